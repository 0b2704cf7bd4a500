/* attend/neon_i8mm.h: attend[k][v]: one chunk of a query group, the passes above in the
 * contract's order; the neon_i8mm tier's, bit for bit attend/scalar.h's rule. Its K pass at 8
 * bits and its V pass at 8 bits are SMMLA's (kdots/, vpass/neon_i8mm.h), the 4-bit sides'
 * passes the neon_dotprod tier's. Included only by ../neon_i8mm.h, inside the tier's target
 * region: its pragma applies to every function here. */
#ifndef I8A_ATTEND_NEON_I8MM_H
#define I8A_ATTEND_NEON_I8MM_H

#ifndef I8A_NEON_I8MM_H
#error "attend/neon_i8mm.h is included by ../neon_i8mm.h only"
#endif

static void i8a_attend_neon_i8mm(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend_with_neon(i8a_kdots_neon_i8mm, i8a_vpass_neon_i8mm, q, kv, scratch, out);
}

static void i8a_attend_k8v4_neon_i8mm(const i8a_query *q, const i8a_span *kv, float *scratch,
                                      const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_kdots_neon_i8mm, i8a_vpass_neon_i8mm,
                          i8a_v4pass_neon_dotprod, q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_neon_i8mm(const i8a_query *q, const i8a_span *kv, float *scratch,
                                      const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_kdots_neon_i8mm, i8a_vpass_neon_i8mm,
                          i8a_v4pass_neon_dotprod, q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_neon_i8mm(const i8a_query *q, const i8a_span *kv, float *scratch,
                                      const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_kdots_neon_i8mm, i8a_vpass_neon_i8mm,
                          i8a_v4pass_neon_dotprod, q, kv, scratch, out, 1, 1);
}

#endif
