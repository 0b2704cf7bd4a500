/* window/avx2.h: the recent window's attention over rows of halves (attend_float): dots4, exps,
 * vsum; the avx2 tier's, bit for bit window/scalar.h's rule. Included only by ../avx2.h, inside
 * the tier's target region: its pragma applies to every function here. */
#ifndef I8A_WINDOW_AVX2_H
#define I8A_WINDOW_AVX2_H

#ifndef I8A_AVX2_H
#error "window/avx2.h is included by ../avx2.h only"
#endif

/* The recent window's loops (window/scalar.h's order), halves widened by i8a_halves8 (above)
 * once for every two heads (the dots) or for the block (the V sum); a lane sum of 16 is two
 * vectors, lanes 0-7 and 8-15, and the dots take the two halves of the lanes one after the
 * other (each lane's order is kept), so that 2 heads x 4 rows of sums fit the 16 registers. nh
 * is a constant in each copy of the blocks (I8A_WIN_BY_HEADS for the V sum). */

I8A_INLINE void i8a_dots4_block_avx2(size_t nh, const float *q, const uint16_t *const *k,
                                     size_t d, float *dot)
{
    __m256 part[2][4][2];                                   /* [head][row][lane half] */
    for (int half = 0; half < 2; half++) {
        __m256 a[2][4];
#pragma GCC unroll 2
        for (size_t h = 0; h < nh; h++)
            for (int b = 0; b < 4; b++)
                a[h][b] = _mm256_setzero_ps();
        for (size_t i = 8 * (size_t)half; i < d; i += 16) {
            __m256 kv[4];
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                kv[b] = i8a_halves8_avx2(k[b] + i);
#pragma GCC unroll 2
            for (size_t h = 0; h < nh; h++) {
                const __m256 qv = _mm256_loadu_ps(q + h * d + i);
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++)
                    a[h][b] = _mm256_add_ps(a[h][b], _mm256_mul_ps(qv, kv[b]));
            }
        }
#pragma GCC unroll 2
        for (size_t h = 0; h < nh; h++)
            for (int b = 0; b < 4; b++)
                part[h][b][half] = a[h][b];
    }
    for (size_t h = 0; h < nh; h++)
        for (int b = 0; b < 4; b++)
            dot[h * 4 + b] = i8a_fold16_avx2(part[h][b][0], part[h][b][1]);
}

static void i8a_dots4_avx2(const float *q, size_t nh, const uint16_t *const *k, size_t d,
                           float *dot)
{
    for (size_t h = 0; h < nh; h += 2) {
        if (nh - h >= 2)
            i8a_dots4_block_avx2(2, q + h * d, k, d, dot + h * 4);
        else
            i8a_dots4_block_avx2(1, q + h * d, k, d, dot + h * 4);
    }
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

/* o[h][i .. i + 8 nb) of the V sum for the nh heads: nh x nb vectors, one chain each, side by
 * side; each vector of halves widened once for the heads. nh x nb <= 8. */
I8A_INLINE void i8a_vsum_part_avx2(const float *w, size_t nh, const uint16_t *const *v, size_t n,
                                   size_t d, size_t i, int nb, float *o)
{
    __m256 acc[I8A_WIN_HEADS][2];
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++)
            acc[h][b] = _mm256_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        __m256 vv[2];
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++)
            vv[b] = i8a_halves8_avx2(v[j] + i + 8 * b);
#pragma GCC unroll 4
        for (size_t h = 0; h < nh; h++) {
            const __m256 wj = _mm256_set1_ps(w[h * n + j]);
#pragma GCC unroll 2
            for (int b = 0; b < nb; b++)
                acc[h][b] = _mm256_add_ps(acc[h][b], _mm256_mul_ps(wj, vv[b]));
        }
    }
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++)
            _mm256_storeu_ps(o + h * d + i + 8 * b, acc[h][b]);
}

I8A_INLINE void i8a_vsum_block_avx2(size_t nh, const float *w, const uint16_t *const *v,
                                    size_t n, size_t d, float *o)
{
    for (size_t i = 0; i < d; i += 16)
        i8a_vsum_part_avx2(w, nh, v, n, d, i, 2, o);
}

static void i8a_vsum_avx2(const float *w, size_t nh, const uint16_t *const *v, size_t n,
                          size_t d, float *o)
{
    I8A_WIN_BY_HEADS(nh, i8a_vsum_block_avx2, w, v, n, d, o);
}

static void i8a_attend_float_avx2(const float *q, size_t nq, const i8a_float_rows *w, size_t d,
                                  float cap, float *logit, const i8a_state *out)
{
    i8a_attend_float_body(q, nq, w, d, cap, logit, out, i8a_dots4_avx2, i8a_exps_avx2,
                          i8a_vsum_avx2);
}

#endif
