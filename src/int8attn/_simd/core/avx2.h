/* core/avx2.h: the contract's shared pieces: the forced-inline macro, the exp polynomial, the
 * soft cap, the 16-lane sum order, the prefetch hint; the avx2 tier's, bit for bit
 * core/scalar.h's rule. Included only by ../avx2.h, inside the tier's target region: its pragma
 * applies to every function here. */
#ifndef I8A_CORE_AVX2_H
#define I8A_CORE_AVX2_H

#ifndef I8A_AVX2_H
#error "core/avx2.h is included by ../avx2.h only"
#endif

static inline float i8a_hmax8_avx2(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline int32_t i8a_hsum8_epi32_avx2(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(x);
}

/* The exp's polynomial on 8 lanes, the operations of i8a_exp_poly_scalar. */
static inline __m256 i8a_exp_poly8_avx2(__m256 x, __m256 *n_out)
{
    const __m256 magic = _mm256_set1_ps(I8A_EXP_MAGIC);
    x = _mm256_max_ps(x, _mm256_set1_ps(I8A_EXP_LO));
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(I8A_LOG2E), magic), magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-I8A_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-I8A_LN2_LO), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(I8A_EXP_P0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P5));
    *n_out = n;
    return _mm256_fmadd_ps(y, z, r);
}

/* y * 2^n on 8 lanes (i8a_scale2n_scalar). */
static inline __m256 i8a_scale2n8_avx2(__m256 y, __m256 n)
{
    __m256i e = _mm256_slli_epi32(_mm256_cvttps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

/* exp of 8 lanes, the operations of i8a_exp_scalar. */
static inline __m256 i8a_exp8_avx2(__m256 x)
{
    __m256 n;
    const __m256 y = i8a_exp_poly8_avx2(x, &n);
    return i8a_scale2n8_avx2(_mm256_add_ps(y, _mm256_set1_ps(1.0f)), n);
}

/* expm1 of 8 lanes, the operations of i8a_expm1_scalar. */
static inline __m256 i8a_expm1_8_avx2(__m256 x)
{
    __m256 n;
    const __m256 y = i8a_exp_poly8_avx2(x, &n), one = _mm256_set1_ps(1.0f);
    const __m256 big = _mm256_sub_ps(i8a_scale2n8_avx2(_mm256_add_ps(y, one), n), one);
    return _mm256_blendv_ps(big, y, _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_EQ_OQ));
}

/* i8a_softcap on 8 lanes (t >= +0, so the sign of u is or-ed in). */
static inline __m256 i8a_softcap8_avx2(__m256 l, float cap, float inv_cap)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 u = _mm256_mul_ps(l, _mm256_set1_ps(inv_cap));
    const __m256 m = i8a_expm1_8_avx2(_mm256_mul_ps(_mm256_andnot_ps(sign, u), _mm256_set1_ps(-2.0f)));
    const __m256 t = _mm256_div_ps(_mm256_andnot_ps(sign, m), _mm256_add_ps(_mm256_set1_ps(2.0f), m));
    return _mm256_mul_ps(_mm256_set1_ps(cap), _mm256_or_ps(t, _mm256_and_ps(u, sign)));
}

/* The 16 lane sums of (lo: lanes 0-7, hi: lanes 8-15) folded into one: lanes i + 8, then
 * i + 4, i + 2, i + 1 (the halving order of i8a_reduce_lanes). */
static inline float i8a_fold16_avx2(__m256 lo, __m256 hi)
{
    const __m256 t = _mm256_add_ps(lo, hi);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* Eight halves widened by F16C (exact). */
static inline __m256 i8a_halves8_avx2(const uint16_t *h)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

#endif
