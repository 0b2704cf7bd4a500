/* The avx512_vnni tier: AVX-512 F/BW/VL + VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later).
 * Same operations as scalar.h in the same order, sixteen lanes at a time.
 *
 * VNNI's vpdpbusd multiplies unsigned by signed bytes. The K codes are made unsigned by an
 * offset, k + 128 (a xor with 0x80), so each dot comes out as q.k + 128 * sum(q); the second
 * term is a constant of each query plane, subtracted once per row. The biased sum stays exact:
 * |q.(k + 128)| <= 127 * 255 * 1024 < 2^25.
 *
 * Compiled at the baseline: the ISA is switched on for this header's functions only.
 */
#ifndef I8A_AVX512_VNNI_H
#define I8A_AVX512_VNNI_H

#include <immintrin.h>

#include "common.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

static int i8a_quantize_row_avx512_vnni(const float *x, size_t d, int8_t *codes, float *scale)
{
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 ok = 0xffff;
    size_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        ok &= _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ);
        vmax = _mm512_max_ps(vmax, a);
    }
    float absmax = _mm512_reduce_max_ps(vmax);
    int finite = ok == 0xffff;
    float inv;
    const int todo = i8a_row_prepare(x, i, d, absmax, finite, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m128i lo = _mm_set1_epi8(-127);
    for (i = 0; i + 16 <= d; i += 16) {
        /* cvtps rounds half to even under the default MXCSR; the narrowing saturates */
        __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
        _mm_storeu_si128((__m128i *)(codes + i), _mm_max_epi8(_mm512_cvtsepi32_epi8(r), lo));
    }
    for (; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

/* Bytes [i, i + 64) of a row of d bytes, zeros past d (d a multiple of 16). */
static inline __m512i i8a_load64_avx512_vnni(const int8_t *p, size_t i, size_t d)
{
    if (i + 64 <= d)
        return _mm512_loadu_si512((const void *)(p + i));
    return _mm512_maskz_loadu_epi8(~0ull >> (64 - (d - i)), p + i);
}

/* sum(q) of one plane: the offset's correction is 128 times it. */
static inline int32_t i8a_qsum_avx512_vnni(const int8_t *q, size_t d)
{
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < d; i += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi8(1), i8a_load64_avx512_vnni(q, i, d));
    return _mm512_reduce_add_epi32(acc);
}

/* Bytes [i, i + 32) of a row of d bytes, zeros past d (d a multiple of 16). */
static inline __m256i i8a_load32_avx512_vnni(const int8_t *p, size_t i, size_t d)
{
    if (i + 32 <= d)
        return _mm256_loadu_si256((const __m256i *)(p + i));
    return _mm256_maskz_loadu_epi8(0xffff, p + i);
}

/* Four row sums of four 256-bit accumulators, minus the offset's correction. */
static inline __m128i i8a_reduce4x256_avx512_vnni(__m256i a0, __m256i a1, __m256i a2, __m256i a3,
                                                  __m128i corr)
{
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return _mm_sub_epi32(x, corr);
}

/* Exact dots of every query head's planes with rows [0, n), four rows at a time (see
 * i8a_kdots_avx2): dh[j * I8A_CHUNK + s], dl[...]. 256-bit vpdpbusd: on cores that split
 * 512-bit operations it costs the same per byte, and its row sums reduce in half the steps. */
static inline void i8a_kdots_avx512_vnni(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                         int32_t *dl)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (size_t j = 0; j < q->nq; j++) {
        const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
        const __m128i ch = _mm_set1_epi32(128 * i8a_qsum_avx512_vnni(qh, d));
        const __m128i cl = _mm_set1_epi32(two ? 128 * i8a_qsum_avx512_vnni(ql, d) : 0);
        /* rows past n of the last group of four are never stored: computed on row n - 1 */
        for (size_t s = 0; s < n; s += 4) {
            if (j == 0 && s < kv->next_n) /* the next chunk's K, one group of rows per group */
                i8a_prefetch_rows(kv->next_k + s * d, (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
            const int8_t *k0 = kv->k + s * d;
            const int8_t *k1 = kv->k + (s + 1 < n ? s + 1 : n - 1) * d;
            const int8_t *k2 = kv->k + (s + 2 < n ? s + 2 : n - 1) * d;
            const int8_t *k3 = kv->k + (s + 3 < n ? s + 3 : n - 1) * d;
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
            __m256i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            for (size_t i = 0; i < d; i += 32) {
                __m256i u0 = _mm256_xor_si256(i8a_load32_avx512_vnni(k0, i, d), bias);
                __m256i u1 = _mm256_xor_si256(i8a_load32_avx512_vnni(k1, i, d), bias);
                __m256i u2 = _mm256_xor_si256(i8a_load32_avx512_vnni(k2, i, d), bias);
                __m256i u3 = _mm256_xor_si256(i8a_load32_avx512_vnni(k3, i, d), bias);
                __m256i a = i8a_load32_avx512_vnni(qh, i, d);
                h0 = _mm256_dpbusd_epi32(h0, u0, a);
                h1 = _mm256_dpbusd_epi32(h1, u1, a);
                h2 = _mm256_dpbusd_epi32(h2, u2, a);
                h3 = _mm256_dpbusd_epi32(h3, u3, a);
                if (two) {
                    __m256i b = i8a_load32_avx512_vnni(ql, i, d);
                    l0 = _mm256_dpbusd_epi32(l0, u0, b);
                    l1 = _mm256_dpbusd_epi32(l1, u1, b);
                    l2 = _mm256_dpbusd_epi32(l2, u2, b);
                    l3 = _mm256_dpbusd_epi32(l3, u3, b);
                }
            }
            _mm_store_si128((__m128i *)(dh + j * I8A_CHUNK + s),
                            i8a_reduce4x256_avx512_vnni(h0, h1, h2, h3, ch));
            if (two)
                _mm_store_si128((__m128i *)(dl + j * I8A_CHUNK + s),
                                i8a_reduce4x256_avx512_vnni(l0, l1, l2, l3, cl));
        }
    }
}

/* The exp's polynomial on 16 lanes, the operations of i8a_exp_poly_scalar. */
static inline __m512 i8a_exp_poly16_avx512_vnni(__m512 x, __m512 *n_out)
{
    const __m512 magic = _mm512_set1_ps(I8A_EXP_MAGIC);
    x = _mm512_max_ps(x, _mm512_set1_ps(I8A_EXP_LO));
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(I8A_LOG2E), magic), magic);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-I8A_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-I8A_LN2_LO), r);
    __m512 z = _mm512_mul_ps(r, r);
    __m512 y = _mm512_set1_ps(I8A_EXP_P0);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(I8A_EXP_P5));
    *n_out = n;
    return _mm512_fmadd_ps(y, z, r);
}

