/* rotate/scalar.h: rotate: the random-sign Walsh-Hadamard rotation of a row. The rule every tier
 * equals bit for bit (the scalar forms, in the contract's order) and the scalar tier's entries.
 * Baseline C, no ISA attributes; common.h includes every op's scalar.h in dependency order. */
#ifndef I8A_ROTATE_SCALAR_H
#define I8A_ROTATE_SCALAR_H

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

/* The rotation: the body above, compiled per tier (each tier's ISA vectorizes it). */
static inline void i8a_rotate_scalar(const float *x, size_t d, const float *sign, int inverse, float *y)
{
    i8a_rotate_body(x, d, sign, inverse, y);
}

#endif
