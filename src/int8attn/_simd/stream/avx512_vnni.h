/* stream/avx512_vnni.h: stream: the benchmarks' bandwidth probe (an XOR fold) and its tail; the
 * avx512_vnni tier's, bit for bit stream/scalar.h's rule. Included only by ../avx512_vnni.h,
 * inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_STREAM_AVX512_VNNI_H
#define I8A_STREAM_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "stream/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

static uint64_t i8a_stream_avx512_vnni(const void *p, size_t bytes, const void *next)
{
    const unsigned char *b = (const unsigned char *)p;
    __m512i x0 = _mm512_setzero_si512(), x1 = x0, x2 = x0, x3 = x0;
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        if (next)
            i8a_prefetch_rows((const char *)next + i, 256);
        x0 = _mm512_xor_si512(x0, _mm512_loadu_si512((const void *)(b + i)));
        x1 = _mm512_xor_si512(x1, _mm512_loadu_si512((const void *)(b + i + 64)));
        x2 = _mm512_xor_si512(x2, _mm512_loadu_si512((const void *)(b + i + 128)));
        x3 = _mm512_xor_si512(x3, _mm512_loadu_si512((const void *)(b + i + 192)));
    }
    __m512i x = _mm512_xor_si512(_mm512_xor_si512(x0, x1), _mm512_xor_si512(x2, x3));
    __m256i y = _mm256_xor_si256(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
    __m128i h = _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
    uint64_t r = (uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1);
    return r ^ i8a_fold_tail(b + i, bytes - i);
}

#endif