/* y * 2^n on 16 lanes (i8a_scale2n_scalar). */
static inline __m512 i8a_scale2n16_avx512_vnni(__m512 y, __m512 n)
{
    __m512i e = _mm512_slli_epi32(_mm512_cvttps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
}

/* exp of 16 lanes, the operations of i8a_exp_scalar. */
static inline __m512 i8a_exp16_avx512_vnni(__m512 x)
{
    __m512 n;
    const __m512 y = i8a_exp_poly16_avx512_vnni(x, &n);
    return i8a_scale2n16_avx512_vnni(_mm512_add_ps(y, _mm512_set1_ps(1.0f)), n);
}

/* expm1 of 16 lanes, the operations of i8a_expm1_scalar. */
static inline __m512 i8a_expm1_16_avx512_vnni(__m512 x)
{
    __m512 n;
    const __m512 y = i8a_exp_poly16_avx512_vnni(x, &n), one = _mm512_set1_ps(1.0f);
    const __m512 big = _mm512_sub_ps(i8a_scale2n16_avx512_vnni(_mm512_add_ps(y, one), n), one);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_EQ_OQ), big, y);
}

/* i8a_softcap on 16 lanes (t >= +0, so the sign of u is or-ed in). */
static inline __m512 i8a_softcap16_avx512_vnni(__m512 l, float cap, float inv_cap)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 u = _mm512_mul_ps(l, _mm512_set1_ps(inv_cap));
    const __m512 m = i8a_expm1_16_avx512_vnni(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-2.0f)));
    const __m512 t = _mm512_div_ps(_mm512_abs_ps(m), _mm512_add_ps(_mm512_set1_ps(2.0f), m));
    const __m512i st = _mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(_mm512_castps_si512(u), sign));
    return _mm512_mul_ps(_mm512_set1_ps(cap), _mm512_castsi512_ps(st));
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, sixteen at a time; returns max_s p[s]. */
static inline float i8a_logits_avx512_vnni(const int32_t *dh, const int32_t *dl, float c_hi,
                                           float c_lo, int two, float bias, float cap, float inv_cap,
                                           const float *ks, size_t n, float *p)
{
    const __m512 ch = _mm512_set1_ps(c_hi), cl = _mm512_set1_ps(c_lo), vb = _mm512_set1_ps(bias);
    __m512 vmax = _mm512_set1_ps(-FLT_MAX);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 lg = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dh + s))), ch);
        if (two)
            lg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dl + s))), cl, lg);
        lg = _mm512_add_ps(_mm512_mul_ps(lg, _mm512_maskz_loadu_ps(live, ks + s)), vb);
        if (cap > 0.0f)
            lg = i8a_softcap16_avx512_vnni(lg, cap, inv_cap);
        _mm512_store_ps(p + s, lg);
        vmax = _mm512_mask_max_ps(vmax, live, vmax, lg);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* Sixteen halves widened by vcvtph2ps (exact). */
