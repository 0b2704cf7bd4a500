/* The neon tier: armv8-a Advanced SIMD (Cortex-A72, Raspberry Pi 4). Same operations as
 * scalar.h in the same order, four lanes at a time.
 *
 * Without SDOT the int8 dot widens: vmull_s8 + vmlal_s8 put two products in each int16 lane
 * (at most 2 * 127 * 127 = 32258: -128 is never stored, so no lane overflows), vpadalq_s16
 * adds the pairs into int32.
 *
 * The attend body is shared with neon_dotprod.h, which passes its own dot: one body, two tiers.
 */
#ifndef I8A_NEON_H
#define I8A_NEON_H

#include <arm_neon.h>

#include "common.h"

static int i8a_quantize_row_neon(const float *x, size_t d, int8_t *codes, float *scale)
{
    float32x4_t vmax = vdupq_n_f32(0.0f);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    const float32x4_t big = vdupq_n_f32(FLT_MAX);
    size_t i = 0;
    for (; i + 4 <= d; i += 4) {
        float32x4_t a = vabsq_f32(vld1q_f32(x + i));
        ok = vandq_u32(ok, vcleq_f32(a, big));
        vmax = vmaxq_f32(vmax, a);
    }
    float absmax = vmaxvq_f32(vmax);
    int finite = vminvq_u32(ok) == 0xffffffffu;
    float inv;
    const int todo = i8a_row_prepare(x, i, d, absmax, finite, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    const float32x4_t vinv = vdupq_n_f32(inv);
    const int8x16_t lo = vdupq_n_s8(-127);
    for (i = 0; i + 16 <= d; i += 16) {
        /* vcvtnq rounds half to even, as rintf does under the default rounding mode */
        int32x4_t a = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i), vinv));
        int32x4_t b = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 4), vinv));
        int32x4_t c = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 8), vinv));
        int32x4_t e = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 12), vinv));
        int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
        int16x8_t ce = vcombine_s16(vqmovn_s32(c), vqmovn_s32(e));
        vst1q_s8(codes + i, vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(ce)), lo));
    }
    for (; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

/* acc += pair sums of a . b over 16 bytes, widening through int16. */
I8A_INLINE int32x4_t i8a_dot16_neon(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(acc, p);
}

typedef int32x4_t (*i8a_dot16_neon_fn)(int32x4_t acc, int8x16_t a, int8x16_t b);

/* Dots of two q planes with one k row (k loaded once), with the given 16-byte dot step. */
I8A_INLINE void i8a_dot2_with_neon(i8a_dot16_neon_fn dot16, const int8_t *qh, const int8_t *ql,
                                   const int8_t *k, size_t d, int two, int32_t *dh, int32_t *dl)
{
    int32x4_t ah = vdupq_n_s32(0), al = vdupq_n_s32(0);
    for (size_t i = 0; i < d; i += 16) {
        int8x16_t kk = vld1q_s8(k + i);
        ah = dot16(ah, vld1q_s8(qh + i), kk);
        if (two)
            al = dot16(al, vld1q_s8(ql + i), kk);
    }
    *dh = vaddvq_s32(ah);
    *dl = two ? vaddvq_s32(al) : 0;
}

/* The exp's polynomial on 4 lanes, the operations of i8a_exp_poly_scalar
 * (vfmaq_f32(c, a, b) = fma(a, b, c)). */
I8A_INLINE float32x4_t i8a_exp_poly4_neon(float32x4_t x, float32x4_t *n_out)
{
    const float32x4_t magic = vdupq_n_f32(I8A_EXP_MAGIC);
    x = vmaxq_f32(x, vdupq_n_f32(I8A_EXP_LO));
    float32x4_t n = vsubq_f32(vfmaq_f32(magic, x, vdupq_n_f32(I8A_LOG2E)), magic);
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-I8A_LN2_HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(-I8A_LN2_LO));
    float32x4_t z = vmulq_f32(r, r);
    float32x4_t y = vdupq_n_f32(I8A_EXP_P0);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P1), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P2), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P3), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P4), y, r);
    y = vfmaq_f32(vdupq_n_f32(I8A_EXP_P5), y, r);
    *n_out = n;
    return vfmaq_f32(r, y, z);
}

/* y * 2^n on 4 lanes (i8a_scale2n_scalar). */
I8A_INLINE float32x4_t i8a_scale2n4_neon(float32x4_t y, float32x4_t n)
{
    int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), e));
}

