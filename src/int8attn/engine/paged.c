/* A paged pool: rows written by slot, and a batch of sequences attended through views (an
 * i8a_cache per sequence whose rows lie in the pool's blocks, decoded by decode.c as any
 * cache). */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

#include "../_pool.h"

/* row * block_rows * n_kv_heads bytes, 0 when it does not fit a size_t. */
static size_t block_of(size_t row, size_t n_kv_heads, size_t block_rows)
{
    if (block_rows && row > SIZE_MAX / block_rows)
        return 0;
    const size_t head = row * block_rows;
    if (n_kv_heads && head > SIZE_MAX / n_kv_heads)
        return 0;
    return head * n_kv_heads;
}

size_t i8a_paged_block_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows)
{
    return block_of(2 * head_dim + 8, n_kv_heads, block_rows);  /* K and V codes, 2 scales */
}

void i8a_paged_init(i8a_paged *p, uint8_t *base, size_t blocks, size_t n_kv_heads,
                    size_t head_dim, size_t block_rows, const float *sign)
{
    I8A_EXPECT(head_dim % 16 == 0 && head_dim >= 16 && head_dim <= I8A_MAX_HEAD_DIM);
    I8A_EXPECT(block_rows >= 16 && block_rows <= 256 && (block_rows & (block_rows - 1)) == 0);
    unsigned shift = 0;
    while (((size_t)1 << shift) < block_rows)
        shift++;
    const i8a_paged init = {base, blocks, n_kv_heads, head_dim, block_rows, shift,
                            i8a_paged_block_bytes(n_kv_heads, head_dim, block_rows), sign,
                            NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL,
                            NULL};
    *p = init;
}

void i8a_paged_free_work(i8a_paged *p)
{
    i8a_free_aligned(p->work);
    p->work = NULL;
    p->work_bytes = 0;
}

size_t i8a_paged_open_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows)
{
    return block_of(4 * head_dim + 8, n_kv_heads, block_rows);  /* K and V halves, 2 scales */
}

void i8a_paged_open(i8a_paged *p, size_t cap, uint16_t *k, uint16_t *v, float *ks, float *vs,
                    int32_t *of, i8a_open_entry *entries, float *first_k, float *first_v,
                    uint8_t *first_held)
{
    I8A_EXPECT(cap >= 1);
    p->open_cap = cap;
    p->open_k = k, p->open_v = v, p->open_ks = ks, p->open_vs = vs;
    p->open_of = of;
    p->open = entries;
    p->first_k = first_k, p->first_v = first_v, p->first_held = first_held;
    for (size_t b = 0; b < p->blocks; b++)
        of[b] = -1;
    for (size_t e = 0; e < cap; e++) {
        const i8a_open_entry none = {-1, 0, 0, 0};
        entries[e] = none;
    }
}

/* Entry e's halves (and scales) start at row e * hkv * block_rows of the open arrays. */
static size_t open_row0(const i8a_paged *p, size_t e)
{
    return e * p->n_kv_heads * p->block_rows;
}

/* The entry that keeps the halves of offset `off` of `block`, about to be written: the block's
 * own (its held run starts again at off unless off extends it or lies in it), else a free one,
 * else the one used least recently, taken from its block (*reused set when this call wrote it
 * already: its stamp is the clock, which every write and attend advances as it returns). */
static size_t open_for_write(i8a_paged *p, size_t block, size_t off, int *reused)
{
    int32_t e = p->open_of[block];
    if (e < 0) {
        size_t pick = 0;
        for (size_t i = 0; i < p->open_cap; i++) {
            if (p->open[i].block < 0) {
                pick = i;
                break;
            }
            if (p->open[i].stamp < p->open[pick].stamp)
                pick = i;
        }
        if (p->open[pick].block >= 0) {
            p->open_of[p->open[pick].block] = -1;
            *reused |= p->open[pick].stamp == p->clock;
        }
        e = (int32_t)pick;
        p->open_of[block] = e;
        p->open[e].block = (int32_t)block;
        p->open[e].first = p->open[e].top = (uint32_t)off;
    }
    i8a_open_entry *o = &p->open[e];
    if (off == 0 || off < o->first || off > o->top)     /* a new owner, or a gap: start again */
        o->first = o->top = (uint32_t)off;
    if (off + 1 > o->top)
        o->top = (uint32_t)(off + 1);
    o->stamp = p->clock;
    return (size_t)e;
}

