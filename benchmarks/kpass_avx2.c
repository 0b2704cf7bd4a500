/* The avx2 tier's two K passes side by side: the row pass (4 K rows against each query row, row
 * sums reduced) and the tiled pass (8 K rows transposed once, each query row's word broadcast),
 * on one chunk of 256 rows, for query groups of 1 to 128 rows (a GQA group's heads, a prefill's
 * block). The two are timed in turn in one process, best of the rounds each; their dots must be
 * equal (exit 1 if not). Prints a markdown table. I8A_KTILE_MIN_ROWS_AVX2 (kdots/avx2.h) is where
 * the ratio drops below 1.
 *
 *     gcc -O2 -std=gnu11 -Isrc/int8attn benchmarks/kpass_avx2.c -o /tmp/kpass && /tmp/kpass
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "_simd/avx2.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

static AVX2 void row_pass(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    i8a_kdots_rows_avx2(q, kv, dh, dl, 1);
}

static AVX2 void tiled_pass(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    i8a_kdots_tiled_avx2(q, kv, dh, dl, 1);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void (*pass_fn)(const i8a_query *, const i8a_span *, int32_t *, int32_t *);

/* Best time of one call over `rounds` rounds of `reps` calls. */
static double best_of(pass_fn f, const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl,
                      int reps, double *best)
{
    const double t0 = now();
    for (int i = 0; i < reps; i++)
        f(q, kv, dh, dl);
    const double t = (now() - t0) / reps;
    *best = t < *best ? t : *best;
    return t;
}

int main(void)
{
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("skipped: no AVX2 on this CPU\n");
        return 0;
    }
    static const size_t ds[] = {128, 256}, rows[] = {1, 2, 3, 4, 8, 16, 128};
    const size_t n = I8A_CHUNK, max_rows = 128, max_d = 256;
    int8_t *k = aligned_alloc(64, n * max_d), *q_hi = aligned_alloc(64, max_rows * max_d);
    int8_t *q_lo = aligned_alloc(64, max_rows * max_d);
    int32_t *out = aligned_alloc(64, 4 * max_rows * I8A_CHUNK * sizeof(int32_t));
    srand(1);
    for (size_t i = 0; i < n * max_d; i++)           /* codes in [-127, 127], as stored */
        k[i] = (int8_t)(rand() % 255 - 127);
    for (size_t i = 0; i < max_rows * max_d; i++) {
        q_hi[i] = (int8_t)(rand() % 255 - 127);
        q_lo[i] = (int8_t)(rand() % 255 - 127);
    }
    printf("| D | query rows | row pass us | tiled pass us | tiled / row |\n| --- | --- | ---: | ---: | ---: |\n");
    int differ = 0;
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++) {
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++) {
            const size_t d = ds[a], nq = rows[b];
            int32_t *dh[2] = {out, out + 2 * nq * I8A_CHUNK}, *dl[2];
            dl[0] = dh[0] + nq * I8A_CHUNK, dl[1] = dh[1] + nq * I8A_CHUNK;
            const i8a_query q = {d, nq, 1, q_hi, q_lo, NULL, NULL, 0.0f, 0.0f, NULL, NULL};
            i8a_span kv;
            memset(&kv, 0, sizeof kv);
            kv.k = k, kv.blocks = i8a_one_block, kv.block_shift = I8A_ONE_BLOCK_SHIFT, kv.n = n;
            const int reps = (int)(4000 / nq) + 20;
            double best[2] = {1e9, 1e9};
            for (int r = 0; r < 15; r++) {                /* in turn: the VM's drift hits both */
                best_of(row_pass, &q, &kv, dh[0], dl[0], reps, &best[0]);
                best_of(tiled_pass, &q, &kv, dh[1], dl[1], reps, &best[1]);
            }
            for (size_t j = 0; j < nq; j++)
                differ |= memcmp(dh[0] + j * I8A_CHUNK, dh[1] + j * I8A_CHUNK, n * 4) != 0
                          || memcmp(dl[0] + j * I8A_CHUNK, dl[1] + j * I8A_CHUNK, n * 4) != 0;
            printf("| %zu | %zu | %.2f | %.2f | %.2f |\n", d, nq, best[0] * 1e6, best[1] * 1e6,
                   best[1] / best[0]);
        }
    }
    printf(differ ? "the passes' dots differ\n" : "the passes' dots are equal\n");
    return differ;
}
