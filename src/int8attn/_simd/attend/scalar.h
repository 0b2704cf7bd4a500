/* attend/scalar.h: attend[k][v]: one chunk of a query group, the passes above in the contract's
 * order. The rule every tier equals bit for bit (the scalar forms, in the contract's order) and
 * the scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h
 * in dependency order. */
#ifndef I8A_ATTEND_SCALAR_H
#define I8A_ATTEND_SCALAR_H

/* attend4 (dispatch.h) in the order of i8a_attend_scalar: per query head, the logits (K at 8
 * or 4 bits), m, p = exp(logit - m), l = the 16-lane sum of p; with V at 4 bits also sum_s p_s
 * vmin_s in the same lane order (multiply, then add); the weights p * vs (V's scales or steps)
 * in integer planes and the top row; then the V pass of the side's width. */
I8A_INLINE void i8a_attend4_body(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out, const int k4, const int v4)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = k4 ? i8a_logits4_scalar(q, kv, j, p, extra)
                               : i8a_logits8_scalar(q, kv, j, p);
        float lane[I8A_SUM_LANES] = {0.0f}, mlane[I8A_SUM_LANES] = {0.0f};
        for (size_t s = 0; s < n; s++) {
            p[s] = i8a_exp_scalar(p[s] - m);
            lane[s % I8A_SUM_LANES] += p[s];
            if (v4)
                mlane[s % I8A_SUM_LANES] += p[s] * kv->v4_min[s];
        }
        for (size_t s = 0; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_scalar(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j),
                          v4 ? I8A_WPLANES4 : I8A_WPLANES8);
        *i8a_vmin_sum_at(scratch, nq, j) = i8a_reduce_lanes(mlane);
        out->m[j] = m;
        out->l[j] = i8a_reduce_lanes(lane);
    }
    if (v4)
        i8a_vpass4_scalar(scratch, nq, kv, d, out->o);
    else
        i8a_vpass8_scalar(scratch, nq, kv, d, out->o);
    i8a_vtop_with(i8a_vtop_row_scalar, scratch, nq, kv, d, v4, out->o);
}

/* Each query head against a chunk, in the contract's order:
 *   logit[s] by i8a_logit_capped (kdots/scalar.h);  m = max_s logit[s];
 *   p[s] = exp(logit[s] - m);  l = the 16-lane sum of p (core/scalar.h);
 *   w[s] = p[s] * v_scale[s]: the largest kept exact, the rest in two integer planes; o from
 *   their integer sums, then the top row (planes/scalar.h, vpass/scalar.h) */
static inline void i8a_attend_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
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
        i8a_planes_scalar(p, kv->n, kv->v_lead, i8a_planes_at(scratch, q->nq, j), I8A_WPLANES8);
        out->m[j] = m;
        out->l[j] = i8a_reduce_lanes(lane);
    }
    i8a_vpass8_scalar(scratch, q->nq, kv, q->d, out->o);
    i8a_vtop_with(i8a_vtop_row_scalar, scratch, q->nq, kv, q->d, 0, out->o);
}

/* attend[k][v] with a side at 4 bits: the body above (the reference of every tier's), its
 * flags constant. */
static inline void i8a_attend_k8v4_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    i8a_attend4_body(q, kv, scratch, out, 0, 1);
}

static inline void i8a_attend_k4v8_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    i8a_attend4_body(q, kv, scratch, out, 1, 0);
}

static inline void i8a_attend_k4v4_scalar(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    i8a_attend4_body(q, kv, scratch, out, 1, 1);
}

#endif
