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
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
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
    float inv;
    const int todo = i8a_row_prepare(x, i, d, absmax, finite, codes, scale, &inv);
    if (todo <= 0)
        return todo;
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

/* The exp's polynomial on 8 lanes, the operations of i8a_exp_poly_scalar. */
static inline __m256 i8a_exp_poly8_avx2(__m256 x, __m256 *n_out)
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
    *n_out = n;
    return _mm256_fmadd_ps(y, z, r);
}

/* y * 2^n on 8 lanes (i8a_scale2n_scalar). */
static inline __m256 i8a_scale2n8_avx2(__m256 y, __m256 n)
{
    __m256i e = _mm256_slli_epi32(_mm256_cvttps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

/* exp of 8 lanes, the operations of i8a_exp_scalar. */
static inline __m256 i8a_exp8_avx2(__m256 x)
{
    __m256 n;
    const __m256 y = i8a_exp_poly8_avx2(x, &n);
    return i8a_scale2n8_avx2(_mm256_add_ps(y, _mm256_set1_ps(1.0f)), n);
}

/* expm1 of 8 lanes, the operations of i8a_expm1_scalar. */
static inline __m256 i8a_expm1_8_avx2(__m256 x)
{
    __m256 n;
    const __m256 y = i8a_exp_poly8_avx2(x, &n), one = _mm256_set1_ps(1.0f);
    const __m256 big = _mm256_sub_ps(i8a_scale2n8_avx2(_mm256_add_ps(y, one), n), one);
    return _mm256_blendv_ps(big, y, _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_EQ_OQ));
}

/* i8a_softcap on 8 lanes (t >= +0, so the sign of u is or-ed in). */
static inline __m256 i8a_softcap8_avx2(__m256 l, float cap, float inv_cap)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 u = _mm256_mul_ps(l, _mm256_set1_ps(inv_cap));
    const __m256 m = i8a_expm1_8_avx2(_mm256_mul_ps(_mm256_andnot_ps(sign, u), _mm256_set1_ps(-2.0f)));
    const __m256 t = _mm256_div_ps(_mm256_andnot_ps(sign, m), _mm256_add_ps(_mm256_set1_ps(2.0f), m));
    return _mm256_mul_ps(_mm256_set1_ps(cap), _mm256_or_ps(t, _mm256_and_ps(u, sign)));
}

/* The 16 lane sums of (lo: lanes 0-7, hi: lanes 8-15) folded into one: lanes i + 8, then
 * i + 4, i + 2, i + 1 (the halving order of i8a_reduce_lanes). */
static inline float i8a_fold16_avx2(__m256 lo, __m256 hi)
{
    const __m256 t = _mm256_add_ps(lo, hi);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* Eight halves widened by F16C (exact). */
static inline __m256 i8a_halves8_avx2(const uint16_t *h)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
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
    return i8a_fold16_avx2(s0, s1);
}

/* Four row sums of four int32 accumulators: lane r of the result is the sum of acc r. */
static inline __m128i i8a_reduce4_avx2(__m256i a0, __m256i a1, __m256i a2, __m256i a3)
{
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* acc += the int32 pair sums of q . k over 16 bytes, in the low 128 bits. */
static inline __m256i i8a_dot16x_avx2(__m256i acc, const int8_t *q, const int8_t *k)
{
    __m128i kk = _mm_loadu_si128((const __m128i *)k);
    __m128i t = i8a_dot16_avx2(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)q), kk);
    return _mm256_add_epi32(acc, _mm256_zextsi128_si256(t));
}

/* Exact dots of every query head's planes with rows [0, n) of the chunk, four rows at a time:
 * dh[j * I8A_CHUNK + s], dl[...] (dl only with two planes). The k rows of a group stay in L1
 * while each head of the group passes over them. */
