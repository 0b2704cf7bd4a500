#include "_engine.h"

#include <string.h>

int i8a_append(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
               size_t t, size_t *bad)
{
    const size_t d = c->d;
    for (size_t r = 0; r < t * c->hkv; r++) {
        const size_t tok = r / c->hkv, head = r % c->hkv;
        const size_t row = head * c->cap + c->len + tok;
        if (kt->quantize_row(k + r * d, d, c->k + row * d, c->ks + row) != 0) {
            *bad = r;
            return 1;
        }
        if (kt->quantize_row(v + r * d, d, c->v + row * d, c->vs + row) != 0) {
            *bad = r;
            return 2;
        }
    }
    return 0;
}

/* Scratch layout, each part 64-byte aligned:
 *   q_hi, q_lo [h][d] int8;  c_hi, c_lo [h] float;  residual [d] float;
 *   chunk state m, l [nq], o [nq][d];  running m, l [nq];  logits [nq][I8A_CHUNK] float. */
static size_t i8a_align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

size_t i8a_decode_scratch_size(size_t h, size_t hkv, size_t d)
{
    const size_t nq = h / hkv, f = sizeof(float);
    return 2 * i8a_align64(h * d) + 2 * i8a_align64(h * f) + i8a_align64(d * f)
         + 4 * i8a_align64(nq * f) + i8a_align64(nq * d * f) + i8a_align64(nq * I8A_CHUNK * f);
}

/* The two q planes of one query row: q_hi, s_hi quantize q; q_lo, s_lo quantize the residual
 * q - float(q_hi) * s_hi (multiply, then subtract). */
static int i8a_prepare_q(const i8a_kernels *kt, const float *q, size_t d, int two_planes,
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

int i8a_decode(const i8a_kernels *kt, const i8a_cache *c, const float *q, size_t h, float scale,
               int q_bits, float *out, void *scratch, size_t *bad)
{
    const size_t d = c->d, hkv = c->hkv, nq = h / hkv, f = sizeof(float);
    const int two = q_bits == 16;
    char *p = (char *)scratch;
    int8_t *q_hi = (int8_t *)p;            p += i8a_align64(h * d);
    int8_t *q_lo = (int8_t *)p;            p += i8a_align64(h * d);
    float *c_hi = (float *)p;              p += i8a_align64(h * f);
    float *c_lo = (float *)p;              p += i8a_align64(h * f);
    float *residual = (float *)p;          p += i8a_align64(d * f);
    float *cm = (float *)p;                p += i8a_align64(nq * f);
    float *cl = (float *)p;                p += i8a_align64(nq * f);
    float *rm = (float *)p;                p += i8a_align64(nq * f);
    float *rl = (float *)p;                p += i8a_align64(nq * f);
    float *co = (float *)p;                p += i8a_align64(nq * d * f);
    float *logits = (float *)p;

    for (size_t r = 0; r < h; r++) {
        if (i8a_prepare_q(kt, q + r * d, d, two, scale, q_hi + r * d, q_lo + r * d, c_hi + r,
                          c_lo + r, residual) != 0) {
            *bad = r;
            return 1;
        }
    }
    const i8a_state chunk = {cm, cl, co};
    for (size_t g = 0; g < hkv; g++) {
        const size_t r0 = g * nq;
        const i8a_query query = {d, nq, two, q_hi + r0 * d, q_lo + r0 * d, c_hi + r0, c_lo + r0};
        const i8a_state run = {rm, rl, out + r0 * d};
        for (size_t s0 = 0; s0 < c->len; s0 += I8A_CHUNK) {
            const size_t row = g * c->cap + s0;
            const size_t n = c->len - s0 < I8A_CHUNK ? c->len - s0 : I8A_CHUNK;
            const i8a_span span = {c->k + row * d, c->v + row * d, c->ks + row, c->vs + row, n};
            if (s0 == 0) {
                kt->attend(&query, &span, logits, &run);
            } else {
                kt->attend(&query, &span, logits, &chunk);
                kt->merge(&run, &chunk, nq, d);
            }
        }
        for (size_t j = 0; j < nq; j++) {
            const float inv = 1.0f / rl[j];
            float *o = out + (r0 + j) * d;
            for (size_t i = 0; i < d; i++)
                o[i] = o[i] * inv;
        }
    }
    return 0;
}
