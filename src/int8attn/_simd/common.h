/* Shared scalar pieces of the math contract: the row quantizer's scale rule, the exp polynomial,
 * and the 16-lane order of the softmax sum. Every tier reproduces these operation by operation
 * (the whole module is compiled with -ffp-contract=off: an FMA happens only where one is written),
 * so every tier returns the same bits as the scalar tier.
 */
#ifndef I8A_COMMON_H
#define I8A_COMMON_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dispatch.h"

/* Helpers whose constant arguments (head counts, block widths, the dot step) must fold: forced
 * inline so each call site compiles to its own register-blocked loop. */
#if defined(__GNUC__) || defined(__clang__)
#define I8A_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define I8A_INLINE static __forceinline
#else
#define I8A_INLINE static inline
#endif

/* n rounded up to a multiple of 16: the SIMD tiers work on the logit scratch in groups of 16
 * tokens (the padding is written as zeros and masked out of the sum), and on the P planes in
 * 16-byte vectors. */
static inline size_t i8a_round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Rows whose absmax is below this are stored as zeros with scale 0: below it 127/absmax would
 * leave float range. 2^-100 (7.9e-31) is far below any activation that matters. */
#define I8A_ABSMAX_MIN 7.88860905e-31f

/* The quantizer's two scales: scale = absmax / 127 (stored), inv = 127 / absmax (applied).
 * Returns 0 for a row that stores as zeros (scale 0), 1 otherwise. */
static inline int i8a_row_scales(float absmax, float *scale, float *inv)
{
    if (!(absmax >= I8A_ABSMAX_MIN)) {
        *scale = 0.0f;
        *inv = 0.0f;
        return 0;
    }
    *scale = absmax / 127.0f;
    *inv = 127.0f / absmax;
    return 1;
}

/* The end of every tier's quantizer scan: folds elements [i, d) into the absmax and finiteness
 * found so far, then sets the scales. Returns -1 for a row with a NaN or an Inf, 0 for a row
 * stored as zeros (nothing left to do), 1 when the codes remain to be computed with *inv. */
static inline int i8a_row_prepare(const float *x, size_t i, size_t d, float absmax, int finite,
                                  int8_t *codes, float *scale, float *inv)
{
    for (; i < d; i++) {
        float a = fabsf(x[i]);
        finite &= a <= FLT_MAX;          /* false for +inf and for NaN */
        absmax = a > absmax ? a : absmax;
    }
    if (!finite)
        return -1;
    if (!i8a_row_scales(absmax, scale, inv)) {
        memset(codes, 0, d);
        return 0;
    }
    return 1;
}

/* One element of the quantizer: clamp(round_half_even(x * inv), -127, 127). */
static inline int8_t i8a_quantize_one(float x, float inv)
{
    float r = rintf(x * inv);
    r = r > 127.0f ? 127.0f : r;
    r = r < -127.0f ? -127.0f : r;
    return (int8_t)r;
}

/* exp(x) for x <= 0, the contract's polynomial (Cephes' expf coefficients):
 *   x = max(x, I8A_EXP_LO); n = round(x * log2 e) by the 1.5 * 2^23 trick, fused;
 *   r = x - n * ln2 (two fused steps, ln2 split hi + lo);
 *   y = ((((P0 r + P1) r + P2) r + P3) r + P4) r + P5  (fused Horner);
 *   y = y * r^2 + r (fused); y = y + 1; result = y * 2^n (added to the exponent bits).
 * exp(0) is exactly 1: n = 0, r = 0, y = 1. Inputs below I8A_EXP_LO give exp(I8A_EXP_LO),
 * about 1.6e-38, which keeps 2^n normal and is nothing next to the softmax sum (>= 1). */
#define I8A_EXP_LO (-87.0f)
#define I8A_EXP_MAGIC 12582912.0f
#define I8A_LOG2E 1.44269504088896341f
#define I8A_LN2_HI 0.693359375f
#define I8A_LN2_LO (-2.12194440e-4f)
#define I8A_EXP_P0 1.9875691500e-4f
#define I8A_EXP_P1 1.3981999507e-3f
#define I8A_EXP_P2 8.3334519073e-3f
#define I8A_EXP_P3 4.1665795894e-2f
#define I8A_EXP_P4 1.6666665459e-1f
#define I8A_EXP_P5 5.0000001201e-1f

/* The polynomial part of the exp: x = n ln2 + r, returns y = expm1(r) (before the "+ 1") and
 * sets *n. */
