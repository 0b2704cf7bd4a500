#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L      /* posix_memalign */
#endif
#include "_engine.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "_pool.h"
#include "_simd/common.h"

/* x itself, or (with a rotation: sign != NULL) its rotated copy in tmp. */
static const float *maybe_rotated(const i8a_kernels *kt, const i8a_cache *c, const float *sign,
                                  const float *x, float *tmp)
{
    if (!sign)
        return x;
    kt->rotate(x, c->head_dim, sign, 0, tmp);
    return tmp;
}

/* The offsets hold: decode adds them back. */
static int has_offsets(const i8a_cache *c)
{
    return c->k_offset != NULL && c->offsets_set;
}

/* Whether every one of the d values at x has |x| <= limit (a non-negative float): false for
 * NaN and Inf. On the bits: without their sign, floats order as integers do, with NaN and Inf
 * above every finite value, so one integer compare per value answers (and vectorizes, where a
 * float compare that must fail on NaN is left scalar). */
static int within(const float *x, size_t d, float limit)
{
    int32_t top, over = 0;               /* signed: both sides are below 2^31 */
    memcpy(&top, &limit, sizeof top);
    for (size_t i = 0; i < d; i++) {
        int32_t b;
        memcpy(&b, x + i, sizeof b);
        over |= (b & 0x7fffffff) > top;
    }
    return !over;
}

static int in_range(const float *x, size_t d)
{
    return within(x, d, I8A_VALUE_MAX);
}

/* The ring slot of position pos (held: held_from <= pos < len, or being appended). */
static size_t slot_of(const i8a_cache *c, size_t pos)
{
    return (pos + c->ring_shift) % c->ring;
}

/* V tiles per kv head: max_seq rounded up to whole tiles (dispatch.h). */
static size_t v_tiles_of(const i8a_cache *c)
{
    return (c->max_seq + I8A_V_TILE - 1) / I8A_V_TILE;
}

/* The V tile of kv head g holding position pos. */
static int8_t *v_tile(const i8a_cache *c, size_t g, size_t pos)
{
    return c->v_codes + (g * v_tiles_of(c) + pos / I8A_V_TILE) * I8A_V_TILE * c->head_dim;
}

/* The V codes [d] of kv head g at position pos, into its tile / out of it. */
static void v_put(const i8a_cache *c, size_t g, size_t pos, const int8_t *codes)
{
    int8_t *t = v_tile(c, g, pos) + pos % I8A_V_TILE;
    for (size_t i = 0; i < c->head_dim; i++)
        t[i * I8A_V_TILE] = codes[i];
}

static void v_get(const i8a_cache *c, size_t g, size_t pos, int8_t *codes)
{
    const int8_t *t = v_tile(c, g, pos) + pos % I8A_V_TILE;
    for (size_t i = 0; i < c->head_dim; i++)
        codes[i] = t[i * I8A_V_TILE];
}

size_t i8a_k4_groups(size_t cap)
{
    return (cap + I8A_K4_GROUP - 1) / I8A_K4_GROUP;
}

/* Set the nibble of one element in its byte (dispatch.h's blocks): high for elements 16 .. 31
 * of a block. */
static void nib_set(uint8_t *byte, size_t i, unsigned code)
{
    *byte = i % I8A_NIB_BLOCK < 16 ? (uint8_t)((*byte & 0xf0u) | code)
                                   : (uint8_t)((*byte & 0x0fu) | code << 4);
}

/* The V tile at 4 bits of kv head g holding position pos. */
static uint8_t *v4_tile(const i8a_cache *c, size_t g, size_t pos)
{
    return c->v4 + (g * v_tiles_of(c) + pos / I8A_V_TILE) * 2 * c->head_dim;
}

/* The row at 4 bits of K of kv head g at position pos. */
static uint8_t *k4_row_codes(const i8a_cache *c, size_t g, size_t pos)
{
    return c->k4 + (g * c->max_seq + pos) * (c->head_dim / 2);
}

/* The V codes at 4 bits [d] of kv head g at position pos, into its tile / out of it. */
static void v4_put(const i8a_cache *c, size_t g, size_t pos, const uint8_t *codes)
{
    uint8_t *t = v4_tile(c, g, pos);
    for (size_t i = 0; i < c->head_dim; i++)
        nib_set(t + i / I8A_NIB_BLOCK * 64 + i % 16 * I8A_V_TILE + pos % I8A_V_TILE, i, codes[i]);
}

static void v4_get(const i8a_cache *c, size_t g, size_t pos, uint8_t *codes)
{
    const uint8_t *t = v4_tile(c, g, pos);
    for (size_t i = 0; i < c->head_dim; i++)
        codes[i] = (uint8_t)i8a_nib_tile(t, i, pos % I8A_V_TILE);
}

/* A row y [d] (finite, in the stored space) at 4 bits, position pos of kv head g: lo = min y,
 * hi = max y; below I8A_ABSMAX_MIN apart, step 0 and codes 0; else step = (hi - lo) / 15, inv =
 * 15 / (hi - lo), code_i = clamp(rint((y_i - lo) * inv), 0, 15). The row reads back as lo +
 * step * code (multiply, then add). */
static void v4_store(const i8a_cache *c, size_t g, size_t pos, const float *y)
{
    const size_t d = c->head_dim, row = g * c->max_seq + pos;
    float lo = y[0], hi = y[0];
    for (size_t i = 1; i < d; i++) {
        lo = y[i] < lo ? y[i] : lo;
        hi = y[i] > hi ? y[i] : hi;
    }
    const float range = hi - lo;
    const int some = range >= I8A_ABSMAX_MIN;
    const float inv = some ? 15.0f / range : 0.0f;
    uint8_t codes[I8A_MAX_HEAD_DIM];
    for (size_t i = 0; i < d; i++) {
        float r = rintf((y[i] - lo) * inv);
        r = r > 15.0f ? 15.0f : r;
        codes[i] = (uint8_t)(r > 0.0f ? r : 0.0f);
    }
    c->v4_min[row] = lo;
    c->v_scale[row] = some ? range / 15.0f : 0.0f;
    v4_put(c, g, pos, codes);
}

/* K at 4 bits of kv head g at position pos as floats y [d]: min_i + step_i * code (its group's
 * minima and steps, halves times their powers of two; multiply, then add). */
static void k4_value(const i8a_cache *c, size_t g, size_t pos, float *y)
{
    const size_t d = c->head_dim, at = g * i8a_k4_groups(c->max_seq) + pos / I8A_K4_GROUP;
    const uint16_t *hm = c->k4_min + at * d, *hs = c->k4_step + at * d;
    const float sm = c->k4_min_scale[at], ss = c->k4_step_scale[at];
    const uint8_t *row = k4_row_codes(c, g, pos);
    for (size_t i = 0; i < d; i++)
        y[i] = i8a_half_value(hm[i]) * sm + (i8a_half_value(hs[i]) * ss) * (float)i8a_nib_row(row, i);
}

/* Halves h [d] times their row's scale into y [d] (exact). */
static void widen(const uint16_t *h, float scale, size_t d, float *y)
{
    for (size_t i = 0; i < d; i++)
        y[i] = i8a_half_value(h[i]) * scale;
}

/* Row `slot` of kv head g of one side of the ring (halves h, scales s) as floats into y [d]. */
static void widen_row(const i8a_cache *c, const uint16_t *h, const float *s, size_t g,
                      size_t slot, float *y)
{
    const size_t at = g * c->ring + slot;
    widen(h + at * c->head_dim, s[at], c->head_dim, y);
}

/* Where the rows of one side (K or V) of a position are during an append: the append's own
 * rows x [.][hkv][d] for positions from x_from on, the ring (halves and scales) before. */
typedef struct {
    const i8a_kernels *kt;          /* (its half_row) */
    const i8a_cache *c;
    const float *x;
    const uint16_t *ring;
    const float *ring_scale;
    size_t x_from;
} row_source;

/* The row of kv head g at position pos as the cache codes it. From x as given, except that
 * with a recent window positions 1 .. R (the rows the offsets come from, which the ring may
 * code again) go through the window's halves first, so a position codes the same whether it
 * comes from an append or from the ring; from the ring, widened. tmp [d] holds the row when
 * it is not x's own. x's rows are in range (checked before). */