/* exp of 4 lanes, the operations of i8a_exp_scalar. */
I8A_INLINE float32x4_t i8a_exp4_neon(float32x4_t x)
{
    float32x4_t n;
    const float32x4_t y = i8a_exp_poly4_neon(x, &n);
    return i8a_scale2n4_neon(vaddq_f32(y, vdupq_n_f32(1.0f)), n);
}

/* expm1 of 4 lanes, the operations of i8a_expm1_scalar. */
I8A_INLINE float32x4_t i8a_expm1_4_neon(float32x4_t x)
{
    float32x4_t n;
    const float32x4_t y = i8a_exp_poly4_neon(x, &n), one = vdupq_n_f32(1.0f);
    const float32x4_t big = vsubq_f32(i8a_scale2n4_neon(vaddq_f32(y, one), n), one);
    return vbslq_f32(vceqq_f32(n, vdupq_n_f32(0.0f)), y, big);
}

/* i8a_softcap on 4 lanes (t >= +0, so the sign of u is or-ed in). */
I8A_INLINE float32x4_t i8a_softcap4_neon(float32x4_t l, float cap, float inv_cap)
{
    const float32x4_t u = vmulq_n_f32(l, inv_cap);
    const float32x4_t m = i8a_expm1_4_neon(vmulq_n_f32(vabsq_f32(u), -2.0f));
    const float32x4_t t = vdivq_f32(vabsq_f32(m), vaddq_f32(vdupq_n_f32(2.0f), m));
    const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(u), vdupq_n_u32(0x80000000u));
    return vmulq_n_f32(vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t), sign)), cap);
}

/* Four halves widened (exact). */
static inline float32x4_t i8a_halves4_neon(const uint16_t *h)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* The 16 lane sums of a[0..3] (lanes 4r .. 4r + 3 in a[r]) folded into one: lanes i + 8, then
 * i + 4, i + 2, i + 1 (the halving order of i8a_reduce_lanes). */
I8A_INLINE float i8a_fold16_neon(const float32x4_t a[4])
{
    const float32x4_t h = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
    const float32x2_t t = vadd_f32(vget_low_f32(h), vget_high_f32(h));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* p[s] = exp(p[s] - m) for s < n (in place, padding to a multiple of 16 left as zeros);
 * returns the 16-lane sum of common.h. */
I8A_INLINE float i8a_softmax_neon(float *p, size_t n, float m)
{
    const float32x4_t vm = vdupq_n_f32(m);
    const int32x4_t idx = {0, 1, 2, 3};
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (size_t s = 0; s < n; s += 16) {
        for (int b = 0; b < 4; b++) {
            uint32x4_t keep = vcgtq_s32(vdupq_n_s32((int32_t)(n - s) - 4 * b), idx);
            float32x4_t e = i8a_exp4_neon(vsubq_f32(vld1q_f32(p + s + 4 * b), vm));
            e = vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(e)));
            vst1q_f32(p + s + 4 * b, e);
            acc[b] = vaddq_f32(acc[b], e);
        }
    }
    return i8a_fold16_neon(acc);
}

/* Exact dots of every query head's planes with rows [0, n) of the chunk, four rows at a time
 * (the rows of a group stay in L1 while each head passes over them), with the given 16-byte
 * dot step; prefetches the next chunk's K one group of rows per group. */