static inline float i8a_exp_poly_scalar(float x, float *n_out)
{
    x = x > I8A_EXP_LO ? x : I8A_EXP_LO;
    float n = fmaf(x, I8A_LOG2E, I8A_EXP_MAGIC) - I8A_EXP_MAGIC;
    float r = fmaf(n, -I8A_LN2_HI, x);
    r = fmaf(n, -I8A_LN2_LO, r);
    float z = r * r;
    float y = I8A_EXP_P0;
    y = fmaf(y, r, I8A_EXP_P1);
    y = fmaf(y, r, I8A_EXP_P2);
    y = fmaf(y, r, I8A_EXP_P3);
    y = fmaf(y, r, I8A_EXP_P4);
    y = fmaf(y, r, I8A_EXP_P5);
    *n_out = n;
    return fmaf(y, z, r);
}

/* y * 2^n for integral n with 2^n normal, by adding n to the exponent bits. */
static inline float i8a_scale2n_scalar(float y, float n)
{
    int32_t bits;
    memcpy(&bits, &y, sizeof bits);
    bits += (int32_t)n * (1 << 23);
    memcpy(&y, &bits, sizeof y);
    return y;
}

static inline float i8a_exp_scalar(float x)
{
    float n;
    const float y = i8a_exp_poly_scalar(x, &n);
    return i8a_scale2n_scalar(y + 1.0f, n);
}

/* exp(x) - 1 for x <= 0 without cancellation near 0: the polynomial's own expm1(r) when n = 0
 * (|x| below about ln2 / 2, where r = x exactly), else exp(x) - 1 from the same steps. */
static inline float i8a_expm1_scalar(float x)
{
    float n;
    const float y = i8a_exp_poly_scalar(x, &n);
    return n == 0.0f ? y : i8a_scale2n_scalar(y + 1.0f, n) - 1.0f;
}

/* The softmax sum of a chunk: p[s] goes to lane s % 16 (each lane sums in token order), then
 * the lanes reduce by halving: for w = 8, 4, 2, 1: lane[i] = lane[i] + lane[i + w]. */
#define I8A_SUM_LANES 16

