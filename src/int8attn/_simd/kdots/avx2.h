/* kdots/avx2.h: K at 8 bits: the exact int8 dots of the q planes with K rows, and the logits; the
 * avx2 tier's, bit for bit kdots/scalar.h's rule. Included only by ../avx2.h, inside the tier's
 * target region: its pragma applies to every function here. */
#ifndef I8A_KDOTS_AVX2_H
#define I8A_KDOTS_AVX2_H

#ifndef I8A_AVX2_H
#error "kdots/avx2.h is included by ../avx2.h only"
#endif

/* acc += the int32 pair sums of a . b over 32 bytes (sign trick). */
static inline __m256i i8a_dot32_avx2(__m256i acc, __m256i a, __m256i b)
{
    __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(b, b), _mm256_sign_epi8(a, b));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(prod, _mm256_set1_epi16(1)));
}

static inline __m128i i8a_dot16_avx2(__m128i acc, __m128i a, __m128i b)
{
    __m128i prod = _mm_maddubs_epi16(_mm_sign_epi8(b, b), _mm_sign_epi8(a, b));
    return _mm_add_epi32(acc, _mm_madd_epi16(prod, _mm_set1_epi16(1)));
}

/* Dots of two q planes with one k row, k loaded once. d a multiple of 16. */
static inline void i8a_dot2_avx2(const int8_t *qh, const int8_t *ql, const int8_t *k, size_t d,
                                 int two, int32_t *dh, int32_t *dl)
{
    __m256i ah = _mm256_setzero_si256(), al = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256i kk = _mm256_loadu_si256((const __m256i *)(k + i));
        ah = i8a_dot32_avx2(ah, _mm256_loadu_si256((const __m256i *)(qh + i)), kk);
        if (two)
            al = i8a_dot32_avx2(al, _mm256_loadu_si256((const __m256i *)(ql + i)), kk);
    }
    if (i < d) {
        __m128i kk = _mm_loadu_si128((const __m128i *)(k + i));
        __m128i th = i8a_dot16_avx2(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)(qh + i)), kk);
        ah = _mm256_add_epi32(ah, _mm256_zextsi128_si256(th));
        if (two) {
            __m128i tl = i8a_dot16_avx2(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)(ql + i)), kk);
            al = _mm256_add_epi32(al, _mm256_zextsi128_si256(tl));
        }
    }
    *dh = i8a_hsum8_epi32_avx2(ah);
    *dl = two ? i8a_hsum8_epi32_avx2(al) : 0;
}

/* Four row sums of four int32 accumulators: lane r of the result is the sum of acc r. */
static inline __m128i i8a_reduce4_avx2(__m256i a0, __m256i a1, __m256i a2, __m256i a3)
{
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* acc += the int32 pair sums of q . k over 16 bytes, in the low 128 bits. */
static inline __m256i i8a_dot16x_avx2(__m256i acc, const int8_t *q, const int8_t *k)
{
    __m128i kk = _mm_loadu_si128((const __m128i *)k);
    __m128i t = i8a_dot16_avx2(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)q), kk);
    return _mm256_add_epi32(acc, _mm256_zextsi128_si256(t));
}

/* Exact dots of every query head's planes with rows [0, n) of the chunk, four rows at a time:
 * dh[j * I8A_CHUNK + s], dl[...] (dl only with two planes). The k rows of a group stay in L1
 * while each head of the group passes over them. */
