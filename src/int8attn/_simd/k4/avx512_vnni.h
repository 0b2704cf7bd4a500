/* k4/avx512_vnni.h: K at 4 bits: each group's q planes, the nibble dots, the logits; the
 * avx512_vnni tier's, bit for bit k4/scalar.h's rule. Included only by ../avx512_vnni.h, inside
 * the tier's target region: its pragma applies to every function here. */
#ifndef I8A_K4_AVX512_VNNI_H
#define I8A_K4_AVX512_VNNI_H

#ifndef I8A_AVX512_VNNI_H
#error "k4/avx512_vnni.h is included by ../avx512_vnni.h only"
#endif

/* A K group's planes in the order of this tier's code vectors: 32 bytes of a row (two blocks)
 * unpack to the low nibbles, channels 32 b + i, and the high ones, 32 b + 16 + i (b = 0, 1, i
 * < 16). lo / hi [d / 2] take plane q's bytes in those orders. */
static inline void i8a_k4_order_avx512_vnni(const int8_t *q, size_t d, int8_t *lo, int8_t *hi)
{
    for (size_t b = 0; b < d / I8A_NIB_BLOCK; b++) {
        memcpy(lo + 16 * b, q + I8A_NIB_BLOCK * b, 16);
        memcpy(hi + 16 * b, q + I8A_NIB_BLOCK * b + 16, 16);
    }
}

/* Exact dots of NP ordered q planes (lo, hi: [NP][I8A_MAX_HEAD_DIM / 2]) with rows [0, n) of
 * K at 4 bits, four rows at a time (codes unsigned, planes signed: vpdpbusd as it is; a row's
 * last 16 bytes when d / 2 is an odd number of them load with zeros past the row):
 * dot[k * I8A_K4_GROUP + s]. n <= I8A_K4_GROUP. NP is a constant at every call. */
I8A_INLINE void i8a_k4dots_avx512_vnni(const uint8_t *k4, size_t n, size_t d, const int8_t *lo,
                                       const int8_t *hi, int np, int32_t *dot)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m128i none = _mm_setzero_si128();
    for (size_t s = 0; s < n; s += 4) {
        const uint8_t *r[4];
        for (int u = 0; u < 4; u++)
            r[u] = k4 + (s + (size_t)u < n ? s + (size_t)u : n - 1) * (d / 2);
        __m256i acc[4][I8A_K4_QPLANES];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
#pragma GCC unroll 3
            for (int k = 0; k < np; k++)
                acc[u][k] = _mm256_setzero_si256();
        for (size_t j = 0; j < d / 2; j += 32) {
            __m256i cl[4], ch[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m256i x = i8a_load32_avx512_vnni((const int8_t *)r[u], j, d / 2);
                cl[u] = _mm256_and_si256(x, nib);
                ch[u] = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
            }
#pragma GCC unroll 3
            for (int k = 0; k < np; k++) {
                const __m256i ql = _mm256_loadu_si256((const __m256i *)(lo + k * (I8A_MAX_HEAD_DIM / 2) + j));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(hi + k * (I8A_MAX_HEAD_DIM / 2) + j));
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    acc[u][k] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc[u][k], cl[u], ql), ch[u], qh);
            }
        }
#pragma GCC unroll 3
        for (int k = 0; k < np; k++) {
            int32_t four[4];
            _mm_storeu_si128((__m128i *)four, i8a_reduce4x256_avx512_vnni(acc[0][k], acc[1][k],
                                                                          acc[2][k], acc[3][k], none));
            for (size_t u = 0; u < 4 && s + u < n; u++)
                dot[(size_t)k * I8A_K4_GROUP + s + u] = four[u];
        }
    }
}

/* p [n] = i8a_logit4 of NP plane dots (dot[k * I8A_K4_GROUP + s]), sixteen at a time; returns
 * their max (-FLT_MAX for none). */
I8A_INLINE float i8a_logits4_avx512_vnni(const int32_t *dot, const float *c, int np, float bias,
                                         float cap, float inv_cap, size_t n, float *p)
{
    __m512 vmax = _mm512_set1_ps(-FLT_MAX);
    for (size_t s = 0; s < n; s += 16) {
        const __mmask16 live = n - s >= 16 ? 0xffff : (__mmask16)((1u << (n - s)) - 1);
        __m512 lg = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(live, dot + s)),
                                  _mm512_set1_ps(c[0]));