/* A view of the pool as a cache of `length` positions in `blocks` (NULL: the whole pool, its
 * blocks in order, a position being a slot). */
static i8a_cache view_of(const i8a_paged *p, const int32_t *blocks, size_t length)
{
    i8a_cache c;
    memset(&c, 0, sizeof c);
    c.n_kv_heads = p->n_kv_heads;
    c.head_dim = p->head_dim;
    c.max_seq = length;
    c.length = length;
    c.k_sign = c.v_sign = p->sign;
    c.k_bits = c.v_bits = 8;
    c.paged = p;
    c.blocks = blocks;
    return c;
}

void i8a_narrow(const float *x, size_t n, int type, uint16_t *y)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        const uint32_t sign = b >> 16 & 0x8000u, a = b & 0x7fffffffu;
        if (type == I8A_BF16)                   /* the top half, rounded on the bottom one */
            y[i] = a > 0x7f800000u ? (uint16_t)(b >> 16 | 0x40u)
                                   : (uint16_t)((b + 0x7fffu + (b >> 16 & 1u)) >> 16);
        else if (a > 0x7f800000u)               /* a NaN */
            y[i] = (uint16_t)(sign | 0x7e00u);
        else if (a >= 0x477ff000u)              /* 65520 and up round to infinity */
            y[i] = (uint16_t)(sign | 0x7c00u);
        else
            y[i] = i8a_half_bits(x[i]);
    }
}

/* With open blocks: the row of slot pos's entry (open_for_write) in the open arrays, the
 * block's first row flagged anew at offset 0 (if the block is a first block). */
static size_t entry_row(i8a_paged *p, size_t pos, int *reused)
{
    const size_t off = pos & (p->block_rows - 1);
    if (off == 0)
        p->first_held[pos >> p->block_shift] = 0;
    return open_row0(p, open_for_write(p, pos >> p->block_shift, off, reused)) + off;
}

/* A paged write after its checks: row i's K and V of every kv head coded into slot slots[i]
 * (and with open blocks, as halves into its entry's row at[i]). */
typedef struct {
    const i8a_kernels *kt;
    i8a_paged *p;                       /* its entries change only without `at` */
    const int64_t *slots;
    const size_t *at;
    const void *k, *v;
    int type;
} write_job;

/* Rows i .. i + n - 1 (n = 1, or I8A_V_TILE rows at the slots of one V tile, in order), at[u]
 * their open rows: each kv head's V codes of the n rows go into their tile together. */
static void write_rows(const write_job *w, const i8a_cache *pool, size_t i, size_t n,
                       const size_t *at)
{
    const i8a_kernels *kt = w->kt;
    const i8a_paged *p = w->p;
    const size_t hkv = p->n_kv_heads, d = p->head_dim, pos = (size_t)w->slots[i];
    for (size_t g = 0; g < hkv; g++) {
        int8_t vc[I8A_V_TILE * I8A_MAX_HEAD_DIM];
        for (size_t u = 0; u < n; u++) {
            float kw[I8A_MAX_HEAD_DIM], vw[I8A_MAX_HEAD_DIM], tmp[I8A_MAX_HEAD_DIM];
            const float *kr = i8a_row_f32(w->k, (i + u) * hkv + g, d, w->type, kw);
            const float *vr = i8a_row_f32(w->v, (i + u) * hkv + g, d, w->type, vw);
            kt->quantize_row(maybe_rotated(kt, pool, p->sign, kr, tmp), d,
                             k_row(pool, g, pos + u), k_scale_of(pool, g, pos + u));
            kt->quantize_row(maybe_rotated(kt, pool, p->sign, vr, tmp), d, vc + u * d,
                             v_scale_of(pool, g, pos + u));
            if (p->open_cap) {  /* the halves, as the recent window keeps the row */
                const size_t r = at[u] + g * p->block_rows;
                p->open_ks[r] = kt->half_row(kr, d, p->open_k + r * d);
                p->open_vs[r] = kt->half_row(vr, d, p->open_v + r * d);
            }
        }
        i8a_tile_rows(vc, n, d, pos % I8A_V_TILE, v_tile(pool, g, pos));
    }
}

/* Whether rows i .. i + I8A_V_TILE - 1 (below end; slots[i] not skipped) fill one V tile: their
 * slots are a tile's, in order. */
static int whole_tile(const int64_t *slots, size_t i, size_t end)
{
    if (i + I8A_V_TILE > end || slots[i] % I8A_V_TILE)
        return 0;
    for (size_t u = 1; u < I8A_V_TILE; u++)
        if (slots[i + u] != slots[i] + (int64_t)u)
            return 0;
    return 1;
}

