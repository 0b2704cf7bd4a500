/* v4/avx2.h: V at 4 bits: the planes' sums over tiles of nibbles, and V's minima; the avx2
 * tier's, bit for bit v4/scalar.h's rule. Included only by ../avx2.h, inside the tier's target
 * region: its pragma applies to every function here. */
#ifndef I8A_V4_AVX2_H
#define I8A_V4_AVX2_H

#ifndef I8A_AVX2_H
#error "v4/avx2.h is included by ../avx2.h only"
#endif

/* The 16-lane sum (core/scalar.h's order) of p[s] * vmin[s] for s < n: V's minima at 4 bits. */
static inline float i8a_vmin_sum_avx2(const float *p, const float *vmin, size_t n)
{
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    size_t s = 0;
    for (; s + 8 <= n; s += 8)
        acc[s / 8 % 2] = _mm256_add_ps(acc[s / 8 % 2], _mm256_mul_ps(_mm256_loadu_ps(p + s), _mm256_loadu_ps(vmin + s)));
    float lane[I8A_SUM_LANES];
    _mm256_storeu_ps(lane, acc[0]);
    _mm256_storeu_ps(lane + 8, acc[1]);
    for (; s < n; s++)
        lane[s % I8A_SUM_LANES] = lane[s % I8A_SUM_LANES] + p[s] * vmin[s];
    return i8a_reduce_lanes(lane);
}

/* The integer V pass at 4 bits of NH heads (1 or 2) over one 32-byte half (e) of a tile's
 * 32-dimension block b: it unpacks to dimensions 32 b + 8 e .. + 7 (low nibbles) and 32 b + 16
 * + 8 e .. + 7 (high ones) in the int8 tile's layout; i8a_vdot_avx2 per plane and head; then
 * o = i8a_v_out(S) + the head's vmin sum. The tiles of pf_n rows of pf (the next chunk's V)
 * are prefetched. NH is a constant at every call. */
I8A_INLINE void i8a_v4tiles_block_avx2(const uint8_t *const *planes, const float *vmin, int nh,
                                       const uint8_t *v4, size_t tiles, size_t d, size_t b,
                                       size_t e, float *o, const int8_t *pf, size_t pf_n)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i acc[2][I8A_WPLANES4][2];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < I8A_WPLANES4; k++)
            acc[h][k][0] = acc[h][k][1] = _mm256_setzero_si256();
    for (size_t t = 0; t < tiles; t++) {
        if (I8A_V_TILE * t < pf_n)              /* the next chunk's V, a tile at a time */
            i8a_prefetch_rows(pf + t * 2 * d, 2 * d);
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(v4 + t * 2 * d + 64 * b + 32 * e));
        const __m256i x[2] = {_mm256_and_si256(raw, nib), _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib)};
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < I8A_WPLANES4; k++) {
                const __m256i pw = i8a_pword_avx2(planes[h] + k * I8A_PLANE_BYTES, t);
                acc[h][k][0] = i8a_vdot_avx2(acc[h][k][0], pw, x[0]);
                acc[h][k][1] = i8a_vdot_avx2(acc[h][k][1], pw, x[1]);
            }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++) {
        float sc[I8A_WPLANES];
        i8a_planes_scales(planes[h], sc);
        for (int f = 0; f < 2; f++) {
            __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][0][f]), _mm256_set1_ps(sc[0]));
            for (int k = 1; k < I8A_WPLANES4; k++)
                y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][k][f]), _mm256_set1_ps(sc[k]), y);
            _mm256_storeu_ps(o + h * d + I8A_NIB_BLOCK * b + 8 * e + 16 * (size_t)f,
                             _mm256_add_ps(y, _mm256_set1_ps(vmin[h])));
        }
    }
}

/* The V pass at 4 bits over the nq heads of a chunk: pairs of heads, then a head left alone,
 * each a half block (16 dimensions) at a time. */
static inline void i8a_v4pass_avx2(float *scratch, size_t nq, const i8a_span *kv, size_t d, float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n), blocks = d / I8A_NIB_BLOCK;
    size_t j = 0, pf_n = kv->next_n;   /* the first block prefetches the next chunk's V */
    for (; j < nq; j += 2) {
        const int nh = j + 2 <= nq ? 2 : 1;
        const uint8_t *planes[2] = {i8a_planes_at(scratch, nq, j),
                                    i8a_planes_at(scratch, nq, j + (size_t)nh - 1)};
        const float vmin[2] = {*i8a_vmin_sum_at(scratch, nq, j),
                               *i8a_vmin_sum_at(scratch, nq, j + (size_t)nh - 1)};
        for (size_t b = 0; b < blocks; b++)
            for (size_t e = 0; e < 2; e++, pf_n = 0) {
                if (nh == 2)
                    i8a_v4tiles_block_avx2(planes, vmin, 2, kv->v4, tiles, d, b, e, o + j * d,
                                           kv->next_v, pf_n);
                else
                    i8a_v4tiles_block_avx2(planes, vmin, 1, kv->v4, tiles, d, b, e, o + j * d,
                                           kv->next_v, pf_n);
            }
    }
}

/* i8a_vtop_row_scalar with this tier's vectors: the row's codes widened 8 dimensions at a time
 * (V at 8 bits: byte r of each 32-bit lane of the row's tile; at 4 bits: the lane's byte r
 * split in its nibbles, dimensions i and i + 16 of a block), added by one fused multiply-add
 * each (fmaf's rounding). */
static inline void i8a_vtop_row_avx2(float w_top, size_t t, size_t r, const i8a_span *kv,
                                     size_t d, int v4, float *o)
{
    const __m256i r8 = _mm256_set1_epi32((int)(8 * r));
    const __m256 w = _mm256_set1_ps(w_top);
    if (!v4) {
        const int8_t *x = i8a_vtile(kv, t, d);
        const __m256i up = _mm256_sub_epi32(_mm256_set1_epi32(24), r8);
        for (size_t i = 0; i < d; i += 8) {
            const __m256i c = _mm256_srai_epi32(
                _mm256_sllv_epi32(_mm256_loadu_si256((const __m256i *)(x + I8A_V_TILE * i)), up), 24);
            _mm256_storeu_ps(o + i, _mm256_fmadd_ps(w, _mm256_cvtepi32_ps(c), _mm256_loadu_ps(o + i)));
        }
    } else {
        const __m256i nib = _mm256_set1_epi32(15);
        const uint8_t *tile = kv->v4 + t * 2 * d;
        for (size_t b = 0; b < d; b += I8A_NIB_BLOCK)
            for (size_t h = 0; h < 2; h++) {          /* lanes 8 h .. 8 h + 7 of the block */
                const __m256i x = _mm256_srlv_epi32(
                    _mm256_loadu_si256((const __m256i *)(tile + 2 * b + 32 * h)), r8);
                const __m256i lo = _mm256_and_si256(x, nib);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(x, 4), nib);
                float *a = o + b + 8 * h, *c = o + b + 16 + 8 * h;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(w, _mm256_cvtepi32_ps(lo), _mm256_loadu_ps(a)));
                _mm256_storeu_ps(c, _mm256_fmadd_ps(w, _mm256_cvtepi32_ps(hi), _mm256_loadu_ps(c)));
            }
    }
}

#endif
