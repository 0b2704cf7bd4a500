/* half_row/neon.h: IEEE halves (the recent window's rows): half_bits / half_value, a row's scale
 * exponent, half_row; the neon tier's, bit for bit half_row/scalar.h's rule. Included only by
 * ../neon.h (the aarch64 baseline: no target pragma), before the neon_dotprod tier's region
 * opens. */
#ifndef I8A_HALF_ROW_NEON_H
#define I8A_HALF_ROW_NEON_H

#ifndef I8A_NEON_H
#error "half_row/neon.h is included by ../neon.h only"
#endif

/* A row into the window's halves (dispatch.h): the largest |x| by vector max (exact in any
 * order), then fcvtn, IEEE nearest-even (FPCR's default mode) like i8a_half_bits. */
static float i8a_half_row_neon(const float *x, size_t d, uint16_t *h)
{
    float32x4_t most = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < d; i += 4)
        most = vmaxq_f32(most, vabsq_f32(vld1q_f32(x + i)));
    const float top = vmaxvq_f32(most);
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const float32x4_t down = vdupq_n_f32(i8a_pow2f(-e));
    for (size_t i = 0; i < d; i += 4)
        vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vmulq_f32(vld1q_f32(x + i), down))));
    return i8a_pow2f(e);
}

#endif