static inline __m512 i8a_halves16_avx512_vnni(const uint16_t *h)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

/* The 16 lane sums of v folded into one: lanes i + 8, then i + 4, i + 2, i + 1 (the halving
 * order of i8a_reduce_lanes). */
static inline float i8a_fold16_avx512_vnni(__m512 v)
{
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* p[s] = exp(p[s] - m) * vs[s] for s < n (zeros up to a multiple of 16); returns the 16-lane
 * sum of the exps (common.h): one accumulator is exactly the sixteen lanes. */
static inline float i8a_softmax_avx512_vnni(float *p, const float *vs, size_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 e = _mm512_maskz_mov_ps(live, i8a_exp16_avx512_vnni(_mm512_sub_ps(_mm512_load_ps(p + s), vm)));
        acc = _mm512_add_ps(acc, e);
        _mm512_store_ps(p + s, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(live, vs + s)));
    }
    return i8a_fold16_avx512_vnni(acc);
}

/* A head's P planes from its weights w [n] (common.h's rule, 16 weights at a time; floor,
 * clamps and residuals on floats, each residual by one fused step, the last plane's rint by
 * vcvtps2dq under the default MXCSR, clamped as integers: the bytes of i8a_planes_scalar). */
static inline void i8a_planes_avx512_vnni(const float *w, size_t n, size_t lead, uint8_t *slot)
{
    __m512 most = _mm512_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        most = _mm512_max_ps(most, _mm512_maskz_loadu_ps(live, w + s));
    }
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    const float lift = i8a_weight_scales(_mm512_reduce_max_ps(most), sc, inv);
    const __m512 lift_f = _mm512_set1_ps(lift);
    const __m512 zero_f = _mm512_setzero_ps(), most_f = _mm512_set1_ps(127.0f);
    const __m512i zero = _mm512_setzero_si512(), most_i = _mm512_set1_epi32(127);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, w + s), lift_f);
        for (int k = 0; k < I8A_WPLANES - 1; k++) {
            __m512 x = _mm512_roundscale_ps(_mm512_mul_ps(r, _mm512_set1_ps(inv[k])),
                                            _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            x = _mm512_min_ps(_mm512_max_ps(x, zero_f), most_f);
            r = _mm512_fnmadd_ps(x, _mm512_set1_ps(sc[k]), r);
            _mm_mask_storeu_epi8(slot + k * I8A_PLANE_BYTES + lead + s, live,
                                 _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x)));
        }
        __m512i l = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(inv[I8A_WPLANES - 1])));
        l = _mm512_min_epi32(_mm512_max_epi32(l, zero), most_i);
        _mm_mask_storeu_epi8(slot + (I8A_WPLANES - 1) * I8A_PLANE_BYTES + lead + s, live,
                             _mm512_cvtepi32_epi8(l));
    }
    i8a_planes_frame(slot, lead, n, sc, lift);
}

/* One plane byte group (4 positions of a tile) of a head, broadcast to every 32-bit lane. */
static inline __m512i i8a_pword_avx512_vnni(const uint8_t *plane, size_t t)
{
    int32_t x;
    memcpy(&x, plane + I8A_V_TILE * t, sizeof x);
    return _mm512_set1_epi32(x);
}

/* The integer V pass (common.h) of NH heads over dims [i0, i0 + 16 nb): per tile, one
 * vpdpbusd per plane, head and 16 dims (P bytes unsigned, V codes signed: each lane sums the
 * tile's 4 positions of one dimension), then o from the three sums. The first block prefetches
 * pf_n rows of pf (the next chunk's V). NH and NB are constants at every call. */
I8A_INLINE void
i8a_vtiles_block_avx512_vnni(const uint8_t *const *planes, int nh, int nb, const int8_t *v,
                             size_t tiles, size_t d, size_t i0, float *o, const int8_t *pf,
                             size_t pf_n)
{
    __m512i acc[4][I8A_WPLANES][8];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 8
            for (int b = 0; b < nb; b++)
                acc[h][k][b] = _mm512_setzero_si512();
    for (size_t t = 0; t < tiles; t++) {
        if (I8A_V_TILE * t < pf_n)
            i8a_prefetch_rows(pf + I8A_V_TILE * t * d, I8A_V_TILE * d);
        const int8_t *x = v + (t * d + i0) * I8A_V_TILE;
        /* one plane word at a time in a register, V as the memory operand (VNNI's signed
         * one): 3 NH NB accumulators and one broadcast live */
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES; k++) {
                const __m512i pw = i8a_pword_avx512_vnni(planes[h] + k * I8A_PLANE_BYTES, t);
#pragma GCC unroll 8
                for (int b = 0; b < nb; b++)
                    acc[h][k][b] = _mm512_dpbusd_epi32(
                        acc[h][k][b], pw, _mm512_loadu_si512((const void *)(x + 64 * b)));
            }
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int b = 0; b < nb; b++) {
            __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][0][b]), _mm512_set1_ps(sc[0]));