/* Rows [begin, end) of a write, an item a row. Each row's open entry is at[i], set before; or,
 * without `at` (one thread, the rows in order), assigned as the row comes (entry_row), so that
 * an entry that goes to another block within the write does so between its rows. A tile's rows
 * in order are written together (write_rows). */
static void write_range(void *ctx, size_t begin, size_t end, size_t next, size_t worker)
{
    (void)next, (void)worker;
    const write_job *w = (const write_job *)ctx;
    const i8a_cache pool = view_of(w->p, NULL, w->p->blocks * w->p->block_rows);
    int reused = 0;
    for (size_t i = begin; i < end;) {
        if (w->slots[i] < 0) {
            i++;
            continue;
        }
        const size_t n = whole_tile(w->slots, i, end) ? I8A_V_TILE : 1;
        size_t at[I8A_V_TILE] = {0};
        for (size_t u = 0; u < n && w->p->open_cap; u++)
            at[u] = w->at ? w->at[i + u] : entry_row(w->p, (size_t)w->slots[i + u], &reused);
        write_rows(w, &pool, i, n, at);
        i += n;
    }
}

/* Whether two of slots [0, n) that are not skipped are equal, by a set of them: `set` of size
 * (a power of two, above n) entries, overwritten. */
static int has_duplicate(const int64_t *slots, size_t n, int64_t *set, size_t size)
{
    for (size_t j = 0; j < size; j++)
        set[j] = -1;
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        size_t j = (size_t)(((uint64_t)slots[i] * 0x9e3779b97f4a7c15ull) >> 32) & (size - 1);
        while (set[j] >= 0 && set[j] != slots[i])
            j = (j + 1) & (size - 1);
        if (set[j] == slots[i])
            return 1;
        set[j] = slots[i];
    }
    return 0;
}

/* The checks of a write's rows (i8a_check_rows: k before v, head by head), an item a row:
 * `first` ends as the first row, in row order, that is refused (n: none). */
typedef struct {
    const int64_t *slots;
    size_t n, hkv, d;
    const void *k, *v;
    int type;
    atomic_size_t first;
} check_job;

/* Row i's check: 0, or 1 / 2 (k / v refused) with *head the first kv head refused. 16-bit rows
 * are checked on their bits (in_range16), float32 rows by i8a_check_rows. */
static int check_row(const check_job *c, size_t i, size_t *head)
{
    for (size_t g = 0; g < c->hkv; g++) {
        const size_t at = (i * c->hkv + g) * c->d;
        size_t none;
        const int rc = c->type == I8A_F32
                           ? i8a_check_rows((const float *)c->k + at, (const float *)c->v + at, 1,
                                            c->d, &none)
                       : !in_range16((const uint16_t *)c->k + at, c->d, c->type) ? 1
                       : !in_range16((const uint16_t *)c->v + at, c->d, c->type) ? 2
                                                                               : 0;
        if (rc) {
            *head = g;
            return rc;
        }
    }
    return 0;
}

static void check_range(void *ctx, size_t begin, size_t end, size_t next, size_t worker)
{
    (void)next, (void)worker;
    check_job *c = (check_job *)ctx;
    for (size_t i = begin; i < end; i++) {
        size_t head, seen = atomic_load_explicit(&c->first, memory_order_relaxed);
        if (i >= seen)
            return;                     /* a row before these is refused already */
        if (c->slots[i] < 0 || !check_row(c, i, &head))
            continue;
        while (i < seen && !atomic_compare_exchange_weak_explicit(
                               &c->first, &seen, i, memory_order_relaxed, memory_order_relaxed))
            ;
        return;
    }
}

/* Kv heads' rows a write takes per thread at least (a row of one kv head is about half a
 * microsecond at D = 128: coded K and V, and their halves): fewer stay on the calling thread. */
#define I8A_WRITE_ROWS_PER_THREAD 256

