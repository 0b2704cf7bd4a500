/* append, truncate and evict: which rows a position is coded from (the append's own, or the
 * ring's halves), their codes and scales, K's groups at 4 bits, the ring of the recent window,
 * and what a cache that shrank forgets (K's groups past its rows, the offsets). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* K at 4 bits: position pos of kv head g as its group is coded from it: the append's row
 * rounded as the ring rounds it (so the codes do not depend on how appends were split), the
 * ring's row, or (its floats gone after a truncate deeper than the ring) its codes' value. tmp
 * [d] holds the row. */
static const float *k4_row(const row_source *src, size_t pos, size_t g, float *tmp)
{
    const i8a_cache *c = src->c;
    const size_t d = c->head_dim;
    if (pos >= src->x_from) {
        uint16_t h[I8A_MAX_HEAD_DIM];
        const float *x = src->x + ((pos - src->x_from) * c->n_kv_heads + g) * d;
        widen(h, src->kt->half_row(x, d, h), d, tmp);
    } else if (pos >= c->held_from) {
        widen_row(c, src->ring, src->ring_scale, g, slot_of(c, pos), tmp);
    } else {
        i8a_k4_value(c, g, pos, tmp);
    }
    return tmp;
}

/* Descending floats, for qsort (the rows are finite). */
static int descending(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* wide [d]: 1 for the d / 2 channels of the largest spans (ties: the lower channel first). */
static void k4_widest(const float *span, size_t d, uint8_t *wide)
{
    float sorted[I8A_MAX_HEAD_DIM];
    memcpy(sorted, span, d * sizeof(float));
    qsort(sorted, d, sizeof(float), descending);
    const float edge = sorted[d / 2 - 1];
    size_t ties = d / 2;                /* then: how many at the edge are wide */
    for (size_t i = 0; i < d; i++)
        ties -= (size_t)(span[i] > edge);
    for (size_t i = 0; i < d; i++) {
        const int tie = span[i] == edge && ties > 0;
        wide[i] = (uint8_t)(span[i] > edge || tie);
        ties -= (size_t)tie;
    }
}

/* Code group grp of kv head g at 4 bits, its positions all appended (rows by k4_row): per
 * channel lo = min, hi = max over the group's positions (not position 0 when it is kept
 * apart); the minima as halves times a power of two (the tier's half_row), min_i their value;
 * span_i = hi_i - min_i, and the d / 2 channels of the largest spans wide (k4_widest); the steps
 * max(span_i / 31, 0) for a wide channel, max(span_i / 15, 0) else, as halves the same way, each
 * half then made odd for a wide channel (h | 1, unless 0) and even for the others (h & ~1): one
 * unit of the half at most, in the same binade, so the group's power of two stays; step_i their
 * value, and a channel is wide exactly when its half is odd (dispatch.h); code = clamp(rint((x
 * - min_i) * inv_i), 0, 31 wide, 15 else) with inv_i = 1 / step_i (0 when step_i is 0), its
 * nibble in the row and its fifth bit in the row's wide bits. */
static void k4_code_group(const i8a_kernels *kt, i8a_cache *c, const row_source *src, size_t g,
                          size_t grp)
{
    const size_t d = c->head_dim, first = grp * I8A_K4_GROUP, end = first + I8A_K4_GROUP;
    const size_t from = c->k_first && first == 0 ? 1 : first;
    const size_t at = g * i8a_k4_groups(c->max_seq) + grp;
    float lo[I8A_MAX_HEAD_DIM], hi[I8A_MAX_HEAD_DIM], tmp[I8A_MAX_HEAD_DIM];
    uint16_t hm[I8A_MAX_HEAD_DIM], hs[I8A_MAX_HEAD_DIM];
    uint8_t wide[I8A_MAX_HEAD_DIM];
    int16_t rank[I8A_MAX_HEAD_DIM];
    for (size_t pos = from; pos < end; pos++) {
        const float *x = k4_row(src, pos, g, tmp);
        for (size_t i = 0; i < d; i++) {
            lo[i] = pos == from || x[i] < lo[i] ? x[i] : lo[i];
            hi[i] = pos == from || x[i] > hi[i] ? x[i] : hi[i];
        }
    }
    const float sm = kt->half_row(lo, d, hm);
    for (size_t i = 0; i < d; i++) {
        lo[i] = i8a_half_value(hm[i]) * sm;
        hi[i] = hi[i] - lo[i];                                      /* now the spans */
    }
    k4_widest(hi, d, wide);
    for (size_t i = 0; i < d; i++) {
        const float step = hi[i] / (wide[i] ? 31.0f : 15.0f);
        hi[i] = step > 0.0f ? step : 0.0f;
    }
    const float ss = kt->half_row(hi, d, hs);
    for (size_t i = 0; i < d; i++) {
        hs[i] = wide[i] && hs[i] ? (uint16_t)(hs[i] | 1u) : (uint16_t)(hs[i] & ~1u);
        const float step = i8a_half_value(hs[i]) * ss;
        hi[i] = step > 0.0f ? 1.0f / step : 0.0f;                  /* now the inverses */
    }
    i8a_k4_wide_ranks(hs, d, rank);
    /* every position's codes before the group's new minima and steps are stored: a position
     * without floats is read from its old codes by its old ones */
    for (size_t pos = first; pos < end; pos++) {
        const float *x = k4_row(src, pos, g, tmp);
        uint8_t *row = k4_row_codes(c, g, pos), *bits = k4_row_wide(c, g, pos);
        memset(bits, 0, I8A_K4_WIDE_BYTES(d));
        for (size_t i = 0; i < d; i++) {
            const float top = rank[i] < 0 ? 15.0f : 31.0f;
            float r = rintf((x[i] - lo[i]) * hi[i]);
            r = r > top ? top : r;
            k4_set_code(row, bits, rank, i, (unsigned)(r > 0.0f ? r : 0.0f));
        }
    }
    memcpy(c->k4_min + at * d, hm, d * sizeof(uint16_t));
    memcpy(c->k4_step + at * d, hs, d * sizeof(uint16_t));
    c->k4_min_scale[at] = sm;
    c->k4_step_scale[at] = ss;
}

/* One row into codes and scale: rotated when the cache rotates, minus off when off != NULL.
 * The row is in range, so it stays finite through the rotation and the offset
 * (I8A_VALUE_MAX) and the quantizer cannot fail. */
static void store_row(const i8a_kernels *kt, const i8a_cache *c, const float *sign,
                      const float *x, const float *off, int8_t *codes, float *scale)
{
    float tmp[I8A_MAX_HEAD_DIM];
    const float *y = maybe_rotated(kt, c, sign, x, tmp);
    if (off) {
        for (size_t i = 0; i < c->head_dim; i++)
            tmp[i] = y[i] - off[i];
        y = tmp;
    }
    kt->quantize_row(y, c->head_dim, codes, scale);
}

/* Quantize positions [a, b) of both sides from src_k / src_v into their codes (centered past
 * position 0 when the offsets hold), checking the rows that come from the append (in_range)
 * as it goes. Returns 0, or 1 / 2 when a K / V row is out of range, with *bad = (pos - x_from)
 * * hkv + head of the first (row order, K before V); the codes up to it are then written, which
 * changes nothing while the length is not committed. */
static int code_rows(const i8a_kernels *kt, const i8a_cache *c, const row_source *src_k,
                     const row_source *src_v, size_t a, size_t b, size_t *bad)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads;
    for (size_t pos = a; pos < b; pos++) {
        const int given = pos >= src_k->x_from;             /* the ring's rows were checked */
        for (size_t g = 0; g < hkv; g++) {
            const size_t row = g * c->max_seq + pos;
            const int centered = has_offsets(c) && pos >= 1;
            if (given) {
                const size_t at = ((pos - src_k->x_from) * hkv + g) * d;
                const int bad_k = !in_range(src_k->x + at, d);
                if (bad_k || !in_range(src_v->x + at, d)) {
                    *bad = (pos - src_k->x_from) * hkv + g;
                    return bad_k ? 1 : 2;
                }
            }
            float tk[I8A_MAX_HEAD_DIM], tv[I8A_MAX_HEAD_DIM];
            if (c->k_bits == 8)             /* (at 4 bits K is coded by groups: k4_code_group) */
                store_row(kt, c, c->k_sign, i8a_row_at(src_k, pos, g, tk),
                          centered ? c->k_offset + g * d : NULL, c->k_codes + row * d,
                          c->k_scale + row);
            if (c->v_bits == 8) {
                int8_t vc[I8A_MAX_HEAD_DIM];
                store_row(kt, c, c->v_sign, i8a_row_at(src_v, pos, g, tv),
                          centered ? c->v_offset + g * d : NULL, vc, c->v_scale + row);
                i8a_v_put(c, g, pos, vc);
            } else {
                float rv[I8A_MAX_HEAD_DIM];
                const float *y = i8a_row_at(src_v, pos, g, tv);
                i8a_v4_store(c, g, pos, maybe_rotated(kt, c, c->v_sign, y, rv));
            }
        }
    }
    return 0;
}