I8A_INLINE void i8a_kdots_with_neon(i8a_dot16_neon_fn dot16, const i8a_query *q,
                                    const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        if (s < kv->next_n)
            i8a_prefetch_rows(kv->next_k + s * d, (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
        const int8_t *k = kv->k + s * d;
        for (size_t j = 0; j < q->nq; j++) {
            const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
            int32x4_t h0 = vdupq_n_s32(0), h1 = h0, h2 = h0, h3 = h0;
            int32x4_t l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            for (size_t i = 0; i < d; i += 16) {
                int8x16_t k0 = vld1q_s8(k + i), k1 = vld1q_s8(k + d + i);
                int8x16_t k2 = vld1q_s8(k + 2 * d + i), k3 = vld1q_s8(k + 3 * d + i);
                int8x16_t a = vld1q_s8(qh + i);
                h0 = dot16(h0, a, k0), h1 = dot16(h1, a, k1);
                h2 = dot16(h2, a, k2), h3 = dot16(h3, a, k3);
                if (two) {
                    int8x16_t b = vld1q_s8(ql + i);
                    l0 = dot16(l0, b, k0), l1 = dot16(l1, b, k1);
                    l2 = dot16(l2, b, k2), l3 = dot16(l3, b, k3);
                }
            }
            /* pairwise adds leave the four row sums in order */
            vst1q_s32(dh + j * I8A_CHUNK + s, vpaddq_s32(vpaddq_s32(h0, h1), vpaddq_s32(h2, h3)));
            if (two)
                vst1q_s32(dl + j * I8A_CHUNK + s, vpaddq_s32(vpaddq_s32(l0, l1), vpaddq_s32(l2, l3)));
        }
    }
    for (; s < n; s++)
        for (size_t j = 0; j < q->nq; j++)
            i8a_dot2_with_neon(dot16, q->q_hi + j * d, q->q_lo + j * d, kv->k + s * d, d, two,
                               dh + j * I8A_CHUNK + s, dl + j * I8A_CHUNK + s);
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, four at a time; returns max_s p[s]. */
I8A_INLINE float i8a_logits_neon(const int32_t *dh, const int32_t *dl, float c_hi, float c_lo,
                                 int two, float bias, float cap, float inv_cap, const float *ks,
                                 size_t n, float *p)
{
    float32x4_t vmax = vdupq_n_f32(-FLT_MAX);
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        float32x4_t lg = vmulq_n_f32(vcvtq_f32_s32(vld1q_s32(dh + s)), c_hi);
        if (two)
            lg = vfmaq_n_f32(lg, vcvtq_f32_s32(vld1q_s32(dl + s)), c_lo);
        lg = vaddq_f32(vmulq_f32(lg, vld1q_f32(ks + s)), vdupq_n_f32(bias));
        if (cap > 0.0f)
            lg = i8a_softcap4_neon(lg, cap, inv_cap);
        vst1q_f32(p + s, lg);
        vmax = vmaxq_f32(vmax, lg);
    }
    float m = vmaxvq_f32(vmax);
    for (; s < n; s++) {
        p[s] = i8a_logit_capped(dh[s], two ? dl[s] : 0, c_hi, c_lo, two, ks[s], bias, cap, inv_cap);
        m = p[s] > m ? p[s] : m;
    }
    return m;
}

/* A head's P planes from its weights w [round16(n)] (zeros past n; common.h's rule, 16 weights
 * at a time: floor (vrndm) and clamps on floats, each residual by one fused step (vfms: r - x
 * sc), the last plane's rint by vcvtn (nearest, ties to even), clamped as integers, narrowed to
 * bytes: the bytes of i8a_planes_scalar). */
I8A_INLINE void i8a_planes_neon(const float *w, size_t n, size_t lead, uint8_t *slot)
{
    float32x4_t most = vdupq_n_f32(0.0f);
    for (size_t s = 0; s < n; s += 4)
        most = vmaxq_f32(most, vld1q_f32(w + s));             /* the padding's zeros too */
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    const float lift = i8a_weight_scales(vmaxvq_f32(most), sc, inv);
    const float32x4_t zero_f = vdupq_n_f32(0.0f), most_f = vdupq_n_f32(127.0f);
    const int32x4_t zero = vdupq_n_s32(0), most_i = vdupq_n_s32(127);
    for (size_t s = 0; s < n; s += 16) {
        int32x4_t b[I8A_WPLANES][4];
        for (int u = 0; u < 4; u++) {
            float32x4_t r = vmulq_n_f32(vld1q_f32(w + s + 4 * u), lift);
            for (int k = 0; k < I8A_WPLANES - 1; k++) {
                float32x4_t x = vrndmq_f32(vmulq_n_f32(r, inv[k]));
                x = vminq_f32(vmaxq_f32(x, zero_f), most_f);
                r = vfmsq_n_f32(r, x, sc[k]);
                b[k][u] = vcvtq_s32_f32(x);
            }
            const int32x4_t l = vcvtnq_s32_f32(vmulq_n_f32(r, inv[I8A_WPLANES - 1]));
            b[I8A_WPLANES - 1][u] = vminq_s32(vmaxq_s32(l, zero), most_i);
        }
        for (int k = 0; k < I8A_WPLANES; k++) {
            const int16x8_t b01 = vcombine_s16(vmovn_s32(b[k][0]), vmovn_s32(b[k][1]));
            const int16x8_t b23 = vcombine_s16(vmovn_s32(b[k][2]), vmovn_s32(b[k][3]));
            vst1q_s8((int8_t *)slot + k * I8A_PLANE_BYTES + lead + s,
                     vcombine_s8(vmovn_s16(b01), vmovn_s16(b23)));
        }
    }
    i8a_planes_frame(slot, lead, n, sc, lift);
}

/* Four outputs from their planes' sums (common.h's i8a_v_out, four lanes). */
I8A_INLINE float32x4_t i8a_v_out4_neon(const int32x4_t sums[I8A_WPLANES],
                                       const float sc[I8A_WPLANES])
{
    float32x4_t r = vmulq_n_f32(vcvtq_f32_s32(sums[0]), sc[0]);
#pragma GCC unroll 8
    for (int k = 1; k < I8A_WPLANES; k++)
        r = vfmaq_n_f32(r, vcvtq_f32_s32(sums[k]), sc[k]);
    return r;
}

/* The integer V pass (common.h) without SDOT, NH heads over dims [i0, i0 + 4 nu): V bytes
 * times each head's plane word repeated in every lane (ld1r) by vmull_s8 for one tile and
 * vmlal_s8 for the next (two products per int16 lane, at most 2 * 127 * 127), vpadalq_s16
 * into int32 pairs of positions, a pairwise add per 4 dims at the end; then o from the three
 * sums. The first block prefetches pf_n rows of pf (the next chunk's V). NH and NU are
 * constants at every call. */
I8A_INLINE void
i8a_vtiles_block_neon(const uint8_t *const *planes, int nh, int nu, const int8_t *v,
                      size_t tiles, size_t d, size_t i0, float *o, const int8_t *pf, size_t pf_n)
{
    int32x4_t acc[2][I8A_WPLANES][2][2];    /* [head][plane][vector][dims 0-1, dims 2-3] */
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 8
            for (int u = 0; u < nu; u++)
                acc[h][k][u][0] = acc[h][k][u][1] = vdupq_n_s32(0);
    for (size_t t = 0; t < tiles; t += 2) {
        if (I8A_V_TILE * t < pf_n)
            i8a_prefetch_rows(pf + I8A_V_TILE * t * d, 2 * I8A_V_TILE * d);
        const int two = t + 1 < tiles;      /* the last tile of an odd count is alone */
        const int8_t *x0 = v + (t * d + i0) * I8A_V_TILE, *x1 = x0 + I8A_V_TILE * d;
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES; k++) {
                const uint8_t *pw = planes[h] + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                const int8x16_t w0 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
                const int8x16_t w1 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)(pw + 4)));