static inline void i8a_kdots_avx2(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        if (s < kv->next_n) /* the next chunk's K, one group of rows per group */
            i8a_prefetch_rows(kv->next_k + s * d, (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
        const int8_t *k = kv->k + s * d;
        for (size_t j = 0; j < q->nq; j++) {
            const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
            __m256i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            size_t i = 0;
            for (; i + 32 <= d; i += 32) {
                __m256i a = _mm256_loadu_si256((const __m256i *)(qh + i));
                h0 = i8a_dot32_avx2(h0, a, _mm256_loadu_si256((const __m256i *)(k + i)));
                h1 = i8a_dot32_avx2(h1, a, _mm256_loadu_si256((const __m256i *)(k + d + i)));
                h2 = i8a_dot32_avx2(h2, a, _mm256_loadu_si256((const __m256i *)(k + 2 * d + i)));
                h3 = i8a_dot32_avx2(h3, a, _mm256_loadu_si256((const __m256i *)(k + 3 * d + i)));
                if (two) {
                    __m256i b = _mm256_loadu_si256((const __m256i *)(ql + i));
                    l0 = i8a_dot32_avx2(l0, b, _mm256_loadu_si256((const __m256i *)(k + i)));
                    l1 = i8a_dot32_avx2(l1, b, _mm256_loadu_si256((const __m256i *)(k + d + i)));
                    l2 = i8a_dot32_avx2(l2, b, _mm256_loadu_si256((const __m256i *)(k + 2 * d + i)));
                    l3 = i8a_dot32_avx2(l3, b, _mm256_loadu_si256((const __m256i *)(k + 3 * d + i)));
                }
            }
            if (i < d) {
                h0 = i8a_dot16x_avx2(h0, qh + i, k + i);
                h1 = i8a_dot16x_avx2(h1, qh + i, k + d + i);
                h2 = i8a_dot16x_avx2(h2, qh + i, k + 2 * d + i);
                h3 = i8a_dot16x_avx2(h3, qh + i, k + 3 * d + i);
                if (two) {
                    l0 = i8a_dot16x_avx2(l0, ql + i, k + i);
                    l1 = i8a_dot16x_avx2(l1, ql + i, k + d + i);
                    l2 = i8a_dot16x_avx2(l2, ql + i, k + 2 * d + i);
                    l3 = i8a_dot16x_avx2(l3, ql + i, k + 3 * d + i);
                }
            }
            _mm_store_si128((__m128i *)(dh + j * I8A_CHUNK + s), i8a_reduce4_avx2(h0, h1, h2, h3));
            if (two)
                _mm_store_si128((__m128i *)(dl + j * I8A_CHUNK + s), i8a_reduce4_avx2(l0, l1, l2, l3));
        }
    }
    for (; s < n; s++)
        for (size_t j = 0; j < q->nq; j++)
            i8a_dot2_avx2(q->q_hi + j * d, q->q_lo + j * d, kv->k + s * d, d, two,
                          dh + j * I8A_CHUNK + s, dl + j * I8A_CHUNK + s);
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, eight at a time; returns max_s p[s]. */
static inline float i8a_logits_avx2(const int32_t *dh, const int32_t *dl, float c_hi, float c_lo,
                                    int two, float bias, float cap, float inv_cap, const float *ks,
                                    size_t n, float *p)
{
    const __m256 ch = _mm256_set1_ps(c_hi), cl = _mm256_set1_ps(c_lo), vb = _mm256_set1_ps(bias);
    __m256 vmax = _mm256_set1_ps(-FLT_MAX);
    size_t s = 0;
    for (; s + 8 <= n; s += 8) {
        __m256 lg = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(dh + s))), ch);
        if (two)
            lg = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(dl + s))), cl, lg);
        lg = _mm256_add_ps(_mm256_mul_ps(lg, _mm256_loadu_ps(ks + s)), vb);
        if (cap > 0.0f)
            lg = i8a_softcap8_avx2(lg, cap, inv_cap);
        _mm256_store_ps(p + s, lg);
        vmax = _mm256_max_ps(vmax, lg);
    }
    float m = i8a_hmax8_avx2(vmax);
    for (; s < n; s++) {
        p[s] = i8a_logit_capped(dh[s], two ? dl[s] : 0, c_hi, c_lo, two, ks[s], bias, cap, inv_cap);
        m = p[s] > m ? p[s] : m;
    }
    return m;
}

/* A head's P planes from its weights w [round16(n)] (zeros past n; common.h's rule, 16 weights
 * at a time: floor, clamps and residuals on floats, each residual by one fused step, the last
 * plane's rint by vcvtps2dq under the default MXCSR, clamped as integers, packed to bytes: the
 * bytes of i8a_planes_scalar). */
