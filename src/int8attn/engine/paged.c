/* A paged pool: rows written by slot, and a batch of sequences attended through views (an
 * i8a_cache per sequence whose rows lie in the pool's blocks, decoded by decode.c as any
 * cache). */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

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
 * else the one used least recently, taken from its block. */
static size_t open_for_write(i8a_paged *p, size_t block, size_t off)
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
        if (p->open[pick].block >= 0)
            p->open_of[p->open[pick].block] = -1;
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

int i8a_paged_write(const i8a_kernels *kt, i8a_paged *p, const int64_t *slots, size_t n,
                    const void *k, const void *v, int type, size_t *bad)
{
    const uint64_t t0 = i8a_prof_start();
    const size_t hkv = p->n_kv_heads, d = p->head_dim;
    float kw[I8A_MAX_HEAD_DIM], vw[I8A_MAX_HEAD_DIM];   /* a row of either, as floats */
    /* every row that is written is checked before the first is (a skipped one may hold
     * anything: vLLM's padding), in row order, k before v */
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        I8A_EXPECT((uint64_t)slots[i] < (uint64_t)p->blocks * p->block_rows);
        for (size_t g = 0; g < hkv; g++) {
            size_t none;
            const int rc = i8a_check_rows(i8a_row_f32(k, i * hkv + g, d, type, kw),
                                          i8a_row_f32(v, i * hkv + g, d, type, vw), 1, d, &none);
            if (rc) {
                *bad = i * hkv + g;
                return rc;
            }
        }
    }
    const i8a_cache pool = view_of(p, NULL, p->blocks * p->block_rows);
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        const size_t pos = (size_t)slots[i];
        size_t at = 0;              /* with open blocks: the entry's row of the position */
        if (p->open_cap) {
            const size_t off = pos & (p->block_rows - 1);
            if (off == 0)           /* a new first row, if the block is a first block */
                p->first_held[pos >> p->block_shift] = 0;
            at = open_row0(p, open_for_write(p, pos >> p->block_shift, off)) + off;
        }
        for (size_t g = 0; g < hkv; g++) {
            float tmp[I8A_MAX_HEAD_DIM];
            int8_t vc[I8A_MAX_HEAD_DIM];
            const float *kr = i8a_row_f32(k, i * hkv + g, d, type, kw);
            const float *vr = i8a_row_f32(v, i * hkv + g, d, type, vw);
            kt->quantize_row(maybe_rotated(kt, &pool, p->sign, kr, tmp), d,
                             k_row(&pool, g, pos), k_scale_of(&pool, g, pos));
            kt->quantize_row(maybe_rotated(kt, &pool, p->sign, vr, tmp), d, vc,
                             v_scale_of(&pool, g, pos));
            i8a_v_put(&pool, g, pos, vc);
            if (p->open_cap) {      /* the halves, as the recent window keeps the row */
                const size_t r = at + g * p->block_rows;
                p->open_ks[r] = kt->half_row(kr, d, p->open_k + r * d);
                p->open_vs[r] = kt->half_row(vr, d, p->open_v + r * d);
            }
        }
    }
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
