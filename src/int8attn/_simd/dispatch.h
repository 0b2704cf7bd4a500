/* The kernel table: every tier fills one i8a_kernels with functions of these signatures.
 *
 * The kernels are filed by operation: _simd/<op>/scalar.h is the op's scalar rule (every tier
 * equals it bit for bit) and the scalar tier's entry, _simd/<op>/<tier>.h the op for one ISA tier,
 * included by _simd/<tier>.h inside the tier's target region. Every function of an
 * _simd/<op>/<tier>.h is named i8a_<name>_<tier>, tier in {neon, neon_dotprod, avx2,
 * avx512_vnni}, and each is included by its tier header alone (.ci/check_isa.py checks both;
 * the scalar tier's entries are i8a_<name>_scalar). The engine only calls through
 * a table; the front end validates every argument first, so kernels assume their preconditions
 * (written next to each signature) and never check them in a release build. A build with
 * -DI8A_CHECK_PRECONDITIONS (the C cross-check's) checks them at the engine's calls with
 * I8A_EXPECT and aborts with the failed condition.
 */
#ifndef I8A_DISPATCH_H
#define I8A_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

/* Tokens per softmax chunk. Each chunk keeps its own max and sum; chunks are merged in order.
 * Part of the math contract: it fixes the floating-point order of every tier. */
#define I8A_CHUNK 256
#define I8A_MAX_HEAD_DIM 1024