#pragma GCC unroll 3
        for (int k = 1; k < np; k++)
            lg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(live, dot + (size_t)k * I8A_K4_GROUP + s)),
                                 _mm512_set1_ps(c[k]), lg);
        lg = _mm512_add_ps(lg, _mm512_set1_ps(bias));
        if (cap > 0.0f)
            lg = i8a_softcap16_avx512_vnni(lg, cap, inv_cap);
        _mm512_mask_storeu_ps(p + s, live, lg);
        vmax = _mm512_mask_max_ps(vmax, live, vmax, lg);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* k4/scalar.h's i8a_k4_query with this tier's vectors: the steps and minima widened by
 * vcvtph2ps (exact), the planes' bytes by vcvtps2dq (nearest even under the default MXCSR)
 * clamped as integers, the bias by one 16-lane accumulator (dot16's order) and the lane fold. */
static inline void i8a_k4_query_avx512_vnni(const float *qs, const uint16_t *h_min,
                                            float min_scale, const uint16_t *h_step,
                                            float step_scale, size_t d, int planes, int8_t *q,
                                            float *c, float *bias, float *r)
{
    const __m512 ss = _mm512_set1_ps(step_scale);
    __m512 acc = _mm512_setzero_ps(), most = _mm512_setzero_ps();
    for (size_t i = 0; i < d; i += 16) {
        const __m512 x = _mm512_loadu_ps(qs + i);
        const __m512 y = _mm512_mul_ps(x, _mm512_mul_ps(i8a_halves16_avx512_vnni(h_step + i), ss));
        _mm512_storeu_ps(r + i, y);
        most = _mm512_max_ps(most, _mm512_abs_ps(y));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, i8a_halves16_avx512_vnni(h_min + i)));
    }
    float inv[I8A_K4_QPLANES];
    i8a_k4_scales(_mm512_reduce_max_ps(most), planes, c, inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (size_t i = 0; i < d; i += 16) {
        __m512 x = _mm512_loadu_ps(r + i);
        for (int k = 0; k < planes; k++) {
            __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inv[k])));
            b = _mm512_min_epi32(_mm512_max_epi32(b, lo), hi);
            _mm_storeu_si128((__m128i *)(q + (size_t)k * I8A_MAX_HEAD_DIM + i), _mm512_cvtepi32_epi8(b));
            x = _mm512_sub_ps(x, _mm512_mul_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(c[k])));
        }
    }
    *bias = i8a_fold16_avx512_vnni(acc) * min_scale;
}

/* The logits of query head j against the span's K rows at 4 bits (k4/scalar.h's
 * i8a_logits4_scalar, group by group); returns their max. */
I8A_INLINE float i8a_k4_logits_avx512_vnni(const i8a_query *q, const i8a_span *kv, size_t j,
                                           float *p, uint8_t *extra, int np)
{
    const size_t d = q->d, n = kv->n, half = I8A_MAX_HEAD_DIM / 2;
    int8_t *planes = (int8_t *)extra, *lo = planes + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM;
    int8_t *hi = lo + I8A_K4_QPLANES * half;
    float *tmp = (float *)(hi + I8A_K4_QPLANES * half);
    int32_t *dot = (int32_t *)(tmp + I8A_MAX_HEAD_DIM);
    int8_t pw[I8A_K4_QPLANES * I8A_K4_WIDE_STRIDE];    /* the wide channels' planes */
    float m = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query_avx512_vnni(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                                 kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c,
                                 &bias, tmp);
        for (int k = 0; k < np; k++)
            i8a_k4_order_avx512_vnni(planes + k * I8A_MAX_HEAD_DIM, d, lo + k * half, hi + k * half);
        if (j == 0)   /* the next chunk's K, a group's rows at a time */
            i8a_k4_prefetch_group(kv, s, rows, d);
        i8a_k4dots_avx512_vnni(kv->k4 + s * (d / 2), rows, d, lo, hi, np, dot);
        if (i8a_k4_wide_planes(kv->k4_step + grp * d, d, planes, np, pw))
            i8a_k4_wide_dots(kv->k4_wide + s * I8A_K4_WIDE_BYTES(d), rows, d, pw, np, dot);
        const float gm = i8a_logits4_avx512_vnni(dot, c, np, bias, q->softcap, q->inv_softcap,
                                                 rows, p + s);
        m = gm > m ? gm : m;
        s += rows;
    }
    return m;
}

