/* window/avx512_vnni.h: the recent window's attention over rows of halves (attend_float): dots4,
 * exps, vsum; the avx512_vnni tier's, bit for bit window/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_WINDOW_AVX512_VNNI_H
#define I8A_WINDOW_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "window/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* The recent window's loops (window/scalar.h's order), halves widened by i8a_halves16 (above)
 * once for every head of the block: nh is a constant in each copy of the blocks
 * (I8A_WIN_BY_HEADS), so their loops unroll into registers (4 heads x 4 rows of sums). */

I8A_INLINE void i8a_dots4_block_avx512_vnni(size_t nh, const float *q, const uint16_t *const *k,
                                            size_t d, float *dot)
{
    __m512 a[I8A_WIN_HEADS][4];
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
        for (int b = 0; b < 4; b++)
            a[h][b] = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            kv[b] = i8a_halves16_avx512_vnni(k[b] + i);
#pragma GCC unroll 4
        for (size_t h = 0; h < nh; h++) {
            const __m512 qv = _mm512_loadu_ps(q + h * d + i);
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                a[h][b] = _mm512_add_ps(a[h][b], _mm512_mul_ps(qv, kv[b]));
        }
    }
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
        for (int b = 0; b < 4; b++)
            dot[h * 4 + b] = i8a_fold16_avx512_vnni(a[h][b]);
}

static void i8a_dots4_avx512_vnni(const float *q, size_t nh, const uint16_t *const *k, size_t d,
                                  float *dot)
{
    I8A_WIN_BY_HEADS(nh, i8a_dots4_block_avx512_vnni, q, k, d, dot);
}

static void i8a_exps_avx512_vnni(float *x, size_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    size_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(x + j, i8a_exp16_avx512_vnni(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm)));
    for (; j < n; j++)
        x[j] = i8a_exp_scalar(x[j] - m);
}

/* o[h][i .. i + 16 nb) of the V sum for the nh heads: nh x nb vectors, one chain each, side by
 * side; each vector of halves widened once for the heads. nh x nb <= 16. */
I8A_INLINE void i8a_vsum_part_avx512_vnni(const float *w, size_t nh, const uint16_t *const *v,
                                          size_t n, size_t d, size_t i, int nb, float *o)
{
    __m512 acc[I8A_WIN_HEADS][4];
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++)
            acc[h][b] = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++)
            vv[b] = i8a_halves16_avx512_vnni(v[j] + i + 16 * b);
#pragma GCC unroll 4
        for (size_t h = 0; h < nh; h++) {
            const __m512 wj = _mm512_set1_ps(w[h * n + j]);
#pragma GCC unroll 4
            for (int b = 0; b < nb; b++)
                acc[h][b] = _mm512_add_ps(acc[h][b], _mm512_mul_ps(wj, vv[b]));
        }
    }
#pragma GCC unroll 4
    for (size_t h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int b = 0; b < nb; b++)
            _mm512_storeu_ps(o + h * d + i + 16 * b, acc[h][b]);
}

I8A_INLINE void i8a_vsum_block_avx512_vnni(size_t nh, const float *w, const uint16_t *const *v,
                                           size_t n, size_t d, float *o)
{
    size_t i = 0;
    for (; i + 64 <= d; i += 64)
        i8a_vsum_part_avx512_vnni(w, nh, v, n, d, i, 4, o);
    for (; i < d; i += 16)
        i8a_vsum_part_avx512_vnni(w, nh, v, n, d, i, 1, o);
}

static void i8a_vsum_avx512_vnni(const float *w, size_t nh, const uint16_t *const *v, size_t n,
                                 size_t d, float *o)
{
    I8A_WIN_BY_HEADS(nh, i8a_vsum_block_avx512_vnni, w, v, n, d, o);
}

static void i8a_attend_float_avx512_vnni(const float *q, size_t nq, const i8a_float_rows *w,
                                         size_t d, float cap, float *logit, const i8a_state *out)
{
    i8a_attend_float_body(q, nq, w, d, cap, logit, out, i8a_dots4_avx512_vnni,
                          i8a_exps_avx512_vnni, i8a_vsum_avx512_vnni);
}

#endif
