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

/* acc + SDOT of x with 32-bit lane r of p repeated (SDOT by element: r a constant once
 * inlined and unrolled). */
I8A_INLINE int32x4_t i8a_sdot_lane_neon_dotprod(int32x4_t acc, int8x16_t x, int8x16_t p, int r)
{
    switch (r) {
    case 0: return vdotq_laneq_s32(acc, x, p, 0);
    case 1: return vdotq_laneq_s32(acc, x, p, 1);
    case 2: return vdotq_laneq_s32(acc, x, p, 2);
    default: return vdotq_laneq_s32(acc, x, p, 3);
    }
}

/* The integer V pass (common.h) with SDOT, NH heads over dims [i0, i0 + 4 nu): each 32-bit
 * lane sums its dimension's 4 positions of a tile. Four tiles at a time, each head's plane
 * bytes of the four in one register (16 bytes: the planes are zero up to a multiple of 16),
 * SDOT by element picking tile r's word; tiles past the last multiple of four one at a time
 * with the word repeated (ld1r). Then o from the three sums. The first block prefetches pf_n
 * rows of pf (the next chunk's V). NH and NU are constants at every call. */
I8A_INLINE void
i8a_vtiles_block_neon_dotprod(const uint8_t *const *planes, int nh, int nu, const int8_t *v,
                              size_t tiles, size_t d, size_t i0, float *o, const int8_t *pf,
                              size_t pf_n)
{
    int32x4_t acc[4][I8A_WPLANES][8];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 8
            for (int u = 0; u < nu; u++)
                acc[h][k][u] = vdupq_n_s32(0);
    size_t t = 0;
    for (; t + 4 <= tiles; t += 4) {
        if (I8A_V_TILE * t < pf_n)
            i8a_prefetch_rows(pf + I8A_V_TILE * t * d, 4 * I8A_V_TILE * d);
        int8x16_t pw[4][I8A_WPLANES];
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES; k++)
                pw[h][k] = vreinterpretq_s8_u8(vld1q_u8(planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const int8_t *x = v + ((t + (size_t)r) * d + i0) * I8A_V_TILE;
#pragma GCC unroll 8
            for (int u = 0; u < nu; u++) {
                const int8x16_t xv = vld1q_s8(x + 16 * u);
#pragma GCC unroll 8
                for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                    for (int k = 0; k < I8A_WPLANES; k++)
                        acc[h][k][u] = i8a_sdot_lane_neon_dotprod(acc[h][k][u], xv, pw[h][k], r);
            }
        }
    }
    for (; t < tiles; t++) {
        const int8_t *x = v + (t * d + i0) * I8A_V_TILE;
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES; k++) {
                const uint8_t *pw = planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                const int8x16_t w = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
#pragma GCC unroll 8
                for (int u = 0; u < nu; u++)
                    acc[h][k][u] = vdotq_s32(acc[h][k][u], vld1q_s8(x + 16 * u), w);
            }
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int u = 0; u < nu; u++) {
            int32x4_t sums[I8A_WPLANES];
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES; k++)
                sums[k] = acc[h][k][u];
            vst1q_f32(o + h * d + i0 + 4 * u, i8a_v_out4_neon(sums, sc));
        }
    }
}

/* The V pass of heads [j, j + NH): blocks of at most 24 accumulators whose plane registers
 * (3 NH) fit beside them, then single vectors for the rest of d. */
