/* planes/avx2.h: a chunk's softmax and its weights in integer planes and a top row (the V pass's
 * first half); the avx2 tier's, bit for bit planes/scalar.h's rule. Included only by ../avx2.h,
 * inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_PLANES_AVX2_H
#define I8A_PLANES_AVX2_H

#ifndef I8A_AVX2_H
#error "planes/avx2.h is included by ../avx2.h only"
#endif

/* p[s] = exp(p[s] - m) for s < n (in place, padding to a multiple of 16 left as zeros);
 * returns the 16-lane sum of core/scalar.h. */
static inline float i8a_softmax_avx2(float *p, size_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        __m256 keep0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - s)), idx));
        __m256 keep1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - s) - 8), idx));
        __m256 p0 = _mm256_and_ps(keep0, i8a_exp8_avx2(_mm256_sub_ps(_mm256_load_ps(p + s), vm)));
        __m256 p1 = _mm256_and_ps(keep1, i8a_exp8_avx2(_mm256_sub_ps(_mm256_load_ps(p + s + 8), vm)));
        _mm256_store_ps(p + s, p0);
        _mm256_store_ps(p + s + 8, p1);
        s0 = _mm256_add_ps(s0, p0);
        s1 = _mm256_add_ps(s1, p1);
    }
    return i8a_fold16_avx2(s0, s1);
}

/* A head's P planes and top row from its weights w [round16(n)] (zeros past n; planes/scalar.h's
 * rule, the top's weight set to 0 in w; the planes 16 weights
 * at a time: floor, clamps and residuals on floats, each residual by one fused step, the last
 * plane's rint by vcvtps2dq under the default MXCSR, clamped as integers, packed to bytes: the
 * bytes of i8a_planes_scalar). */
static inline void i8a_planes_avx2(float *w, size_t n, size_t lead, uint8_t *slot,
                                   int np)
{
    float top[2], w_top;                  /* the largest, then the largest of the others */
    uint32_t at;
    for (int pass = 0; pass < 2; pass++) {
        __m256 most = _mm256_setzero_ps();
        for (size_t s = 0; s < n; s += 8)
            most = _mm256_max_ps(most, _mm256_load_ps(w + s)); /* the padding's zeros too */
        top[pass] = i8a_hmax8_avx2(most);
        if (pass == 0) {                  /* the first 8 weights holding top (zeros past n) */
            size_t from = 0;
            for (; from < n; from += 8)
                if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_load_ps(w + from),
                                                     _mm256_set1_ps(top[0]), _CMP_EQ_OQ)))
                    break;
            i8a_take_top(w, from, n, top[0], &w_top, &at);
        }
    }
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    const float lift = i8a_weight_scales(top[1], np, sc, inv);
    const __m256 lift_f = _mm256_set1_ps(lift);
    const __m256 zero_f = _mm256_setzero_ps(), most_f = _mm256_set1_ps(127.0f);
    const __m256i zero = _mm256_setzero_si256(), most_i = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t s = 0; s < n; s += 16) {
        __m256i b[I8A_WPLANES][2];
        for (int u = 0; u < 2; u++) {
            __m256 r = _mm256_mul_ps(_mm256_load_ps(w + s + 8 * u), lift_f);
            for (int k = 0; k < np - 1; k++) {
                __m256 x = _mm256_floor_ps(_mm256_mul_ps(r, _mm256_set1_ps(inv[k])));
                x = _mm256_min_ps(_mm256_max_ps(x, zero_f), most_f);
                r = _mm256_fnmadd_ps(x, _mm256_set1_ps(sc[k]), r);
                b[k][u] = _mm256_cvttps_epi32(x);
            }
            const __m256i l = _mm256_cvtps_epi32(_mm256_mul_ps(r, _mm256_set1_ps(inv[np - 1])));
            b[np - 1][u] = _mm256_min_epi32(_mm256_max_epi32(l, zero), most_i);
        }
        /* packs: [a0-3 b0-3 | a4-7 b4-7] as 16 bits, then bytes (twice); words 0 4 1 5 */
        for (int k = 0; k < np; k++) {
            const __m256i pk = _mm256_packus_epi16(_mm256_packs_epi32(b[k][0], b[k][1]), zero);
            _mm_storeu_si128((__m128i *)(slot + k * I8A_PLANE_BYTES + lead + s),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pk, order)));
        }
    }
    i8a_planes_frame(slot, lead, n, np, sc, lift, w_top, at);
}

#endif
