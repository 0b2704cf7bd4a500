#include "_engine.h"

#include <stdatomic.h>
#include <string.h>

#include "_pool.h"

int i8a_append(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
               size_t t, size_t *bad)
{
    const size_t d = c->d;
    for (size_t r = 0; r < t * c->hkv; r++) {
        const size_t tok = r / c->hkv, head = r % c->hkv;
        const size_t row = head * c->cap + c->len + tok;
        if (kt->quantize_row(k + r * d, d, c->k + row * d, c->ks + row) != 0) {
            *bad = r;
            return 1;
        }
        if (kt->quantize_row(v + r * d, d, c->v + row * d, c->vs + row) != 0) {
            *bad = r;
            return 2;
        }
    }
    return 0;
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static size_t n_chunks(const i8a_cache *c)
{
    return (c->len + I8A_CHUNK - 1) / I8A_CHUNK;
}

/* Work per thread below which another thread costs more than it saves, in kv rows of 128
 * dims times (1 + query heads per kv head) / 2 (each head of a GQA group adds a dot and an
 * accumulation). Measured on the 2-core development VM (avx512_vnni): H = Hkv = 8, D = 128
 * gains from a second thread at 256 tokens (19 -> 15 us) and loses at 128 (10.5 -> 11.4 us). */
#define I8A_ROWS_PER_THREAD 1024

size_t i8a_decode_threads(const i8a_cache *c, size_t h, size_t max_threads)
{
    const size_t nq = h / c->hkv;
    const size_t work = c->hkv * c->len * (c->d / 16) * (1 + nq) / 16;
    size_t t = work / I8A_ROWS_PER_THREAD;
    t = t < 1 ? 1 : t;
    t = t < max_threads ? t : max_threads;
    const size_t items = c->hkv * n_chunks(c);
    return t < items ? t : items;
}

/* Scratch layout, every part 64-byte aligned:
 *   q_hi, q_lo [h][d] int8;  c_hi, c_lo [h] float;  residual [d] float;
 *   per kv head: chunks left [hkv] (atomic);
 *   per (kv head, chunk): the chunk's state: o [nq][d], m [nq], l [nq];
 *   per thread: the attend scratch, 2 * nq * I8A_CHUNK floats. */
typedef struct {
    size_t q_lo, c_hi, c_lo, residual, left, states, workers, end;
    size_t state_bytes, worker_bytes;
} layout;

static layout plan(const i8a_cache *c, size_t h, size_t threads)
{
    const size_t nq = h / c->hkv, d = c->d, f = sizeof(float);
    layout L;
    L.state_bytes = align64(nq * (d + 2) * f);
    L.worker_bytes = align64(2 * nq * I8A_CHUNK * f);
    L.q_lo = align64(h * d);
    L.c_hi = L.q_lo + align64(h * d);
    L.c_lo = L.c_hi + align64(h * f);
    L.residual = L.c_lo + align64(h * f);
    L.left = L.residual + align64(d * f);
    L.states = L.left + align64(c->hkv * sizeof(atomic_size_t));
    L.workers = L.states + c->hkv * n_chunks(c) * L.state_bytes;
    L.end = L.workers + (threads ? threads : 1) * L.worker_bytes;
    return L;
}

size_t i8a_decode_scratch_size(const i8a_cache *c, size_t h, size_t threads)
{
    return plan(c, h, threads).end;
}

/* The two q planes of one query row: q_hi, s_hi quantize q; q_lo, s_lo quantize the residual
 * q - float(q_hi) * s_hi (multiply, then subtract). The plane scales times the softmax scale
 * are what the logits use. */
static int prepare_q(const i8a_kernels *kt, const float *q, size_t d, int two_planes,
                     float scale, int8_t *q_hi, int8_t *q_lo, float *c_hi, float *c_lo,
                     float *residual)
{
    float s_hi, s_lo = 0.0f;
    if (kt->quantize_row(q, d, q_hi, &s_hi) != 0)
        return -1;
    if (two_planes) {
        for (size_t i = 0; i < d; i++)
            residual[i] = q[i] - (float)q_hi[i] * s_hi;
        kt->quantize_row(residual, d, q_lo, &s_lo);
    } else {
        memset(q_lo, 0, d);
    }
    *c_hi = s_hi * scale;
    *c_lo = s_lo * scale;
    return 0;
}

typedef struct {
    const i8a_kernels *kt;
    const i8a_cache *c;
    char *base;
    layout L;
    size_t nq, chunks;
    int two;
    float *out;
} decode_job;

static i8a_state state_at(const decode_job *job, size_t g, size_t chunk)
{
    float *p = (float *)(job->base + job->L.states + (g * job->chunks + chunk) * job->L.state_bytes);
    const size_t nq = job->nq;
    i8a_state s = {p + nq * job->c->d, p + nq * job->c->d + nq, p};
    return s;
}

/* All chunks of kv head g are done: fold them in chunk order, normalize into out. */
static void finish_head(const decode_job *job, size_t g)
{
    const size_t nq = job->nq, d = job->c->d;
    const i8a_state run = state_at(job, g, 0);
    for (size_t k = 1; k < job->chunks; k++) {
        const i8a_state chunk = state_at(job, g, k);
        job->kt->merge(&run, &chunk, nq, d);
    }
    for (size_t j = 0; j < nq; j++) {
        const float inv = 1.0f / run.l[j];
        const float *o = run.o + j * d;
        float *dst = job->out + (g * nq + j) * d;
        for (size_t i = 0; i < d; i++)
            dst[i] = o[i] * inv;
    }
}

/* Chunk `item` (kv head item / chunks, chunk item % chunks) as a span, without a prefetch hint. */
static i8a_span span_at(const i8a_cache *c, size_t chunks, size_t item)
{
    const size_t g = item / chunks, s0 = (item % chunks) * I8A_CHUNK;
    const size_t row = g * c->cap + s0, d = c->d;
    i8a_span span = {c->k + row * d, c->v + row * d, c->ks + row, c->vs + row,
                     c->len - s0 < I8A_CHUNK ? c->len - s0 : I8A_CHUNK, NULL, NULL, 0};
    return span;
}

static void decode_range(void *ctx, size_t begin, size_t end, size_t worker)
{
    const decode_job *job = (const decode_job *)ctx;
    const size_t d = job->c->d, nq = job->nq;
    float *scratch = (float *)(job->base + job->L.workers + worker * job->L.worker_bytes);
    for (size_t item = begin; item < end; item++) {
        const size_t g = item / job->chunks, r0 = g * nq;
        const i8a_query query = {
            d, nq, job->two,
            (const int8_t *)job->base + r0 * d,
            (const int8_t *)job->base + job->L.q_lo + r0 * d,
            (const float *)(job->base + job->L.c_hi) + r0,
            (const float *)(job->base + job->L.c_lo) + r0,
        };
        i8a_span span = span_at(job->c, job->chunks, item);
        if (item + 1 < end) {
            const i8a_span next = span_at(job->c, job->chunks, item + 1);
            span.next_k = next.k, span.next_v = next.v, span.next_n = next.n;
        }
        const i8a_state state = state_at(job, g, item % job->chunks);
        job->kt->attend(&query, &span, scratch, &state);
        atomic_size_t *left = (atomic_size_t *)(job->base + job->L.left) + g;
        if (atomic_fetch_sub_explicit(left, 1, memory_order_acq_rel) == 1)
            finish_head(job, g);
    }
}

int i8a_decode(const i8a_kernels *kt, const i8a_cache *c, const float *q, size_t h, float scale,
               int q_bits, float *out, void *scratch, size_t threads, size_t *bad)
{
    const size_t d = c->d;
    decode_job job = {kt, c, (char *)scratch, plan(c, h, threads), h / c->hkv, n_chunks(c),
                      q_bits == 16, out};
    int8_t *q_hi = (int8_t *)job.base, *q_lo = (int8_t *)(job.base + job.L.q_lo);
    float *c_hi = (float *)(job.base + job.L.c_hi), *c_lo = (float *)(job.base + job.L.c_lo);
    float *residual = (float *)(job.base + job.L.residual);
    for (size_t r = 0; r < h; r++) {
        if (prepare_q(kt, q + r * d, d, job.two, scale, q_hi + r * d, q_lo + r * d, c_hi + r,
                      c_lo + r, residual) != 0) {
            *bad = r;
            return 1;
        }
    }
    atomic_size_t *left = (atomic_size_t *)(job.base + job.L.left);
    for (size_t g = 0; g < c->hkv; g++)
        atomic_init(left + g, job.chunks);
    i8a_pool_run(c->hkv * job.chunks, threads, decode_range, &job);
    return 0;
}

typedef struct {
    const i8a_kernels *kt;
    const i8a_cache *c;
    size_t chunks;
    _Atomic uint64_t sum;
} stream_job;

static void stream_range(void *ctx, size_t begin, size_t end, size_t worker)
{
    (void)worker;
    stream_job *job = (stream_job *)ctx;
    const i8a_cache *c = job->c;
    const i8a_stream_fn stream = job->kt->stream;
    uint64_t x = 0;
    for (size_t item = begin; item < end; item++) {
        /* the same items, ranges and prefetch of the next item as a decode */
        const i8a_span s = span_at(job->c, job->chunks, item);
        const i8a_span next = item + 1 < end ? span_at(job->c, job->chunks, item + 1) : s;
        const int more = item + 1 < end;
        x ^= stream(s.k, s.n * c->d, more ? next.k : NULL);
        x ^= stream(s.v, s.n * c->d, more ? next.v : NULL);
        x ^= stream(s.ks, s.n * sizeof(float), NULL);
        x ^= stream(s.vs, s.n * sizeof(float), NULL);
    }
    atomic_fetch_xor_explicit(&job->sum, x, memory_order_relaxed);
}

uint64_t i8a_stream_read(const i8a_kernels *kt, const i8a_cache *c, size_t threads)
{
    stream_job job = {kt, c, n_chunks(c), 0};
    i8a_pool_run(c->hkv * job.chunks, threads, stream_range, &job);
    return atomic_load(&job.sum);
}
