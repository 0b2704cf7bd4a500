/* The engine's own declarations, shared by its files (the public API is ../_engine.h).
 *
 *   store.c   the buffers: which a format has (i8a_store_layout), where each position's codes,
 *             scales and floats lie, reading and writing them, dequantize, moving the rows down
 *             (evict's part), the rotation signs, aligned allocation
 *   state.c   the rows in and out as the file holds them (i8a_export, i8a_import)
 *   append.c  append, truncate and evict: which rows a position is coded from, quantizing them,
 *             K's groups at 4 bits, what a cache that shrank forgets
 *   center.c  the offsets of a centered cache
 *   plan.c    what a decode reads and how it splits (visibility, the cost model, the workspace):
 *             i8a_plan_decode
 *   span.c    a chunk of one kv head as the kernels read it (i8a_span), and prefetch hints
 *   decode.c  the executor: q planes, the (kv head, chunk) items on the pool, batches
 *   merge.c   a kv head's rows: position 0, the recent window, the states folded in position
 *             order, the output
 *   prefill.c an append and a decode of its rows' queries in one call, each query reading its
 *             own position's recent window however many rows the call brings
 *   probe.c   the benchmarks' bandwidth probe
 *
 * Calls go down: prefill -> append, decode; decode -> plan, span, merge -> store; append -> center -> store; probe -> span;
 * state -> store. (i8a_row_at, which rows an append codes from, is in store.c: center reads it.)
 * Each file's definitions carry their comments here when another file calls them. */
#ifndef I8A_ENGINE_INTERNAL_H
#define I8A_ENGINE_INTERNAL_H

#include <stdatomic.h>
#include <string.h>

#include "../_engine.h"
#include "../_simd/common.h"

/* -- the buffers (store.c): small accessors, inline where every file reads them ------------- */

/* n rounded up to a multiple of 64: every part of a workspace starts on a cache line. */
static inline size_t i8a_align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* x itself, or (with a rotation: sign != NULL) its rotated copy in tmp. */
static inline const float *maybe_rotated(const i8a_kernels *kt, const i8a_cache *c,
                                         const float *sign, const float *x, float *tmp)
{
    if (!sign)
        return x;
    kt->rotate(x, c->head_dim, sign, 0, tmp);
    return tmp;
}

/* Row i of rows of d elements of `type` (_engine.h: I8A_F32, I8A_BF16, I8A_F16) as floats:
 * x's own row for float32, else widened into tmp [d], exactly (a half's Inf and NaN too). */
static inline const float *i8a_row_f32(const void *x, size_t i, size_t d, int type, float *tmp)
{
    if (type == I8A_F32)
        return (const float *)x + i * d;
    const uint16_t *h = (const uint16_t *)x + i * d;
    if (type == I8A_BF16) {
        for (size_t j = 0; j < d; j++) {
            const uint32_t b = (uint32_t)h[j] << 16;            /* the top half */
            memcpy(tmp + j, &b, sizeof b);
        }
        return tmp;
    }
    for (size_t j = 0; j < d; j++)
        tmp[j] = i8a_half_value(h[j]);                          /* exact, Inf and NaN too */
    return tmp;
}

/* The offsets hold: decode adds them back. */
static inline int has_offsets(const i8a_cache *c)
{
    return c->k_offset != NULL && c->offsets_set;
}

/* Whether every one of the d values at x has |x| <= limit (a non-negative float): false for
 * NaN and Inf. On the bits: without their sign, floats order as integers do, with NaN and Inf
 * above every finite value, so one integer compare per value answers (and vectorizes, where a
 * float compare that must fail on NaN is left scalar). */
static inline int within(const float *x, size_t d, float limit)
{
    int32_t top, over = 0;               /* signed: both sides are below 2^31 */
    memcpy(&top, &limit, sizeof top);
    for (size_t i = 0; i < d; i++) {
        int32_t b;
        memcpy(&b, x + i, sizeof b);
        over |= (b & 0x7fffffff) > top;
    }
    return !over;
}