I8A_INLINE void i8a_vtiles_group_neon_dotprod(float *scratch, size_t nq, size_t j, int nh,
                                              const i8a_span *kv, size_t d, float *o, size_t pf_n)
{
    const uint8_t *planes[4];
    for (int h = 0; h < nh; h++)
        planes[h] = i8a_planes_at(scratch, nq, j + (size_t)h);
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const int nu = nh == 1 ? 8 : nh == 2 ? 2 : nh == 3 ? 2 : 1;
    size_t i = 0;
    for (; i + 4 * (size_t)nu <= d; i += 4 * (size_t)nu, pf_n = 0)
        i8a_vtiles_block_neon_dotprod(planes, nh, nu, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
    for (; i < d; i += 4, pf_n = 0)
        i8a_vtiles_block_neon_dotprod(planes, nh, 1, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
}

/* The neon_dotprod tier's V pass over the nq heads of a chunk: groups of four heads, then the
 * rest as one group. The first group prefetches the next chunk's V. */
I8A_INLINE void i8a_vpass_neon_dotprod(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                       float *o)
{
    size_t j = 0, pf_n = kv->next_n;
    for (; j + 4 <= nq; j += 4, pf_n = 0)
        i8a_vtiles_group_neon_dotprod(scratch, nq, j, 4, kv, d, o, pf_n);
    switch (nq - j) {
    case 3: i8a_vtiles_group_neon_dotprod(scratch, nq, j, 3, kv, d, o, pf_n); break;
    case 2: i8a_vtiles_group_neon_dotprod(scratch, nq, j, 2, kv, d, o, pf_n); break;
    case 1: i8a_vtiles_group_neon_dotprod(scratch, nq, j, 1, kv, d, o, pf_n); break;
    default: break;
    }
}

/* The V pass at 4 bits with SDOT, NH heads (1 or 2) over NL 16-byte loads of a tile's
 * 32-dimension block b (loads m0 .. m0 + NL - 1: dimensions 32 b + 4 m .. + 3 from the low
 * nibbles, + 16 from the high ones): four tiles at a time with SDOT by element as at 8 bits,
 * then single tiles; o = i8a_v_out(S) + the head's vmin sum. The tiles of pf_n rows of pf (the
 * next chunk's V) are prefetched. NH and NL are constants. */
I8A_INLINE void
i8a_v4tiles_block_neon_dotprod(const uint8_t *const *planes, const float *vmin, int nh, int nl,
                               const uint8_t *v4, size_t tiles, size_t d, size_t b, size_t m0,
                               float *o, const int8_t *pf, size_t pf_n)
{
    const uint8x16_t nib = vdupq_n_u8(15);
    int32x4_t acc[2][I8A_WPLANES][4];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 4
            for (int u = 0; u < 2 * nl; u++)
                acc[h][k][u] = vdupq_n_s32(0);
    const uint8_t *base = v4 + 64 * b + 16 * m0;
    size_t t = 0;
    for (; t + 4 <= tiles; t += 4) {
        if (I8A_V_TILE * t < pf_n)              /* the next chunk's V, four tiles at a time */
            i8a_prefetch_rows(pf + t * 2 * d, 8 * d);
        int8x16_t pw[2][I8A_WPLANES];
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES; k++)
                pw[h][k] = vreinterpretq_s8_u8(vld1q_u8(planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
#pragma GCC unroll 2
            for (int e = 0; e < nl; e++) {
                const uint8x16_t a = vld1q_u8(base + (t + (size_t)r) * 2 * d + 16 * (size_t)e);
                const int8x16_t x[2] = {vreinterpretq_s8_u8(vandq_u8(a, nib)),
                                        vreinterpretq_s8_u8(vshrq_n_u8(a, 4))};
#pragma GCC unroll 2
                for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
                    for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 2
                        for (int f = 0; f < 2; f++)
                            acc[h][k][2 * e + f] = i8a_sdot_lane_neon_dotprod(acc[h][k][2 * e + f], x[f], pw[h][k], r);
            }
        }
    }
    for (; t < tiles; t++) {
#pragma GCC unroll 2
        for (int e = 0; e < nl; e++) {
            const uint8x16_t a = vld1q_u8(base + t * 2 * d + 16 * (size_t)e);
            const int8x16_t x[2] = {vreinterpretq_s8_u8(vandq_u8(a, nib)),
                                    vreinterpretq_s8_u8(vshrq_n_u8(a, 4))};
#pragma GCC unroll 2
            for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
                for (int k = 0; k < I8A_WPLANES; k++) {
                    const uint8_t *pw = planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                    const int8x16_t w = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
#pragma GCC unroll 2
                    for (int f = 0; f < 2; f++)
                        acc[h][k][2 * e + f] = vdotq_s32(acc[h][k][2 * e + f], x[f], w);
                }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 4
        for (int u = 0; u < 2 * nl; u++) {
            int32x4_t sums[I8A_WPLANES];
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES; k++)
                sums[k] = acc[h][k][u];
            const size_t dim = I8A_NIB_BLOCK * b + 4 * (m0 + (size_t)(u / 2)) + (u % 2 ? 16 : 0);
            vst1q_f32(o + h * d + dim, vaddq_f32(i8a_v_out4_neon(sums, sc), vdupq_n_f32(vmin[h])));
        }
    }
}

/* The neon_dotprod tier's V pass at 4 bits: pairs of heads one load (8 dimensions) at a time,
 * then a head left alone two loads at a time (12 accumulators either way). */
I8A_INLINE void i8a_v4pass_neon_dotprod(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                        float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n), blocks = d / I8A_NIB_BLOCK;
    size_t j = 0, pf_n = kv->next_n;   /* the first block prefetches the next chunk's V */
    for (; j + 2 <= nq; j += 2) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), i8a_planes_at(scratch, nq, j + 1)};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j), *i8a_vmin_sum_at(scratch, nq, j + 1)};
        for (size_t b = 0; b < blocks; b++)
            for (size_t m = 0; m < 4; m++, pf_n = 0)
                i8a_v4tiles_block_neon_dotprod(planes, vmin, 2, 1, kv->v4, tiles, d, b, m, o + j * d,
                                               kv->next_v, pf_n);
    }
    if (j < nq) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), NULL};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j), 0.0f};
        for (size_t b = 0; b < blocks; b++)
            for (size_t m = 0; m < 4; m += 2, pf_n = 0)
                i8a_v4tiles_block_neon_dotprod(planes, vmin, 1, 2, kv->v4, tiles, d, b, m, o + j * d,
                                               kv->next_v, pf_n);
    }
}

static void i8a_attend_k8v4_neon_dotprod(const i8a_query *q, const i8a_span *kv,
                                         float *scratch, const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_vpass_neon_dotprod, i8a_v4pass_neon_dotprod,
                          q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_neon_dotprod(const i8a_query *q, const i8a_span *kv,
                                         float *scratch, const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_vpass_neon_dotprod, i8a_v4pass_neon_dotprod,
                          q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_neon_dotprod(const i8a_query *q, const i8a_span *kv,
                                         float *scratch, const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon_dotprod, i8a_vpass_neon_dotprod, i8a_v4pass_neon_dotprod,
                          q, kv, scratch, out, 1, 1);
}


static void i8a_attend_neon_dotprod(const i8a_query *q, const i8a_span *kv, float *scratch,
                                    const i8a_state *out)
{
    i8a_attend_with_neon(i8a_dot16_neon_dotprod, i8a_vpass_neon_dotprod, q, kv, scratch, out);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