static const float *row_at(const row_source *src, size_t pos, size_t g, float *tmp)
{
    const i8a_cache *c = src->c;
    const size_t d = c->head_dim;
    if (pos < src->x_from) {
        widen_row(c, src->ring, src->ring_scale, g, slot_of(c, pos), tmp);
        return tmp;
    }
    const float *x = src->x + ((pos - src->x_from) * c->n_kv_heads + g) * d;
    if (!c->recent || pos == 0 || pos > c->recent)
        return x;
    uint16_t h[I8A_MAX_HEAD_DIM];
    widen(h, src->kt->half_row(x, d, h), d, tmp);
    return tmp;
}

/* K at 4 bits: position pos of kv head g as its group is coded from it: the append's row
 * rounded as the ring rounds it (so the codes do not depend on how appends were split), the
 * ring's row, or (its floats gone after a truncate deeper than the ring) its codes' value. tmp
 * [d] holds the row. */
static const float *k4_row(const row_source *src, size_t pos, size_t g, float *tmp)
{
    const i8a_cache *c = src->c;
    const size_t d = c->head_dim;
    if (pos >= src->x_from) {
        uint16_t h[I8A_MAX_HEAD_DIM];
        const float *x = src->x + ((pos - src->x_from) * c->n_kv_heads + g) * d;
        widen(h, src->kt->half_row(x, d, h), d, tmp);
    } else if (pos >= c->held_from) {
        widen_row(c, src->ring, src->ring_scale, g, slot_of(c, pos), tmp);
    } else {
        k4_value(c, g, pos, tmp);
    }
    return tmp;
}

/* Code group grp of kv head g at 4 bits, its positions all appended (rows by k4_row): per
 * channel lo = min, hi = max over the group's positions (not position 0 when it is kept
 * apart); the minima as halves times a power of two (the tier's half_row), min_i their value;
 * the steps max((hi_i - min_i) / 15, 0) the same way, step_i their value; code = clamp(rint((x -
 * min_i) * inv_i), 0, 15) with inv_i = 1 / step_i (0 when step_i is 0). */
static void k4_code_group(const i8a_kernels *kt, i8a_cache *c, const row_source *src, size_t g,
                          size_t grp)
{
    const size_t d = c->head_dim, first = grp * I8A_K4_GROUP, end = first + I8A_K4_GROUP;
    const size_t from = c->k_first && first == 0 ? 1 : first;
    const size_t at = g * i8a_k4_groups(c->max_seq) + grp;
    float lo[I8A_MAX_HEAD_DIM], hi[I8A_MAX_HEAD_DIM], tmp[I8A_MAX_HEAD_DIM];
    uint16_t hm[I8A_MAX_HEAD_DIM], hs[I8A_MAX_HEAD_DIM];
    for (size_t pos = from; pos < end; pos++) {
        const float *x = k4_row(src, pos, g, tmp);
        for (size_t i = 0; i < d; i++) {
            lo[i] = pos == from || x[i] < lo[i] ? x[i] : lo[i];
            hi[i] = pos == from || x[i] > hi[i] ? x[i] : hi[i];
        }
    }
    const float sm = kt->half_row(lo, d, hm);
    for (size_t i = 0; i < d; i++) {
        lo[i] = i8a_half_value(hm[i]) * sm;
        const float step = (hi[i] - lo[i]) / 15.0f;
        hi[i] = step > 0.0f ? step : 0.0f;
    }
    const float ss = kt->half_row(hi, d, hs);
    for (size_t i = 0; i < d; i++) {
        const float step = i8a_half_value(hs[i]) * ss;
        hi[i] = step > 0.0f ? 1.0f / step : 0.0f;                  /* now the inverses */
    }
    /* every position's codes before the group's new minima and steps are stored: a position
     * without floats is read from its old codes by its old ones */
    for (size_t pos = first; pos < end; pos++) {
        const float *x = k4_row(src, pos, g, tmp);
        uint8_t *row = k4_row_codes(c, g, pos);
        for (size_t i = 0; i < d; i++) {
            float r = rintf((x[i] - lo[i]) * hi[i]);
            r = r > 15.0f ? 15.0f : r;
            nib_set(row + i / I8A_NIB_BLOCK * 16 + i % 16, i, (unsigned)(r > 0.0f ? r : 0.0f));
        }
    }
    memcpy(c->k4_min + at * d, hm, d * sizeof(uint16_t));
    memcpy(c->k4_step + at * d, hs, d * sizeof(uint16_t));
    c->k4_min_scale[at] = sm;
    c->k4_step_scale[at] = ss;
}

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
        const float *row = row_at(src, from + j * rows / n, head, tmp);
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

/* off[head] = R (the mean of positions [from, to) of src), per kv head (rotated when the cache
 * rotates): sums in double, in position order. Fewer than I8A_OFFSET_MIN_ROWS rows make no
 * estimate worth its noise, and a mean that offset_keeps rejects is no offset of its rows: the
 * offsets are then zero, which centers nothing (the same codes, and decode values, as without
 * centering). The rows are in range (checked before). */
static void set_offset(const i8a_kernels *kt, const row_source *src, size_t from, size_t to,
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
                const float *row = row_at(src, pos, h0 + h, tmp);
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

/* One row into codes and scale: rotated when the cache rotates, minus off when off != NULL.
 * The row is in range, so it stays finite through the rotation and the offset
 * (I8A_VALUE_MAX) and the quantizer cannot fail. */
static void store_row(const i8a_kernels *kt, const i8a_cache *c, const float *sign,
                      const float *x, const float *off, int8_t *codes, float *scale)
{
    float tmp[I8A_MAX_HEAD_DIM];
    const float *y = maybe_rotated(kt, c, sign, x, tmp);
    if (off) {
        for (size_t i = 0; i < c->head_dim; i++)
            tmp[i] = y[i] - off[i];
        y = tmp;
    }
    kt->quantize_row(y, c->head_dim, codes, scale);
}

/* Quantize positions [a, b) of both sides from src_k / src_v into their codes (centered past
 * position 0 when the offsets hold), checking the rows that come from the append (in_range)
 * as it goes. Returns 0, or 1 / 2 when a K / V row is out of range, with *bad = (pos - x_from)
 * * hkv + head of the first (row order, K before V); the codes up to it are then written, which
 * changes nothing while the length is not committed. */
static int code_rows(const i8a_kernels *kt, const i8a_cache *c, const row_source *src_k,
                     const row_source *src_v, size_t a, size_t b, size_t *bad)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads;
    for (size_t pos = a; pos < b; pos++) {
        const int given = pos >= src_k->x_from;             /* the ring's rows were checked */
        for (size_t g = 0; g < hkv; g++) {
            const size_t row = g * c->max_seq + pos;
            const int centered = has_offsets(c) && pos >= 1;
            if (given) {
                const size_t at = ((pos - src_k->x_from) * hkv + g) * d;
                const int bad_k = !in_range(src_k->x + at, d);
                if (bad_k || !in_range(src_v->x + at, d)) {
                    *bad = (pos - src_k->x_from) * hkv + g;
                    return bad_k ? 1 : 2;
                }
            }
            float tk[I8A_MAX_HEAD_DIM], tv[I8A_MAX_HEAD_DIM];
            if (c->k_bits == 8)             /* (at 4 bits K is coded by groups: k4_code_group) */
                store_row(kt, c, c->k_sign, row_at(src_k, pos, g, tk),
                          centered ? c->k_offset + g * d : NULL, c->k_codes + row * d,
                          c->k_scale + row);
            if (c->v_bits == 8) {
                int8_t vc[I8A_MAX_HEAD_DIM];
                store_row(kt, c, c->v_sign, row_at(src_v, pos, g, tv),
                          centered ? c->v_offset + g * d : NULL, vc, c->v_scale + row);
                v_put(c, g, pos, vc);
            } else {
                float rv[I8A_MAX_HEAD_DIM];
                v4_store(c, g, pos, maybe_rotated(kt, c, c->v_sign, row_at(src_v, pos, g, tv), rv));
            }
        }
    }
    return 0;
}