static inline float i8a_reduce_lanes(float lane[I8A_SUM_LANES])
{
    for (int w = I8A_SUM_LANES / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            lane[i] = lane[i] + lane[i + w];
    return lane[0];
}

/* The logit of one token, both q precisions:
 *   q_bits=16: fma(float(dot_lo), c_lo, float(dot_hi) * c_hi) * k_scale
 *   q_bits=8:  (float(dot_hi) * c_hi) * k_scale
 * The dots are exact (|dot| < 2^24, so the conversions are exact too). */
static inline float i8a_logit(int32_t dh, int32_t dl, float c_hi, float c_lo, int two, float ks)
{
    float hi = (float)dh * c_hi;
    return (two ? fmaf((float)dl, c_lo, hi) : hi) * ks;
}

/* The V pass in integers. A chunk's weights w[s] = p[s] * v_scale[s] (>= 0, finite) become
 * three planes of 7-bit unsigned integers, each plane 127 times finer than the one before, and
 * the sum over the chunk's positions is then an exact integer dot per plane and dimension:
 *   top = the largest w[s]; 0: every plane is 0 (scales 0: o = 0);
 *   lift = 2^100 if top < 2^-100, else 1; every w[s] and top are first multiplied by lift
 *   (exact: w * 2^100 < 1 loses no bit, subnormal w included);
 *   sc[0] = top / 127, sc[k] = sc[k-1] / 127;  inv[0] = 127 / top, inv[k] = inv[k-1] * 127;
 *   b0 = min(floor(w * inv[0]), 127);           r = fma(-b0, sc[0], w);
 *   b1 = clamp(floor(r * inv[1]), 0, 127);      r = fma(-b1, sc[1], r);
 *   b2 = clamp(rint(r * inv[2]), 0, 127);
 *   S_k[i] = sum_s b_k[s] * v[s][i], in int32 (exact: |S| <= 256 * 127 * 127 < 2^23, so float(S)
 *   is exact too, and any order of the sum gives the same S);
 *   o[i] = fma(float(S_2[i]), sc[2], fma(float(S_1[i]), sc[1], float(S_0[i]) * sc[0])).
 * sum_k b_k * sc[k] is w to within top / (2 * 127^3) (about top / 4.1e6): the floors leave
 * residuals below their plane's step, which the last plane rounds. Two planes (within top /
 * 32258) were not enough: with one token far above the rest of its chunk (an attention sink)
 * the many small weights round to the same few steps, and Gemma 3's attention at 2575 tokens
 * came out 1.4e-3 off. 7 bits a plane, not 8: SDOT multiplies signed bytes, and vpmaddubsw adds
 * two products in int16 (2 * 127 * 127 = 32258 fits, 2 * 255 * 127 does not). With top (after
 * the lift) in [2^-100, 2^64 * 127], sc[2] is a normal float (2^-100 / 127^3 > 2^-121) and
 * inv[2] finite; the planes' scales are stored divided by lift (exact unless they fall below
 * 2^-126, where a scale keeps its absolute error under 2^-150), so V rows near the quantizer's
 * smallest absmax (2^-100) keep their relative accuracy. */
#define I8A_WPLANES 3
#define I8A_WEIGHT_LIFT_BELOW 0x1p-100f
#define I8A_WEIGHT_LIFT 0x1p100f

/* Where head j of nq keeps its planes in an attend's scratch (dispatch.h: 2 * nq * I8A_CHUNK
 * floats): in the second half, the 4 * I8A_CHUNK bytes of its K dots, which its logits have
 * consumed by then: plane 0, 1, 2 [I8A_PLANE_BYTES each], then the planes' scales (floats). A
 * plane's byte v_lead + s is row s's weight (the slot of the row in the V tiles); the bytes
 * before v_lead and after the last row, up to a multiple of 16, are 0. */
#define I8A_PLANE_BYTES 320
_Static_assert(I8A_WPLANES * (I8A_PLANE_BYTES + sizeof(float)) + sizeof(float) <= 4 * I8A_CHUNK,
               "a head's planes, their scales and attend4's vmin sum fit the bytes of its K dots");

static inline uint8_t *i8a_planes_at(float *scratch, size_t nq, size_t j)
{
    return (uint8_t *)(scratch + (nq + j) * I8A_CHUNK);
}

/* The scales of a chunk's planes in the lifted weights' terms (the rule above); all 0 when it
 * has none, which makes every plane byte 0 by the same steps. Returns lift. */
static inline float i8a_weight_scales(float top, float sc[I8A_WPLANES], float inv[I8A_WPLANES])
{
    if (!(top > 0.0f)) {
        for (int k = 0; k < I8A_WPLANES; k++)
            sc[k] = inv[k] = 0.0f;
        return 1.0f;
    }
    const float lift = top < I8A_WEIGHT_LIFT_BELOW ? I8A_WEIGHT_LIFT : 1.0f;
    top *= lift;
    sc[0] = top / 127.0f;
    inv[0] = 127.0f / top;
    for (int k = 1; k < I8A_WPLANES; k++) {
        sc[k] = sc[k - 1] / 127.0f;
        inv[k] = inv[k - 1] * 127.0f;
    }
    return lift;
}

/* x clamped to [0, 127] (x not NaN). */
static inline float i8a_clamp127(float x)
{
    x = x > 0.0f ? x : 0.0f;
    return x < 127.0f ? x : 127.0f;
}

/* The plane bytes of one weight (the rule above). */
static inline void i8a_weight_one(float w, const float sc[I8A_WPLANES],
                                  const float inv[I8A_WPLANES], uint8_t b[I8A_WPLANES])
{
    float r = w;
    for (int k = 0; k < I8A_WPLANES - 1; k++) {
        const float x = i8a_clamp127(floorf(r * inv[k]));
        r = fmaf(-x, sc[k], r);
        b[k] = (uint8_t)x;
    }
    b[I8A_WPLANES - 1] = (uint8_t)i8a_clamp127(rintf(r * inv[I8A_WPLANES - 1]));
}

/* The zeros of a head's planes around rows [lead, lead + n) (the layout above); the scales
 * sc / lift (the weights' own terms). */
static inline void i8a_planes_frame(uint8_t *slot, size_t lead, size_t n,
                                    const float sc[I8A_WPLANES], float lift)
{
    float out[I8A_WPLANES];
    for (int k = 0; k < I8A_WPLANES; k++)
        out[k] = sc[k] / lift;
    const size_t end = i8a_round16(lead + n);
    for (int k = 0; k < I8A_WPLANES; k++) {
        uint8_t *plane = slot + k * I8A_PLANE_BYTES;
        memset(plane, 0, lead);
        memset(plane + lead + n, 0, end - lead - n);
    }
    memcpy(slot + I8A_WPLANES * I8A_PLANE_BYTES, out, I8A_WPLANES * sizeof(float));
}

/* A head's planes from its weights w [n] (the scalar form; the SIMD tiers write the same
 * bytes). */
static inline void i8a_planes_scalar(const float *w, size_t n, size_t lead, uint8_t *slot)
{
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    float top = 0.0f;
    for (size_t s = 0; s < n; s++)
        top = w[s] > top ? w[s] : top;
    const float lift = i8a_weight_scales(top, sc, inv);
    for (size_t s = 0; s < n; s++) {
        uint8_t b[I8A_WPLANES];
        i8a_weight_one(w[s] * lift, sc, inv, b);
        for (int k = 0; k < I8A_WPLANES; k++)
            slot[k * I8A_PLANE_BYTES + lead + s] = b[k];
    }
    i8a_planes_frame(slot, lead, n, sc, lift);
}

/* The scales of head j's planes. */
static inline void i8a_planes_scales(const uint8_t *slot, float sc[I8A_WPLANES])
{
    memcpy(sc, slot + I8A_WPLANES * I8A_PLANE_BYTES, I8A_WPLANES * sizeof(float));
}

/* One output value from its three integer sums (the rule above). */
static inline float i8a_v_out(const int32_t S[I8A_WPLANES], const float sc[I8A_WPLANES])
{
    return fmaf((float)S[2], sc[2], fmaf((float)S[1], sc[1], (float)S[0] * sc[0]));
}

/* The V tiles a span reads: ceil((v_lead + n) / 4). */
static inline size_t i8a_v_tiles(size_t lead, size_t n)
{
    return (lead + n + I8A_V_TILE - 1) / I8A_V_TILE;
}

/* The logit soft cap (Gemma 2): cap * tanh(logit / cap), tanh from the contract's expm1, which
 * keeps full precision for logits far below the cap (no 1 - e cancellation):
 *   u = logit * inv_cap;  m = expm1(|u| * -2) (in [-1, 0]);  t = |m| / (2 + m) (>= +0);
 *   t takes u's sign;  result = cap * t.  Every tier does these operations in this order. */
static inline float i8a_softcap(float logit, float cap, float inv_cap)
{
    const float u = logit * inv_cap;
    const float m = i8a_expm1_scalar(fabsf(u) * -2.0f);
    const float t = fabsf(m) / (2.0f + m);
    return cap * copysignf(t, u);
}

/* The random-sign Walsh-Hadamard rotation of a row of d floats, from `in` into x (x may be in):
 * block-diagonal over blocks of B = the largest power of two dividing d (d a multiple of 16, so
 * B >= 16), orthonormal:
 *   forward: x = x * sign;  butterflies;  x = x * (1 / sqrt(B))
 *   inverse: butterflies;  x = x * (1 / sqrt(B));  x = x * sign
 * The butterflies run for h = 1, 2, 4, .. B/2 over each pair (i, i + h) with i & h == 0:
 * (a, b) -> (a + b, a - b). Each stage is elementwise, so any vector width gives these bits. */

/* Stages h = from, 2 from, .. B/2 over memory, in place; the last one (h = B/2) also scales and,
 * inverse, applies the signs before it stores. The SIMD tiers run the stages below `from` in
 * registers and call this for the rest (nothing when from >= B); the scalar tier runs them all. */
static inline void i8a_rotate_stages(float *x, size_t d, const float *sign, int inverse,
                                     size_t from)
{
    const size_t block = d & (~d + 1);
    const float scale = 1.0f / sqrtf((float)block);
    for (size_t h = from; h < block; h *= 2) {
        const int last = 2 * h == block;
        for (size_t b = 0; b < d; b += 2 * h)
            for (size_t i = b; i < b + h; i++) {
                const float a = x[i], c = x[i + h];
                float s = a + c, t = a - c;
                if (last) {
                    s = s * scale, t = t * scale;
                    if (inverse)
                        s = s * sign[i], t = t * sign[i + h];
                }
                x[i] = s, x[i + h] = t;
            }
    }
}

static inline void i8a_rotate_body(const float *in, size_t d, const float *sign, int inverse,
                                   float *x)
{
    for (size_t i = 0; i < d; i++)
        x[i] = inverse ? in[i] : in[i] * sign[i];
    i8a_rotate_stages(x, d, sign, inverse, 1);
}

/* i8a_logit plus the query row's bias (a separate add), then the soft cap when it is on
 * (cap > 0): the scalar form every tier uses for the rows its vectors do not cover. */
static inline float i8a_logit_capped(int32_t dh, int32_t dl, float c_hi, float c_lo, int two,
                                     float ks, float bias, float cap, float inv_cap)
{
    const float lg = i8a_logit(dh, dl, c_hi, c_lo, two, ks) + bias;
    return cap > 0.0f ? i8a_softcap(lg, cap, inv_cap) : lg;
}

/* The scalar part of merging a chunk's state into the running one (one query row): updates m
 * and l and returns the factors for o: o = o * a + chunk_o * b (the product by b fused). */
static inline void i8a_merge_head(const i8a_state *run, const i8a_state *chunk, float *a,
                                  float *b)
{
    float m0 = run->m[0], m1 = chunk->m[0];
    float m = m1 > m0 ? m1 : m0;
    *a = i8a_exp_scalar(m0 - m);
    *b = i8a_exp_scalar(m1 - m);
    run->l[0] = fmaf(chunk->l[0], *b, run->l[0] * *a);
    run->m[0] = m;
}

/* IEEE binary16 (the recent window's rows, with a power-of-two scale per row). i8a_half_bits:
 * the half nearest x, ties to even; |x| < 65520 (no overflow: the window's rows are scaled
 * below 2^15 first). Normal halves (|x| >= 2^-14) round the float's bits; subnormal ones are
 * |x| * 2^24 rounded to an integer by adding 2^23 (exact steps, then one rounding to nearest
 * even: the default mode, which the quantizer's rintf also assumes). Branch-free, so that a
 * row's loop vectorizes at the baseline ISA. i8a_half_value: its value, exact (every half is a
 * float). Plain C, so the engine and the scalar tier share it; the SIMD tiers widen with their
 * own instructions (exact too: the same floats). */
static inline uint16_t i8a_half_bits(float x)
{
    uint32_t b, sb;
    memcpy(&b, &x, sizeof b);
    const uint32_t a = b & 0x7fffffffu;
    const uint32_t normal = ((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10);
    float ax;
    memcpy(&ax, &a, sizeof ax);
    const float t = ax * 0x1p24f + 0x1p23f;      /* |x| < 2^-14: t - 2^23 < 2^10, exact sum */
    memcpy(&sb, &t, sizeof sb);
    const uint32_t sub = sb - 0x4b000000u;      /* the integer, 0 .. 1024 (1024: 2^-14) */
    const uint32_t is_normal = 0u - (uint32_t)(a >= 0x38800000u);   /* all ones or zero */
    return (uint16_t)(((b >> 16) & 0x8000u) | (normal & is_normal) | (sub & ~is_normal));
}

static inline float i8a_half_value(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float x = (float)m * 0x1p-24f;    /* subnormal (or zero): exact */
        return sign ? -x : x;
    }
    const uint32_t b = sign | ((e + 112u) << 23) | (m << 13);
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* A tier's three loops of the recent window, in the order every tier keeps (multiply, then
 * add: no fma). i8a_dots4_fn: dot[b] = q . k[b] for 4 rows of halves: 16 lane sums (element i
 * to lane i mod 16, each lane in index order), folded by i8a_reduce_lanes. i8a_exps_fn: x[j]
 * = exp(x[j] - m) for j < n, the operations of i8a_exp_scalar. i8a_vsum_fn: o[i] = the sum over
 * j < n of w[j] * v[j][i], in position order for every i. d a multiple of 16. */
typedef void (*i8a_dots4_fn)(const float *q, const uint16_t *const *k, size_t d, float *dot);
typedef void (*i8a_exps_fn)(float *x, size_t n, float m);
typedef void (*i8a_vsum_fn)(const float *w, const uint16_t *const *v, size_t n, size_t d,
                            float *o);

/* The scalar forms of the two (the scalar tier's, and the order the others vectorize). */
/* q . h for one row of halves h [d] in the dot16 order (dots4's, one row). */
static inline float i8a_dot16_halves(const float *q, const uint16_t *h, size_t d)
{
    float lane[I8A_SUM_LANES] = {0.0f};
    for (size_t i = 0; i < d; i += I8A_SUM_LANES)
        for (size_t t = 0; t < I8A_SUM_LANES; t++)
            lane[t] = lane[t] + q[i + t] * i8a_half_value(h[i + t]);
    return i8a_reduce_lanes(lane);
}

static inline void i8a_dots4_scalar(const float *q, const uint16_t *const *k, size_t d,
                                    float *dot)
{
    for (size_t b = 0; b < 4; b++)
        dot[b] = i8a_dot16_halves(q, k[b], d);
}

static inline void i8a_exps_scalar(float *x, size_t n, float m)
{
    for (size_t j = 0; j < n; j++)
        x[j] = i8a_exp_scalar(x[j] - m);
}

static inline void i8a_vsum_scalar(const float *w, const uint16_t *const *v, size_t n, size_t d,
                                   float *o)
{
    for (size_t i = 0; i < d; i++) {
        float acc = 0.0f;
        for (size_t j = 0; j < n; j++)
            acc = acc + w[j] * i8a_half_value(v[j][i]);
        o[i] = acc;
    }
}

/* The smallest scale exponent of a window row: a row whose largest |value| is below 2^(14 +
 * this) keeps fewer than 11 bits for it (subnormal halves); scales stay normal floats. */
#define I8A_HALF_EXP_MIN (-100)

/* The scale exponent of a window row whose largest |value| is top (finite, > 0): e puts top's
 * rounded half in [2^14, 2^15), at least I8A_HALF_EXP_MIN. Rounding is monotone, so top alone
 * says whether the row rounds up to 2^15 at e - 15; the next exponent then takes it (and its
 * largest is 2^14). */
static inline int i8a_half_exponent(float top)
{
    int e;
    frexpf(top, &e);                    /* top in [2^(e-1), 2^e) */
    e = e - 15 > I8A_HALF_EXP_MIN ? e - 15 : I8A_HALF_EXP_MIN;
    if ((i8a_half_bits(top * ldexpf(1.0f, -e)) & 0x7fffu) >= 0x7800u)
        e++;
    return e;
}

/* The i8a_half_row_fn of the scalar tier: the largest |x| (float compares: exact in any order), then every
 * element times 2^-e (exact but below 2^-126, which rounds to 0 anyway) to its half. */
static inline float i8a_half_row_body(const float *x, size_t d, uint16_t *h)
{
    float top = 0.0f;
    for (size_t i = 0; i < d; i++)
        top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    if (top == 0.0f) {
        memset(h, 0, d * sizeof(uint16_t));
        return 1.0f;
    }
    const int e = i8a_half_exponent(top);
    const float down = ldexpf(1.0f, -e);        /* 2^-e, a normal float (-50 <= -e <= 100) */
    for (size_t i = 0; i < d; i++)
        h[i] = i8a_half_bits(x[i] * down);
    return ldexpf(1.0f, e);
}

/* The largest of x[0 .. n), n >= 1, none NaN: eight running maxima side by side (a max is
 * exact, so any order gives the same value; one chain of n dependent compares was a tenth of
 * the window's time). */
static inline float i8a_max_of(const float *x, size_t n)
{
    float part[8];
    for (size_t b = 0; b < 8; b++)
        part[b] = x[0];
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (size_t b = 0; b < 8; b++)
            part[b] = x[j + b] > part[b] ? x[j + b] : part[b];
    for (; j < n; j++)
        part[0] = x[j] > part[0] ? x[j] : part[0];
    for (size_t b = 1; b < 8; b++)
        part[0] = part[b] > part[0] ? part[b] : part[0];
    return part[0];
}

/* The recent window's state of one query row (i8a_attend_float_fn), the same source in every
 * tier around the tier's three loops: logit = (q . h[j]) * k_scale[j] (dots4; the last n % 4
 * rows go through it with their first row repeated, the extra dots unused), soft-capped when
 * on; m = their max; w = exp(logit - m) by the contract's polynomial (exps); l = the sum of w
 * in position order; o = vsum of the weights w * v_scale[j]. */
I8A_INLINE void i8a_attend_float_body(const float *q, const i8a_float_rows *w, size_t d,
                                      float cap, float *logit, float *m_out, float *l_out,
                                      float *o, i8a_dots4_fn dots4, i8a_exps_fn exps,
                                      i8a_vsum_fn vsum)
{
    const size_t n = w->n;
    for (size_t j = 0; j < n; j += 4) {
        const uint16_t *rows[4];
        float dot[4];
        for (size_t b = 0; b < 4; b++)
            rows[b] = w->k[j + b < n ? j + b : j];
        dots4(q, rows, d, dot);
        for (size_t b = 0; b < 4 && j + b < n; b++)
            logit[j + b] = dot[b] * w->k_scale[j + b];
    }
    if (cap > 0.0f)
        for (size_t j = 0; j < n; j++)
            logit[j] = i8a_softcap(logit[j], cap, 1.0f / cap);
    const float m = i8a_max_of(logit, n);
    exps(logit, n, m);                                      /* now the weights */
    float l = 0.0f;
    for (size_t j = 0; j < n; j++)
        l = l + logit[j];
    for (size_t j = 0; j < n; j++)
        logit[j] = logit[j] * w->v_scale[j];                /* the weights of the halves */
    vsum(logit, w->v, n, d, o);
    *m_out = m;
    *l_out = l;
}

/* -- The 4-bit sides (dispatch.h): the scalar forms, and attend4's body ----------------- */

/* Element i of a row of nibble blocks (a K row at 4 bits). */
static inline int32_t i8a_nib_row(const uint8_t *row, size_t i)
{
    const uint8_t b = row[i / I8A_NIB_BLOCK * 16 + i % 16];
    return i % I8A_NIB_BLOCK < 16 ? b & 15 : b >> 4;
}

/* Dimension i of slot r of a V tile at 4 bits. */
static inline int32_t i8a_nib_tile(const uint8_t *tile, size_t i, size_t r)
{
    const uint8_t b = tile[i / I8A_NIB_BLOCK * 64 + i % 16 * I8A_V_TILE + r];
    return i % I8A_NIB_BLOCK < 16 ? b & 15 : b >> 4;
}

/* The q planes of one query row against one K group at 4 bits, qs [d] the row times the
 * softmax scale:
 *   step_i = half(h_step[i]) * step_scale;  q'_i = qs_i * step_i;  a = max_i |q'_i|;
 *   a below I8A_ABSMAX_MIN: every plane 0, c_k = 0; else c_0 = a / 127, inv_0 = 127 / a, and
 *   each plane 254 times finer than the one before: c_k = c_(k-1) / 254, inv_k = inv_(k-1) * 254;
 *   per element, x = q'_i, then for each plane: b = clamp(rint(x * inv_k), -127, 127), the
 *   plane's byte; x = x - float(b) * c_k (multiply, then subtract);
 *   bias = dot16(qs, h_min) * min_scale;
 * so that qs . k = bias + sum_i q'_i code_i, with q' within c_(planes-1) / 2 (each residual
 * lies within half the step of its plane: 254 steps of the next cover it). Three planes with
 * q_bits=16, not two as for K at 8 bits: q' carries each channel's step, and K's outlier
 * channels (steps 20x the others') leave the other channels few steps of two planes (1.05e-3
 * against the contract's 1e-3 on such K). One plane with q_bits=8. Plane k is at q + k *
 * I8A_MAX_HEAD_DIM; r: d floats of scratch. */
#define I8A_K4_QPLANES 3

static inline void i8a_k4_scales(float a, int planes, float *c, float *inv)
{
    const int some = a >= I8A_ABSMAX_MIN;
    c[0] = some ? a / 127.0f : 0.0f;
    inv[0] = some ? 127.0f / a : 0.0f;
    for (int k = 1; k < planes; k++) {
        c[k] = c[k - 1] / 254.0f;
        inv[k] = inv[k - 1] * 254.0f;
    }
}

static inline int8_t i8a_k4_plane_byte(float x, float inv)
{
    float b = rintf(x * inv);
    b = b > 127.0f ? 127.0f : b;
    return (int8_t)(b < -127.0f ? -127.0f : b);
}

static inline void i8a_k4_query(const float *qs, const uint16_t *h_min, float min_scale,
                                const uint16_t *h_step, float step_scale, size_t d, int planes,
                                int8_t *q, float *c, float *bias, float *r)
{
    float a = 0.0f, inv[I8A_K4_QPLANES];
    for (size_t i = 0; i < d; i++) {
        r[i] = qs[i] * (i8a_half_value(h_step[i]) * step_scale);
        a = fabsf(r[i]) > a ? fabsf(r[i]) : a;
    }
    i8a_k4_scales(a, planes, c, inv);
    for (size_t i = 0; i < d; i++) {
        float x = r[i];
        for (int k = 0; k < planes; k++) {
            const int8_t b = i8a_k4_plane_byte(x, inv[k]);
            q[(size_t)k * I8A_MAX_HEAD_DIM + i] = b;
            x = x - (float)b * c[k];
        }
    }
    *bias = i8a_dot16_halves(qs, h_min, d) * min_scale;
}

/* A logit of K at 4 bits from its `planes` plane dots: lg = float(dot0) * c0, then lg =
 * fma(float(dot_k), c_k, lg) for the planes after it; lg + bias; the soft cap when on (the
 * dots are exact: |dot| <= 127 * 15 * 1024 < 2^21). */
static inline float i8a_logit4(const int32_t *dot, const float *c, int planes, float bias,
                               float cap, float inv_cap)
{
    float lg = (float)dot[0] * c[0];
    for (int k = 1; k < planes; k++)
        lg = fmaf((float)dot[k], c[k], lg);
    lg = lg + bias;
    return cap > 0.0f ? i8a_softcap(lg, cap, inv_cap) : lg;
}

/* The integer V pass (common.h) of heads [0, nq) at 8 bits: the planes' sums over the span's
 * tiles, then o. The scalar tier's (and the order the others vectorize). */
static inline void i8a_vpass8_scalar(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                     float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t i = 0; i < d; i++) {
            int32_t S[I8A_WPLANES] = {0};
            for (size_t t = 0; t < tiles; t++) {
                const int8_t *x = kv->v + (t * d + i) * I8A_V_TILE;
                for (size_t r = 0; r < I8A_V_TILE; r++)
                    for (int k = 0; k < I8A_WPLANES; k++)
                        S[k] += (int32_t)slot[k * I8A_PLANE_BYTES + t * I8A_V_TILE + r] * x[r];
            }
            o[j * d + i] = i8a_v_out(S, sc);
        }
    }
}

