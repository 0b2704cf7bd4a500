/* attend/neon.h: attend[k][v]: one chunk of a query group, the passes above in the contract's
 * order; the neon tier's, bit for bit attend/scalar.h's rule. Included only by ../neon.h (the
 * aarch64 baseline: no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_ATTEND_NEON_H
#define I8A_ATTEND_NEON_H

#ifndef I8A_NEON_H
#error "attend/neon.h is included by ../neon.h only"
#endif

/* The attend of the aarch64 tiers; only the K pass (kdots: the dots of every head with the
 * chunk's rows) and the V pass differ. */
I8A_INLINE void i8a_attend_with_neon(i8a_kdots_neon_fn kdots, i8a_vpass_neon_fn vpass,
                                     const i8a_query *q, const i8a_span *kv, float *scratch,
                                     const i8a_state *out)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    /* dh in the second half of the scratch, dl in the first: head j's logits overwrite its
     * own dl element by element, each read before it is written, and its planes its dh */
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    kdots(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = i8a_logits_neon(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                        q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                        q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->m[j] = m;
        out->l[j] = i8a_softmax_neon(p, n, m);
        size_t s = 0;
        for (; s + 4 <= n; s += 4)
            vst1q_f32(p + s, vmulq_f32(vld1q_f32(p + s), vld1q_f32(kv->vs + s)));
        for (; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_neon(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j), I8A_WPLANES8);
    }
    vpass(scratch, nq, kv, d, out->o);
    i8a_vtop_with(i8a_vtop_row_scalar, scratch, nq, kv, d, 0, out->o);
}

static void i8a_attend_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                            const i8a_state *out)
{
    i8a_attend_with_neon(i8a_kdots_neon, i8a_vpass_neon, q, kv, scratch, out);
}

/* attend4 of the aarch64 tiers (dispatch.h): K at 8 bits by the tier's K pass (kdots), at 4
 * bits group by group with the given dot step; the softmax, V's minima, the planes; the V pass
 * of the side's width (vpass8, vpass4: the tier's). */
I8A_INLINE void i8a_attend4_with_neon(i8a_dot16_neon_fn dot16, i8a_kdots_neon_fn kdots,
                                      i8a_vpass_neon_fn vpass8, i8a_vpass_neon_fn vpass4,
                                      const i8a_query *q,
                                      const i8a_span *kv, float *scratch, const i8a_state *out,
                                      const int k4, const int v4)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    if (!k4)
        kdots(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m;
        if (!k4)
            m = i8a_logits_neon(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes, q->bias[j],
                                q->softcap, q->inv_softcap, kv->ks, n, p);
        else if (q->two_planes)
            m = i8a_k4_logits_with_neon(dot16, q, kv, j, p, extra, I8A_K4_QPLANES);
        else
            m = i8a_k4_logits_with_neon(dot16, q, kv, j, p, extra, 1);
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->m[j] = m;
        out->l[j] = i8a_softmax_neon(p, n, m);
        if (v4)
            *i8a_vmin_sum_at(scratch, nq, j) = i8a_vmin_sum_neon(p, kv->v4_min, n);
        size_t s = 0;
        for (; s + 4 <= n; s += 4)
            vst1q_f32(p + s, vmulq_f32(vld1q_f32(p + s), vld1q_f32(kv->vs + s)));
        for (; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_neon(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j),
                        v4 ? I8A_WPLANES4 : I8A_WPLANES8);
    }
    (v4 ? vpass4 : vpass8)(scratch, nq, kv, d, out->o);
    i8a_vtop_with(i8a_vtop_row_scalar, scratch, nq, kv, d, v4, out->o);
}

static void i8a_attend_k8v4_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon, i8a_kdots_neon, i8a_vpass_neon, i8a_v4pass_neon, q, kv,
                          scratch, out, 0, 1);
}

static void i8a_attend_k4v8_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon, i8a_kdots_neon, i8a_vpass_neon, i8a_v4pass_neon, q, kv,
                          scratch, out, 1, 0);
}

static void i8a_attend_k4v4_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon, i8a_kdots_neon, i8a_vpass_neon, i8a_v4pass_neon, q, kv,
                          scratch, out, 1, 1);
}

#endif
