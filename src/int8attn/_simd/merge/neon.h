/* merge/neon.h: merge: a chunk's softmax state folded into the running one; the neon tier's, bit
 * for bit merge/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline: no target
 * pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_MERGE_NEON_H
#define I8A_MERGE_NEON_H

#ifndef I8A_NEON_H
#error "merge/neon.h is included by ../neon.h only"
#endif

static void i8a_merge_neon(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    for (size_t i = 0; i < d; i += 4)
        vst1q_f32(ro + i, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(ro + i), a), vld1q_f32(co + i), b));
}

#endif