#ifdef I8A_CHECK_PRECONDITIONS
#include <stdio.h>
#include <stdlib.h>
#define I8A_EXPECT(cond)                                                                     \
    ((cond) ? (void)0                                                                        \
            : (fprintf(stderr, "%s:%d: precondition failed: %s\n", __FILE__, __LINE__, #cond), \
               abort()))
#else
#define I8A_EXPECT(cond) ((void)0)
#endif

/* Query side of one GQA group: nq query rows that read the same kv head (the heads of the
 * group, for one or more query positions). */
typedef struct {
    size_t d;            /* head dim: multiple of 16, 16..1024 */
    size_t nq;           /* query heads in the group, >= 1 */
    int two_planes;      /* 1: q_bits=16 (hi and lo planes), 0: q_bits=8 (hi only) */
    const int8_t *q_hi;  /* [nq][d] */
    const int8_t *q_lo;  /* [nq][d], read only when two_planes */
    const float *c_hi;   /* [nq] plane scale * softmax scale */
    const float *c_lo;   /* [nq] (0 when !two_planes: it may be read, it adds nothing) */
    float softcap;       /* > 0: logits become softcap * tanh(logit / softcap); 0: off */
    float inv_softcap;   /* 1 / softcap */
    const float *bias;   /* [nq] added to every logit of the row before the soft cap: the
                            cache's K offset seen by the row (0 without one) */
    const float *q_float;  /* [nq][d] q times the softmax scale, as given with K at 4 bits
                              (attend4 makes each K group's planes from it) */
} i8a_query;

/* The 4-bit sides (attend4). K at 4 bits is stored per channel: positions [32 j, 32 j + 32)
 * of a kv head form group j, whose channel i has a minimum and a step (IEEE halves times a
 * power-of-two scale per group and kind: min_i = h_min[i] * min_scale, step_i = h_step[i] *
 * step_scale), and a position's value is min_i + step_i * code. code is 0 .. 15, but in a wide
 * channel, whose h_step[i] is odd (append makes the widest half of a group's channels so),
 * 0 .. 31: its nibble plus 16 times its fifth bit, kept apart (I8A_K4_WIDE_BYTES a row: bit r %
 * 8 of byte r / 8 for the channel of rank r among the group's wide ones, r < d / 2; a wide
 * channel of rank d / 2 or more, which only a state made by hand can hold, has none). V at 4
 * bits is stored
 * per position: v_i = vmin + vstep * code (0 .. 15), in the stored (rotated) space. Codes are
 * nibbles in blocks of 32 elements, 16 bytes a block: byte i holds element i in its low nibble
 * and element i + 16 in its high one. A K row of d channels is d / 32 such blocks; a V tile
 * (I8A_V_TILE positions) is d / 32 blocks of 64 bytes, byte 4 i + r holding dimensions i and
 * i + 16 of the block for the tile's position r. d is a multiple of 32 with a 4-bit side. */
#define I8A_K4_GROUP 32
#define I8A_NIB_BLOCK 32
#define I8A_K4_WIDE_BYTES(d) ((d) / 16)

/* V is stored in tiles of I8A_V_TILE consecutive positions, so that one integer dot lane
 * (SDOT, VPDPBUSD) sums the products of the tile's positions for one dimension: byte 4 i + r
 * of a tile of d dims is dimension i of the tile's position r (tile t of a kv head holds
 * positions 4 t .. 4 t + 3), and a kv head's tiles follow each other, 4 d bytes apart. */
#define I8A_V_TILE 4

/* One chunk of one kv head's history: rows s0 .. s0+n-1; and where the thread's next chunk
 * lies, as a prefetch hint (next_n = 0: none). V is read by whole tiles, from the tile holding
 * row s0, in which row s0 is slot v_lead (the V pass reads the slots before v_lead and after the
 * last row too, with weight 0).
 *
 * At 8 bits the rows lie in blocks of 2^block_shift positions (a paged pool) or in one run (a
 * contiguous cache: one block, blocks = i8a_one_block, block_shift I8A_ONE_BLOCK_SHIFT, leads
 * 0); the kernels reach them through i8a_krow and i8a_vtile below, never by arithmetic of their
 * own. Span row r is row lead + r of the span's blocks, whose block b starts at k + blocks[b] *
 * block_bytes (K's row 0) and v + blocks[b] * block_bytes (V's tile 0); V's tile t of the span
 * holds rows vlead + 4 t .. of them (vlead = lead - v_lead: tiles never straddle blocks, a block
 * holds a multiple of I8A_V_TILE rows). The next span's rows lie the same way (next_k, next_v,
 * next_blocks, next_lead, next_vlead), in blocks of the same pool. A side at 4 bits is always
 * one run (a paged pool holds 8-bit rows): k4 and v4 point at row s0's codes and tile, and
 * next_k / next_v at the next span's (4-bit kernels prefetch them as one run). */
typedef struct {
    const int8_t *k;          /* K at 8 bits: row 0 of block 0, rows d bytes apart in a block */
    const int8_t *v;          /* V at 8 bits: tile 0 of block 0, tiles [.][d][4] in a block */
    const int32_t *blocks;    /* the span's blocks in position order (never NULL) */
    size_t block_bytes;       /* a block's place: blocks[b] * block_bytes from k (from v) */
    unsigned block_shift;     /* rows per block: 2^block_shift, at least 16 (I8A_ONE_BLOCK_SHIFT:
                                 one run) */
    size_t lead, vlead;       /* span row 0 is row lead of block 0; tile 0 starts at row vlead */
    const float *ks, *vs;     /* [n] */
    size_t n;                 /* 1 .. I8A_CHUNK */
    size_t v_lead;            /* s0 % I8A_V_TILE: row s0's slot in its tile */
    const int8_t *next_k;     /* the next span's K (at 8 bits as k above, at 4 bits its row s0) */
    const int8_t *next_v;     /* its V (at 8 bits as v above, at 4 bits its tile of nibbles) */
    const int32_t *next_blocks;   /* at 8 bits: its blocks, as blocks above */
    size_t next_lead, next_vlead;
    size_t next_n;
    /* K at 4 bits (else NULL; k and ks are then unused): */
    const uint8_t *k4;        /* [n][d / 2] rows from row s0 */
    const uint8_t *k4_wide;   /* [n][d / 16] their fifth bits (k4/scalar.h) */
    const uint16_t *k4_min, *k4_step;     /* [groups][d] from row s0's group on */
    const float *k4_min_scale, *k4_step_scale;   /* [groups] */
    size_t k4_lead;           /* s0 % I8A_K4_GROUP: row s0's place in its group */
    /* V at 4 bits (else NULL; vs then holds the steps): */
    const uint8_t *v4;        /* tiles [ceil((v_lead + n) / 4)][2 d] from row s0's */
    const float *v4_min;      /* [n] */
} i8a_span;

/* The blocks of a span that lies in one run: block 0 at offset 0. */
#define I8A_ONE_BLOCK_SHIFT 60
static const int32_t i8a_one_block[1] = {0};

/* Row r of a span's blocks from the first (lead + r, say): its block's place plus its row's. */
static inline size_t i8a_block_offset(const int32_t *blocks, size_t block_bytes, unsigned shift,
                                      size_t row, size_t row_bytes)
{
    const size_t mask = ((size_t)1 << shift) - 1;
    return (size_t)blocks[row >> shift] * block_bytes + (row & mask) * row_bytes;
}

/* K row r (0 <= r < n) of a span at 8 bits, [d] bytes. */
static inline const int8_t *i8a_krow(const i8a_span *kv, size_t r, size_t d)
{
    return kv->k + i8a_block_offset(kv->blocks, kv->block_bytes, kv->block_shift, kv->lead + r, d);
}

/* V tile t (0 <= t < ceil((v_lead + n) / 4)) of a span at 8 bits, [d][4] bytes. */
static inline const int8_t *i8a_vtile(const i8a_span *kv, size_t t, size_t d)
{
    return kv->v + i8a_block_offset(kv->blocks, kv->block_bytes, kv->block_shift,
                                    kv->vlead + I8A_V_TILE * t, d);
}

/* Of `want` rows of a span's blocks from `row` on (row counted from block 0's row 0), how many
 * lie in row's block: 1 .. want (want >= 1). The one rule of the runs below and of the engine's
 * scale gathering. */
static inline size_t i8a_rows_in_block(const i8a_span *kv, size_t row, size_t want)
{
    const size_t rows = (size_t)1 << kv->block_shift;
    const size_t left = rows - (row & (rows - 1));                  /* rows left in its block */
    return left < want ? left : want;
}

/* The run of V tiles from tile t on that lie in one block (all of them in one run): returns
 * how many (1 .. tiles - t), tile t's address in *x; tile t + u is then at *x + u * 4 d. The V
 * passes loop over runs, so a contiguous cache's loop is the one it always was. */
static inline size_t i8a_vrun(const i8a_span *kv, size_t t, size_t tiles, size_t d,
                              const int8_t **x)
{
    *x = i8a_vtile(kv, t, d);
    /* a block holds whole tiles, so its rows left from a tile's first are whole tiles too */
    return i8a_rows_in_block(kv, kv->vlead + I8A_V_TILE * t, I8A_V_TILE * (tiles - t))
           / I8A_V_TILE;
}

/* tile[t] = V tile t's address for t < the span's tiles (i8a_v_tiles), one block lookup per run;
 * tile[tiles] = NULL. Returns the tile count. tile holds I8A_CHUNK / I8A_V_TILE + 2 entries. */
static inline size_t i8a_vtile_addresses(const i8a_span *kv, size_t d, const int8_t **tile)
{
    const size_t tiles = (kv->v_lead + kv->n + I8A_V_TILE - 1) / I8A_V_TILE;
    for (size_t t0 = 0; t0 < tiles;) {
        const int8_t *run;
        const size_t m = i8a_vrun(kv, t0, tiles, d, &run);
        for (size_t u = 0; u < m; u++)
            tile[t0 + u] = run + u * d * I8A_V_TILE;
        t0 += m;
    }
    tile[tiles] = NULL;
    return tiles;
}

/* Row r (0 <= r < next_n) of the next span's K, and the tile holding it of its V, at 8 bits:
 * the prefetch hints. */
static inline const int8_t *i8a_next_krow(const i8a_span *kv, size_t r, size_t d)
{
    return kv->next_k + i8a_block_offset(kv->next_blocks, kv->block_bytes, kv->block_shift,
                                         kv->next_lead + r, d);
}

static inline const int8_t *i8a_next_vrow(const i8a_span *kv, size_t r, size_t d)
{
    return kv->next_v + i8a_block_offset(kv->next_blocks, kv->block_bytes, kv->block_shift,
                                         kv->next_vlead + r, d);
}

/* The rows of the next span's V [0, pf_n) that block b of the nblk blocks of dims of a V pass
 * prefetches (tile t when lo <= 4 t < hi): spread over the pass, not all from its first block.
 * A chunk's V hinted at once came in late (x86 tiers: 4 heads over 8 kv heads, D = 128, 8192
 * tokens from DRAM, Zen 4: 1150 us a decode against 1004 spread). */
static inline void i8a_vprefetch_share(size_t pf_n, size_t b, size_t nblk, size_t *lo, size_t *hi)
{
    *lo = pf_n * b / nblk;
    *hi = pf_n * (b + 1) / nblk;
}

/* The run of K rows from span row r on that lie in one block (all of them in one run): returns
 * how many (1 .. n - r), row r's address in *x; row r + u is then at *x + u * d. */
static inline size_t i8a_krun(const i8a_span *kv, size_t r, size_t d, const int8_t **x)
{
    *x = i8a_krow(kv, r, d);
    return i8a_rows_in_block(kv, kv->lead + r, kv->n - r);
}

/* rows[r] = K row r of a span at 8 bits, r < n: one block lookup per run, not per row (at 8/8 x
 * 128 a lookup per row cost the K pass a third of its time). rows holds I8A_CHUNK entries. */
static inline void i8a_krows(const i8a_span *kv, size_t d, const int8_t **rows)
{
    for (size_t r = 0; r < kv->n;) {
        const int8_t *x;
        const size_t m = i8a_krun(kv, r, d, &x);
        for (size_t u = 0; u < m; u++)
            rows[r + u] = x + u * d;
        r += m;
    }
}

/* Whether a span's rows lie in one run (a contiguous cache's): the K passes then take the loop
 * they always had, K row r at k + r * d (i8a_krow_of, with the answer a constant); else they
 * fill rows by i8a_krows once and read row r there. */
static inline int i8a_one_run(const i8a_span *kv)
{
    return kv->block_shift == I8A_ONE_BLOCK_SHIFT;
}

static inline const int8_t *i8a_krow_of(const i8a_span *kv, const int8_t *const *rows, size_t r,
                                        size_t d, int one_run)
{
    return one_run ? kv->k + r * d : rows[r];
}

static inline const int8_t *i8a_next_krow_of(const i8a_span *kv, size_t r, size_t d, int one_run)
{
    return one_run ? kv->next_k + r * d : i8a_next_krow(kv, r, d);
}

/* Softmax state of nq query heads over some tokens: max logit, sum of exp(logit - m), and
 * the unnormalized output sum_s exp(logit_s - m) * v_scale_s * v_s (over a chunk, with the
 * weights exp(logit_s - m) * v_scale_s in integer planes: planes/scalar.h). */
typedef struct {
    float *m;       /* [nq] */
    float *l;       /* [nq] */
    float *o;       /* [nq][d] */
} i8a_state;

/* Quantize one row of d floats (the contract's exact sequence). Returns 0, or -1 when the row
 * holds a NaN or an infinity (codes and scale are then unspecified). d >= 1, any alignment. */
typedef int (*i8a_quantize_row_fn)(const float *x, size_t d, int8_t *codes, float *scale);

/* Attend a query group to one chunk: writes out->m, out->l, out->o for the chunk alone.
 * scratch: at least 2 * nq * I8A_CHUNK floats, 64-byte aligned; an attend with a side at 4 bits
 * (every entry of i8a_kernels.attend but [I8A_FMT8][I8A_FMT8]) I8A_ATTEND4_EXTRA bytes more. */
typedef void (*i8a_attend_fn)(const i8a_query *q, const i8a_span *kv, float *scratch,
                              const i8a_state *out);
#define I8A_ATTEND4_EXTRA                                                                     \
    ((I8A_K4_TILE_HEADS * 3 + 4) * I8A_MAX_HEAD_DIM                                            \
     + I8A_K4_TILE_HEADS * (3 * I8A_K4_GROUP + 3 + 1) * 4 + 64)

/* Query heads whose q planes (three at most) against one K group at 4 bits a tiled K pass keeps
 * while it passes over the group's rows (the tiles made once for that many heads). */
#define I8A_K4_TILE_HEADS 8

/* Fold a chunk's state into a running state, one query row (the running one covers the
 * earlier tokens): m = max(m, cm); l = l*a + cl*b; o = o*a + co*b, a = exp(m_old - m),
 * b = exp(cm - m). d a multiple of 16, at most I8A_MAX_HEAD_DIM. */
typedef void (*i8a_merge_fn)(const i8a_state *run, const i8a_state *chunk, size_t d);

/* The recent window's rows as attend_float reads them: n rows [d] of finite IEEE halves (k[j],
 * v[j], in position order) and each row's scale, a power of two (k_scale[j], v_scale[j]): the
 * row is h * scale. seen (NULL: every query row sees all n): query row r sees rows [0,
 * seen[r]), 1 <= seen[r] <= n (a prefill's positions in one block, each one row further). */
typedef struct {
    const uint16_t *const *k, *const *v;
    const float *k_scale, *v_scale;
    size_t n;
    const size_t *seen;
} i8a_float_rows;

/* The states of nq query rows over the recent window's rows (the contract's recent-window step,
 * i8a_attend_float_body in window/scalar.h), each row as if alone: q [nq][d] the queries times
 * the softmax scale, each seeing its rows of w (w->seen); cap > 0 the soft cap (0: off).
 * Writes out->m [nq], out->l [nq], out->o [nq][d], and logit [I8A_WIN_HEADS * n] as scratch.
 * 1 <= nq, 1 <= w->n, d a multiple of 16, at most I8A_MAX_HEAD_DIM; out->o must not overlap
 * the rows. */
typedef void (*i8a_attend_float_fn)(const float *q, size_t nq, const i8a_float_rows *w, size_t d,
                                    float cap, float *logit, const i8a_state *out);

/* Row x [d] (finite, |x| <= 2^64, d a multiple of 16) as the recent window keeps it: halves h
 * [d] and the returned scale 2^e, e the exponent that puts the largest rounded |h| in [2^14,
 * 2^15) (i8a_half_exponent; 0 for a zero row), h the halves nearest x / 2^e (ties to even). The
 * row is then h * 2^e to 11 significant bits, and a row that already is h * 2^e gives back h and
 * 2^e. Every tier returns the same bits (IEEE rounding in hardware or in i8a_half_bits). */
typedef float (*i8a_half_row_fn)(const float *x, size_t d, uint16_t *h);

/* The cache's rotation (rotate/scalar.h) of the row x [d] into y [d]: d a multiple of 16, sign [d] of
 * +-1; y may be x (in place), otherwise the two must not overlap. */
typedef void (*i8a_rotate_fn)(const float *x, size_t d, const float *sign, int inverse, float *y);

/* The storage formats of a side (K or V) of the cache: the indices of i8a_kernels.attend. At 8
 * bits a span's k / ks (K) and v / vs (V) are read; at 4 bits k4 and its groups (K), v4, v4_min
 * and vs as the steps (V). */
enum { I8A_FMT8 = 0, I8A_FMT4 = 1, I8A_FMTS = 2 };

/* A tier's kernels, by name (kernels.c fills them with designated initializers). */
typedef struct {
    const char *name;
    unsigned requires;               /* I8A_CPU_* bits the tier needs */
    i8a_quantize_row_fn quantize_row;
    /* attend[K's format][V's format]: a chunk whose sides are in those formats (the span's
     * fields of the other format unused); [I8A_FMT8][I8A_FMT8] is the 8/8 attend */
    i8a_attend_fn attend[I8A_FMTS][I8A_FMTS];
    i8a_merge_fn merge;
    i8a_rotate_fn rotate;
    i8a_attend_float_fn attend_float;
    i8a_half_row_fn half_row;
} i8a_kernels;

/* XOR-fold of every byte of p[0 .. bytes): reads memory as fast as the tier can stream it (the
 * bandwidth probe of the benchmarks). Any alignment, any length. While reading it prefetches
 * next[0 .. bytes) the way attend prefetches the next chunk (next may be NULL). */
typedef uint64_t (*i8a_stream_fn)(const void *p, size_t bytes, const void *next);
typedef struct {
    const char *name;                /* the tier whose loads it uses */
    unsigned requires;
    i8a_stream_fn stream;
} i8a_probe;

/* CPU feature bits, filled by i8a_cpu_features() in _cpu.c. */
#define I8A_CPU_AVX2 (1u << 0)          /* AVX2 + FMA, YMM state enabled by the OS */
#define I8A_CPU_NEON (1u << 1)          /* aarch64 Advanced SIMD */
#define I8A_CPU_DOTPROD (1u << 2)       /* aarch64 SDOT/UDOT (FEAT_DotProd) */
#define I8A_CPU_AVX512_VNNI (1u << 3)   /* AVX-512 F, BW, VL and VNNI, ZMM state enabled */
#define I8A_CPU_I8MM (1u << 4)          /* aarch64 SMMLA/UMMLA/USMMLA (FEAT_I8MM) */
#define I8A_CPU_AMX (1u << 5)           /* AMX-TILE and AMX-INT8, the tiles' state enabled and
                                         * (Linux) the process allowed to use them */

/* What became of AMX at import (i8a_cpu_features): 0 the CPU or the OS has none, 1 the CPU has
 * it but the process was refused its tile data, 2 usable. */
int i8a_amx_status(void);

unsigned i8a_cpu_features(void);

/* Tiers compiled into this build, best first, terminated by a NULL name. */
extern const i8a_kernels i8a_tiers[];

/* The benchmarks' bandwidth probe of each tier, in the order of i8a_tiers (not part of a decode,
 * so not in the tier table). */
extern const i8a_probe i8a_probes[];

#endif
