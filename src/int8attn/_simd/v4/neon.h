/* v4/neon.h: V at 4 bits: the planes' sums over tiles of nibbles, and V's minima; the neon
 * tier's, bit for bit v4/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline: no
 * target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_V4_NEON_H
#define I8A_V4_NEON_H

#ifndef I8A_NEON_H
#error "v4/neon.h is included by ../neon.h only"
#endif

/* The 16-lane sum (core/scalar.h's order) of p[s] * vmin[s] for s < n: V's minima at 4 bits. */
I8A_INLINE float i8a_vmin_sum_neon(const float *p, const float *vmin, size_t n)
{
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    size_t s = 0;
    for (; s + 4 <= n; s += 4)
        acc[s / 4 % 4] = vaddq_f32(acc[s / 4 % 4], vmulq_f32(vld1q_f32(p + s), vld1q_f32(vmin + s)));
    float lane[I8A_SUM_LANES];
    for (int b = 0; b < 4; b++)
        vst1q_f32(lane + 4 * b, acc[b]);
    for (; s < n; s++)
        lane[s % I8A_SUM_LANES] = lane[s % I8A_SUM_LANES] + p[s] * vmin[s];
    return i8a_reduce_lanes(lane);
}

/* The neon tier's V pass at 4 bits: codes unpacked to the int8 tile layout (a 16-byte load of
 * a tile's 32-dimension block: dimensions 32 b + 4 m .. + 3 in the low nibbles, 32 b + 16 + 4 m
 * .. + 3 in the high ones, m the load's place in the block), then SMULL and SMLAL over two
 * tiles, one head at a time, four loads (32 dimensions) a block; o = i8a_v_out(S) + the head's
 * vmin sum. */
I8A_INLINE void i8a_v4pass_neon(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const uint8x16_t nib = vdupq_n_u8(15);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        const float vmin = *i8a_vmin_sum_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t b = 0; b < d / I8A_NIB_BLOCK; b++) {
            for (size_t m = 0; m < 4; m += 2) {             /* two loads: 16 dimensions */
                int32x4_t acc[I8A_WPLANES4][4][2];
#pragma GCC unroll 3
                for (int k = 0; k < I8A_WPLANES4; k++)
#pragma GCC unroll 4
                    for (int u = 0; u < 4; u++)
                        acc[k][u][0] = acc[k][u][1] = vdupq_n_s32(0);
                for (size_t t = 0; t < tiles; t += 2) {
                    if (j == 0 && b == 0 && m == 0 && I8A_V_TILE * t < kv->next_n)
                        i8a_prefetch_rows(kv->next_v + t * 2 * d, 4 * d);   /* the next chunk's V */
                    const int two = t + 1 < tiles;
                    int8x16_t x0[4], x1[4];      /* [lo m, hi m, lo m+1, hi m+1] */
#pragma GCC unroll 2
                    for (int e = 0; e < 2; e++) {
                        const uint8_t *at = kv->v4 + t * 2 * d + 64 * b + 16 * (m + (size_t)e);
                        const uint8x16_t a = vld1q_u8(at);
                        x0[2 * e] = vreinterpretq_s8_u8(vandq_u8(a, nib));
                        x0[2 * e + 1] = vreinterpretq_s8_u8(vshrq_n_u8(a, 4));
                        const uint8x16_t c2 = two ? vld1q_u8(at + 2 * d) : vdupq_n_u8(0);
                        x1[2 * e] = vreinterpretq_s8_u8(vandq_u8(c2, nib));
                        x1[2 * e + 1] = vreinterpretq_s8_u8(vshrq_n_u8(c2, 4));
                    }
#pragma GCC unroll 3
                    for (int k = 0; k < I8A_WPLANES4; k++) {
                        const uint8_t *pw = slot + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                        const int8x16_t w0 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
                        const int8x16_t w1 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)(pw + 4)));
#pragma GCC unroll 4
                        for (int u = 0; u < 4; u++) {
                            int16x8_t lo = vmull_s8(vget_low_s8(x0[u]), vget_low_s8(w0));
                            int16x8_t hi = vmull_high_s8(x0[u], w0);
                            lo = vmlal_s8(lo, vget_low_s8(x1[u]), vget_low_s8(w1));
                            hi = vmlal_high_s8(hi, x1[u], w1);
                            acc[k][u][0] = vpadalq_s16(acc[k][u][0], lo);
                            acc[k][u][1] = vpadalq_s16(acc[k][u][1], hi);
                        }
                    }
                }
                /* x0[u] covers dims: u even: 32 b + 4 (m + u/2) .., u odd: + 16 */
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) {
                    int32x4_t sums[I8A_WPLANES4];
                    for (int k = 0; k < I8A_WPLANES4; k++)
                        sums[k] = vpaddq_s32(acc[k][u][0], acc[k][u][1]);
                    const size_t dim = I8A_NIB_BLOCK * b + 4 * (m + (size_t)(u / 2)) + (u % 2 ? 16 : 0);
                    vst1q_f32(o + j * d + dim, vaddq_f32(i8a_v_out4_neon(sums, sc, I8A_WPLANES4), vdupq_n_f32(vmin)));
                }
            }
        }
    }
}

#endif
