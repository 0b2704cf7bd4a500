/* Every supported tier against the scalar tier, bit for bit, straight through the C driver.
 * A fast check for cross-compiled builds run under qemu-user (the Python tests cover the rest):
 *   cc -O2 -ffp-contract=off -Isrc/int8attn [-DI8A_TILE_MODEL] tests/c/tiers_agree.c \
 *      $(grep -v '^#' src/int8attn/csources.txt) -lm -pthread && ./a.out
 * (-DI8A_TILE_MODEL: on x86-64 also the amx tier against the C model of the tile instructions,
 * tests/c/tiers.h.)
 * Prints one line per tier, with a digest of its outputs over every case (FNV-1a of the bytes:
 * equal digests before and after a change that must not move a bit), and exits non-zero on any
 * difference. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_engine.h"
#include "_pool.h"
#include "tiers.h"          /* the tiers checked (with -DI8A_TILE_MODEL: the amx tier's model) */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* FNV-1a over n bytes, continuing from h. */
static uint64_t digest(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static float gauss(void)
{
    float s = 0.0f;
    for (int i = 0; i < 12; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)(rng >> 40) / (float)(1 << 24);
    }
    return s - 6.0f;
}

/* One decode of a cache of len tokens appended in two calls; k_bits, v_bits 8 or 4 (then d is
 * a multiple of 32; K at 4 bits unrotated with a window of 64, no side at 4 bits centered). */
static int run_case(const i8a_kernels *kt, size_t h, size_t hkv, size_t d, size_t len, int q_bits,
                    int k_bits, int v_bits, float *out)
{
    static float sign[I8A_MAX_HEAD_DIM];
    for (size_t i = 0; i < d; i++)
        sign[i] = (i * 2654435761u) & 64 ? -1.0f : 1.0f;
    const int eight = k_bits == 8 && v_bits == 8;
    /* position 0 kept as floats on two thirds of the cases, and the offsets on half of those;
     * the recent window on half of the cases: R = 64 or 16 (K at 4 bits: 64) */
    const size_t recent = k_bits == 4 ? 64 : len % 2 ? 0 : len % 4 ? 16 : 64;
    const i8a_format f = {hkv, len, d, k_bits, v_bits, len % 3 != 0, len % 3 == 2 && eight,
                          recent};
    i8a_buffer buf[I8A_BUFFERS];
    void *mem[I8A_BUFFERS];
    size_t total;
    if (i8a_store_layout(&f, buf, &total) != 0)
        return 1;
    for (size_t i = 0; i < I8A_BUFFERS; i++) {   /* the store's layout, as the front end uses it */
        const size_t n = buf[i].bytes;
        mem[i] = !n ? NULL : buf[i].zeroed ? calloc(1, n) : malloc(n);
    }
    i8a_cache c;
    /* both sides rotated on a quarter of the cases, V alone on another quarter */
    i8a_store_bind(&c, &f, mem, len % 4 == 1 || len % 4 == 3 ? sign : NULL);
    if (len % 4 == 3)
        c.k_sign = NULL;
    float *k = malloc(len * hkv * d * sizeof(float)), *v = malloc(len * hkv * d * sizeof(float));
    float *q = malloc(h * d * sizeof(float));
    uint64_t seed = rng;
    /* V near the quantizer's smallest absmax on two shapes (17 and 257 tokens): the weight
     * planes' lift (common.h) */
    const float vmag = len % 5 == 2 ? 1e-30f : 1.0f;
    for (size_t i = 0; i < len * hkv * d; i++)
        k[i] = gauss() * ((i % d) == 3 ? 20.0f : 1.0f) + (float)(i % 7) - 3.0f, v[i] = gauss() * vmag;
    for (size_t i = 0; i < h * d; i++)
        q[i] = gauss();
    rng = seed;
    size_t bad = 0;
    /* position 0 alone first, then the rest (the offsets come from the second append) */
    int rc = i8a_append(kt, &c, k, v, 1, &bad);
    rc |= len > 1 ? i8a_append(kt, &c, k + hkv * d, v + hkv * d, len - 1, &bad) : 0;
    const size_t threads = 1 + (len % 3);      /* 1..3 threads: the output must not care */
    const i8a_options opt = {0.125f, q_bits, 0, 0, len % 2 ? 0.0f : 5.0f};   /* softcap on half */
    rc |= i8a_decode(kt, &c, q, 1, h, &opt, threads, out, &bad);
    i8a_cache_free_work(&c);
    free(k), free(v), free(q);
    for (size_t i = 0; i < I8A_BUFFERS; i++)
        free(mem[i]);
    return rc;
}

