/* k4/avx2.h: K at 4 bits: each group's q planes, the nibble dots, the logits; the avx2 tier's,
 * bit for bit k4/scalar.h's rule. Included only by ../avx2.h, inside the tier's target region:
 * its pragma applies to every function here. */
#ifndef I8A_K4_AVX2_H
#define I8A_K4_AVX2_H

#ifndef I8A_AVX2_H
#error "k4/avx2.h is included by ../avx2.h only"
#endif

/* k4/scalar.h's i8a_k4_query on 8 lanes: the steps and minima widened by F16C (exact), the planes'
 * bytes by vcvtps2dq (nearest even under the default MXCSR) clamped as integers, the bias in
 * dot16's order (two vectors of the sixteen lanes, folded). */
static inline void i8a_k4_query_avx2(const float *qs, const uint16_t *h_min, float min_scale,
                                     const uint16_t *h_step, float step_scale, size_t d,
                                     int planes, int8_t *q, float *c, float *bias, float *r)
{
    const __m256 ss = _mm256_set1_ps(step_scale);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, most = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t i = 0; i < d; i += 16) {
        for (int b = 0; b < 2; b++) {
            const __m256 x = _mm256_loadu_ps(qs + i + 8 * b);
            const __m256 y = _mm256_mul_ps(x, _mm256_mul_ps(i8a_halves8_avx2(h_step + i + 8 * b), ss));
            _mm256_storeu_ps(r + i + 8 * b, y);
            most = _mm256_max_ps(most, _mm256_andnot_ps(sign, y));
            acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(x, i8a_halves8_avx2(h_min + i + 8 * b)));
        }
    }
    float inv[I8A_K4_QPLANES];
    i8a_k4_scales(i8a_hmax8_avx2(most), planes, c, inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t i = 0; i < d; i += 16) {
        __m256 x[2] = {_mm256_loadu_ps(r + i), _mm256_loadu_ps(r + i + 8)};
        for (int k = 0; k < planes; k++) {
            __m256i b[2];
            for (int u = 0; u < 2; u++) {
                b[u] = _mm256_cvtps_epi32(_mm256_mul_ps(x[u], _mm256_set1_ps(inv[k])));
                b[u] = _mm256_min_epi32(_mm256_max_epi32(b[u], lo), hi);
                x[u] = _mm256_sub_ps(x[u], _mm256_mul_ps(_mm256_cvtepi32_ps(b[u]), _mm256_set1_ps(c[k])));
            }
            /* packs: [a0-3 b0-3 | a4-7 b4-7] as 16 bits, then bytes; words 0 4 1 5 */
            const __m256i pk = _mm256_packs_epi16(_mm256_packs_epi32(b[0], b[1]), _mm256_setzero_si256());
            _mm_storeu_si128((__m128i *)(q + (size_t)k * I8A_MAX_HEAD_DIM + i),
                             _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pk, order)));
        }
    }
    *bias = i8a_fold16_avx2(acc[0], acc[1]) * min_scale;
}

/* The int16 pair sums of 32 codes (unsigned, 0 .. 15) and 32 plane bytes (signed): vpmaddubsw,
 * at most 2 * 15 * 127 a pair. */
static inline __m256i i8a_pairs4_avx2(__m256i codes, const int8_t *q)
{
    return _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)q));
}

/* 32 fifth bits of a K row from b (the row's bytes from there: 4, or 2 with `two`) as 32
 * bytes 0 or 1, bit t % 8 of byte t / 8 in lane t (zeros past them). */
static inline __m256i i8a_k4_bits32_avx2(const uint8_t *b, int two)
{
    uint32_t x;
    if (two) {
        uint16_t h;
        memcpy(&h, b, sizeof h);
        x = h;
    } else {
        memcpy(&x, b, sizeof x);
    }
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_min_epu8(_mm256_and_si256(sel, bit), _mm256_set1_epi8(1));
}

/* Exact dots of NP q planes ([NP][I8A_MAX_HEAD_DIM], natural order) with rows [0, n) of K at 4
 * bits, four rows at a time, every plane from one unpacking: a row's 32 bytes (two blocks)
 * unpack to the low nibbles, channels 32 b + i, and the high ones, 32 b + 16 + i, matched by the
 * plane's bytes in that order (lo, hi: [NP][I8A_MAX_HEAD_DIM / 2], i8a_k4_order). With `wide`
 * (the rows' fifth bits, I8A_K4_WIDE_BYTES(d) a row; pw: i8a_k4_wide_planes_avx2), the same 32
 * bytes' ranks (32 b .. 32 b + 31) add 16 times their bits' vpmaddubsw with the wide channels'
 * plane bytes. The int16 pair sums of a row add before vpmaddwd widens them, over up to 128
 * bytes (8 nibble pair sums: at most 8 * 3810 < 2^15), with fifth bits over 64 (4 nibble pair
 * sums and 2 of bits: 4 * 3810 + 2 * 16 * 254 < 2^15): dot[k * I8A_K4_GROUP + s], up to the
 * next multiple of 4 past n (those unused). NP is a constant at every call. */
