/* The cache's rows in and out as its file holds them (i8a_rows: codes one a byte, V as rows,
 * K's group minima and steps and the recent window as floats): state_dict and load go through
 * here, so the layout in memory has one owner. */
#include "internal.h"

#include <string.h>

size_t i8a_rows_held(const i8a_cache *c)
{
    return c->recent ? c->length - c->held_from : 0;
}

/* K's group j of kv head g: its minima and steps as floats (halves times their powers of two,
 * exact) into lo [d] and step [d]. */
static void k4_group_values(const i8a_cache *c, size_t g, size_t j, float *lo, float *step)
{
    const size_t d = c->head_dim, at = g * i8a_k4_groups(c->max_seq) + j;
    widen(c->k4_min + at * d, c->k4_min_scale[at], d, lo);
    widen(c->k4_step + at * d, c->k4_step_scale[at], d, step);
}

/* A pair of float row sets (K, V) [n] out: copies of k, v, or zeros when k is NULL; nothing
 * when the caller did not ask (ok NULL). */
static void float_rows(float *ok, float *ov, const float *k, const float *v, size_t n)
{
    if (!ok)
        return;
    if (k) {
        memcpy(ok, k, n * sizeof(float));
        memcpy(ov, v, n * sizeof(float));
    } else {
        memset(ok, 0, n * sizeof(float));
        memset(ov, 0, n * sizeof(float));
    }
}

void i8a_export(const i8a_cache *c, i8a_rows *r)
{
    const size_t hkv = c->n_kv_heads, d = c->head_dim, n = c->length, cap = c->max_seq;
    r->length = n;
    r->held = i8a_rows_held(c);
    r->offsets_set = c->offsets_set;
    for (size_t g = 0; g < hkv; g++) {
        int16_t rank[I8A_MAX_HEAD_DIM];
        for (size_t pos = 0; pos < n; pos++) {
            const size_t row = g * cap + pos, at = g * n + pos;
            if (r->k_codes && pos % I8A_K4_GROUP == 0)
                i8a_k4_wide_ranks(c->k4_step + (g * i8a_k4_groups(cap) + pos / I8A_K4_GROUP) * d,
                                  d, rank);
            if (r->k_i8)
                memcpy(r->k_i8 + at * d, c->k_codes + row * d, d);
            if (r->k_scale)
                r->k_scale[at] = c->k_scale[row];
            if (r->k_codes)
                for (size_t i = 0; i < d; i++)
                    r->k_codes[at * d + i] = (uint8_t)i8a_k4_code(k4_row_codes(c, g, pos),
                                                                  k4_row_wide(c, g, pos), rank, i);
            if (r->v_i8)
                i8a_v_get(c, g, pos, r->v_i8 + at * d);
            if (r->v_codes)
                i8a_v4_get(c, g, pos, r->v_codes + at * d);
            if (r->v_scale)
                r->v_scale[at] = c->v_scale[row];
            if (r->v_min)
                r->v_min[at] = c->v4_min[row];
        }
        const size_t groups = i8a_k4_groups(n);
        for (size_t j = 0; r->k_group_min && j < groups; j++) {
            const size_t at = (g * groups + j) * d;
            k4_group_values(c, g, j, r->k_group_min + at, r->k_group_step + at);
        }
    }
    /* position 0 once the cache holds it, the offsets while they hold; else zeros */
    float_rows(r->k_first, r->v_first, c->k_first && n ? c->k_first : NULL, c->v_first, hkv * d);
    float_rows(r->k_offset, r->v_offset, c->k_offset && c->offsets_set ? c->k_offset : NULL,
               c->v_offset, hkv * d);
    for (size_t j = 0; r->k_recent && j < r->held; j++) {
        const size_t slot = slot_of(c, n - r->held + j);
        for (size_t g = 0; g < hkv; g++) {
            widen_row(c, c->k_recent, c->k_rscale, g, slot, r->k_recent + (j * hkv + g) * d);
            widen_row(c, c->v_recent, c->v_rscale, g, slot, r->v_recent + (j * hkv + g) * d);
        }
    }
}

/* x [d] as halves h [d] times a power of two (returned), giving x back bit for bit, when it is
 * such a row; else *exact = 0. half_row finds them, but for a row of zeros: it makes those +0.0,
 * while the halves of a row of tiny values (below the smallest scale's reach) are zeros that
 * keep their signs; so a row of zeros is taken as its signs, times 1 (half_row's zero scale). */
static float as_halves(const i8a_kernels *kt, const float *x, size_t d, uint16_t *h, int *exact)
{
    uint32_t any = 0;
    for (size_t i = 0; i < d; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        any |= b & 0x7fffffffu;
        h[i] = (uint16_t)(b >> 16 & 0x8000u);
    }
    *exact = 1;
    if (!any)
        return 1.0f;
    const float scale = kt->half_row(x, d, h);
    for (size_t i = 0; i < d; i++) {
        const float y = i8a_half_value(h[i]) * scale;
        if (memcmp(&y, x + i, sizeof y))
            *exact = 0;
    }
    return scale;
}