/* A paged pool against contiguous caches of the same format (rotated, 8/8, no float rows): three
 * sequences of different lengths, their rows written by slot into shuffled blocks of
 * block_rows positions (two sharing the first blocks' rows, as prefix caching shares them),
 * attended in one call with t queries each; each output must equal a decode of the same rows
 * and queries in a contiguous cache, bit for bit. Adds the outputs to *sum; returns the
 * sequences that differ. */
static size_t paged_case(const i8a_kernels *kt, size_t h, size_t hkv, size_t d,
                         size_t block_rows, const size_t len[3], const size_t t[3],
                         const i8a_options *opt, uint64_t *sum)
{
    static float sign[I8A_MAX_HEAD_DIM];
    for (size_t i = 0; i < d; i++)
        sign[i] = (i * 2654435761u) & 64 ? -1.0f : 1.0f;
    size_t nblocks = 0, most = 0, diffs = 0, qrows = 0;
    for (int b = 0; b < 3; b++) {
        nblocks += (len[b] + block_rows - 1) / block_rows;
        most = len[b] > most ? len[b] : most;
        qrows += t[b] * h;
    }
    nblocks += 2;                                   /* spare blocks, never named */
    const size_t row = hkv * d, bb = i8a_paged_block_bytes(hkv, d, block_rows);
    uint8_t *base = i8a_alloc_aligned(nblocks * bb);
    memset(base, 0x5a, nblocks * bb);
    int32_t *order = malloc(nblocks * sizeof(int32_t));
    for (size_t i = 0; i < nblocks; i++)
        order[i] = (int32_t)i;
    for (size_t i = nblocks - 1; i > 0; i--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const size_t j = (size_t)(rng >> 33) % (i + 1);
        const int32_t x = order[i];
        order[i] = order[j], order[j] = x;
    }
    i8a_paged p;
    i8a_paged_init(&p, base, nblocks, hkv, d, block_rows, sign);
    float *k = malloc(3 * most * row * sizeof(float)), *v = malloc(3 * most * row * sizeof(float));
    float *q = malloc(qrows * d * sizeof(float)), *out = malloc(qrows * d * sizeof(float));
    float *ref = malloc(most * h * d * sizeof(float));
    for (size_t i = 0; i < 3 * most * row; i++)
        k[i] = gauss() + (float)(i % 5) - 2.0f, v[i] = gauss();
    for (size_t i = 0; i < qrows * d; i++)
        q[i] = gauss();
    /* sequence 1 shares sequence 0's rows and its first blocks (a prefix) */
    const size_t shared = len[0] < len[1] ? len[0] / block_rows : len[1] / block_rows;
    memcpy(k + most * row, k, shared * block_rows * row * sizeof(float));
    memcpy(v + most * row, v, shared * block_rows * row * sizeof(float));
    int32_t *tables[3];
    i8a_paged_seq seqs[3];
    size_t next = 0, bad = 0;
    int rc = 0;
    for (int b = 0; b < 3; b++) {
        const size_t nb = (len[b] + block_rows - 1) / block_rows;
        tables[b] = malloc(nb * sizeof(int32_t));
        for (size_t j = 0; j < nb; j++)
            tables[b][j] = b == 1 && j < shared ? tables[0][j] : order[next++];
        int64_t *slots = malloc(len[b] * sizeof(int64_t));
        for (size_t pos = 0; pos < len[b]; pos++)   /* shared rows: written again, the same */
            slots[pos] = (int64_t)tables[b][pos / block_rows] * (int64_t)block_rows
                         + (int64_t)(pos % block_rows);
        rc |= i8a_paged_write(kt, &p, slots, len[b], k + b * most * row, v + b * most * row, I8A_F32,
                              1 + (size_t)b, &bad);
        free(slots);
        seqs[b] = (i8a_paged_seq){tables[b], len[b], t[b]};
    }
    rc |= i8a_paged_attend(kt, &p, seqs, 3, q, I8A_F32, h, opt, 1 + len[0] % 3, out, &bad);
    *sum = digest(*sum, out, qrows * d * sizeof(float));
    const i8a_format f = {hkv, most, d, 8, 8, 0, 0, 0};
    i8a_buffer buf[I8A_BUFFERS];
    void *mem[I8A_BUFFERS];
    size_t total;
    i8a_store_layout(&f, buf, &total);
    size_t at = 0;
    for (int b = 0; b < 3; b++) {
        for (size_t i = 0; i < I8A_BUFFERS; i++)
            mem[i] = buf[i].bytes ? calloc(1, buf[i].bytes) : NULL;
        i8a_cache c;
        i8a_store_bind(&c, &f, mem, sign);
        rc |= i8a_append(kt, &c, k + b * most * row, v + b * most * row, len[b], &bad);
        rc |= i8a_decode(kt, &c, q + at * d, t[b], h, opt, 2, ref, &bad);
        diffs += rc != 0 || memcmp(ref, out + at * d, t[b] * h * d * sizeof(float)) != 0;
        at += t[b] * h;
        i8a_cache_free_work(&c);
        for (size_t i = 0; i < I8A_BUFFERS; i++)
            free(mem[i]);
    }
    i8a_paged_free_work(&p);
    for (int b = 0; b < 3; b++)
        free(tables[b]);
    i8a_free_aligned(base);
    free(order), free(k), free(v), free(q), free(out), free(ref);
    return diffs;
}