#pragma GCC unroll 8
                for (int u = 0; u < nu; u++) {
                    const int8x16_t a = vld1q_s8(x0 + 16 * u);
                    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(w0));
                    int16x8_t hi = vmull_high_s8(a, w0);
                    if (two) {
                        const int8x16_t b = vld1q_s8(x1 + 16 * u);
                        lo = vmlal_s8(lo, vget_low_s8(b), vget_low_s8(w1));
                        hi = vmlal_high_s8(hi, b, w1);
                    }
                    acc[h][k][u][0] = vpadalq_s16(acc[h][k][u][0], lo);
                    acc[h][k][u][1] = vpadalq_s16(acc[h][k][u][1], hi);
                }
            }
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int u = 0; u < nu; u++) {
            int32x4_t sums[I8A_WPLANES];
#pragma GCC unroll 8
            for (int k = 0; k < I8A_WPLANES; k++)
                sums[k] = vpaddq_s32(acc[h][k][u][0], acc[h][k][u][1]);
            vst1q_f32(o + h * d + i0 + 4 * u, i8a_v_out4_neon(sums, sc));
        }
    }
}

/* The neon tier's V pass over the nq heads of a chunk: pairs of heads 4 dims at a time, then a
 * head left alone 8 dims at a time (24 accumulators either way). The first block prefetches
 * the next chunk's V. d is a multiple of 16. */
I8A_INLINE void i8a_vpass_neon(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                               float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    size_t pf_n = kv->next_n, j = 0;
    for (; j + 2 <= nq; j += 2) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), i8a_planes_at(scratch, nq, j + 1)};
        for (size_t i = 0; i < d; i += 4, pf_n = 0)
            i8a_vtiles_block_neon(planes, 2, 1, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
    }
    if (j < nq) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), NULL};
        for (size_t i = 0; i < d; i += 8, pf_n = 0)
            i8a_vtiles_block_neon(planes, 1, 2, kv->v, tiles, d, i, o + j * d, kv->next_v, pf_n);
    }
}

typedef void (*i8a_vpass_neon_fn)(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                  float *o);

