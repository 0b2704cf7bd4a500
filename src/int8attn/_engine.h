/* The tier-independent driver: append and decode over one cache, through a kernel table.
 * The Cython front end validates shapes, counts and capacity before calling; these functions
 * check only what needs the data itself (NaN and Inf). */
#ifndef I8A_ENGINE_H
#define I8A_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "_simd/dispatch.h"

/* The cache buffers, head-major: k_codes[head][position][i] int8 and k_scale[head][position]
 * float; the same for V. In the comments below hkv, cap, d and len abbreviate n_kv_heads,
 * max_seq, head_dim and length. With a rotation (sign != NULL) K and V rows are stored
 * rotated, q is rotated before the dots and the output rotated back: (Rq).(Rk) = q.k and
 * R^T sum p (R v) = sum p v.
 *
 * Keeping the first position (k_first != NULL): position 0, the attention sink, is also kept as
 * given in k_first / v_first, and decode reads it from there instead of from its codes.
 *
 * Centering (k_offset != NULL, only with k_first): every row past position 0 is stored minus
 * its kv head's offset (k_offset / v_offset, in the stored space), which decode adds back:
 * q.off joins each logit (the query's bias) and the V offset joins the output (the weights sum
 * to 1). The offsets exist once the cache holds 2 or more tokens: the append that first
 * reaches past position 0 sets them to the mean of its own rows past position 0, or to zeros
 * when it holds fewer than I8A_OFFSET_MIN_ROWS of them (a cache filled token by token: one row
 * is no mean). */
#define I8A_OFFSET_MIN_ROWS 16

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
    int8_t *k_codes, *v_codes;  /* [n_kv_heads][max_seq][head_dim] */
    float *k_scale, *v_scale;   /* [n_kv_heads][max_seq] */
    size_t n_kv_heads, max_seq, head_dim;
    size_t length;              /* tokens stored: rows 0 .. length-1 of every head */
    const float *sign;          /* [head_dim] +-1 of the random-sign Hadamard rotation, or NULL */
    float *k_first, *v_first;   /* [n_kv_heads][head_dim] position 0 as appended, or NULL */
    float *k_offset, *v_offset; /* [n_kv_heads][head_dim] the offsets, or NULL: no centering */
    void *work;                 /* decode's workspace (64-byte aligned), grown by i8a_decode */
    size_t work_bytes;          /* its size; 0 with work == NULL before the first decode */
} i8a_cache;

/* Free the decode workspace (the cache's other buffers belong to its owner). */
void i8a_cache_free_work(i8a_cache *c);

/* `bytes` (exactly: a sanitizer sees past them) at a 64-byte boundary, or NULL; freed by
 * i8a_free_aligned. The cache's buffers come from here, so every row of 64 or more bytes
 * starts on a cache line. */
void *i8a_alloc_aligned(size_t bytes);
void i8a_free_aligned(void *p);

/* Quantize t tokens, k and v each [t][hkv][d] float32, into rows len .. len+t-1 (len itself is
 * not changed: the caller commits it; position 0's float row and the offsets written here
 * count only once it does). Returns 0, or 1 / 2 when k / v holds a NaN, an Inf or a value
 * beyond +-I8A_VALUE_MAX, with *bad = token * hkv + head of the first such row. Requires
 * len + t <= cap. */
int i8a_append(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
               size_t t, size_t *bad);

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

/* Threads a decode of t queries of h heads uses: at most max_threads, fewer when the tokens
 * it reads are too few to pay for waking another thread. */
size_t i8a_decode_threads(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                          size_t max_threads);

/* out[t][h][d] = attention of q[t][h][d] over the cache (1 <= t <= len), query head r reading kv
 * head r / (h / hkv): the whole decode in one call, planned once. The work splits into (kv
 * head, chunk) items over up to max_threads threads (i8a_decode_threads); each K/V row is read
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

/* Forget the n oldest positions (n <= len): position n + i becomes position i, and len shrinks
 * by n (a sliding-window layer's history past its window). With a kept first position, the new
 * position 0's float row is its dequantized codes (what decode read for it before). The
 * offsets, when the cache has them, stay. */
void i8a_evict(const i8a_kernels *kt, i8a_cache *c, size_t n);

/* The signs [d] (+-1) of the rotation with this seed: bit 63 of successive splitmix64 outputs
 * (part of the file format: a saved cache stores the seed, not the signs). */
void i8a_rotation_signs(uint64_t seed, size_t d, float *sign);

/* The history decode attends over, as floats: k and v [len][hkv][d] float32 each, row = code *
 * scale (float32), plus the offset when the cache holds them, rotated back (the tier's inverse
 * rotation, in place: the same bits on every tier); with a kept first position, position 0 is
 * its float row. */
void i8a_dequantize(const i8a_kernels *kt, const i8a_cache *c, float *k, float *v);

/* Read every byte a decode of the whole cache reads (K and V codes and scales of every kv head
 * and token), split over `threads` threads like a decode: the bandwidth probe of the benchmarks.
 * Returns a checksum so the reads cannot be optimized away. */
uint64_t i8a_stream_read(const i8a_probe *probe, const i8a_cache *c, size_t threads);

#endif
