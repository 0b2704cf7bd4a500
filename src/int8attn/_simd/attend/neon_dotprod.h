/* attend/neon_dotprod.h: attend[k][v]: one chunk of a query group, the passes above in the
 * contract's order; the neon_dotprod tier's, bit for bit attend/scalar.h's rule. Included only by
 * ../neon_dotprod.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_ATTEND_NEON_DOTPROD_H
#define I8A_ATTEND_NEON_DOTPROD_H

#ifndef I8A_NEON_DOTPROD_H
#error "attend/neon_dotprod.h is included by ../neon_dotprod.h only"
#endif

static void i8a_attend_k8v4_neon_dotprod(const i8a_query *q, const i8a_span *kv,
                                         float *scratch, const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_kdots_neon_dotprod, i8a_vpass_neon_dotprod,
                          i8a_v4pass_neon_dotprod, q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_neon_dotprod(const i8a_query *q, const i8a_span *kv,
                                         float *scratch, const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_kdots_neon_dotprod, i8a_vpass_neon_dotprod,
                          i8a_v4pass_neon_dotprod, q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_neon_dotprod(const i8a_query *q, const i8a_span *kv,
                                         float *scratch, const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_kdots_neon_dotprod, i8a_vpass_neon_dotprod,
                          i8a_v4pass_neon_dotprod, q, kv, scratch, out, 1, 1);
}

static void i8a_attend_neon_dotprod(const i8a_query *q, const i8a_span *kv, float *scratch,
                                    const i8a_state *out)
{
    i8a_attend_with_neon(i8a_kdots_neon_dotprod, i8a_vpass_neon_dotprod, q, kv, scratch, out);
}

#endif
