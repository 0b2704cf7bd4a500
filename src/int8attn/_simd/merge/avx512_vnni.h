/* merge/avx512_vnni.h: merge: a chunk's softmax state folded into the running one; the
 * avx512_vnni tier's, bit for bit merge/scalar.h's rule. Included only by ../avx512_vnni.h,
 * inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_MERGE_AVX512_VNNI_H
#define I8A_MERGE_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "merge/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

static void i8a_merge_avx512_vnni(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    for (size_t i = 0; i < d; i += 16) {
        __m512 r = _mm512_mul_ps(_mm512_loadu_ps(ro + i), va);
        _mm512_storeu_ps(ro + i, _mm512_fmadd_ps(_mm512_loadu_ps(co + i), vb, r));
    }
}

#endif