int i8a_check_rows(const float *k, const float *v, size_t rows, size_t d, size_t *bad)
{
    for (size_t r = 0; r < rows; r++) {
        if (!in_range(k + r * d, d) || !in_range(v + r * d, d)) {
            *bad = r;
            return in_range(k + r * d, d) ? 2 : 1;
        }
    }
    return 0;
}

int i8a_append(const i8a_kernels *kt, i8a_cache *c, const float *k, const float *v, size_t t,
               size_t *bad)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, len = c->length, end = len + t;
    I8A_EXPECT(end <= c->max_seq && t >= 1);
    I8A_EXPECT(d % 16 == 0 && d >= 16 && d <= I8A_MAX_HEAD_DIM && hkv >= 1);
    I8A_EXPECT(!c->k_offset || c->k_first);
    I8A_EXPECT(c->recent ? c->ring >= 1 && c->k_recent && c->v_recent : c->ring == 0);
    I8A_EXPECT(c->k_bits == 8 || (c->k4 && !c->k_sign && !c->k_offset && c->recent >= I8A_K4_GROUP));
    I8A_EXPECT(c->v_bits == 8 || (c->v4 && c->v4_min && !c->v_offset));
    I8A_EXPECT((c->k_bits == 8 && c->v_bits == 8) || d % I8A_NIB_BLOCK == 0);
    /* Nothing that outlives a failed append is written before every row is known to be in
     * range: the codes and scales of positions len .. are not the cache's until len grows,
     * and k_first counts only once it does; the offsets and the ring are written after. */
    const row_source src_k = {kt, c, k, c->k_recent, c->k_rscale, len};
    const row_source src_v = {kt, c, v, c->v_recent, c->v_rscale, len};
    size_t to = 0;                      /* the offsets come from positions 1 .. to-1 */
    if (c->k_offset && !c->offsets_set && !c->recent && end >= 2)
        to = end;                                           /* this append's rows past 0 */
    else if (c->k_offset && !c->offsets_set && c->recent && end >= c->recent + 1)
        to = c->recent + 1;                                 /* positions 1 .. R */
    if (to) {                           /* the offsets first: every row checked before */
        const int refused = i8a_check_rows(k, v, t * hkv, d, bad);
        if (refused)
            return refused;
        i8a_set_offset(kt, &src_k, 1, to, c->k_sign, c->k_offset);
        i8a_set_offset(kt, &src_v, 1, to, c->v_sign, c->v_offset);
        c->offsets_set = 1;
    }
    if (c->k_first && len == 0) {
        for (size_t g = 0; g < hkv; g++) {
            memcpy(c->k_first + g * d, k + g * d, d * sizeof(float));
            memcpy(c->v_first + g * d, v + g * d, d * sizeof(float));
        }
    }
    const int rc = code_rows(kt, c, &src_k, &src_v, len, end, bad);
    if (rc != 0)
        return rc;                      /* (never after the offsets were set: checked there) */
    if (to && len > 1)                  /* the rows coded uncentered so far, again */
        code_rows(kt, c, &src_k, &src_v, 1, len, bad);
    if (c->k_bits == 4)                 /* the K groups this append fills, before the ring moves */
        for (size_t grp = len / I8A_K4_GROUP; (grp + 1) * I8A_K4_GROUP <= end; grp++)
            for (size_t g = 0; g < hkv; g++)
                k4_code_group(kt, c, &src_k, g, grp);
    if (c->recent) {                    /* the latest `ring` rows into the ring */
        const size_t from = end > c->ring && end - c->ring > len ? end - c->ring : len;
        for (size_t pos = from; pos < end; pos++) {
            for (size_t g = 0; g < hkv; g++) {
                const size_t at = g * c->ring + slot_of(c, pos), x = ((pos - len) * hkv + g) * d;
                c->k_rscale[at] = kt->half_row(k + x, d, c->k_recent + at * d);
                c->v_rscale[at] = kt->half_row(v + x, d, c->v_recent + at * d);
            }
        }
        if (end > c->ring && end - c->ring > c->held_from)
            c->held_from = end - c->ring;
    } else {
        c->held_from = end;
    }
    c->length = end;
    return 0;
}

