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

#if defined(__GNUC__) || defined(__clang__)
#define I8A_INLINE static inline __attribute__((always_inline))
#else
#define I8A_INLINE static inline
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

#endif

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
I8A_INLINE void i8a_dot2_neon_with(i8a_dot16_neon_fn dot16, const int8_t *qh, const int8_t *ql,
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

static void i8a_dots_neon(const int8_t *q, const int8_t *k, size_t n, size_t d, int32_t *out)
{
    int32_t unused;
    for (size_t s = 0; s < n; s++)
        i8a_dot2_neon_with(i8a_dot16_neon, q, q, k + s * d, d, 0, out + s, &unused);
}

/* exp of 4 lanes, the operations of i8a_exp_scalar (vfmaq_f32(c, a, b) = fma(a, b, c)). */
I8A_INLINE float32x4_t i8a_exp4_neon(float32x4_t x)
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
    y = vfmaq_f32(r, y, z);
    y = vaddq_f32(y, vdupq_n_f32(1.0f));
    int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), e));
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
    /* lanes i + 8, then i + 4, i + 2, i + 1: the halving order of i8a_reduce_lanes */
    float32x4_t h = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3]));
    float32x2_t t = vadd_f32(vget_low_f32(h), vget_high_f32(h));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* o[0..d) = sum_s w[s] * v[s][.] in token order (fused), d a multiple of 16. */
I8A_INLINE void i8a_accumulate_v_neon(const float *w, const int8_t *v, size_t n, size_t d, float *o)
{
    size_t i = 0;
    for (; i + 64 <= d; i += 64) {
        float32x4_t a[16];
        for (int b = 0; b < 16; b++)
            a[b] = vdupq_n_f32(0.0f);
        for (size_t s = 0; s < n; s++) {
            const int8_t *vr = v + s * d + i;
            for (int c = 0; c < 4; c++) {
                int8x16_t x = vld1q_s8(vr + 16 * c);
                int16x8_t x0 = vmovl_s8(vget_low_s8(x)), x1 = vmovl_s8(vget_high_s8(x));
                a[4 * c + 0] = vfmaq_n_f32(a[4 * c + 0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(x0))), w[s]);
                a[4 * c + 1] = vfmaq_n_f32(a[4 * c + 1], vcvtq_f32_s32(vmovl_s16(vget_high_s16(x0))), w[s]);
                a[4 * c + 2] = vfmaq_n_f32(a[4 * c + 2], vcvtq_f32_s32(vmovl_s16(vget_low_s16(x1))), w[s]);
                a[4 * c + 3] = vfmaq_n_f32(a[4 * c + 3], vcvtq_f32_s32(vmovl_s16(vget_high_s16(x1))), w[s]);
            }
        }
        for (int b = 0; b < 16; b++)
            vst1q_f32(o + i + 4 * b, a[b]);
    }
    for (; i < d; i += 16) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (size_t s = 0; s < n; s++) {
            int8x16_t x = vld1q_s8(v + s * d + i);
            int16x8_t x0 = vmovl_s8(vget_low_s8(x)), x1 = vmovl_s8(vget_high_s8(x));
            a0 = vfmaq_n_f32(a0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(x0))), w[s]);
            a1 = vfmaq_n_f32(a1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(x0))), w[s]);
            a2 = vfmaq_n_f32(a2, vcvtq_f32_s32(vmovl_s16(vget_low_s16(x1))), w[s]);
            a3 = vfmaq_n_f32(a3, vcvtq_f32_s32(vmovl_s16(vget_high_s16(x1))), w[s]);
        }
        vst1q_f32(o + i, a0);
        vst1q_f32(o + i + 4, a1);
        vst1q_f32(o + i + 8, a2);
        vst1q_f32(o + i + 12, a3);
    }
}

/* The attend of both aarch64 tiers; only the 16-byte dot step differs. */
I8A_INLINE void i8a_attend_neon_with(i8a_dot16_neon_fn dot16, const i8a_query *q,
                                     const i8a_span *kv, float *scratch, const i8a_state *out)
{
    const size_t d = q->d, n = kv->n;
    for (size_t j = 0; j < q->nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        float m = 0.0f;
        for (size_t s = 0; s < n; s++) {
            int32_t dh, dl;
            i8a_dot2_neon_with(dot16, q->q_hi + j * d, q->q_lo + j * d, kv->k + s * d, d,
                               q->two_planes, &dh, &dl);
            float lg = i8a_logit(dh, dl, q->c_hi[j], q->c_lo[j], q->two_planes, kv->ks[s]);
            p[s] = lg;
            m = (s == 0 || lg > m) ? lg : m;
        }
        for (size_t s = n; s < i8a_round16(n); s++)
            p[s] = 0.0f;
        out->l[j] = i8a_softmax_neon(p, n, m);
        out->m[j] = m;
        for (size_t s = 0; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_accumulate_v_neon(p, kv->v, n, d, out->o + j * d);
    }
}

static void i8a_attend_neon(const i8a_query *q, const i8a_span *kv, float *scratch,
                            const i8a_state *out)
{
    i8a_attend_neon_with(i8a_dot16_neon, q, kv, scratch, out);
}

static void i8a_merge_neon(const i8a_state *run, const i8a_state *chunk, size_t nq, size_t d)
{
    for (size_t j = 0; j < nq; j++) {
        float a, b;
        i8a_merge_head(run, chunk, j, &a, &b);
        float *ro = run->o + j * d;
        const float *co = chunk->o + j * d;
        for (size_t i = 0; i < d; i += 4)
            vst1q_f32(ro + i, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(ro + i), a), vld1q_f32(co + i), b));
    }
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

#endif
