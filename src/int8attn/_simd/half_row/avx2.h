/* half_row/avx2.h: IEEE halves (the recent window's rows): half_bits / half_value, a row's scale
 * exponent, half_row; the avx2 tier's, bit for bit half_row/scalar.h's rule. Included only by
 * ../avx2.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_HALF_ROW_AVX2_H
#define I8A_HALF_ROW_AVX2_H

#ifndef I8A_AVX2_H
#error "half_row/avx2.h is included by ../avx2.h only"
#endif

/* A row into the window's halves (dispatch.h): the largest |x| by vector max (exact in any
 * order), then F16C's vcvtps2ph, IEEE nearest-even like i8a_half_bits. */
static float i8a_half_row_avx2(const float *x, size_t d, uint16_t *h)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 most = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i += 8)
        most = _mm256_max_ps(most, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
    float lane[8], top = 0.0f;
    _mm256_storeu_ps(lane, most);
    for (int t = 0; t < 8; t++)
        top = lane[t] > top ? lane[t] : top;
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const __m256 down = _mm256_set1_ps(i8a_pow2f(-e));
    for (size_t i = 0; i < d; i += 8) {
        const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), down);
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return i8a_pow2f(e);
}

#endif