static inline int in_range(const float *x, size_t d)
{
    return within(x, d, I8A_VALUE_MAX);
}

/* in_range for a row of d 16-bit values of `type` (I8A_BF16 or I8A_F16), on their bits as
 * within() does a float's, without widening them. A bfloat16 is a float's top half: its bits
 * without the sign, x, give x << 16 > the bound's bits exactly when x > their top half. Every
 * finite half is below I8A_VALUE_MAX (65504 < 2^64): a half is in range when it is finite. */
static inline int in_range16(const uint16_t *h, size_t d, int type)
{
    const float limit = I8A_VALUE_MAX;
    uint32_t bits;
    memcpy(&bits, &limit, sizeof bits);
    /* int16: both sides are below 2^15, and the compare vectorizes as one */
    const int16_t top = (int16_t)(type == I8A_BF16 ? bits >> 16 : 0x7bffu);   /* 65504 */
    int16_t over = 0;
    for (size_t i = 0; i < d; i++)
        over |= (int16_t)((int16_t)(h[i] & 0x7fffu) > top);
    return !over;
}

/* The ring slot of position pos (held: held_from <= pos < len, or being appended). */
static inline size_t slot_of(const i8a_cache *c, size_t pos)
{
    return (pos + c->ring_shift) % c->ring;
}

/* V tiles per kv head: max_seq rounded up to whole tiles (dispatch.h). */
static inline size_t v_tiles_of(const i8a_cache *c)
{
    return (c->max_seq + I8A_V_TILE - 1) / I8A_V_TILE;
}

/* The parts of kv head g's share of a paged block (_engine.h's layout), as offsets from it. */
enum { PAGED_K, PAGED_V, PAGED_KS, PAGED_VS };

static inline size_t paged_part(const i8a_paged *p, int part)
{
    const size_t rd = p->block_rows * p->head_dim;
    return part == PAGED_K ? 0 : part == PAGED_V ? rd : part == PAGED_KS ? 2 * rd
                                                                         : 2 * rd + 4 * p->block_rows;
}

/* Where kv head g's share of block 0 starts (a block's place is then + block * block_bytes):
 * the heads' shares follow each other, block_bytes / n_kv_heads bytes each. */
static inline size_t paged_head(const i8a_paged *p, size_t g)
{
    return g * (p->block_bytes / p->n_kv_heads);
}

/* Kv head g's part `part` in the block of a paged view's position pos (the view's blocks[pos /
 * block_rows]; a view without blocks is the whole pool, its blocks in order: position = slot). */
static inline uint8_t *paged_at(const i8a_cache *c, size_t g, size_t pos, int part)
{
    const i8a_paged *p = c->paged;
    const size_t b = pos >> p->block_shift;
    const size_t block = c->blocks ? (size_t)c->blocks[b] : b;
    return p->base + block * p->block_bytes + paged_head(p, g) + paged_part(p, part);
}

/* The row within its block of a paged view's position pos. */
static inline size_t paged_row(const i8a_cache *c, size_t pos)
{
    return pos & (c->paged->block_rows - 1);
}

/* K at 8 bits: the codes [d] and the scale of kv head g at position pos. */
static inline int8_t *k_row(const i8a_cache *c, size_t g, size_t pos)
{
    if (c->paged)
        return (int8_t *)paged_at(c, g, pos, PAGED_K) + paged_row(c, pos) * c->head_dim;
    return c->k_codes + (g * c->max_seq + pos) * c->head_dim;
}

static inline float *k_scale_of(const i8a_cache *c, size_t g, size_t pos)
{
    if (c->paged)
        return (float *)paged_at(c, g, pos, PAGED_KS) + paged_row(c, pos);
    return c->k_scale + g * c->max_seq + pos;
}

/* V's scale (at 4 bits its step) of kv head g at position pos. */
static inline float *v_scale_of(const i8a_cache *c, size_t g, size_t pos)
{
    if (c->paged)
        return (float *)paged_at(c, g, pos, PAGED_VS) + paged_row(c, pos);
    return c->v_scale + g * c->max_seq + pos;
}