static inline void i8a_planes_avx2(const float *w, size_t n, size_t lead, uint8_t *slot)
{
    __m256 most = _mm256_setzero_ps();
    for (size_t s = 0; s < n; s += 8)
        most = _mm256_max_ps(most, _mm256_load_ps(w + s));     /* the padding's zeros too */
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    const float lift = i8a_weight_scales(i8a_hmax8_avx2(most), sc, inv);
    const __m256 lift_f = _mm256_set1_ps(lift);
    const __m256 zero_f = _mm256_setzero_ps(), most_f = _mm256_set1_ps(127.0f);
    const __m256i zero = _mm256_setzero_si256(), most_i = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t s = 0; s < n; s += 16) {
        __m256i b[I8A_WPLANES][2];
        for (int u = 0; u < 2; u++) {
            __m256 r = _mm256_mul_ps(_mm256_load_ps(w + s + 8 * u), lift_f);
            for (int k = 0; k < I8A_WPLANES - 1; k++) {
                __m256 x = _mm256_floor_ps(_mm256_mul_ps(r, _mm256_set1_ps(inv[k])));
                x = _mm256_min_ps(_mm256_max_ps(x, zero_f), most_f);
                r = _mm256_fnmadd_ps(x, _mm256_set1_ps(sc[k]), r);
                b[k][u] = _mm256_cvttps_epi32(x);
            }
            const __m256i l = _mm256_cvtps_epi32(_mm256_mul_ps(r, _mm256_set1_ps(inv[I8A_WPLANES - 1])));
            b[I8A_WPLANES - 1][u] = _mm256_min_epi32(_mm256_max_epi32(l, zero), most_i);
        }
        /* packs: [a0-3 b0-3 | a4-7 b4-7] as 16 bits, then bytes (twice); words 0 4 1 5 */
        for (int k = 0; k < I8A_WPLANES; k++) {
            const __m256i pk = _mm256_packus_epi16(_mm256_packs_epi32(b[k][0], b[k][1]), zero);
            _mm_storeu_si128((__m128i *)(slot + k * I8A_PLANE_BYTES + lead + s),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pk, order)));
        }
    }
    i8a_planes_frame(slot, lead, n, sc, lift);
}

/* One plane byte group (4 positions of a tile) of a head, broadcast to every 32-bit lane. */
static inline __m256i i8a_pword_avx2(const uint8_t *plane, size_t t)
{
    int32_t x;
    memcpy(&x, plane + I8A_V_TILE * t, sizeof x);
    return _mm256_set1_epi32(x);
}

/* acc += for each dimension (32-bit lane) the sum of the tile's 4 products: vpmaddubsw adds
 * two products (unsigned P by signed V, at most 2 * 127 * 127: no saturation), vpmaddwd
 * the two pairs. */
static inline __m256i i8a_vdot_avx2(__m256i acc, __m256i p, __m256i x)
{
    const __m256i pairs = _mm256_maddubs_epi16(p, x);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* The integer V pass (common.h) of NH heads over dims [i0, i0 + 8 nv), as the avx512_vnni
 * tier's, 8 dims a vector. NH and NV are constants at every call. */
I8A_INLINE void
i8a_vtiles_block_avx2(const uint8_t *const *planes, int nh, int nv, const int8_t *v,
                      size_t tiles, size_t d, size_t i0, float *o, const int8_t *pf, size_t pf_n)
{
    __m256i acc[2][I8A_WPLANES][2];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 8
            for (int b = 0; b < nv; b++)
                acc[h][k][b] = _mm256_setzero_si256();
    for (size_t t = 0; t < tiles; t++) {
        if (I8A_V_TILE * t < pf_n)
            i8a_prefetch_rows(pf + I8A_V_TILE * t * d, I8A_V_TILE * d);
        const int8_t *x = v + (t * d + i0) * I8A_V_TILE;
#pragma GCC unroll 8
        for (int b = 0; b < nv; b++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * b));
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                for (int k = 0; k < I8A_WPLANES; k++)
                    acc[h][k][b] = i8a_vdot_avx2(
                        acc[h][k][b], i8a_pword_avx2(planes[h] + k * I8A_PLANE_BYTES, t), xv);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int b = 0; b < nv; b++) {
            __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][0][b]), _mm256_set1_ps(sc[0]));
#pragma GCC unroll 8
            for (int k = 1; k < I8A_WPLANES; k++)
                y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][k][b]), _mm256_set1_ps(sc[k]), y);
            _mm256_storeu_ps(o + h * d + i0 + 8 * b, y);
        }
    }
}

/* The V pass of heads [j, j + NH), NH at most 2: blocks as wide as the 16 registers allow (3 NH
 * NV accumulators), then single vectors for the rest of d (a multiple of 16). */
