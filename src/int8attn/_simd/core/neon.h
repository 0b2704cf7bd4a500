/* core/neon.h: the contract's shared pieces: the forced-inline macro, the exp polynomial, the
 * soft cap, the 16-lane sum order, the prefetch hint; the neon tier's, bit for bit
 * core/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline: no target pragma),
 * before the neon_dotprod tier's region opens. */
#ifndef I8A_CORE_NEON_H
#define I8A_CORE_NEON_H

#ifndef I8A_NEON_H
#error "core/neon.h is included by ../neon.h only"
#endif

/* The exp's polynomial on 4 lanes, the operations of i8a_exp_poly_scalar
 * (vfmaq_f32(c, a, b) = fma(a, b, c)). */
I8A_INLINE float32x4_t i8a_exp_poly4_neon(float32x4_t x, float32x4_t *n_out)
{
    const float32x4_t magic = vdupq_n_f32(I8A_EXP_MAGIC);
    x = vmaxq_f32(x, vdupq_n_f32(I8A_EXP_LO));
    float32x4_t n = vsubq_f32(vfmaq_f32(magic, x, vdupq_n_f32(I8A_LOG2E)), magic);
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-I8A_LN2_HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(-I8A_LN2_LO));
    float32x4_t z = vmulq_f32(r, r);
    float32x4_t y = vdupq_n_f32(I8A_EXP_P0);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P1), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P2), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P3), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P4), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P5), y, r);
    *n_out = n;
    return vfmaq_f32(r, y, z);
}

/* y * 2^n on 4 lanes (i8a_scale2n_scalar). */
I8A_INLINE float32x4_t i8a_scale2n4_neon(float32x4_t y, float32x4_t n)
{
    int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), e));
}

/* exp of 4 lanes, the operations of i8a_exp_scalar. */
I8A_INLINE float32x4_t i8a_exp4_neon(float32x4_t x)
{
    float32x4_t n;
    const float32x4_t y = i8a_exp_poly4_neon(x, &n);
    return i8a_scale2n4_neon(vaddq_f32(y, vdupq_n_f32(1.0f)), n);
}

/* expm1 of 4 lanes, the operations of i8a_expm1_scalar. */
I8A_INLINE float32x4_t i8a_expm1_4_neon(float32x4_t x)
{
    float32x4_t n;
    const float32x4_t y = i8a_exp_poly4_neon(x, &n), one = vdupq_n_f32(1.0f);
    const float32x4_t big = vsubq_f32(i8a_scale2n4_neon(vaddq_f32(y, one), n), one);
    return vbslq_f32(vceqq_f32(n, vdupq_n_f32(0.0f)), y, big);
}

/* i8a_softcap on 4 lanes (t >= +0, so the sign of u is or-ed in). */
I8A_INLINE float32x4_t i8a_softcap4_neon(float32x4_t l, float cap, float inv_cap)
{
    const float32x4_t u = vmulq_n_f32(l, inv_cap);
    const float32x4_t m = i8a_expm1_4_neon(vmulq_n_f32(vabsq_f32(u), -2.0f));
    const float32x4_t t = vdivq_f32(vabsq_f32(m), vaddq_f32(vdupq_n_f32(2.0f), m));
    const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(u), vdupq_n_u32(0x80000000u));
    return vmulq_n_f32(vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t), sign)), cap);
}

/* Four halves widened (exact). */
static inline float32x4_t i8a_halves4_neon(const uint16_t *h)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* The 16 lane sums of a[0..3] (lanes 4r .. 4r + 3 in a[r]) folded into one: lanes i + 8, then
 * i + 4, i + 2, i + 1 (the halving order of i8a_reduce_lanes). */
I8A_INLINE float i8a_fold16_neon(const float32x4_t a[4])
{
    const float32x4_t h = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
    const float32x2_t t = vadd_f32(vget_low_f32(h), vget_high_f32(h));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

#endif
