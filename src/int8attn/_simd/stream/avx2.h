/* stream/avx2.h: stream: the benchmarks' bandwidth probe (an XOR fold) and its tail; the avx2
 * tier's, bit for bit stream/scalar.h's rule. Included only by ../avx2.h, inside the tier's
 * target region: its pragma applies to every function here. */
#ifndef I8A_STREAM_AVX2_H
#define I8A_STREAM_AVX2_H

#ifndef I8A_AVX2_H
#error "stream/avx2.h is included by ../avx2.h only"
#endif

static uint64_t i8a_stream_avx2(const void *p, size_t bytes, const void *next)
{
    const unsigned char *b = (const unsigned char *)p;
    __m256i x0 = _mm256_setzero_si256(), x1 = x0, x2 = x0, x3 = x0;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        if (next)
            i8a_prefetch_rows((const char *)next + i, 128);
        x0 = _mm256_xor_si256(x0, _mm256_loadu_si256((const __m256i *)(b + i)));
        x1 = _mm256_xor_si256(x1, _mm256_loadu_si256((const __m256i *)(b + i + 32)));
        x2 = _mm256_xor_si256(x2, _mm256_loadu_si256((const __m256i *)(b + i + 64)));
        x3 = _mm256_xor_si256(x3, _mm256_loadu_si256((const __m256i *)(b + i + 96)));
    }
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(x0, x1), _mm256_xor_si256(x2, x3));
    __m128i h = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    uint64_t r = (uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1);
    return r ^ i8a_fold_tail(b + i, bytes - i);
}

#endif