I8A_INLINE void i8a_vtiles_group_avx2(float *scratch, size_t nq, size_t j, int nh,
                                      const i8a_span *kv, size_t d, float *o, size_t pf_n)
{
    const uint8_t *planes[2];
    for (int h = 0; h < nh; h++)
        planes[h] = i8a_planes_at(scratch, nq, j + (size_t)h);
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const int nv = nh == 1 ? 2 : 1;
    for (size_t i = 0; i < d; i += 8 * (size_t)nv, pf_n = 0)
        i8a_vtiles_block_avx2(planes, nh, nv, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
}

static void i8a_attend_avx2(const i8a_query *q, const i8a_span *kv, float *scratch,
                            const i8a_state *out)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    /* dh lives in the second half of the scratch, dl in the first: head j's logits then
     * overwrite its own dl element by element, each read before it is written, and its
     * planes its dh. */
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    i8a_kdots_avx2(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = i8a_logits_avx2(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                        q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                        q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->m[j] = m;
        out->l[j] = i8a_softmax_avx2(p, n, m);
        size_t s = 0;
        for (; s + 8 <= n; s += 8)
            _mm256_store_ps(p + s, _mm256_mul_ps(_mm256_load_ps(p + s), _mm256_loadu_ps(kv->vs + s)));
        for (; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_avx2(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
    }
    size_t j = 0, pf_n = kv->next_n;   /* the first group prefetches the next chunk's V */
    for (; j + 2 <= nq; j += 2, pf_n = 0)
        i8a_vtiles_group_avx2(scratch, nq, j, 2, kv, d, out->o, pf_n);
    if (j < nq)
        i8a_vtiles_group_avx2(scratch, nq, j, 1, kv, d, out->o, pf_n);
}

/* -- attend4: the sides at 4 bits (dispatch.h) ------------------------------------------- */

/* common.h's i8a_k4_query on 8 lanes: the steps and minima widened by F16C (exact), the planes'
 * bytes by vcvtps2dq (nearest even under the default MXCSR) clamped as integers, the bias in
 * dot16's order (two vectors of the sixteen lanes, folded). */
static inline void i8a_k4_query_avx2(const float *qs, const uint16_t *h_min, float min_scale,
                                     const uint16_t *h_step, float step_scale, size_t d,
                                     int planes, int8_t *q, float *c, float *bias, float *r)
{
    const __m256 ss = _mm256_set1_ps(step_scale);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, most = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t i = 0; i < d; i += 16) {
        for (int b = 0; b < 2; b++) {
            const __m256 x = _mm256_loadu_ps(qs + i + 8 * b);
            const __m256 y = _mm256_mul_ps(x, _mm256_mul_ps(i8a_halves8_avx2(h_step + i + 8 * b), ss));
            _mm256_storeu_ps(r + i + 8 * b, y);
            most = _mm256_max_ps(most, _mm256_andnot_ps(sign, y));
            acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(x, i8a_halves8_avx2(h_min + i + 8 * b)));
        }
    }
    float inv[I8A_K4_QPLANES];
    i8a_k4_scales(i8a_hmax8_avx2(most), planes, c, inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t i = 0; i < d; i += 16) {
        __m256 x[2] = {_mm256_loadu_ps(r + i), _mm256_loadu_ps(r + i + 8)};
        for (int k = 0; k < planes; k++) {
            __m256i b[2];
            for (int u = 0; u < 2; u++) {
                b[u] = _mm256_cvtps_epi32(_mm256_mul_ps(x[u], _mm256_set1_ps(inv[k])));
                b[u] = _mm256_min_epi32(_mm256_max_epi32(b[u], lo), hi);
                x[u] = _mm256_sub_ps(x[u], _mm256_mul_ps(_mm256_cvtepi32_ps(b[u]), _mm256_set1_ps(c[k])));
            }
            /* packs: [a0-3 b0-3 | a4-7 b4-7] as 16 bits, then bytes; words 0 4 1 5 */
            const __m256i pk = _mm256_packs_epi16(_mm256_packs_epi32(b[0], b[1]), _mm256_setzero_si256());
            _mm_storeu_si128((__m128i *)(q + (size_t)k * I8A_MAX_HEAD_DIM + i),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pk, order)));
        }
    }
    *bias = i8a_fold16_avx2(acc[0], acc[1]) * min_scale;
}

/* The int16 pair sums of 32 codes (unsigned, 0 .. 15) and 32 plane bytes (signed): vpmaddubsw,
 * at most 2 * 15 * 127 a pair. */
static inline __m256i i8a_pairs4_avx2(__m256i codes, const int8_t *q)
{
    return _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)q));
}

/* Exact dots of NP q planes ([NP][I8A_MAX_HEAD_DIM], natural order) with rows [0, n) of K at 4
 * bits, four rows and one plane at a time: a row's 32 bytes (two blocks) unpack to the low
 * nibbles, channels 32 b + i, and the high ones, 32 b + 16 + i, matched by the plane's bytes
 * in that order (lo, hi: [NP][I8A_MAX_HEAD_DIM / 2], i8a_k4_order); the int16 pair sums of up
 * to 128 bytes of a row (8 of them: at most 8 * 3810 < 2^15) add before vpmaddwd widens them:
 * dot[k * I8A_K4_GROUP + s]. */
