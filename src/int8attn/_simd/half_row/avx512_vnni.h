/* half_row/avx512_vnni.h: IEEE halves (the recent window's rows): half_bits / half_value, a row's
 * scale exponent, half_row; the avx512_vnni tier's, bit for bit half_row/scalar.h's rule.
 * Included only by ../avx512_vnni.h, inside the tier's target region: its pragma applies to every
 * function here. */
#ifndef I8A_HALF_ROW_AVX512_VNNI_H
#define I8A_HALF_ROW_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "half_row/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* A row into the window's halves (dispatch.h): the largest |x| by vector max (exact in any
 * order), then vcvtps2ph, IEEE nearest-even like i8a_half_bits. */
static float i8a_half_row_avx512_vnni(const float *x, size_t d, uint16_t *h)
{
    __m512 most = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i += 16)
        most = _mm512_max_ps(most, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    const float top = _mm512_reduce_max_ps(most);
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const __m512 down = _mm512_set1_ps(i8a_pow2f(-e));
    for (size_t i = 0; i < d; i += 16) {
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + i), down);
        _mm256_storeu_si256((__m256i *)(h + i),
                            _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return i8a_pow2f(e);
}

#endif