/* The V tile of kv head g holding position pos. */
static inline int8_t *v_tile(const i8a_cache *c, size_t g, size_t pos)
{
    if (c->paged)
        return (int8_t *)paged_at(c, g, pos, PAGED_V)
               + paged_row(c, pos) / I8A_V_TILE * I8A_V_TILE * c->head_dim;
    return c->v_codes + (g * v_tiles_of(c) + pos / I8A_V_TILE) * I8A_V_TILE * c->head_dim;
}

/* Set the nibble of one element in its byte (dispatch.h's blocks): high for elements 16 .. 31
 * of a block. */
static inline void nib_set(uint8_t *byte, size_t i, unsigned code)
{
    *byte = i % I8A_NIB_BLOCK < 16 ? (uint8_t)((*byte & 0xf0u) | code)
                                   : (uint8_t)((*byte & 0x0fu) | code << 4);
}

/* Element i's code (0 .. 31) into a K row at 4 bits: its nibble, and in a wide channel (rank:
 * its group's i8a_k4_wide_ranks) its fifth bit into the row's wide bits, cleared beforehand. */
static inline void k4_set_code(uint8_t *row, uint8_t *wide, const int16_t *rank, size_t i,
                               unsigned code)
{
    nib_set(row + i / I8A_NIB_BLOCK * 16 + i % 16, i, code & 15u);
    if (rank[i] >= 0)
        wide[rank[i] / 8] |= (uint8_t)((code >> 4) << (rank[i] % 8));
}

/* The V tile at 4 bits of kv head g holding position pos. */
static inline uint8_t *v4_tile(const i8a_cache *c, size_t g, size_t pos)
{
    return c->v4 + (g * v_tiles_of(c) + pos / I8A_V_TILE) * 2 * c->head_dim;
}

/* The row at 4 bits of K of kv head g at position pos. */
static inline uint8_t *k4_row_codes(const i8a_cache *c, size_t g, size_t pos)
{
    return c->k4 + (g * c->max_seq + pos) * (c->head_dim / 2);
}

/* Its wide channels' fifth bits (I8A_K4_WIDE_BYTES). */
static inline uint8_t *k4_row_wide(const i8a_cache *c, size_t g, size_t pos)
{
    return c->k4_wide + (g * c->max_seq + pos) * I8A_K4_WIDE_BYTES(c->head_dim);
}

/* Halves h [d] times their row's scale into y [d] (exact). */
static inline void widen(const uint16_t *h, float scale, size_t d, float *y)
{
    for (size_t i = 0; i < d; i++)
        y[i] = i8a_half_value(h[i]) * scale;
}

/* Row `slot` of kv head g of one side of the ring (halves h, scales s) as floats into y [d]. */
static inline void widen_row(const i8a_cache *c, const uint16_t *h, const float *s, size_t g,
                             size_t slot, float *y)
{
    const size_t at = g * c->ring + slot;
    widen(h + at * c->head_dim, s[at], c->head_dim, y);
}

/* The first position read from the codes (position 0 is read from its float row when kept). */
static inline size_t coded_from(const i8a_cache *c)
{
    return c->k_first ? 1 : 0;
}

/* The first position a query at position end - 1 reads from the recent window (end when it
 * reads none): the last R positions up to it whose floats are held, not position 0 when it is
 * kept apart. */
static inline size_t float_start(const i8a_cache *c, size_t end)
{
    if (!c->recent)
        return end;
    size_t w = end > c->recent ? end - c->recent : 0;
    w = w > c->held_from ? w : c->held_from;
    w = w > coded_from(c) ? w : coded_from(c);
    return w < end ? w : end;
}

/* The first position decode reads from the recent window (i8a_window_start, inline here: every
 * chunk item asks). */
static inline size_t window_start(const i8a_cache *c)
{
    return float_start(c, c->length);
}

