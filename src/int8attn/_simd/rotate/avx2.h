/* rotate/avx2.h: rotate: the random-sign Walsh-Hadamard rotation of a row; the avx2 tier's, bit
 * for bit rotate/scalar.h's rule. Included only by ../avx2.h, inside the tier's target region:
 * its pragma applies to every function here. */
#ifndef I8A_ROTATE_AVX2_H
#define I8A_ROTATE_AVX2_H

#ifndef I8A_AVX2_H
#error "rotate/avx2.h is included by ../avx2.h only"
#endif

/* The rotation of rotate/scalar.h, stage by stage the same additions and subtractions. A group of
 * N registers (N * 8 floats, N = 1, 2, 4, 8) goes through every stage below N * 8 without
 * leaving registers: h = 1, 2, 4 inside each register (partner lane i ^ h by a shuffle; lanes
 * with bit h set take partner - self, the others self + partner), then h = 8 .. between
 * registers. Wider stages (blocks over 64) are rotate/scalar.h's passes over memory. */
/* One stage inside a register, p the partner lanes: p + v * m, m = -1 in the lanes with bit h
 * set and +1 in the others. v * m is exact, so the fused step rounds the exact sum p - v or
 * v + p once, as the scalar rule's subtraction or addition does (signed zeros included). */
static inline __m256 i8a_rot_lanes_avx2(__m256 v, __m256 p, __m256 m)
{
    return _mm256_fmadd_ps(v, m, p);
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
    const __m256 m1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 m2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 m4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    for (size_t g = 0; g < d; g += (size_t)n * 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int j = 0; j < n; j++) {
            __m256 v = _mm256_loadu_ps(in + g + 8 * j);
            if (!inverse)
                v = _mm256_mul_ps(v, _mm256_loadu_ps(sign + g + 8 * j));
            v = i8a_rot_lanes_avx2(v, _mm256_permute_ps(v, 0xB1), m1);   /* lanes 1 0 3 2 .. */
            v = i8a_rot_lanes_avx2(v, _mm256_permute_ps(v, 0x4E), m2);   /* lanes 2 3 0 1 .. */
            r[j] = i8a_rot_lanes_avx2(v, _mm256_permute2f128_ps(v, v, 0x01), m4);  /* halves */
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

#endif