/* The tiled K pass at 4 bits, for groups of two query heads or more (the 8-bit one's tiles,
 * kdots/avx512_vnni.h, with the codes unsigned as they are, so no offset to correct): 16 rows of
 * a K group are unpacked and transposed once, and each head's planes' dots are then one
 * vpdpbusd per quad, the plane's word broadcast, landing in row order: no row sums to reduce,
 * and the unpacking shared by the heads. The dots are exact, so the logits are the row pass's
 * bits. */

/* Dims [i, i + 64) of a K row at 4 bits as 64 unsigned bytes in dim order (block b's low
 * nibbles are dims 32 b + [0, 16), its high ones 32 b + [16, 32)); zeros past d. */
I8A_INLINE __m512i i8a_k4_unpack64_avx512_vnni(const uint8_t *row, size_t i, size_t d)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i x = i8a_load32_avx512_vnni((const int8_t *)row, i / 2, d / 2);
    const __m256i lo = _mm256_and_si256(x, nib), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  /* lo0 lo1 hi0 hi1 */
    return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));              /* lo0 hi0 lo1 hi1 */
}

/* The tiles of rows [0, rows) of K at 4 bits from k4 (rows <= 16; the rows past them repeat the
 * last), as i8a_ktiles_avx512_vnni makes them of 8-bit rows. */
I8A_INLINE void i8a_k4tiles_avx512_vnni(const uint8_t *k4, size_t rows, size_t d, uint8_t *kt)
{
    const uint8_t *src[I8A_KTILE_ROWS];
    for (size_t r = 0; r < I8A_KTILE_ROWS; r++)
        src[r] = k4 + (r < rows ? r : rows - 1) * (d / 2);
    for (size_t i = 0; i < d; i += 64) {
        __m512i r[I8A_KTILE_ROWS];
        for (int k = 0; k < I8A_KTILE_ROWS; k++)
            r[k] = i8a_k4_unpack64_avx512_vnni(src[k], i, d);
        i8a_transpose16_avx512_vnni(r, i, d, kt);
    }
}

/* The dots of the tile kt's 16 rows with NP planes of NH heads (head h's plane k at planes + (h
 * * I8A_K4_QPLANES + k) * I8A_MAX_HEAD_DIM): dot[(h * I8A_K4_QPLANES + k) * I8A_K4_GROUP + r]
 * for r < 16. NH <= 4 and NP are constants at every call (12 accumulators at most). */
I8A_INLINE void i8a_k4tile_dots_avx512_vnni(const uint8_t *kt, size_t d, const int8_t *planes,
                                            int nh, int np, int32_t *dot)
{
    __m512i acc[4][I8A_K4_QPLANES];
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < np; k++)
            acc[h][k] = _mm512_setzero_si512();
    for (size_t c = 0; c < d / 4; c++) {
        const __m512i x = _mm512_load_si512((const void *)(kt + 64 * c));
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
            for (int k = 0; k < np; k++) {
                int32_t w;
                memcpy(&w, planes + ((size_t)h * I8A_K4_QPLANES + (size_t)k) * I8A_MAX_HEAD_DIM
                           + 4 * c, sizeof w);
                acc[h][k] = _mm512_dpbusd_epi32(acc[h][k], x, _mm512_set1_epi32(w));
            }
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 3
        for (int k = 0; k < np; k++)
            _mm512_storeu_si512((void *)(dot + ((size_t)h * I8A_K4_QPLANES + (size_t)k) * I8A_K4_GROUP),
                                acc[h][k]);
}

/* p_j = scratch + j * I8A_CHUNK [n] the logits of every query head j against the span's K rows
 * at 4 bits with NP planes, group by group (k4/scalar.h's i8a_logits4_scalar), and m[j] their
 * max: per group each head's planes (i8a_k4_query_avx512_vnni), then the group's tiles, each
 * made once for I8A_K4_TILE_HEADS heads. extra: I8A_ATTEND4_EXTRA bytes. */
