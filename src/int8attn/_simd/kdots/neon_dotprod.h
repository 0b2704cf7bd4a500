/* kdots/neon_dotprod.h: K at 8 bits: the exact int8 dots of the q planes with K rows, and the
 * logits; the neon_dotprod tier's, bit for bit kdots/scalar.h's rule. Included only by
 * ../neon_dotprod.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_KDOTS_NEON_DOTPROD_H
#define I8A_KDOTS_NEON_DOTPROD_H

#ifndef I8A_NEON_DOTPROD_H
#error "kdots/neon_dotprod.h is included by ../neon_dotprod.h only"
#endif

I8A_INLINE int32x4_t i8a_dot16_neon_dotprod(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    return vdotq_s32(acc, a, b);
}

/* The neon_dotprod tier's K pass (attend's kdots). */
I8A_INLINE void i8a_kdots_neon_dotprod(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                       int32_t *dl)
{
    i8a_kdots_with_neon(i8a_dot16_neon_dotprod, q, kv, dh, dl);
}

#endif
