/* core/scalar.h: the contract's shared pieces: the forced-inline macro, the exp polynomial, the
 * soft cap, the 16-lane sum order, the prefetch hint. The rule every tier equals bit for bit (the
 * scalar forms, in the contract's order) and the scalar tier's entries. Baseline C, no ISA
 * attributes; common.h includes every op's scalar.h in dependency order. */
#ifndef I8A_CORE_SCALAR_H
#define I8A_CORE_SCALAR_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../dispatch.h"

/* Helpers whose constant arguments (head counts, block widths, the dot step) must fold: forced
 * inline so each call site compiles to its own register-blocked loop. */
#if defined(__GNUC__) || defined(__clang__)
#define I8A_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define I8A_INLINE static __forceinline
#else
#define I8A_INLINE static inline
#endif

/* The index of m's lowest set bit (m != 0). */
static inline unsigned i8a_ctz64(uint64_t m)
{
#if defined(__GNUC__) || defined(__clang__)
    return (unsigned)__builtin_ctzll(m);
#else
    unsigned i = 0;
    for (; !(m & 1u); m >>= 1)
        i++;
    return i;
#endif
}

/* n rounded up to a multiple of 16: the SIMD tiers work on the logit scratch in groups of 16
 * tokens (the padding is written as zeros and masked out of the sum), and on the P planes in
 * 16-byte vectors. */
static inline size_t i8a_round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
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
