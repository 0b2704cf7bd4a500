/* Every supported tier against the scalar tier, bit for bit, straight through the C driver.
 * A fast check for cross-compiled builds run under qemu-user (the Python tests cover the rest):
 *   cc -O2 -ffp-contract=off -Isrc/int8attn tests/c/tiers_agree.c \
 *      $(grep -v '^#' src/int8attn/csources.txt) -lm -pthread && ./a.out
 * Prints one line per tier, with a digest of its outputs over every case (FNV-1a of the bytes:
 * equal digests before and after a change that must not move a bit), and exits non-zero on any
 * difference. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_engine.h"
#include "_pool.h"

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
    for (const i8a_kernels *t = i8a_tiers; t->name; t++)
        if (!strcmp(t->name, "scalar"))
            scalar = t;
    int failed = 0;
    for (const i8a_kernels *t = i8a_tiers; t->name; t++) {
        if ((t->requires & have) != t->requires) {
            printf("%-14s skipped: not supported on this CPU\n", t->name);
            continue;
        }
        size_t cases = 0, diffs = 0;
        rng = 0x9e3779b97f4a7c15ull;           /* every tier on the same data: one digest */
        uint64_t sum = 0xcbf29ce484222325ull;
        /* the int8 cache, and K and V at 4 bits (both, or either) where d allows */
        static const int widths[][2] = {{8, 8}, {4, 4}, {8, 4}, {4, 8}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            for (size_t w = 0; w < 4; w++) {
                if (w && shapes[i][2] % I8A_NIB_BLOCK)
                    continue;
                for (int q_bits = 8; q_bits <= 16; q_bits += 8) {
                    size_t h = shapes[i][0], d = shapes[i][2];
                    float *a = malloc(h * d * sizeof(float)), *b = malloc(h * d * sizeof(float));
                    uint64_t seed = rng;
                    int rc = run_case(t, h, shapes[i][1], d, shapes[i][3], q_bits, widths[w][0],
                                      widths[w][1], a);
                    rng = seed;
                    rc |= run_case(scalar, h, shapes[i][1], d, shapes[i][3], q_bits,
                                   widths[w][0], widths[w][1], b);
                    cases++;
                    sum = digest(sum, a, h * d * sizeof(float));
                    if (rc || memcmp(a, b, h * d * sizeof(float)) != 0) {
                        if (diffs++ < 3)
                            printf("  %s differs: H %zu, Hkv %zu, D %zu, %zu tokens, K%d/V%d, "
                                   "q_bits %d\n", t->name, h, shapes[i][1], d, shapes[i][3],
                                   widths[w][0], widths[w][1], q_bits);
                    }
                    free(a), free(b);
                }
            }
        }
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