I8A_INLINE void i8a_k4dots_avx2(const uint8_t *k4, const uint8_t *wide, size_t n, size_t d,
                                const int8_t *lo, const int8_t *hi, const int8_t *pw, int np,
                                int32_t *dot)
{
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const size_t bytes = d / 2, nb = I8A_K4_WIDE_BYTES(d), half = I8A_MAX_HEAD_DIM / 2;
    const size_t block = wide ? 64 : 128;
    for (size_t s = 0; s < n; s += 4) {
        size_t row[4];
        for (int u = 0; u < 4; u++)
            row[u] = s + (size_t)u < n ? s + (size_t)u : n - 1;
        __m256i acc[I8A_K4_QPLANES][4];
#pragma GCC unroll 3
        for (int k = 0; k < np; k++)
            for (int u = 0; u < 4; u++)
                acc[k][u] = _mm256_setzero_si256();
        for (size_t j0 = 0; j0 < bytes; j0 += block) {
            const size_t j1 = j0 + block < bytes ? j0 + block : bytes;
            __m256i p16[I8A_K4_QPLANES][4];
#pragma GCC unroll 3
            for (int k = 0; k < np; k++)
                for (int u = 0; u < 4; u++)
                    p16[k][u] = _mm256_setzero_si256();
            for (size_t j = j0; j < j1; j += 32) {
                const int tail = j + 32 > bytes;    /* a last 16 bytes: zeros past the row */
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) {
                    const uint8_t *r = k4 + row[u] * bytes + j;
                    const __m256i x = tail ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)r))
                                           : _mm256_loadu_si256((const __m256i *)r);
                    const __m256i cl = _mm256_and_si256(x, nib);
                    const __m256i ch = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
                    __m256i e = _mm256_setzero_si256();
                    if (wide)
                        e = i8a_k4_bits32_avx2(wide + row[u] * nb + j / 8, tail);
#pragma GCC unroll 3
                    for (int k = 0; k < np; k++) {
                        __m256i t = _mm256_add_epi16(i8a_pairs4_avx2(cl, lo + (size_t)k * half + j),
                                                     i8a_pairs4_avx2(ch, hi + (size_t)k * half + j));
                        if (wide) {
                            const __m256i w = _mm256_loadu_si256((const __m256i *)(pw + (size_t)k * I8A_K4_WIDE_STRIDE + j));
                            t = _mm256_add_epi16(t, _mm256_slli_epi16(_mm256_maddubs_epi16(e, w), 4));
                        }
                        p16[k][u] = _mm256_add_epi16(p16[k][u], t);
                    }
                }
            }
#pragma GCC unroll 3
            for (int k = 0; k < np; k++)
                for (int u = 0; u < 4; u++)
                    acc[k][u] = _mm256_add_epi32(acc[k][u], _mm256_madd_epi16(p16[k][u], ones));
        }
#pragma GCC unroll 3
        for (int k = 0; k < np; k++)
            _mm_storeu_si128((__m128i *)(dot + (size_t)k * I8A_K4_GROUP + s),
                             i8a_reduce4_avx2(acc[k][0], acc[k][1], acc[k][2], acc[k][3]));
    }
}

/* k4/scalar.h's i8a_k4_wide_planes: the parities of 32 steps at a time by vpmovmskb, limited
 * (i8a_k4_wide_limit); then 8 channels at a time, each plane's 8 bytes packed by vpshufb
 * (i8a_k4_pack8) and stored at the count so far (the next store, or the zeros after, overwrite
 * the bytes past it: I8A_K4_WIDE_STRIDE leaves room). The same bytes as the scalar rule's. */
static inline size_t i8a_k4_wide_planes_avx2(const uint16_t *h_step, size_t d,
                                             const int8_t *planes, int np, int8_t *pw)
{
    uint8_t mask[I8A_MAX_HEAD_DIM / 8];
    for (size_t i = 0; i < d; i += 32) {
        const __m256i a = _mm256_slli_epi16(_mm256_loadu_si256((const __m256i *)(h_step + i)), 15);
        const __m256i b = i + 32 <= d ? _mm256_slli_epi16(_mm256_loadu_si256((const __m256i *)(h_step + i + 16)), 15)
                                      : _mm256_setzero_si256();
        /* packs: [a 0-7, b 0-7 | a 8-15, b 8-15]; quads 0 2 1 3 put them in channel order */
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi16(a, b), 0xD8);
        const uint32_t m = (uint32_t)_mm256_movemask_epi8(p);
        memcpy(mask + i / 8, &m, i + 32 <= d ? 4 : 2);
    }
    i8a_k4_wide_limit(mask, d);
    size_t r = 0;
    for (size_t i = 0; i < d; i += 8) {
        const __m128i sh = _mm_cvtsi64_si128((long long)i8a_k4_pack8(mask[i / 8]));
        for (int k = 0; k < np; k++) {
            const __m128i x = _mm_loadl_epi64((const __m128i *)(planes + (size_t)k * I8A_MAX_HEAD_DIM + i));
            _mm_storel_epi64((__m128i *)(pw + (size_t)k * I8A_K4_WIDE_STRIDE + r), _mm_shuffle_epi8(x, sh));
        }
        r += i8a_popcount8(mask[i / 8]);
    }
    return i8a_k4_wide_pad(pw, np, r, d);
}

