/* vpass/neon.h: the integer V pass at 8 bits: the planes' sums over V tiles, then o; the neon
 * tier's, bit for bit vpass/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline: no
 * target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_VPASS_NEON_H
#define I8A_VPASS_NEON_H

#ifndef I8A_NEON_H
#error "vpass/neon.h is included by ../neon.h only"
#endif

/* Four outputs from their planes' sums (vpass/scalar.h's i8a_v_out, four lanes). */
I8A_INLINE float32x4_t i8a_v_out4_neon(const int32x4_t *sums, const float sc[I8A_WPLANES],
                                       int np)
{
    float32x4_t r = vmulq_n_f32(vcvtq_f32_s32(sums[0]), sc[0]);
#pragma GCC unroll 8
    for (int k = 1; k < np; k++)
        r = vfmaq_n_f32(r, vcvtq_f32_s32(sums[k]), sc[k]);
    return r;
}

/* The integer V pass (planes/scalar.h) without SDOT, NH heads over dims [i0, i0 + 4 nu): V bytes
 * times each head's plane word repeated in every lane (ld1r) by vmull_s8 for one tile and
 * vmlal_s8 for the next (two products per int16 lane, at most 2 * 127 * 127), vpadalq_s16
 * into int32 pairs of positions, a pairwise add per 4 dims at the end; then o from the planes'
 * sums. The first block prefetches pf_n rows of the next span's V. NH and NU are
 * constants at every call. */
I8A_INLINE void
i8a_vtiles_block_neon(const uint8_t *const *planes, int nh, int nu, const i8a_span *kv,
                      size_t tiles, size_t d, size_t i0, float *o, size_t pf_n)
{
    int32x4_t acc[2][I8A_WPLANES8][2][2];    /* [head][plane][vector][dims 0-1, dims 2-3] */
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES8; k++)
#pragma GCC unroll 8
            for (int u = 0; u < nu; u++)
                acc[h][k][u][0] = acc[h][k][u][1] = vdupq_n_s32(0);
    for (size_t t0 = 0; t0 < tiles;) {            /* runs of tiles in one block (i8a_vrun) */
        const int8_t *run;
        const size_t end = t0 + i8a_vrun(kv, t0, tiles, d, &run);
        for (size_t t = t0; t < end; t += 2) {
            if (I8A_V_TILE * t < pf_n)
                i8a_prefetch_rows(i8a_next_vrow(kv, I8A_V_TILE * t, d), 2 * I8A_V_TILE * d);
            const int two = t + 1 < end;        /* the last tile of an odd run is alone */
            const int8_t *x0 = run + ((t - t0) * d + i0) * I8A_V_TILE, *x1 = x0 + I8A_V_TILE * d;
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                for (int k = 0; k < I8A_WPLANES8; k++) {
                    const uint8_t *pw = planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                    const int8x16_t w0 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
                    const int8x16_t w1 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)(pw + 4)));
#pragma GCC unroll 8
                    for (int u = 0; u < nu; u++) {
                        const int8x16_t a = vld1q_s8(x0 + 16 * u);
                        int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(w0));
                        int16x8_t hi = vmull_high_s8(a, w0);
                        if (two) {
                            const int8x16_t b = vld1q_s8(x1 + 16 * u);
                            lo = vmlal_s8(lo, vget_low_s8(b), vget_low_s8(w1));
                            hi = vmlal_high_s8(hi, b, w1);
                        }
                        acc[h][k][u][0] = vpadalq_s16(acc[h][k][u][0], lo);
                        acc[h][k][u][1] = vpadalq_s16(acc[h][k][u][1], hi);
                    }
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
                sums[k] = vpaddq_s32(acc[h][k][u][0], acc[h][k][u][1]);
            vst1q_f32(o + h * d + i0 + 4 * u, i8a_v_out4_neon(sums, sc, I8A_WPLANES8));
        }
    }
}

/* The neon tier's V pass over the nq heads of a chunk: pairs of heads 4 dims at a time, then a
 * head left alone 8 dims at a time (24 accumulators either way). The first block prefetches
 * the next chunk's V. d is a multiple of 16. */
I8A_INLINE void i8a_vpass_neon(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                               float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    size_t pf_n = kv->next_n, j = 0;
    for (; j + 2 <= nq; j += 2) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), i8a_planes_at(scratch, nq, j + 1)};
        for (size_t i = 0; i < d; i += 4, pf_n = 0)
            i8a_vtiles_block_neon(planes, 2, 1, kv, tiles, d, i, o + j * d, pf_n);
    }
    if (j < nq) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), NULL};
        for (size_t i = 0; i < d; i += 8, pf_n = 0)
            i8a_vtiles_block_neon(planes, 1, 2, kv, tiles, d, i, o + j * d, pf_n);
    }
}

typedef void (*i8a_vpass_neon_fn)(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                  float *o);

#endif
