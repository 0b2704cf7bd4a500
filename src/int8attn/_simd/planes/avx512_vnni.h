/* planes/avx512_vnni.h: a chunk's softmax and its weights in integer planes and a top row (the V
 * pass's first half); the avx512_vnni tier's, bit for bit planes/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_PLANES_AVX512_VNNI_H
#define I8A_PLANES_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "planes/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* p[s] = exp(p[s] - m) * vs[s] for s < n (zeros up to a multiple of 16); returns the 16-lane
 * sum of the exps (core/scalar.h): one accumulator is exactly the sixteen lanes. */
static inline float i8a_softmax_avx512_vnni(float *p, const float *vs, size_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 e = _mm512_maskz_mov_ps(live, i8a_exp16_avx512_vnni(_mm512_sub_ps(_mm512_load_ps(p + s), vm)));
        acc = _mm512_add_ps(acc, e);
        _mm512_store_ps(p + s, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(live, vs + s)));
    }
    return i8a_fold16_avx512_vnni(acc);
}

/* A head's P planes and top row from its weights w [n] (planes/scalar.h's rule, the top's
 * weight set to 0 in w; the planes 16 weights at a time; floor,
 * clamps and residuals on floats, each residual by one fused step, the last plane's rint by
 * vcvtps2dq under the default MXCSR, clamped as integers: the bytes of i8a_planes_scalar). */
static inline void i8a_planes_avx512_vnni(float *w, size_t n, size_t lead, uint8_t *slot,
                                          int np)
{
    float top[2], w_top;                  /* the largest, then the largest of the others */
    uint32_t at;
    for (int pass = 0; pass < 2; pass++) {
        __m512 most = _mm512_setzero_ps();
        for (size_t s = 0; s < n; s += 16) {
            const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
            most = _mm512_max_ps(most, _mm512_maskz_loadu_ps(live, w + s));
        }
        top[pass] = _mm512_reduce_max_ps(most);
        if (pass == 0) {                  /* the first 16 weights holding top */
            size_t from = 0;
            for (; from < n; from += 16) {
                const __mmask16 live = n - from >= 16 ? 0xffff : (__mmask16)((1u << (n - from)) - 1);
                if (_mm512_mask_cmp_ps_mask(live, _mm512_maskz_loadu_ps(live, w + from),
                                            _mm512_set1_ps(top[0]), _CMP_EQ_OQ))
                    break;
            }
            i8a_take_top(w, from, n, top[0], &w_top, &at);
        }
    }
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    const float lift = i8a_weight_scales(top[1], np, sc, inv);
    const __m512 lift_f = _mm512_set1_ps(lift);
    const __m512 zero_f = _mm512_setzero_ps(), most_f = _mm512_set1_ps(127.0f);
    const __m512i zero = _mm512_setzero_si512(), most_i = _mm512_set1_epi32(127);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, w + s), lift_f);
        for (int k = 0; k < np - 1; k++) {
            __m512 x = _mm512_roundscale_ps(_mm512_mul_ps(r, _mm512_set1_ps(inv[k])),
                                            _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            x = _mm512_min_ps(_mm512_max_ps(x, zero_f), most_f);
            r = _mm512_fnmadd_ps(x, _mm512_set1_ps(sc[k]), r);
            _mm_mask_storeu_epi8(slot + k * I8A_PLANE_BYTES + lead + s, live,
                                 _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x)));
        }
        __m512i l = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(inv[np - 1])));
        l = _mm512_min_epi32(_mm512_max_epi32(l, zero), most_i);
        _mm_mask_storeu_epi8(slot + (size_t)(np - 1) * I8A_PLANE_BYTES + lead + s, live,
                             _mm512_cvtepi32_epi8(l));
    }
    i8a_planes_frame(slot, lead, n, np, sc, lift, w_top, at);
}

#endif