I8A_INLINE void i8a_k4_logits_tiled_avx512_vnni(const i8a_query *q, const i8a_span *kv,
                                                float *scratch, uint8_t *extra, int np, float *m)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    int8_t *planes = (int8_t *)extra;  /* [I8A_K4_TILE_HEADS][I8A_K4_QPLANES][I8A_MAX_HEAD_DIM] */
    float *tmp = (float *)(planes + I8A_K4_TILE_HEADS * I8A_K4_QPLANES * I8A_MAX_HEAD_DIM);
    float *cs = tmp + I8A_MAX_HEAD_DIM;                     /* [heads][I8A_K4_QPLANES] */
    float *bias = cs + I8A_K4_TILE_HEADS * I8A_K4_QPLANES;  /* [heads] */
    int32_t *dot = (int32_t *)(bias + I8A_K4_TILE_HEADS);   /* [heads][planes][I8A_K4_GROUP] */
    _Alignas(64) uint8_t kt[I8A_KTILE_ROWS * I8A_MAX_HEAD_DIM];
    int8_t pw[I8A_K4_QPLANES * I8A_K4_WIDE_STRIDE];    /* a head's wide channels' planes */
    for (size_t j = 0; j < nq; j++)
        m[j] = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        i8a_k4_prefetch_group(kv, s, rows, d);         /* the next chunk's K */
        for (size_t j0 = 0; j0 < nq; j0 += I8A_K4_TILE_HEADS) {
            const size_t j1 = nq - j0 < I8A_K4_TILE_HEADS ? nq : j0 + I8A_K4_TILE_HEADS;
            for (size_t j = j0; j < j1; j++)
                i8a_k4_query_avx512_vnni(q->q_float + j * d, kv->k4_min + grp * d,
                                         kv->k4_min_scale[grp], kv->k4_step + grp * d,
                                         kv->k4_step_scale[grp], d, np,
                                         planes + (j - j0) * I8A_K4_QPLANES * I8A_MAX_HEAD_DIM,
                                         cs + (j - j0) * I8A_K4_QPLANES, bias + (j - j0), tmp);
            for (size_t t = 0; t < rows; t += I8A_KTILE_ROWS) {
                const size_t tr = rows - t < I8A_KTILE_ROWS ? rows - t : I8A_KTILE_ROWS;
                i8a_k4tiles_avx512_vnni(kv->k4 + (s + t) * (d / 2), tr, d, kt);
                for (size_t j = j0; j < j1; j += 4) {
                    const int nh = j1 - j >= 4 ? 4 : (int)(j1 - j);
                    const int8_t *pl = planes + (j - j0) * I8A_K4_QPLANES * I8A_MAX_HEAD_DIM;
                    int32_t *dt = dot + (j - j0) * I8A_K4_QPLANES * I8A_K4_GROUP + t;
                    switch (nh * 2 + (np > 1)) {    /* NH and NP as constants */
                    case 9: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 4, I8A_K4_QPLANES, dt); break;
                    case 8: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 4, 1, dt); break;
                    case 7: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 3, I8A_K4_QPLANES, dt); break;
                    case 6: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 3, 1, dt); break;
                    case 5: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 2, I8A_K4_QPLANES, dt); break;
                    case 4: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 2, 1, dt); break;
                    case 3: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 1, I8A_K4_QPLANES, dt); break;
                    default: i8a_k4tile_dots_avx512_vnni(kt, d, pl, 1, 1, dt); break;
                    }
                }
            }
            for (size_t j = j0; j < j1; j++) {
                const size_t h = j - j0;
                if (i8a_k4_wide_planes(kv->k4_step + grp * d, d,
                                       planes + h * I8A_K4_QPLANES * I8A_MAX_HEAD_DIM, np, pw))
                    i8a_k4_wide_dots(kv->k4_wide + s * I8A_K4_WIDE_BYTES(d), rows, d, pw, np,
                                     dot + h * I8A_K4_QPLANES * I8A_K4_GROUP);
                const float gm = i8a_logits4_avx512_vnni(dot + (j - j0) * I8A_K4_QPLANES * I8A_K4_GROUP,
                                                         cs + (j - j0) * I8A_K4_QPLANES, np,
                                                         bias[j - j0], q->softcap, q->inv_softcap,
                                                         rows, scratch + j * I8A_CHUNK + s);
                m[j] = gm > m[j] ? gm : m[j];
            }
        }
        s += rows;
    }
}

_Static_assert(I8A_K4_QPLANES <= 3 && I8A_K4_GROUP == 2 * I8A_KTILE_ROWS,
               "the tiled K pass at 4 bits: its planes and a group's two tiles fit "
               "I8A_ATTEND4_EXTRA's layout");

#endif
