/* core/avx512_vnni.h: the contract's shared pieces: the forced-inline macro, the exp polynomial,
 * the soft cap, the 16-lane sum order, the prefetch hint; the avx512_vnni tier's, bit for bit
 * core/scalar.h's rule. Included only by ../avx512_vnni.h, inside the tier's target region: its
 * pragma applies to every function here. */
#ifndef I8A_CORE_AVX512_VNNI_H
#define I8A_CORE_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "core/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* The exp's polynomial on 16 lanes, the operations of i8a_exp_poly_scalar. */
static inline __m512 i8a_exp_poly16_avx512_vnni(__m512 x, __m512 *n_out)
{
    const __m512 magic = _mm512_set1_ps(I8A_EXP_MAGIC);
    x = _mm512_max_ps(x, _mm512_set1_ps(I8A_EXP_LO));
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(I8A_LOG2E), magic), magic);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-I8A_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-I8A_LN2_LO), r);
    __m512 z = _mm512_mul_ps(r, r);
    __m512 y = _mm512_set1_ps(I8A_EXP_P0);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P5));
    *n_out = n;
    return _mm512_fmadd_ps(y, z, r);
}

/* y * 2^n on 16 lanes (i8a_scale2n_scalar). */
static inline __m512 i8a_scale2n16_avx512_vnni(__m512 y, __m512 n)
{
    __m512i e = _mm512_slli_epi32(_mm512_cvttps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
}

/* exp of 16 lanes, the operations of i8a_exp_scalar. */
static inline __m512 i8a_exp16_avx512_vnni(__m512 x)
{
    __m512 n;
    const __m512 y = i8a_exp_poly16_avx512_vnni(x, &n);
    return i8a_scale2n16_avx512_vnni(_mm512_add_ps(y, _mm512_set1_ps(1.0f)), n);
}

/* expm1 of 16 lanes, the operations of i8a_expm1_scalar. */
static inline __m512 i8a_expm1_16_avx512_vnni(__m512 x)
{
    __m512 n;
    const __m512 y = i8a_exp_poly16_avx512_vnni(x, &n), one = _mm512_set1_ps(1.0f);
    const __m512 big = _mm512_sub_ps(i8a_scale2n16_avx512_vnni(_mm512_add_ps(y, one), n), one);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_EQ_OQ), big, y);
}

/* i8a_softcap on 16 lanes (t >= +0, so the sign of u is or-ed in). */
static inline __m512 i8a_softcap16_avx512_vnni(__m512 l, float cap, float inv_cap)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 u = _mm512_mul_ps(l, _mm512_set1_ps(inv_cap));
    const __m512 m = i8a_expm1_16_avx512_vnni(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-2.0f)));
    const __m512 t = _mm512_div_ps(_mm512_abs_ps(m), _mm512_add_ps(_mm512_set1_ps(2.0f), m));
    const __m512i st = _mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(_mm512_castps_si512(u), sign));
    return _mm512_mul_ps(_mm512_set1_ps(cap), _mm512_castsi512_ps(st));
}

/* Sixteen halves widened by vcvtph2ps (exact). */
static inline __m512 i8a_halves16_avx512_vnni(const uint16_t *h)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

/* The 16 lane sums of v folded into one: lanes i + 8, then i + 4, i + 2, i + 1 (the halving
 * order of i8a_reduce_lanes). */
static inline float i8a_fold16_avx512_vnni(__m512 v)
{
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

#endif
