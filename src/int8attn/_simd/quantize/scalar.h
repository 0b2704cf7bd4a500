/* quantize/scalar.h: the row quantizer (quantize_row): the scale rule and one element's rounding.
 * The rule every tier equals bit for bit (the scalar forms, in the contract's order) and the
 * scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h in
 * dependency order. */
#ifndef I8A_QUANTIZE_SCALAR_H
#define I8A_QUANTIZE_SCALAR_H

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

static inline int i8a_quantize_row_scalar(const float *x, size_t d, int8_t *codes, float *scale)
{
    float inv;
    const int todo = i8a_row_prepare(x, 0, d, 0.0f, 1, codes, scale, &inv);
    if (todo <= 0)
        return todo;
    for (size_t i = 0; i < d; i++)
        codes[i] = i8a_quantize_one(x[i], inv);
    return 0;
}

#endif