/* A K group's planes in the order of 32-byte code vectors (two blocks: low nibbles of both,
 * then high). */
static inline void i8a_k4_order_avx2(const int8_t *q, size_t d, int8_t *lo, int8_t *hi)
{
    for (size_t b = 0; b < d / I8A_NIB_BLOCK; b++) {
        memcpy(lo + 16 * b, q + I8A_NIB_BLOCK * b, 16);
        memcpy(hi + 16 * b, q + I8A_NIB_BLOCK * b + 16, 16);
    }
}

/* p [n] = i8a_logit4 of NP plane dots, eight at a time (the rest one by one); returns their
 * max (-FLT_MAX for none). */
static inline float i8a_logits4_avx2(const int32_t *dot, const float *c, int np, float bias,
                                     float cap, float inv_cap, size_t n, float *p)
{
    __m256 vmax = _mm256_set1_ps(-FLT_MAX);
    size_t s = 0;
    for (; s + 8 <= n; s += 8) {
        __m256 lg = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(dot + s))),
                                  _mm256_set1_ps(c[0]));
        for (int k = 1; k < np; k++)
            lg = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(dot + (size_t)k * I8A_K4_GROUP + s))),
                                 _mm256_set1_ps(c[k]), lg);
        lg = _mm256_add_ps(lg, _mm256_set1_ps(bias));
        if (cap > 0.0f)
            lg = i8a_softcap8_avx2(lg, cap, inv_cap);
        _mm256_storeu_ps(p + s, lg);
        vmax = _mm256_max_ps(vmax, lg);
    }
    float m = i8a_hmax8_avx2(vmax);
    for (; s < n; s++) {
        int32_t one[I8A_K4_QPLANES];
        for (int k = 0; k < np; k++)
            one[k] = dot[(size_t)k * I8A_K4_GROUP + s];
        p[s] = i8a_logit4(one, c, np, bias, cap, inv_cap);
        m = p[s] > m ? p[s] : m;
    }
    return m;
}

/* The logits of query head j against the span's K rows at 4 bits, group by group; returns
 * their max. extra: I8A_ATTEND4_EXTRA bytes. */
I8A_INLINE float i8a_k4_logits_avx2(const i8a_query *q, const i8a_span *kv, size_t j, float *p,
                                    uint8_t *extra, int np)
{
    const size_t d = q->d, n = kv->n, half = I8A_MAX_HEAD_DIM / 2;
    int8_t *planes = (int8_t *)extra, *lo = planes + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM;
    int8_t *hi = lo + I8A_K4_QPLANES * half;
    float *r = (float *)(hi + I8A_K4_QPLANES * half);
    int32_t *dot = (int32_t *)(r + I8A_MAX_HEAD_DIM);
    int8_t pw[I8A_K4_QPLANES * I8A_K4_WIDE_STRIDE];    /* the wide channels' planes */
    float m = -FLT_MAX;
    size_t s = 0;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead, rows = (end < n ? end : n) - s;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query_avx2(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                          kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c, &bias, r);
        for (int k = 0; k < np; k++)
            i8a_k4_order_avx2(planes + k * I8A_MAX_HEAD_DIM, d, lo + k * half, hi + k * half);
        if (j == 0)   /* the next chunk's K, a group's rows at a time */
            i8a_k4_prefetch_group(kv, s, rows, d);
        /* two calls: the pass inlined with its fifth bits and without (a NULL constant) */
        if (i8a_k4_wide_planes_avx2(kv->k4_step + grp * d, d, planes, np, pw))
            i8a_k4dots_avx2(kv->k4 + s * (d / 2), kv->k4_wide + s * I8A_K4_WIDE_BYTES(d), rows,
                            d, lo, hi, pw, np, dot);
        else
            i8a_k4dots_avx2(kv->k4 + s * (d / 2), NULL, rows, d, lo, hi, pw, np, dot);
        const float gm = i8a_logits4_avx2(dot, c, np, bias, q->softcap, q->inv_softcap, rows, p + s);
        m = gm > m ? gm : m;
        s += rows;
    }
    return m;
}

#endif