I8A_INLINE void i8a_kdots_rows_avx2(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                    int32_t *dl, const int one_run)
{
    const size_t d = q->d, n = kv->n;
    const int two = q->two_planes;
    const int8_t *rows[I8A_CHUNK];              /* rows in blocks: found once for all heads */
    if (!one_run)
        i8a_krows(kv, d, rows);
    size_t s = 0;
    for (; s + 4 <= n; s += 4) {
        if (s < kv->next_n) /* the next chunk's K, one group of rows per group */
            i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                              (kv->next_n - s < 4 ? kv->next_n - s : 4) * d);
        const int8_t *k0 = i8a_krow_of(kv, rows, s, d, one_run);
        const int8_t *k1 = i8a_krow_of(kv, rows, s + 1, d, one_run);
        const int8_t *k2 = i8a_krow_of(kv, rows, s + 2, d, one_run);
        const int8_t *k3 = i8a_krow_of(kv, rows, s + 3, d, one_run);
        for (size_t j = 0; j < q->nq; j++) {
            const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
            __m256i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
            size_t i = 0;
            for (; i + 32 <= d; i += 32) {
                __m256i a = _mm256_loadu_si256((const __m256i *)(qh + i));
                h0 = i8a_dot32_avx2(h0, a, _mm256_loadu_si256((const __m256i *)(k0 + i)));
                h1 = i8a_dot32_avx2(h1, a, _mm256_loadu_si256((const __m256i *)(k1 + i)));
                h2 = i8a_dot32_avx2(h2, a, _mm256_loadu_si256((const __m256i *)(k2 + i)));
                h3 = i8a_dot32_avx2(h3, a, _mm256_loadu_si256((const __m256i *)(k3 + i)));
                if (two) {
                    __m256i b = _mm256_loadu_si256((const __m256i *)(ql + i));
                    l0 = i8a_dot32_avx2(l0, b, _mm256_loadu_si256((const __m256i *)(k0 + i)));
                    l1 = i8a_dot32_avx2(l1, b, _mm256_loadu_si256((const __m256i *)(k1 + i)));
                    l2 = i8a_dot32_avx2(l2, b, _mm256_loadu_si256((const __m256i *)(k2 + i)));
                    l3 = i8a_dot32_avx2(l3, b, _mm256_loadu_si256((const __m256i *)(k3 + i)));
                }
            }
            if (i < d) {
                h0 = i8a_dot16x_avx2(h0, qh + i, k0 + i);
                h1 = i8a_dot16x_avx2(h1, qh + i, k1 + i);
                h2 = i8a_dot16x_avx2(h2, qh + i, k2 + i);
                h3 = i8a_dot16x_avx2(h3, qh + i, k3 + i);
                if (two) {
                    l0 = i8a_dot16x_avx2(l0, ql + i, k0 + i);
                    l1 = i8a_dot16x_avx2(l1, ql + i, k1 + i);
                    l2 = i8a_dot16x_avx2(l2, ql + i, k2 + i);
                    l3 = i8a_dot16x_avx2(l3, ql + i, k3 + i);
                }
            }
            _mm_store_si128((__m128i *)(dh + j * I8A_CHUNK + s), i8a_reduce4_avx2(h0, h1, h2, h3));
            if (two)
                _mm_store_si128((__m128i *)(dl + j * I8A_CHUNK + s), i8a_reduce4_avx2(l0, l1, l2, l3));
        }
    }
    for (; s < n; s++)
        for (size_t j = 0; j < q->nq; j++)
            i8a_dot2_avx2(q->q_hi + j * d, q->q_lo + j * d, i8a_krow_of(kv, rows, s, d, one_run),
                          d, two, dh + j * I8A_CHUNK + s, dl + j * I8A_CHUNK + s);
}

/* The tiled K pass, for groups of query rows (below): 8 rows at a time are transposed once
 * into tiles, tile c holding quad c (dims [4c, 4c + 4)) of row r in 32-bit lane r, as stored (kt_s)
 * and as |k| (kt_a): kt_s[32 c + 4 r + b] = k[s + r][4 c + b]. A head's dots with the 8 rows are
 * then, per quad, the sign trick on its broadcast q word (vpsignb, vpmaddubsw, vpmaddwd, vpaddd),
 * landing in row order: no row sums to reduce, and the transpose and |k| are shared by every
 * head and plane of the group (4 vector ops per 32 products, against the row pass's 5 and its
 * row sums). Rows past n repeat row n - 1; quads past d are not stored. */
#define I8A_KTILE_ROWS_AVX2 8

/* Quads [0, 8) of 8 rows, r[k] holding row k's 32 bytes, transposed: tile c (32 bytes at kt_s +
 * 32 c) holds quad c of row k in word k, |k| of it at kt_a + 32 c; the tiles of quads below
 * `quads` only. */