/* The paged cases of one tier: block sizes 16 .. 128, GQA, windows with sinks, the soft cap,
 * single queries and prefill chunks across chunk and block boundaries. */
static size_t paged_differs(const i8a_kernels *kt, size_t *cases, uint64_t *sum)
{
    static const struct {
        size_t h, hkv, d, rows, len[3], t[3], window, sinks;
        float cap;
    } pc[] = {
        {8, 8, 128, 16, {300, 517, 1}, {1, 1, 1}, 0, 0, 0.0f},
        {32, 8, 128, 128, {700, 900, 77}, {1, 60, 77}, 0, 0, 0.0f},
        {4, 1, 256, 64, {700, 900, 33}, {5, 1, 17}, 512, 0, 0.0f},
        {6, 2, 64, 32, {613, 613, 258}, {1, 40, 258}, 100, 4, 30.0f},
        {7, 1, 32, 16, {45, 300, 512}, {3, 300, 1}, 0, 0, 5.0f},
    };
    size_t diffs = 0;
    for (size_t i = 0; i < sizeof pc / sizeof pc[0]; i++)
        for (int q_bits = 8; q_bits <= 16; q_bits += 8) {
            const i8a_options opt = {0.09f, q_bits, pc[i].window, pc[i].sinks, pc[i].cap};
            diffs += paged_case(kt, pc[i].h, pc[i].hkv, pc[i].d, pc[i].rows, pc[i].len, pc[i].t,
                                &opt, sum);
            (*cases)++;
        }
    return diffs;
}

/* A pool with open blocks (i8a_paged_open, four entries): sequence 0 prefilled in chunks that
 * cross blocks (its position 0 kept apart once its first block is full), then decoded token by
 * token past a block's end; sequence 1 shares its first full block and prefills its own rows
 * in one chunk beside sequence 0's decodes. Every output
 * goes to out (n_out floats, *n_out set); returns nonzero when a call fails. The same rng state
 * gives the same data on every tier. */
