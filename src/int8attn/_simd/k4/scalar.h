/* k4/scalar.h: K at 4 bits: each group's q planes, the nibble dots, the logits. The rule every
 * tier equals bit for bit (the scalar forms, in the contract's order) and the scalar tier's
 * entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h in dependency
 * order. */
#ifndef I8A_K4_SCALAR_H
#define I8A_K4_SCALAR_H

/* Element i of a row of nibble blocks (a K row at 4 bits). */
static inline int32_t i8a_nib_row(const uint8_t *row, size_t i)
{
    const uint8_t b = row[i / I8A_NIB_BLOCK * 16 + i % 16];
    return i % I8A_NIB_BLOCK < 16 ? b & 15 : b >> 4;
}

/* K at 4 bits, the wide channels (dispatch.h): rank [d] of each channel, r for the wide one of
 * rank r < d / 2 (odd step half), -1 for the others. */
static inline void i8a_k4_wide_ranks(const uint16_t *h_step, size_t d, int16_t *rank)
{
    size_t r = 0;
    for (size_t i = 0; i < d; i++) {
        const int wide = (h_step[i] & 1u) && r < d / 2;
        rank[i] = wide ? (int16_t)r : -1;
        r += (size_t)wide;
    }
}

/* Element i of a K row at 4 bits (row: its nibble blocks, wide: its I8A_K4_WIDE_BYTES, rank:
 * its group's i8a_k4_wide_ranks): 0 .. 31. */
static inline int32_t i8a_k4_code(const uint8_t *row, const uint8_t *wide, const int16_t *rank,
                                  size_t i)
{
    const int32_t r = rank[i];
    return i8a_nib_row(row, i) + (r < 0 ? 0 : 16 * ((wide[r / 8] >> (r % 8)) & 1));
}

/* The q planes of one query row against one K group at 4 bits, qs [d] the row times the
 * softmax scale:
 *   step_i = half(h_step[i]) * step_scale;  q'_i = qs_i * step_i;  a = max_i |q'_i|;
 *   a below I8A_ABSMAX_MIN: every plane 0, c_k = 0; else c_0 = a / 127, inv_0 = 127 / a, and
 *   each plane 254 times finer than the one before: c_k = c_(k-1) / 254, inv_k = inv_(k-1) * 254;
 *   per element, x = q'_i, then for each plane: b = clamp(rint(x * inv_k), -127, 127), the
 *   plane's byte; x = x - float(b) * c_k (multiply, then subtract);
 *   bias = dot16(qs, h_min) * min_scale;
 * so that qs . k = bias + sum_i q'_i code_i, with q' within c_(planes-1) / 2 (each residual
 * lies within half the step of its plane: 254 steps of the next cover it). Three planes with
 * q_bits=16, not two as for K at 8 bits: q' carries each channel's step, and K's outlier
 * channels (steps 20x the others') leave the other channels few steps of two planes (1.05e-3
 * against the contract's 1e-3 on such K). One plane with q_bits=8. Plane k is at q + k *
 * I8A_MAX_HEAD_DIM; r: d floats of scratch. */
#define I8A_K4_QPLANES 3

static inline void i8a_k4_scales(float a, int planes, float *c, float *inv)
{
    const int some = a >= I8A_ABSMAX_MIN;
    c[0] = some ? a / 127.0f : 0.0f;
    inv[0] = some ? 127.0f / a : 0.0f;
    for (int k = 1; k < planes; k++) {
        c[k] = c[k - 1] / 254.0f;
        inv[k] = inv[k - 1] * 254.0f;
    }
}

static inline int8_t i8a_k4_plane_byte(float x, float inv)
{
    float b = rintf(x * inv);
    b = b > 127.0f ? 127.0f : b;
    return (int8_t)(b < -127.0f ? -127.0f : b);
}

static inline void i8a_k4_query(const float *qs, const uint16_t *h_min, float min_scale,
                                const uint16_t *h_step, float step_scale, size_t d, int planes,
                                int8_t *q, float *c, float *bias, float *r)
{
    float a = 0.0f, inv[I8A_K4_QPLANES];
    for (size_t i = 0; i < d; i++) {
        r[i] = qs[i] * (i8a_half_value(h_step[i]) * step_scale);
        a = fabsf(r[i]) > a ? fabsf(r[i]) : a;
    }
    i8a_k4_scales(a, planes, c, inv);
    for (size_t i = 0; i < d; i++) {
        float x = r[i];
        for (int k = 0; k < planes; k++) {
            const int8_t b = i8a_k4_plane_byte(x, inv[k]);
            q[(size_t)k * I8A_MAX_HEAD_DIM + i] = b;
            x = x - (float)b * c[k];
        }
    }
    *bias = i8a_dot16_halves(qs, h_min, d) * min_scale;
}

