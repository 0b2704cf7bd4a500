/* merge/scalar.h: merge: a chunk's softmax state folded into the running one. The rule every tier
 * equals bit for bit (the scalar forms, in the contract's order) and the scalar tier's entries.
 * Baseline C, no ISA attributes; common.h includes every op's scalar.h in dependency order. */
#ifndef I8A_MERGE_SCALAR_H
#define I8A_MERGE_SCALAR_H

/* The scalar part of merging a chunk's state into the running one (one query row): updates m
 * and l and returns the factors for o: o = o * a + chunk_o * b (the product by b fused). */
static inline void i8a_merge_head(const i8a_state *run, const i8a_state *chunk, float *a,
                                  float *b)
{
    float m0 = run->m[0], m1 = chunk->m[0];
    float m = m1 > m0 ? m1 : m0;
    *a = i8a_exp_scalar(m0 - m);
    *b = i8a_exp_scalar(m1 - m);
    run->l[0] = fmaf(chunk->l[0], *b, run->l[0] * *a);
    run->m[0] = m;
}

static inline void i8a_merge_scalar(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    for (size_t i = 0; i < d; i++)
        ro[i] = fmaf(co[i], b, ro[i] * a);
}

#endif
