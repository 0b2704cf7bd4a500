/* v4/neon_dotprod.h: V at 4 bits: the planes' sums over tiles of nibbles, and V's minima; the
 * neon_dotprod tier's, bit for bit v4/scalar.h's rule. Included only by ../neon_dotprod.h, inside
 * the tier's target region: its pragma applies to every function here. */
#ifndef I8A_V4_NEON_DOTPROD_H
#define I8A_V4_NEON_DOTPROD_H

#ifndef I8A_NEON_DOTPROD_H
#error "v4/neon_dotprod.h is included by ../neon_dotprod.h only"
#endif

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
    int32x4_t acc[2][I8A_WPLANES4][4];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < I8A_WPLANES4; k++)
#pragma GCC unroll 4
            for (int u = 0; u < 2 * nl; u++)
                acc[h][k][u] = vdupq_n_s32(0);
    const uint8_t *base = v4 + 64 * b + 16 * m0;
    size_t t = 0;
    for (; t + 4 <= tiles; t += 4) {
        if (I8A_V_TILE * t < pf_n)              /* the next chunk's V, four tiles at a time */
            i8a_prefetch_rows(pf + t * 2 * d, 8 * d);
        int8x16_t pw[2][I8A_WPLANES4];
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES4; k++)
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
                    for (int k = 0; k < I8A_WPLANES4; k++)
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
                for (int k = 0; k < I8A_WPLANES4; k++) {
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
            int32x4_t sums[I8A_WPLANES4];
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES4; k++)
                sums[k] = acc[h][k][u];
            const size_t dim = I8A_NIB_BLOCK * b + 4 * (m0 + (size_t)(u / 2)) + (u % 2 ? 16 : 0);
            vst1q_f32(o + h * d + dim, vaddq_f32(i8a_v_out4_neon(sums, sc, I8A_WPLANES4), vdupq_n_f32(vmin[h])));
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

#endif