static int open_run(const i8a_kernels *kt, size_t h, size_t hkv, size_t d, size_t block_rows,
                    const i8a_options *opt, float *out, size_t *n_out)
{
    static float sign[I8A_MAX_HEAD_DIM];
    for (size_t i = 0; i < d; i++)
        sign[i] = (i * 2654435761u) & 64 ? -1.0f : 1.0f;
    enum { ENTRIES = 4, NB = 12 };
    const size_t row = hkv * d, bb = i8a_paged_block_bytes(hkv, d, block_rows);
    const size_t len0 = 3 * block_rows + 5, len1 = block_rows + 9, cells = hkv * block_rows;
    uint8_t *base = i8a_alloc_aligned(NB * bb);
    uint16_t *ok = i8a_alloc_aligned(2 * ENTRIES * cells * d * sizeof(uint16_t));
    float *os = i8a_alloc_aligned(2 * ENTRIES * cells * sizeof(float));
    int32_t of[NB];
    i8a_open_entry entries[ENTRIES];
    uint8_t held[NB] = {0};
    float *first = calloc(2 * NB * row, sizeof(float));
    i8a_paged p;
    i8a_paged_init(&p, base, NB, hkv, d, block_rows, sign);
    i8a_paged_open(&p, ENTRIES, ok, ok + ENTRIES * cells * d, os, os + ENTRIES * cells, of,
                   entries, first, first + NB * row, held);
    const int32_t table0[4] = {7, 2, 9, 4}, table1[2] = {7, 11};
    float *k = malloc((len0 + len1) * row * sizeof(float));
    float *v = malloc((len0 + len1) * row * sizeof(float));
    float *q = malloc((len0 + len1) * h * d * sizeof(float));
    for (size_t i = 0; i < (len0 + len1) * row; i++)
        k[i] = gauss() + (float)(i % 3) - 1.0f, v[i] = gauss();
    for (size_t i = 0; i < (len0 + len1) * h * d; i++)
        q[i] = gauss();
    memcpy(k + len0 * row, k, block_rows * row * sizeof(float));     /* the shared block */
    memcpy(v + len0 * row, v, block_rows * row * sizeof(float));
    int64_t slots[1024];
    size_t bad = 0, done = 0, at = 0;
    int rc = 0;
    /* sequence 0: chunks [0, 7), [7, 2 B + 3), then one token at a time */
    for (size_t a = 0; a < len0;) {
        const size_t z = a == 0 ? 7 : a == 7 ? 2 * block_rows + 3 : a + 1;
        for (size_t pos = a; pos < z; pos++)
            slots[pos - a] = (int64_t)table0[pos / block_rows] * (int64_t)block_rows
                             + (int64_t)(pos % block_rows);
        rc |= i8a_paged_write(kt, &p, slots, z - a, k + a * row, v + a * row, I8A_F32, 2,
                              &bad);
        i8a_paged_seq seqs[2] = {{table0, z, z - a}, {table1, len1, len1 - block_rows}};
        const int with1 = a == 7;                   /* sequence 1's own rows, beside */
        if (with1) {
            for (size_t pos = block_rows; pos < len1; pos++)
                slots[pos - block_rows] = (int64_t)table1[1] * (int64_t)block_rows
                                          + (int64_t)(pos - block_rows);
            rc |= i8a_paged_write(kt, &p, slots, len1 - block_rows,
                                  k + (len0 + block_rows) * row, v + (len0 + block_rows) * row,
                                  I8A_F32, 3, &bad);
        }
        /* the step's queries: sequence 0's, then sequence 1's */
        float *qq = malloc((z - a + (with1 ? len1 : 0)) * h * d * sizeof(float));
        memcpy(qq, q + a * h * d, (z - a) * h * d * sizeof(float));
        if (with1)
            memcpy(qq + (z - a) * h * d, q + (len0 + block_rows) * h * d,
                   (len1 - block_rows) * h * d * sizeof(float));
        const size_t rows = (z - a + (with1 ? len1 - block_rows : 0)) * h;
        rc |= i8a_paged_attend(kt, &p, seqs, with1 ? 2 : 1, qq, I8A_F32, h, opt, 1 + done % 2,
                               out + at * d, &bad);
        at += rows;
        done++;
        free(qq);
        a = z;
    }
    *n_out = at * d;
    i8a_paged_free_work(&p);
    i8a_free_aligned(base), i8a_free_aligned(ok), i8a_free_aligned(os);
    free(k), free(v), free(q), free(first);
    return rc;
}

/* The scalar tier's run of one case, made once and kept: the first tier to meet the case makes
 * it (from the rng state the case starts at), every tier's run of the case is compared with it,
 * and the scalar tier's run is it. A case's data comes from the rng alone, so a tier's run
 * leaves the rng where the scalar run left it (checked). */
typedef struct {
    float *out;
    size_t n;                       /* floats in out */
    int rc;
    uint64_t rng_after;
} reference;

/* Whether tier kt's run of a case (rc, its n floats in out; the rng where it left it) differs
 * from the case's reference, or either failed. The rng is left where the reference left it. */
static int differs_from(const reference *ref, int rc, const float *out, size_t n)
{
    const int moved = rng != ref->rng_after;
    rng = ref->rng_after;
    return rc || ref->rc || moved || n != ref->n || memcmp(out, ref->out, n * sizeof(float)) != 0;
}

/* The open-block runs of one tier against the scalar tier's, bit for bit: block sizes 16, 32 and
 * 128, GQA, a window with sinks, the soft cap, both q widths. Adds the outputs to *sum; returns
 * the runs that differ (or fail). */
