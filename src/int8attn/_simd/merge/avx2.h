/* merge/avx2.h: merge: a chunk's softmax state folded into the running one; the avx2 tier's, bit
 * for bit merge/scalar.h's rule. Included only by ../avx2.h, inside the tier's target region: its
 * pragma applies to every function here. */
#ifndef I8A_MERGE_AVX2_H
#define I8A_MERGE_AVX2_H

#ifndef I8A_AVX2_H
#error "merge/avx2.h is included by ../avx2.h only"
#endif

static void i8a_merge_avx2(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    for (size_t i = 0; i < d; i += 8) {
        __m256 r = _mm256_mul_ps(_mm256_loadu_ps(ro + i), va);
        _mm256_storeu_ps(ro + i, _mm256_fmadd_ps(_mm256_loadu_ps(co + i), vb, r));
    }
}

#endif
