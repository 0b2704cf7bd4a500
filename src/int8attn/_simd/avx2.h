/* The avx2 tier: x86-64 AVX2 + FMA (Haswell, Zen and later). Same operations as the ops' scalar
 * rules (<op>/scalar.h) in the same order, eight lanes at a time.
 *
 * The int8 x int8 dot uses the sign trick: maddubs(|k|, q * sign(k)) multiplies u8 by s8 into
 * int16 pairs. |k| <= 127 and |q * sign(k)| <= 127 because -128 is never stored, so a pair is at
 * most 2 * 127 * 127 = 32258 and never saturates.
 *
 * Compiled at the baseline: the ISA is switched on around the op files included below
 * (<op>/<tier>.h, one per op), for their functions only.
 */
#ifndef I8A_AVX2_H
#define I8A_AVX2_H

#include <immintrin.h>

#include "common.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "core/avx2.h"
#include "half_row/avx2.h"
#include "quantize/avx2.h"
#include "window/avx2.h"
#include "kdots/avx2.h"
#include "planes/avx2.h"
#include "vpass/avx2.h"
#include "k4/avx2.h"
#include "v4/avx2.h"
#include "attend/avx2.h"
#include "merge/avx2.h"
#include "stream/avx2.h"
#include "rotate/avx2.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