I8A_INLINE void i8a_transpose8_avx2(const __m256i r[8], size_t quads, uint8_t *kt_s, uint8_t *kt_a)
{
    /* rows k, k + 1 interleaved by words; then u_c (128-bit half H: quad 4 H + c of rows 0-3),
     * w_c (the same of rows 4-7) */
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i w[4] = {_mm256_unpacklo_epi64(t4, t6), _mm256_unpackhi_epi64(t4, t6),
                          _mm256_unpacklo_epi64(t5, t7), _mm256_unpackhi_epi64(t5, t7)};
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i lo = _mm256_permute2x128_si256(u[c], w[c], 0x20);   /* quad c */
        _mm256_store_si256((__m256i *)(kt_s + 32 * c), lo);
        _mm256_store_si256((__m256i *)(kt_a + 32 * c), _mm256_abs_epi8(lo));
        if (quads > 4) {
            const __m256i hi = _mm256_permute2x128_si256(u[c], w[c], 0x31);  /* quad 4 + c */
            _mm256_store_si256((__m256i *)(kt_s + 32 * (4 + c)), hi);
            _mm256_store_si256((__m256i *)(kt_a + 32 * (4 + c)), _mm256_abs_epi8(hi));
        }
    }
}

/* Rows [s, s + 8) of a span into kt_s (as stored) and kt_a (|k|), dims 32 at a time; a tail of
 * 16 dims (d a multiple of 16) loads its rows' bytes into the low halves and stores 4 quads. */
I8A_INLINE void i8a_ktiles_avx2(const i8a_span *kv, const int8_t *const *rows, size_t s, size_t d,
                                int one_run, uint8_t *kt_s, uint8_t *kt_a)
{
    const size_t n = kv->n;
    const int8_t *src[I8A_KTILE_ROWS_AVX2];
    for (size_t r = 0; r < I8A_KTILE_ROWS_AVX2; r++)
        src[r] = i8a_krow_of(kv, rows, s + r < n ? s + r : n - 1, d, one_run);
    __m256i r[8];
    size_t i = 0;
    for (; i + 32 <= d; i += 32) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            r[k] = _mm256_loadu_si256((const __m256i *)(src[k] + i));
        i8a_transpose8_avx2(r, 8, kt_s + 8 * i, kt_a + 8 * i);
    }
    if (i < d) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            r[k] = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(src[k] + i)));
        i8a_transpose8_avx2(r, 4, kt_s + 8 * i, kt_a + 8 * i);
    }
}

/* dh (and dl) of heads [j, j + NH) for the 8 rows of the tiles: per quad, per head and plane, the
 * sign trick on the broadcast q word (at most 8 accumulators). NH and TWO are constants at every
 * call. */
I8A_INLINE void i8a_ktile_dots_avx2(const i8a_query *q, const uint8_t *kt_s, const uint8_t *kt_a,
                                    size_t s, size_t j, int nh, int two, int32_t *dh, int32_t *dl)
{
    const size_t d = q->d;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4][2];
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
        acc[h][0] = acc[h][1] = _mm256_setzero_si256();
    for (size_t c = 0; c < d / 4; c++) {
        const __m256i xs = _mm256_load_si256((const __m256i *)(kt_s + 32 * c));
        const __m256i xa = _mm256_load_si256((const __m256i *)(kt_a + 32 * c));
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++) {
            int32_t w;
            memcpy(&w, q->q_hi + (j + (size_t)h) * d + 4 * c, sizeof w);
            __m256i pr = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(_mm256_set1_epi32(w), xs));
            acc[h][0] = _mm256_add_epi32(acc[h][0], _mm256_madd_epi16(pr, ones));
            if (two) {
                memcpy(&w, q->q_lo + (j + (size_t)h) * d + 4 * c, sizeof w);
                pr = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(_mm256_set1_epi32(w), xs));
                acc[h][1] = _mm256_add_epi32(acc[h][1], _mm256_madd_epi16(pr, ones));
            }
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++) {
        const size_t at = (j + (size_t)h) * I8A_CHUNK + s;
        _mm256_store_si256((__m256i *)(dh + at), acc[h][0]);
        if (two)
            _mm256_store_si256((__m256i *)(dl + at), acc[h][1]);
    }
}

/* Heads whose q planes stay in L1 while they pass over a chunk's tiles (a larger group transposes
 * each tile once per block of heads). */
#define I8A_KTILE_HEADS_AVX2 64

/* Exact dots of every query head's planes with rows [0, n), by tiles of 8 rows (above): dh[j *
 * I8A_CHUNK + s], dl[...], up to the next multiple of 8 past n (those values unused). */