int i8a_append(const i8a_kernels *kt, i8a_cache *c, const float *k, const float *v, size_t t,
               size_t *bad)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, len = c->length, end = len + t;
    I8A_EXPECT(end <= c->max_seq && t >= 1);
    I8A_EXPECT(d % 16 == 0 && d >= 16 && d <= I8A_MAX_HEAD_DIM && hkv >= 1);
    I8A_EXPECT(!c->k_offset || c->k_first);
    I8A_EXPECT(c->recent ? c->ring >= 1 && c->k_recent && c->v_recent : c->ring == 0);
    I8A_EXPECT(c->k_bits == 8 || (c->k4 && !c->k_sign && !c->k_offset && c->recent >= I8A_K4_GROUP));
    I8A_EXPECT(c->v_bits == 8 || (c->v4 && c->v4_min && !c->v_offset));
    I8A_EXPECT((c->k_bits == 8 && c->v_bits == 8) || d % I8A_NIB_BLOCK == 0);
    /* Nothing that outlives a failed append is written before every row is known to be in
     * range: the codes and scales of positions len .. are not the cache's until len grows,
     * and k_first counts only once it does; the offsets and the ring are written after. */
    const row_source src_k = {kt, c, k, c->k_recent, c->k_rscale, len};
    const row_source src_v = {kt, c, v, c->v_recent, c->v_rscale, len};
    size_t to = 0;                      /* the offsets come from positions 1 .. to-1 */
    if (c->k_offset && !c->offsets_set && !c->recent && end >= 2)
        to = end;                                           /* this append's rows past 0 */
    else if (c->k_offset && !c->offsets_set && c->recent && end >= c->recent + 1)
        to = c->recent + 1;                                 /* positions 1 .. R */
    if (to) {                           /* the offsets first: every row checked before */
        for (size_t r = 0; r < t * hkv; r++) {
            if (!in_range(k + r * d, d) || !in_range(v + r * d, d)) {
                *bad = r;
                return in_range(k + r * d, d) ? 2 : 1;
            }
        }
        set_offset(kt, &src_k, 1, to, c->k_sign, c->k_offset);
        set_offset(kt, &src_v, 1, to, c->v_sign, c->v_offset);
        c->offsets_set = 1;
    }
    if (c->k_first && len == 0) {
        for (size_t g = 0; g < hkv; g++) {
            memcpy(c->k_first + g * d, k + g * d, d * sizeof(float));
            memcpy(c->v_first + g * d, v + g * d, d * sizeof(float));
        }
    }
    const int rc = code_rows(kt, c, &src_k, &src_v, len, end, bad);
    if (rc != 0)
        return rc;                      /* (never after the offsets were set: checked there) */
    if (to && len > 1)                  /* the rows coded uncentered so far, again */
        code_rows(kt, c, &src_k, &src_v, 1, len, bad);
    if (c->k_bits == 4)                 /* the K groups this append fills, before the ring moves */
        for (size_t grp = len / I8A_K4_GROUP; (grp + 1) * I8A_K4_GROUP <= end; grp++)
            for (size_t g = 0; g < hkv; g++)
                k4_code_group(kt, c, &src_k, g, grp);
    if (c->recent) {                    /* the latest `ring` rows into the ring */
        const size_t from = end > c->ring && end - c->ring > len ? end - c->ring : len;
        for (size_t pos = from; pos < end; pos++) {
            for (size_t g = 0; g < hkv; g++) {
                const size_t at = g * c->ring + slot_of(c, pos), x = ((pos - len) * hkv + g) * d;
                c->k_rscale[at] = kt->half_row(k + x, d, c->k_recent + at * d);
                c->v_rscale[at] = kt->half_row(v + x, d, c->v_recent + at * d);
            }
        }
        if (end > c->ring && end - c->ring > c->held_from)
            c->held_from = end - c->ring;
    } else {
        c->held_from = end;
    }
    c->length = end;
    return 0;
}

/* K at 4 bits after a truncate from len to n: the groups no longer complete hold what they
 * held before they were first coded (zeros), so that the cache holds what it held after its
 * n-th append; but the first of them keeps its codes when some of its positions have no
 * floats left (a truncate deeper than the ring), which then serve those positions. */
static void k4_forget_groups(i8a_cache *c, size_t len, size_t n)
{
    const size_t d = c->head_dim, groups = i8a_k4_groups(c->max_seq);
    size_t first = n / I8A_K4_GROUP;
    if (c->held_from > first * I8A_K4_GROUP)
        first++;
    const size_t end = i8a_k4_groups(len);
    if (first >= end)
        return;
    const size_t rows = (len < end * I8A_K4_GROUP ? len : end * I8A_K4_GROUP) - first * I8A_K4_GROUP;
    for (size_t g = 0; g < c->n_kv_heads; g++) {
        const size_t at = g * groups + first;
        memset(k4_row_codes(c, g, first * I8A_K4_GROUP), 0, rows * (d / 2));
        memset(c->k4_min + at * d, 0, (end - first) * d * sizeof(uint16_t));
        memset(c->k4_step + at * d, 0, (end - first) * d * sizeof(uint16_t));
        memset(c->k4_min_scale + at, 0, (end - first) * sizeof(float));
        memset(c->k4_step_scale + at, 0, (end - first) * sizeof(float));
    }
}

