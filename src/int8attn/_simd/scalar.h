/* The scalar tier: the reference. The order of every floating-point operation in decode is
 * defined here; the SIMD tiers do the same operations in the same order, lanes side by side.
 * Compiled at the baseline of the target, with no ISA attributes.
 */
#ifndef I8A_SCALAR_H
#define I8A_SCALAR_H

#include "common.h"

static int i8a_quantize_row_scalar(const float *x, size_t d, int8_t *codes, float *scale)
{
    float inv;
    const int todo = i8a_row_prepare(x, 0, d, 0.0f, 1, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    for (size_t i = 0; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

/* |sum| <= 127 * 127 * 1024 < 2^24: exact in int32, and exact again when converted to float. */
static inline int32_t i8a_dot_scalar(const int8_t *a, const int8_t *b, size_t d)
{
    int32_t acc = 0;
    for (size_t i = 0; i < d; i++)
        acc += (int32_t)a[i] * (int32_t)b[i];
    return acc;
}

/* The integer V pass (common.h) of heads [0, nq): the planes' sums over the span's tiles, then
 * o. */
static void i8a_vpass_scalar(float *scratch, size_t nq, const i8a_span *kv, size_t d, float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t i = 0; i < d; i++) {
            int32_t S[I8A_WPLANES] = {0};
            for (size_t t = 0; t < tiles; t++) {
                const int8_t *x = kv->v + (t * d + i) * I8A_V_TILE;
                for (size_t r = 0; r < I8A_V_TILE; r++)
                    for (int k = 0; k < I8A_WPLANES; k++)
                        S[k] += (int32_t)slot[k * I8A_PLANE_BYTES + t * I8A_V_TILE + r] * x[r];
            }
            o[j * d + i] = i8a_v_out(S, sc);
        }
    }
}

/* Each query head against a chunk, in the contract's order:
 *   logit[s] by i8a_logit_capped (common.h);  m = max_s logit[s];
 *   p[s] = exp(logit[s] - m);  l = the 16-lane sum of p (common.h);
 *   w[s] = p[s] * v_scale[s] into three integer planes, and o from their integer sums
 *   (common.h) */
static void i8a_attend_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                              const i8a_state *out)
{
    const size_t d = q->d, n = kv->n;
    for (size_t j = 0; j < q->nq; j++) {
        const int8_t *qh = q->q_hi + j * d;
        const int8_t *ql = q->q_lo + j * d;
        float *p = scratch + j * I8A_CHUNK;
        float m = 0.0f;
        for (size_t s = 0; s < n; s++) {
            const int8_t *kr = kv->k + s * d;
            int32_t dl = q->two_planes ? i8a_dot_scalar(ql, kr, d) : 0;
            const float lg = i8a_logit_capped(i8a_dot_scalar(qh, kr, d), dl, q->c_hi[j],
                                              q->c_lo[j], q->two_planes, kv->ks[s], q->bias[j],
                                              q->softcap, q->inv_softcap);
            p[s] = lg;
            m = (s == 0 || lg > m) ? lg : m;
        }
        float lane[I8A_SUM_LANES] = {0.0f};
        for (size_t s = 0; s < n; s++) {
            p[s] = i8a_exp_scalar(p[s] - m);
            lane[s % I8A_SUM_LANES] += p[s];
        }
        for (size_t s = 0; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_scalar(p, n, kv->v_lead, i8a_planes_at(scratch, q->nq, j));
        out->m[j] = m;
        out->l[j] = i8a_reduce_lanes(lane);
    }
    i8a_vpass_scalar(scratch, q->nq, kv, d, out->o);
}

static void i8a_merge_scalar(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    for (size_t i = 0; i < d; i++)
        ro[i] = fmaf(co[i], b, ro[i] * a);
}

static uint64_t i8a_stream_scalar(const void *p, size_t bytes, const void *next)
{
    (void)next;
    return i8a_fold_tail((const unsigned char *)p, bytes);
}

static void i8a_attend_float_scalar(const float *q, const i8a_float_rows *w, size_t d,
                                    float cap, float *logit, float *m, float *l, float *o)
{
    i8a_attend_float_body(q, w, d, cap, logit, m, l, o, i8a_dots4_scalar, i8a_exps_scalar,
                          i8a_vsum_scalar);
}

static float i8a_half_row_scalar(const float *x, size_t d, uint16_t *h)
{
    return i8a_half_row_body(x, d, h);
}

/* The rotation: the body of common.h, compiled per tier (each tier's ISA vectorizes it). */
static void i8a_rotate_scalar(const float *x, size_t d, const float *sign, int inverse, float *y)
{
    i8a_rotate_body(x, d, sign, inverse, y);
}

#endif
