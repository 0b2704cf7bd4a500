/* A paged pool: rows written by slot, and a batch of sequences attended through views (an
 * i8a_cache per sequence whose rows lie in the pool's blocks, decoded by decode.c as any
 * cache). */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

size_t i8a_paged_block_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows)
{
    const size_t row = 2 * head_dim + 8;            /* K and V codes, their two scales */
    if (block_rows && row > SIZE_MAX / block_rows)
        return 0;
    const size_t head = row * block_rows;
    if (n_kv_heads && head > SIZE_MAX / n_kv_heads)
        return 0;
    return head * n_kv_heads;
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
                            NULL, 0};
    *p = init;
}

void i8a_paged_free_work(i8a_paged *p)
{
    i8a_free_aligned(p->work);
    p->work = NULL;
    p->work_bytes = 0;
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

int i8a_paged_write(const i8a_kernels *kt, const i8a_paged *p, const int64_t *slots, size_t n,
                    const float *k, const float *v, size_t *bad)
{
    const size_t hkv = p->n_kv_heads, d = p->head_dim, row = hkv * d;
    /* every row that is written is checked before the first is (a skipped one may hold
     * anything: vLLM's padding) */
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        I8A_EXPECT((uint64_t)slots[i] < (uint64_t)p->blocks * p->block_rows);
        const int rc = i8a_check_rows(k + i * row, v + i * row, hkv, d, bad);
        if (rc) {
            *bad += i * hkv;
            return rc;
        }
    }
    const i8a_cache pool = view_of(p, NULL, p->blocks * p->block_rows);
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < 0)
            continue;
        const size_t pos = (size_t)slots[i];
        for (size_t g = 0; g < hkv; g++) {
            float tmp[I8A_MAX_HEAD_DIM];
            int8_t vc[I8A_MAX_HEAD_DIM];
            kt->quantize_row(maybe_rotated(kt, &pool, p->sign, k + i * row + g * d, tmp), d,
                             k_row(&pool, g, pos), k_scale_of(&pool, g, pos));
            kt->quantize_row(maybe_rotated(kt, &pool, p->sign, v + i * row + g * d, tmp), d, vc,
                             v_scale_of(&pool, g, pos));
            i8a_v_put(&pool, g, pos, vc);
        }
    }
    return 0;
}

int i8a_paged_attend(const i8a_kernels *kt, i8a_paged *p, const i8a_paged_seq *seqs, size_t n,
                     const float *q, size_t h, const i8a_options *opt, size_t max_threads,
                     float *out, size_t *bad)
{
    I8A_EXPECT(n >= 1);
    i8a_cache stack_views[I8A_BATCH_STACK], *stack_ptrs[I8A_BATCH_STACK] = {0};
    size_t stack_ts[I8A_BATCH_STACK] = {0};
    i8a_cache *views = stack_views, **ptrs = stack_ptrs;
    size_t *ts = stack_ts;
    if (n > I8A_BATCH_STACK) {
        views = (i8a_cache *)malloc(n * sizeof *views);
        ptrs = (i8a_cache **)malloc(n * sizeof *ptrs);
        ts = (size_t *)malloc(n * sizeof *ts);
        if (!views || !ptrs || !ts) {
            free(views);
            free(ptrs);
            free(ts);
            return 3;
        }
    }
    for (size_t b = 0; b < n; b++) {
        I8A_EXPECT(seqs[b].t >= 1 && seqs[b].t <= seqs[b].length);
        views[b] = view_of(p, seqs[b].blocks, seqs[b].length);
        ptrs[b] = views + b;
        ts[b] = seqs[b].t;
    }
    /* the views decode in slices of the pool's workspace, which it keeps for the next call */
    i8a_cache owner;
    memset(&owner, 0, sizeof owner);
    owner.work = p->work;
    owner.work_bytes = p->work_bytes;
    const int rc = i8a_decode_views(kt, ptrs, n, q, 0, ts, h, opt, max_threads, out, bad, &owner);
    p->work = owner.work;
    p->work_bytes = owner.work_bytes;
    if (n > I8A_BATCH_STACK) {
        free(views);
        free(ptrs);
        free(ts);
    }
    return rc;
}

void i8a_paged_dequantize(const i8a_kernels *kt, const i8a_paged *p, const int32_t *blocks,
                          size_t length, float *k, float *v)
{
    const i8a_cache c = view_of(p, blocks, length);
    i8a_dequantize(kt, &c, k, v);
}