void i8a_truncate(const i8a_kernels *kt, i8a_cache *c, size_t n)
{
    I8A_EXPECT(n <= c->length);
    const size_t len = c->length;
    c->length = n;
    c->held_from = c->held_from < n ? c->held_from : n;
    if (c->k_bits == 4)
        k4_forget_groups(c, len, n);
    if (!has_offsets(c))
        return;
    if (!c->recent && n <= 1) {
        c->offsets_set = 0;
    } else if (c->recent && n <= c->recent && c->held_from <= 1) {
        /* back to before the offsets: the rows past position 0 coded uncentered again, as the
         * appends that brought the cache to n tokens left them */
        const row_source src_k = {kt, c, NULL, c->k_recent, c->k_rscale, n};
        const row_source src_v = {kt, c, NULL, c->v_recent, c->v_rscale, n};
        c->offsets_set = 0;
        size_t unused;
        code_rows(kt, c, &src_k, &src_v, 1, n, &unused);
    }
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* The first position read from the codes (position 0 is read from its float row when kept). */
static size_t coded_from(const i8a_cache *c)
{
    return c->k_first ? 1 : 0;
}

/* The first position a query at position end - 1 reads from the recent window (end when it
 * reads none): the last R positions up to it whose floats are held, not position 0 when it is
 * kept apart. */
static size_t float_start(const i8a_cache *c, size_t end)
{
    if (!c->recent)
        return end;
    size_t w = end > c->recent ? end - c->recent : 0;
    w = w > c->held_from ? w : c->held_from;
    w = w > coded_from(c) ? w : coded_from(c);
    return w < end ? w : end;
}

size_t i8a_window_start(const i8a_cache *c)
{
    return float_start(c, c->length);
}

/* Whether a side of the cache is at 4 bits (its chunks go to the tier's attend4). */
static int has_four(const i8a_cache *c)
{
    return c->k_bits == 4 || c->v_bits == 4;
}

/* Chunks of every kv head's positions [0, len), in I8A_CHUNK steps. */
static size_t n_chunks(const i8a_cache *c)
{
    return (c->length + I8A_CHUNK - 1) / I8A_CHUNK;
}

/* The positions query tt of t sees: as two half-open ranges of coded positions in position
 * order, the sinks [sink_begin, sink_end) (empty without them) and the window up to the query
 * itself [win_begin, win_end); pos0: whether it sees position 0 from its float row (kept first
 * position); and the positions p of the recent window it sees: fw <= p < end with p >= lo or
 * p < sinks. Each query reads the recent window of its own position (float_start), so a
 * decode of t queries reads what t single-query decodes after one append each would read,
 * while the ring holds those positions' floats (t <= R). */
typedef struct {
    size_t sink_begin, sink_end, win_begin, win_end;
    int pos0;
    size_t lo, end, fw;
} visible_ranges;

static size_t clip(size_t x, size_t lo, size_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static visible_ranges visible(const i8a_cache *c, size_t t, size_t tt, const i8a_options *opt)
{
    const size_t end = c->length - t + tt + 1;              /* the query's position + 1 */
    const size_t lo = opt->window && end > opt->window ? end - opt->window : 0;
    const size_t e = coded_from(c), fw = float_start(c, end);
    visible_ranges v = {0, 0, lo, end, 0, lo, end, fw};
    if (opt->sinks >= lo)
        v.win_begin = 0;                                    /* the sinks join the window */
    else
        v.sink_end = opt->sinks;
    v.pos0 = e && (v.win_begin == 0 || v.sink_end > 0);
    /* the coded ranges: within [e, fw) (empty ranges collapse to begin == end) */
    v.sink_end = clip(v.sink_end, e, fw);
    v.sink_begin = clip(v.sink_begin, e, v.sink_end);
    v.win_end = clip(v.win_end, e, fw);
    v.win_begin = clip(v.win_begin, e, v.win_end);
    return v;
}

/* The chunks the queries see, in position order: two runs of consecutive chunks (the sinks',
 * then the window's; the second empty when they meet). Each query's window range ends at its
 * own position and consecutive queries' ranges overlap, so the window ranges of all queries
 * cover [the first query's window start, the last query's recent window); the sinks range is
 * the same for every query that has one, and the last query has one when any does. */
typedef struct {
    size_t begin[2], count[2];
} chunk_runs;

static chunk_runs visible_chunks(const i8a_cache *c, size_t t, const i8a_options *opt)
{
    const visible_ranges v0 = visible(c, t, 0, opt), vl = visible(c, t, t - 1, opt);
    chunk_runs runs = {{0, 0}, {0, 0}};
    size_t k = 0;
    if (vl.sink_begin < vl.sink_end) {
        runs.begin[0] = vl.sink_begin / I8A_CHUNK;
        runs.count[0] = (vl.sink_end - 1) / I8A_CHUNK + 1 - runs.begin[0];
        k = 1;
    }
    const size_t fw = i8a_window_start(c);
    if (v0.win_begin < fw) {
        size_t b = v0.win_begin / I8A_CHUNK, e = (fw - 1) / I8A_CHUNK + 1;
        if (k && b <= runs.begin[0] + runs.count[0]) {      /* meets the sinks' run: one run */
            runs.count[0] = e - runs.begin[0];
        } else {
            runs.begin[k] = b;
            runs.count[k] = e - b;
        }
    }
    return runs;
}

/* The vi-th visible chunk. */
static size_t visible_chunk(const chunk_runs *runs, size_t vi)
{
    return vi < runs->count[0] ? runs->begin[0] + vi : runs->begin[1] + (vi - runs->count[0]);
}

/* Work per thread below which another thread costs more than it saves, in kv rows of 128
 * dims times (1 + query rows per kv head) / 2 (each query row of a group adds a dot and an
 * accumulation). Measured on the 2-core development VM (avx512_vnni): H = Hkv = 8, D = 128
 * gains from a second thread at 256 tokens (19 -> 15 us) and loses at 128 (10.5 -> 11.4 us). */
#define I8A_ROWS_PER_THREAD 1024

/* The work of a decode of t queries of h heads that reads `items` (kv head, chunk) items, in
 * units of I8A_ROWS_PER_THREAD per thread. */
static size_t work_of(const i8a_cache *c, size_t t, size_t h, size_t items)
{
    const size_t hkv = c->n_kv_heads, rows_per_kv = t * (h / hkv);
    const size_t tokens = items / hkv * I8A_CHUNK;  /* rows read, a window item as a chunk */
    return hkv * (tokens < c->length ? tokens : c->length) * (c->head_dim / 16)
           * (1 + rows_per_kv) / 16;
}

/* Threads for `items` work items of this much work: at most max_threads, fewer when the tokens
 * read are too few to pay for waking another thread. */
static size_t threads_for(size_t work, size_t items, size_t max_threads)
{
    size_t n = work / I8A_ROWS_PER_THREAD;
    n = n < 1 ? 1 : n;
    n = n < max_threads ? n : max_threads;
    return n < items ? n : (items ? items : 1);
}

/* The plan of one decode: the visible chunks, the thread count, and the workspace layout, every
 * part 64-byte aligned (R = t * nq query rows per kv head):
 *   q_hi, q_lo [hkv][R][d] int8;  c_hi, c_lo, bias, pos0_logit [hkv][R] float;
 *   q_float [hkv][R][d] float, q times the softmax scale as given (the recent window's dots);
 *   residual [d] float;
 *   position 0's V row in the stored space, v_pos0 [hkv][d] float;
 *   chunks left per kv head [hkv] (atomic);
 *   running max and sum per kv head [hkv][R] float each;
 *   per (kv head, visible chunk, part): the state of R rows: o [R][d], m [R], l [R]; the part is
 *     0 for the sinks and 1 for the window when both are on, else 0;
 *   with a recent window, per kv head: the state of R rows over the window (the same shape);
 *   per thread: the attend scratch, 2 * R * I8A_CHUNK floats. */
typedef struct {
    chunk_runs runs;
    size_t rows, parts, nvis, per_head, threads;   /* per_head: items per kv head, nvis + its
                                                     * window's (decode_range's order) */
    size_t q_lo, c_hi, c_lo, bias, pos0_logit, q_float, v_pos0, residual, left, run_m, run_l;
    size_t states, windows;
    size_t workers, end;
    size_t state_bytes, worker_bytes;
} layout;

/* The plan L for another thread count (the per-thread scratch is last in the workspace). */
static layout with_threads(layout L, size_t threads)
{
    L.threads = threads;
    L.end = L.workers + threads * L.worker_bytes;
    return L;
}

/* The plan for one thread (with_threads() gives it the count a batch decodes with, so that
 * every worker has its scratch). */
static layout plan(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt)
{
    const size_t d = c->head_dim, f = sizeof(float), hkv = c->n_kv_heads;
    layout L;
    L.rows = t * (h / hkv);
    L.parts = opt->window && opt->sinks ? 2 : 1;
    L.runs = visible_chunks(c, t, opt);
    L.nvis = L.runs.count[0] + L.runs.count[1];
    L.per_head = L.nvis + (c->recent ? 1 : 0);
    L.state_bytes = align64(L.rows * (d + 2) * f);
    L.worker_bytes = align64(2 * L.rows * I8A_CHUNK * f)
                     + (has_four(c) ? align64(I8A_ATTEND4_EXTRA) : 0);
    const size_t qrows = hkv * L.rows;
    L.q_lo = align64(qrows * d);
    L.c_hi = L.q_lo + align64(qrows * d);
    L.c_lo = L.c_hi + align64(qrows * f);
    L.bias = L.c_lo + align64(qrows * f);
    L.pos0_logit = L.bias + align64(qrows * f);
    L.q_float = L.pos0_logit + align64(qrows * f);
    L.v_pos0 = L.q_float + (c->recent || c->k_bits == 4 ? align64(qrows * d * f) : 0);
    L.residual = L.v_pos0 + align64(hkv * d * f);
    L.left = L.residual + align64(d * f);
    L.run_m = L.left + align64(hkv * sizeof(atomic_size_t));
    L.run_l = L.run_m + align64(qrows * f);
    L.states = L.run_l + align64(qrows * f);
    L.windows = L.states + hkv * L.nvis * L.parts * L.state_bytes;
    L.workers = L.windows + (c->recent ? hkv * L.state_bytes : 0);
    return with_threads(L, 1);
}

size_t i8a_decode_threads(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                          size_t max_threads)
{
    const size_t items = c->n_kv_heads * plan(c, t, h, opt).per_head;
    return threads_for(work_of(c, t, h, items), items, max_threads);
}

void *i8a_alloc_aligned(size_t bytes)
{
    bytes = bytes ? bytes : 1;
#ifdef _WIN32
    return _aligned_malloc(bytes, 64);
#else
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
#endif
}

void i8a_free_aligned(void *p)
{
#ifdef _WIN32
    _aligned_free(p);
#else
    free(p);
#endif
}

/* The workspace holds at least `bytes` (64-byte aligned): grown by half again at least, so a
 * growing cache reallocates rarely. 0, or -1 when it cannot be allocated (then unchanged). */
static int reserve_work(i8a_cache *c, size_t bytes)
{
    if (c->work_bytes >= bytes)
        return 0;
    size_t grown = c->work_bytes + c->work_bytes / 2;
    grown = grown > bytes ? grown : bytes;
    void *p = i8a_alloc_aligned(grown);
    if (!p)
        return -1;
    i8a_free_aligned(c->work);
    c->work = p;
    c->work_bytes = grown;
    return 0;
}

void i8a_cache_free_work(i8a_cache *c)
{
    i8a_free_aligned(c->work);
    c->work = NULL;
    c->work_bytes = 0;
}

/* The two q planes of one query row: q_hi, s_hi quantize q; q_lo, s_lo quantize the residual
 * q - float(q_hi) * s_hi (multiply, then subtract). The plane scales times the softmax scale
 * are what the logits use. */
static int prepare_q(const i8a_kernels *kt, const float *q, size_t d, int two_planes,
                     float scale, int8_t *q_hi, int8_t *q_lo, float *c_hi, float *c_lo,
                     float *residual)
{
    float s_hi, s_lo = 0.0f;
    if (kt->quantize_row(q, d, q_hi, &s_hi) != 0)
        return -1;
    if (two_planes) {
        for (size_t i = 0; i < d; i++)
            residual[i] = q[i] - (float)q_hi[i] * s_hi;
        kt->quantize_row(residual, d, q_lo, &s_lo);
    } else {
        memset(q_lo, 0, d);
    }
    *c_hi = s_hi * scale;
    *c_lo = s_lo * scale;
    return 0;
}

/* (x . y) * scale over d floats, summed in double in index order, rounded to float once (the
 * dot of two rows in range can exceed float32's range before the scale brings it back). */
static float dot_scaled(const float *x, const float *y, size_t d, float scale)
{
    double acc = 0.0;
    for (size_t i = 0; i < d; i++)
        acc += (double)x[i] * (double)y[i];
    return (float)(acc * (double)scale);
}

typedef struct {
    const i8a_kernels *kt;
    const i8a_cache *c;
    const i8a_options *opt;
    char *base;
    layout L;
    size_t t, h, nq;
    float *out;
} decode_job;

/* The state of rows [r, r + count) of kv head g, visible chunk vi, part. */
static i8a_state state_at(const decode_job *job, size_t g, size_t vi, size_t part, size_t r)
{
    const size_t slot = (g * job->L.nvis + vi) * job->L.parts + part, rows = job->L.rows;
    const size_t d = job->c->head_dim;
    float *p = (float *)(job->base + job->L.states + slot * job->L.state_bytes);
    i8a_state s = {p + rows * d + r, p + rows * d + rows + r, p + r * d};
    return s;
}

/* The recent window's state of rows [r, ..) of kv head g. */
static i8a_state window_at(const decode_job *job, size_t g, size_t r)
{
    const size_t rows = job->L.rows, d = job->c->head_dim;
    float *p = (float *)(job->base + job->L.windows + g * job->L.state_bytes);
    i8a_state s = {p + rows * d + r, p + rows * d + rows + r, p + r * d};
    return s;
}

/* Query rows [r, r + count) of kv head g. */
static i8a_query query_at(const decode_job *job, size_t g, size_t r, size_t count)
{
    const size_t d = job->c->head_dim, row = g * job->L.rows + r;
    const i8a_query q = {
        d, count, job->opt->q_bits == 16,
        (const int8_t *)job->base + row * d,
        (const int8_t *)job->base + job->L.q_lo + row * d,
        (const float *)(job->base + job->L.c_hi) + row,
        (const float *)(job->base + job->L.c_lo) + row,
        job->opt->softcap,
        job->opt->softcap > 0.0f ? 1.0f / job->opt->softcap : 0.0f,
        (const float *)(job->base + job->L.bias) + row,
        (const float *)(job->base + job->L.q_float) + row * d,
    };
    return q;
}

/* Positions [a, b) of kv head g as a span (without a prefetch hint). */
static i8a_span span_rows(const i8a_cache *c, size_t g, size_t a, size_t b)
{
    const size_t row = g * c->max_seq + a, d = c->head_dim;
    i8a_span span = {0};
    span.ks = c->k_bits == 8 ? c->k_scale + row : NULL;
    span.vs = c->v_scale + row;
    span.n = b - a;
    span.v_lead = a % I8A_V_TILE;
    if (c->k_bits == 8) {
        span.k = c->k_codes + row * d;
    } else {
        const size_t at = g * i8a_k4_groups(c->max_seq) + a / I8A_K4_GROUP;
        span.k4 = k4_row_codes(c, g, a);
        span.k4_min = c->k4_min + at * d, span.k4_step = c->k4_step + at * d;
        span.k4_min_scale = c->k4_min_scale + at, span.k4_step_scale = c->k4_step_scale + at;
        span.k4_lead = a % I8A_K4_GROUP;
    }
    if (c->v_bits == 8) {
        span.v = v_tile(c, g, a);
    } else {
        span.v4 = v4_tile(c, g, a);
        span.v4_min = c->v4_min + row;
    }
    return span;
}

/* The next item's rows as span's prefetch hint: its K and V bytes, at 8 or 4 bits (the
 * kernels read them at the span's own widths: a window item's halves are two rows of codes). */
static void hint_next(i8a_span *span, const i8a_span *next)
{
    span->next_k = next->k4 ? (const int8_t *)next->k4 : next->k;
    span->next_v = next->v4 ? (const int8_t *)next->v4 : next->v;
    span->next_n = next->n;
}

/* What the next item reads besides its codes at 4 bits, into the caches ahead of it: K's group
 * minima and steps, V's minima and steps (the kernels prefetch the codes themselves). */
static void prefetch_four(const i8a_cache *c, const i8a_span *next)
{
    if (next->k4 && next->n) {
        const size_t groups = (next->k4_lead + next->n + I8A_K4_GROUP - 1) / I8A_K4_GROUP;
        i8a_prefetch_rows(next->k4_min, groups * c->head_dim * sizeof(uint16_t));
        i8a_prefetch_rows(next->k4_step, groups * c->head_dim * sizeof(uint16_t));
    }
    if (next->v4 && next->n) {
        i8a_prefetch_rows(next->v4_min, next->n * sizeof(float));
        i8a_prefetch_rows(next->vs, next->n * sizeof(float));
    }
}

/* The first coded position of chunk `chunk`. */
static size_t chunk_start(const i8a_cache *c, size_t chunk)
{
    const size_t c0 = chunk * I8A_CHUNK;
    return c0 > coded_from(c) ? c0 : coded_from(c);
}

/* Chunk `chunk` of kv head g as a span of its coded positions below `end`. */
static i8a_span chunk_span_to(const i8a_cache *c, size_t g, size_t chunk, size_t end)
{
    const size_t c1 = chunk * I8A_CHUNK + I8A_CHUNK;
    return span_rows(c, g, chunk_start(c, chunk), c1 < end ? c1 : end);
}

/* Chunk `chunk` of kv head g as decode reads it: cut where the recent window starts. */
static i8a_span chunk_span(const i8a_cache *c, size_t g, size_t chunk)
{
    return chunk_span_to(c, g, chunk, i8a_window_start(c));
}

/* The state of position 0 read from its float row (kept first position): m = the logit
 * (soft-capped when the cap is on), l = 1, o = v0 (its V row in the stored space), minus
 * v_offset when `off` (the offset then joins every row at the end). */
static void pos0_state(const decode_job *job, size_t g, size_t r, const float *v0, int off,
                       const i8a_state *run)
{
    const i8a_cache *c = job->c;
    const float lg = ((const float *)(job->base + job->L.pos0_logit))[g * job->L.rows + r];
    const float cap = job->opt->softcap;
    run->m[0] = cap > 0.0f ? i8a_softcap(lg, cap, 1.0f / cap) : lg;
    run->l[0] = 1.0f;
    for (size_t i = 0; i < c->head_dim; i++)
        run->o[i] = off ? v0[i] - c->v_offset[g * c->head_dim + i] : v0[i];
}

/* The state of query row r of kv head g over the positions of the recent window it sees
 * (visible_ranges), from its halves (the tier's attend_float); o is then rotated into
 * the stored space, minus l * v_offset when `off` (as the coded rows' states are). Returns 0
 * when the row sees none of the window (st untouched). */
static int window_state(const decode_job *job, size_t g, size_t r, const visible_ranges *vis,
                        int off, const i8a_state *st)
{
    const i8a_cache *c = job->c;
    const size_t d = c->head_dim, sinks = job->opt->sinks;
    const float *qf = (const float *)(job->base + job->L.q_float) + (g * job->L.rows + r) * d;
    const uint16_t *kr[I8A_RECENT_MAX], *vr[I8A_RECENT_MAX];
    float ks[I8A_RECENT_MAX], vs[I8A_RECENT_MAX], logit[I8A_RECENT_MAX];
    size_t n = 0;
    size_t s = slot_of(c, vis->fw);                         /* p's slot, stepped along */
    for (size_t p = vis->fw; p < vis->end; p++, s = s + 1 < c->ring ? s + 1 : 0) {
        if (p < vis->lo && p >= sinks)
            continue;
        const size_t at = g * c->ring + s;
        kr[n] = c->k_recent + at * d, vr[n] = c->v_recent + at * d;
        ks[n] = c->k_rscale[at], vs[n++] = c->v_rscale[at];
    }
    if (n == 0)
        return 0;
    I8A_EXPECT(n <= c->recent);
    const i8a_float_rows rows = {kr, vr, ks, vs, n};
    job->kt->attend_float(qf, &rows, d, job->opt->softcap, logit, st->m, st->l, st->o);
    if (c->v_sign)
        job->kt->rotate(st->o, d, c->v_sign, 0, st->o);
    if (off)
        for (size_t i = 0; i < d; i++)
            st->o[i] = st->o[i] - st->l[0] * c->v_offset[g * d + i];
    return 1;
}

/* Whether query row r's output takes the V offset back: the cache's offsets hold and the row
 * saw coded positions (its window's state is taken minus l * v_offset to match). */
static int row_offset(const i8a_cache *c, const visible_ranges *vis)
{
    return has_offsets(c) && (vis->sink_begin < vis->sink_end || vis->win_begin < vis->win_end);
}

/* The recent window's halves of kv head g as a prefetch hint (a span of codes over the same
 * bytes: a row of d halves is two rows of d codes): the window's slots up to the ring's end. */
static i8a_span window_span(const i8a_cache *c, size_t g)
{
    i8a_span span = {0};
    const size_t fw = i8a_window_start(c), d = c->head_dim;
    if (fw >= c->length)
        return span;
    const size_t s = slot_of(c, fw), n = c->length - fw;
    span.k = (const int8_t *)(c->k_recent + (g * c->ring + s) * d);
    span.v = (const int8_t *)(c->v_recent + (g * c->ring + s) * d);
    span.n = 2 * (s + n <= c->ring ? n : c->ring - s);
    return span;
}

/* The window item of kv head g: every query row's state over the recent window it sees (m =
 * -inf: none). */
static void window_item(const decode_job *job, size_t g)
{
    for (size_t r = 0; r < job->L.rows; r++) {
        const visible_ranges vis = visible(job->c, job->t, r / job->nq, job->opt);
        const i8a_state st = window_at(job, g, r);
        if (!window_state(job, g, r, &vis, row_offset(job->c, &vis), &st))
            st.m[0] = -INFINITY;
    }
}

/* Fold the state st of one query row into its running state run: the first state it has
 * (*started == 0) is copied, later ones merged; m = -inf: the row saw nothing there. */
static void fold_state(const decode_job *job, const i8a_state *run, const i8a_state *st,
                       int *started)
{
    if (st->m[0] == -INFINITY)
        return;
    if (*started) {
        job->kt->merge(run, st, job->c->head_dim);
        return;
    }
    run->m[0] = st->m[0], run->l[0] = st->l[0];
    memcpy(run->o, st->o, job->c->head_dim * sizeof(float));
    *started = 1;
}

/* All items of kv head g are done: per query row, fold the states it has in position order
 * (position 0 from its float row, chunks, and within a chunk the sinks before the window, then
 * the recent window), normalize into out, add the V offset when the row saw coded positions (so
 * a row that sees only position 0 and the window gets the same bits whatever the cache's
 * length). */
static void finish_head(const decode_job *job, size_t g)
{
    const i8a_cache *c = job->c;
    const size_t d = c->head_dim, nq = job->nq, rows = job->L.rows;
    float *rm = (float *)(job->base + job->L.run_m) + g * rows;
    float *rl = (float *)(job->base + job->L.run_l) + g * rows;
    float *v0 = (float *)(job->base + job->L.v_pos0) + g * d;
    if (c->k_first && c->v_sign)
        job->kt->rotate(c->v_first + g * d, d, c->v_sign, 0, v0);  /* once for the head's rows */
    else if (c->k_first)
        memcpy(v0, c->v_first + g * d, d * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        const size_t tt = r / nq, j = r % nq;
        float *o = job->out + (tt * job->h + g * nq + j) * d;
        const i8a_state run = {rm + r, rl + r, o};
        const visible_ranges vis = visible(c, job->t, tt, job->opt);
        const int off = row_offset(c, &vis);
        int started = vis.pos0;
        if (started)
            pos0_state(job, g, r, v0, off, &run);
        for (size_t vi = 0; vi < job->L.nvis; vi++) {
            for (size_t part = 0; part < job->L.parts; part++) {
                const i8a_state st = state_at(job, g, vi, part, r);
                fold_state(job, &run, &st, &started);
            }
        }
        if (c->recent) {
            const i8a_state win = window_at(job, g, r);
            fold_state(job, &run, &win, &started);
        }
        const float inv = 1.0f / rl[r];
        for (size_t i = 0; i < d; i++)
            o[i] = o[i] * inv;
        if (off)
            for (size_t i = 0; i < d; i++)
                o[i] = o[i] + c->v_offset[g * d + i];
        if (c->v_sign)
            job->kt->rotate(o, d, c->v_sign, 1, o);         /* back from the rotated space */
    }
}

/* Items [begin, end) of a decode: first every (kv head, visible chunk), kv head by kv head, then
 * every kv head's recent window. The windows come last so that each chunk prefetches the next
 * one (across kv heads too) as in a cache without a window; a window between two chunks broke
 * that chain, and the chunk after it started cold (3-4% at 2048 tokens, one thread). The
 * last chunk prefetches the first window. */
static void decode_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    const decode_job *job = (const decode_job *)ctx;
    const i8a_cache *c = job->c;
    const size_t nq = job->nq, rows = job->L.rows, nvis = job->L.nvis;
    const size_t chunks = c->n_kv_heads * nvis, items = c->n_kv_heads * job->L.per_head;
    float *scratch = (float *)(job->base + job->L.workers + worker * job->L.worker_bytes);
    atomic_size_t *left = (atomic_size_t *)(job->base + job->L.left);
    for (size_t item = begin; item < end; item++) {
        if (item >= chunks) {                               /* a kv head's recent window */
            const size_t g = item - chunks;
            window_item(job, g);
            if (atomic_fetch_sub_explicit(left + g, 1, memory_order_acq_rel) == 1)
                finish_head(job, g);
            continue;
        }
        const size_t g = item / nvis, vi = item % nvis;
        const size_t chunk = visible_chunk(&job->L.runs, vi);
        const i8a_span whole_span = chunk_span(c, g, chunk);
        const size_t c0 = chunk_start(c, chunk), c1 = c0 + whole_span.n;
        for (size_t part = 0; part < job->L.parts; part++) {
            const i8a_state st = state_at(job, g, vi, part, 0);
            for (size_t r = 0; r < rows; r++)
                st.m[r] = -INFINITY;                        /* empty until attended */
        }
        /* the whole chunk for every query: one pass serves all rows */
        int whole = 1;
        for (size_t tt = 0; tt < job->t && whole; tt++) {
            const visible_ranges v = visible(c, job->t, tt, job->opt);
            whole = v.win_begin <= c0 && c1 <= v.win_end;
        }
        const size_t then = item + 1 < end ? item + 1 : after;   /* this thread's next item */
        i8a_span next = {0};
        if (then < chunks)
            next = chunk_span(c, then / nvis, visible_chunk(&job->L.runs, then % nvis));
        else if (then < items)
            next = window_span(c, then - chunks);
        if (has_four(c))
            prefetch_four(c, &next);
        if (whole) {
            i8a_span span = whole_span;
            hint_next(&span, &next);
            const i8a_query q = query_at(job, g, 0, rows);
            const i8a_state st = state_at(job, g, vi, job->L.parts - 1, 0);
            I8A_EXPECT(span.n >= 1 && span.n <= I8A_CHUNK && q.nq >= 1);
            (has_four(c) ? job->kt->attend4 : job->kt->attend)(&q, &span, scratch, &st);
        } else {
            for (size_t tt = 0; tt < job->t; tt++) {
                const visible_ranges v = visible(c, job->t, tt, job->opt);
                const size_t range[2][2] = {{v.sink_begin, v.sink_end}, {v.win_begin, v.win_end}};
                for (size_t k = 0; k < 2; k++) {
                    const size_t a = range[k][0] > c0 ? range[k][0] : c0;
                    const size_t b = range[k][1] < c1 ? range[k][1] : c1;
                    if (a >= b)
                        continue;
                    i8a_span span = span_rows(c, g, a, b);
                    hint_next(&span, &next);
                    const i8a_query q = query_at(job, g, tt * nq, nq);
                    const i8a_state st = state_at(job, g, vi, job->L.parts == 2 ? k : 0, tt * nq);
                    I8A_EXPECT(span.n >= 1 && span.n <= I8A_CHUNK);
                    (has_four(c) ? job->kt->attend4 : job->kt->attend)(&q, &span, scratch, &st);
                }
            }
        }
        if (atomic_fetch_sub_explicit(left + g, 1, memory_order_acq_rel) == 1)
            finish_head(job, g);
    }
}

/* Set up job for a decode of cache c by its plan L: its workspace, the q planes and biases, the
 * chunk counters. Returns 0, or i8a_decode's codes with *bad the q row. */
static int prepare(const i8a_kernels *kt, i8a_cache *c, const float *q, size_t t, size_t h,
                   const i8a_options *opt, const layout L, float *out, decode_job *job,
                   size_t *bad)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, nq = h / hkv;
    I8A_EXPECT(t >= 1 && t <= c->length && h >= hkv && h % hkv == 0);
    if (reserve_work(c, L.end) != 0)
        return 3;
    const decode_job init = {kt, c, opt, (char *)c->work, L, t, h, nq, out};
    *job = init;
    int8_t *q_hi = (int8_t *)job->base, *q_lo = (int8_t *)(job->base + L.q_lo);
    float *c_hi = (float *)(job->base + L.c_hi), *c_lo = (float *)(job->base + L.c_lo);
    float *residual = (float *)(job->base + L.residual);
    float *bias = (float *)(job->base + L.bias);
    float *pos0_logit = (float *)(job->base + L.pos0_logit);
    float *q_float = (float *)(job->base + L.q_float);
    /* |q| may reach I8A_VALUE_MAX and I8A_QSCALE_MAX / scale, whichever is lower: the largest
     * float not above it (a float q is at most x exactly when it is at most that float) */
    double most = (double)I8A_QSCALE_MAX / (double)opt->scale;
    most = most < (double)I8A_VALUE_MAX ? most : (double)I8A_VALUE_MAX;
    float q_limit = (float)most;
    if ((double)q_limit > most)
        q_limit = nextafterf(q_limit, 0.0f);
    /* q rows in the order of the kernels: kv head, then query position, then head of the group */
    for (size_t tt = 0; tt < t; tt++) {
        for (size_t head = 0; head < h; head++) {
            const size_t g = head / nq, r = g * L.rows + tt * nq + head % nq;
            float tmp[I8A_MAX_HEAD_DIM];
            const float *q0 = q + (tt * h + head) * d;
            if (!within(q0, d, q_limit)) {
                *bad = tt * h + head;
                return in_range(q0, d) ? 2 : 1;
            }
            const float *qrow = maybe_rotated(kt, c, c->k_sign, q0, tmp);
            /* (K at 4 bits makes each group's planes from q_float in attend4) */
            if (c->k_bits == 8 && prepare_q(kt, qrow, d, opt->q_bits == 16, opt->scale,
                                            q_hi + r * d, q_lo + r * d, c_hi + r, c_lo + r,
                                            residual) != 0) {
                *bad = tt * h + head;
                return 1;
            }
            /* the logit of position 0 from its float row, and the K offset's part
             * of every other logit (both q.x * scale, the dot in double) */
            bias[r] = has_offsets(c)
                ? dot_scaled(qrow, c->k_offset + g * d, d, opt->scale) : 0.0f;
            if (c->k_first)
                pos0_logit[r] = dot_scaled(q0, c->k_first + g * d, d, opt->scale);
            if (c->recent || c->k_bits == 4)
                for (size_t i = 0; i < d; i++)
                    q_float[r * d + i] = q0[i] * opt->scale;
        }
    }
    atomic_size_t *left = (atomic_size_t *)(job->base + L.left);
    for (size_t g = 0; g < hkv; g++)
        atomic_init(left + g, L.per_head);
    return 0;
}

