/* window/neon.h: the recent window's attention over rows of halves (attend_float): dots4, exps,
 * vsum; the neon tier's, bit for bit window/scalar.h's rule. Included only by ../neon.h (the
 * aarch64 baseline: no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_WINDOW_NEON_H
#define I8A_WINDOW_NEON_H

#ifndef I8A_NEON_H
#error "window/neon.h is included by ../neon.h only"
#endif

/* The recent window's loops (window/scalar.h's order), halves widened by fcvtl (exact) once for
 * every head of the block; a lane sum of 16 is four vectors of 4 lanes, and the dots take them
 * one after the other (each lane's order is kept), so that 4 heads x 4 rows of sums fit the
 * registers. nh is a constant in each copy of the blocks (I8A_WIN_BY_HEADS). */

I8A_INLINE void i8a_dots4_block_neon(size_t nh, const float *q, const uint16_t *const *k,
                                     size_t d, float *dot)
{
    float32x4_t part[I8A_WIN_HEADS][4][4];                  /* [head][row][lane quarter] */
    for (int r = 0; r < 4; r++) {
        float32x4_t a[I8A_WIN_HEADS][4];
#pragma GCC unroll 4
        for (size_t h = 0; h < nh; h++)
            for (int b = 0; b < 4; b++)
                a[h][b] = vdupq_n_f32(0.0f);
        for (size_t i = 4 * (size_t)r; i < d; i += 16) {
            float32x4_t kv[4];
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                kv[b] = i8a_halves4_neon(k[b] + i);
#pragma GCC unroll 4
            for (size_t h = 0; h < nh; h++) {
                const float32x4_t qv = vld1q_f32(q + h * d + i);
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++)
                    a[h][b] = vaddq_f32(a[h][b], vmulq_f32(qv, kv[b]));
            }
        }
#pragma GCC unroll 4
        for (size_t h = 0; h < nh; h++)
            for (int b = 0; b < 4; b++)
                part[h][b][r] = a[h][b];
    }
    for (size_t h = 0; h < nh; h++)
        for (int b = 0; b < 4; b++)
            dot[h * 4 + b] = i8a_fold16_neon(part[h][b]);
}

static void i8a_dots4_neon(const float *q, size_t nh, const uint16_t *const *k, size_t d,
                           float *dot)
{
    I8A_WIN_BY_HEADS(nh, i8a_dots4_block_neon, q, k, d, dot);
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

/* o[h][i .. i + 16) of the V sum for the nh heads: nh x 4 vectors, one chain each, side by side;
 * each vector of halves widened once for the heads. */
I8A_INLINE void i8a_vsum_part_neon(const float *w, size_t nh, const uint16_t *const *v, size_t n,
                                   size_t d, size_t i, float *o)
{
    float32x4_t acc[I8A_WIN_HEADS][4];
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
        for (int b = 0; b < 4; b++)
            acc[h][b] = vdupq_n_f32(0.0f);
    for (size_t j = 0; j < n; j++) {
        float32x4_t vv[4];
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            vv[b] = i8a_halves4_neon(v[j] + i + 4 * b);
#pragma GCC unroll 4
        for (size_t h = 0; h < nh; h++) {
            const float32x4_t wj = vdupq_n_f32(w[h * n + j]);
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                acc[h][b] = vaddq_f32(acc[h][b], vmulq_f32(wj, vv[b]));
        }
    }
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
        for (int b = 0; b < 4; b++)
            vst1q_f32(o + h * d + i + 4 * b, acc[h][b]);
}

I8A_INLINE void i8a_vsum_block_neon(size_t nh, const float *w, const uint16_t *const *v, size_t n,
                                    size_t d, float *o)
{
    for (size_t i = 0; i < d; i += 16)
        i8a_vsum_part_neon(w, nh, v, n, d, i, o);
}

static void i8a_vsum_neon(const float *w, size_t nh, const uint16_t *const *v, size_t n, size_t d,
                          float *o)
{
    I8A_WIN_BY_HEADS(nh, i8a_vsum_block_neon, w, v, n, d, o);
}

static void i8a_attend_float_neon(const float *q, size_t nq, const i8a_float_rows *w, size_t d,
                                  float cap, float *logit, const i8a_state *out)
{
    i8a_attend_float_body(q, nq, w, d, cap, logit, out, i8a_dots4_neon, i8a_exps_neon,
                          i8a_vsum_neon);
}

#endif
