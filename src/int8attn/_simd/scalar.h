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

/* Each query head against a chunk, in the contract's order:
 *   logit[s] by i8a_logit_capped (common.h);  m = max_s logit[s];
 *   p[s] = exp(logit[s] - m);  l = the 16-lane sum of p (common.h);
 *   w[s] = p[s] * v_scale[s] into three integer planes, and o from their integer sums
 *   (common.h) */
static void i8a_attend_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                              const i8a_state *out)
{
    for (size_t j = 0; j < q->nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = i8a_logits8_scalar(q, kv, j, p);
        float lane[I8A_SUM_LANES] = {0.0f};
        for (size_t s = 0; s < kv->n; s++) {
            p[s] = i8a_exp_scalar(p[s] - m);
            lane[s % I8A_SUM_LANES] += p[s];
        }
        for (size_t s = 0; s < kv->n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_scalar(p, kv->n, kv->v_lead, i8a_planes_at(scratch, q->nq, j));
        out->m[j] = m;
        out->l[j] = i8a_reduce_lanes(lane);
    }
    i8a_vpass8_scalar(scratch, q->nq, kv, q->d, out->o);
}

/* attend[k][v] with a side at 4 bits: common.h's body (the reference of every tier's), its
 * flags constant. */
static void i8a_attend_k8v4_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    i8a_attend4_body(q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    i8a_attend4_body(q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    i8a_attend4_body(q, kv, scratch, out, 1, 1);
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