int i8a_import(const i8a_kernels *kt, i8a_cache *c, const i8a_rows *r, int round_window,
               size_t *bad)
{
    const size_t hkv = c->n_kv_heads, d = c->head_dim, n = r->length, cap = c->max_seq;
    I8A_EXPECT(c->length == 0 && n <= cap && r->held <= n && r->held <= c->ring);
    const size_t groups = i8a_k4_groups(n), all = i8a_k4_groups(cap);
    uint16_t h[I8A_MAX_HEAD_DIM];
    /* every row that must be halves checked before anything is written: K's group minima and
     * steps, and the window's rows unless they are to be rounded */
    const float *const checked[4] = {r->k_group_min, r->k_group_step, r->k_recent, r->v_recent};
    const size_t k4 = c->k_bits == 4 ? hkv * groups : 0, window = round_window ? 0 : r->held * hkv;
    const size_t rows_of[4] = {k4, k4, window, window};
    int exact;
    for (int which = 0; which < 4; which++) {
        for (size_t j = 0; j < rows_of[which]; j++) {
            as_halves(kt, checked[which] + j * d, d, h, &exact);
            if (!exact) {
                *bad = j;
                return which + 1;
            }
        }
    }
    /* K's codes above 15: in the wide channels of their groups only (dispatch.h; the caller
     * refused codes above 31) */
    for (size_t g = 0; k4 && g < hkv; g++) {
        int16_t rank[I8A_MAX_HEAD_DIM];
        for (size_t pos = 0; pos < n; pos++) {
            if (pos % I8A_K4_GROUP == 0) {
                as_halves(kt, r->k_group_step + (g * groups + pos / I8A_K4_GROUP) * d, d, h,
                          &exact);
                i8a_k4_wide_ranks(h, d, rank);
            }
            for (size_t i = 0; i < d; i++) {
                if (r->k_codes[(g * n + pos) * d + i] > 15 && rank[i] < 0) {
                    *bad = g * n + pos;
                    return 5;
                }
            }
        }
    }
    for (size_t g = 0; k4 && g < hkv; g++) {
        for (size_t j = 0; j < groups; j++) {
            const size_t at = g * all + j, from = (g * groups + j) * d;
            c->k4_min_scale[at] = as_halves(kt, r->k_group_min + from, d, c->k4_min + at * d,
                                            &exact);
            c->k4_step_scale[at] = as_halves(kt, r->k_group_step + from, d, c->k4_step + at * d,
                                             &exact);
        }
    }
    for (size_t g = 0; g < hkv; g++) {
        int16_t rank[I8A_MAX_HEAD_DIM];
        for (size_t pos = 0; pos < n; pos++) {
            const size_t row = g * cap + pos, at = g * n + pos;
            if (c->k_bits == 8) {
                memcpy(c->k_codes + row * d, r->k_i8 + at * d, d);
                c->k_scale[row] = r->k_scale[at];
            } else {
                uint8_t *codes = k4_row_codes(c, g, pos), *bits = k4_row_wide(c, g, pos);
                if (pos % I8A_K4_GROUP == 0)
                    i8a_k4_wide_ranks(c->k4_step + (g * all + pos / I8A_K4_GROUP) * d, d, rank);
                for (size_t i = 0; i < d; i++)
                    k4_set_code(codes, bits, rank, i, r->k_codes[at * d + i]);
            }
            if (c->v_bits == 8) {
                i8a_v_put(c, g, pos, r->v_i8 + at * d);
            } else {
                i8a_v4_put(c, g, pos, r->v_codes + at * d);
                c->v4_min[row] = r->v_min[at];
            }
            c->v_scale[row] = r->v_scale[at];
        }
    }
    const size_t rows = hkv * d * sizeof(float);
    if (c->k_first) {
        memcpy(c->k_first, r->k_first, rows);
        memcpy(c->v_first, r->v_first, rows);
    }
    if (c->k_offset) {
        memcpy(c->k_offset, r->k_offset, rows);
        memcpy(c->v_offset, r->v_offset, rows);
        c->offsets_set = r->offsets_set != 0;
    }
    /* the window's rows into slots 0 .. held-1: their halves, or rounded as an append rounds
     * them */
    for (size_t j = 0; c->recent && j < r->held; j++) {
        for (size_t g = 0; g < hkv; g++) {
            const size_t at = g * c->ring + j, from = (j * hkv + g) * d;
            const float *k = r->k_recent + from, *v = r->v_recent + from;
            uint16_t *kh = c->k_recent + at * d, *vh = c->v_recent + at * d;
            c->k_rscale[at] = round_window ? kt->half_row(k, d, kh)
                                           : as_halves(kt, k, d, kh, &exact);
            c->v_rscale[at] = round_window ? kt->half_row(v, d, vh)
                                           : as_halves(kt, v, d, vh, &exact);
        }
    }
    c->ring_shift = c->recent ? (c->ring - (n - r->held) % c->ring) % c->ring : 0;
    c->held_from = n - r->held;
    c->length = n;
    return 0;
}
