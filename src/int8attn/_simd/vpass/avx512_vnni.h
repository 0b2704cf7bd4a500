/* vpass/avx512_vnni.h: the integer V pass at 8 bits: the planes' sums over V tiles, then o; the
 * avx512_vnni tier's, bit for bit vpass/scalar.h's rule. Included only by ../avx512_vnni.h,
 * inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_VPASS_AVX512_VNNI_H
#define I8A_VPASS_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "vpass/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* One plane byte group (4 positions of a tile) of a head, broadcast to every 32-bit lane. */
static inline __m512i i8a_pword_avx512_vnni(const uint8_t *plane, size_t t)
{
    int32_t x;
    memcpy(&x, plane + I8A_V_TILE * t, sizeof x);
    return _mm512_set1_epi32(x);
}

/* The integer V pass (planes/scalar.h) of NH heads over dims [i0, i0 + 16 nb): per tile, one
 * vpdpbusd per plane, head and 16 dims (P bytes unsigned, V codes signed: each lane sums the
 * tile's 4 positions of one dimension), then o from the planes' sums. The block prefetches rows
 * [pf_lo, pf_hi) of the next span's V (i8a_vprefetch_share). NH and NB are constants at every
 * call. */
I8A_INLINE void
i8a_vtiles_block_avx512_vnni(const uint8_t *const *planes, int nh, int nb, const i8a_span *kv,
                             size_t tiles, size_t d, size_t i0, float *o, size_t pf_lo,
                             size_t pf_hi)
{
    __m512i acc[4][I8A_WPLANES8][8];
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int k = 0; k < I8A_WPLANES8; k++)
#pragma GCC unroll 8
            for (int b = 0; b < nb; b++)
                acc[h][k][b] = _mm512_setzero_si512();
    for (size_t t0 = 0; t0 < tiles;) {            /* runs of tiles in one block (i8a_vrun) */
        const int8_t *run;
        const size_t end = t0 + i8a_vrun(kv, t0, tiles, d, &run);
        for (size_t t = t0; t < end; t++) {
            if (I8A_V_TILE * t >= pf_lo && I8A_V_TILE * t < pf_hi)
                i8a_prefetch_rows(i8a_next_vrow(kv, I8A_V_TILE * t, d), I8A_V_TILE * d);
            const int8_t *x = run + ((t - t0) * d + i0) * I8A_V_TILE;
            /* one plane word at a time in a register, V as the memory operand (VNNI's signed
             * one): 3 NH NB accumulators and one broadcast live */
#pragma GCC unroll 8
            for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
                for (int k = 0; k < I8A_WPLANES8; k++) {
                    const __m512i pw = i8a_pword_avx512_vnni(planes[h] + k * I8A_PLANE_BYTES, t);
#pragma GCC unroll 8
                    for (int b = 0; b < nb; b++)
                        acc[h][k][b] = _mm512_dpbusd_epi32(
                            acc[h][k][b], pw, _mm512_loadu_si512((const void *)(x + 64 * b)));
                }
        }
        t0 = end;
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
#pragma GCC unroll 8
        for (int b = 0; b < nb; b++) {
            __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][0][b]), _mm512_set1_ps(sc[0]));
#pragma GCC unroll 8
            for (int k = 1; k < I8A_WPLANES8; k++)
                y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h][k][b]), _mm512_set1_ps(sc[k]), y);
            _mm512_storeu_ps(o + h * d + i0 + 16 * b, y);
        }
    }
}

/* The V pass of heads [j, j + NH): blocks of 2 NH NB <= 16 accumulators (GCC 12 spills
 * beyond about 16 of them in this loop; with three planes the blocks had to stop at 12, and
 * the wider blocks of two planes take 3-5% off an attend of 2 to 4 heads), then single
 * vectors for the rest of d. */
I8A_INLINE void i8a_vtiles_group_avx512_vnni(float *scratch, size_t nq, size_t j, int nh,
                                             const i8a_span *kv, size_t d, float *o, size_t pf_n)
{
    const uint8_t *planes[4];
    for (int h = 0; h < nh; h++)
        planes[h] = i8a_planes_at(scratch, nq, j + (size_t)h);
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    const int nb = nh <= 2 ? 4 : 2;
    const size_t wide = d / (16 * (size_t)nb), nblk = wide + (d - wide * 16 * (size_t)nb) / 16;
    size_t i = 0, b = 0, lo, hi;
    for (; b < wide; i += 16 * (size_t)nb, b++) {
        i8a_vprefetch_share(pf_n, b, nblk, &lo, &hi);
        i8a_vtiles_block_avx512_vnni(planes, nh, nb, kv, tiles, d, i, o + j * d, lo, hi);
    }
    for (; i < d; i += 16, b++) {
        i8a_vprefetch_share(pf_n, b, nblk, &lo, &hi);
        i8a_vtiles_block_avx512_vnni(planes, nh, 1, kv, tiles, d, i, o + j * d, lo, hi);
    }
}

#endif
