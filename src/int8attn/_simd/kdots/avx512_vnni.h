/* kdots/avx512_vnni.h: K at 8 bits: the exact int8 dots of the q planes with K rows, and the
 * logits; the avx512_vnni tier's, bit for bit kdots/scalar.h's rule. Included only by
 * ../avx512_vnni.h, inside the tier's target region: its pragma applies to every function here. */
#ifndef I8A_KDOTS_AVX512_VNNI_H
#define I8A_KDOTS_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "kdots/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* Bytes [i, i + 64) of a row of d bytes, zeros past d (d a multiple of 16). */
static inline __m512i i8a_load64_avx512_vnni(const int8_t *p, size_t i, size_t d)
{
    if (i + 64 <= d)
        return _mm512_loadu_si512((const void *)(p + i));
    return _mm512_maskz_loadu_epi8(~0ull >> (64 - (d - i)), p + i);
}

/* sum(q) of one plane: the offset's correction is 128 times it. */
static inline int32_t i8a_qsum_avx512_vnni(const int8_t *q, size_t d)
{
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < d; i += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi8(1), i8a_load64_avx512_vnni(q, i, d));
    return _mm512_reduce_add_epi32(acc);
}

/* Bytes [i, i + 32) of a row of d bytes, zeros past d (d a multiple of 16). */
static inline __m256i i8a_load32_avx512_vnni(const int8_t *p, size_t i, size_t d)
{
    if (i + 32 <= d)
        return _mm256_loadu_si256((const __m256i *)(p + i));
    return _mm256_maskz_loadu_epi8(0xffff, p + i);
}

/* Four row sums of four 256-bit accumulators, minus the offset's correction. */
static inline __m128i i8a_reduce4x256_avx512_vnni(__m256i a0, __m256i a1, __m256i a2, __m256i a3,
                                                  __m128i corr)
{
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return _mm_sub_epi32(x, corr);
}

/* Exact dots of every query head's planes with rows [0, n), four rows at a time (see
 * i8a_kdots_avx2): dh[j * I8A_CHUNK + s], dl[...]. 256-bit vpdpbusd: on cores that split
 * 512-bit operations it costs the same per byte, and its row sums reduce in half the steps. */
I8A_INLINE void i8a_kdots_rows_avx512_vnni(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                           int32_t *dl, const int one_run)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    const int8_t *rows[I8A_CHUNK];              /* rows in blocks: found once for all heads */
    if (!one_run)
        i8a_krows(kv, d, rows);
    for (size_t j = 0; j < q->nq; j++) {
        const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
        const __m128i ch = _mm_set1_epi32(128 * i8a_qsum_avx512_vnni(qh, d));
        const __m128i cl = _mm_set1_epi32(two ? 128 * i8a_qsum_avx512_vnni(ql, d) : 0);
        /* rows past n of the last group of four are never stored: computed on row n - 1 */
        for (size_t s = 0; s < n; s += 4) {
            if (j == 0 && s < kv->next_n) /* the next chunk's K, one group of rows per group */
                i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                                  (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
            const int8_t *k0 = i8a_krow_of(kv, rows, s, d, one_run);
            const int8_t *k1 = i8a_krow_of(kv, rows, s + 1 < n ? s + 1 : n - 1, d, one_run);
            const int8_t *k2 = i8a_krow_of(kv, rows, s + 2 < n ? s + 2 : n - 1, d, one_run);
            const int8_t *k3 = i8a_krow_of(kv, rows, s + 3 < n ? s + 3 : n - 1, d, one_run);
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
            __m256i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            for (size_t i = 0; i < d; i += 32) {
                __m256i u0 = _mm256_xor_si256(i8a_load32_avx512_vnni(k0, i, d), bias);
                __m256i u1 = _mm256_xor_si256(i8a_load32_avx512_vnni(k1, i, d), bias);
                __m256i u2 = _mm256_xor_si256(i8a_load32_avx512_vnni(k2, i, d), bias);
                __m256i u3 = _mm256_xor_si256(i8a_load32_avx512_vnni(k3, i, d), bias);
                __m256i a = i8a_load32_avx512_vnni(qh, i, d);
                h0 = _mm256_dpbusd_epi32(h0, u0, a);
                h1 = _mm256_dpbusd_epi32(h1, u1, a);
                h2 = _mm256_dpbusd_epi32(h2, u2, a);
                h3 = _mm256_dpbusd_epi32(h3, u3, a);
                if (two) {
                    __m256i b = i8a_load32_avx512_vnni(ql, i, d);
                    l0 = _mm256_dpbusd_epi32(l0, u0, b);
                    l1 = _mm256_dpbusd_epi32(l1, u1, b);
                    l2 = _mm256_dpbusd_epi32(l2, u2, b);
                    l3 = _mm256_dpbusd_epi32(l3, u3, b);
                }
            }
            _mm_store_si128((__m128i *)(dh + j * I8A_CHUNK + s),
                            i8a_reduce4x256_avx512_vnni(h0, h1, h2, h3, ch));
            if (two)
                _mm_store_si128((__m128i *)(dl + j * I8A_CHUNK + s),
                                i8a_reduce4x256_avx512_vnni(l0, l1, l2, l3, cl));
        }
    }
}

