/* vpass/avx2.h: the integer V pass at 8 bits: the planes' sums over V tiles, then o; the avx2
 * tier's, bit for bit vpass/scalar.h's rule. Included only by ../avx2.h, inside the tier's target
 * region: its pragma applies to every function here. */
#ifndef I8A_VPASS_AVX2_H
#define I8A_VPASS_AVX2_H

#ifndef I8A_AVX2_H
#error "vpass/avx2.h is included by ../avx2.h only"
#endif

/* One plane byte group (4 positions of a tile) of a head, broadcast to every 32-bit lane. */
static inline __m256i i8a_pword_avx2(const uint8_t *plane, size_t t)
{
    int32_t x;
    memcpy(&x, plane + I8A_V_TILE * t, sizeof x);
    return _mm256_set1_epi32(x);
}

/* acc += for each dimension (32-bit lane) the sum of the tile's 4 products: vpmaddubsw adds
 * two products (unsigned P by signed V, at most 2 * 127 * 127: no saturation), vpmaddwd
 * the two pairs. */
static inline __m256i i8a_vdot_avx2(__m256i acc, __m256i p, __m256i x)
{
    const __m256i pairs = _mm256_maddubs_epi16(p, x);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* The integer V pass (planes/scalar.h) of NH heads over dims [i0, i0 + 8 nv), as the avx512_vnni
 * tier's, 8 dims a vector, prefetching rows [pf_lo, pf_hi) of the next span's V
 * (i8a_vprefetch_share). NH and NV are constants at every call. */
I8A_INLINE void
i8a_vtiles_block_avx2(const uint8_t *const *planes, int nh, int nv, const i8a_span *kv,
                      size_t tiles, size_t d, size_t i0, float *o, size_t pf_lo, size_t pf_hi)
{
    __m256i acc[2][I8A_WPLANES8][2];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES8; k++)
#pragma GCC unroll 8
            for (int b = 0; b < nv; b++)
                acc[h][k][b] = _mm256_setzero_si256();
    for (size_t t0 = 0; t0 < tiles;) {            /* runs of tiles in one block (i8a_vrun) */
        const int8_t *run;
        const size_t end = t0 + i8a_vrun(kv, t0, tiles, d, &run);
        for (size_t t = t0; t < end; t++) {
            if (I8A_V_TILE * t >= pf_lo && I8A_V_TILE * t < pf_hi)
                i8a_prefetch_rows(i8a_next_vrow(kv, I8A_V_TILE * t, d), I8A_V_TILE * d);
            const int8_t *x = run + ((t - t0) * d + i0) * I8A_V_TILE;
#pragma GCC unroll 8
            for (int b = 0; b < nv; b++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * b));
#pragma GCC unroll 8
                for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                    for (int k = 0; k < I8A_WPLANES8; k++)
                        acc[h][k][b] = i8a_vdot_avx2(
                            acc[h][k][b], i8a_pword_avx2(planes[h] + k * I8A_PLANE_BYTES, t), xv);
            }
        }
        t0 = end;
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int b = 0; b < nv; b++) {
            __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][0][b]), _mm256_set1_ps(sc[0]));
#pragma GCC unroll 8
            for (int k = 1; k < I8A_WPLANES8; k++)
                y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][k][b]), _mm256_set1_ps(sc[k]), y);
            _mm256_storeu_ps(o + h * d + i0 + 8 * b, y);
        }
    }
}

/* The V pass of heads [j, j + NH), NH at most 2: blocks as wide as the 16 registers allow (3 NH
 * NV accumulators), then single vectors for the rest of d (a multiple of 16). */
I8A_INLINE void i8a_vtiles_group_avx2(float *scratch, size_t nq, size_t j, int nh,
                                      const i8a_span *kv, size_t d, float *o, size_t pf_n)
{
    const uint8_t *planes[2];
    for (int h = 0; h < nh; h++)
        planes[h] = i8a_planes_at(scratch, nq, j + (size_t)h);
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const int nv = nh == 1 ? 2 : 1;
    const size_t nblk = d / (8 * (size_t)nv);
    for (size_t i = 0, b = 0, lo, hi; i < d; i += 8 * (size_t)nv, b++) {
        i8a_vprefetch_share(pf_n, b, nblk, &lo, &hi);
        i8a_vtiles_block_avx2(planes, nh, nv, kv, tiles, d, i, o + j * d, lo, hi);
    }
}

#endif
