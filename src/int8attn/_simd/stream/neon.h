/* stream/neon.h: stream: the benchmarks' bandwidth probe (an XOR fold) and its tail; the neon
 * tier's, bit for bit stream/scalar.h's rule. Included only by ../neon.h (the aarch64 baseline:
 * no target pragma), before the neon_dotprod tier's region opens. */
#ifndef I8A_STREAM_NEON_H
#define I8A_STREAM_NEON_H

#ifndef I8A_NEON_H
#error "stream/neon.h is included by ../neon.h only"
#endif

static uint64_t i8a_stream_neon(const void *p, size_t bytes, const void *next)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64x2_t x0 = vdupq_n_u64(0), x1 = x0, x2 = x0, x3 = x0;
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
        if (next)
            i8a_prefetch_rows((const char *)next + i, 64);
        x0 = veorq_u64(x0, vreinterpretq_u64_u8(vld1q_u8(b + i)));
        x1 = veorq_u64(x1, vreinterpretq_u64_u8(vld1q_u8(b + i + 16)));
        x2 = veorq_u64(x2, vreinterpretq_u64_u8(vld1q_u8(b + i + 32)));
        x3 = veorq_u64(x3, vreinterpretq_u64_u8(vld1q_u8(b + i + 48)));
    }
    uint64x2_t x = veorq_u64(veorq_u64(x0, x1), veorq_u64(x2, x3));
    return vgetq_lane_u64(x, 0) ^ vgetq_lane_u64(x, 1) ^ i8a_fold_tail(b + i, bytes - i);
}

#endif
