/* The avx2 tier: x86-64 AVX2 + FMA (Haswell, Zen and later). Same operations as scalar.h in
 * the same order, eight lanes at a time.
 *
 * The int8 x int8 dot uses the sign trick: maddubs(|k|, q * sign(k)) multiplies u8 by s8 into
 * int16 pairs. |k| <= 127 and |q * sign(k)| <= 127 because -128 is never stored, so a pair is at
 * most 2 * 127 * 127 = 32258 and never saturates.
 *
 * Compiled at the baseline: the ISA is switched on for this header's functions only.
 */
#ifndef I8A_AVX2_H
#define I8A_AVX2_H

#include <immintrin.h>

#include "common.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

static inline float i8a_hmax8_avx2(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

static inline int32_t i8a_hsum8_epi32_avx2(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(x);
}

static int i8a_quantize_row_avx2(const float *x, size_t d, int8_t *codes, float *scale)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 vmax = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    size_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
        vmax = _mm256_max_ps(vmax, a);
    }
    float absmax = i8a_hmax8_avx2(vmax);
    int finite = _mm256_movemask_ps(ok) == 0xff;
    for (; i < d; i++) {
        float a = fabsf(x[i]);
        finite &= a <= FLT_MAX;
        absmax = a > absmax ? a : absmax;
    }
    if (!finite)
        return -1;
    float inv;
    if (!i8a_row_scales(absmax, scale, &inv)) {
        memset(codes, 0, d);
        return 0;
    }
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi8(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (i = 0; i + 32 <= d; i += 32) {
        /* cvtps rounds half to even under the default MXCSR, as rintf does */
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vinv));
        __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vinv));
        __m256i ab = _mm256_packs_epi32(a, b), ce = _mm256_packs_epi32(c, e);
        __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, ce), order);
        _mm256_storeu_si256((__m256i *)(codes + i), _mm256_max_epi8(q, lo));
    }
    for (; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

/* acc += the int32 pair sums of a . b over 32 bytes (sign trick). */
static inline __m256i i8a_dot32_avx2(__m256i acc, __m256i a, __m256i b)
{
    __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(b, b), _mm256_sign_epi8(a, b));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(prod, _mm256_set1_epi16(1)));
}

static inline __m128i i8a_dot16_avx2(__m128i acc, __m128i a, __m128i b)
{
    __m128i prod = _mm_maddubs_epi16(_mm_sign_epi8(b, b), _mm_sign_epi8(a, b));
    return _mm_add_epi32(acc, _mm_madd_epi16(prod, _mm_set1_epi16(1)));
}

/* Dots of two q planes with one k row, k loaded once. d a multiple of 16. */
static inline void i8a_dot2_avx2(const int8_t *qh, const int8_t *ql, const int8_t *k, size_t d,
                                 int two, int32_t *dh, int32_t *dl)
{
    __m256i ah = _mm256_setzero_si256(), al = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256i kk = _mm256_loadu_si256((const __m256i *)(k + i));
        ah = i8a_dot32_avx2(ah, _mm256_loadu_si256((const __m256i *)(qh + i)), kk);
        if (two)
            al = i8a_dot32_avx2(al, _mm256_loadu_si256((const __m256i *)(ql + i)), kk);
    }
    if (i < d) {
        __m128i kk = _mm_loadu_si128((const __m128i *)(k + i));
        __m128i th = i8a_dot16_avx2(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)(qh + i)), kk);
        ah = _mm256_add_epi32(ah, _mm256_zextsi128_si256(th));
        if (two) {
            __m128i tl = i8a_dot16_avx2(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)(ql + i)), kk);
            al = _mm256_add_epi32(al, _mm256_zextsi128_si256(tl));
        }
    }
    *dh = i8a_hsum8_epi32_avx2(ah);
    *dl = two ? i8a_hsum8_epi32_avx2(al) : 0;
}

static void i8a_dots_avx2(const int8_t *q, const int8_t *k, size_t n, size_t d, int32_t *out)
{
    int32_t unused;
    for (size_t s = 0; s < n; s++)
        i8a_dot2_avx2(q, q, k + s * d, d, 0, out + s, &unused);
}