#pragma GCC unroll 8
            for (int k = 1; k < I8A_WPLANES; k++)
                y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h][k][b]), _mm512_set1_ps(sc[k]), y);
            _mm512_storeu_ps(o + h * d + i0 + 16 * b, y);
        }
    }
}

/* The V pass of heads [j, j + NH): blocks of 3 NH NB <= 12 accumulators (GCC 12 spills
 * beyond about 16 of them in this loop), then single vectors for the rest of d. */
I8A_INLINE void i8a_vtiles_group_avx512_vnni(float *scratch, size_t nq, size_t j, int nh,
                                             const i8a_span *kv, size_t d, float *o, size_t pf_n)
{
    const uint8_t *planes[4];
    for (int h = 0; h < nh; h++)
        planes[h] = i8a_planes_at(scratch, nq, j + (size_t)h);
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const int nb = nh == 1 ? 4 : nh == 2 ? 2 : 1;
    size_t i = 0;
    for (; i + 16 * (size_t)nb <= d; i += 16 * (size_t)nb, pf_n = 0)
        i8a_vtiles_block_avx512_vnni(planes, nh, nb, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
    for (; i < d; i += 16, pf_n = 0)
        i8a_vtiles_block_avx512_vnni(planes, nh, 1, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
}

static void i8a_attend_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                   const i8a_state *out)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    /* dh in the second half of the scratch, dl in the first: head j's logits overwrite its
     * own dl element by element, each read before it is written, and its planes its dh */
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    i8a_kdots_avx512_vnni(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = i8a_logits_avx512_vnni(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                               q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                               q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        out->m[j] = m;
        out->l[j] = i8a_softmax_avx512_vnni(p, kv->vs, n, m);
        i8a_planes_avx512_vnni(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
    }
    size_t j = 0, pf_n = kv->next_n;   /* the first group prefetches the next chunk's V */
    for (; j + 4 <= nq; j += 4, pf_n = 0)
        i8a_vtiles_group_avx512_vnni(scratch, nq, j, 4, kv, d, out->o, pf_n);
    switch (nq - j) {
    case 3: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 3, kv, d, out->o, pf_n); break;
    case 2: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 2, kv, d, out->o, pf_n); break;
    case 1: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 1, kv, d, out->o, pf_n); break;
    default: break;
    }
}

/* -- attend4: the sides at 4 bits (dispatch.h) ------------------------------------------- */

/* A K group's planes in the order of this tier's code vectors: 32 bytes of a row (two blocks)
 * unpack to the low nibbles, channels 32 b + i, and the high ones, 32 b + 16 + i (b = 0, 1, i
 * < 16). lo / hi [d / 2] take plane q's bytes in those orders. */
static inline void i8a_k4_order_avx512_vnni(const int8_t *q, size_t d, int8_t *lo, int8_t *hi)
{
    for (size_t b = 0; b < d / I8A_NIB_BLOCK; b++) {
        memcpy(lo + 16 * b, q + I8A_NIB_BLOCK * b, 16);
        memcpy(hi + 16 * b, q + I8A_NIB_BLOCK * b + 16, 16);
    }
}

/* Exact dots of NP ordered q planes (lo, hi: [NP][I8A_MAX_HEAD_DIM / 2]) with rows [0, n) of
 * K at 4 bits, four rows at a time (codes unsigned, planes signed: vpdpbusd as it is; a row's
 * last 16 bytes when d / 2 is an odd number of them load with zeros past the row):
 * dot[k * I8A_K4_GROUP + s]. n <= I8A_K4_GROUP. NP is a constant at every call. */
I8A_INLINE void i8a_k4dots_avx512_vnni(const uint8_t *k4, size_t n, size_t d, const int8_t *lo,
                                       const int8_t *hi, int np, int32_t *dot)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m128i none = _mm_setzero_si128();
    for (size_t s = 0; s < n; s += 4) {
        const uint8_t *r[4];
        for (int u = 0; u < 4; u++)
            r[u] = k4 + (s + (size_t)u < n ? s + (size_t)u : n - 1) * (d / 2);
        __m256i acc[4][I8A_K4_QPLANES];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
#pragma GCC unroll 3
            for (int k = 0; k < np; k++)
                acc[u][k] = _mm256_setzero_si256();
        for (size_t j = 0; j < d / 2; j += 32) {
            __m256i cl[4], ch[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m256i x = i8a_load32_avx512_vnni((const int8_t *)r[u], j, d / 2);
                cl[u] = _mm256_and_si256(x, nib);
                ch[u] = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
            }
#pragma GCC unroll 3
            for (int k = 0; k < np; k++) {
                const __m256i ql = _mm256_loadu_si256((const __m256i *)(lo + k * (I8A_MAX_HEAD_DIM / 2) + j));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(hi + k * (I8A_MAX_HEAD_DIM / 2) + j));
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    acc[u][k] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc[u][k], cl[u], ql), ch[u], qh);
            }
        }
