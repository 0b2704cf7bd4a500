/* kdots/avx512_vnni.h: K at 8 bits: the exact int8 dots of the q planes with K rows, and the
 * logits; the avx512_vnni tier's, bit for bit kdots/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_KDOTS_AVX512_VNNI_H
#define I8A_KDOTS_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "kdots/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* Bytes [i, i + 64) of a row of d bytes, zeros past d (d a multiple of 16). */
static inline __m512i i8a_load64_avx512_vnni(const int8_t *p, size_t i, size_t d)
{
    if (i + 64 <= d)
        return _mm512_loadu_si512((const void *)(p + i));
    return _mm512_maskz_loadu_epi8(~0ull >> (64 - (d - i)), p + i);
}

/* sum(q) of one plane: the offset's correction is 128 times it. */
static inline int32_t i8a_qsum_avx512_vnni(const int8_t *q, size_t d)
{
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < d; i += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi8(1), i8a_load64_avx512_vnni(q, i, d));
    return _mm512_reduce_add_epi32(acc);
}

/* Bytes [i, i + 32) of a row of d bytes, zeros past d (d a multiple of 16). */
static inline __m256i i8a_load32_avx512_vnni(const int8_t *p, size_t i, size_t d)
{
    if (i + 32 <= d)
        return _mm256_loadu_si256((const __m256i *)(p + i));
    return _mm256_maskz_loadu_epi8(0xffff, p + i);
}

/* Four row sums of four 256-bit accumulators, minus the offset's correction. */
static inline __m128i i8a_reduce4x256_avx512_vnni(__m256i a0, __m256i a1, __m256i a2, __m256i a3,
                                                  __m128i corr)
{
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return _mm_sub_epi32(x, corr);
}

/* Exact dots of every query head's planes with rows [0, n), four rows at a time (see
 * i8a_kdots_avx2): dh[j * I8A_CHUNK + s], dl[...]. 256-bit vpdpbusd: on cores that split
 * 512-bit operations it costs the same per byte, and its row sums reduce in half the steps. */
I8A_INLINE void i8a_kdots_rows_avx512_vnni(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                           int32_t *dl, const int one_run)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    const int8_t *rows[I8A_CHUNK];              /* rows in blocks: found once for all heads */
    if (!one_run)
        i8a_krows(kv, d, rows);
    for (size_t j = 0; j < q->nq; j++) {
        const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
        const __m128i ch = _mm_set1_epi32(128 * i8a_qsum_avx512_vnni(qh, d));
        const __m128i cl = _mm_set1_epi32(two ? 128 * i8a_qsum_avx512_vnni(ql, d) : 0);
        /* rows past n of the last group of four are never stored: computed on row n - 1 */
        for (size_t s = 0; s < n; s += 4) {
            if (j == 0 && s < kv->next_n) /* the next chunk's K, one group of rows per group */
                i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                                  (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
            const int8_t *k0 = i8a_krow_of(kv, rows, s, d, one_run);
            const int8_t *k1 = i8a_krow_of(kv, rows, s + 1 < n ? s + 1 : n - 1, d, one_run);
            const int8_t *k2 = i8a_krow_of(kv, rows, s + 2 < n ? s + 2 : n - 1, d, one_run);
            const int8_t *k3 = i8a_krow_of(kv, rows, s + 3 < n ? s + 3 : n - 1, d, one_run);
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
            __m256i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            for (size_t i = 0; i < d; i += 32) {
                __m256i u0 = _mm256_xor_si256(i8a_load32_avx512_vnni(k0, i, d), bias);
                __m256i u1 = _mm256_xor_si256(i8a_load32_avx512_vnni(k1, i, d), bias);
                __m256i u2 = _mm256_xor_si256(i8a_load32_avx512_vnni(k2, i, d), bias);
                __m256i u3 = _mm256_xor_si256(i8a_load32_avx512_vnni(k3, i, d), bias);
                __m256i a = i8a_load32_avx512_vnni(qh, i, d);
                h0 = _mm256_dpbusd_epi32(h0, u0, a);
                h1 = _mm256_dpbusd_epi32(h1, u1, a);
                h2 = _mm256_dpbusd_epi32(h2, u2, a);
                h3 = _mm256_dpbusd_epi32(h3, u3, a);
                if (two) {
                    __m256i b = i8a_load32_avx512_vnni(ql, i, d);
                    l0 = _mm256_dpbusd_epi32(l0, u0, b);
                    l1 = _mm256_dpbusd_epi32(l1, u1, b);
                    l2 = _mm256_dpbusd_epi32(l2, u2, b);
                    l3 = _mm256_dpbusd_epi32(l3, u3, b);
                }
            }
            _mm_store_si128((__m128i *)(dh + j * I8A_CHUNK + s),
                            i8a_reduce4x256_avx512_vnni(h0, h1, h2, h3, ch));
            if (two)
                _mm_store_si128((__m128i *)(dl + j * I8A_CHUNK + s),
                                i8a_reduce4x256_avx512_vnni(l0, l1, l2, l3, cl));
        }
    }
}

/* i8a_kdots_rows_avx512_vnni with the span's layout a constant (one run: a contiguous cache). */
static inline void i8a_kdots_avx512_vnni(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                         int32_t *dl)
{
    if (i8a_one_run(kv))
        i8a_kdots_rows_avx512_vnni(q, kv, dh, dl, 1);
    else
        i8a_kdots_rows_avx512_vnni(q, kv, dh, dl, 0);
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, sixteen at a time; returns max_s p[s]. */
static inline float i8a_logits_avx512_vnni(const int32_t *dh, const int32_t *dl, float c_hi,
                                           float c_lo, int two, float bias, float cap, float inv_cap,
                                           const float *ks, size_t n, float *p)
{
    const __m512 ch = _mm512_set1_ps(c_hi), cl = _mm512_set1_ps(c_lo), vb = _mm512_set1_ps(bias);
    __m512 vmax = _mm512_set1_ps(-FLT_MAX);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 lg = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dh + s))), ch);
        if (two)
            lg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dl + s))), cl, lg);
        lg = _mm512_add_ps(_mm512_mul_ps(lg, _mm512_maskz_loadu_ps(live, ks + s)), vb);
        if (cap > 0.0f)
            lg = i8a_softcap16_avx512_vnni(lg, cap, inv_cap);
        _mm512_store_ps(p + s, lg);
        vmax = _mm512_mask_max_ps(vmax, live, vmax, lg);
    }
    return _mm512_reduce_max_ps(vmax);
}

#endif