/* The attend of both aarch64 tiers; only the 16-byte dot step of K and the V pass differ. */
I8A_INLINE void i8a_attend_with_neon(i8a_dot16_neon_fn dot16, i8a_vpass_neon_fn vpass,
                                     const i8a_query *q, const i8a_span *kv, float *scratch,
                                     const i8a_state *out)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    /* dh in the second half of the scratch, dl in the first: head j's logits overwrite its
     * own dl element by element, each read before it is written, and its planes its dh */
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    i8a_kdots_with_neon(dot16, q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = i8a_logits_neon(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                        q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes,
                                        q->bias[j], q->softcap, q->inv_softcap, kv->ks, n, p);
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->m[j] = m;
        out->l[j] = i8a_softmax_neon(p, n, m);
        size_t s = 0;
        for (; s + 4 <= n; s += 4)
            vst1q_f32(p + s, vmulq_f32(vld1q_f32(p + s), vld1q_f32(kv->vs + s)));
        for (; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_neon(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
    }
    vpass(scratch, nq, kv, d, out->o);
}

static void i8a_attend_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                            const i8a_state *out)
{
    i8a_attend_with_neon(i8a_dot16_neon, i8a_vpass_neon, q, kv, scratch, out);
}

/* -- attend4: the sides at 4 bits (dispatch.h), for both aarch64 tiers ------------------- */

/* common.h's i8a_k4_query on 4 lanes: the steps and minima widened (exact), the planes' bytes
 * by vcvtn (nearest even) clamped as integers, the bias in dot16's order (four vectors of the
 * sixteen lanes, folded). */
I8A_INLINE void i8a_k4_query_neon(const float *qs, const uint16_t *h_min, float min_scale,
                                  const uint16_t *h_step, float step_scale, size_t d, int planes,
                                  int8_t *q, float *c, float *bias, float *r)
{
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    float32x4_t most = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < d; i += 16) {
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) {
            const float32x4_t x = vld1q_f32(qs + i + 4 * b);
            const float32x4_t y = vmulq_f32(x, vmulq_n_f32(i8a_halves4_neon(h_step + i + 4 * b), step_scale));
            vst1q_f32(r + i + 4 * b, y);
            most = vmaxq_f32(most, vabsq_f32(y));
            acc[b] = vaddq_f32(acc[b], vmulq_f32(x, i8a_halves4_neon(h_min + i + 4 * b)));
        }
    }
    float inv[I8A_K4_QPLANES];
    i8a_k4_scales(vmaxvq_f32(most), planes, c, inv);
    const int32x4_t lo = vdupq_n_s32(-127), hi = vdupq_n_s32(127);
    for (size_t i = 0; i < d; i += 8) {
        float32x4_t x0 = vld1q_f32(r + i), x1 = vld1q_f32(r + i + 4);
        for (int k = 0; k < planes; k++) {
            const int32x4_t b0 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(x0, inv[k])), lo), hi);
            const int32x4_t b1 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(x1, inv[k])), lo), hi);
            const int16x8_t b01 = vcombine_s16(vmovn_s32(b0), vmovn_s32(b1));
            vst1_s8(q + (size_t)k * I8A_MAX_HEAD_DIM + i, vmovn_s16(b01));
            x0 = vsubq_f32(x0, vmulq_n_f32(vcvtq_f32_s32(b0), c[k]));
            x1 = vsubq_f32(x1, vmulq_n_f32(vcvtq_f32_s32(b1), c[k]));
        }
    }
    *bias = i8a_fold16_neon(acc) * min_scale;
}

/* Exact dots of NP q planes ([NP][I8A_MAX_HEAD_DIM], natural order: a 16-byte block of a row
 * unpacks to channels 32 b .. + 15 in its low nibbles and 32 b + 16 .. + 31 in its high ones,
 * the planes' bytes at 32 b and 32 b + 16) with rows [0, n) of K at 4 bits, four rows at a
 * time, with the given 16-byte dot step: dot[k * I8A_K4_GROUP + s]. NP is a constant. */
