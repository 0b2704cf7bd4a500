/* planes/neon.h: a chunk's softmax and its weights in integer planes and a top row (the V pass's
 * first half); the neon tier's, bit for bit planes/scalar.h's rule. Included only by ../neon.h
 * (the aarch64 baseline: no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_PLANES_NEON_H
#define I8A_PLANES_NEON_H

#ifndef I8A_NEON_H
#error "planes/neon.h is included by ../neon.h only"
#endif

/* p[s] = exp(p[s] - m) for s < n (in place, padding to a multiple of 16 left as zeros);
 * returns the 16-lane sum of core/scalar.h. */
I8A_INLINE float i8a_softmax_neon(float *p, size_t n, float m)
{
    const float32x4_t vm = vdupq_n_f32(m);
    const int32x4_t idx = {0, 1, 2, 3};
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (size_t s = 0; s < n; s += 16) {
        for (int b = 0; b < 4; b++) {
            uint32x4_t keep = vcgtq_s32(vdupq_n_s32((int32_t)(n - s) - 4 * b), idx);
            float32x4_t e = i8a_exp4_neon(vsubq_f32(vld1q_f32(p + s + 4 * b), vm));
            e = vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(e)));
            vst1q_f32(p + s + 4 * b, e);
            acc[b] = vaddq_f32(acc[b], e);
        }
    }
    return i8a_fold16_neon(acc);
}

/* A head's P planes and top row from its weights w [round16(n)] (zeros past n; planes/scalar.h's
 * rule, the top's weight set to 0 in w; the planes 16 weights
 * at a time: floor (vrndm) and clamps on floats, each residual by one fused step (vfms: r - x
 * sc), the last plane's rint by vcvtn (nearest, ties to even), clamped as integers, narrowed to
 * bytes: the bytes of i8a_planes_scalar). */
I8A_INLINE void i8a_planes_neon(float *w, size_t n, size_t lead, uint8_t *slot,
                                int np)
{
    float top[2], w_top;                  /* the largest, then the largest of the others */
    uint32_t at;
    for (int pass = 0; pass < 2; pass++) {
        float32x4_t most = vdupq_n_f32(0.0f);
        for (size_t s = 0; s < n; s += 4)
            most = vmaxq_f32(most, vld1q_f32(w + s));         /* the padding's zeros too */
        top[pass] = vmaxvq_f32(most);
        if (pass == 0)
            i8a_take_top(w, 0, n, top[0], &w_top, &at);
    }
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    const float lift = i8a_weight_scales(top[1], np, sc, inv);
    const float32x4_t zero_f = vdupq_n_f32(0.0f), most_f = vdupq_n_f32(127.0f);
    const int32x4_t zero = vdupq_n_s32(0), most_i = vdupq_n_s32(127);
    for (size_t s = 0; s < n; s += 16) {
        int32x4_t b[I8A_WPLANES][4];
        for (int u = 0; u < 4; u++) {
            float32x4_t r = vmulq_n_f32(vld1q_f32(w + s + 4 * u), lift);
            for (int k = 0; k < np - 1; k++) {
                float32x4_t x = vrndmq_f32(vmulq_n_f32(r, inv[k]));
                x = vminq_f32(vmaxq_f32(x, zero_f), most_f);
                r = vfmsq_n_f32(r, x, sc[k]);
                b[k][u] = vcvtq_s32_f32(x);
            }
            const int32x4_t l = vcvtnq_s32_f32(vmulq_n_f32(r, inv[np - 1]));
            b[np - 1][u] = vminq_s32(vmaxq_s32(l, zero), most_i);
        }
        for (int k = 0; k < np; k++) {
            const int16x8_t b01 = vcombine_s16(vmovn_s32(b[k][0]), vmovn_s32(b[k][1]));
            const int16x8_t b23 = vcombine_s16(vmovn_s32(b[k][2]), vmovn_s32(b[k][3]));
            vst1q_s8((int8_t *)slot + k * I8A_PLANE_BYTES + lead + s,
                     vcombine_s8(vmovn_s16(b01), vmovn_s16(b23)));
        }
    }
    i8a_planes_frame(slot, lead, n, np, sc, lift, w_top, at);
}

#endif
