/* The benchmarks' bandwidth probe: every byte a decode reads, by the same items and ranges. */
#include "internal.h"

#include "../_pool.h"

typedef struct {
    const i8a_probe *probe;
    const i8a_cache *c;
    size_t chunks;
    _Atomic uint64_t sum;
} stream_job;

static void stream_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    (void)worker;
    stream_job *job = (stream_job *)ctx;
    const i8a_cache *c = job->c;
    const i8a_stream_fn stream = job->probe->stream;
    uint64_t x = 0;
    for (size_t item = begin; item < end; item++) {
        /* the same items, ranges and prefetch of the next item as a decode */
        const i8a_span s = i8a_chunk_span_to(c, item / job->chunks, item % job->chunks, c->length);
        const size_t then = item + 1 < end ? item + 1 : after;
        i8a_span next = {0};                                /* no next: NULL, no prefetch */
        if (then < c->n_kv_heads * job->chunks)
            next = i8a_chunk_span_to(c, then / job->chunks, then % job->chunks, c->length);
        const size_t d = c->head_dim, tiles = i8a_v_tiles(s.v_lead, s.n);
        if (s.k)
            x ^= stream(s.k, s.n * d, next.k);
        else                        /* K at 4 bits: codes, fifth bits, the groups' halves */
            x ^= stream(s.k4, s.n * d / 2, next.k4)
                 ^ stream(s.k4_wide, s.n * I8A_K4_WIDE_BYTES(d), NULL)
                 ^ stream(s.k4_min, i8a_k4_groups(s.n) * d * 2, NULL)
                 ^ stream(s.k4_step, i8a_k4_groups(s.n) * d * 2, NULL);
        if (s.v)
            x ^= stream(s.v, tiles * I8A_V_TILE * d, next.v);
        else
            x ^= stream(s.v4, tiles * 2 * d, next.v4) ^ stream(s.v4_min, s.n * sizeof(float), NULL);
        if (s.ks)
            x ^= stream(s.ks, s.n * sizeof(float), NULL);
        x ^= stream(s.vs, s.n * sizeof(float), NULL);
    }
    atomic_fetch_xor_explicit(&job->sum, x, memory_order_relaxed);
}

uint64_t i8a_stream_read(const i8a_probe *probe, const i8a_cache *c, size_t threads)
{
    stream_job job = {probe, c, n_chunks(c), 0};
    i8a_pool_run(c->n_kv_heads * job.chunks, threads, stream_range, &job);
    return atomic_load(&job.sum);
}