/* K at 4 bits, the cache shrunk from len positions to its length: the groups from `first` on,
 * and the codes of the positions from min(length, first * I8A_K4_GROUP) to the end of the groups
 * len reached, hold zeros again, what they held before they were first coded. Above the length
 * nothing is kept (no later state shows codes of a history the cache no longer holds: a group's
 * codes are written when it fills, and a partial group's are exported as they lie); below it,
 * the positions of the groups from `first` on are read from their floats until their group
 * fills again. */
static void k4_zero(i8a_cache *c, size_t first, size_t len)
{
    const size_t d = c->head_dim, cap = c->max_seq, groups = i8a_k4_groups(cap);
    const size_t end = i8a_k4_groups(len), from = first * I8A_K4_GROUP;
    const size_t a = c->length < from ? c->length : from;
    const size_t b = end * I8A_K4_GROUP < cap ? end * I8A_K4_GROUP : cap;
    for (size_t g = 0; g < c->n_kv_heads; g++) {
        if (b > a) {
            memset(k4_row_codes(c, g, a), 0, (b - a) * (d / 2));
            memset(k4_row_wide(c, g, a), 0, (b - a) * I8A_K4_WIDE_BYTES(d));
        }
        if (end > first) {
            const size_t at = g * groups + first;
            memset(c->k4_min + at * d, 0, (end - first) * d * sizeof(uint16_t));
            memset(c->k4_step + at * d, 0, (end - first) * d * sizeof(uint16_t));
            memset(c->k4_min_scale + at, 0, (end - first) * sizeof(float));
            memset(c->k4_step_scale + at, 0, (end - first) * sizeof(float));
        }
    }
}