#pragma GCC unroll 3
        for (int k = 0; k < np; k++) {
            int32_t four[4];
            _mm_storeu_si128((__m128i *)four, i8a_reduce4x256_avx512_vnni(acc[0][k], acc[1][k],
                                                                          acc[2][k], acc[3][k], none));
            for (size_t u = 0; u < 4 && s + u < n; u++)
                dot[(size_t)k * I8A_K4_GROUP + s + u] = four[u];
        }
    }
}

/* p [n] = i8a_logit4 of NP plane dots (dot[k * I8A_K4_GROUP + s]), sixteen at a time; returns
 * their max (-FLT_MAX for none). */
I8A_INLINE float i8a_logits4_avx512_vnni(const int32_t *dot, const float *c, int np, float bias,
                                         float cap, float inv_cap, size_t n, float *p)
{
    __m512 vmax = _mm512_set1_ps(-FLT_MAX);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 lg = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(live, dot + s)),
                                  _mm512_set1_ps(c[0]));
#pragma GCC unroll 3
        for (int k = 1; k < np; k++)
            lg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(live, dot + (size_t)k * I8A_K4_GROUP + s)),
                                 _mm512_set1_ps(c[k]), lg);
        lg = _mm512_add_ps(lg, _mm512_set1_ps(bias));
        if (cap > 0.0f)
            lg = i8a_softcap16_avx512_vnni(lg, cap, inv_cap);
        _mm512_mask_storeu_ps(p + s, live, lg);
        vmax = _mm512_mask_max_ps(vmax, live, vmax, lg);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* common.h's i8a_k4_query with this tier's vectors: the steps and minima widened by
 * vcvtph2ps (exact), the planes' bytes by vcvtps2dq (nearest even under the default MXCSR)
 * clamped as integers, the bias by one 16-lane accumulator (dot16's order) and the lane fold. */
static inline void i8a_k4_query_avx512_vnni(const float *qs, const uint16_t *h_min,
                                            float min_scale, const uint16_t *h_step,
                                            float step_scale, size_t d, int planes, int8_t *q,
                                            float *c, float *bias, float *r)
{
    const __m512 ss = _mm512_set1_ps(step_scale);
    __m512 acc = _mm512_setzero_ps(), most = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i += 16) {
        const __m512 x = _mm512_loadu_ps(qs + i);
        const __m512 y = _mm512_mul_ps(x, _mm512_mul_ps(i8a_halves16_avx512_vnni(h_step + i), ss));
        _mm512_storeu_ps(r + i, y);
        most = _mm512_max_ps(most, _mm512_abs_ps(y));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, i8a_halves16_avx512_vnni(h_min + i)));
    }
    float inv[I8A_K4_QPLANES];
    i8a_k4_scales(_mm512_reduce_max_ps(most), planes, c, inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (size_t i = 0; i < d; i += 16) {
        __m512 x = _mm512_loadu_ps(r + i);
        for (int k = 0; k < planes; k++) {
            __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inv[k])));
            b = _mm512_min_epi32(_mm512_max_epi32(b, lo), hi);
            _mm_storeu_si128((__m128i *)(q + (size_t)k * I8A_MAX_HEAD_DIM + i), _mm512_cvtepi32_epi8(b));
            x = _mm512_sub_ps(x, _mm512_mul_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(c[k])));
        }
    }
    *bias = i8a_fold16_avx512_vnni(acc) * min_scale;
}

/* The logits of query head j against the span's K rows at 4 bits (common.h's
 * i8a_logits4_scalar, group by group); returns their max. */
I8A_INLINE float i8a_k4_logits_avx512_vnni(const i8a_query *q, const i8a_span *kv, size_t j,
                                           float *p, uint8_t *extra, int np)
{
    const size_t d = q->d, n = kv->n, half = I8A_MAX_HEAD_DIM / 2;
    int8_t *planes = (int8_t *)extra, *lo = planes + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM;
    int8_t *hi = lo + I8A_K4_QPLANES * half;
    float *tmp = (float *)(hi + I8A_K4_QPLANES * half);
    int32_t *dot = (int32_t *)(tmp + I8A_MAX_HEAD_DIM);
    float m = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query_avx512_vnni(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                                 kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c,
                                 &bias, tmp);
        for (int k = 0; k < np; k++)
            i8a_k4_order_avx512_vnni(planes + k * I8A_MAX_HEAD_DIM, d, lo + k * half, hi + k * half);
        if (j == 0 && s < kv->next_n)   /* the next chunk's K, a group's rows at a time */
            i8a_prefetch_rows(kv->next_k + s * (d / 2), (kv->next_n - s < rows ? kv->next_n - s : rows) * (d / 2));
        i8a_k4dots_avx512_vnni(kv->k4 + s * (d / 2), rows, d, lo, hi, np, dot);
        const float gm = i8a_logits4_avx512_vnni(dot, c, np, bias, q->softcap, q->inv_softcap,
                                                 rows, p + s);
        m = gm > m ? gm : m;
        s += rows;
    }
    return m;
}