static size_t open_differs(const i8a_kernels *kt, const i8a_kernels *scalar, size_t *cases,
                           uint64_t *sum)
{
    static const struct {
        size_t h, hkv, d, rows, window, sinks;
        float cap;
    } oc[] = {
        {8, 2, 64, 16, 0, 0, 0.0f},
        {4, 1, 256, 32, 40, 3, 0.0f},
        {6, 3, 96, 128, 0, 0, 30.0f},
    };
    static reference refs[2 * sizeof oc / sizeof oc[0]];
    size_t diffs = 0, k = 0;
    for (size_t i = 0; i < sizeof oc / sizeof oc[0]; i++)
        for (int q_bits = 8; q_bits <= 16; q_bits += 8, k++) {
            const i8a_options opt = {0.11f, q_bits, oc[i].window, oc[i].sinks, oc[i].cap};
            const size_t most = (5 * oc[i].rows + 14) * oc[i].h * oc[i].d;
            reference *ref = &refs[k];
            const uint64_t seed = rng;
            if (!ref->out) {
                ref->out = malloc(most * sizeof(float));
                ref->rc = open_run(scalar, oc[i].h, oc[i].hkv, oc[i].d, oc[i].rows, &opt,
                                   ref->out, &ref->n);
                ref->rng_after = rng;
                rng = seed;
            }
            float *a = kt == scalar ? NULL : malloc(most * sizeof(float));
            size_t na = ref->n;
            const int rc = a ? open_run(kt, oc[i].h, oc[i].hkv, oc[i].d, oc[i].rows, &opt, a, &na)
                             : 0;
            if (!a)
                rng = ref->rng_after;
            const float *out = a ? a : ref->out;
            *sum = digest(*sum, out, na * sizeof(float));
            diffs += (size_t)differs_from(ref, rc, out, na);
            (*cases)++;
            free(a);
        }
    return diffs;
}

/* The rotation alone, forward and inverse, out of place, at every block size: 1 if it differs. */
static int rotation_differs(const i8a_kernels *kt, const i8a_kernels *scalar)
{
    static const size_t dims[] = {16, 32, 48, 64, 80, 96, 128, 192, 256, 384, 512, 1024};
    static float x[I8A_MAX_HEAD_DIM], sign[I8A_MAX_HEAD_DIM], a[I8A_MAX_HEAD_DIM], b[I8A_MAX_HEAD_DIM];
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const size_t d = dims[i];
        for (size_t j = 0; j < d; j++)
            x[j] = gauss(), sign[j] = gauss() < 0.0f ? -1.0f : 1.0f;
        for (int inverse = 0; inverse <= 1; inverse++) {
            kt->rotate(x, d, sign, inverse, a);
            scalar->rotate(x, d, sign, inverse, b);
            if (memcmp(a, b, d * sizeof(float)) != 0)
                return 1;
        }
    }
    return 0;
}

/* The pool: every item of a job runs exactly once, on a worker index below the job's thread
 * count, with a prefetch hint that is an item or n_items; over many back-to-back jobs of
 * uneven items (some spin, so threads steal from each other's ranges). 1 if any is wrong. */
typedef struct {
    _Atomic unsigned *count;
    size_t n, threads;
    atomic_int wrong;
} pool_check;

static void pool_task(void *ctx, size_t begin, size_t end, size_t next, size_t worker)
{
    pool_check *pc = ctx;
    if (begin >= end || end > pc->n || worker >= pc->threads || next > pc->n)
        atomic_store(&pc->wrong, 1);
    for (size_t i = begin; i < end && i < pc->n; i++) {
        atomic_fetch_add(&pc->count[i], 1);
        if (i % 7 == worker % 7)                /* uneven work: some items take longer */
            for (volatile int spin = 0; spin < 5000; spin++)
                ;
    }
}

static int pool_differs(void)
{
    static const size_t items[] = {1, 2, 3, 17, 64, 255, 1000};
    static const size_t threads[] = {2, 3, 8, 64};
    _Atomic unsigned *count = malloc(1000 * sizeof *count);
    int failed = 0;
    for (int round = 0; round < 8; round++)
        for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
            for (size_t j = 0; j < sizeof threads / sizeof threads[0]; j++) {
                pool_check pc = {count, items[i], threads[j], 0};
                for (size_t k = 0; k < pc.n; k++)
                    atomic_init(&count[k], 0);
                const size_t used = i8a_pool_run(pc.n, pc.threads, pool_task, &pc);
                for (size_t k = 0; k < pc.n; k++)
                    failed |= atomic_load(&count[k]) != 1;
                failed |= atomic_load(&pc.wrong) || used > pc.threads || used > pc.n;
            }
    free(count);
    return failed;
}

