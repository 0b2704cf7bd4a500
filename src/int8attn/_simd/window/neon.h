/* window/neon.h: the recent window's attention over rows of halves (attend_float): dots4, exps,
 * vsum; the neon tier's, bit for bit window/scalar.h's rule. Included only by ../neon.h (the
 * aarch64 baseline: no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_WINDOW_NEON_H
#define I8A_WINDOW_NEON_H

#ifndef I8A_NEON_H
#error "window/neon.h is included by ../neon.h only"
#endif

/* The recent window's two loops (window/scalar.h's order), halves widened by fcvtl (exact); a lane
 * sum of 16 is four vectors of 4 lanes. */

static void i8a_dots4_neon(const float *q, const uint16_t *const *k, size_t d, float *dot)
{
    float32x4_t a[4][4];
    for (int b = 0; b < 4; b++)
        for (int r = 0; r < 4; r++)
            a[b][r] = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < d; i += 16) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const float32x4_t qv = vld1q_f32(q + i + 4 * r);
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                a[b][r] = vaddq_f32(a[b][r], vmulq_f32(qv, i8a_halves4_neon(k[b] + i + 4 * r)));
        }
    }
    for (int b = 0; b < 4; b++)
        dot[b] = i8a_fold16_neon(a[b]);
}

static void i8a_exps_neon(float *x, size_t n, float m)
{
    const float32x4_t vm = vdupq_n_f32(m);
    size_t j = 0;
    for (; j + 4 <= n; j += 4)
        vst1q_f32(x + j, i8a_exp4_neon(vsubq_f32(vld1q_f32(x + j), vm)));
    for (; j < n; j++)
        x[j] = i8a_exp_scalar(x[j] - m);
}

/* o[i .. i + 4 nb) of the V sum: nb vectors, one chain each, side by side. */
I8A_INLINE void i8a_vsum_part_neon(const float *w, const uint16_t *const *v, size_t n, size_t i,
                                   int nb, float *o)
{
    float32x4_t acc[16];
#pragma GCC unroll 16
    for (int b = 0; b < nb; b++)
        acc[b] = vdupq_n_f32(0.0f);
    for (size_t j = 0; j < n; j++) {
        const float32x4_t wj = vdupq_n_f32(w[j]);
#pragma GCC unroll 16
        for (int b = 0; b < nb; b++)
            acc[b] = vaddq_f32(acc[b], vmulq_f32(wj, i8a_halves4_neon(v[j] + i + 4 * b)));
    }
#pragma GCC unroll 16
    for (int b = 0; b < nb; b++)
        vst1q_f32(o + i + 4 * b, acc[b]);
}

static void i8a_vsum_neon(const float *w, const uint16_t *const *v, size_t n, size_t d, float *o)
{
    size_t i = 0;
    for (; i + 64 <= d; i += 64)
        i8a_vsum_part_neon(w, v, n, i, 16, o);
    for (; i < d; i += 16)
        i8a_vsum_part_neon(w, v, n, i, 4, o);
}

static void i8a_attend_float_neon(const float *q, const i8a_float_rows *w, size_t d,
                                  float cap, float *logit, float *m, float *l, float *o)
{
    i8a_attend_float_body(q, w, d, cap, logit, m, l, o, i8a_dots4_neon, i8a_exps_neon,
                          i8a_vsum_neon);
}

#endif
