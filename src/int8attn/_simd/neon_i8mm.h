/* The neon_i8mm tier: armv8.2-a + dotprod + i8mm (Neoverse N2, V1, V2: Graviton 3 and 4;
 * Cortex-A710, X2 and later; Ampere One; Apple M2 and later). SMMLA multiplies a 2 x 8 int8
 * matrix by the transpose of another into 2 x 2 exact int32 sums: twice SDOT's products per
 * instruction. The K and V passes at 8 bits use it (a head's two q planes against two K rows; a
 * head's two weight planes against two dimensions of 8 positions); everything else is the
 * neon_dotprod tier's code.
 */
#ifndef I8A_NEON_I8MM_H
#define I8A_NEON_I8MM_H

#include "neon_dotprod.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod,i8mm"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")
#endif

#include "kdots/neon_i8mm.h"
#include "vpass/neon_i8mm.h"
#include "attend/neon_i8mm.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