I8A_INLINE void i8a_k4dots_with_neon(i8a_dot16_neon_fn dot16, const uint8_t *k4, size_t n,
                                     size_t d, const int8_t *planes, int np, int32_t *dot)
{
    const uint8x16_t nib = vdupq_n_u8(15);
    for (size_t s = 0; s < n; s += 4) {
        const uint8_t *r[4];
        for (int u = 0; u < 4; u++)
            r[u] = k4 + (s + (size_t)u < n ? s + (size_t)u : n - 1) * (d / 2);
        int32x4_t acc[4][I8A_K4_QPLANES];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
#pragma GCC unroll 3
            for (int k = 0; k < np; k++)
                acc[u][k] = vdupq_n_s32(0);
#pragma GCC unroll 1
        for (size_t j = 0; j < d / 2; j += 16) {     /* (unrolled, GCC 12 spills) */
            int8x16_t cl[4], ch[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const uint8x16_t x = vld1q_u8(r[u] + j);
                cl[u] = vreinterpretq_s8_u8(vandq_u8(x, nib));
                ch[u] = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
            }
#pragma GCC unroll 3
            for (int k = 0; k < np; k++) {
                const int8x16_t ql = vld1q_s8(planes + (size_t)k * I8A_MAX_HEAD_DIM + 2 * j);
                const int8x16_t qh = vld1q_s8(planes + (size_t)k * I8A_MAX_HEAD_DIM + 2 * j + 16);
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    acc[u][k] = dot16(dot16(acc[u][k], ql, cl[u]), qh, ch[u]);
            }
        }
#pragma GCC unroll 3
        for (int k = 0; k < np; k++) {
            int32_t four[4];      /* pairwise adds leave the four row sums in order */
            vst1q_s32(four, vpaddq_s32(vpaddq_s32(acc[0][k], acc[1][k]), vpaddq_s32(acc[2][k], acc[3][k])));
            for (size_t u = 0; u < 4 && s + u < n; u++)
                dot[(size_t)k * I8A_K4_GROUP + s + u] = four[u];
        }
    }
}

/* p [n] = i8a_logit4 of NP plane dots, four at a time (the rest one by one); returns their max
 * (-FLT_MAX for none). */
I8A_INLINE float i8a_logits4_neon(const int32_t *dot, const float *c, int np, float bias,
                                  float cap, float inv_cap, size_t n, float *p)
{
    float32x4_t vmax = vdupq_n_f32(-FLT_MAX);
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        float32x4_t lg = vmulq_n_f32(vcvtq_f32_s32(vld1q_s32(dot + s)), c[0]);
#pragma GCC unroll 3
        for (int k = 1; k < np; k++)
            lg = vfmaq_n_f32(lg, vcvtq_f32_s32(vld1q_s32(dot + (size_t)k * I8A_K4_GROUP + s)), c[k]);
        lg = vaddq_f32(lg, vdupq_n_f32(bias));
        if (cap > 0.0f)
            lg = i8a_softcap4_neon(lg, cap, inv_cap);
        vst1q_f32(p + s, lg);
        vmax = vmaxq_f32(vmax, lg);
    }
    float m = vmaxvq_f32(vmax);
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
I8A_INLINE float i8a_k4_logits_with_neon(i8a_dot16_neon_fn dot16, const i8a_query *q,
                                         const i8a_span *kv, size_t j, float *p, uint8_t *extra,
                                         int np)
{
    const size_t d = q->d, n = kv->n;
    int8_t *planes = (int8_t *)extra;
    float *r = (float *)(extra + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM);
    int32_t *dot = (int32_t *)(r + I8A_MAX_HEAD_DIM);
    float m = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query_neon(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                          kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c, &bias, r);
        if (j == 0 && s < kv->next_n)   /* the next chunk's K, a group's rows at a time */
            i8a_prefetch_rows(kv->next_k + s * (d / 2), (kv->next_n - s < rows ? kv->next_n - s : rows) * (d / 2));
        i8a_k4dots_with_neon(dot16, kv->k4 + s * (d / 2), rows, d, planes, np, dot);
        const float gm = i8a_logits4_neon(dot, c, np, bias, q->softcap, q->inv_softcap, rows, p + s);
        m = gm > m ? gm : m;
        s += rows;
    }
    return m;
}

/* The 16-lane sum (common.h's order) of p[s] * vmin[s] for s < n: V's minima at 4 bits. */
I8A_INLINE float i8a_vmin_sum_neon(const float *p, const float *vmin, size_t n)
{
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    size_t s = 0;
    for (; s + 4 <= n; s += 4)
        acc[s / 4 % 4] = vaddq_f32(acc[s / 4 % 4], vmulq_f32(vld1q_f32(p + s), vld1q_f32(vmin + s)));
    float lane[I8A_SUM_LANES];
    for (int b = 0; b < 4; b++)
        vst1q_f32(lane + 4 * b, acc[b]);
    for (; s < n; s++)
        lane[s % I8A_SUM_LANES] = lane[s % I8A_SUM_LANES] + p[s] * vmin[s];
    return i8a_reduce_lanes(lane);
}