/* Whether a side of the cache is at 4 bits (its attends need I8A_ATTEND4_EXTRA). */
static inline int has_four(const i8a_cache *c)
{
    return c->k_bits == 4 || c->v_bits == 4;
}

/* The format of each side (dispatch.h: the indices of the tier's attend[k][v]). */
static inline int k_format(const i8a_cache *c)
{
    return c->k_bits == 4 ? I8A_FMT4 : I8A_FMT8;
}

static inline int v_format(const i8a_cache *c)
{
    return c->v_bits == 4 ? I8A_FMT4 : I8A_FMT8;
}

/* Chunks of every kv head's positions [0, len), in I8A_CHUNK steps. */
static inline size_t n_chunks(const i8a_cache *c)
{
    return (c->length + I8A_CHUNK - 1) / I8A_CHUNK;
}

/* The V codes [d] of kv head g at position pos, into its tile / out of it; at 4 bits the same
 * (codes 0 .. 15, one a byte, into and out of the tile's nibbles). */
void i8a_v_put(const i8a_cache *c, size_t g, size_t pos, const int8_t *codes);
void i8a_v_get(const i8a_cache *c, size_t g, size_t pos, int8_t *codes);
void i8a_v4_put(const i8a_cache *c, size_t g, size_t pos, const uint8_t *codes);
void i8a_v4_get(const i8a_cache *c, size_t g, size_t pos, uint8_t *codes);

/* A row y [d] (finite, in the stored space) at 4 bits, position pos of kv head g: lo = min y,
 * hi = max y; below I8A_ABSMAX_MIN apart, step 0 and codes 0; else step = (hi - lo) / 15, inv =
 * 15 / (hi - lo), code_i = clamp(rint((y_i - lo) * inv), 0, 15). The row reads back as lo +
 * step * code (multiply, then add). */
void i8a_v4_store(const i8a_cache *c, size_t g, size_t pos, const float *y);

/* K at 4 bits of kv head g at position pos as floats y [d]: min_i + step_i * code (its group's
 * minima and steps, halves times their powers of two; multiply, then add). */
void i8a_k4_value(const i8a_cache *c, size_t g, size_t pos, float *y);

/* Evict's part in the buffers: positions n .. len-1 move down to 0 .. len-n-1 (codes and scales,
 * V's tiles, at 4 bits K's whole groups), the ring's shift follows them, and len shrinks by n;
 * with a kept first position, the new position 0's float row is what decode read for it (its
 * window floats, or its dequantized codes held within +-I8A_VALUE_MAX). What lies above the new
 * length is left as it was (i8a_evict clears K's 4-bit buffers there). Requires 1 <= n < len (an
 * evict of everything is a truncate to 0) and, with K at 4 bits, n a multiple of I8A_K4_GROUP. */
void i8a_move_down(const i8a_kernels *kt, i8a_cache *c, size_t n);

/* -- append (append.c, center.c; the rows an append codes from, in store.c) ------------------ */

/* Where the rows of one side (K or V) of a position are during an append: the append's own
 * rows x [.][hkv][d] for positions from x_from on, the ring (halves and scales) before. */
typedef struct {
    const i8a_kernels *kt;          /* (its half_row) */
    const i8a_cache *c;
    const float *x;
    const uint16_t *ring;
    const float *ring_scale;
    size_t x_from;
} row_source;

/* The row of kv head g at position pos as the cache codes it. From x as given, except that
 * with a recent window positions 1 .. R (the rows the offsets come from, which the ring may
 * code again) go through the window's halves first, so a position codes the same whether it
 * comes from an append or from the ring; from the ring, widened. tmp [d] holds the row when
 * it is not x's own. x's rows are in range (checked before). */
const float *i8a_row_at(const row_source *src, size_t pos, size_t g, float *tmp);