/* The logits of query head j against the span's K rows at 8 bits (i8a_attend_scalar's): p [n];
 * returns their max. */
static inline float i8a_logits8_scalar(const i8a_query *q, const i8a_span *kv, size_t j, float *p)
{
    const size_t d = q->d;
    const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
    float m = 0.0f;
    for (size_t s = 0; s < kv->n; s++) {
        const int8_t *kr = kv->k + s * d;
        int32_t dh = 0, dl = 0;
        for (size_t i = 0; i < d; i++) {
            dh += (int32_t)qh[i] * kr[i];
            dl += q->two_planes ? (int32_t)ql[i] * kr[i] : 0;
        }
        p[s] = i8a_logit_capped(dh, dl, q->c_hi[j], q->c_lo[j], q->two_planes, kv->ks[s],
                                q->bias[j], q->softcap, q->inv_softcap);
        m = (s == 0 || p[s] > m) ? p[s] : m;
    }
    return m;
}

/* The logits of query head j against the span's K rows at 4 bits: each group's planes
 * (i8a_k4_query; three with q_bits=16, one with 8) against its rows' codes, exact int32 dots;
 * p [n]; returns their max. extra: I8A_ATTEND4_EXTRA bytes. */
static inline float i8a_logits4_scalar(const i8a_query *q, const i8a_span *kv, size_t j,
                                       float *p, uint8_t *extra)
{
    const size_t d = q->d, n = kv->n;
    int8_t *planes = (int8_t *)extra;
    float *tmp = (float *)(extra + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM);
    float m = 0.0f;
    size_t s = 0;
    const int np = q->two_planes ? I8A_K4_QPLANES : 1;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                     kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c, &bias, tmp);
        for (; s < n && s < end; s++) {
            const uint8_t *row = kv->k4 + s * (d / 2);
            int32_t dot[I8A_K4_QPLANES] = {0};
            for (size_t i = 0; i < d; i++) {
                const int32_t code = i8a_nib_row(row, i);
                for (int k = 0; k < np; k++)
                    dot[k] += planes[(size_t)k * I8A_MAX_HEAD_DIM + i] * code;
            }
            p[s] = i8a_logit4(dot, c, np, bias, q->softcap, q->inv_softcap);
            m = (s == 0 || p[s] > m) ? p[s] : m;
        }
    }
    return m;
}