/* The items of a batch: cache b's (kv head, chunk) items are [first[b], first[b + 1]). */
typedef struct {
    const decode_job *jobs;
    const size_t *first;
} batch_job;

static void batch_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    const batch_job *batch = (const batch_job *)ctx;
    size_t b = 0;
    while (batch->first[b + 1] <= begin)
        b++;
    while (begin < end) {
        const size_t lo = batch->first[b], hi = batch->first[b + 1];
        const size_t stop = end < hi ? end : hi;
        const size_t then = stop < end ? stop : after;          /* the next item, if this cache's */
        decode_range((void *)&batch->jobs[b], begin - lo, stop - lo,
                     then >= lo && then < hi ? then - lo : hi - lo, worker);
        begin = stop;
        b++;
    }
}

/* Jobs on the stack up to this batch size, beyond it on the heap. */
#define I8A_BATCH_STACK 8

int i8a_decode_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *q,
                     size_t t, size_t h, const i8a_options *opt, size_t max_threads, float *out,
                     size_t *bad)
{
    I8A_EXPECT(n >= 1);
    I8A_EXPECT(opt->scale > 0.0f && opt->scale <= FLT_MAX);
    I8A_EXPECT(opt->q_bits == 16 || opt->q_bits == 8);
    I8A_EXPECT(opt->window ? opt->sinks <= opt->window : opt->sinks == 0);
    I8A_EXPECT(opt->softcap == 0.0f || (opt->softcap >= 0x1p-126f && opt->softcap <= 0x1p126f));
    I8A_EXPECT(max_threads >= 1);
    decode_job stack_jobs[I8A_BATCH_STACK];
    size_t stack_first[I8A_BATCH_STACK + 1];
    decode_job *jobs = stack_jobs;
    size_t *first = stack_first;
    if (n > I8A_BATCH_STACK) {
        jobs = (decode_job *)malloc(n * sizeof *jobs);
        first = (size_t *)malloc((n + 1) * sizeof *first);
        if (!jobs || !first) {
            free(jobs);
            free(first);
            return 3;
        }
    }
    /* one thread count for the whole batch, from the work of all its caches */
    size_t work = 0;
    first[0] = 0;
    for (size_t b = 0; b < n; b++) {
        jobs[b].L = plan(cs[b], t, h, opt);
        const size_t items = cs[b]->n_kv_heads * jobs[b].L.per_head;
        work += work_of(cs[b], t, h, items);
        first[b + 1] = first[b] + items;
    }
    const size_t threads = threads_for(work, first[n], max_threads);
    const size_t qsize = t * h * cs[0]->head_dim;
    int rc = 0;
    for (size_t b = 0; b < n && rc == 0; b++) {
        I8A_EXPECT(cs[b]->head_dim == cs[0]->head_dim && cs[b]->n_kv_heads == cs[0]->n_kv_heads);
        rc = prepare(kt, cs[b], q + b * qsize, t, h, opt, with_threads(jobs[b].L, threads),
                     out + b * qsize, &jobs[b], bad);
        if (rc != 0 && rc != 3)
            *bad += b * t * h;
    }
    if (rc == 0) {
        for (size_t b = 0; b < n; b++)              /* a cache whose queries see only position 0 */
            if (jobs[b].L.per_head == 0)
                for (size_t g = 0; g < cs[b]->n_kv_heads; g++)
                    finish_head(&jobs[b], g);
        const batch_job batch = {jobs, first};
        if (first[n])
            i8a_pool_run(first[n], threads, batch_range, (void *)&batch);
    }
    if (n > I8A_BATCH_STACK) {
        free(jobs);
        free(first);
    }
    return rc;
}