I8A_INLINE void i8a_kdots_tiled_avx2(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                     int32_t *dl, const int one_run)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    const int two = q->two_planes;
    const int8_t *rows[I8A_CHUNK];
    if (!one_run)
        i8a_krows(kv, d, rows);
    _Alignas(32) uint8_t kt_s[I8A_KTILE_ROWS_AVX2 * I8A_MAX_HEAD_DIM];
    _Alignas(32) uint8_t kt_a[I8A_KTILE_ROWS_AVX2 * I8A_MAX_HEAD_DIM];
    for (size_t j0 = 0; j0 < nq; j0 += I8A_KTILE_HEADS_AVX2) {
        const size_t j1 = nq - j0 < I8A_KTILE_HEADS_AVX2 ? nq : j0 + I8A_KTILE_HEADS_AVX2;
        for (size_t s = 0; s < n; s += I8A_KTILE_ROWS_AVX2) {
            if (j0 == 0 && s < kv->next_n)     /* the next chunk's K, 8 rows per tile */
                i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                                  (kv->next_n - s < I8A_KTILE_ROWS_AVX2 ? kv->next_n - s
                                                                        : I8A_KTILE_ROWS_AVX2) * d);
            i8a_ktiles_avx2(kv, rows, s, d, one_run, kt_s, kt_a);
            for (size_t j = j0; j < j1; j += 4) {
                const int nh = j1 - j >= 4 ? 4 : (int)(j1 - j);
                switch (nh * 2 + two) {        /* NH and TWO as constants */
                case 9: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 4, 1, dh, dl); break;
                case 8: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 4, 0, dh, dl); break;
                case 7: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 3, 1, dh, dl); break;
                case 6: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 3, 0, dh, dl); break;
                case 5: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 2, 1, dh, dl); break;
                case 4: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 2, 0, dh, dl); break;
                case 3: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 1, 1, dh, dl); break;
                default: i8a_ktile_dots_avx2(q, kt_s, kt_a, s, j, 1, 0, dh, dl); break;
                }
            }
        }
    }
}

/* Query rows from which the tiled pass is the faster: its transpose is shared by the rows
 * (benchmarks/kpass_avx2.c, one chunk of 256 rows, two planes, Zen 3 VM: tiled / row pass 1.17 at
 * 2 rows, 0.99 at 3, 0.92 at 4, 0.78 at 8 to 128, D = 128; 1.01 at 4, 0.69 at 128, D = 256). */
#define I8A_KTILE_MIN_ROWS_AVX2 4

/* The K pass: tiled for a group of I8A_KTILE_MIN_ROWS_AVX2 rows or more, else row by row; the
 * span's layout a constant (one run: a contiguous cache). */
static inline void i8a_kdots_avx2(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    if (q->nq >= I8A_KTILE_MIN_ROWS_AVX2) {    /* the tiled pass */
        if (i8a_one_run(kv))
            i8a_kdots_tiled_avx2(q, kv, dh, dl, 1);
        else
            i8a_kdots_tiled_avx2(q, kv, dh, dl, 0);
        return;
    }
    if (i8a_one_run(kv))
        i8a_kdots_rows_avx2(q, kv, dh, dl, 1);
    else
        i8a_kdots_rows_avx2(q, kv, dh, dl, 0);
}

/* p[s] = i8a_logit_capped(dh[s], dl[s], ...) for s < n, eight at a time; returns max_s p[s]. */
static inline float i8a_logits_avx2(const int32_t *dh, const int32_t *dl, float c_hi, float c_lo,
                                    int two, float bias, float cap, float inv_cap, const float *ks,
                                    size_t n, float *p)
{
    const __m256 ch = _mm256_set1_ps(c_hi), cl = _mm256_set1_ps(c_lo), vb = _mm256_set1_ps(bias);
    __m256 vmax = _mm256_set1_ps(-FLT_MAX);
    size_t s = 0;
    for (; s + 8 <= n; s += 8) {
        __m256 lg = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(dh + s))), ch);
        if (two)
            lg = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(dl + s))), cl, lg);
        lg = _mm256_add_ps(_mm256_mul_ps(lg, _mm256_loadu_ps(ks + s)), vb);
        if (cap > 0.0f)
            lg = i8a_softcap8_avx2(lg, cap, inv_cap);
        _mm256_store_ps(p + s, lg);
        vmax = _mm256_max_ps(vmax, lg);
    }
    float m = i8a_hmax8_avx2(vmax);
    for (; s < n; s++) {
        p[s] = i8a_logit_capped(dh[s], two ? dl[s] : 0, c_hi, c_lo, two, ks[s], bias, cap, inv_cap);
        m = p[s] > m ? p[s] : m;
    }
    return m;
}

#endif
