/* stream/scalar.h: stream: the benchmarks' bandwidth probe (an XOR fold) and its tail. The rule
 * every tier equals bit for bit (the scalar forms, in the contract's order) and the scalar tier's
 * entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h in dependency
 * order. */
#ifndef I8A_STREAM_SCALAR_H
#define I8A_STREAM_SCALAR_H

/* The tail of a stream fold: the bytes past the last whole 8-byte word. */
static inline uint64_t i8a_fold_tail(const unsigned char *p, size_t bytes)
{
    uint64_t x = 0;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        x ^= w;
    }
    for (; i < bytes; i++)
        x ^= (uint64_t)p[i] << (8 * (i % 8));
    return x;
}

static inline uint64_t i8a_stream_scalar(const void *p, size_t bytes, const void *next)
{
    (void)next;
    return i8a_fold_tail((const unsigned char *)p, bytes);
}

#endif
