/* vpass/neon_i8mm.h: the integer V pass at 8 bits by SMMLA: the planes' sums over V tiles, then
 * o; the neon_i8mm tier's, bit for bit vpass/scalar.h's rule. Included only by ../neon_i8mm.h,
 * inside the tier's target region: its pragma applies to every function here.
 *
 * SMMLA's first operand is one head's two weight planes over 8 positions (two tiles: plane 0's
 * 8 bytes, then plane 1's, the head's packed planes; 7-bit, so as signed bytes the same), its
 * second two dimensions' codes over the same 8 positions. A tile holds each dimension's 4
 * positions in 4 bytes, so 16 bytes of tile t and the same 16 of tile t + 1, zipped by 32-bit
 * words, are the operands of dims (i, i + 1) and (i + 2, i + 3): one zip pair serves every head
 * of the group, and each head takes two SMMLA where SDOT takes four. */
#ifndef I8A_VPASS_NEON_I8MM_H
#define I8A_VPASS_NEON_I8MM_H

#ifndef I8A_NEON_I8MM_H
#error "vpass/neon_i8mm.h is included by ../neon_i8mm.h only"
#endif

/* Head planes' packed form, wp [16 * pairs] (pairs <= 33: within two planes' bytes): per 8
 * positions (tiles 2 u, 2 u + 1) plane 0's 8 bytes, then plane 1's. A head's planes are zero
 * from its last row up to a multiple of 16 (planes/scalar.h), which covers the last pair's
 * bytes. */
I8A_INLINE void i8a_wpack_neon_i8mm(const uint8_t *planes, size_t pairs, uint8_t *wp)
{
    for (size_t u = 0; u < pairs; u++)
        vst1q_u8(wp + 16 * u, vcombine_u8(vld1_u8(planes + 8 * u),
                                          vld1_u8(planes + I8A_PLANE_BYTES + 8 * u)));
}

/* The V pass of NH heads (packed planes wp, 16 * pairs bytes each) over dims [i0, i0 + 4 nu):
 * per pair of tiles and 4 dims, the zipped operands and two SMMLA per head, whose sums come out
 * as (S_0 of dims i, i + 1, S_1 of them) and the same for i + 2, i + 3; then o from the planes'
 * sums. tile[t]: tile t's address (NULL past the last: zeros). Block b of nblk prefetches its
 * share of the next span's V (i8a_vprefetch_share). NH and NU are constants at every call. */
