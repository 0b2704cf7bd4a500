/* prefill: an append and a decode of the queries of its rows in one call. Each query reads the
 * history a single decode after its own token's append reads, however many rows the call
 * brings: its recent window (the last R positions up to it) from their floats. The ring holds
 * the last min(2R, cap) positions, so after an append of t > R + 1 rows the first queries'
 * windows have left it; the call keeps them in a copy of the windows' rows, taken before the
 * append moves the ring, and decodes over that copy in the ring's place. */
#include "internal.h"

#include <stdlib.h>

/* The floats of the windows a chunk's queries read: positions base .. base + slots - 1 (up to
 * R - 1 before the chunk, then the chunk's own), as the ring holds them (halves, the rows'
 * scales); position base + i of kv head g in slot g * slots + i. */
typedef struct {
    uint16_t *k, *v;            /* [hkv][slots][d] */
    float *ks, *vs;             /* [hkv][slots] */
    size_t base, slots, held_from;
} window_copy;

/* Whether the ring still holds, after appending t rows, every window the t queries read: the
 * first query's reaches R - 1 positions before the chunk, the ring the last `ring`. */
static int ring_holds(const i8a_cache *c, size_t t)
{
    return !c->recent || c->length + t <= c->ring || t + c->recent - 1 <= c->ring;
}

/* Allocate w for an append of t rows to c (which ring_holds refuses). 0, or -1. */
static int copy_alloc(const i8a_cache *c, size_t t, window_copy *w)
{
    const size_t len = c->length, d = c->head_dim;
    w->base = len + 1 > c->recent ? len + 1 - c->recent : 0;
    w->slots = len + t - w->base;
    w->held_from = c->held_from > w->base ? c->held_from : w->base;
    /* rows <= hkv * cap, so the bytes are fewer than those of the cache's own K codes and ring
     * together: no overflow */
    const size_t rows = c->n_kv_heads * w->slots;
    char *p = (char *)i8a_alloc_aligned(rows * (2 * d * sizeof(uint16_t) + 2 * sizeof(float)));
    if (!p)
        return -1;
    w->k = (uint16_t *)p;
    w->v = w->k + rows * d;
    w->ks = (float *)(void *)(w->v + rows * d);
    w->vs = w->ks + rows;
    return 0;
}

/* Fill w before the append: the positions before the chunk whose floats the ring holds, copied
 * from it, and the chunk's rows k, v [t][hkv][d] (in range) as the append puts them in the
 * ring (the tier's half_row of the row as given). */
static void copy_fill(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
                      size_t t, window_copy *w)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, len = c->length;
    for (size_t g = 0; g < hkv; g++) {
        for (size_t pos = w->held_from; pos < len; pos++) {
            const size_t from = g * c->ring + slot_of(c, pos), to = g * w->slots + pos - w->base;
            memcpy(w->k + to * d, c->k_recent + from * d, d * sizeof(uint16_t));
            memcpy(w->v + to * d, c->v_recent + from * d, d * sizeof(uint16_t));
            w->ks[to] = c->k_rscale[from];
            w->vs[to] = c->v_rscale[from];
        }
        for (size_t i = 0; i < t; i++) {
            const size_t x = (i * hkv + g) * d, to = g * w->slots + len + i - w->base;
            w->ks[to] = kt->half_row(k + x, d, w->k + to * d);
            w->vs[to] = kt->half_row(v + x, d, w->v + to * d);
        }
    }
}

/* Cache c as the decode reads it once it holds `end` tokens: with w (not NULL) in the ring's
 * place, floats held from w's held_from on. A plan reads only the length and the format, so
 * the view before the append plans what the view after it runs. */
static i8a_cache view_of(const i8a_cache *c, const window_copy *w, size_t end)
{
    i8a_cache view = *c;
    view.length = end;
    if (w) {
        view.ring = w->slots;
        view.k_recent = w->k, view.v_recent = w->v;
        view.k_rscale = w->ks, view.v_rscale = w->vs;
        view.ring_shift = (w->slots - w->base % w->slots) % w->slots;
        view.held_from = w->held_from;
    }
    return view;
}

/* K at 4 bits: a group is coded when its last position is appended, and a truncate deeper
 * than the ring leaves positions of the group holding position len without floats, read from
 * the group's old codes until it fills. The rows of an append of t before the one that fills
 * it, when those positions exist and it fills within the t (else t): a call splits there, so
 * that the queries before it read the old codes, as single decodes did. */
static size_t rows_before_recode(const i8a_cache *c, size_t t)
{
    const size_t len = c->length, first = len - len % I8A_K4_GROUP;
    const size_t from = c->k_first && first == 0 ? 1 : first;   /* (position 0 kept apart) */
    if (c->k_bits != 4 || len % I8A_K4_GROUP == 0 || c->held_from <= from)
        return t;
    const size_t before = first + I8A_K4_GROUP - 1 - len;
    return before >= 1 && before < t ? before : t;
}