int i8a_decode(const i8a_kernels *kt, i8a_cache *c, const float *q, size_t t, size_t h,
               const i8a_options *opt, size_t max_threads, float *out, size_t *bad)
{
    return i8a_decode_batch(kt, &c, 1, q, t, h, opt, max_threads, out, bad);
}

typedef struct {
    const i8a_probe *probe;
    const i8a_cache *c;
    size_t chunks;
    _Atomic uint64_t sum;
} stream_job;

static void stream_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    (void)worker;
    stream_job *job = (stream_job *)ctx;
    const i8a_cache *c = job->c;
    const i8a_stream_fn stream = job->probe->stream;
    uint64_t x = 0;
    for (size_t item = begin; item < end; item++) {
        /* the same items, ranges and prefetch of the next item as a decode */
        const i8a_span s = chunk_span_to(c, item / job->chunks, item % job->chunks, c->length);
        const size_t then = item + 1 < end ? item + 1 : after;
        i8a_span next = {0};                                /* no next: NULL, no prefetch */
        if (then < c->n_kv_heads * job->chunks)
            next = chunk_span_to(c, then / job->chunks, then % job->chunks, c->length);
        const size_t d = c->head_dim, tiles = i8a_v_tiles(s.v_lead, s.n);
        if (s.k)
            x ^= stream(s.k, s.n * d, next.k);
        else                        /* K at 4 bits: codes, and the groups' halves and scales */
            x ^= stream(s.k4, s.n * d / 2, next.k4)
                 ^ stream(s.k4_min, i8a_k4_groups(s.n) * d * 2, NULL)
                 ^ stream(s.k4_step, i8a_k4_groups(s.n) * d * 2, NULL);
        if (s.v)
            x ^= stream(s.v, tiles * I8A_V_TILE * d, next.v);
        else
            x ^= stream(s.v4, tiles * 2 * d, next.v4) ^ stream(s.v4_min, s.n * sizeof(float), NULL);
        if (s.ks)
            x ^= stream(s.ks, s.n * sizeof(float), NULL);
        x ^= stream(s.vs, s.n * sizeof(float), NULL);
    }
    atomic_fetch_xor_explicit(&job->sum, x, memory_order_relaxed);
}