/* Where attend4 keeps head j's sum of p * vmin (V at 4 bits): after its planes' scales. */
static inline float *i8a_vmin_sum_at(float *scratch, size_t nq, size_t j)
{
    return (float *)(i8a_planes_at(scratch, nq, j) + I8A_WPLANES * (I8A_PLANE_BYTES + 4));
}

/* The integer V pass at 4 bits of heads [0, nq): the planes' sums over the span's tiles of
 * codes, then o = i8a_v_out(S) + sum_s p_s vmin_s (the head's vmin sum, in the 16-lane order of
 * the softmax sum). */
static inline void i8a_vpass4_scalar(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                     float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        const float vmin = *i8a_vmin_sum_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t i = 0; i < d; i++) {
            int32_t S[I8A_WPLANES] = {0};
            for (size_t t = 0; t < tiles; t++) {
                const uint8_t *tile = kv->v4 + t * 2 * d;
                for (size_t r = 0; r < I8A_V_TILE; r++)
                    for (int k = 0; k < I8A_WPLANES; k++)
                        S[k] += (int32_t)slot[k * I8A_PLANE_BYTES + t * I8A_V_TILE + r]
                                * i8a_nib_tile(tile, i, r);
            }
            o[j * d + i] = i8a_v_out(S, sc) + vmin;
        }
    }
}

