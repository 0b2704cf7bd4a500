/* v4/avx512_vnni.h: V at 4 bits: the planes' sums over tiles of nibbles, and V's minima; the
 * avx512_vnni tier's, bit for bit v4/scalar.h's rule. Included only by ../avx512_vnni.h, inside
 * the tier's target region: its pragma applies to every function here. */
#ifndef I8A_V4_AVX512_VNNI_H
#define I8A_V4_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "v4/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* p[s] = exp(p[s] - m) * vs[s] for s < n (zeros up to a multiple of 16); returns the 16-lane
 * sum of the exps and sets *vmin_sum to the 16-lane sum of exp * vmin (V at 4 bits). */
static inline float i8a_softmax4_avx512_vnni(float *p, const float *vs, const float *vmin,
                                             size_t n, float m, float *vmin_sum)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps(), macc = _mm512_setzero_ps();
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 e = _mm512_maskz_mov_ps(live, i8a_exp16_avx512_vnni(_mm512_sub_ps(_mm512_load_ps(p + s), vm)));
        acc = _mm512_add_ps(acc, e);
        macc = _mm512_add_ps(macc, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(live, vmin + s)));
        _mm512_store_ps(p + s, _mm512_mul_ps(e, _mm512_maskz_loadu_ps(live, vs + s)));
    }
    *vmin_sum = i8a_fold16_avx512_vnni(macc);
    return i8a_fold16_avx512_vnni(acc);
}

/* The integer V pass at 4 bits of NH heads (1 or 2) over the 32-dimension blocks [b0, b0 +
 * NB): per tile and block, 64 bytes unpack to two vectors in the int8 tile's layout
 * (dimensions 32 b .. + 15 from the low nibbles, 32 b + 16 .. + 31 from the high ones), one
 * vpdpbusd each per plane and head; then o = i8a_v_out(S) + the head's vmin sum. The tiles of
 * pf_n rows of pf (the next chunk's V) are prefetched. NH and NB are constants at every call. */
I8A_INLINE void
i8a_v4tiles_block_avx512_vnni(const uint8_t *const *planes, const float *vmin, int nh, int nb,
                              const uint8_t *v4, size_t tiles, size_t d, size_t b0, float *o,
                              const int8_t *pf, size_t pf_n)
{
    const __m512i nib = _mm512_set1_epi8(0x0f);
    __m512i acc[2][I8A_WPLANES4][4];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < I8A_WPLANES4; k++)
#pragma GCC unroll 4
            for (int u = 0; u < 2 * nb; u++)
                acc[h][k][u] = _mm512_setzero_si512();
    for (size_t t = 0; t < tiles; t++) {
        if (I8A_V_TILE * t < pf_n)              /* the next chunk's V, a tile at a time */
            i8a_prefetch_rows(pf + t * 2 * d, 2 * d);
        const uint8_t *x = v4 + t * 2 * d + 64 * b0;
        __m512i xv[4];
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++) {
            const __m512i raw = _mm512_loadu_si512((const void *)(x + 64 * b));
            xv[2 * b] = _mm512_and_si512(raw, nib);
            xv[2 * b + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
        }
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES4; k++) {
                const __m512i pw = i8a_pword_avx512_vnni(planes[h] + k * I8A_PLANE_BYTES, t);
#pragma GCC unroll 4
                for (int u = 0; u < 2 * nb; u++)
                    acc[h][k][u] = _mm512_dpbusd_epi32(acc[h][k][u], pw, xv[u]);
            }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 4
        for (int u = 0; u < 2 * nb; u++) {
            __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][0][u]), _mm512_set1_ps(sc[0]));
#pragma GCC unroll 3
            for (int k = 1; k < I8A_WPLANES4; k++)
                y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h][k][u]), _mm512_set1_ps(sc[k]), y);
            _mm512_storeu_ps(o + h * d + 32 * b0 + 16 * u, _mm512_add_ps(y, _mm512_set1_ps(vmin[h])));
        }
    }
}

/* The V pass at 4 bits over the nq heads of a chunk: pairs of heads a block of 32 dimensions at
 * a time, then a head left alone two blocks at a time (12 accumulators either way). */
static inline void i8a_v4pass_avx512_vnni(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                          float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n), blocks = d / I8A_NIB_BLOCK;
    size_t j = 0, pf_n = kv->next_n;   /* the first block prefetches the next chunk's V */
    for (; j + 2 <= nq; j += 2) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), i8a_planes_at(scratch, nq, j + 1)};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j), *i8a_vmin_sum_at(scratch, nq, j + 1)};
        for (size_t b = 0; b < blocks; b++, pf_n = 0)
            i8a_v4tiles_block_avx512_vnni(planes, vmin, 2, 1, kv->v4, tiles, d, b, o + j * d,
                                          kv->next_v, pf_n);
    }
    if (j < nq) {
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j), NULL};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j), 0.0f};
        size_t b = 0;
        for (; b + 2 <= blocks; b += 2, pf_n = 0)
            i8a_v4tiles_block_avx512_vnni(planes, vmin, 1, 2, kv->v4, tiles, d, b, o + j * d,
                                          kv->next_v, pf_n);
        if (b < blocks)
            i8a_v4tiles_block_avx512_vnni(planes, vmin, 1, 1, kv->v4, tiles, d, b, o + j * d,
                                          kv->next_v, pf_n);
    }
}

/* i8a_vtop_row_scalar with this tier's vectors: the row's codes widened 16 dimensions at a time
 * (V at 8 bits: byte r of each 32-bit lane of the row's tile; at 4 bits: the lane's byte r
 * split in its nibbles, dimensions i and i + 16 of a block), added by one fused multiply-add
 * each (fmaf's rounding). */
static inline void i8a_vtop_row_avx512_vnni(float w_top, size_t t, size_t r, const i8a_span *kv,
                                            size_t d, int v4, float *o)
{
    const __m512i r8 = _mm512_set1_epi32((int)(8 * r));
    const __m512 w = _mm512_set1_ps(w_top);
    if (!v4) {
        const int8_t *x = i8a_vtile(kv, t, d);
        const __m512i up = _mm512_sub_epi32(_mm512_set1_epi32(24), r8);
        for (size_t i = 0; i < d; i += 16) {
            const __m512i c = _mm512_srai_epi32(
                _mm512_sllv_epi32(_mm512_loadu_si512((const void *)(x + I8A_V_TILE * i)), up), 24);
            _mm512_storeu_ps(o + i, _mm512_fmadd_ps(w, _mm512_cvtepi32_ps(c), _mm512_loadu_ps(o + i)));
        }
    } else {
        const __m512i nib = _mm512_set1_epi32(15);
        const uint8_t *tile = kv->v4 + t * 2 * d;
        for (size_t b = 0; b < d; b += I8A_NIB_BLOCK) {
            const __m512i x = _mm512_srlv_epi32(_mm512_loadu_si512((const void *)(tile + 2 * b)), r8);
            const __m512i lo = _mm512_and_si512(x, nib), hi = _mm512_and_si512(_mm512_srli_epi32(x, 4), nib);
            _mm512_storeu_ps(o + b, _mm512_fmadd_ps(w, _mm512_cvtepi32_ps(lo), _mm512_loadu_ps(o + b)));
            _mm512_storeu_ps(o + b + 16,
                             _mm512_fmadd_ps(w, _mm512_cvtepi32_ps(hi), _mm512_loadu_ps(o + b + 16)));
        }
    }
}

#endif