I8A_INLINE void i8a_k4dots_avx2(const uint8_t *k4, size_t n, size_t d, const int8_t *lo,
                                const int8_t *hi, int np, int32_t *dot)
{
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const size_t bytes = d / 2;
    for (int k = 0; k < np; k++) {
        const int8_t *ql = lo + (size_t)k * (I8A_MAX_HEAD_DIM / 2), *qh = hi + (size_t)k * (I8A_MAX_HEAD_DIM / 2);
        for (size_t s = 0; s < n; s += 4) {
            const uint8_t *r[4];
            for (int u = 0; u < 4; u++)
                r[u] = k4 + (s + (size_t)u < n ? s + (size_t)u : n - 1) * bytes;
            __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                              _mm256_setzero_si256(), _mm256_setzero_si256()};
            for (size_t j0 = 0; j0 < bytes; j0 += 128) {
                const size_t j1 = j0 + 128 < bytes ? j0 + 128 : bytes;
                __m256i p16[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                  _mm256_setzero_si256(), _mm256_setzero_si256()};
                for (size_t j = j0; j < j1; j += 32) {
                    const int half = j + 32 > bytes;    /* a last 16 bytes: zeros past the row */
#pragma GCC unroll 4
                    for (int u = 0; u < 4; u++) {
                        const __m256i x = half ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(r[u] + j)))
                                               : _mm256_loadu_si256((const __m256i *)(r[u] + j));
                        const __m256i cl = _mm256_and_si256(x, nib);
                        const __m256i ch = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
                        p16[u] = _mm256_add_epi16(p16[u], _mm256_add_epi16(i8a_pairs4_avx2(cl, ql + j),
                                                                           i8a_pairs4_avx2(ch, qh + j)));
                    }
                }
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    acc[u] = _mm256_add_epi32(acc[u], _mm256_madd_epi16(p16[u], ones));
            }
            int32_t four[4];
            _mm_storeu_si128((__m128i *)four, i8a_reduce4_avx2(acc[0], acc[1], acc[2], acc[3]));
            for (size_t u = 0; u < 4 && s + u < n; u++)
                dot[(size_t)k * I8A_K4_GROUP + s + u] = four[u];
        }
    }
}

/* A K group's planes in the order of 32-byte code vectors (two blocks: low nibbles of both,
 * then high). */
static inline void i8a_k4_order_avx2(const int8_t *q, size_t d, int8_t *lo, int8_t *hi)
{
    for (size_t b = 0; b < d / I8A_NIB_BLOCK; b++) {
        memcpy(lo + 16 * b, q + I8A_NIB_BLOCK * b, 16);
        memcpy(hi + 16 * b, q + I8A_NIB_BLOCK * b + 16, 16);
    }
}

/* p [n] = i8a_logit4 of NP plane dots, eight at a time (the rest one by one); returns their
 * max (-FLT_MAX for none). */
static inline float i8a_logits4_avx2(const int32_t *dot, const float *c, int np, float bias,
                                     float cap, float inv_cap, size_t n, float *p)
{
    __m256 vmax = _mm256_set1_ps(-FLT_MAX);
    size_t s = 0;
    for (; s + 8 <= n; s += 8) {
        __m256 lg = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(dot + s))),
                                  _mm256_set1_ps(c[0]));
        for (int k = 1; k < np; k++)
            lg = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(dot + (size_t)k * I8A_K4_GROUP + s))),
                                 _mm256_set1_ps(c[k]), lg);
        lg = _mm256_add_ps(lg, _mm256_set1_ps(bias));
        if (cap > 0.0f)
            lg = i8a_softcap8_avx2(lg, cap, inv_cap);
        _mm256_storeu_ps(p + s, lg);
        vmax = _mm256_max_ps(vmax, lg);
    }
    float m = i8a_hmax8_avx2(vmax);
    for (; s < n; s++) {
        int32_t one[I8A_K4_QPLANES];
        for (int k = 0; k < np; k++)
            one[k] = dot[(size_t)k * I8A_K4_GROUP + s];
        p[s] = i8a_logit4(one, c, np, bias, cap, inv_cap);
        m = p[s] > m ? p[s] : m;
    }
    return m;
}

/* The logits of query head j against the span's K rows at 4 bits, group by group; returns
 * their max. extra: I8A_ATTEND4_EXTRA bytes. */
