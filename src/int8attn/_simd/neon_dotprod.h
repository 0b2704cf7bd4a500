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

#include "kdots/neon_dotprod.h"
#include "vpass/neon_dotprod.h"
#include "v4/neon_dotprod.h"
#include "attend/neon_dotprod.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