int i8a_paged_write(const i8a_kernels *kt, i8a_paged *p, const int64_t *slots, size_t n,
                    const void *k, const void *v, int type, size_t max_threads, size_t *bad)
{
    const uint64_t t0 = i8a_prof_start();
    const size_t hkv = p->n_kv_heads, d = p->head_dim;
    size_t rows = 0;
    for (size_t i = 0; i < n; i++) {
        I8A_EXPECT(slots[i] < 0 || (uint64_t)slots[i] < (uint64_t)p->blocks * p->block_rows);
        rows += slots[i] >= 0;
    }
    size_t threads = rows * hkv / I8A_WRITE_ROWS_PER_THREAD;
    threads = threads < max_threads ? threads : max_threads;
    threads = threads ? threads : 1;
    /* every row that is written is checked before the first is (a skipped one may hold
     * anything: vLLM's padding); the first refused in row order, k before v, is named */
    check_job check = {slots, n, hkv, d, k, v, type, n};
    i8a_pool_run(n, threads, check_range, (void *)&check);
    const size_t first = atomic_load_explicit(&check.first, memory_order_relaxed);
    if (first < n) {
        size_t head = 0;
        const int rc = check_row(&check, first, &head);
        *bad = first * hkv + head;
        return rc;
    }
    write_job job = {kt, p, slots, NULL, k, v, type};
    size_t size = 1;                    /* the duplicate check's set: a power of two above 2n */
    while (size <= 2 * n)
        size *= 2;
    size_t *at = threads > 1 ? (size_t *)malloc(n * sizeof *at + size * sizeof(int64_t)) : NULL;
    int64_t *set = at ? (int64_t *)(void *)(at + n) : NULL;
    if (!at || has_duplicate(slots, n, set, size)) {
        write_range(&job, 0, n, 0, 0);  /* row after row: a slot given twice holds its last */
    } else {
        /* the entries first, in row order; then the rows on the threads, unless an entry went
         * to another block after this call wrote a row into it (the two rows would share its
         * memory: they are written in row order then, on this thread) */
        int reused = 0;
        for (size_t i = 0; i < n && p->open_cap; i++)
            if (slots[i] >= 0)
                at[i] = entry_row(p, (size_t)slots[i], &reused);
        job.at = at;
        i8a_pool_run(n, reused ? 1 : threads, write_range, (void *)&job);
    }
    free(at);
    p->clock++;
    i8a_prof_add(I8A_PROF_WRITE, t0, 1);
    return 0;
}

/* Position 0 of the sequence whose first block is `block`, widened from the halves of entry e
 * (which holds the block from offset 0) into the block's first rows. */
static void widen_first_row(const i8a_paged *p, size_t block, size_t e)
{
    const size_t hkv = p->n_kv_heads, d = p->head_dim;
    for (size_t g = 0; g < hkv; g++) {
        const size_t r = open_row0(p, e) + g * p->block_rows, at = (block * hkv + g) * d;
        widen(p->open_k + r * d, p->open_ks[r], d, p->first_k + at);
        widen(p->open_v + r * d, p->open_vs[r], d, p->first_v + at);
    }
}

/* Whether a query past a sequence's first block `block` reads position 0 apart: the block keeps
 * it (first_held), or its entry still holds it from offset 0 (the attend that fills the block
 * has not returned: the rows are widened now, the same as the block will keep; the block's
 * first rows are scratch until held). */
static int first_row(const i8a_paged *p, size_t block)
{
    if (p->first_held[block])
        return 1;
    const int32_t e = p->open_of[block];
    if (e < 0 || p->open[e].first != 0)
        return 0;
    widen_first_row(p, block, (size_t)e);
    return 1;
}

/* The view of a sequence's positions up to end (exclusive) whose last t are queries, all in one
 * block: with that block's open entry as its recent window (block_rows long, floats held from
 * the entry's first offset) when the entry holds the rows of every query, else codes alone. */
static i8a_cache segment_view(const i8a_paged *p, const int32_t *blocks, size_t end, size_t t)
{
    i8a_cache c = view_of(p, blocks, end);
    if (!p->open_cap)
        return c;
    const size_t j = (end - 1) >> p->block_shift, start = j << p->block_shift;
    if (j > 0 && first_row(p, (size_t)blocks[0])) {   /* position 0 apart, as keep_first */
        const size_t at = (size_t)blocks[0] * p->n_kv_heads * p->head_dim;
        c.k_first = p->first_k + at;
        c.v_first = p->first_v + at;
    }
    const int32_t e = p->open_of[blocks[j]];
    if (e < 0 || start + p->open[e].first > end - t || start + p->open[e].top < end)
        return c;
    const size_t r = open_row0(p, (size_t)e);
    c.recent = c.ring = p->block_rows;          /* position pos in slot pos % block_rows */
    c.ring_shift = 0;
    c.k_recent = p->open_k + r * p->head_dim;
    c.v_recent = p->open_v + r * p->head_dim;
    c.k_rscale = p->open_ks + r;
    c.v_rscale = p->open_vs + r;
    c.held_from = start + p->open[e].first;
    return c;
}