/* A K group's wide channels' plane bytes: pw[k * I8A_K4_WIDE_STRIDE + r] = plane k's byte of
 * the wide channel of rank r (planes as i8a_k4_query makes them), zeros after the last up to
 * d / 2 rounded up to 32 (what the vector tiers read); returns how many there are (0: none,
 * the group's dots are its nibbles'). The parities of 64 channels at a time make a mask, and
 * its set bits, lowest first, the ranks. A plane's stride leaves 8 bytes past d / 2 for the
 * vector tiers' stores of 8 bytes at any count. */
#define I8A_K4_WIDE_STRIDE (I8A_MAX_HEAD_DIM / 2 + 8)

/* The zeros of i8a_k4_wide_planes: each plane's bytes from rank r (the count) up to d / 2
 * rounded up to 32; returns r. */
static inline size_t i8a_k4_wide_pad(int8_t *pw, int np, size_t r, size_t d)
{
    const size_t end = (d / 2 + 31) / 32 * 32;
    for (int k = 0; k < np; k++)
        memset(pw + (size_t)k * I8A_K4_WIDE_STRIDE + r, 0, end - r);
    return r;
}

static inline size_t i8a_k4_wide_planes(const uint16_t *h_step, size_t d, const int8_t *planes,
                                        int np, int8_t *pw)
{
    size_t r = 0;
    for (size_t i0 = 0; i0 < d; i0 += 64) {
        const size_t n = d - i0 < 64 ? d - i0 : 64;
        uint64_t m = 0;
        for (size_t i = 0; i < n; i++)
            m |= (uint64_t)(h_step[i0 + i] & 1u) << i;
        for (; m && r < d / 2; m &= m - 1, r++) {
            const size_t i = i0 + i8a_ctz64(m);
            for (int k = 0; k < np; k++)
                pw[(size_t)k * I8A_K4_WIDE_STRIDE + r] = planes[(size_t)k * I8A_MAX_HEAD_DIM + i];
        }
    }
    return i8a_k4_wide_pad(pw, np, r, d);
}

/* The set bits of m (8 bits). */
static inline unsigned i8a_popcount8(unsigned m)
{
    m = m - ((m >> 1) & 0x55u);
    m = (m & 0x33u) + ((m >> 2) & 0x33u);
    return (m + (m >> 4)) & 0x0fu;
}

/* For the vector tiers' i8a_k4_wide_planes: the wide channels' mask (bit i % 8 of mask[i / 8]
 * set for channel i's odd step half) cleared past its first d / 2 set bits (there are more only
 * in files from before the wide channels). */
static inline void i8a_k4_wide_limit(uint8_t *mask, size_t d)
{
    size_t left = d / 2;
    for (size_t b = 0; b < d / 8; b++) {
        unsigned m = mask[b], c = i8a_popcount8(m);
        for (; c > left; c--) {             /* clear the highest set bit */
            unsigned h = m | m >> 1;
            h |= h >> 2;
            h |= h >> 4;
            m &= ~(h ^ (h >> 1));
        }
        mask[b] = (uint8_t)m;
        left -= c;
    }
}

/* The offsets of the set bits of a nibble, lowest first, a byte each (zeros past them). */
static const uint32_t i8a_k4_pack4[16] = {
    0x00000000, 0x00000000, 0x00000001, 0x00000100, 0x00000002, 0x00000200, 0x00000201,
    0x00020100, 0x00000003, 0x00000300, 0x00000301, 0x00030100, 0x00000302, 0x00030200,
    0x00030201, 0x03020100};

/* The byte shuffle (8 offsets in 0 .. 7, one a byte, lowest byte first) that packs the bytes of
 * the set bits of m (8 bits), lowest first, to the front. The bytes past popcount(m) are offsets
 * too, to be overwritten: a vector tier stores all 8 bytes of a shuffle at its count so far. */
static inline uint64_t i8a_k4_pack8(unsigned m)
{
    return (uint64_t)i8a_k4_pack4[m & 15u]
           | (uint64_t)(i8a_k4_pack4[m >> 4] + 0x04040404u) << (8 * i8a_popcount8(m & 15u));
}

/* The fifth bits' part of the plane dots of rows [0, rows) (wide: I8A_K4_WIDE_BYTES(d) bytes a
 * row; pw: i8a_k4_wide_planes): dot[k * I8A_K4_GROUP + s] += 16 * sum_r pw_k[r] * bit_r. Exact:
 * with the nibbles' part, |dot| <= 127 * 31 * d < 2^22, a float's integer. */