/* Centering, the cache shrunk to n = length tokens (a truncate or an evict): the offsets go when
 * the cache is back to before they were set, so that the next rows set them as a fresh cache's
 * would: without a window at n <= 1; with one at n <= R while the floats of positions 1 .. n-1
 * are held, the rows past position 0 then coded uncentered again from them (what the appends
 * alone left; decode reads those rows from the window, so its results do not change). Taken
 * further than the ring (held_from > 1), the rows have no floats to be coded from, and the
 * offsets stay. */
static void offsets_after_shrink(const i8a_kernels *kt, i8a_cache *c)
{
    const size_t n = c->length;
    if (!has_offsets(c))
        return;
    if (!c->recent && n <= 1) {
        c->offsets_set = 0;
    } else if (c->recent && n <= c->recent && c->held_from <= 1) {
        const row_source src_k = {kt, c, NULL, c->k_recent, c->k_rscale, n};
        const row_source src_v = {kt, c, NULL, c->v_recent, c->v_rscale, n};
        c->offsets_set = 0;
        size_t unused;
        code_rows(kt, c, &src_k, &src_v, 1, n, &unused);
    }
}

void i8a_truncate(const i8a_kernels *kt, i8a_cache *c, size_t n)
{
    I8A_EXPECT(n <= c->length);
    const size_t len = c->length;
    c->length = n;
    c->held_from = c->held_from < n ? c->held_from : n;
    if (c->k_bits == 4) {
        /* the groups no longer complete are forgotten, but the first of them keeps its codes
         * when some of its positions have no floats left (a truncate deeper than the ring),
         * which then serve those positions */
        size_t first = n / I8A_K4_GROUP;
        if (c->held_from > first * I8A_K4_GROUP)
            first++;
        k4_zero(c, first, len);
    }
    offsets_after_shrink(kt, c);
}

void i8a_evict(const i8a_kernels *kt, i8a_cache *c, size_t n)
{
    const size_t len = c->length;
    I8A_EXPECT(n <= len && (c->k_bits == 8 || n % I8A_K4_GROUP == 0 || n == len));
    if (n == 0)
        return;
    if (n == len) {                     /* forgetting everything: what reset does */
        i8a_truncate(kt, c, 0);
        return;
    }
    i8a_move_down(kt, c, n);
    if (c->k_bits == 4)                 /* whole groups moved: none above them is coded */
        k4_zero(c, i8a_k4_groups(c->length), len);
    offsets_after_shrink(kt, c);
}
