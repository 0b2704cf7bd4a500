/* The tier-independent driver: append and decode over one cache, through a kernel table.
 * The Cython front end validates shapes, counts and capacity before calling; these functions
 * check only what needs the data itself (NaN and Inf). */
#ifndef I8A_ENGINE_H
#define I8A_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "_simd/dispatch.h"

/* The cache buffers, head-major: k[h][cap][d] int8, ks[h][cap] float; the same for v. */
typedef struct {
    int8_t *k, *v;
    float *ks, *vs;
    size_t hkv, cap, d, len;
} i8a_cache;

/* Quantize t tokens, k and v each [t][hkv][d] float32, into rows len .. len+t-1 (len itself is
 * not changed: the caller commits it). Returns 0, or 1 / 2 when k / v holds a NaN or an Inf, with
 * *bad = token * hkv + head of the first such row. Requires len + t <= cap. */
int i8a_append(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
               size_t t, size_t *bad);

/* Threads worth using for a decode of h query heads over the cache: at most max_threads, fewer
 * when the context is too short to pay for waking another thread. */
size_t i8a_decode_threads(const i8a_cache *c, size_t h, size_t max_threads);

/* Bytes of scratch that i8a_decode needs (the caller aligns it to 64 bytes). */
size_t i8a_decode_scratch_size(const i8a_cache *c, size_t h, size_t threads);

/* out[h][d] = attention of q[h][d] over the len >= 1 cached tokens; query head r reads kv head
 * r / (h / hkv). q_bits is 8 or 16. The work is split into (kv head, chunk) items run on up to
 * `threads` threads; chunk results merge in chunk order, so the output does not depend on the
 * thread count. Returns 0, or 1 when q row *bad holds a NaN or an Inf (out is then untouched). */
int i8a_decode(const i8a_kernels *kt, const i8a_cache *c, const float *q, size_t h, float scale,
               int q_bits, float *out, void *scratch, size_t threads, size_t *bad);

/* Read every byte a decode of the whole cache reads (K and V codes and scales of every kv head
 * and token), split over `threads` threads like a decode: the bandwidth probe of the benchmarks.
 * Returns a checksum so the reads cannot be optimized away. */
uint64_t i8a_stream_read(const i8a_kernels *kt, const i8a_cache *c, size_t threads);

#endif