/* The neon tier's V pass at 4 bits: codes unpacked to the int8 tile layout (a 16-byte load of
 * a tile's 32-dimension block: dimensions 32 b + 4 m .. + 3 in the low nibbles, 32 b + 16 + 4 m
 * .. + 3 in the high ones, m the load's place in the block), then SMULL and SMLAL over two
 * tiles, one head at a time, four loads (32 dimensions) a block; o = i8a_v_out(S) + the head's
 * vmin sum. */
I8A_INLINE void i8a_v4pass_neon(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const uint8x16_t nib = vdupq_n_u8(15);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        const float vmin = *i8a_vmin_sum_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t b = 0; b < d / I8A_NIB_BLOCK; b++) {
            for (size_t m = 0; m < 4; m += 2) {             /* two loads: 16 dimensions */
                int32x4_t acc[I8A_WPLANES][4][2];
#pragma GCC unroll 3
                for (int k = 0; k < I8A_WPLANES; k++)
#pragma GCC unroll 4
                    for (int u = 0; u < 4; u++)
                        acc[k][u][0] = acc[k][u][1] = vdupq_n_s32(0);
                for (size_t t = 0; t < tiles; t += 2) {
                    if (j == 0 && b == 0 && m == 0 && I8A_V_TILE * t < kv->next_n)
                        i8a_prefetch_rows(kv->next_v + t * 2 * d, 4 * d);   /* the next chunk's V */
                    const int two = t + 1 < tiles;
                    int8x16_t x0[4], x1[4];      /* [lo m, hi m, lo m+1, hi m+1] */
#pragma GCC unroll 2
                    for (int e = 0; e < 2; e++) {
                        const uint8_t *at = kv->v4 + t * 2 * d + 64 * b + 16 * (m + (size_t)e);
                        const uint8x16_t a = vld1q_u8(at);
                        x0[2 * e] = vreinterpretq_s8_u8(vandq_u8(a, nib));
                        x0[2 * e + 1] = vreinterpretq_s8_u8(vshrq_n_u8(a, 4));
                        const uint8x16_t c2 = two ? vld1q_u8(at + 2 * d) : vdupq_n_u8(0);
                        x1[2 * e] = vreinterpretq_s8_u8(vandq_u8(c2, nib));
                        x1[2 * e + 1] = vreinterpretq_s8_u8(vshrq_n_u8(c2, 4));
                    }
#pragma GCC unroll 3
                    for (int k = 0; k < I8A_WPLANES; k++) {
                        const uint8_t *pw = slot + k * I8A_PLANE_BYTES + I8A_V_TILE * t;
                        const int8x16_t w0 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)pw));
                        const int8x16_t w1 = vreinterpretq_s8_u32(vld1q_dup_u32((const uint32_t *)(pw + 4)));
#pragma GCC unroll 4
                        for (int u = 0; u < 4; u++) {
                            int16x8_t lo = vmull_s8(vget_low_s8(x0[u]), vget_low_s8(w0));
                            int16x8_t hi = vmull_high_s8(x0[u], w0);
                            lo = vmlal_s8(lo, vget_low_s8(x1[u]), vget_low_s8(w1));
                            hi = vmlal_high_s8(hi, x1[u], w1);
                            acc[k][u][0] = vpadalq_s16(acc[k][u][0], lo);
                            acc[k][u][1] = vpadalq_s16(acc[k][u][1], hi);
                        }
                    }
                }
                /* x0[u] covers dims: u even: 32 b + 4 (m + u/2) .., u odd: + 16 */
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) {
                    int32x4_t sums[I8A_WPLANES];
                    for (int k = 0; k < I8A_WPLANES; k++)
                        sums[k] = vpaddq_s32(acc[k][u][0], acc[k][u][1]);
                    const size_t dim = I8A_NIB_BLOCK * b + 4 * (m + (size_t)(u / 2)) + (u % 2 ? 16 : 0);
                    vst1q_f32(o + j * d + dim, vaddq_f32(i8a_v_out4_neon(sums, sc), vdupq_n_f32(vmin)));
                }
            }
        }
    }
}

/* attend4 of both aarch64 tiers (dispatch.h): K at 8 bits by attend's dots, at 4 bits group
 * by group with the given dot step; the softmax, V's minima, the planes; the V pass of the
 * side's width (vpass8, vpass4: the tier's). */
