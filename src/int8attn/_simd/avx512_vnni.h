/* The avx512_vnni tier: AVX-512 F/BW/VL + VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later).
 * Same operations as the ops' scalar rules (<op>/scalar.h) in the same order, sixteen lanes at a
 * time.
 *
 * VNNI's vpdpbusd multiplies unsigned by signed bytes. The K codes are made unsigned by an
 * offset, k + 128 (a xor with 0x80), so each dot comes out as q.k + 128 * sum(q); the second
 * term is a constant of each query plane, subtracted once per row. The biased sum stays exact:
 * |q.(k + 128)| <= 127 * 255 * 1024 < 2^25.
 *
 * Compiled at the baseline: the ISA is switched on around the op files included below
 * (<op>/<tier>.h, one per op), for their functions only.
 */
#ifndef I8A_AVX512_VNNI_H
#define I8A_AVX512_VNNI_H

#include <immintrin.h>

#include "common.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#include "core/avx512_vnni.h"
#include "half_row/avx512_vnni.h"
#include "quantize/avx512_vnni.h"
#include "window/avx512_vnni.h"
#include "kdots/avx512_vnni.h"
#include "planes/avx512_vnni.h"
#include "vpass/avx512_vnni.h"
#include "k4/avx512_vnni.h"
#include "v4/avx512_vnni.h"
#include "attend/avx512_vnni.h"
#include "merge/avx512_vnni.h"
#include "stream/avx512_vnni.h"
#include "rotate/avx512_vnni.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