/* p[s] = exp(p[s] - m) * vs[s] for s < n (zeros up to a multiple of 16); returns the 16-lane
 * sum of the exps and sets *vmin_sum to the 16-lane sum of exp * vmin (V at 4 bits). */
static inline float i8a_softmax4_avx512_vnni(float *p, const float *vs, const float *vmin,
                                             size_t n, float m, float *vmin_sum)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps(), macc = _mm512_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 e = _mm512_maskz_mov_ps(live, i8a_exp16_avx512_vnni(_mm512_sub_ps(_mm512_load_ps(p + s), vm)));
        acc = _mm512_add_ps(acc, e);
        macc = _mm512_add_ps(macc, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(live, vmin + s)));
        _mm512_store_ps(p + s, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(live, vs + s)));
    }
    *vmin_sum = i8a_fold16_avx512_vnni(macc);
    return i8a_fold16_avx512_vnni(acc);
}

/* The integer V pass at 4 bits of NH heads (1 or 2) over the 32-dimension blocks [b0, b0 +
 * NB): per tile and block, 64 bytes unpack to two vectors in the int8 tile's layout
 * (dimensions 32 b .. + 15 from the low nibbles, 32 b + 16 .. + 31 from the high ones), one
 * vpdpbusd each per plane and head; then o = i8a_v_out(S) + the head's vmin sum. The tiles of
 * pf_n rows of pf (the next chunk's V) are prefetched. NH and NB are constants at every call. */
I8A_INLINE void
i8a_v4tiles_block_avx512_vnni(const uint8_t *const *planes, const float *vmin, int nh, int nb,
                              const uint8_t *v4, size_t tiles, size_t d, size_t b0, float *o,
                              const int8_t *pf, size_t pf_n)
{
    const __m512i nib = _mm512_set1_epi8(0x0f);
    __m512i acc[2][I8A_WPLANES][4];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 4
            for (int u = 0; u < 2 * nb; u++)
                acc[h][k][u] = _mm512_setzero_si512();
    for (size_t t = 0; t < tiles; t++) {
        if (I8A_V_TILE * t < pf_n)              /* the next chunk's V, a tile at a time */
            i8a_prefetch_rows(pf + t * 2 * d, 2 * d);
        const uint8_t *x = v4 + t * 2 * d + 64 * b0;
        __m512i xv[4];
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++) {
            const __m512i raw = _mm512_loadu_si512((const void *)(x + 64 * b));
            xv[2 * b] = _mm512_and_si512(raw, nib);
            xv[2 * b + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
        }
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES; k++) {
                const __m512i pw = i8a_pword_avx512_vnni(planes[h] + k * I8A_PLANE_BYTES, t);
#pragma GCC unroll 4
                for (int u = 0; u < 2 * nb; u++)
                    acc[h][k][u] = _mm512_dpbusd_epi32(acc[h][k][u], pw, xv[u]);
            }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 4
        for (int u = 0; u < 2 * nb; u++) {
            __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][0][u]), _mm512_set1_ps(sc[0]));
#pragma GCC unroll 3
            for (int k = 1; k < I8A_WPLANES; k++)
                y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h][k][u]), _mm512_set1_ps(sc[k]), y);
            _mm512_storeu_ps(o + h * d + 32 * b0 + 16 * u, _mm512_add_ps(y, _mm512_set1_ps(vmin[h])));
        }
    }
}

/* The V pass at 4 bits over the nq heads of a chunk: pairs of heads a block of 32 dimensions at
 * a time, then a head left alone two blocks at a time (12 accumulators either way). */
static inline void i8a_v4pass_avx512_vnni(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                          float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n), blocks = d / I8A_NIB_BLOCK;
    size_t j = 0, pf_n = kv->next_n;   /* the first block prefetches the next chunk's V */
    for (; j + 2 <= nq; j += 2) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), i8a_planes_at(scratch, nq, j + 1)};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j), *i8a_vmin_sum_at(scratch, nq, j + 1)};
        for (size_t b = 0; b < blocks; b++, pf_n = 0)
            i8a_v4tiles_block_avx512_vnni(planes, vmin, 2, 1, kv->v4, tiles, d, b, o + j * d,
                                          kv->next_v, pf_n);
    }
    if (j < nq) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), NULL};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j), 0.0f};
        size_t b = 0;
        for (; b + 2 <= blocks; b += 2, pf_n = 0)
            i8a_v4tiles_block_avx512_vnni(planes, vmin, 1, 2, kv->v4, tiles, d, b, o + j * d,
                                          kv->next_v, pf_n);
        if (b < blocks)
            i8a_v4tiles_block_avx512_vnni(planes, vmin, 1, 1, kv->v4, tiles, d, b, o + j * d,
                                          kv->next_v, pf_n);
    }
}

