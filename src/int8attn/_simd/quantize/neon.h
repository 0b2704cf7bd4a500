/* quantize/neon.h: the row quantizer (quantize_row): the scale rule and one element's rounding;
 * the neon tier's, bit for bit quantize/scalar.h's rule. Included only by ../neon.h (the aarch64
 * baseline: no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_QUANTIZE_NEON_H
#define I8A_QUANTIZE_NEON_H

#ifndef I8A_NEON_H
#error "quantize/neon.h is included by ../neon.h only"
#endif

static int i8a_quantize_row_neon(const float *x, size_t d, int8_t *codes, float *scale)
{
    float32x4_t vmax = vdupq_n_f32(0.0f);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    const float32x4_t big = vdupq_n_f32(FLT_MAX);
    size_t i = 0;
    for (; i + 4 <= d; i += 4) {
        float32x4_t a = vabsq_f32(vld1q_f32(x + i));
        ok = vandq_u32(ok, vcleq_f32(a, big));
        vmax = vmaxq_f32(vmax, a);
    }
    float absmax = vmaxvq_f32(vmax);
    int finite = vminvq_u32(ok) == 0xffffffffu;
    float inv;
    const int todo = i8a_row_prepare(x, i, d, absmax, finite, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    const float32x4_t vinv = vdupq_n_f32(inv);
    const int8x16_t lo = vdupq_n_s8(-127);
    for (i = 0; i + 16 <= d; i += 16) {
        /* vcvtnq rounds half to even, as rintf does under the default rounding mode */
        int32x4_t a = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i), vinv));
        int32x4_t b = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 4), vinv));
        int32x4_t c = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 8), vinv));
        int32x4_t e = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 12), vinv));
        int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
        int16x8_t ce = vcombine_s16(vqmovn_s32(c), vqmovn_s32(e));
        vst1q_s8(codes + i, vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(ce)), lo));
    }
    for (; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

#endif
