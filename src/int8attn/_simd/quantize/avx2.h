/* quantize/avx2.h: the row quantizer (quantize_row): the scale rule and one element's rounding;
 * the avx2 tier's, bit for bit quantize/scalar.h's rule. Included only by ../avx2.h, inside the
 * tier's target region: its pragma applies to every function here. */
#ifndef I8A_QUANTIZE_AVX2_H
#define I8A_QUANTIZE_AVX2_H

#ifndef I8A_AVX2_H
#error "quantize/avx2.h is included by ../avx2.h only"
#endif

static int i8a_quantize_row_avx2(const float *x, size_t d, int8_t *codes, float *scale)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 vmax = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    size_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
        vmax = _mm256_max_ps(vmax, a);
    }
    float absmax = i8a_hmax8_avx2(vmax);
    int finite = _mm256_movemask_ps(ok) == 0xff;
    float inv;
    const int todo = i8a_row_prepare(x, i, d, absmax, finite, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi8(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (i = 0; i + 32 <= d; i += 32) {
        /* cvtps rounds half to even under the default MXCSR, as rintf does */
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vinv));
        __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vinv));
        __m256i ab = _mm256_packs_epi32(a, b), ce = _mm256_packs_epi32(c, e);
        __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, ce), order);
        _mm256_storeu_si256((__m256i *)(codes + i), _mm256_max_epi8(q, lo));
    }
    for (; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

#endif
