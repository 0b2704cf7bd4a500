/* kdots/neon.h: K at 8 bits: the exact int8 dots of the q planes with K rows, and the logits; the
 * neon tier's, bit for bit kdots/scalar.h's rule. Included only by ../neon.h (the aarch64
 * baseline: no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_KDOTS_NEON_H
#define I8A_KDOTS_NEON_H

#ifndef I8A_NEON_H
#error "kdots/neon.h is included by ../neon.h only"
#endif

/* acc += pair sums of a . b over 16 bytes, widening through int16. */
I8A_INLINE int32x4_t i8a_dot16_neon(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(acc, p);
}

typedef int32x4_t (*i8a_dot16_neon_fn)(int32x4_t acc, int8x16_t a, int8x16_t b);

/* Dots of two q planes with one k row (k loaded once), with the given 16-byte dot step. */
I8A_INLINE void i8a_dot2_with_neon(i8a_dot16_neon_fn dot16, const int8_t *qh, const int8_t *ql,
                                   const int8_t *k, size_t d, int two, int32_t *dh, int32_t *dl)
{
    int32x4_t ah = vdupq_n_s32(0), al = vdupq_n_s32(0);
    for (size_t i = 0; i < d; i += 16) {
        int8x16_t kk = vld1q_s8(k + i);
        ah = dot16(ah, vld1q_s8(qh + i), kk);
        if (two)
            al = dot16(al, vld1q_s8(ql + i), kk);
    }
    *dh = vaddvq_s32(ah);
    *dl = two ? vaddvq_s32(al) : 0;
}

/* Exact dots of every query head's planes with rows [0, n) of the chunk, four rows at a time
 * (the rows of a group stay in L1 while each head passes over them), with the given 16-byte
 * dot step; prefetches the next chunk's K one group of rows per group. */
I8A_INLINE void i8a_kdots_rows_neon(i8a_dot16_neon_fn dot16, const i8a_query *q,
                                    const i8a_span *kv, int32_t *dh, int32_t *dl,
                                    const int one_run)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    const int8_t *rows[I8A_CHUNK];              /* rows in blocks: found once for all heads */
    if (!one_run)
        i8a_krows(kv, d, rows);
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        if (s < kv->next_n)
            i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                              (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
        const int8_t *r0 = i8a_krow_of(kv, rows, s, d, one_run);
        const int8_t *r1 = i8a_krow_of(kv, rows, s + 1, d, one_run);
        const int8_t *r2 = i8a_krow_of(kv, rows, s + 2, d, one_run);
        const int8_t *r3 = i8a_krow_of(kv, rows, s + 3, d, one_run);
        for (size_t j = 0; j < q->nq; j++) {
            const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
            int32x4_t h0 = vdupq_n_s32(0), h1 = h0, h2 = h0, h3 = h0;
            int32x4_t l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            for (size_t i = 0; i < d; i += 16) {
                int8x16_t k0 = vld1q_s8(r0 + i), k1 = vld1q_s8(r1 + i);
                int8x16_t k2 = vld1q_s8(r2 + i), k3 = vld1q_s8(r3 + i);
                int8x16_t a = vld1q_s8(qh + i);
                h0 = dot16(h0, a, k0), h1 = dot16(h1, a, k1);
                h2 = dot16(h2, a, k2), h3 = dot16(h3, a, k3);
                if (two) {
                    int8x16_t b = vld1q_s8(ql + i);
                    l0 = dot16(l0, b, k0), l1 = dot16(l1, b, k1);
                    l2 = dot16(l2, b, k2), l3 = dot16(l3, b, k3);
                }
            }
            /* pairwise adds leave the four row sums in order */
            vst1q_s32(dh + j * I8A_CHUNK + s, vpaddq_s32(vpaddq_s32(h0, h1), vpaddq_s32(h2, h3)));
            if (two)
                vst1q_s32(dl + j * I8A_CHUNK + s, vpaddq_s32(vpaddq_s32(l0, l1), vpaddq_s32(l2, l3)));
        }
    }
    for (; s < n; s++)
        for (size_t j = 0; j < q->nq; j++)
            i8a_dot2_with_neon(dot16, q->q_hi + j * d, q->q_lo + j * d,
                               i8a_krow_of(kv, rows, s, d, one_run), d, two,
                               dh + j * I8A_CHUNK + s, dl + j * I8A_CHUNK + s);
}

/* i8a_kdots_rows_neon with the span's layout a constant (one run: a contiguous cache). */
I8A_INLINE void i8a_kdots_with_neon(i8a_dot16_neon_fn dot16, const i8a_query *q,
                                    const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    if (i8a_one_run(kv))
        i8a_kdots_rows_neon(dot16, q, kv, dh, dl, 1);
    else
        i8a_kdots_rows_neon(dot16, q, kv, dh, dl, 0);
}

typedef void (*i8a_kdots_neon_fn)(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                  int32_t *dl);

/* The neon tier's K pass (attend's kdots). */
I8A_INLINE void i8a_kdots_neon(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    i8a_kdots_with_neon(i8a_dot16_neon, q, kv, dh, dl);
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, four at a time; returns max_s p[s]. */
I8A_INLINE float i8a_logits_neon(const int32_t *dh, const int32_t *dl, float c_hi, float c_lo,
                                 int two, float bias, float cap, float inv_cap, const float *ks,
                                 size_t n, float *p)
{
    float32x4_t vmax = vdupq_n_f32(-FLT_MAX);
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        float32x4_t lg = vmulq_n_f32(vcvtq_f32_s32(vld1q_s32(dh + s)), c_hi);
        if (two)
            lg = vfmaq_n_f32(lg, vcvtq_f32_s32(vld1q_s32(dl + s)), c_lo);
        lg = vaddq_f32(vmulq_f32(lg, vld1q_f32(ks + s)), vdupq_n_f32(bias));
        if (cap > 0.0f)
            lg = i8a_softcap4_neon(lg, cap, inv_cap);
        vst1q_f32(p + s, lg);
        vmax = vmaxq_f32(vmax, lg);
    }
    float m = vmaxvq_f32(vmax);
    for (; s < n; s++) {
        p[s] = i8a_logit_capped(dh[s], two ? dl[s] : 0, c_hi, c_lo, two, ks[s], bias, cap, inv_cap);
        m = p[s] > m ? p[s] : m;
    }
    return m;
}

#endif