I8A_INLINE float i8a_k4_logits_avx2(const i8a_query *q, const i8a_span *kv, size_t j, float *p,
                                    uint8_t *extra, int np)
{
    const size_t d = q->d, n = kv->n, half = I8A_MAX_HEAD_DIM / 2;
    int8_t *planes = (int8_t *)extra, *lo = planes + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM;
    int8_t *hi = lo + I8A_K4_QPLANES * half;
    float *r = (float *)(hi + I8A_K4_QPLANES * half);
    int32_t *dot = (int32_t *)(r + I8A_MAX_HEAD_DIM);
    float m = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query_avx2(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                          kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c, &bias, r);
        for (int k = 0; k < np; k++)
            i8a_k4_order_avx2(planes + k * I8A_MAX_HEAD_DIM, d, lo + k * half, hi + k * half);
        if (j == 0 && s < kv->next_n)   /* the next chunk's K, a group's rows at a time */
            i8a_prefetch_rows(kv->next_k + s * (d / 2), (kv->next_n - s < rows ? kv->next_n - s : rows) * (d / 2));
        i8a_k4dots_avx2(kv->k4 + s * (d / 2), rows, d, lo, hi, np, dot);
        const float gm = i8a_logits4_avx2(dot, c, np, bias, q->softcap, q->inv_softcap, rows, p + s);
        m = gm > m ? gm : m;
        s += rows;
    }
    return m;
}

/* The 16-lane sum (common.h's order) of p[s] * vmin[s] for s < n: V's minima at 4 bits. */
static inline float i8a_vmin_sum_avx2(const float *p, const float *vmin, size_t n)
{
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    size_t s = 0;
    for (; s + 8 <= n; s += 8)
        acc[s / 8 % 2] = _mm256_add_ps(acc[s / 8 % 2], _mm256_mul_ps(_mm256_loadu_ps(p + s), _mm256_loadu_ps(vmin + s)));
    float lane[I8A_SUM_LANES];
    _mm256_storeu_ps(lane, acc[0]);
    _mm256_storeu_ps(lane + 8, acc[1]);
    for (; s < n; s++)
        lane[s % I8A_SUM_LANES] = lane[s % I8A_SUM_LANES] + p[s] * vmin[s];
    return i8a_reduce_lanes(lane);
}

/* The integer V pass at 4 bits of NH heads (1 or 2) over one 32-byte half (e) of a tile's
 * 32-dimension block b: it unpacks to dimensions 32 b + 8 e .. + 7 (low nibbles) and 32 b + 16
 * + 8 e .. + 7 (high ones) in the int8 tile's layout; i8a_vdot_avx2 per plane and head; then
 * o = i8a_v_out(S) + the head's vmin sum. The tiles of pf_n rows of pf (the next chunk's V)
 * are prefetched. NH is a constant at every call. */
I8A_INLINE void i8a_v4tiles_block_avx2(const uint8_t *const *planes, const float *vmin, int nh,
                                       const uint8_t *v4, size_t tiles, size_t d, size_t b,
                                       size_t e, float *o, const int8_t *pf, size_t pf_n)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i acc[2][I8A_WPLANES][2];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < I8A_WPLANES; k++)
            acc[h][k][0] = acc[h][k][1] = _mm256_setzero_si256();
    for (size_t t = 0; t < tiles; t++) {
        if (I8A_V_TILE * t < pf_n)              /* the next chunk's V, a tile at a time */
            i8a_prefetch_rows(pf + t * 2 * d, 2 * d);
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(v4 + t * 2 * d + 64 * b + 32 * e));
        const __m256i x[2] = {_mm256_and_si256(raw, nib), _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib)};
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES; k++) {
                const __m256i pw = i8a_pword_avx2(planes[h] + k * I8A_PLANE_BYTES, t);
                acc[h][k][0] = i8a_vdot_avx2(acc[h][k][0], pw, x[0]);
                acc[h][k][1] = i8a_vdot_avx2(acc[h][k][1], pw, x[1]);
            }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
        for (int f = 0; f < 2; f++) {
            __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][0][f]), _mm256_set1_ps(sc[0]));
            for (int k = 1; k < I8A_WPLANES; k++)
                y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][k][f]), _mm256_set1_ps(sc[k]), y);
            _mm256_storeu_ps(o + h * d + I8A_NIB_BLOCK * b + 8 * e + 16 * (size_t)f,
                             _mm256_add_ps(y, _mm256_set1_ps(vmin[h])));
        }
    }
}

