/* vpass/neon_dotprod.h: the integer V pass at 8 bits: the planes' sums over V tiles, then o; the
 * neon_dotprod tier's, bit for bit vpass/scalar.h's rule. Included only by ../neon_dotprod.h,
 * inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_VPASS_NEON_DOTPROD_H
#define I8A_VPASS_NEON_DOTPROD_H

#ifndef I8A_NEON_DOTPROD_H
#error "vpass/neon_dotprod.h is included by ../neon_dotprod.h only"
#endif

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

/* The integer V pass (planes/scalar.h) with SDOT, NH heads over dims [i0, i0 + 4 nu): each 32-bit
 * lane sums its dimension's 4 positions of a tile. Four tiles at a time, each head's plane
 * bytes of the four in one register (16 bytes: the planes are zero up to a multiple of 16),
 * SDOT by element picking tile r's word; tiles past the last multiple of four one at a time
 * with the word repeated (ld1r). Then o from the planes' sums. The first block prefetches pf_n
 * rows of the next span's V. NH and NU are constants at every call. */
I8A_INLINE void
i8a_vtiles_block_neon_dotprod(const uint8_t *const *planes, int nh, int nu, const i8a_span *kv,
                              size_t tiles, size_t d, size_t i0, float *o,
                              size_t pf_n)
{
    int32x4_t acc[4][I8A_WPLANES8][8];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES8; k++)
#pragma GCC unroll 8
            for (int u = 0; u < nu; u++)
                acc[h][k][u] = vdupq_n_s32(0);
    for (size_t t0 = 0; t0 < tiles;) {            /* runs of tiles in one block (i8a_vrun) */
        const int8_t *run;
        const size_t end = t0 + i8a_vrun(kv, t0, tiles, d, &run);
        size_t t = t0;
        for (; t + 4 <= end; t += 4) {
            if (I8A_V_TILE * t < pf_n)
                i8a_prefetch_rows(i8a_next_vrow(kv, I8A_V_TILE * t, d), 4 * I8A_V_TILE * d);
            int8x16_t pw[4][I8A_WPLANES8];
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                for (int k = 0; k < I8A_WPLANES8; k++)
                    pw[h][k] = vreinterpretq_s8_u8(vld1q_u8(planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t));
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const int8_t *x = run + ((t - t0 + (size_t)r) * d + i0) * I8A_V_TILE;
#pragma GCC unroll 8
                for (int u = 0; u < nu; u++) {
                    const int8x16_t xv = vld1q_s8(x + 16 * u);
#pragma GCC unroll 8
                    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                        for (int k = 0; k < I8A_WPLANES8; k++)
                            acc[h][k][u] = i8a_sdot_lane_neon_dotprod(acc[h][k][u], xv, pw[h][k], r);
                }
            }
        }
        for (; t < end; t++) {
            const int8_t *x = run + ((t - t0) * d + i0) * I8A_V_TILE;
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                for (int k = 0; k < I8A_WPLANES8; k++) {
                    const uint8_t *pw = planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                    const int8x16_t w = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
#pragma GCC unroll 8
                    for (int u = 0; u < nu; u++)
                        acc[h][k][u] = vdotq_s32(acc[h][k][u], vld1q_s8(x + 16 * u), w);
                }
        }
        t0 = end;
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int u = 0; u < nu; u++) {
            int32x4_t sums[I8A_WPLANES8];
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES8; k++)
                sums[k] = acc[h][k][u];
            vst1q_f32(o + h * d + i0 + 4 * u, i8a_v_out4_neon(sums, sc, I8A_WPLANES8));
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
        i8a_vtiles_block_neon_dotprod(planes, nh, nu, kv, tiles, d, i, o + j * d, pf_n);
    for (; i < d; i += 4, pf_n = 0)
        i8a_vtiles_block_neon_dotprod(planes, nh, 1, kv, tiles, d, i, o + j * d, pf_n);
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

#endif
