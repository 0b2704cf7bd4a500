/* window/avx512_vnni.h: the recent window's attention over rows of halves (attend_float): dots4,
 * exps, vsum; the avx512_vnni tier's, bit for bit window/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_WINDOW_AVX512_VNNI_H
#define I8A_WINDOW_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "window/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* The recent window's two loops (window/scalar.h's order), halves widened by i8a_halves16 (above). */

static void i8a_dots4_avx512_vnni(const float *q, const uint16_t *const *k, size_t d, float *dot)
{
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (size_t i = 0; i < d; i += 16) {
        const __m512 qv = _mm512_loadu_ps(q + i);
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            a[b] = _mm512_add_ps(a[b], _mm512_mul_ps(qv, i8a_halves16_avx512_vnni(k[b] + i)));
    }
    for (int b = 0; b < 4; b++)
        dot[b] = i8a_fold16_avx512_vnni(a[b]);
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

/* o[i .. i + 16 nb) of the V sum: nb vectors, one chain each, side by side. */
I8A_INLINE void i8a_vsum_part_avx512_vnni(const float *w, const uint16_t *const *v, size_t n,
                                          size_t i, int nb, float *o)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int b = 0; b < nb; b++)
        acc[b] = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        const __m512 wj = _mm512_set1_ps(w[j]);
#pragma GCC unroll 8
        for (int b = 0; b < nb; b++)
            acc[b] = _mm512_add_ps(acc[b],
                                   _mm512_mul_ps(wj, i8a_halves16_avx512_vnni(v[j] + i + 16 * b)));
    }
#pragma GCC unroll 8
    for (int b = 0; b < nb; b++)
        _mm512_storeu_ps(o + i + 16 * b, acc[b]);
}

static void i8a_vsum_avx512_vnni(const float *w, const uint16_t *const *v, size_t n, size_t d,
                                 float *o)
{
    size_t i = 0;
    for (; i + 128 <= d; i += 128)
        i8a_vsum_part_avx512_vnni(w, v, n, i, 8, o);
    for (; i + 64 <= d; i += 64)
        i8a_vsum_part_avx512_vnni(w, v, n, i, 4, o);
    for (; i < d; i += 16)
        i8a_vsum_part_avx512_vnni(w, v, n, i, 1, o);
}

static void i8a_attend_float_avx512_vnni(const float *q, const i8a_float_rows *w, size_t d,
                                         float cap, float *logit, float *m, float *l, float *o)
{
    i8a_attend_float_body(q, w, d, cap, logit, m, l, o, i8a_dots4_avx512_vnni,
                          i8a_exps_avx512_vnni, i8a_vsum_avx512_vnni);
}

#endif