/* The end (exclusive) of the view holding a sequence's query at position pos: with open blocks
 * its block's end, at most the sequence's length; else the length (one view of all queries). */
static size_t segment_end(const i8a_paged *p, const i8a_paged_seq *s, size_t pos)
{
    if (!p->open_cap)
        return s->length;
    const size_t edge = ((pos >> p->block_shift) + 1) << p->block_shift;
    return edge < s->length ? edge : s->length;
}

/* After an attend: the entries of the views' blocks are used now; a block whose last position
 * was a query is full, and its entry is freed (a first block's keeping position 0 apart). */
static void open_after_attend(i8a_paged *p, i8a_cache *const *views, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const size_t end = views[i]->length, j = (end - 1) >> p->block_shift;
        const int32_t block = views[i]->blocks[j], e = p->open_of[block];
        if (e < 0)
            continue;
        p->open[e].stamp = p->clock;
        if ((end & (p->block_rows - 1)) == 0) {
            if (j == 0 && p->open[e].first == 0) {      /* a first block keeps position 0 */
                widen_first_row(p, (size_t)block, (size_t)e);
                p->first_held[block] = 1;
            }
            p->open_of[block] = -1;
            p->open[e].block = -1;
        }
    }
    p->clock++;
}

int i8a_paged_attend(const i8a_kernels *kt, i8a_paged *p, const i8a_paged_seq *seqs, size_t n,
                     const void *q, int q_type, size_t h, const i8a_options *opt,
                     size_t max_threads, float *out, size_t *bad)
{
    I8A_EXPECT(n >= 1);
    const uint64_t t0 = i8a_prof_start();
    size_t nv = 0;              /* the views: a sequence's queries cut at segment_end */
    for (size_t b = 0; b < n; b++) {
        I8A_EXPECT(seqs[b].t >= 1 && seqs[b].t <= seqs[b].length);
        for (size_t pos = seqs[b].length - seqs[b].t; pos < seqs[b].length; nv++)
            pos = segment_end(p, seqs + b, pos);
    }
    i8a_cache stack_views[I8A_BATCH_STACK], *stack_ptrs[I8A_BATCH_STACK] = {0};
    size_t stack_ts[I8A_BATCH_STACK] = {0};
    i8a_cache *views = stack_views, **ptrs = stack_ptrs;
    size_t *ts = stack_ts;
    if (nv > I8A_BATCH_STACK) {
        views = (i8a_cache *)malloc(nv * sizeof *views);
        ptrs = (i8a_cache **)malloc(nv * sizeof *ptrs);
        ts = (size_t *)malloc(nv * sizeof *ts);
        if (!views || !ptrs || !ts) {
            free(views);
            free(ptrs);
            free(ts);
            return 3;
        }
    }
    /* a sequence's queries in order, cut at block ends (q's and out's rows stay in order) */
    size_t v = 0;
    for (size_t b = 0; b < n; b++) {
        for (size_t pos = seqs[b].length - seqs[b].t; pos < seqs[b].length; v++) {
            const size_t end = segment_end(p, seqs + b, pos);
            views[v] = segment_view(p, seqs[b].blocks, end, end - pos);
            ptrs[v] = views + v;
            ts[v] = end - pos;
            pos = end;
        }
    }
    /* the views decode in slices of the pool's workspace, which it keeps for the next call */
    i8a_cache owner;
    memset(&owner, 0, sizeof owner);
    owner.work = p->work;
    owner.work_bytes = p->work_bytes;
    const int rc = i8a_decode_views(kt, ptrs, nv, q, q_type, 0, ts, h, opt, max_threads, out, bad,
                                    &owner);
    p->work = owner.work;
    p->work_bytes = owner.work_bytes;
    if (rc == 0 && p->open_cap)
        open_after_attend(p, ptrs, nv);
    if (nv > I8A_BATCH_STACK) {
        free(views);
        free(ptrs);
        free(ts);
    }
    i8a_prof_add(I8A_PROF_ATTEND, t0, 1);
    return rc;
}

void i8a_paged_dequantize(const i8a_kernels *kt, const i8a_paged *p, const int32_t *blocks,
                          size_t length, float *k, float *v)
{
    const i8a_cache c = segment_view(p, blocks, length, 1);
    i8a_dequantize(kt, &c, k, v);
}
