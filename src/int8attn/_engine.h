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

/* Bytes of scratch that i8a_decode needs for h query heads (64-byte aligned by the caller). */
size_t i8a_decode_scratch_size(size_t h, size_t hkv, size_t d);

/* out[h][d] = attention of q[h][d] over the len >= 1 cached tokens; query head r reads kv head
 * r / (h / hkv). q_bits is 8 or 16. Returns 0, or 1 when q row *bad holds a NaN or an Inf. */
int i8a_decode(const i8a_kernels *kt, const i8a_cache *c, const float *q, size_t h, float scale,
               int q_bits, float *out, void *scratch, size_t *bad);

#endif
