/* A chunk of one kv head as the kernels read it (i8a_span: its rows at 8 or 4 bits, where
 * they start in their tiles and groups) and the next item's bytes as a prefetch hint. */
#include "internal.h"

/* Positions [a, b) of kv head g of a paged view: in its blocks from the one holding a (the
 * scales are gathered by i8a_gather_scales). */
static i8a_span paged_rows(const i8a_cache *c, size_t g, size_t a, size_t b)
{
    const i8a_paged *p = c->paged;
    i8a_span span = {0};
    span.k = (const int8_t *)p->base + paged_head(p, g);
    span.v = span.k + paged_part(p, PAGED_V);
    span.blocks = c->blocks + (a >> p->block_shift);
    span.block_bytes = p->block_bytes;
    span.block_shift = p->block_shift;
    span.lead = paged_row(c, a);
    span.v_lead = a % I8A_V_TILE;
    span.vlead = span.lead - span.v_lead;
    span.n = b - a;
    return span;
}

i8a_span i8a_span_rows(const i8a_cache *c, size_t g, size_t a, size_t b)
{
    if (c->paged)
        return paged_rows(c, g, a, b);
    const size_t row = g * c->max_seq + a, d = c->head_dim;
    i8a_span span = {0};
    span.blocks = i8a_one_block;
    span.block_shift = I8A_ONE_BLOCK_SHIFT;
    span.ks = c->k_bits == 8 ? c->k_scale + row : NULL;
    span.vs = c->v_scale + row;
    span.n = b - a;
    span.v_lead = a % I8A_V_TILE;
    if (c->k_bits == 8) {
        span.k = c->k_codes + row * d;
    } else {
        const size_t at = g * i8a_k4_groups(c->max_seq) + a / I8A_K4_GROUP;
        span.k4 = k4_row_codes(c, g, a), span.k4_wide = k4_row_wide(c, g, a);
        span.k4_min = c->k4_min + at * d, span.k4_step = c->k4_step + at * d;
        span.k4_min_scale = c->k4_min_scale + at, span.k4_step_scale = c->k4_step_scale + at;
        span.k4_lead = a % I8A_K4_GROUP;
    }
    if (c->v_bits == 8) {
        span.v = v_tile(c, g, a);
    } else {
        span.v4 = v4_tile(c, g, a);
        span.v4_min = c->v4_min + row;
    }
    return span;
}

/* The rows from span row r of a paged span that lie in one block: how many, and in *block the
 * start of kv head g's share of that block (the span's k is its share of block 0's place), in
 * *in_block row r's place there. */
static size_t paged_run(const i8a_paged *p, const i8a_span *span, size_t r, const uint8_t **block,
                        size_t *in_block)
{
    const size_t row = span->lead + r;
    *block = (const uint8_t *)span->k
             + (size_t)span->blocks[row >> p->block_shift] * p->block_bytes;
    *in_block = row & (p->block_rows - 1);
    return i8a_rows_in_block(span, row, span->n - r);
}

/* Each run's K and V scales of a paged span: copied to buf (K's at buf, V's at buf +
 * I8A_CHUNK), or with buf NULL only prefetched. */
static void paged_scales(const i8a_paged *p, const i8a_span *span, float *buf)
{
    for (size_t r = 0; r < span->n;) {
        const uint8_t *block;
        size_t at;
        const size_t run = paged_run(p, span, r, &block, &at);
        const float *ks = (const float *)(block + paged_part(p, PAGED_KS)) + at;
        const float *vs = (const float *)(block + paged_part(p, PAGED_VS)) + at;
        if (buf) {
            memcpy(buf + r, ks, run * sizeof(float));
            memcpy(buf + I8A_CHUNK + r, vs, run * sizeof(float));
        } else {
            i8a_prefetch_rows(ks, run * sizeof(float));
            i8a_prefetch_rows(vs, run * sizeof(float));
        }
        r += run;
    }
}

void i8a_gather_scales(const i8a_cache *c, i8a_span *span, float *buf)
{
    if (!c->paged)
        return;
    paged_scales(c->paged, span, buf);
    span->ks = buf;
    span->vs = buf + I8A_CHUNK;
}

void i8a_prefetch_scales(const i8a_cache *c, const i8a_span *next)
{
    if (c->paged && next->n && !i8a_one_run(next))  /* a chunk of blocks, not the window */
        paged_scales(c->paged, next, NULL);
}

void i8a_hint_next(i8a_span *span, const i8a_span *next)
{
    /* the hints are read with this span's block layout: a next span laid out otherwise (a
     * paged view's window after its chunks: one run) gets none */
    if (next->block_shift != span->block_shift) {
        span->next_n = 0;
        return;
    }
    span->next_k = next->k4 ? (const int8_t *)next->k4 : next->k;
    span->next_v = next->v4 ? (const int8_t *)next->v4 : next->v;
    span->next_blocks = next->blocks ? next->blocks : i8a_one_block;
    span->next_lead = next->lead;
    span->next_vlead = next->vlead;
    span->next_n = next->n;
}

void i8a_prefetch_four(const i8a_cache *c, const i8a_span *next)
{
    if (next->k4 && next->n) {
        const size_t groups = (next->k4_lead + next->n + I8A_K4_GROUP - 1) / I8A_K4_GROUP;
        i8a_prefetch_rows(next->k4_min, groups * c->head_dim * sizeof(uint16_t));
        i8a_prefetch_rows(next->k4_step, groups * c->head_dim * sizeof(uint16_t));
    }
    if (next->v4 && next->n) {
        i8a_prefetch_rows(next->v4_min, next->n * sizeof(float));
        i8a_prefetch_rows(next->vs, next->n * sizeof(float));
    }
}

i8a_span i8a_chunk_span_to(const i8a_cache *c, size_t g, size_t chunk, size_t end)
{
    const size_t c1 = chunk * I8A_CHUNK + I8A_CHUNK;
    return i8a_span_rows(c, g, i8a_chunk_start(c, chunk), c1 < end ? c1 : end);
}

i8a_span i8a_chunk_span(const i8a_cache *c, size_t g, size_t chunk)
{
    return i8a_chunk_span_to(c, g, chunk, window_start(c));
}

i8a_span i8a_window_span(const i8a_cache *c, size_t g)
{
    i8a_span span = {0};
    const size_t fw = window_start(c), d = c->head_dim;
    if (fw >= c->length)
        return span;
    const size_t s = slot_of(c, fw), n = c->length - fw;
    span.blocks = i8a_one_block;
    span.block_shift = I8A_ONE_BLOCK_SHIFT;
    span.k = (const int8_t *)(c->k_recent + (g * c->ring + s) * d);
    span.v = (const int8_t *)(c->v_recent + (g * c->ring + s) * d);
    span.n = 2 * (s + n <= c->ring ? n : c->ring - s);
    return span;
}