uint64_t i8a_stream_read(const i8a_probe *probe, const i8a_cache *c, size_t threads)
{
    stream_job job = {probe, c, n_chunks(c), 0};
    i8a_pool_run(c->n_kv_heads * job.chunks, threads, stream_range, &job);
    return atomic_load(&job.sum);
}

void i8a_rotation_signs(uint64_t seed, size_t d, float *sign)
{
    uint64_t state = seed;
    for (size_t i = 0; i < d; i++) {
        state += 0x9E3779B97F4A7C15u;                       /* splitmix64 */
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
        z ^= z >> 31;
        sign[i] = z >> 63 ? -1.0f : 1.0f;
    }
}

/* Coded position pos of kv head g as floats into yk, yv: code * scale, plus the offset when
 * `off`, rotated back. */
static void dequantize_row(const i8a_kernels *kt, const i8a_cache *c, size_t g, size_t pos,
                           int off, float *yk, float *yv)
{
    const size_t d = c->head_dim, row = g * c->max_seq + pos;
    if (c->k_bits == 8)
        for (size_t i = 0; i < d; i++)
            yk[i] = (float)c->k_codes[row * d + i] * c->k_scale[row];
    else
        k4_value(c, g, pos, yk);
    if (c->v_bits == 8) {
        int8_t vc[I8A_MAX_HEAD_DIM];
        v_get(c, g, pos, vc);
        for (size_t i = 0; i < d; i++)
            yv[i] = (float)vc[i] * c->v_scale[row];
    } else {
        uint8_t vc[I8A_MAX_HEAD_DIM];
        v4_get(c, g, pos, vc);
        for (size_t i = 0; i < d; i++)
            yv[i] = c->v4_min[row] + c->v_scale[row] * (float)vc[i];
    }
    if (off)
        for (size_t i = 0; i < d; i++) {
            yk[i] = yk[i] + c->k_offset[g * d + i];
            yv[i] = yv[i] + c->v_offset[g * d + i];
        }
    if (c->k_sign)
        kt->rotate(yk, d, c->k_sign, 1, yk);
    if (c->v_sign)
        kt->rotate(yv, d, c->v_sign, 1, yv);
}