/* off[head] = R (the mean of positions [from, to) of src), per kv head (rotated when the cache
 * rotates): sums in double, in position order. Fewer than I8A_OFFSET_MIN_ROWS rows make no
 * estimate worth its noise, and a mean that offset_keeps rejects is no offset of its rows: the
 * offsets are then zero, which centers nothing (the same codes, and decode values, as without
 * centering). The rows are in range (checked before). */
void i8a_set_offset(const i8a_kernels *kt, const row_source *src, size_t from, size_t to,
                    const float *sign, float *off);

/* The rule on the rows an append takes, in row order (k before v in each): 0 when all `rows`
 * rows of d values of k and v are in range, else 1 / 2 for k / v with *bad the first row that
 * is not (a NaN, an Inf or a value beyond +-I8A_VALUE_MAX). */
int i8a_check_rows(const float *k, const float *v, size_t rows, size_t d, size_t *bad);

/* -- the plan (plan.c) --------------------------------------------------------------------- */

/* The positions query tt of t sees: as two half-open ranges of coded positions in position
 * order, the sinks [sink_begin, sink_end) (empty without them) and the window up to the query
 * itself [win_begin, win_end); pos0: whether it sees position 0 from its float row (kept first
 * position); and the positions p of the recent window it sees: fw <= p < end with p >= lo or
 * p < sinks. Each query reads the recent window of its own position (float_start), so a
 * decode of t queries reads what t single-query decodes after one append each would read,
 * while the ring holds those positions' floats (t <= R). */
typedef struct {
    size_t sink_begin, sink_end, win_begin, win_end;
    int pos0;
    size_t lo, end, fw;
} visible_ranges;

/* What query tt of t sees (visible_ranges). */
visible_ranges i8a_visible(const i8a_cache *c, size_t t, size_t tt, const i8a_options *opt);

/* Whether a query that sees vis reads coded positions (else only float rows: position 0's and
 * the recent window's). */
static inline int sees_codes(const visible_ranges *vis)
{
    return vis->sink_begin < vis->sink_end || vis->win_begin < vis->win_end;
}

/* The chunks the queries see, in position order (i8a_chunk_runs). Each query's window range
 * ends at its own position and consecutive queries' ranges overlap, so the window ranges of all
 * queries cover [the first query's window start, the last query's recent window); the sinks
 * range is the same for every query that has one, and the last query has one when any does. */
i8a_chunk_runs i8a_visible_chunks(const i8a_cache *c, size_t t, const i8a_options *opt);

/* The vi-th visible chunk. */
static inline size_t i8a_visible_chunk(const i8a_chunk_runs *runs, size_t vi)
{
    return vi < runs->count[0] ? runs->begin[0] + vi : runs->begin[1] + (vi - runs->count[0]);
}

/* The work of a decode of t queries of h heads that reads nvis chunks of each kv head and the
 * recent window, in units of I8A_ROWS_PER_THREAD per thread. */
size_t i8a_work_of(const i8a_cache *c, size_t t, size_t h, size_t nvis);

/* Threads for `items` work items of this much work: at most max_threads, fewer when the tokens
 * read are too few to pay for waking another thread. */
size_t i8a_threads_for(size_t work, size_t items, size_t max_threads);

/* The plan for another thread count (the per-thread scratch is last in the workspace). */
i8a_plan i8a_plan_with_threads(i8a_plan L, size_t threads);

/* -- spans (span.c) ------------------------------------------------------------------------ */

/* Positions [a, b) of kv head g as a span (without a prefetch hint). */
i8a_span i8a_span_rows(const i8a_cache *c, size_t g, size_t a, size_t b);

/* A span of a paged view (from i8a_span_rows) reads its rows' scales from buf [2 * I8A_CHUNK]
 * (K's, then V's from buf + I8A_CHUNK): gathered from its blocks; nothing for a contiguous
 * cache, whose scales lie in a row. */
void i8a_gather_scales(const i8a_cache *c, i8a_span *span, float *buf);

/* The scales the next item of a paged view will gather, into the caches ahead of it (a
 * contiguous cache's lie in a row the hardware prefetches: nothing). */
