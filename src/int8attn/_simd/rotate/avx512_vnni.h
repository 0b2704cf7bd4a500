/* rotate/avx512_vnni.h: rotate: the random-sign Walsh-Hadamard rotation of a row; the avx512_vnni
 * tier's, bit for bit rotate/scalar.h's rule. Included only by ../avx512_vnni.h, inside the
 * tier's target region: its pragma applies to every function here. */
#ifndef I8A_ROTATE_AVX512_VNNI_H
#define I8A_ROTATE_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "rotate/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* The rotation of rotate/scalar.h, stage by stage the same additions and subtractions. A group of
 * N registers (N * 16 floats, N = 1, 2, 4, 8) goes through every stage below N * 16 without
 * leaving registers: h = 1, 2, 4, 8 inside each register (partner lane i ^ h by a permute;
 * lanes with bit h set take partner - self, the others self + partner), then h = 16 .. between
 * registers. Wider stages (blocks over 128) are rotate/scalar.h's passes over memory. */
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

#endif