void i8a_dequantize(const i8a_kernels *kt, const i8a_cache *c, float *k, float *v)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, fw = i8a_window_start(c);
    const int off = has_offsets(c);
    for (size_t pos = 0; pos < c->length; pos++) {
        if (pos >= fw) {                /* the window: its halves, scaled */
            for (size_t g = 0; g < hkv; g++) {
                widen_row(c, c->k_recent, c->k_rscale, g, slot_of(c, pos), k + (pos * hkv + g) * d);
                widen_row(c, c->v_recent, c->v_rscale, g, slot_of(c, pos), v + (pos * hkv + g) * d);
            }
            continue;
        }
        for (size_t g = 0; g < hkv; g++) {
            const size_t at = (pos * hkv + g) * d;
            if (c->k_first && pos == 0) {
                memcpy(k + at, c->k_first + g * d, d * sizeof(float));
                memcpy(v + at, c->v_first + g * d, d * sizeof(float));
            } else {
                dequantize_row(kt, c, g, pos, off && pos >= 1, k + at, v + at);
            }
        }
    }
}

void i8a_evict(const i8a_kernels *kt, i8a_cache *c, size_t n)
{
    I8A_EXPECT(n <= c->length);
    const size_t d = c->head_dim, hkv = c->n_kv_heads, cap = c->max_seq, keep = c->length - n;
    if (n == 0)
        return;
    if (c->k_first && keep > 0) {   /* position n, as decode read it, becomes the float row */
        if (n >= i8a_window_start(c)) {
            for (size_t g = 0; g < hkv; g++) {
                widen_row(c, c->k_recent, c->k_rscale, g, slot_of(c, n), c->k_first + g * d);
                widen_row(c, c->v_recent, c->v_rscale, g, slot_of(c, n), c->v_first + g * d);
            }
        } else {
            /* clamped to the format's range, which first rows keep (as load checks): rounding
             * in the rotated space can take a value at the edge of the range past it */
            for (size_t g = 0; g < hkv; g++) {
                float *yk = c->k_first + g * d, *yv = c->v_first + g * d;
                dequantize_row(kt, c, g, n, has_offsets(c), yk, yv);
                for (size_t i = 0; i < d; i++) {
                    yk[i] = fminf(fmaxf(yk[i], -I8A_VALUE_MAX), I8A_VALUE_MAX);
                    yv[i] = fminf(fmaxf(yv[i], -I8A_VALUE_MAX), I8A_VALUE_MAX);
                }
            }
        }
    }
    I8A_EXPECT(c->k_bits == 8 || n % I8A_K4_GROUP == 0);
    const size_t groups = i8a_k4_groups(cap), gone = n / I8A_K4_GROUP;
    const size_t kept_groups = i8a_k4_groups(keep);
    for (size_t g = 0; g < hkv; g++) {
        if (c->k_bits == 8) {
            memmove(c->k_codes + g * cap * d, c->k_codes + (g * cap + n) * d, keep * d);
            memmove(c->k_scale + g * cap, c->k_scale + g * cap + n, keep * sizeof(float));
        } else {                    /* whole groups: their codes, halves and scales */
            memmove(k4_row_codes(c, g, 0), k4_row_codes(c, g, n), keep * (d / 2));
            memmove(c->k4_min + g * groups * d, c->k4_min + (g * groups + gone) * d,
                    kept_groups * d * sizeof(uint16_t));
            memmove(c->k4_step + g * groups * d, c->k4_step + (g * groups + gone) * d,
                    kept_groups * d * sizeof(uint16_t));
            memmove(c->k4_min_scale + g * groups, c->k4_min_scale + g * groups + gone,
                    kept_groups * sizeof(float));
            memmove(c->k4_step_scale + g * groups, c->k4_step_scale + g * groups + gone,
                    kept_groups * sizeof(float));
        }
        if (c->v_bits == 8 && n % I8A_V_TILE == 0) {
            memmove(v_tile(c, g, 0), v_tile(c, g, n), i8a_v_tiles(0, keep) * I8A_V_TILE * d);
        } else if (c->v_bits == 4 && n % I8A_V_TILE == 0) {
            memmove(v4_tile(c, g, 0), v4_tile(c, g, n), i8a_v_tiles(0, keep) * 2 * d);
        } else {                    /* position by position, upwards: p + n is read before p + n
                                     * is written (every position's bytes are its own) */
            for (size_t p = 0; p < keep; p++) {
                if (c->v_bits == 8) {
                    int8_t vc[I8A_MAX_HEAD_DIM];
                    v_get(c, g, p + n, vc);
                    v_put(c, g, p, vc);
                } else {
                    uint8_t vc[I8A_MAX_HEAD_DIM];
                    v4_get(c, g, p + n, vc);
                    v4_put(c, g, p, vc);
                }
            }
        }
        memmove(c->v_scale + g * cap, c->v_scale + g * cap + n, keep * sizeof(float));
        if (c->v_bits == 4)
            memmove(c->v4_min + g * cap, c->v4_min + g * cap + n, keep * sizeof(float));
    }
    if (c->ring)                    /* slot (p + n + shift) % ring now holds position p */
        c->ring_shift = (c->ring_shift + n) % c->ring;
    c->held_from = c->held_from > n ? c->held_from - n : 0;
    c->length = keep;
}