/* attend4 (dispatch.h) in attend's order, the 4-bit passes vectorized: K at 8 bits by attend's
 * dots, at 4 bits group by group (i8a_k4_logits_avx512_vnni); the softmax with V's minima; the
 * planes; the V pass of the side's width. */
I8A_INLINE void i8a_attend4_body_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                             const i8a_state *out, const int k4, const int v4)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    if (!k4)
        i8a_kdots_avx512_vnni(q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m;
        if (!k4)
            m = i8a_logits_avx512_vnni(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                       q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                       q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        else if (q->two_planes)
            m = i8a_k4_logits_avx512_vnni(q, kv, j, p, extra, I8A_K4_QPLANES);
        else
            m = i8a_k4_logits_avx512_vnni(q, kv, j, p, extra, 1);
        out->m[j] = m;
        if (v4)
            out->l[j] = i8a_softmax4_avx512_vnni(p, kv->vs, kv->v4_min, n, m,
                                                 i8a_vmin_sum_at(scratch, nq, j));
        else
            out->l[j] = i8a_softmax_avx512_vnni(p, kv->vs, n, m);
        i8a_planes_avx512_vnni(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
    }
    if (v4) {
        i8a_v4pass_avx512_vnni(scratch, nq, kv, d, out->o);
        return;
    }
    size_t j = 0, pf_n = kv->next_n;
    for (; j + 4 <= nq; j += 4, pf_n = 0)
        i8a_vtiles_group_avx512_vnni(scratch, nq, j, 4, kv, d, out->o, pf_n);
    switch (nq - j) {
    case 3: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 3, kv, d, out->o, pf_n); break;
    case 2: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 2, kv, d, out->o, pf_n); break;
    case 1: i8a_vtiles_group_avx512_vnni(scratch, nq, j, 1, kv, d, out->o, pf_n); break;
    default: break;
    }
}

/* The three entries of attend[k][v] with a side at 4 bits: the body above, its flags constant. */
static void i8a_attend_k8v4_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out)
{
    i8a_attend4_body_avx512_vnni(q, kv, scratch, out, 0, 1);
}

static void i8a_attend_k4v8_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out)
{
    i8a_attend4_body_avx512_vnni(q, kv, scratch, out, 1, 0);
}

static void i8a_attend_k4v4_avx512_vnni(const i8a_query *q, const i8a_span *kv, float *scratch,
                                        const i8a_state *out)
{
    i8a_attend4_body_avx512_vnni(q, kv, scratch, out, 1, 1);
}

static void i8a_merge_avx512_vnni(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    for (size_t i = 0; i < d; i += 16) {
        __m512 r = _mm512_mul_ps(_mm512_loadu_ps(ro + i), va);
        _mm512_storeu_ps(ro + i, _mm512_fmadd_ps(_mm512_loadu_ps(co + i), vb, r));
    }
}

static uint64_t i8a_stream_avx512_vnni(const void *p, size_t bytes, const void *next)
{
    const unsigned char *b = (const unsigned char *)p;
    __m512i x0 = _mm512_setzero_si512(), x1 = x0, x2 = x0, x3 = x0;
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        if (next)
            i8a_prefetch_rows((const char *)next + i, 256);
        x0 = _mm512_xor_si512(x0, _mm512_loadu_si512((const void *)(b + i)));
        x1 = _mm512_xor_si512(x1, _mm512_loadu_si512((const void *)(b + i + 64)));
        x2 = _mm512_xor_si512(x2, _mm512_loadu_si512((const void *)(b + i + 128)));
        x3 = _mm512_xor_si512(x3, _mm512_loadu_si512((const void *)(b + i + 192)));
    }
    __m512i x = _mm512_xor_si512(_mm512_xor_si512(x0, x1), _mm512_xor_si512(x2, x3));
    __m256i y = _mm256_xor_si256(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
    __m128i h = _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
    uint64_t r = (uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1);
    return r ^ i8a_fold_tail(b + i, bytes - i);
}

/* The rotation of common.h, stage by stage the same additions and subtractions. A group of
 * N registers (N * 16 floats, N = 1, 2, 4, 8) goes through every stage below N * 16 without
 * leaving registers: h = 1, 2, 4, 8 inside each register (partner lane i ^ h by a permute;
 * lanes with bit h set take partner - self, the others self + partner), then h = 16 .. between
 * registers. Wider stages (blocks over 128) are common.h's passes over memory. */
