/* quantize/avx512_vnni.h: the row quantizer (quantize_row): the scale rule and one element's
 * rounding; the avx512_vnni tier's, bit for bit quantize/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_QUANTIZE_AVX512_VNNI_H
#define I8A_QUANTIZE_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "quantize/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

static int i8a_quantize_row_avx512_vnni(const float *x, size_t d, int8_t *codes, float *scale)
{
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 ok = 0xffff;
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        ok &= _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ);
        vmax = _mm512_max_ps(vmax, a);
    }
    float absmax = _mm512_reduce_max_ps(vmax);
    int finite = ok == 0xffff;
    float inv;
    const int todo = i8a_row_prepare(x, i, d, absmax, finite, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m128i lo = _mm_set1_epi8(-127);
    for (i = 0; i + 16 <= d; i += 16) {
        /* cvtps rounds half to even under the default MXCSR; the narrowing saturates */
        __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
        _mm_storeu_si128((__m128i *)(codes + i), _mm_max_epi8(_mm512_cvtsepi32_epi8(r), lo));
    }
    for (; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

#endif