void i8a_prefetch_scales(const i8a_cache *c, const i8a_span *next);

/* The next item's rows as span's prefetch hint: its K and V bytes, at 8 or 4 bits (the
 * kernels read them at the span's own widths: a window item's halves are two rows of codes). */
void i8a_hint_next(i8a_span *span, const i8a_span *next);

/* What the next item reads besides its codes at 4 bits, into the caches ahead of it: K's group
 * minima and steps, V's minima and steps (the kernels prefetch the codes themselves). */
void i8a_prefetch_four(const i8a_cache *c, const i8a_span *next);

/* The first coded position of chunk `chunk`. */
static inline size_t i8a_chunk_start(const i8a_cache *c, size_t chunk)
{
    const size_t c0 = chunk * I8A_CHUNK;
    return c0 > coded_from(c) ? c0 : coded_from(c);
}

/* Chunk `chunk` of kv head g as a span of its coded positions below `end`. */
i8a_span i8a_chunk_span_to(const i8a_cache *c, size_t g, size_t chunk, size_t end);

/* Chunk `chunk` of kv head g as decode reads it: cut where the recent window starts. */
i8a_span i8a_chunk_span(const i8a_cache *c, size_t g, size_t chunk);

/* The recent window's halves of kv head g as a prefetch hint (a span of codes over the same
 * bytes: a row of d halves is two rows of d codes): the window's slots up to the ring's end. */
i8a_span i8a_window_span(const i8a_cache *c, size_t g);

/* -- the executor (decode.c, merge.c) ------------------------------------------------------ */

/* One cache's decode: its plan, its workspace (base) and its queries' shape. */
typedef struct {
    const i8a_kernels *kt;
    const i8a_cache *c;
    const i8a_options *opt;
    char *base;
    i8a_plan L;
    size_t t, h, nq;
    const void *q;          /* [t][h][d] of q_type (_engine.h), as given (checked) */
    int q_type;
    float *out;
} decode_job;

/* The states of a run of a kv head's query rows, one slot per part: part p's slot starts at
 * at + p * bytes and holds rows [first, first + rows): o [rows][d], then m [rows], l [rows]. */
typedef struct {
    char *at;
    size_t bytes, rows, first, d;
} state_slots;

/* The state of rows [r, ..) of part `part` (r within the slots' rows). */
static inline i8a_state slot_state(const state_slots *s, size_t part, size_t r)
{
    float *p = (float *)(s->at + part * s->bytes);
    const size_t k = r - s->first, n = s->rows;
    i8a_state st = {p + n * s->d + k, p + n * s->d + n + k, p + k * s->d};
    return st;
}

/* The chunk form's states of kv head g's rows over visible chunk vi (a slot per part). */
static inline state_slots chunk_slots(const decode_job *job, size_t g, size_t vi)
{
    const size_t slot = (g * job->L.nvis + vi) * job->L.parts;
    const state_slots s = {job->base + job->L.states + slot * job->L.state_bytes,
                           job->L.state_bytes, job->L.rows, 0, job->c->head_dim};
    return s;
}

/* The chunk form's states of kv head g's rows over the recent window (one slot). */
static inline state_slots window_slots(const decode_job *job, size_t g)
{
    const state_slots s = {job->base + job->L.windows + g * job->L.state_bytes,
                           job->L.state_bytes, job->L.rows, 0, job->c->head_dim};
    return s;
}

/* Query rows [r, r + count) of kv head g. */
static inline i8a_query query_at(const decode_job *job, size_t g, size_t r, size_t count)
{
    const size_t d = job->c->head_dim, row = g * job->L.rows + r;
    const i8a_query q = {
        d, count, job->opt->q_bits == 16,
        (const int8_t *)job->base + row * d,
        (const int8_t *)job->base + job->L.q_lo + row * d,
        (const float *)(job->base + job->L.c_hi) + row,
        (const float *)(job->base + job->L.c_lo) + row,
        job->opt->softcap,
        job->opt->softcap > 0.0f ? 1.0f / job->opt->softcap : 0.0f,
        (const float *)(job->base + job->L.bias) + row,
        (const float *)(job->base + job->L.q_float) + row * d,
    };
    return q;
}

