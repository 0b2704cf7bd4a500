/* window/avx2.h: the recent window's attention over rows of halves (attend_float): dots4, exps,
 * vsum; the avx2 tier's, bit for bit window/scalar.h's rule. Included only by ../avx2.h, inside
 * the tier's target region: its pragma applies to every function here. */
#ifndef I8A_WINDOW_AVX2_H
#define I8A_WINDOW_AVX2_H

#ifndef I8A_AVX2_H
#error "window/avx2.h is included by ../avx2.h only"
#endif

/* The recent window's two loops (window/scalar.h's order), halves widened by i8a_halves8 (above); a
 * lane sum of 16 is two vectors, lanes 0-7 and 8-15. */

static void i8a_dots4_avx2(const float *q, const uint16_t *const *k, size_t d, float *dot)
{
    __m256 lo[4], hi[4];
    for (int b = 0; b < 4; b++)
        lo[b] = hi[b] = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) {
            lo[b] = _mm256_add_ps(lo[b], _mm256_mul_ps(q0, i8a_halves8_avx2(k[b] + i)));
            hi[b] = _mm256_add_ps(hi[b], _mm256_mul_ps(q1, i8a_halves8_avx2(k[b] + i + 8)));
        }
    }
    for (int b = 0; b < 4; b++)
        dot[b] = i8a_fold16_avx2(lo[b], hi[b]);
}

static void i8a_exps_avx2(float *x, size_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(x + j, i8a_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
    for (; j < n; j++)
        x[j] = i8a_exp_scalar(x[j] - m);
}

/* o[i .. i + 8 nb) of the V sum: nb vectors, one chain each, side by side. */
I8A_INLINE void i8a_vsum_part_avx2(const float *w, const uint16_t *const *v, size_t n, size_t i,
                                   int nb, float *o)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int b = 0; b < nb; b++)
        acc[b] = _mm256_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        const __m256 wj = _mm256_set1_ps(w[j]);
#pragma GCC unroll 8
        for (int b = 0; b < nb; b++)
            acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(wj, i8a_halves8_avx2(v[j] + i + 8 * b)));
    }
#pragma GCC unroll 8
    for (int b = 0; b < nb; b++)
        _mm256_storeu_ps(o + i + 8 * b, acc[b]);
}

static void i8a_vsum_avx2(const float *w, const uint16_t *const *v, size_t n, size_t d, float *o)
{
    size_t i = 0;
    for (; i + 64 <= d; i += 64)
        i8a_vsum_part_avx2(w, v, n, i, 8, o);
    for (; i < d; i += 16)
        i8a_vsum_part_avx2(w, v, n, i, 2, o);
}

static void i8a_attend_float_avx2(const float *q, const i8a_float_rows *w, size_t d,
                                  float cap, float *logit, float *m, float *l, float *o)
{
    i8a_attend_float_body(q, w, d, cap, logit, m, l, o, i8a_dots4_avx2, i8a_exps_avx2,
                          i8a_vsum_avx2);
}

#endif