int main(void)
{
    static const size_t shapes[][4] = {
        {8, 8, 128, 1}, {8, 8, 128, 17}, {32, 8, 128, 1100}, {4, 1, 16, 300}, {2, 2, 1024, 513},
        {8, 2, 48, 257}, {6, 3, 80, 255}, {4, 2, 64, 130},
        /* query heads per kv head 3, 5 and 7: the V passes' groups of 4 and 2 and what is left */
        {6, 2, 96, 700}, {10, 2, 64, 301}, {7, 1, 32, 41},
    };
    const unsigned have = i8a_cpu_features();
    const i8a_kernels *scalar = NULL;
    for (const i8a_kernels *const *tp = checked_tiers(); *tp; tp++)
        if (!strcmp((*tp)->name, "scalar"))
            scalar = *tp;
    int failed = 0;
    /* the scalar tier's run of each case (the decodes, 2 q widths over each shape and width) */
    static reference refs[2 * 4 * sizeof shapes / sizeof shapes[0]];
    for (const i8a_kernels *const *tp = checked_tiers(); *tp; tp++) {
        const i8a_kernels *t = *tp;
        if ((t->requires & have) != t->requires) {
            printf("%-14s skipped: not supported on this CPU\n", t->name);
            continue;
        }
        size_t cases = 0, diffs = 0;
        rng = 0x9e3779b97f4a7c15ull;           /* every tier on the same data: one digest */
        uint64_t sum = 0xcbf29ce484222325ull;
        /* the int8 cache, and K and V at 4 bits (both, or either) where d allows */
        static const int widths[][2] = {{8, 8}, {4, 4}, {8, 4}, {4, 8}};
        size_t k = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            for (size_t w = 0; w < 4; w++) {
                if (w && shapes[i][2] % I8A_NIB_BLOCK)
                    continue;
                for (int q_bits = 8; q_bits <= 16; q_bits += 8, k++) {
                    const size_t h = shapes[i][0], hkv = shapes[i][1], d = shapes[i][2];
                    const size_t len = shapes[i][3];
                    const int kb = widths[w][0], vb = widths[w][1];
                    reference *ref = &refs[k];
                    const uint64_t seed = rng;
                    if (!ref->out) {
                        ref->out = malloc(h * d * sizeof(float));
                        ref->n = h * d;
                        ref->rc = run_case(scalar, h, hkv, d, len, q_bits, kb, vb, ref->out);
                        ref->rng_after = rng;
                        rng = seed;
                    }
                    float *a = t == scalar ? NULL : malloc(h * d * sizeof(float));
                    const int rc = a ? run_case(t, h, hkv, d, len, q_bits, kb, vb, a) : 0;
                    if (!a)
                        rng = ref->rng_after;
                    const float *out = a ? a : ref->out;
                    cases++;
                    sum = digest(sum, out, h * d * sizeof(float));
                    if (differs_from(ref, rc, out, h * d) && diffs++ < 3)
                        printf("  %s differs: H %zu, Hkv %zu, D %zu, %zu tokens, K%d/V%d, "
                               "q_bits %d\n", t->name, h, hkv, d, len, kb, vb, q_bits);
                    free(a);
                }
            }
        }
        size_t paged_cases = 0;
        uint64_t paged_sum = 0xcbf29ce484222325ull;
        const size_t paged = paged_differs(t, &paged_cases, &paged_sum);
        printf("%-14s paged pool: %zu cases, %zu sequences differ from a contiguous cache; "
               "outputs %016llx\n", t->name, paged_cases, paged, (unsigned long long)paged_sum);
        failed |= paged != 0;
        size_t open_cases = 0;
        uint64_t open_sum = 0xcbf29ce484222325ull;
        const size_t open = open_differs(t, scalar, &open_cases, &open_sum);
        printf("%-14s open blocks: %zu cases, %zu differ from scalar; outputs %016llx\n",
               t->name, open_cases, open, (unsigned long long)open_sum);
        failed |= open != 0;
        const int rot = rotation_differs(t, scalar);
        printf("%-14s %zu cases, %zu differ from scalar; rotation over 12 head dims %s; outputs "
               "%016llx\n", t->name, cases, diffs, rot ? "DIFFERS" : "agrees",
               (unsigned long long)sum);
        failed |= diffs != 0 || rot;
    }
    const int pool = pool_differs();
    printf("pool: every item exactly once over %d jobs: %s\n", 8 * 7 * 4, pool ? "FAILS" : "yes");
    return failed | pool;
}