/* The V pass at 4 bits over the nq heads of a chunk: pairs of heads, then a head left alone,
 * each a half block (16 dimensions) at a time. */
static inline void i8a_v4pass_avx2(float *scratch, size_t nq, const i8a_span *kv, size_t d, float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n), blocks = d / I8A_NIB_BLOCK;
    size_t j = 0, pf_n = kv->next_n;   /* the first block prefetches the next chunk's V */
    for (; j < nq; j += 2) {
        const int nh = j + 2 <= nq ? 2 : 1;
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j),
                                    i8a_planes_at(scratch, nq, j + (size_t)nh - 1)};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j),
                               *i8a_vmin_sum_at(scratch, nq, j + (size_t)nh - 1)};
        for (size_t b = 0; b < blocks; b++)
            for (size_t e = 0; e < 2; e++, pf_n = 0) {
                if (nh == 2)
                    i8a_v4tiles_block_avx2(planes, vmin, 2, kv->v4, tiles, d, b, e, o + j * d,
                                           kv->next_v, pf_n);
                else
                    i8a_v4tiles_block_avx2(planes, vmin, 1, kv->v4, tiles, d, b, e, o + j * d,
                                           kv->next_v, pf_n);
            }
    }
}

/* attend4 (dispatch.h) in attend's order: K at 8 bits by attend's dots, at 4 bits group by
 * group; the softmax, V's minima, the planes; the V pass of the side's width. */
I8A_INLINE void i8a_attend4_body_avx2(const i8a_query *q, const i8a_span *kv, float *scratch,
                                      const i8a_state *out, const int k4, const int v4)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    if (!k4)
        i8a_kdots_avx2(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m;
        if (!k4)
            m = i8a_logits_avx2(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes, q->bias[j],
                                q->softcap, q->inv_softcap, kv->ks, n, p);
        else if (q->two_planes)
            m = i8a_k4_logits_avx2(q, kv, j, p, extra, I8A_K4_QPLANES);
        else
            m = i8a_k4_logits_avx2(q, kv, j, p, extra, 1);
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->m[j] = m;
        out->l[j] = i8a_softmax_avx2(p, n, m);
        if (v4)
            *i8a_vmin_sum_at(scratch, nq, j) = i8a_vmin_sum_avx2(p, kv->v4_min, n);
        size_t s = 0;
        for (; s + 8 <= n; s += 8)
            _mm256_store_ps(p + s, _mm256_mul_ps(_mm256_load_ps(p + s), _mm256_loadu_ps(kv->vs + s)));
        for (; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_avx2(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
    }
    if (v4) {
        i8a_v4pass_avx2(scratch, nq, kv, d, out->o);
        return;
    }
    size_t j = 0, pf_n = kv->next_n;
    for (; j + 2 <= nq; j += 2, pf_n = 0)
        i8a_vtiles_group_avx2(scratch, nq, j, 2, kv, d, out->o, pf_n);
    if (j < nq)
        i8a_vtiles_group_avx2(scratch, nq, j, 1, kv, d, out->o, pf_n);
}

/* The three entries of attend[k][v] with a side at 4 bits: the body above, its flags constant. */
static void i8a_attend_k8v4_avx2(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_body_avx2(q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_avx2(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_body_avx2(q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_avx2(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_body_avx2(q, kv, scratch, out, 1, 1);
}

static void i8a_merge_avx2(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    for (size_t i = 0; i < d; i += 8) {
        __m256 r = _mm256_mul_ps(_mm256_loadu_ps(ro + i), va);
        _mm256_storeu_ps(ro + i, _mm256_fmadd_ps(_mm256_loadu_ps(co + i), vb, r));
    }
}

static uint64_t i8a_stream_avx2(const void *p, size_t bytes, const void *next)
{
    const unsigned char *b = (const unsigned char *)p;
    __m256i x0 = _mm256_setzero_si256(), x1 = x0, x2 = x0, x3 = x0;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        if (next)
            i8a_prefetch_rows((const char *)next + i, 128);
        x0 = _mm256_xor_si256(x0, _mm256_loadu_si256((const __m256i *)(b + i)));
        x1 = _mm256_xor_si256(x1, _mm256_loadu_si256((const __m256i *)(b + i + 32)));
        x2 = _mm256_xor_si256(x2, _mm256_loadu_si256((const __m256i *)(b + i + 64)));
        x3 = _mm256_xor_si256(x3, _mm256_loadu_si256((const __m256i *)(b + i + 96)));
    }
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(x0, x1), _mm256_xor_si256(x2, x3));
    __m128i h = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    uint64_t r = (uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1);
    return r ^ i8a_fold_tail(b + i, bytes - i);
}

/* The rotation of common.h, stage by stage the same additions and subtractions. A group of
 * N registers (N * 8 floats, N = 1, 2, 4, 8) goes through every stage below N * 8 without
 * leaving registers: h = 1, 2, 4 inside each register (partner lane i ^ h by a permute; lanes
 * with bit h set take partner - self, the others self + partner), then h = 8 .. between
 * registers. Wider stages (blocks over 64) are common.h's passes over memory. */
/* One stage inside a register: partner lane i ^ h (idx), lanes in hi take partner - self. */
static inline __m256 i8a_rot_lanes_avx2(__m256 v, __m256i idx, __m256 hi)
{
    const __m256 p = _mm256_permutevar8x32_ps(v, idx);
    return _mm256_blendv_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), hi);
}

/* Stage h (in registers) over the n registers of a group: (r[j], r[j + h]) for j & h == 0. */
I8A_INLINE void i8a_rot_regs_avx2(__m256 *r, int n, int h)
{
#pragma GCC unroll 8
    for (int j = 0; j < n; j++)
        if (!(j & h)) {
            const __m256 a = r[j], c = r[j + h];
            r[j] = _mm256_add_ps(a, c);
            r[j + h] = _mm256_sub_ps(a, c);
        }
}

I8A_INLINE void
i8a_rot_groups_avx2(const float *in, size_t d, const float *sign, int inverse, int n, int whole,
                    __m256 scale, float *x)
{
    const __m256i i1 = _mm256_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6);
    const __m256i i2 = _mm256_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5);
    const __m256i i4 = _mm256_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3);
    const __m256 h1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
    const __m256 h2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, -1, -1, 0, 0, -1, -1));
    const __m256 h4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1));
    for (size_t g = 0; g < d; g += (size_t)n * 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int j = 0; j < n; j++) {
            __m256 v = _mm256_loadu_ps(in + g + 8 * j);
            if (!inverse)
                v = _mm256_mul_ps(v, _mm256_loadu_ps(sign + g + 8 * j));
            v = i8a_rot_lanes_avx2(v, i1, h1);
            v = i8a_rot_lanes_avx2(v, i2, h2);
            r[j] = i8a_rot_lanes_avx2(v, i4, h4);
        }
        if (n > 1)
            i8a_rot_regs_avx2(r, n, 1);
        if (n > 2)
            i8a_rot_regs_avx2(r, n, 2);
        if (n > 4)
            i8a_rot_regs_avx2(r, n, 4);