I8A_INLINE void i8a_vmm_block_neon_i8mm(const uint8_t *wp, size_t pairs, int nh, int nu,
                                        const i8a_span *kv, const int8_t *const *tile, size_t d,
                                        size_t i0, const uint8_t *const *planes, float *o,
                                        size_t pf_lo, size_t pf_hi)
{
    int32x4_t acc[I8A_I8MM_HEADS][4][2];
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int u = 0; u < nu; u++)
            acc[h][u][0] = acc[h][u][1] = vdupq_n_s32(0);
    const int8x16_t zero = vdupq_n_s8(0);
    for (size_t p = 0; p < pairs; p++) {
        if (2 * I8A_V_TILE * p >= pf_lo && 2 * I8A_V_TILE * p < pf_hi)
            i8a_prefetch_rows(i8a_next_vrow(kv, 2 * I8A_V_TILE * p, d), 2 * I8A_V_TILE * d);
        const int8_t *x = tile[2 * p] + i0 * I8A_V_TILE, *y = tile[2 * p + 1];
        int8x16_t b[4][2];
#pragma GCC unroll 4
        for (int u = 0; u < nu; u++) {
            const int32x4_t xv = vreinterpretq_s32_s8(vld1q_s8(x + 16 * u));
            const int32x4_t yv = vreinterpretq_s32_s8(
                y ? vld1q_s8(y + i0 * I8A_V_TILE + 16 * u) : zero);
            b[u][0] = vreinterpretq_s8_s32(vzip1q_s32(xv, yv));
            b[u][1] = vreinterpretq_s8_s32(vzip2q_s32(xv, yv));
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            const int8x16_t a = vreinterpretq_s8_u8(vld1q_u8(wp + (size_t)h * 16 * pairs + 16 * p));
#pragma GCC unroll 4
            for (int u = 0; u < nu; u++) {
                acc[h][u][0] = vmmlaq_s32(acc[h][u][0], a, b[u][0]);
                acc[h][u][1] = vmmlaq_s32(acc[h][u][1], a, b[u][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 4
        for (int u = 0; u < nu; u++) {
            const int64x2_t e = vreinterpretq_s64_s32(acc[h][u][0]);
            const int64x2_t f = vreinterpretq_s64_s32(acc[h][u][1]);
            const int32x4_t sums[I8A_WPLANES8] = {vreinterpretq_s32_s64(vzip1q_s64(e, f)),
                                                  vreinterpretq_s32_s64(vzip2q_s64(e, f))};
            vst1q_f32(o + (size_t)h * d + i0 + 4 * (size_t)u,
                      i8a_v_out4_neon(sums, sc, I8A_WPLANES8));
        }
    }
}

/* The V pass of heads [j, j + nh) (nh <= I8A_I8MM_HEADS): their planes packed on the stack, dims
 * in blocks of 4 nu (24 accumulators at most beside the operands), the first block of heads
 * prefetching the next chunk's V. */
I8A_INLINE void i8a_vmm_group_neon_i8mm(float *scratch, size_t nq, size_t j, int nh,
                                        const i8a_span *kv, const int8_t *const *tile,
                                        size_t pairs, size_t d, float *o, size_t pf_n)
{
    const uint8_t *planes[I8A_I8MM_HEADS];
    _Alignas(16) uint8_t wp[I8A_I8MM_HEADS * I8A_WPLANES8 * I8A_PLANE_BYTES];   /* 16 * pairs */
    for (int h = 0; h < nh; h++) {
        planes[h] = i8a_planes_at(scratch, nq, j + (size_t)h);
        i8a_wpack_neon_i8mm(planes[h], pairs, wp + (size_t)h * 16 * pairs);
    }
    const int nu = nh <= 2 ? 4 : 2;
    const size_t nblk = d / (4 * (size_t)nu) + (d % (4 * (size_t)nu)) / 4;
    size_t i = 0, b = 0, lo, hi;
    for (; i + 4 * (size_t)nu <= d; i += 4 * (size_t)nu, b++) {
        i8a_vprefetch_share(pf_n, b, nblk, &lo, &hi);
        switch (nh) {                           /* NH and NU as constants */
        case 4: i8a_vmm_block_neon_i8mm(wp, pairs, 4, 2, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        case 3: i8a_vmm_block_neon_i8mm(wp, pairs, 3, 2, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        case 2: i8a_vmm_block_neon_i8mm(wp, pairs, 2, 4, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        default: i8a_vmm_block_neon_i8mm(wp, pairs, 1, 4, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        }
    }
    for (; i < d; i += 4, b++) {
        i8a_vprefetch_share(pf_n, b, nblk, &lo, &hi);
        switch (nh) {
        case 4: i8a_vmm_block_neon_i8mm(wp, pairs, 4, 1, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        case 3: i8a_vmm_block_neon_i8mm(wp, pairs, 3, 1, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        case 2: i8a_vmm_block_neon_i8mm(wp, pairs, 2, 1, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        default: i8a_vmm_block_neon_i8mm(wp, pairs, 1, 1, kv, tile, d, i, planes, o + j * d, lo, hi); break;
        }
    }
}

/* The neon_i8mm tier's V pass over the nq heads of a chunk: the tiles' addresses found once (a
 * block lookup per run), then heads in groups of I8A_I8MM_HEADS; the first group prefetches
 * the next chunk's V. */
I8A_INLINE void i8a_vpass_neon_i8mm(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                    float *o)
{
    const int8_t *tile[I8A_CHUNK / I8A_V_TILE + 2];    /* an odd count's last pair: NULL, zeros */
    const size_t tiles = i8a_vtile_addresses(kv, d, tile), pairs = (tiles + 1) / 2;
    size_t pf_n = kv->next_n;
    for (size_t j = 0; j < nq; j += I8A_I8MM_HEADS, pf_n = 0)
        i8a_vmm_group_neon_i8mm(scratch, nq, j, nq - j < I8A_I8MM_HEADS ? (int)(nq - j)
                                                                         : I8A_I8MM_HEADS,
                                kv, tile, pairs, d, o, pf_n);
}

#endif
