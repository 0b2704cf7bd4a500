/* The offsets of a centered cache: the mean of a range of positions per kv head, kept only when
 * it does not dwarf the rows it comes from. */
#include "internal.h"

#include <string.h>

/* Doubles of set_offset's sums on the stack: the heads are summed this many elements at a time
 * (at least 4 heads of the largest head dim), so a token's rows are read in one sweep. */
#define I8A_OFFSET_SUMS 4096

/* Rows (at most) that decide whether a head keeps its offset. */
#define I8A_OFFSET_SAMPLE 64

/* A mean is kept as the offset only when it does not dwarf the rows it comes from: of (up to)
 * I8A_OFFSET_SAMPLE rows evenly spread over positions [from, to) of head `head`, at most half
 * may grow by centering to more than twice their norm. One outlier (a single huge element in a
 * prefill) drags the mean far from every other row, and centering would then store every later
 * row as about minus that mean, its own values lost in the steps; with a zero offset the
 * outlier only sets its own row's scale. */
static int offset_keeps(const row_source *src, size_t from, size_t to, size_t head,
                        const double *mean)
{
    const size_t d = src->c->head_dim, rows = to - from;
    const size_t n = rows < I8A_OFFSET_SAMPLE ? rows : I8A_OFFSET_SAMPLE;
    size_t grown = 0;
    for (size_t j = 0; j < n; j++) {
        float tmp[I8A_MAX_HEAD_DIM];
        const float *row = i8a_row_at(src, from + j * rows / n, head, tmp);
        double raw = 0.0, centered = 0.0;
        for (size_t i = 0; i < d; i++) {
            const double c = (double)row[i] - mean[i];
            raw += (double)row[i] * (double)row[i];
            centered += c * c;
        }
        grown += centered > 4.0 * raw;
    }
    return 2 * grown <= n;
}

void i8a_set_offset(const i8a_kernels *kt, const row_source *src, size_t from, size_t to,
                    const float *sign, float *off)
{
    const i8a_cache *c = src->c;
    const size_t d = c->head_dim, hkv = c->n_kv_heads, per_block = I8A_OFFSET_SUMS / d;
    double sum[I8A_OFFSET_SUMS];
    if (to - from < I8A_OFFSET_MIN_ROWS) {
        memset(off, 0, hkv * d * sizeof(float));
        return;
    }
    for (size_t h0 = 0; h0 < hkv; h0 += per_block) {
        const size_t nh = hkv - h0 < per_block ? hkv - h0 : per_block, n = nh * d;
        for (size_t i = 0; i < n; i++)
            sum[i] = 0.0;
        for (size_t pos = from; pos < to; pos++) {
            for (size_t h = 0; h < nh; h++) {               /* a token's heads in one sweep */
                float tmp[I8A_MAX_HEAD_DIM];
                const float *row = i8a_row_at(src, pos, h0 + h, tmp);
                for (size_t i = 0; i < d; i++)
                    sum[h * d + i] += row[i];
            }
        }
        for (size_t i = 0; i < n; i++)
            sum[i] = sum[i] / (double)(to - from);          /* now the means */
        for (size_t h = 0; h < nh; h++) {
            float *o = off + (h0 + h) * d;
            const int keep = offset_keeps(src, from, to, h0 + h, sum + h * d);
            for (size_t i = 0; i < d; i++)
                o[i] = keep ? (float)sum[h * d + i] : 0.0f;
            if (sign)
                kt->rotate(o, d, sign, 0, o);
        }
    }
}
