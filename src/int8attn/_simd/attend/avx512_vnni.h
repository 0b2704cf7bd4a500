/* attend/avx512_vnni.h: attend[k][v]: one chunk of a query group, the passes above in the
 * contract's order; the avx512_vnni tier's, bit for bit attend/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_ATTEND_AVX512_VNNI_H
#define I8A_ATTEND_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "attend/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

static void i8a_attend_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    /* dh in the second half of the scratch, dl in the first: head j's logits overwrite its
     * own dl element by element, each read before it is written, and its planes its dh */
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    i8a_kdots_avx512_vnni(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = i8a_logits_avx512_vnni(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                               q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                               q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        out->m[j] = m;
        out->l[j] = i8a_softmax_avx512_vnni(p, kv->vs, n, m);
        i8a_planes_avx512_vnni(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j), I8A_WPLANES8);
    }
    size_t j = 0, pf_n = kv->next_n;   /* the first group prefetches the next chunk's V */
    for (; j + 4 <= nq; j += 4, pf_n = 0)
        i8a_vtiles_group_avx512_vnni(scratch, nq, j, 4, kv, d, out->o, pf_n);
    switch (nq - j) {
    case 3: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 3, kv, d, out->o, pf_n); break;
    case 2: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 2, kv, d, out->o, pf_n); break;
    case 1: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 1, kv, d, out->o, pf_n); break;
    default: break;
    }
    i8a_vtop_with(i8a_vtop_row_avx512_vnni, scratch, nq, kv, d, 0, out->o);
}

/* Every head's weights after the K pass (attend4's middle, the amx tier's too): its logits (K at
 * 8 bits: from the dots dh, dl; at 4 bits: out->m already, when k4_tiled made them, else group
 * by group), m and l, the softmax with V's minima at 4 bits, the planes of the side's width. */
I8A_INLINE void i8a_weights_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out, const int k4, const int v4,
                                        const int k4_tiled)
{
    const size_t n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m;
        if (k4_tiled)
            m = out->m[j];
        else if (!k4)
            m = i8a_logits_avx512_vnni(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                       q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                       q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        else if (q->two_planes)
            m = i8a_k4_logits_avx512_vnni(q, kv, j, p, extra, I8A_K4_QPLANES);
        else
            m = i8a_k4_logits_avx512_vnni(q, kv, j, p, extra, 1);
        out->m[j] = m;
        if (v4)
            out->l[j] = i8a_softmax4_avx512_vnni(p, kv->vs, kv->v4_min, n, m,
                                                 i8a_vmin_sum_at(scratch, nq, j));
        else
            out->l[j] = i8a_softmax_avx512_vnni(p, kv->vs, n, m);
        i8a_planes_avx512_vnni(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j),
                               v4 ? I8A_WPLANES4 : I8A_WPLANES8);
    }
}

/* attend4 (dispatch.h) in attend's order, the 4-bit passes vectorized: K at 8 bits by attend's
 * dots, at 4 bits group by group (i8a_k4_logits_avx512_vnni); the softmax with V's minima; the
 * planes; the V pass of the side's width. */
I8A_INLINE void i8a_attend4_body_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                             const i8a_state *out, const int k4, const int v4)
{
    const size_t d = q->d, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    const int k4_tiled = k4 && nq >= 2, k4_np = q->two_planes ? I8A_K4_QPLANES : 1;
    if (!k4)
        i8a_kdots_avx512_vnni(q, kv, dh, dl);
    else if (k4_tiled)      /* every head's logits, into p and out->m */
        i8a_k4_logits_tiled_avx512_vnni(q, kv, scratch, extra, k4_np, out->m);
    i8a_weights_avx512_vnni(q, kv, scratch, out, k4, v4, k4_tiled);
    if (v4) {
        i8a_v4pass_avx512_vnni(scratch, nq, kv, d, out->o);
        i8a_vtop_with(i8a_vtop_row_avx512_vnni, scratch, nq, kv, d, 1, out->o);
        return;
    }
    size_t j = 0, pf_n = kv->next_n;
    for (; j + 4 <= nq; j += 4, pf_n = 0)
        i8a_vtiles_group_avx512_vnni(scratch, nq, j, 4, kv, d, out->o, pf_n);
    switch (nq - j) {
    case 3: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 3, kv, d, out->o, pf_n); break;
    case 2: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 2, kv, d, out->o, pf_n); break;
    case 1: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 1, kv, d, out->o, pf_n); break;
    default: break;
    }
    i8a_vtop_with(i8a_vtop_row_avx512_vnni, scratch, nq, kv, d, 0, out->o);
}

/* The three entries of attend[k][v] with a side at 4 bits: the body above, its flags constant. */
static void i8a_attend_k8v4_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out)
{
    i8a_attend4_body_avx512_vnni(q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out)
{
    i8a_attend4_body_avx512_vnni(q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out)
{
    i8a_attend4_body_avx512_vnni(q, kv, scratch, out, 1, 1);
}

#endif
