/* The neon_dotprod tier: armv8.2-a + dotprod (Cortex-A76, Raspberry Pi 5). SDOT sums four
 * int8 products per int32 lane in one instruction; everything else is the neon tier's code
 * (the quantizer and the merge are shared outright, the attend body through its dot step).
 */
#ifndef I8A_NEON_DOTPROD_H
#define I8A_NEON_DOTPROD_H

#include "neon.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

I8A_INLINE int32x4_t i8a_dot16_neon_dotprod(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    return vdotq_s32(acc, a, b);
}

/* The V step with SDOT: each 32-bit lane sums its dimension's 4 products (acc[1] unused). */
I8A_INLINE void i8a_vdot_neon_dotprod(int32x4_t *acc, int8x16_t x, int8x16_t p)
{
    acc[0] = vdotq_s32(acc[0], x, p);
}

static void i8a_attend_neon_dotprod(const i8a_query *q, const i8a_span *kv, float *scratch,
                                    const i8a_state *out)
{
    i8a_attend_with_neon(i8a_dot16_neon_dotprod, i8a_vdot_neon_dotprod, 0, q, kv, scratch, out);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