/* attend4 (dispatch.h) in the order of i8a_attend_scalar: per query head, the logits (K at 8
 * or 4 bits), m, p = exp(logit - m), l = the 16-lane sum of p; with V at 4 bits also sum_s p_s
 * vmin_s in the same lane order (multiply, then add); the weights p * vs (V's scales or steps)
 * in three integer planes; then the V pass of the side's width. */
I8A_INLINE void i8a_attend4_body(const i8a_query *q, const i8a_span *kv, float *scratch,
                                 const i8a_state *out, const int k4, const int v4)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    for (size_t j = 0; j < nq; j++) {
        float *p = scratch + j * I8A_CHUNK;
        const float m = k4 ? i8a_logits4_scalar(q, kv, j, p, extra)
                               : i8a_logits8_scalar(q, kv, j, p);
        float lane[I8A_SUM_LANES] = {0.0f}, mlane[I8A_SUM_LANES] = {0.0f};
        for (size_t s = 0; s < n; s++) {
            p[s] = i8a_exp_scalar(p[s] - m);
            lane[s % I8A_SUM_LANES] += p[s];
            if (v4)
                mlane[s % I8A_SUM_LANES] += p[s] * kv->v4_min[s];
        }
        for (size_t s = 0; s < n; s++)
            p[s] = p[s] * kv->vs[s];
        i8a_planes_scalar(p, n, kv->v_lead, i8a_planes_at(scratch, nq, j));
        *i8a_vmin_sum_at(scratch, nq, j) = i8a_reduce_lanes(mlane);
        out->m[j] = m;
        out->l[j] = i8a_reduce_lanes(lane);
    }
    if (v4)
        i8a_vpass4_scalar(scratch, nq, kv, d, out->o);
    else
        i8a_vpass8_scalar(scratch, nq, kv, d, out->o);
}

/* The tail of a stream fold: the bytes past the last whole 8-byte word. */
static inline uint64_t i8a_fold_tail(const unsigned char *p, size_t bytes)
{
    uint64_t x = 0;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        x ^= w;
    }
    for (; i < bytes; i++)
        x ^= (uint64_t)p[i] << (8 * (i % 8));
    return x;
}

/* Prefetch `bytes` bytes from p into the caches (a hint: the next chunk of this thread, while
 * the current one computes, so memory and arithmetic overlap in the cold regime). */
static inline void i8a_prefetch_rows(const void *p, size_t bytes)
{
#if defined(__GNUC__) || defined(__clang__)
    for (size_t b = 0; b < bytes; b += 64)
        __builtin_prefetch((const char *)p + b, 0, 2);
#else
    (void)p, (void)bytes;
#endif
}

#endif