static inline void i8a_k4_wide_dots(const uint8_t *wide, size_t rows, size_t d, const int8_t *pw,
                                    int np, int32_t *dot)
{
    const size_t nb = I8A_K4_WIDE_BYTES(d);
    for (size_t s = 0; s < rows; s++) {
        const uint8_t *b = wide + s * nb;
        uint8_t e[I8A_MAX_HEAD_DIM / 2];                /* the bits as bytes */
        for (size_t j = 0; j < nb; j++)
            for (unsigned t = 0; t < 8; t++)
                e[8 * j + t] = (uint8_t)((b[j] >> t) & 1u);
        for (int k = 0; k < np; k++) {
            const int8_t *w = pw + (size_t)k * I8A_K4_WIDE_STRIDE;
            int32_t sum = 0;
            for (size_t r = 0; r < d / 2; r++)
                sum += w[r] * (int32_t)e[r];
            dot[(size_t)k * I8A_K4_GROUP + s] += 16 * sum;
        }
    }
}

/* A logit of K at 4 bits from its `planes` plane dots: lg = float(dot0) * c0, then lg =
 * fma(float(dot_k), c_k, lg) for the planes after it; lg + bias; the soft cap when on (the
 * dots are exact: i8a_k4_wide_dots). */
static inline float i8a_logit4(const int32_t *dot, const float *c, int planes, float bias,
                               float cap, float inv_cap)
{
    float lg = (float)dot[0] * c[0];
    for (int k = 1; k < planes; k++)
        lg = fmaf((float)dot[k], c[k], lg);
    lg = lg + bias;
    return cap > 0.0f ? i8a_softcap(lg, cap, inv_cap) : lg;
}

/* The prefetch hint of a K group at 4 bits: the next chunk's rows [s, s + rows) that exist
 * (next_n of them), while this chunk's group at s is attended (the vector tiers give it once a
 * group). */
static inline void i8a_k4_prefetch_group(const i8a_span *kv, size_t s, size_t rows, size_t d)
{
    if (s < kv->next_n)
        i8a_prefetch_rows(kv->next_k + s * (d / 2),
                          (kv->next_n - s < rows ? kv->next_n - s : rows) * (d / 2));
}

/* The logits of query head j against the span's K rows at 4 bits: each group's planes
 * (i8a_k4_query; three with q_bits=16, one with 8) against its rows' codes (nibbles, then the
 * wide channels' fifth bits: i8a_k4_wide_dots, as every tier adds them), exact int32 dots; p
 * [n]; returns their max. extra: I8A_ATTEND4_EXTRA bytes. */
static inline float i8a_logits4_scalar(const i8a_query *q, const i8a_span *kv, size_t j,
                                       float *p, uint8_t *extra)
{
    const size_t d = q->d, n = kv->n;
    int8_t *planes = (int8_t *)extra;
    float *tmp = (float *)(extra + I8A_K4_QPLANES * I8A_MAX_HEAD_DIM);
    float m = 0.0f;
    size_t s = 0;
    const int np = q->two_planes ? I8A_K4_QPLANES : 1;
    for (size_t grp = 0; s < n; grp++) {
        const size_t end = (grp + 1) * I8A_K4_GROUP - kv->k4_lead;
        float c[I8A_K4_QPLANES], bias;
        i8a_k4_query(q->q_float + j * d, kv->k4_min + grp * d, kv->k4_min_scale[grp],
                     kv->k4_step + grp * d, kv->k4_step_scale[grp], d, np, planes, c, &bias, tmp);
        const size_t rows = (end < n ? end : n) - s;
        int8_t pw[I8A_K4_QPLANES * I8A_K4_WIDE_STRIDE];
        int32_t dot[I8A_K4_QPLANES * I8A_K4_GROUP];
        for (size_t t = 0; t < rows; t++) {
            const uint8_t *row = kv->k4 + (s + t) * (d / 2);
            for (int k = 0; k < np; k++)
                dot[k * I8A_K4_GROUP + t] = 0;
            for (size_t i = 0; i < d; i++) {
                const int32_t code = i8a_nib_row(row, i);
                for (int k = 0; k < np; k++)
                    dot[k * I8A_K4_GROUP + t] += planes[(size_t)k * I8A_MAX_HEAD_DIM + i] * code;
            }
        }
        if (i8a_k4_wide_planes(kv->k4_step + grp * d, d, planes, np, pw))
            i8a_k4_wide_dots(kv->k4_wide + s * I8A_K4_WIDE_BYTES(d), rows, d, pw, np, dot);
        for (size_t t = 0; t < rows; t++, s++) {
            int32_t one[I8A_K4_QPLANES];
            for (int k = 0; k < np; k++)
                one[k] = dot[k * I8A_K4_GROUP + t];
            p[s] = i8a_logit4(one, c, np, bias, q->softcap, q->inv_softcap);
            m = (s == 0 || p[s] > m) ? p[s] : m;
        }
    }
    return m;
}

#endif
