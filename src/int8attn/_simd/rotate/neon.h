/* rotate/neon.h: rotate: the random-sign Walsh-Hadamard rotation of a row; the neon tier's, bit
 * for bit rotate/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline: no target
 * pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_ROTATE_NEON_H
#define I8A_ROTATE_NEON_H

#ifndef I8A_NEON_H
#error "rotate/neon.h is included by ../neon.h only"
#endif

/* The rotation of rotate/scalar.h, stage by stage the same additions and subtractions. A group of
 * N registers (N * 4 floats, N = 4, 8, 16) goes through every stage below N * 4 without leaving
 * registers: h = 1, 2 inside each register (the partner by vrev64q / vextq; lanes with bit h
 * set take partner - self, the others self + partner), then h = 4 .. between registers. Wider
 * stages (blocks over 64) are rotate/scalar.h's passes over memory. */
static inline float32x4_t i8a_rot_lanes_neon(float32x4_t v, float32x4_t p, uint32x4_t hi)
{
    return vbslq_f32(hi, vsubq_f32(p, v), vaddq_f32(v, p));
}

/* Stage h (in registers) over the n registers of a group: (r[j], r[j + h]) for j & h == 0. */
I8A_INLINE void i8a_rot_regs_neon(float32x4_t *r, int n, int h)
{
#pragma GCC unroll 16
    for (int j = 0; j < n; j++)
        if (!(j & h)) {
            const float32x4_t a = r[j], c = r[j + h];
            r[j] = vaddq_f32(a, c);
            r[j + h] = vsubq_f32(a, c);
        }
}

I8A_INLINE void
i8a_rot_groups_neon(const float *in, size_t d, const float *sign, int inverse, int n, int whole,
                    float32x4_t scale, float *x)
{
    static const uint32_t m1[4] = {0, ~0u, 0, ~0u}, m2[4] = {0, 0, ~0u, ~0u};
    const uint32x4_t h1 = vld1q_u32(m1), h2 = vld1q_u32(m2);
    for (size_t g = 0; g < d; g += (size_t)n * 4) {
        float32x4_t r[16];
#pragma GCC unroll 16
        for (int j = 0; j < n; j++) {
            float32x4_t v = vld1q_f32(in + g + 4 * j);
            if (!inverse)
                v = vmulq_f32(v, vld1q_f32(sign + g + 4 * j));
            v = i8a_rot_lanes_neon(v, vrev64q_f32(v), h1);
            r[j] = i8a_rot_lanes_neon(v, vextq_f32(v, v, 2), h2);
        }
        if (n > 1)
            i8a_rot_regs_neon(r, n, 1);
        if (n > 2)
            i8a_rot_regs_neon(r, n, 2);
        if (n > 4)
            i8a_rot_regs_neon(r, n, 4);
        if (n > 8)
            i8a_rot_regs_neon(r, n, 8);
#pragma GCC unroll 16
        for (int j = 0; j < n; j++) {
            if (whole) {
                r[j] = vmulq_f32(r[j], scale);
                if (inverse)
                    r[j] = vmulq_f32(r[j], vld1q_f32(sign + g + 4 * j));
            }
            vst1q_f32(x + g + 4 * j, r[j]);
        }
    }
}

static void i8a_rotate_neon(const float *in, size_t d, const float *sign, int inverse, float *x)
{
    const size_t block = d & (~d + 1);                  /* >= 16: d is a multiple of 16 */
    const float32x4_t scale = vdupq_n_f32(1.0f / sqrtf((float)block));
    switch (block) {
    case 16: i8a_rot_groups_neon(in, d, sign, inverse, 4, 1, scale, x); return;
    case 32: i8a_rot_groups_neon(in, d, sign, inverse, 8, 1, scale, x); return;
    case 64: i8a_rot_groups_neon(in, d, sign, inverse, 16, 1, scale, x); return;
    default: i8a_rot_groups_neon(in, d, sign, inverse, 16, 0, scale, x);
    }
    i8a_rotate_stages(x, d, sign, inverse, 64);
}

#endif