/* The tiled K pass, for groups of two query heads or more: 16 rows at a time are transposed once
 * into tiles, tile c holding quad c (dims [4c, 4c + 4)) of row r in 32-bit lane r, each byte + 128
 * (unsigned): kt[64 c + 4 r + b] = k[s + r][4 c + b] ^ 0x80. A head's dots with the 16 rows are
 * then one vpdpbusd per quad, the q word broadcast, landing in row order: no row sums to reduce,
 * and the transpose (64 shuffles per 16 rows and 64 bytes) is shared by every head and plane of
 * the group (at 4 heads and two planes the pass takes 26 cycles a row where the row by row pass,
 * whose per-head sums of four rows cost as much as their dots, takes 32-36: Zen 4, D = 128).
 * Rows past n repeat row n - 1; quads past d are not stored. */
#define I8A_KTILE_ROWS 16

/* Dims [i, i + 64) of 16 rows, r[k] holding row k's 64 bytes, transposed into their quads' tiles:
 * kt[64 c + 4 k + b] = r[k] byte 4 (c - i / 4) + b for the quads c in [i / 4, i / 4 + 16) below
 * d / 4 (the K passes of both widths make their tiles by it). */
I8A_INLINE void i8a_transpose16_avx512_vnni(const __m512i r[16], size_t i, size_t d, uint8_t *kt)
{
    __m512i t[16], u[16];
    for (int k = 0; k < 16; k += 2) {          /* rows k, k + 1 interleaved by 32-bit words */
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int g = 0; g < 16; g += 4) {          /* u[g + c], 128-bit lane L: quad 4 L + c of rows g.. */
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    const size_t quads = d - i >= 64 ? 16 : (d - i) / 4;
    for (int c = 0; c < 4; c++) {              /* lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        const __m512i o[4] = {_mm512_shuffle_i32x4(v0, v2, 0x88),
                              _mm512_shuffle_i32x4(v0, v2, 0xDD),
                              _mm512_shuffle_i32x4(v1, v3, 0x88),
                              _mm512_shuffle_i32x4(v1, v3, 0xDD)};
        for (size_t L = 0; L < 4; L++)
            if (4 * L + (size_t)c < quads)
                _mm512_store_si512((void *)(kt + 16 * i + 64 * (4 * L + (size_t)c)), o[L]);
    }
}

/* Rows [s, s + 16) of a span into kt (rows past n repeat row n - 1), each byte + 128 when
 * `unsigned_k` (vpdpbusd's unsigned operand), else as stored (the amx tier's TDPBSSD). */
I8A_INLINE void i8a_ktiles_avx512_vnni(const i8a_span *kv, const int8_t *const *rows, size_t s,
                                       size_t d, int one_run, const int unsigned_k, uint8_t *kt)
{
    const size_t n = kv->n;
    const int8_t *src[I8A_KTILE_ROWS];
    for (size_t r = 0; r < I8A_KTILE_ROWS; r++)
        src[r] = i8a_krow_of(kv, rows, s + r < n ? s + r : n - 1, d, one_run);
    const __m512i bias = _mm512_set1_epi8(unsigned_k ? (char)0x80 : 0);
    for (size_t i = 0; i < d; i += 64) {       /* quads [i / 4, i / 4 + 16): a 16 x 16 transpose */
        __m512i r[16];
        for (int k = 0; k < 16; k++)
            r[k] = _mm512_xor_si512(i8a_load64_avx512_vnni(src[k], i, d), bias);
        i8a_transpose16_avx512_vnni(r, i, d, kt);
    }
}

/* dh (and dl) of heads [j, j + NH) for the 16 rows of kt, the planes' offset corrections corr:
 * per quad one vpdpbusd per head and plane (at most 8 accumulators). NH and TWO are constants at
 * every call. */
I8A_INLINE void i8a_ktile_dots_avx512_vnni(const i8a_query *q, const uint8_t *kt, size_t s,
                                           size_t j, int nh, int two, const int32_t (*corr)[2],
                                           int32_t *dh, int32_t *dl)
{
    const size_t d = q->d;
    __m512i acc[4][2];
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
        acc[h][0] = acc[h][1] = _mm512_setzero_si512();
    for (size_t c = 0; c < d / 4; c++) {
        const __m512i x = _mm512_load_si512((const void *)(kt + 64 * c));
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            int32_t w;
            memcpy(&w, q->q_hi + (j + (size_t)h) * d + 4 * c, sizeof w);
            acc[h][0] = _mm512_dpbusd_epi32(acc[h][0], x, _mm512_set1_epi32(w));
            if (two) {
                memcpy(&w, q->q_lo + (j + (size_t)h) * d + 4 * c, sizeof w);
                acc[h][1] = _mm512_dpbusd_epi32(acc[h][1], x, _mm512_set1_epi32(w));
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++) {
        const size_t at = (j + (size_t)h) * I8A_CHUNK + s;
        _mm512_store_si512((void *)(dh + at), _mm512_sub_epi32(acc[h][0], _mm512_set1_epi32(corr[h][0])));
        if (two)
            _mm512_store_si512((void *)(dl + at),
                               _mm512_sub_epi32(acc[h][1], _mm512_set1_epi32(corr[h][1])));
    }
}

/* Heads whose planes' offset corrections are kept while they pass over a chunk's tiles: the
 * corrections do not depend on the row, so each head's are made once a chunk (made again per
 * 16 rows, they took 7% of an attend of 4 heads); a group larger than this transposes each
 * tile once per block of heads (8 cycles a row, shared by 64 heads). */
#define I8A_KTILE_HEADS 64

/* Exact dots of every query head's planes with rows [0, n), by tiles of 16 rows (above): dh[j *
 * I8A_CHUNK + s], dl[...], up to the next multiple of 16 past n (those values unused). */
I8A_INLINE void i8a_kdots_tiled_avx512_vnni(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                            int32_t *dl, const int one_run)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    const int two = q->two_planes;
    const int8_t *rows[I8A_CHUNK];
    if (!one_run)
        i8a_krows(kv, d, rows);
    _Alignas(64) uint8_t kt[I8A_KTILE_ROWS * I8A_MAX_HEAD_DIM];
    for (size_t j0 = 0; j0 < nq; j0 += I8A_KTILE_HEADS) {
        const size_t j1 = nq - j0 < I8A_KTILE_HEADS ? nq : j0 + I8A_KTILE_HEADS;
        int32_t corr[I8A_KTILE_HEADS][2];      /* 128 sum(q) of each plane: K + 128's part */
        for (size_t j = j0; j < j1; j++) {
            corr[j - j0][0] = 128 * i8a_qsum_avx512_vnni(q->q_hi + j * d, d);
            corr[j - j0][1] = two ? 128 * i8a_qsum_avx512_vnni(q->q_lo + j * d, d) : 0;
        }
        for (size_t s = 0; s < n; s += I8A_KTILE_ROWS) {
            if (j0 == 0 && s < kv->next_n)     /* the next chunk's K, 16 rows per tile */
                i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                                  (kv->next_n - s < I8A_KTILE_ROWS ? kv->next_n - s : I8A_KTILE_ROWS) * d);
            i8a_ktiles_avx512_vnni(kv, rows, s, d, one_run, 1, kt);
            for (size_t j = j0; j < j1; j += 4) {
                const int nh = j1 - j >= 4 ? 4 : (int)(j1 - j);
                const int32_t (*c)[2] = corr + (j - j0);
                switch (nh * 2 + two) {        /* NH and TWO as constants */
                case 9: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 4, 1, c, dh, dl); break;
                case 8: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 4, 0, c, dh, dl); break;
                case 7: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 3, 1, c, dh, dl); break;
                case 6: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 3, 0, c, dh, dl); break;
                case 5: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 2, 1, c, dh, dl); break;
                case 4: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 2, 0, c, dh, dl); break;
                case 3: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 1, 1, c, dh, dl); break;
                default: i8a_ktile_dots_avx512_vnni(q, kt, s, j, 1, 0, c, dh, dl); break;
                }
            }
        }
    }
}

