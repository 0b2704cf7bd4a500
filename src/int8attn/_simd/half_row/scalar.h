/* half_row/scalar.h: IEEE halves (the recent window's rows): half_bits / half_value, a row's
 * scale exponent, half_row. The rule every tier equals bit for bit (the scalar forms, in the
 * contract's order) and the scalar tier's entries. Baseline C, no ISA attributes; common.h
 * includes every op's scalar.h in dependency order. */
#ifndef I8A_HALF_ROW_SCALAR_H
#define I8A_HALF_ROW_SCALAR_H

/* IEEE binary16 (the recent window's rows, with a power-of-two scale per row). i8a_half_bits:
 * the half nearest x, ties to even; |x| < 65520 (no overflow: the window's rows are scaled
 * below 2^15 first). Normal halves (|x| >= 2^-14) round the float's bits; subnormal ones are
 * |x| * 2^24 rounded to an integer by adding 2^23 (exact steps, then one rounding to nearest
 * even: the default mode, which the quantizer's rintf also assumes). Branch-free, so that a
 * row's loop vectorizes at the baseline ISA. i8a_half_value: its value, exact (every half is a
 * float; Inf and NaN keep their mantissa bits), branch-free as well (no subnormal float made or
 * read: flush-to-zero modes do not change it). Plain C, so the engine and the scalar tier share
 * it; the SIMD tiers widen with their own instructions (exact too: the same floats). */
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
    const uint32_t e = h & 0x7c00u, m = h & 0x3ffu;
    /* a subnormal's (or zero's) value, exact and a normal float */
    const float small = (float)(int32_t)m * 0x1p-24f;
    uint32_t sb;
    memcpy(&sb, &small, sizeof sb);
    const uint32_t zero = 0u - (uint32_t)(e == 0), top = 0u - (uint32_t)(e == 0x7c00u);  /* masks */
    const uint32_t normal = ((uint32_t)(h & 0x7fffu) << 13) + (112u << 23);   /* rebased */
    const uint32_t b = (uint32_t)(h & 0x8000u) << 16 | (sb & zero)
                       | ((0x7f800000u | m << 13) & top) | (normal & ~(zero | top));
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* 2^e as a float, for -126 <= e <= 127 (a normal float: its bits, no libm call). */
static inline float i8a_pow2f(int e)
{
    const uint32_t b = (uint32_t)(e + 127) << 23;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
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
    uint32_t b;
    memcpy(&b, &top, sizeof b);
    int e;
    if (b >= 0x00800000u)               /* normal: top in [2^(e-1), 2^e) from its exponent */
        e = (int)(b >> 23) - 126;
    else
        frexpf(top, &e);                /* subnormal, the same rule */
    e = e - 15 > I8A_HALF_EXP_MIN ? e - 15 : I8A_HALF_EXP_MIN;
    if ((i8a_half_bits(top * i8a_pow2f(-e)) & 0x7fffu) >= 0x7800u)
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
    const float down = i8a_pow2f(-e);   /* 2^-e, normal: -57 <= -e <= 100 (rows within 2^70) */
    for (size_t i = 0; i < d; i++)
        h[i] = i8a_half_bits(x[i] * down);
    return i8a_pow2f(e);
}

static inline float i8a_half_row_scalar(const float *x, size_t d, uint16_t *h)
{
    return i8a_half_row_body(x, d, h);
}

#endif
