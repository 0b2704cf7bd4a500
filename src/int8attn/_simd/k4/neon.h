/* k4/neon.h: K at 4 bits: each group's q planes, the nibble dots, the logits; the neon tier's,
 * bit for bit k4/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline: no target
 * pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_K4_NEON_H
#define I8A_K4_NEON_H

#ifndef I8A_NEON_H
#error "k4/neon.h is included by ../neon.h only"
#endif

/* k4/scalar.h's i8a_k4_query on 4 lanes: the steps and minima widened (exact), the planes' bytes
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

/* k4/scalar.h's i8a_k4_wide_planes, its bytes in the order i8a_k4_bits16_neon's lanes take:
 * in each 16 ranks 16 c .. 16 c + 15, byte 2 t holds rank 16 c + t and byte 2 t + 1 rank
 * 16 c + 8 + t (t < 8). The parities of 8 steps at a time make a mask byte, limited
 * (i8a_k4_wide_limit); each plane's 8 bytes are packed by vtbl1 (i8a_k4_pack8) and stored at
 * the count so far (the next store, or the zeros after, overwrite the bytes past it:
 * I8A_K4_WIDE_STRIDE leaves room); then each 16 interleaved. Returns the count. */
static inline size_t i8a_k4_wide_planes_neon(const uint16_t *h_step, size_t d,
                                             const int8_t *planes, int np, int8_t *pw)
{
    const uint8x8_t bit = vcreate_u8(0x8040201008040201ull);
    uint8_t mask[I8A_MAX_HEAD_DIM / 8];
    for (size_t i = 0; i < d; i += 8) {
        const uint8x8_t odd = vmovn_u16(vandq_u16(vld1q_u16(h_step + i), vdupq_n_u16(1)));
        mask[i / 8] = vaddv_u8(vmul_u8(odd, bit));
    }
    i8a_k4_wide_limit(mask, d);
    size_t r = 0;
    for (size_t i = 0; i < d; i += 8) {
        const int8x8_t sh = vcreate_s8(i8a_k4_pack8(mask[i / 8]));
        for (int k = 0; k < np; k++)
            vst1_s8(pw + (size_t)k * I8A_K4_WIDE_STRIDE + r,
                    vtbl1_s8(vld1_s8(planes + (size_t)k * I8A_MAX_HEAD_DIM + i), sh));
        r += i8a_popcount8(mask[i / 8]);
    }
    i8a_k4_wide_pad(pw, np, r, d);
    for (int k = 0; k < np; k++) {
        int8_t *w = pw + (size_t)k * I8A_K4_WIDE_STRIDE;
        for (size_t c = 0; c < d / 2; c += 16) {
            const int8x16_t x = vld1q_s8(w + c);
            vst1q_s8(w + c, vzip1q_s8(x, vextq_s8(x, x, 8)));
        }
    }
    return r;
}

/* 16 fifth bits of a K row (two bytes at b) as 16 bytes, 16 for a set bit and 0 for a clear
 * one, interleaved: lane 2 t bit t of byte 0, lane 2 t + 1 bit t of byte 1. */
static inline int8x16_t i8a_k4_bits16_neon(const uint8_t *b)
{
    uint16_t two;
    memcpy(&two, b, sizeof two);
    const uint8x16_t x = vreinterpretq_u8_u16(vdupq_n_u16(two));     /* b0 b1 b0 b1 .. */
    const uint8x16_t bit = vcombine_u8(vcreate_u8(0x0808040402020101ull),
                                       vcreate_u8(0x8080404020201010ull));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(x, bit), vdupq_n_u8(16)));
}

/* Exact dots of NP q planes ([NP][I8A_MAX_HEAD_DIM], natural order: a 16-byte block of a row
 * unpacks to channels 32 b .. + 15 in its low nibbles and 32 b + 16 .. + 31 in its high ones,
 * the planes' bytes at 32 b and 32 b + 16) with rows [0, n) of K at 4 bits, four rows at a
 * time, with the given 16-byte dot step: dot[k * I8A_K4_GROUP + s]. With `wide` (the rows' fifth
 * bits, I8A_K4_WIDE_BYTES(d) a row; pw: i8a_k4_wide_planes_neon, interleaved as
 * i8a_k4_bits16_neon's lanes), the same 16 bytes' ranks (16 b .. 16 b + 15) add the dot of
 * their bits as 16 or 0 with the wide channels' plane bytes (products of at most 16 * 127).
 * NP is a constant. */
I8A_INLINE void i8a_k4dots_with_neon(i8a_dot16_neon_fn dot16, const uint8_t *k4,
                                     const uint8_t *wide, size_t n, size_t d,
                                     const int8_t *planes, const int8_t *pw, int np, int32_t *dot)
{
    const uint8x16_t nib = vdupq_n_u8(15);
    const size_t nb = I8A_K4_WIDE_BYTES(d);
    for (size_t s = 0; s < n; s += 4) {
        size_t row[4];
        for (int u = 0; u < 4; u++)
            row[u] = s + (size_t)u < n ? s + (size_t)u : n - 1;
        int32x4_t acc[4][I8A_K4_QPLANES];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
#pragma GCC unroll 3
            for (int k = 0; k < np; k++)
                acc[u][k] = vdupq_n_s32(0);
#pragma GCC unroll 1
        for (size_t j = 0; j < d / 2; j += 16) {     /* (unrolled, GCC 12 spills) */
            int8x16_t cl[4], ch[4], e[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const uint8x16_t x = vld1q_u8(k4 + row[u] * (d / 2) + j);
                cl[u] = vreinterpretq_s8_u8(vandq_u8(x, nib));
                ch[u] = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
                e[u] = wide ? i8a_k4_bits16_neon(wide + row[u] * nb + j / 8) : vdupq_n_s8(0);
            }
#pragma GCC unroll 3
            for (int k = 0; k < np; k++) {
                const int8x16_t ql = vld1q_s8(planes + (size_t)k * I8A_MAX_HEAD_DIM + 2 * j);
                const int8x16_t qh = vld1q_s8(planes + (size_t)k * I8A_MAX_HEAD_DIM + 2 * j + 16);
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    acc[u][k] = dot16(dot16(acc[u][k], ql, cl[u]), qh, ch[u]);
                if (wide) {
                    const int8x16_t w = vld1q_s8(pw + (size_t)k * I8A_K4_WIDE_STRIDE + j);
#pragma GCC unroll 4
                    for (int u = 0; u < 4; u++)
                        acc[u][k] = dot16(acc[u][k], w, e[u]);
                }
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
    int8_t pw[I8A_K4_QPLANES * I8A_K4_WIDE_STRIDE];    /* the wide channels' planes */
    float m = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query_neon(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                          kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c, &bias, r);
        if (j == 0)   /* the next chunk's K, a group's rows at a time */
            i8a_k4_prefetch_group(kv, s, rows, d);
        /* two calls: the pass inlined with its fifth bits and without (a NULL constant) */
        if (i8a_k4_wide_planes_neon(kv->k4_step + grp * d, d, planes, np, pw))
            i8a_k4dots_with_neon(dot16, kv->k4 + s * (d / 2), kv->k4_wide + s * I8A_K4_WIDE_BYTES(d),
                                 rows, d, planes, pw, np, dot);
        else
            i8a_k4dots_with_neon(dot16, kv->k4 + s * (d / 2), NULL, rows, d, planes, pw, np, dot);
        const float gm = i8a_logits4_neon(dot, c, np, bias, q->softcap, q->inv_softcap, rows, p + s);
        m = gm > m ? gm : m;
        s += rows;
    }
    return m;
}

#endif