/* The K pass: tiled for a group, row by row for one query head; the span's layout a constant
 * (one run: a contiguous cache). */
static inline void i8a_kdots_avx512_vnni(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                         int32_t *dl)
{
    if (q->nq >= 2) {                          /* a group: the tiled pass */
        if (i8a_one_run(kv))
            i8a_kdots_tiled_avx512_vnni(q, kv, dh, dl, 1);
        else
            i8a_kdots_tiled_avx512_vnni(q, kv, dh, dl, 0);
        return;
    }
    if (i8a_one_run(kv))
        i8a_kdots_rows_avx512_vnni(q, kv, dh, dl, 1);
    else
        i8a_kdots_rows_avx512_vnni(q, kv, dh, dl, 0);
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, sixteen at a time; returns max_s p[s]. */
static inline float i8a_logits_avx512_vnni(const int32_t *dh, const int32_t *dl, float c_hi,
                                           float c_lo, int two, float bias, float cap, float inv_cap,
                                           const float *ks, size_t n, float *p)
{
    const __m512 ch = _mm512_set1_ps(c_hi), cl = _mm512_set1_ps(c_lo), vb = _mm512_set1_ps(bias);
    __m512 vmax = _mm512_set1_ps(-FLT_MAX);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 lg = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dh + s))), ch);
        if (two)
            lg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dl + s))), cl, lg);
        lg = _mm512_add_ps(_mm512_mul_ps(lg, _mm512_maskz_loadu_ps(live, ks + s)), vb);
        if (cap > 0.0f)
            lg = i8a_softcap16_avx512_vnni(lg, cap, inv_cap);
        _mm512_store_ps(p + s, lg);
        vmax = _mm512_mask_max_ps(vmax, live, vmax, lg);
    }
    return _mm512_reduce_max_ps(vmax);
}

#endif