/* exp of 8 lanes, the operations of i8a_exp_scalar. */
static inline __m256 i8a_exp8_avx2(__m256 x)
{
    const __m256 magic = _mm256_set1_ps(I8A_EXP_MAGIC);
    x = _mm256_max_ps(x, _mm256_set1_ps(I8A_EXP_LO));
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(I8A_LOG2E), magic), magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-I8A_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-I8A_LN2_LO), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(I8A_EXP_P0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(I8A_EXP_P5));
    y = _mm256_fmadd_ps(y, z, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_cvttps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

/* p[s] = exp(p[s] - m) for s < n (in place, padding to a multiple of 16 left as zeros);
 * returns the 16-lane sum of common.h. */
static inline float i8a_softmax_avx2(float *p, size_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        __m256 keep0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - s)), idx));
        __m256 keep1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - s) - 8), idx));
        __m256 p0 = _mm256_and_ps(keep0, i8a_exp8_avx2(_mm256_sub_ps(_mm256_load_ps(p + s), vm)));
        __m256 p1 = _mm256_and_ps(keep1, i8a_exp8_avx2(_mm256_sub_ps(_mm256_load_ps(p + s + 8), vm)));
        _mm256_store_ps(p + s, p0);
        _mm256_store_ps(p + s + 8, p1);
        s0 = _mm256_add_ps(s0, p0);
        s1 = _mm256_add_ps(s1, p1);
    }
    /* lanes i + 8, then i + 4, i + 2, i + 1: the halving order of i8a_reduce_lanes */
    __m256 t = _mm256_add_ps(s0, s1);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* o[0..d) = sum_s w[s] * v[s][.] in token order (fused), d a multiple of 16. */
static inline void i8a_accumulate_v_avx2(const float *w, const int8_t *v, size_t n, size_t d, float *o)
{
    size_t i = 0;
    for (; i + 64 <= d; i += 64) {
        __m256 a[8];
        for (int b = 0; b < 8; b++)
            a[b] = _mm256_setzero_ps();
        for (size_t s = 0; s < n; s++) {
            const int8_t *vr = v + s * d + i;
            __m256 ws = _mm256_set1_ps(w[s]);
            for (int b = 0; b < 8; b++) {
                __m256i v32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(vr + 8 * b)));
                a[b] = _mm256_fmadd_ps(ws, _mm256_cvtepi32_ps(v32), a[b]);
            }
        }
        for (int b = 0; b < 8; b++)
            _mm256_storeu_ps(o + i + 8 * b, a[b]);
    }
    for (; i < d; i += 16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (size_t s = 0; s < n; s++) {
            const int8_t *vr = v + s * d + i;
            __m256 ws = _mm256_set1_ps(w[s]);
            __m256i v0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)vr));
            __m256i v1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(vr + 8)));
            a0 = _mm256_fmadd_ps(ws, _mm256_cvtepi32_ps(v0), a0);
            a1 = _mm256_fmadd_ps(ws, _mm256_cvtepi32_ps(v1), a1);
        }
        _mm256_storeu_ps(o + i, a0);
        _mm256_storeu_ps(o + i + 8, a1);
    }
}

static void i8a_attend_avx2(const i8a_query *q, const i8a_span *kv, float *scratch,
                            const i8a_state *out)
{
    const size_t d = q->d, n = kv->n;
    for (size_t j = 0; j < q->nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m = 0.0f;
        for (size_t s = 0; s < n; s++) {
            int32_t dh, dl;
            i8a_dot2_avx2(q->q_hi + j * d, q->q_lo + j * d, kv->k + s * d, d, q->two_planes, &dh, &dl);
            float lg = i8a_logit(dh, dl, q->c_hi[j], q->c_lo[j], q->two_planes, kv->ks[s]);
            p[s] = lg;
            m = (s == 0 || lg > m) ? lg : m;
        }
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->l[j] = i8a_softmax_avx2(p, n, m);
        out->m[j] = m;
        for (size_t s = 0; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_accumulate_v_avx2(p, kv->v, n, d, out->o + j * d);
    }
}

static void i8a_merge_avx2(const i8a_state *run, const i8a_state *chunk, size_t nq, size_t d)
{
    for (size_t j = 0; j < nq; j++) {
        float a, b;
        i8a_merge_head(run, chunk, j, &a, &b);
        float *ro = run->o + j * d;
        const float *co = chunk->o + j * d;
        const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
        for (size_t i = 0; i < d; i += 8) {
            __m256 r = _mm256_mul_ps(_mm256_loadu_ps(ro + i), va);
            _mm256_storeu_ps(ro + i, _mm256_fmadd_ps(_mm256_loadu_ps(co + i), vb, r));
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