/* A batch's per-cache arrays (decode's jobs, prefill's copies and views) sit on the stack up
 * to this many caches, beyond it on the heap. */
#define I8A_BATCH_STACK 8

/* i8a_decode_batch with q's elements of q_type (_engine.h: I8A_F32, I8A_BF16, I8A_F16), cache b's
 * queries t[b] (ts != NULL; else t for every cache), its q and out rows after the earlier
 * caches' t * h; with owner != NULL every cache's workspace is a
 * slice of the owner's one (grown here; the caches' own are not freed), as the views of a
 * paged pool decode. */
int i8a_decode_views(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const void *q,
                     int q_type, size_t t, const size_t *ts, size_t h, const i8a_options *opt,
                     size_t max_threads, float *out, size_t *bad, i8a_cache *owner);

/* The workspace holds at least `bytes` (64-byte aligned): grown by half again at least, so a
 * growing cache reallocates rarely. 0, or -1 when it cannot be allocated (then unchanged). */
int i8a_reserve_work(i8a_cache *c, size_t bytes);

/* The largest |q| a decode with this softmax scale takes: I8A_VALUE_MAX or I8A_QSCALE_MAX /
 * scale, whichever is lower, as the largest float not above it. */
float i8a_q_limit(float scale);

/* The rule on a query row q [d]: 0 when every |q_i| <= limit (i8a_q_limit), else i8a_decode's
 * code for it: 1 for a NaN, an Inf or a value beyond +-I8A_VALUE_MAX, 2 for one beyond the
 * limit only. */
int i8a_check_query(const float *q, size_t d, float limit);

/* The profile (profile.c, _engine.h's I8A_PROF_*): i8a_prof_start() is a time stamp when the
 * profile is on, else 0; i8a_prof_add(part, t0, n) adds the time since t0 (when t0 is not 0)
 * and n to part's count. */
uint64_t i8a_prof_start(void);
void i8a_prof_add(int part, uint64_t t0, uint64_t n);

/* The states of kv head g's query rows [r0, r1) (whole query positions) over the recent window
 * each sees, into slot 0 of dest (m = -inf: none). scratch: the worker's, at least
 * i8a_window_scratch_bytes(c->recent) bytes, 64-byte aligned. */
void i8a_window_rows(const decode_job *job, size_t g, size_t r0, size_t r1, char *scratch,
                     const state_slots *dest);

/* The scratch a window item takes for a window of `recent` rows (the plan puts it in every
 * worker's part of the workspace, not on the stack of a thread that may have little). */
size_t i8a_window_scratch_bytes(size_t recent);

/* A query row's states fold in position order into its running state (run_m, run_l and its
 * row of out): position 0 from its float row, the chunks (within a chunk the sinks before the
 * window), then the recent window; then it is normalized, the V offset added back when the row
 * saw coded positions (so a row that sees only position 0 and the window gets the same bits
 * whatever the cache's length) and rotated back. For kv head g's rows [r0, r1): rows_begin
 * starts them (position 0's state, or none: m = -inf), rows_fold folds `parts` slots of states
 * into them (a slot's m = -inf: nothing seen there), rows_end finishes them. The kv head's
 * v_pos0 is prepared before (decode.c). */
void i8a_rows_begin(const decode_job *job, size_t g, size_t r0, size_t r1);
void i8a_rows_fold(const decode_job *job, size_t g, size_t r0, size_t r1,
                   const state_slots *states, size_t parts);
void i8a_rows_end(const decode_job *job, size_t g, size_t r0, size_t r1);

/* The chunk form's last item of kv head g is done: its rows' states fold in position order
 * (i8a_rows_begin, i8a_rows_fold of every chunk and of the window, i8a_rows_end). */
void i8a_finish_head(const decode_job *job, size_t g);

#endif