/* One stage inside a register: partner lane i ^ h (idx), lanes in hi take partner - self. */
static inline __m512 i8a_rot_lanes_avx512_vnni(__m512 v, __m512i idx, __mmask16 hi)
{
    const __m512 p = _mm512_permutexvar_ps(idx, v);
    return _mm512_mask_sub_ps(_mm512_add_ps(v, p), hi, p, v);
}

/* Stage h (in registers) over the n registers of a group: (r[j], r[j + h]) for j & h == 0. */
I8A_INLINE void i8a_rot_regs_avx512_vnni(__m512 *r, int n, int h)
{
#pragma GCC unroll 8
    for (int j = 0; j < n; j++)
        if (!(j & h)) {
            const __m512 a = r[j], c = r[j + h];
            r[j] = _mm512_add_ps(a, c);
            r[j + h] = _mm512_sub_ps(a, c);
        }
}

I8A_INLINE void
i8a_rot_groups_avx512_vnni(const float *in, size_t d, const float *sign, int inverse, int n,
                      int whole, __m512 scale, float *x)
{
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i i1 = _mm512_xor_si512(lane, _mm512_set1_epi32(1));
    const __m512i i2 = _mm512_xor_si512(lane, _mm512_set1_epi32(2));
    const __m512i i4 = _mm512_xor_si512(lane, _mm512_set1_epi32(4));
    const __m512i i8 = _mm512_xor_si512(lane, _mm512_set1_epi32(8));
    for (size_t g = 0; g < d; g += (size_t)n * 16) {
        __m512 r[8];
#pragma GCC unroll 8
        for (int j = 0; j < n; j++) {
            __m512 v = _mm512_loadu_ps(in + g + 16 * j);
            if (!inverse)
                v = _mm512_mul_ps(v, _mm512_loadu_ps(sign + g + 16 * j));
            v = i8a_rot_lanes_avx512_vnni(v, i1, 0xAAAA);
            v = i8a_rot_lanes_avx512_vnni(v, i2, 0xCCCC);
            v = i8a_rot_lanes_avx512_vnni(v, i4, 0xF0F0);
            r[j] = i8a_rot_lanes_avx512_vnni(v, i8, 0xFF00);
        }
        if (n > 1)
            i8a_rot_regs_avx512_vnni(r, n, 1);
        if (n > 2)
            i8a_rot_regs_avx512_vnni(r, n, 2);
        if (n > 4)
            i8a_rot_regs_avx512_vnni(r, n, 4);
#pragma GCC unroll 8
        for (int j = 0; j < n; j++) {
            if (whole) {
                r[j] = _mm512_mul_ps(r[j], scale);
                if (inverse)
                    r[j] = _mm512_mul_ps(r[j], _mm512_loadu_ps(sign + g + 16 * j));
            }
            _mm512_storeu_ps(x + g + 16 * j, r[j]);
        }
    }
}

/* A row into the window's halves (dispatch.h): the largest |x| by vector max (exact in any
 * order), then vcvtps2ph, IEEE nearest-even like i8a_half_bits. */
static float i8a_half_row_avx512_vnni(const float *x, size_t d, uint16_t *h)
{
    __m512 most = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i += 16)
        most = _mm512_max_ps(most, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    const float top = _mm512_reduce_max_ps(most);
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const __m512 down = _mm512_set1_ps(ldexpf(1.0f, -e));
    for (size_t i = 0; i < d; i += 16) {
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + i), down);
        _mm256_storeu_si256((__m256i *)(h + i),
                            _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return ldexpf(1.0f, e);
}

/* The recent window's two loops (common.h's order), halves widened by i8a_halves16 (above). */

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

static void i8a_rotate_avx512_vnni(const float *in, size_t d, const float *sign, int inverse,
                                   float *x)
{
    const size_t block = d & (~d + 1);                  /* >= 16: d is a multiple of 16 */
    const __m512 scale = _mm512_set1_ps(1.0f / sqrtf((float)block));
    switch (block) {
    case 16: i8a_rot_groups_avx512_vnni(in, d, sign, inverse, 1, 1, scale, x); return;
    case 32: i8a_rot_groups_avx512_vnni(in, d, sign, inverse, 2, 1, scale, x); return;
    case 64: i8a_rot_groups_avx512_vnni(in, d, sign, inverse, 4, 1, scale, x); return;
    case 128: i8a_rot_groups_avx512_vnni(in, d, sign, inverse, 8, 1, scale, x); return;
    default: i8a_rot_groups_avx512_vnni(in, d, sign, inverse, 8, 0, scale, x);
    }
    i8a_rotate_stages(x, d, sign, inverse, 128);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif
