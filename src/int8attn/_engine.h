/* The tier-independent driver: append and decode over one cache, through a kernel table.
 * The Cython front end validates shapes, counts and capacity before calling; these functions
 * check only what needs the data itself (NaN and Inf). */
#ifndef I8A_ENGINE_H
#define I8A_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "_simd/dispatch.h"

/* The cache buffers, head-major: k_codes[head][position][i] int8 and k_scale[head][position]
 * float; the same for V, but for V's codes, which are stored in tiles of I8A_V_TILE positions
 * (dispatch.h): v_codes[head][position / 4][i][position % 4], ceil(max_seq / 4) tiles per head
 * (the slots of the last tile past max_seq, and of any tile past length, are never read with a
 * weight other than 0; they need not be initialized). In the comments below hkv, cap, d and len abbreviate n_kv_heads,
 * max_seq, head_dim and length. With a rotation (k_sign, v_sign != NULL) K and V rows are
 * stored rotated, q is rotated before the dots and the output rotated back: (Rq).(Rk) = q.k and
 * R^T sum p (R v) = sum p v. The two sides rotate alike or not at all in an int8 cache.
 *
 * Keeping the first position (k_first != NULL): position 0, the attention sink, is also kept as
 * given in k_first / v_first, and decode reads it from there instead of from its codes.
 *
 * The recent window (recent = R > 0): the rows of the latest positions, as appended, are also
 * kept in a ring (k_recent / v_recent) as IEEE halves with a power-of-two scale per row (the
 * tier's half_row: 11 significant bits whatever the row's range), and decode reads the last R
 * positions from there instead of from their codes. The ring holds the last 2R positions appended
 * (R more than the window reads), so truncate can take back up to R tokens and find the window's
 * rows still there; floats are held for positions [held_from, length). Every row is also
 * quantized as it is appended, so the codes of every position exist (the window's are read once a
 * truncate deeper than the ring, or an evict, leaves a position without its floats).
 *
 * Centering (k_offset != NULL, only with k_first): every row past position 0 is stored minus
 * its kv head's offset (k_offset / v_offset, in the stored space), which decode adds back:
 * q.off joins each logit (the query's bias) and the V offset joins the output (the weights sum
 * to 1). With a recent window the offsets are the mean of positions 1 .. R, set by the append
 * that brings the cache to R + 1 tokens, however the rows were split into appends (until then
 * the rows past position 0 are coded uncentered, and decode reads them only from the window);
 * a truncate or an evict back to R tokens or fewer forgets them while the window's floats are
 * held (the rows past position 0 are coded uncentered again). Without a window the append that
 * first reaches past position 0 sets them, to the mean of its own rows past position 0, or to
 * zeros when it holds fewer than I8A_OFFSET_MIN_ROWS of them (one row is no mean); a truncate or
 * an evict to 1 token or fewer forgets them. Either way a kv head whose mean fails
 * offset_keeps (one huge outlier) gets a zero offset. */
#define I8A_OFFSET_MIN_ROWS 16

/* The largest recent window (its logits sit on the stack during a decode). */
#define I8A_RECENT_MAX 1024


/* The range of the format. Every value appended (k, v) or decoded against (q) must be within
 * +-I8A_VALUE_MAX (2^64): then no step of the format (the rotation grows a row's largest value
 * by at most sqrt(1024) = 2^5, the offsets add one more bit: stored rows stay within 2^70) nor
 * of a chunk's V sum (256 * 2^70) can leave float32's range. A decode's softmax scale times the
 * largest |q| of a query row must be at most I8A_QSCALE_MAX (2^40): every logit is then below
 * 2^10 * 2^5 * 2^70 * 2^40 < 2^126 in magnitude, and so is every product on the way to it, so
 * logits are finite and their differences too. */
#define I8A_VALUE_MAX 0x1p64f
#define I8A_QSCALE_MAX 0x1p40f

typedef struct {
    int8_t *k_codes;            /* [n_kv_heads][max_seq][head_dim] */
    int8_t *v_codes;            /* [n_kv_heads][ceil(max_seq / 4)][head_dim][4] */
    float *k_scale, *v_scale;   /* [n_kv_heads][max_seq] */
    size_t n_kv_heads, max_seq, head_dim;
    size_t length;              /* tokens stored: rows 0 .. length-1 of every head */
    const float *k_sign;        /* [head_dim] +-1 of the random-sign Hadamard rotation of K, or
                                 * NULL: K unrotated (q then unrotated too) */
    const float *v_sign;        /* the same for V (the output rotated back) */
    float *k_first, *v_first;   /* [n_kv_heads][head_dim] position 0 as appended, or NULL */
    float *k_offset, *v_offset; /* [n_kv_heads][head_dim] the offsets, or NULL: no centering */
    int offsets_set;            /* the offsets hold (decode adds them back); 0 without them */
    size_t recent;              /* R, the positions decode reads as floats; 0: no window */
    size_t ring;                /* slots of the ring: min(2R, max_seq); 0 without a window */
    uint16_t *k_recent, *v_recent;  /* [n_kv_heads][ring][head_dim] halves, or NULL */
    float *k_rscale, *v_rscale; /* [n_kv_heads][ring] their rows' scales (powers of two) */
    size_t ring_shift;          /* position p's rows sit in slot (p + ring_shift) % ring */
    size_t held_from;           /* floats are held for positions held_from .. length-1 */
    void *work;                 /* decode's workspace (64-byte aligned), grown by i8a_decode */
    size_t work_bytes;          /* its size; 0 with work == NULL before the first decode */
    /* The sides at 4 bits (dispatch.h's formats; k_bits, v_bits 8 or 4). A side at 4 bits has
     * no int8 codes (k_codes / v_codes and k_scale NULL; v_scale then holds V's steps). K at 4
     * bits is never rotated (k_sign NULL) and neither side is centered. */
    int k_bits, v_bits;
    uint8_t *k4;                /* [n_kv_heads][max_seq][head_dim / 2] nibble blocks */
    uint8_t *k4_wide;           /* [n_kv_heads][max_seq][head_dim / 16] the wide channels' fifth
                                 * bits (k4/scalar.h) */
    uint16_t *k4_min, *k4_step; /* [n_kv_heads][k4 groups][head_dim] halves per group */
    float *k4_min_scale, *k4_step_scale;  /* [n_kv_heads][k4 groups] their powers of two */
    uint8_t *v4;                /* [n_kv_heads][ceil(max_seq / 4)][2 head_dim] tiles of nibbles */
    float *v4_min;              /* [n_kv_heads][max_seq] */
    /* A sequence of a paged pool (i8a_paged_attend's views): its rows lie in the pool's blocks
     * (paged), blocks[b] holding positions b * block_rows ..; the buffers above are then NULL
     * (8/8, rotated or not, nothing else). NULL for a cache with buffers of its own. */
    const struct i8a_paged *paged;
    const int32_t *blocks;
} i8a_cache;

/* A cache's format: what decides its buffers. */
typedef struct {
    size_t n_kv_heads, max_seq, head_dim;
    int k_bits, v_bits;         /* 8 or 4 each */
    int keep_first, center;     /* position 0 as floats; the offsets (needs keep_first, 8/8) */
    size_t recent;              /* R; the ring holds min(2R, max_seq) positions */
} i8a_format;

/* The buffers of a cache, by the i8a_cache field each backs (the order of i8a_store_layout's
 * table). */
enum {
    I8A_BUF_K_CODES, I8A_BUF_K_SCALE, I8A_BUF_K4, I8A_BUF_K4_WIDE, I8A_BUF_K4_MIN, I8A_BUF_K4_STEP,
    I8A_BUF_K4_MIN_SCALE, I8A_BUF_K4_STEP_SCALE, I8A_BUF_V_CODES, I8A_BUF_V_SCALE, I8A_BUF_V4,
    I8A_BUF_V4_MIN, I8A_BUF_K_FIRST, I8A_BUF_V_FIRST, I8A_BUF_K_OFFSET, I8A_BUF_V_OFFSET,
    I8A_BUF_K_RECENT, I8A_BUF_V_RECENT, I8A_BUF_K_RSCALE, I8A_BUF_V_RSCALE,
    I8A_BUFFERS
};

/* One buffer of a cache: its elements' type, its shape (C order) and size. */
typedef struct {
    const char *name;           /* the i8a_cache field */
    char type;                  /* 'b' int8, 'B' uint8, 'H' uint16 (IEEE halves), 'f' float32 */
    size_t item;                /* bytes an element */
    size_t ndim, shape[4];
    size_t bytes;               /* item times the shape's product; 0: the format has none */
    int zeroed;                 /* must hold zeros before the first append */
} i8a_buffer;

/* The layout of a cache of format f: buf[i] for every I8A_BUF_* (the store's one statement of
 * which buffers a format has and how large each is; the front end allocates from it, nbytes
 * sums it, the C check and the benchmarks read it). *total: the sum of their bytes. Returns 0,
 * or -1 when a size does not fit a size_t (f's fields are otherwise taken as valid). */
int i8a_store_layout(const i8a_format *f, i8a_buffer buf[I8A_BUFFERS], size_t *total);

/* c: an empty cache of format f over the buffers mem[i] (buf[i].bytes each, as i8a_store_layout
 * gives them, 64-byte aligned, zeros where buf[i].zeroed; NULL where the format has none). sign
 * [d] is the rotation's signs or NULL (no rotation): V is rotated with it, and K when at 8 bits
 * (K at 4 bits is stored per channel, unrotated). c's workspace starts empty. */
void i8a_store_bind(i8a_cache *c, const i8a_format *f, void *const mem[I8A_BUFFERS],
                    const float *sign);

/* The cache's rows as its file holds them (state_dict's arrays, docs/architecture.md "The file
 * format"): codes one per byte, V as rows, K's group minima and steps and the recent window's
 * rows as floats. A pointer is NULL where the format has no such array. */
typedef struct {
    size_t length;              /* tokens */
    size_t held;                /* the recent window's rows held: positions length - held ..
                                 * length - 1 */
    int offsets_set;
    int8_t *k_i8, *v_i8;        /* [hkv][len][d] a side at 8 bits */
    float *k_scale, *v_scale;   /* [hkv][len] (V at 4 bits: its steps) */
    uint8_t *k_codes, *v_codes; /* [hkv][len][d] a side at 4 bits: codes 0 .. 15 */
    float *k_group_min, *k_group_step;  /* [hkv][ceil(len / 32)][d] K at 4 bits */
    float *v_min;               /* [hkv][len] V at 4 bits */
    float *k_first, *v_first;   /* [hkv][d] position 0 (zeros without keep_first or tokens) */
    float *k_offset, *v_offset; /* [hkv][d] the offsets (zeros unless they hold) */
    float *k_recent, *v_recent; /* [held][hkv][d] */
} i8a_rows;

/* The recent window's rows a cache holds (i8a_rows.held). */
size_t i8a_rows_held(const i8a_cache *c);

/* Copy the cache's rows out into r's arrays (those that are not NULL: a caller may ask for one;
 * r->length, held and offsets_set are set). */
void i8a_export(const i8a_cache *c, i8a_rows *r);

/* Fill the empty cache c with the rows r (checked by the caller: shapes, counts, code and value
 * ranges, length <= cap, held <= min(length, ring)): the state the export that gave them
 * had. K's group minima and steps must be halves times a power of two as half_row makes them
 * (a row of them comes back bit for bit); so must the recent window's rows, unless round_window
 * (files of version 3 from before the halves): then they become halves as an append makes them.
 * Returns 0, or with c still empty 1 / 2 / 3 / 4 when a row of k_group_min / k_group_step /
 * k_recent / v_recent is not such a row, its index into r's array of rows in *bad (groups:
 * kv head * ceil(length / 32) + group; window: position's row * hkv + kv head); 5 when a K
 * code at 4 bits above 15 (at most 31: the caller's check) lies in a channel that is not wide
 * (dispatch.h), *bad its row (kv head * length + position). */
int i8a_import(const i8a_kernels *kt, i8a_cache *c, const i8a_rows *r, int round_window,
               size_t *bad);

/* V codes rows [n][d] (int8) into V tiles (i8a_cache's layout: ceil((lead + n) / 4) tiles of
 * 4 d bytes) from slot `lead` (0 .. 3) of the first; the other slots are left as they are. The
 * engine's writes of V rows, and the kernels' test entry, which builds a span by hand. */
void i8a_tile_rows(const int8_t *rows, size_t n, size_t d, size_t lead, int8_t *tiles);

/* K groups at 4 bits of a cache of cap positions: ceil(cap / I8A_K4_GROUP). A group is coded
 * once all its positions are appended (from the rows as the recent window keeps them, so the
 * codes do not depend on how appends were split); until then its positions are read from the
 * window, which must cover a group (recent >= I8A_K4_GROUP). Position 0, when kept apart,
 * takes no part in group 0's ranges. A truncate into a coded group leaves its codes, which
 * serve positions whose floats the ring no longer holds, and the group is coded again when it
 * fills up. */
size_t i8a_k4_groups(size_t cap);

/* Free the decode workspace (the cache's other buffers belong to its owner). */
void i8a_cache_free_work(i8a_cache *c);

/* `bytes` (exactly: a sanitizer sees past them) at a 64-byte boundary, or NULL; freed by
 * i8a_free_aligned. The cache's buffers come from here, so every row of 64 or more bytes
 * starts on a cache line. */
void *i8a_alloc_aligned(size_t bytes);
void i8a_free_aligned(void *p);

/* Store t tokens, k and v each [t][hkv][d] float32, as positions len .. len+t-1, and grow len by
 * t. Returns 0, or with the cache unchanged 1 / 2 when k / v holds a NaN, an Inf or a value
 * beyond +-I8A_VALUE_MAX, with *bad = token * hkv + head of the first such row (in row order, k
 * before v). Requires len + t <= cap and t >= 1. */
int i8a_append(const i8a_kernels *kt, i8a_cache *c, const float *k, const float *v, size_t t,
               size_t *bad);

/* Keep the first n positions (n <= len): what decode reads of them is then what it read after
 * the n-th append, as long as the ring still holds the floats of the window up to n (always,
 * when the cache was not truncated further back than R tokens before); positions whose floats
 * are gone are read from their codes. The offsets are forgotten as the header says. */
void i8a_truncate(const i8a_kernels *kt, i8a_cache *c, size_t n);

/* What a decode computes beyond q: the softmax scale, q precision, and which positions each
 * query sees. Query t of T sits at position len - T + t and sees the positions up to itself
 * (causal); with a window W, only the last W of them, plus the first `sinks` positions. */
typedef struct {
    float scale;        /* softmax scale */
    int q_bits;         /* 16 (two int8 planes) or 8 */
    size_t window;      /* 0: no window */
    size_t sinks;       /* positions that stay visible under a window (0 without one) */
    float softcap;      /* > 0: logits become softcap * tanh(logit / softcap); 0: off */
} i8a_options;

/* The chunks a decode reads, in position order: two runs of consecutive chunks (the sinks',
 * then the window's; the second empty when they meet). */
typedef struct {
    size_t begin[2], count[2];
} i8a_chunk_runs;

/* The plan of one decode (i8a_plan_decode): what it reads, how it splits over threads, and its
 * workspace, every part at a 64-byte aligned offset from the start (R = rows, query rows per kv
 * head; q_hi at offset 0). Its items take one of two forms: with few rows (row_block 0, the
 * chunk form) an item is a (kv head, visible chunk) pair, and with a recent window one more per
 * kv head; with many (a prefill's), an item is a (kv head, block of row_block rows) that attends
 * the visible chunks and the window for its rows in position order, folding as it goes (the
 * row form: no states kept per chunk). The same operations in the same order either way:
 *   q_hi, q_lo [hkv][R][d] int8;  c_hi, c_lo, bias, pos0_logit [hkv][R] float;
 *   q_float [hkv][R][d] float, the q the float rows are dotted with (decode.c's prepare_q:
 *     q_hat, or q as given) times the softmax scale (the recent window's dots, and K at 4
 *     bits; absent otherwise);
 *   v_pos0 [hkv][d] float, position 0's V row in the stored space;  prep [hkv] atomic int: kv head
 *     g's rows prepared (0 not yet, 1 under way, 2 done: decode.c's ensure_prepared);
 *   left [hkv] atomic: items not yet done per kv head;  run_m, run_l [hkv][R] float;
 *   states (the chunk form): per (kv head, visible chunk, part) the state of R rows,
 *     state_bytes each (o [R][d], m [R], l [R]); the part is 0 for the sinks and 1 for the
 *     window when both are on, else 0;
 *   windows (the chunk form): with a recent window, per kv head the state of R rows over it
 *     (the same shape);
 *   workers: per thread the attend scratch, worker_bytes each (a paged view's: the scales of
 *     the span it attends from `gather` on, 2 * I8A_CHUNK floats), at least a window item's
 *     (i8a_window_scratch_bytes); the row form's from block_states on: the states of its block
 *     of rows, per part, state_bytes each (of row_block rows); end: the workspace's size. */
typedef struct {
    i8a_chunk_runs runs;    /* the visible chunks */
    size_t nvis;            /* their number: runs.count[0] + runs.count[1] */
    size_t rows;            /* query rows per kv head: t * (h / hkv) */
    size_t row_block;       /* the row form's rows per item (whole query positions); 0: the
                             * chunk form */
    size_t parts;           /* states per (kv head, chunk): 2 with sinks under a window, else 1 */
    size_t per_head;        /* items per kv head: nvis, and one for the recent window (the row
                             * form: the blocks of rows) */
    size_t items;           /* hkv * per_head: the pool job's items, chunks first (kv head by
                             * kv head), then the windows (the row form: kv head by kv head) */
    size_t work;            /* the cost model's estimate (units of I8A_ROWS_PER_THREAD) */
    size_t threads;         /* threads the items run on */
    size_t q_lo, c_hi, c_lo, bias, pos0_logit, q_float, v_pos0, prep, left, run_m, run_l;
    size_t states, windows, workers, end;
    size_t state_bytes, worker_bytes, gather, block_states;
} i8a_plan;

/* The plan of a decode of t queries of h heads (1 <= t <= len, h a multiple of hkv) with
 * options opt, on at most max_threads threads (fewer when the rows it reads are too few to pay
 * for waking another thread). i8a_decode runs exactly this plan (a batch, one thread count for
 * all its caches from the work of all). Reads the cache's length and format only. */
i8a_plan i8a_plan_decode(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                         size_t max_threads);

/* out[t][h][d] = attention of q[t][h][d] over the cache (1 <= t <= len), query head r reading kv
 * head r / (h / hkv): the whole decode in one call, planned once. The work splits into (kv
 * head, chunk) items over up to max_threads threads (i8a_plan_decode); each K/V row is read
 * once for all t queries of a kv head, and chunks no query sees are not read. Results merge in
 * position order, so the output does not depend on the thread count. The workspace is the
 * cache's own (c->work, grown here), so one cache decodes in one thread at a time. Requires
 * h a multiple of hkv, opt->scale positive and finite, opt->sinks <= opt->window when a window
 * is set. Returns 0, or with out untouched: 1 or 2 with *bad the q row ([t * h + head]), 1 when
 * it holds a NaN, an Inf or a value beyond +-I8A_VALUE_MAX, 2 when scale times its largest |q|
 * exceeds I8A_QSCALE_MAX; 3 when the workspace cannot be allocated. */
int i8a_decode(const i8a_kernels *kt, i8a_cache *c, const float *q, size_t t, size_t h,
               const i8a_options *opt, size_t max_threads, float *out, size_t *bad);

/* i8a_decode over n distinct caches in one pool job: the (kv head, chunk) items of all of them
 * share the threads (at most max_threads, by the work of the whole batch). Cache b decodes
 * q + b * t * h * d into out + b * t * h * d. Requires n >= 1, the caches distinct (each decodes
 * in its own workspace) with equal n_kv_heads and head_dim, t <= every cache's length, and
 * i8a_decode's conditions on h and opt. Returns i8a_decode's codes, with *bad = b * t * h + the
 * row in cache b's queries; on any error no out is written. */
int i8a_decode_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *q,
                     size_t t, size_t h, const i8a_options *opt, size_t max_threads, float *out,
                     size_t *bad);

/* Append t rows to each of n caches and decode the t queries of those positions in one call:
 * cache b appends k + b * t * hkv * d and v likewise ([t][hkv][d] each, as i8a_append takes
 * them) and decodes q + b * t * h * d into out + b * t * h * d as i8a_decode_batch does, except
 * that every query reads what a single decode right after its own token's append reads, however
 * large t is: its recent window from the floats of those positions (which the ring, holding
 * the last min(2R, cap) positions, keeps for t <= R + 1 only; the call copies them before the
 * append). Requires i8a_decode_batch's conditions and len + t <= cap for every cache. Returns
 * 0, or with every cache and out unchanged: 1 / 2 as i8a_append (a row of k / v out of range)
 * with *bad = b * t * hkv + token * hkv + head; 4 / 5 as i8a_decode's 1 / 2 for a q row, with
 * *bad = b * t * h + the row; 3 when memory cannot be allocated. */
int i8a_prefill_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *k,
                      const float *v, const float *q, size_t t, size_t h,
                      const i8a_options *opt, size_t max_threads, float *out, size_t *bad);

/* A paged pool: one layer's K and V rows of many sequences in blocks of block_rows positions,
 * a sequence's blocks named by its block table (any blocks, in position order), so that
 * sequences can share the blocks of a common prefix. The format is the contiguous cache's
 * FORMATS["rotated"] (K and V rotated alike by sign, or neither; int8 codes and a float32 scale
 * per row; no float rows, no window, no offsets), and a sequence's rows in the pool decode to
 * the bits the same rows give in such a cache. A block holds, per kv head g from g * block_rows
 * * (2 d + 8) bytes on (i8a_paged_block_bytes): K's codes [block_rows][d], V's codes in tiles
 * [block_rows / 4][d][4] (dispatch.h), K's scales [block_rows] and V's [block_rows]. A
 * position's rows are written once, by slot (i8a_paged_write); a full block then never changes.
 * The pool's memory belongs to its owner (the front end, or the serving engine's tensor). */
/* One entry of a pool's open blocks (i8a_paged_open): the halves of a block not yet full. */
typedef struct {
    int32_t block;              /* the block whose rows it holds; -1: free */
    uint32_t first, top;        /* it holds the rows of offsets first .. top - 1 */
    uint64_t stamp;             /* the pool's clock at its last write or attend */
} i8a_open_entry;

typedef struct i8a_paged {
    uint8_t *base;              /* [blocks][block_bytes], 64-byte aligned */
    size_t blocks, n_kv_heads, head_dim;
    size_t block_rows;          /* positions a block: a power of two, 16 .. 256 */
    unsigned block_shift;       /* log2(block_rows) */
    size_t block_bytes;         /* i8a_paged_block_bytes */
    const float *sign;          /* [head_dim] the rotation's signs, or NULL: unrotated */
    void *work;                 /* the attends' workspace (64-byte aligned), grown by them */
    size_t work_bytes;
    /* The open blocks (i8a_paged_open; open_cap 0: none): */
    size_t open_cap;            /* entries */
    uint16_t *open_k, *open_v;  /* [open_cap][n_kv_heads][block_rows][head_dim] halves */
    float *open_ks, *open_vs;   /* [open_cap][n_kv_heads][block_rows] their rows' scales */
    int32_t *open_of;           /* [blocks] the entry holding a block's rows, -1: none */
    i8a_open_entry *open;       /* [open_cap] */
    uint64_t clock;             /* counts the writes and attends */
    float *first_k, *first_v;   /* [blocks][n_kv_heads][head_dim] position 0 of a sequence
                                 * whose first block this is, its halves widened */
    uint8_t *first_held;        /* [blocks] 1: the block's first rows above hold */
} i8a_paged;

/* Bytes a block of a pool: n_kv_heads * block_rows * (2 head_dim + 8); 0 when it does not fit
 * a size_t. */
size_t i8a_paged_block_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows);

/* p: a pool over base (blocks * i8a_paged_block_bytes bytes, 64-byte aligned, owned by the
 * caller; what it holds is taken as written rows), its workspace empty. Requires head_dim a
 * multiple of 16 up to I8A_MAX_HEAD_DIM, block_rows a power of two in 16 .. 256. */
void i8a_paged_init(i8a_paged *p, uint8_t *base, size_t blocks, size_t n_kv_heads,
                    size_t head_dim, size_t block_rows, const float *sign);

/* Free the workspace (the blocks belong to the pool's owner). */
void i8a_paged_free_work(i8a_paged *p);

/* Bytes of one open-block entry's halves and scales, K's and V's: n_kv_heads * block_rows *
 * (4 head_dim + 8); 0 when it does not fit a size_t. */
size_t i8a_paged_open_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows);

/* Give the pool cap >= 1 entries of open blocks, over the caller's memory: k, v [cap][hkv]
 * [block_rows][d] halves, ks, vs [cap][hkv][block_rows] floats (64-byte aligned), of [blocks]
 * int32 and entries [cap] (any contents: all are set here to "none open"); first_k, first_v
 * [blocks][hkv][d] floats and first_held [blocks] (zeros: none held). From then on every
 * row written is also kept as the recent window keeps a row (i8a_half_row of the row as given:
 * halves and a power-of-two scale) in the entry of its block, opened by the block's first write
 * (a write at offset 0 starts the block again: a new owner), and a query reads the rows of its
 * own block from those halves, the earlier blocks from their codes (i8a_paged_attend). A
 * serving engine never shares a block before it is full, so the rows a query reads as halves
 * are its own sequence's. An entry is freed once the attend that reads its block's last
 * position returns; when every entry is taken, a write that opens a block takes the entry used
 * least recently (a block that loses its entry is read from its codes, from the next write into
 * it on: what a query reads depends only on the writes before it). A sequence's position 0 is
 * kept apart as floats (its halves widened, into first_k / first_v of its first block) when
 * the attend that fills the first block frees its entry holding offset 0; queries in later
 * blocks read position 0 from there, as a contiguous cache with keep_first reads k_first, until
 * a write at the block's offset 0 (a new owner) drops it. */
void i8a_paged_open(i8a_paged *p, size_t cap, uint16_t *k, uint16_t *v, float *ks, float *vs,
                    int32_t *of, i8a_open_entry *entries, float *first_k, float *first_v,
                    uint8_t *first_held);

/* The element types a paged pool's writes and attends take rows in (a serving engine's model
 * dtype): float32, bfloat16 and IEEE binary16, the last two as their 16-bit patterns. A row is
 * widened to float32 exactly as it is read (Inf and NaN too: the checks refuse them); results
 * are narrowed by i8a_narrow. */
enum { I8A_F32 = 0, I8A_BF16 = 1, I8A_F16 = 2 };

/* y[i] = x[i] as the element type `type` (I8A_BF16 or I8A_F16, 16-bit patterns), nearest, ties
 * to even, as torch converts (beyond the type's range: infinity; NaN stays NaN), i < n. */
void i8a_narrow(const float *x, size_t n, int type, uint16_t *y);

/* Write n rows by slot: row i of k and of v ([n][hkv][d] each, elements of `type`: I8A_F32,
 * I8A_BF16 or I8A_F16) becomes the position slots[i] % block_rows of block slots[i] /
 * block_rows, coded as i8a_append codes a row of the rotated format (with open blocks, also as
 * halves in its block's entry); a negative slot is skipped, a slot given twice holds its last
 * row. Every other slot must be below blocks * block_rows. The rows split over at most
 * max_threads threads (>= 1) when there are enough of them, no slot is given twice and no
 * open entry changes block within the call; the bits are those of one row at a time. Returns
 * 0, or with the pool unchanged 1 / 2 when a row of k / v that is not skipped holds a NaN, an
 * Inf or a value beyond +-I8A_VALUE_MAX, *bad = i * hkv + head of the first (row order, k
 * before v). */
int i8a_paged_write(const i8a_kernels *kt, i8a_paged *p, const int64_t *slots, size_t n,
                    const void *k, const void *v, int type, size_t max_threads, size_t *bad);

/* One sequence of a paged attend. */
typedef struct {
    const int32_t *blocks;      /* its blocks in position order: ceil(length / block_rows) of
                                   them, each below the pool's block count */
    size_t length;              /* positions it holds, 1 .. */
    size_t t;                   /* its queries: positions length - t .. length - 1, 1 <= t <=
                                   length */
} i8a_paged_seq;

/* Attend n sequences of the pool in one pool job, each as i8a_decode attends t queries over a
 * contiguous cache holding the same rows (the same bits): sequence b's queries are t_b rows of
 * q [.][h][d] (elements of q_type: I8A_F32, I8A_BF16 or I8A_F16; sequence 0's first, then
 * 1's, ...) and its outputs the same rows of out (float32). Its
 * (kv head, chunk) items share the threads with every other sequence's (at most max_threads,
 * by the work of the whole batch). With open blocks (i8a_paged_open) the queries in each block
 * form a view of their own, as a contiguous cache with a recent window of block_rows whose
 * floats are held from the block's first held offset: a query reads the halves of its block's
 * positions from there up to itself, and the codes before (a block whose entry does not hold
 * every query's rows is read from its codes alone); the entries of blocks whose last position
 * was a query are freed when the call returns 0. Requires n >= 1, h a multiple of hkv,
 * i8a_decode's conditions on opt. Returns 0, or with out untouched and no entry changed:
 * i8a_decode's 1 / 2 with *bad the q row (into q, all sequences' rows counted); 3 when memory
 * cannot be allocated. */
int i8a_paged_attend(const i8a_kernels *kt, i8a_paged *p, const i8a_paged_seq *seqs, size_t n,
                     const void *q, int q_type, size_t h, const i8a_options *opt,
                     size_t max_threads, float *out, size_t *bad);

/* The rows a query at the sequence's last position reads, as floats: k and v [length][hkv][d]
 * float32, code * scale rotated back, and with open blocks its own block's held rows as their
 * halves (i8a_dequantize's operations). blocks as in i8a_paged_seq. */
void i8a_paged_dequantize(const i8a_kernels *kt, const i8a_paged *p, const int32_t *blocks,
                          size_t length, float *k, float *v);

/* Forget the n oldest positions (n <= len; with K at 4 bits a multiple of I8A_K4_GROUP, so
 * the groups stay whole, or len: everything): position n + i becomes position i, and len shrinks
 * by n (a sliding-window layer's history past its window). With a kept first position, the new
 * position 0's float row is what decode read for it before (its window floats, or its
 * dequantized codes). n = len is a truncate to 0: the cache is then as a fresh one. The offsets
 * are forgotten as after a truncate to the same length (the header), else they stay; K's
 * 4-bit buffers above the new length hold zeros, as a fresh cache's do. */
void i8a_evict(const i8a_kernels *kt, i8a_cache *c, size_t n);

/* The signs [d] (+-1) of the rotation with this seed: bit 63 of successive splitmix64 outputs
 * (part of the file format: a saved cache stores the seed, not the signs). */
void i8a_rotation_signs(uint64_t seed, size_t d, float *sign);

/* The history decode attends over, as floats: k and v [len][hkv][d] float32 each, row = code *
 * scale (float32), plus the offset when the cache holds them, rotated back (the tier's inverse
 * rotation, in place: the same bits on every tier); with a kept first position, position 0 is
 * its float row; the positions decode reads from the recent window are their floats. */
void i8a_dequantize(const i8a_kernels *kt, const i8a_cache *c, float *k, float *v);

/* The first position decode reads from the recent window (len when it reads none): the last R
 * positions, those whose floats are held, and not position 0 when it is kept apart. */
size_t i8a_window_start(const i8a_cache *c);


/* The engine's profile: while on, time spent in each part below is summed (nanoseconds of
 * CLOCK_MONOTONIC) with a count per part, over every thread; off, each part costs one relaxed
 * atomic load. For the benchmarks (benchmarks/vllm_engine.py --profile): the parts nest as
 * WRITE and ATTEND (the paged pool's calls, on the calling thread), SETUP (within ATTEND: the
 * views, plans and q checks before the pool runs), POOL (the pool job's wall time; its count is
 * the threads it was split for, summed), and on the pool's threads PREPARE (a kv head's q rows),
 * CODED (its chunk items), WINDOW (its float rows) and FINISH (its merges and output). */
enum {
    I8A_PROF_WRITE, I8A_PROF_ATTEND, I8A_PROF_SETUP, I8A_PROF_POOL, I8A_PROF_PREPARE,
    I8A_PROF_CODED, I8A_PROF_WINDOW, I8A_PROF_FINISH, I8A_PROF_PARTS
};

/* Switch the profile on (counters zeroed) or off (counters kept). */
void i8a_profile(int on);

/* The counters: ns[part] and count[part], each I8A_PROF_PARTS long. */
void i8a_profile_read(uint64_t *ns, uint64_t *count);

/* Read the K and V codes and scales of every kv head and position (what a decode of the whole
 * cache reads, but for the recent window's floats in place of its codes), split over `threads`
 * threads like a decode: the bandwidth probe of the benchmarks. Returns a checksum so the reads
 * cannot be optimized away. */
uint64_t i8a_stream_read(const i8a_probe *probe, const i8a_cache *c, size_t threads);

#endif