/* The call on rows and queries already checked, at t rows per cache (cache b's at k + b * t *
 * hkv * d, ...). Returns 0, or 3 when memory cannot be allocated (the caches then unchanged). */
static int prefill_pass(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *k,
                        const float *v, const float *q, size_t t, size_t h,
                        const i8a_options *opt, size_t max_threads, float *out)
{
    const size_t kv_size = t * cs[0]->n_kv_heads * cs[0]->head_dim;
    size_t unused_bad;
    window_copy stack_copies[I8A_BATCH_STACK];
    i8a_cache stack_views[I8A_BATCH_STACK];
    i8a_cache *stack_ptrs[I8A_BATCH_STACK] = {NULL};
    window_copy *copies = stack_copies;
    i8a_cache *views = stack_views, **ptrs = stack_ptrs;
    if (n > I8A_BATCH_STACK) {
        copies = (window_copy *)malloc(n * sizeof *copies);
        views = (i8a_cache *)malloc(n * sizeof *views);
        ptrs = (i8a_cache **)malloc(n * sizeof *ptrs);
    }
    int rc = copies && views && ptrs ? 0 : 3;
    /* the copies (k NULL: none, the ring holds the windows) and the decode's workspaces, before
     * the append, so that nothing fails after it (a workspace for max_threads holds the one
     * for any fewer) */
    size_t made = 0;
    for (; rc == 0 && made < n; made++) {
        i8a_cache *c = cs[made];
        window_copy *w = &copies[made];
        w->k = NULL;
        if (!ring_holds(c, t)) {
            if (copy_alloc(c, t, w) != 0) {
                rc = 3;
                break;
            }
            copy_fill(kt, c, k + made * kv_size, v + made * kv_size, t, w);
        }
        const i8a_cache view = view_of(c, w->k ? w : NULL, c->length + t);
        const i8a_plan L = i8a_plan_decode(&view, t, h, opt, max_threads);
        if (i8a_reserve_work(c, i8a_plan_with_threads(L, max_threads).end) != 0)
            rc = 3;
    }
    if (rc == 0) {
        for (size_t b = 0; b < n; b++) {
            size_t unused;
            i8a_append(kt, cs[b], k + b * kv_size, v + b * kv_size, t, &unused);  /* checked */
            views[b] = view_of(cs[b], copies[b].k ? &copies[b] : NULL, cs[b]->length);
            ptrs[b] = &views[b];
        }
        /* q checked and the workspaces grown above: this returns 0 */
        rc = i8a_decode_batch(kt, ptrs, n, q, t, h, opt, max_threads, out, &unused_bad);
        for (size_t b = 0; b < n; b++) {        /* (the workspace is the cache's) */
            cs[b]->work = views[b].work;
            cs[b]->work_bytes = views[b].work_bytes;
        }
    }
    for (size_t b = 0; b < made; b++)
        i8a_free_aligned(copies[b].k);
    if (n > I8A_BATCH_STACK) {
        free(copies);
        free(views);
        free(ptrs);
    }
    return rc;
}

int i8a_prefill_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *k,
                      const float *v, const float *q, size_t t, size_t h,
                      const i8a_options *opt, size_t max_threads, float *out, size_t *bad)
{
    I8A_EXPECT(n >= 1 && t >= 1);
    const size_t hkv = cs[0]->n_kv_heads, d = cs[0]->head_dim, kv_size = t * hkv * d;
    const size_t q_size = t * h * d;
    /* every row of every cache checked before anything is written */
    const float q_limit = i8a_q_limit(opt->scale);
    for (size_t b = 0; b < n; b++) {
        I8A_EXPECT(cs[b]->length + t <= cs[b]->max_seq);
        size_t row = 0;
        int refused = i8a_check_rows(k + b * kv_size, v + b * kv_size, t * hkv, d, &row);
        if (refused) {
            *bad = b * t * hkv + row;
            return refused;
        }
        for (row = 0; row < t * h; row++) {
            refused = i8a_check_query(q + b * q_size + row * d, d, q_limit);
            if (refused) {
                *bad = b * t * h + row;
                return 3 + refused;
            }
        }
    }
    int split = 0;
    for (size_t b = 0; b < n; b++)
        split |= rows_before_recode(cs[b], t) < t;
    if (!split)
        return prefill_pass(kt, cs, n, k, v, q, t, h, opt, max_threads, out);
    /* one cache at a time then, in two parts where it splits (an allocation that fails leaves
     * the caches before it appended) */
    for (size_t b = 0; b < n; b++) {
        i8a_cache *c = cs[b];
        const size_t s = rows_before_recode(c, t), part[2][2] = {{0, s}, {s, t}};
        for (size_t i = 0; i < 2; i++) {
            const size_t a = part[i][0], rows = part[i][1] - a;
            if (rows == 0)
                continue;
            const int rc = prefill_pass(kt, &c, 1, k + b * kv_size + a * hkv * d,
                                        v + b * kv_size + a * hkv * d, q + b * q_size + a * h * d,
                                        rows, h, opt, max_threads, out + b * q_size + a * h * d);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}
