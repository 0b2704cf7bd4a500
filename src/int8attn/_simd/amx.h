/* The amx tier: the avx512_vnni tier with its K and V passes at 8 bits on AMX-INT8's tile
 * multiply (Sapphire Rapids and later Xeons): TDPBSSD / TDPBUSD add the exact int32 dots of
 * 16 rows of 64 bytes with 16 columns of 64 bytes, 16384 products an instruction, where
 * vpdpbusd makes 64. Everything else (the logits, the softmax, the planes, the 4-bit sides'
 * passes, one query head alone) is the avx512_vnni tier's code. The tile sums are the sums the
 * other tiers make, so the bits are theirs.
 *
 * The tile instructions are written through the macros below, so that tests/c can compile the
 * same passes against a C model of the instructions' documented semantics (tests/c/tile_model.h,
 * which defines I8A_TILE_OPS and its own macros first) and check the tiling on CPUs without AMX.
 * Linux lets a process use the tiles after arch_prctl(ARCH_REQ_XCOMP_PERM) (_cpu.c asks at
 * import; refused, the tier is not offered).
 */
#ifndef I8A_AMX_H
#define I8A_AMX_H

#include "avx512_vnni.h"

/* The tiles both passes use: C (sums) 0 and 1, A (q planes, or weight planes) 2 and 3, B (K rows
 * transposed, or V tiles) 4. Literal numbers: the intrinsics paste them into the instruction. */
#define I8A_TC0 0
#define I8A_TC1 1
#define I8A_TA0 2
#define I8A_TA1 3
#define I8A_TB 4

#ifndef I8A_TILE_OPS
#define I8A_TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define I8A_TILE_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define I8A_TILE_STORE(t, p, stride) _tile_stored(t, p, stride)
#define I8A_TILE_ZERO(t) _tile_zero(t)
#define I8A_TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define I8A_TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define I8A_TILE_RELEASE() _tile_release()
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#endif
#else                                   /* the model: plain C beside the avx512_vnni code */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif
#endif

#include "kdots/amx.h"
#include "vpass/amx.h"
#include "attend/amx.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