#pragma GCC unroll 8
        for (int j = 0; j < n; j++) {
            if (whole) {
                r[j] = _mm256_mul_ps(r[j], scale);
                if (inverse)
                    r[j] = _mm256_mul_ps(r[j], _mm256_loadu_ps(sign + g + 8 * j));
            }
            _mm256_storeu_ps(x + g + 8 * j, r[j]);
        }
    }
}

/* A row into the window's halves (dispatch.h): the largest |x| by vector max (exact in any
 * order), then F16C's vcvtps2ph, IEEE nearest-even like i8a_half_bits. */
static float i8a_half_row_avx2(const float *x, size_t d, uint16_t *h)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 most = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i += 8)
        most = _mm256_max_ps(most, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
    float lane[8], top = 0.0f;
    _mm256_storeu_ps(lane, most);
    for (int t = 0; t < 8; t++)
        top = lane[t] > top ? lane[t] : top;
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const __m256 down = _mm256_set1_ps(ldexpf(1.0f, -e));
    for (size_t i = 0; i < d; i += 8) {
        const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), down);
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return ldexpf(1.0f, e);
}

/* The recent window's two loops (common.h's order), halves widened by i8a_halves8 (above); a
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

static void i8a_rotate_avx2(const float *in, size_t d, const float *sign, int inverse, float *x)
{
    const size_t block = d & (~d + 1);                  /* >= 16: d is a multiple of 16 */
    const __m256 scale = _mm256_set1_ps(1.0f / sqrtf((float)block));
    switch (block) {
    case 16: i8a_rot_groups_avx2(in, d, sign, inverse, 2, 1, scale, x); return;
    case 32: i8a_rot_groups_avx2(in, d, sign, inverse, 4, 1, scale, x); return;
    case 64: i8a_rot_groups_avx2(in, d, sign, inverse, 8, 1, scale, x); return;
    default: i8a_rot_groups_avx2(in, d, sign, inverse, 8, 0, scale, x);
    }
    i8a_rotate_stages(x, d, sign, inverse, 64);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