I8A_INLINE void i8a_attend4_with_neon(i8a_dot16_neon_fn dot16, i8a_vpass_neon_fn vpass8,
                                      i8a_vpass_neon_fn vpass4, const i8a_query *q,
                                      const i8a_span *kv, float *scratch, const i8a_state *out,
                                      const int k4, const int v4)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    if (!k4)
        i8a_kdots_with_neon(dot16, q, kv, dh, dl);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m;
        if (!k4)
            m = i8a_logits_neon(dh + j * I8A_CHUNK, dl + j * I8A_CHUNK, q->c_hi[j],
                                q->two_planes ? q->c_lo[j] : 0.0f, q->two_planes, q->bias[j],
                                q->softcap, q->inv_softcap, kv->ks, n, p);
        else if (q->two_planes)
            m = i8a_k4_logits_with_neon(dot16, q, kv, j, p, extra, I8A_K4_QPLANES);
        else
            m = i8a_k4_logits_with_neon(dot16, q, kv, j, p, extra, 1);
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->m[j] = m;
        out->l[j] = i8a_softmax_neon(p, n, m);
        if (v4)
            *i8a_vmin_sum_at(scratch, nq, j) = i8a_vmin_sum_neon(p, kv->v4_min, n);
        size_t s = 0;
        for (; s + 4 <= n; s += 4)
            vst1q_f32(p + s, vmulq_f32(vld1q_f32(p + s), vld1q_f32(kv->vs + s)));
        for (; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_neon(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
    }
    (v4 ? vpass4 : vpass8)(scratch, nq, kv, d, out->o);
}

static void i8a_attend_k8v4_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon, i8a_vpass_neon, i8a_v4pass_neon, q, kv, scratch, out,
                          0, 1);
}

static void i8a_attend_k4v8_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon, i8a_vpass_neon, i8a_v4pass_neon, q, kv, scratch, out,
                          1, 0);
}

static void i8a_attend_k4v4_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out)
{
    i8a_attend4_with_neon(i8a_dot16_neon, i8a_vpass_neon, i8a_v4pass_neon, q, kv, scratch, out,
                          1, 1);
}

static void i8a_merge_neon(const i8a_state *run, const i8a_state *chunk, size_t d)
{
    float a, b;
    i8a_merge_head(run, chunk, &a, &b);
    float *ro = run->o;
    const float *co = chunk->o;
    for (size_t i = 0; i < d; i += 4)
        vst1q_f32(ro + i, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(ro + i), a), vld1q_f32(co + i), b));
}

static uint64_t i8a_stream_neon(const void *p, size_t bytes, const void *next)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64x2_t x0 = vdupq_n_u64(0), x1 = x0, x2 = x0, x3 = x0;
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
        if (next)
            i8a_prefetch_rows((const char *)next + i, 64);
        x0 = veorq_u64(x0, vreinterpretq_u64_u8(vld1q_u8(b + i)));
        x1 = veorq_u64(x1, vreinterpretq_u64_u8(vld1q_u8(b + i + 16)));
        x2 = veorq_u64(x2, vreinterpretq_u64_u8(vld1q_u8(b + i + 32)));
        x3 = veorq_u64(x3, vreinterpretq_u64_u8(vld1q_u8(b + i + 48)));
    }
    uint64x2_t x = veorq_u64(veorq_u64(x0, x1), veorq_u64(x2, x3));
    return vgetq_lane_u64(x, 0) ^ vgetq_lane_u64(x, 1) ^ i8a_fold_tail(b + i, bytes - i);
}

/* The rotation of common.h, stage by stage the same additions and subtractions. A group of
 * N registers (N * 4 floats, N = 4, 8, 16) goes through every stage below N * 4 without leaving
 * registers: h = 1, 2 inside each register (the partner by vrev64q / vextq; lanes with bit h
 * set take partner - self, the others self + partner), then h = 4 .. between registers. Wider
 * stages (blocks over 64) are common.h's passes over memory. */
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

/* A row into the window's halves (dispatch.h): the largest |x| by vector max (exact in any
 * order), then fcvtn, IEEE nearest-even (FPCR's default mode) like i8a_half_bits. */
static float i8a_half_row_neon(const float *x, size_t d, uint16_t *h)
{
    float32x4_t most = vdupq_n_f32(0.0f);
    for (size_t i = 0; i < d; i += 4)
        most = vmaxq_f32(most, vabsq_f32(vld1q_f32(x + i)));
    const float top = vmaxvq_f32(most);
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const float32x4_t down = vdupq_n_f32(ldexpf(1.0f, -e));
    for (size_t i = 0; i < d; i += 4)
        vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vmulq_f32(vld1q_f32(x + i), down))));
    return ldexpf(1.0f, e);
}

/* The recent window's two loops (common.h's order), halves widened by fcvtl (exact); a lane
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
