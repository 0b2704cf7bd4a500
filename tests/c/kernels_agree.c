/* Every entry of the kernel table, called directly, on every supported tier against the scalar
 * tier, bit for bit: quantize_row, attend[k][v] for the four formats, merge, rotate, attend_float
 * and half_row, on hand-built inputs (no cache, no engine) of the sizes that break naive loops:
 * d from 1 (the quantizer) or 16 to 1024, 1 .. 256 tokens (odd counts and the 4/8/16 edges),
 * every V lead 0 .. 3 and K group lead 0 .. 31, 1 .. 7 query heads, both q precisions, the soft
 * cap on and off, unaligned rows; and each 8/8 case again with its rows in the blocks of a
 * paged pool (16 .. 128 rows a block, shuffled, the span starting anywhere in its first block),
 * which must give the bits of the same rows in one run. Inputs are allocated to the exact size of each kernel's
 * preconditions (dispatch.h), so a sanitizer build catches any read past them, and the scratch
 * and the outputs start as NaN bytes for the scalar tier and as zeros for the others, so an
 * output that depends on what was there before differs. Built like tiers_agree.c:
 *   cc -O2 -std=c11 -ffp-contract=off -Isrc/int8attn [-DI8A_TILE_MODEL] tests/c/kernels_agree.c \
 *      $(grep -v '^#' src/int8attn/csources.txt) -lm -pthread && ./a.out
 * Prints one line per tier: the cases of each entry, how many differ from scalar, and a digest of
 * the tier's outputs (FNV-1a: every tier that agrees prints the scalar tier's); exits non-zero on
 * any difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_simd/common.h"   /* i8a_half_bits, to build the rows of halves */
#include "tiers.h"          /* the tiers checked (with -DI8A_TILE_MODEL: the amx tier's model) */

enum { E_QUANTIZE, E_A88, E_A88P, E_A44, E_A84, E_A48, E_MERGE, E_ROTATE, E_FLOAT, E_HALF, E_N };
static const char *const entry_name[E_N] = {"quantize_row", "attend8/8", "attend8/8 paged",
                                            "attend4/4", "attend8/4", "attend4/8", "merge",
                                            "rotate", "attend_float", "half_row"};

#define MAX_TIERS 8
/* the largest outputs: attend_float's of 9 query rows at the largest head dim */
#define OUT_BYTES (9 * (2 + I8A_MAX_HEAD_DIM) * 4 + 1024)

typedef struct {
    const i8a_kernels *kt;
    size_t cases[E_N], diffs;
    uint64_t sum;
} tier_run;

static tier_run tiers[MAX_TIERS];
static size_t n_tiers;                 /* tiers[0] is the scalar tier */
static unsigned char fill;             /* the byte scratch and outputs start as, per run */
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t digest(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint32_t next_u32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

static float uniform(float lo, float hi)   /* [lo, hi) */
{
    return lo + (hi - lo) * (float)(next_u32() >> 8) / (float)(1 << 24);
}

static float gauss(void)
{
    float s = 0.0f;
    for (int i = 0; i < 12; i++)
        s += uniform(0.0f, 1.0f);
    return s - 6.0f;
}

static int8_t code127(void)                /* a stored int8 code: -128 is never stored */
{
    return (int8_t)((int)(next_u32() % 255) - 127);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* One case of one entry: run writes the entry's outputs for kt into out and returns their
 * bytes. Every tier gets the same inputs; the scalar tier's outputs are the reference. */
typedef size_t (*run_fn)(const i8a_kernels *kt, const void *in, unsigned char *out);

static size_t nonfinite;               /* float outputs of the scalar tier that are not finite */

static void check(int entry, run_fn run, const void *in, const char *what)
{
    static unsigned char ref[OUT_BYTES], got[OUT_BYTES];
    fill = 0xff;
    memset(ref, fill, sizeof ref);
    const size_t n = run(tiers[0].kt, in, ref);
    if (entry != E_QUANTIZE && entry != E_HALF)    /* outputs of floats only: all finite */
        for (size_t i = 0; i + sizeof(float) <= n; i += sizeof(float)) {
            float x;
            memcpy(&x, ref + i, sizeof x);
            nonfinite += !isfinite(x);
        }
    for (size_t t = 0; t < n_tiers; t++) {
        fill = t ? 0x00 : 0xff;
        memset(got, fill, sizeof got);
        const size_t m = run(tiers[t].kt, in, got);
        tiers[t].cases[entry]++;
        tiers[t].sum = digest(tiers[t].sum, got, m);
        if (m != n || memcmp(ref, got, n) != 0) {
            if (tiers[t].diffs++ < 5)
                printf("  %s %s differs: %s\n", tiers[t].kt->name, entry_name[entry], what);
        }
    }
}

/* -- quantize_row: d >= 1, any alignment; codes and scale only when it returns 0 ---------- */

typedef struct {
    const float *x;
    size_t d;
} quantize_in;

static size_t run_quantize(const i8a_kernels *kt, const void *p, unsigned char *out)
{
    const quantize_in *in = p;
    int8_t *codes = xmalloc(in->d);
    memset(codes, fill, in->d);
    float scale;
    memset(&scale, fill, sizeof scale);
    const int rc = kt->quantize_row(in->x, in->d, codes, &scale);
    size_t n = 0;
    memcpy(out, &rc, sizeof rc), n += sizeof rc;
    if (rc == 0) {
        memcpy(out + n, &scale, sizeof scale), n += sizeof scale;
        memcpy(out + n, codes, in->d), n += in->d;
    }
    free(codes);
    return n;
}

static void quantize_cases(void)
{
    static const size_t ds[] = {1,  2,  3,  5,  7,  8,   9,   15,  16,  17,  24,  31,  32,
                                33, 40, 47, 63, 64, 65,  100, 127, 128, 129, 255, 256, 257,
                                511, 512, 513, 768, 1000, 1023, 1024};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        for (int kind = 0; kind < 8; kind++)
            for (size_t off = 0; off < 3; off += 2) {       /* aligned, and 2 floats off */
                const size_t d = ds[i];
                float *buf = xmalloc((d + off) * sizeof(float)), *x = buf + off;
                const float scale = powf(10.0f, uniform(-3.0f, 3.0f));
                for (size_t j = 0; j < d; j++)
                    x[j] = gauss() * scale;
                if (kind == 1)
                    memset(x, 0, d * sizeof(float));                 /* a zero row */
                if (kind == 2)
                    for (size_t j = 0; j < d; j++)
                        x[j] *= 1e-33f;                   /* below I8A_ABSMAX_MIN: zeros */
                if (kind == 3)
                    x[(d * 7) / 8] = NAN;
                if (kind == 4)
                    x[d / 3] = (d & 1) ? INFINITY : -INFINITY;
                if (kind == 5)
                    x[d / 2] = 3.0e38f;                   /* near FLT_MAX */
                if (kind == 6)                            /* halfway codes: x * inv = k + 0.5 */
                    for (size_t j = 0; j < d; j++)
                        x[j] = j == 0 ? 127.0f : (float)((int)(j % 253) - 126) + 0.5f;
                if (kind == 7)
                    x[d - 1] = -x[d - 1] * 1000.0f;       /* the absmax last, negative */
                const quantize_in in = {x, d};
                char what[64];
                snprintf(what, sizeof what, "d %zu, kind %d, offset %zu", d, kind, off);
                check(E_QUANTIZE, run_quantize, &in, what);
                free(buf);
            }
}

/* -- attend[k][v]: a query group against one chunk ------------------------------------------ */

typedef struct {
    i8a_query q;
    i8a_span kv;
    int kf, vf;
} attend_in;

static size_t run_attend(const i8a_kernels *kt, const void *p, unsigned char *out)
{
    const attend_in *in = p;
    const size_t nq = in->q.nq, d = in->q.d;
    const int four = in->kf == I8A_FMT4 || in->vf == I8A_FMT4;
    const size_t bytes = 2 * nq * I8A_CHUNK * sizeof(float) + (four ? I8A_ATTEND4_EXTRA : 0);
    float *scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    memset(scratch, fill, bytes);
    float *m = (float *)out, *l = m + nq, *o = l + nq;   /* out: m [nq], l [nq], o [nq][d] */
    const i8a_state st = {m, l, o};
    kt->attend[in->kf][in->vf](&in->q, &in->kv, scratch, &st);
    free(scratch);
    return (2 + d) * nq * sizeof(float);
}

/* Halves of a float (finite, |x| < 65520). */
static uint16_t half(float x)
{
    return i8a_half_bits(x);
}

/* The 8/8 case `in` (its span in one run: K rows k, V tiles v) again with its rows in the
 * blocks of a pool: 2^shift rows a block, the blocks in a shuffled order among spare ones full
 * of other codes, the span's first row at row lead of its first block (lead % 4 = v_lead, the
 * tiles aligned as in a cache). Every tier must give the scalar tier's bits (check), and the
 * scalar tier the bits of the one-run span. */
static void paged_case(const attend_in *one, const int8_t *k, const int8_t *v, size_t tiles,
                       const char *what)
{
    static size_t turn;
    const size_t d = one->q.d, n = one->kv.n, v_lead = one->kv.v_lead;
    const unsigned shift = 4 + (unsigned)(turn++ % 4);     /* 16, 32, 64, 128 rows */
    const size_t rows = (size_t)1 << shift;
    const size_t lead = (next_u32() % (rows / I8A_V_TILE)) * I8A_V_TILE + v_lead;
    const size_t used = (lead + n + rows - 1) / rows, spare = 3, nb = used + spare;
    const size_t block_bytes = 2 * rows * d + 64;          /* K rows, V tiles, a gap */
    int8_t *pool = xmalloc(nb * block_bytes);
    for (size_t i = 0; i < nb * block_bytes; i++)
        pool[i] = code127();
    int32_t *order = xmalloc(nb * sizeof(int32_t));
    for (size_t b = 0; b < nb; b++)
        order[b] = (int32_t)b;
    for (size_t b = nb - 1; b > 0; b--) {                  /* Fisher-Yates */
        const size_t j = next_u32() % (b + 1);
        const int32_t x = order[b];
        order[b] = order[j], order[j] = x;
    }
    const size_t vlead = lead - v_lead;
    for (size_t r = 0; r < n; r++) {
        const size_t row = lead + r;
        memcpy(pool + order[row >> shift] * block_bytes + (row & (rows - 1)) * d, k + r * d, d);
    }
    for (size_t t = 0; t < tiles; t++) {
        const size_t row = vlead + I8A_V_TILE * t;
        memcpy(pool + order[row >> shift] * block_bytes + rows * d + (row & (rows - 1)) * d,
               v + t * I8A_V_TILE * d, I8A_V_TILE * d);
    }
    attend_in in = *one;
    i8a_span *kv = &in.kv;
    kv->k = pool, kv->v = pool + rows * d;
    kv->blocks = order, kv->block_bytes = block_bytes, kv->block_shift = shift;
    kv->lead = lead, kv->vlead = vlead;
    if (kv->next_n) {                                      /* the hint: the same rows, paged */
        kv->next_k = kv->k, kv->next_v = kv->v, kv->next_blocks = order;
        kv->next_lead = lead, kv->next_vlead = vlead;
    }
    char where[200];
    snprintf(where, sizeof where, "%s, %zu rows a block, lead %zu", what, rows, lead);
    check(E_A88P, run_attend, &in, where);
    static unsigned char a[OUT_BYTES], b[OUT_BYTES];
    const size_t na = run_attend(tiers[0].kt, one, a), nbytes = run_attend(tiers[0].kt, &in, b);
    if (na != nbytes || memcmp(a, b, na) != 0)
        if (tiers[0].diffs++ < 5)
            printf("  scalar paged attend differs from one run: %s\n", where);
    free(pool), free(order);
}

static void attend_case(int entry, int kf, int vf, size_t d, size_t n, size_t v_lead,
                        size_t k4_lead, size_t nq, int two, int cap, int weights)
{
    attend_in in;
    memset(&in, 0, sizeof in);
    in.kf = kf, in.vf = vf;
    i8a_query *q = &in.q;
    i8a_span *kv = &in.kv;
    int8_t *q_hi = xmalloc(nq * d), *q_lo = xmalloc(nq * d);
    float *c_hi = xmalloc(nq * sizeof(float)), *c_lo = xmalloc(nq * sizeof(float));
    float *bias = xmalloc(nq * sizeof(float)), *q_float = xmalloc(nq * d * sizeof(float));
    for (size_t i = 0; i < nq * d; i++) {
        q_hi[i] = code127(), q_lo[i] = code127();
        q_float[i] = gauss() * 0.3f;
    }
    for (size_t j = 0; j < nq; j++) {
        c_hi[j] = uniform(0.5f, 2.0f) / (127.0f * sqrtf((float)d));
        c_lo[j] = c_hi[j] / 127.0f;
        bias[j] = uniform(-2.0f, 2.0f);
    }
    /* q_lo and c_lo given at q_bits=8 too, as the engine gives them: the scalar rule reads
     * c_lo[j] (and ignores it) at either precision */
    *q = (i8a_query){d, nq, two, q_hi, q_lo, c_hi, c_lo,
                     cap ? 20.0f : 0.0f, cap ? 1.0f / 20.0f : 0.0f, bias, q_float};
    kv->n = n;
    kv->v_lead = v_lead;
    kv->blocks = kv->next_blocks = i8a_one_block;      /* one run (paged_case: blocks) */
    kv->block_shift = I8A_ONE_BLOCK_SHIFT;
    const size_t tiles = (v_lead + n + I8A_V_TILE - 1) / I8A_V_TILE;
    float *vs = xmalloc(n * sizeof(float));
    for (size_t s = 0; s < n; s++) {
        vs[s] = uniform(0.002f, 0.05f);
        if (weights == 1)
            vs[s] = ldexpf(vs[s], -110);            /* weights below 2^-100: the lift */
        if (weights == 2 && s == n / 2)
            vs[s] = 1e4f;                           /* one weight far above the rest */
    }
    kv->vs = vs;
    int8_t *k = NULL, *v = NULL;
    float *ks = NULL, *v4_min = NULL, *k4_ms = NULL, *k4_ss = NULL;
    uint8_t *k4 = NULL, *k4w = NULL, *v4 = NULL;
    uint16_t *k4_min = NULL, *k4_step = NULL;
    if (kf == I8A_FMT8) {
        k = xmalloc(n * d);
        ks = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n * d; i++)
            k[i] = code127();
        for (size_t s = 0; s < n; s++)
            ks[s] = uniform(0.05f, 0.5f) * (weights == 2 && s == n / 3 ? 8.0f : 1.0f);
        kv->k = k, kv->ks = ks;
    } else {
        const size_t groups = (k4_lead + n + I8A_K4_GROUP - 1) / I8A_K4_GROUP;
        k4 = xmalloc(n * d / 2);
        k4_min = xmalloc(groups * d * sizeof(uint16_t));
        k4_step = xmalloc(groups * d * sizeof(uint16_t));
        k4_ms = xmalloc(groups * sizeof(float)), k4_ss = xmalloc(groups * sizeof(float));
        for (size_t i = 0; i < n * d / 2; i++)
            k4[i] = (uint8_t)next_u32();
        /* the wide channels' fifth bits (a channel with an odd step half is wide: about half of
         * them, so some groups hold more than d / 2, whose ranks past d / 2 have none) */
        k4w = xmalloc(n * I8A_K4_WIDE_BYTES(d));
        for (size_t i = 0; i < n * I8A_K4_WIDE_BYTES(d); i++)
            k4w[i] = (uint8_t)next_u32();
        for (size_t g = 0; g < groups; g++) {
            k4_ms[g] = ldexpf(1.0f, (int)(next_u32() % 7) - 3);
            k4_ss[g] = ldexpf(1.0f, (int)(next_u32() % 7) - 6);
            for (size_t i = 0; i < d; i++) {
                /* a channel in 16 an outlier, its step 20 times the others' */
                const float outlier = i % 16 == 5 ? 20.0f : 1.0f;
                k4_min[g * d + i] = half(-uniform(0.0f, 2.0f) * outlier);
                k4_step[g * d + i] = half(uniform(0.0f, 0.3f) * outlier);
            }
        }
        kv->k4 = k4, kv->k4_wide = k4w, kv->k4_min = k4_min, kv->k4_step = k4_step;
        kv->k4_min_scale = k4_ms, kv->k4_step_scale = k4_ss, kv->k4_lead = k4_lead;
    }
    if (vf == I8A_FMT8) {
        v = xmalloc(tiles * d * I8A_V_TILE);
        for (size_t i = 0; i < tiles * d * I8A_V_TILE; i++)
            v[i] = weights == 3 ? 0 : code127();       /* weights 3: a V of zeros */
        kv->v = v;
    } else {
        v4 = xmalloc(tiles * 2 * d);
        v4_min = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < tiles * 2 * d; i++)
            v4[i] = (uint8_t)next_u32();
        for (size_t s = 0; s < n; s++)
            v4_min[s] = -uniform(0.0f, 1.0f);
        kv->v4 = v4, kv->v4_min = v4_min;
    }
    /* the prefetch hint: none, or this chunk's own rows again (a hint never changes a bit) */
    if (n % 2) {
        kv->next_k = kf == I8A_FMT8 ? k : (const int8_t *)k4;
        kv->next_v = vf == I8A_FMT8 ? v : (const int8_t *)v4;
        kv->next_n = n;
    }
    char what[160];
    snprintf(what, sizeof what,
             "d %zu, n %zu, v_lead %zu, k4_lead %zu, nq %zu, q_bits %d, cap %d, weights %d", d, n,
             v_lead, k4_lead, nq, two ? 16 : 8, cap, weights);
    check(entry, run_attend, &in, what);
    if (entry == E_A88)
        paged_case(&in, k, v, tiles, what);
    free(q_hi), free(q_lo), free(c_hi), free(c_lo), free(bias), free(q_float), free(vs);
    free(k), free(ks), free(k4), free(k4w), free(k4_min), free(k4_step), free(k4_ms), free(k4_ss);
    free(v), free(v4), free(v4_min);
}

static void attend_cases(void)
{
    static const size_t ns[] = {1,  2,  3,  4,   5,   7,   8,   9,   15,  16,  17,
                                31, 33, 63, 64,  65,  100, 127, 128, 129, 255, 256};
    static const size_t d8[] = {16, 32, 48, 64, 80, 96, 128, 160, 256, 512, 1024, 112};
    static const size_t d4[] = {32, 64, 96, 128, 160, 192, 256, 512, 1024};
    static const int formats[4][3] = {{E_A88, I8A_FMT8, I8A_FMT8}, {E_A44, I8A_FMT4, I8A_FMT4},
                                      {E_A84, I8A_FMT8, I8A_FMT4}, {E_A48, I8A_FMT4, I8A_FMT8}};
    const size_t nn = sizeof ns / sizeof ns[0];
    for (int f = 0; f < 4; f++) {
        const int eight = formats[f][1] == I8A_FMT8 && formats[f][2] == I8A_FMT8;
        const size_t *ds = eight ? d8 : d4;
        const size_t nd = eight ? sizeof d8 / sizeof d8[0] : sizeof d4 / sizeof d4[0];
        size_t idx = 0;
        for (size_t i = 0; i < nn; i++)
            for (size_t lead = 0; lead < I8A_V_TILE; lead++)
                for (int rep = 0; rep < 2; rep++, idx++) {
                    /* strides coprime to each list's length walk every combination over time */
                    size_t d = ds[(idx * 5 + (size_t)f) % nd];
                    const size_t nq = 1 + (idx * 3 + lead) % 7;
                    if (d == 1024 && nq > 3)
                        d = ds[(idx + 1) % (nd - 1)];   /* keeps the emulated runs short */
                    const int two = (int)((idx / 7) % 2), cap = (int)((idx / 3) % 2);
                    const size_t k4_lead = (idx * 13) % I8A_K4_GROUP;
                    const int weights = idx % 11 == 4   ? 1   /* lifted */
                                        : idx % 11 == 8 ? 2   /* a sink */
                                        : idx % 13 == 6 ? 3   /* V zeros */
                                                        : 0;
                    attend_case(formats[f][0], formats[f][1], formats[f][2], d, ns[i], lead,
                                k4_lead, nq, two, cap, weights);
                }
        /* every token count 1 .. I8A_CHUNK, at head dims up to 160 */
        for (size_t n = 1; n <= I8A_CHUNK; n++)
            attend_case(formats[f][0], formats[f][1], formats[f][2], ds[n % 5], n,
                        n % I8A_V_TILE, (n * 7) % I8A_K4_GROUP, 1 + n % 7, (int)(n / 3 % 2),
                        (int)(n / 2 % 2), n % 17 == 3 ? 1 : 0);
        /* every head dim at 7 query heads, a short chunk */
        for (size_t j = 0; j < nd; j++)
            attend_case(formats[f][0], formats[f][1], formats[f][2], ds[j], 19, 3, 29, 7, 1, 1,
                        0);
        /* groups as a multi-token decode makes them (queries x heads a group): many blocks of
         * heads over one chunk's tiles, a tail block of one, both precisions; and a group past
         * the 64 heads the tiled K pass keeps corrections for (its tiles made per 64 heads) */
        for (int two = 0; two < 2; two++)
            attend_case(formats[f][0], formats[f][1], formats[f][2], 128, 250 - 67 * (size_t)two,
                        1 + (size_t)two, 5, 37 - 4 * (size_t)two, two, 0, 0);
        attend_case(formats[f][0], formats[f][1], formats[f][2], 64, 77, 2, 9, 70, 1, 0, 0);
    }
}

/* -- merge: one query row's running state and a chunk's ------------------------------------- */

typedef struct {
    float m[2], l[2];
    const float *o[2];
    size_t d;
} merge_in;

static size_t run_merge(const i8a_kernels *kt, const void *p, unsigned char *out)
{
    const merge_in *in = p;
    float *m = (float *)out, *l = m + 1, *o = l + 1;   /* out: the running state after */
    *m = in->m[0], *l = in->l[0];
    memcpy(o, in->o[0], in->d * sizeof(float));
    float cm = in->m[1], cl = in->l[1];
    const i8a_state run = {m, l, o}, chunk = {&cm, &cl, (float *)in->o[1]};
    kt->merge(&run, &chunk, in->d);
    return (2 + in->d) * sizeof(float);
}

static void merge_cases(void)
{
    for (size_t d = 16; d <= I8A_MAX_HEAD_DIM; d += 16)
        for (int kind = 0; kind < 4; kind++) {
            float *o0 = xmalloc(d * sizeof(float)), *o1 = xmalloc(d * sizeof(float));
            for (size_t i = 0; i < d; i++)
                o0[i] = gauss() * 3.0f, o1[i] = gauss() * 3.0f;
            merge_in in = {{uniform(-10.0f, 10.0f), uniform(-10.0f, 10.0f)},
                           {uniform(1.0f, 50.0f), uniform(1.0f, 50.0f)}, {o0, o1}, d};
            if (kind == 1)
                in.m[1] = in.m[0];                     /* equal maxima */
            if (kind == 2)
                in.m[0] = -INFINITY, in.l[0] = 0.0f;   /* the running state still empty */
            if (kind == 3)
                in.m[1] = in.m[0] - 80.0f;             /* a factor near exp's floor */
            char what[64];
            snprintf(what, sizeof what, "d %zu, kind %d", d, kind);
            check(E_MERGE, run_merge, &in, what);
            free(o0), free(o1);
        }
}

/* -- rotate: d a multiple of 16, in place or not, both ways --------------------------------- */

typedef struct {
    const float *x, *sign;
    size_t d;
    int inverse, in_place;
} rotate_in;

static size_t run_rotate(const i8a_kernels *kt, const void *p, unsigned char *out)
{
    const rotate_in *in = p;
    float *y = (float *)out;
    if (in->in_place) {
        memcpy(y, in->x, in->d * sizeof(float));
        kt->rotate(y, in->d, in->sign, in->inverse, y);
    } else {
        kt->rotate(in->x, in->d, in->sign, in->inverse, y);
    }
    return in->d * sizeof(float);
}

static void rotate_cases(void)
{
    for (size_t d = 16; d <= I8A_MAX_HEAD_DIM; d += 16)
        for (int inverse = 0; inverse < 2; inverse++)
            for (int in_place = 0; in_place < 2; in_place++) {
                float *x = xmalloc(d * sizeof(float)), *sign = xmalloc(d * sizeof(float));
                for (size_t i = 0; i < d; i++)
                    x[i] = gauss(), sign[i] = next_u32() & 1 ? 1.0f : -1.0f;
                const rotate_in in = {x, sign, d, inverse, in_place};
                char what[64];
                snprintf(what, sizeof what, "d %zu, inverse %d, in place %d", d, inverse,
                         in_place);
                check(E_ROTATE, run_rotate, &in, what);
                free(x), free(sign);
            }
}

/* -- attend_float: query rows over rows of halves ------------------------------------------- */

typedef struct {
    const float *q;             /* [nq][d] */
    size_t nq;
    i8a_float_rows w;
    size_t d;
    float cap;
} float_in;

static size_t run_float(const i8a_kernels *kt, const void *p, unsigned char *out)
{
    const float_in *in = p;
    float *m = (float *)out, *l = m + in->nq, *o = l + in->nq;
    float *logit = xmalloc(I8A_WIN_HEADS * in->w.n * sizeof(float));
    memset(logit, fill, I8A_WIN_HEADS * in->w.n * sizeof(float));
    const i8a_state st = {m, l, o};
    kt->attend_float(in->q, in->nq, &in->w, in->d, in->cap, logit, &st);
    /* the group is invisible: each row alone gives its row of the group's states */
    float *one = xmalloc((2 + in->d) * sizeof(float));
    for (size_t h = 0; h < in->nq; h++) {
        const i8a_state alone = {one, one + 1, one + 2};
        kt->attend_float(in->q + h * in->d, 1, &in->w, in->d, in->cap, logit, &alone);
        if (memcmp(one, m + h, sizeof(float)) || memcmp(one + 1, l + h, sizeof(float)) ||
            memcmp(one + 2, o + h * in->d, in->d * sizeof(float))) {
            fprintf(stderr, "FAIL attend_float %s: row %zu of %zu differs from the row alone\n",
                    kt->name, h, in->nq);
            exit(1);
        }
    }
    /* rows that see fewer rows (w.seen, a prefill's positions in one block): each row is the
     * row alone over its first seen[h] rows (the tier's own bits; the digest holds them) */
    if (in->nq > 1) {
        size_t *seen = xmalloc(in->nq * sizeof *seen);
        for (size_t h = 0; h < in->nq; h++)
            seen[h] = 1 + (h * 7 + in->w.n / 2) % in->w.n;
        float *mlo = xmalloc((2 + in->d) * in->nq * sizeof(float));
        const i8a_state part = {mlo, mlo + in->nq, mlo + 2 * in->nq};
        i8a_float_rows w = in->w;
        w.seen = seen;
        kt->attend_float(in->q, in->nq, &w, in->d, in->cap, logit, &part);
        for (size_t h = 0; h < in->nq; h++) {
            i8a_float_rows first = in->w;
            first.n = seen[h];
            const i8a_state alone = {one, one + 1, one + 2};
            kt->attend_float(in->q + h * in->d, 1, &first, in->d, in->cap, logit, &alone);
            if (memcmp(one, part.m + h, sizeof(float)) || memcmp(one + 1, part.l + h, sizeof(float))
                || memcmp(one + 2, part.o + h * in->d, in->d * sizeof(float))) {
                fprintf(stderr, "FAIL attend_float %s: row %zu of %zu over its %zu of %zu rows "
                        "differs from the row alone\n", kt->name, h, in->nq, seen[h], in->w.n);
                exit(1);
            }
        }
        free(mlo);
        free(seen);
    }
    free(one);
    free(logit);
    return (2 + in->d) * in->nq * sizeof(float);
}

static void float_cases(void)
{
    static const size_t ds[] = {16, 32, 48, 64, 80, 96, 128, 256, 512, 1024};
    static const size_t ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64, 65, 200};
    static const size_t nqs[] = {1, 4, 2, 3, 5, 8, 7, 9};   /* blocks of 4 heads and their tails */
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (int cap = 0; cap < 2; cap++) {
                const size_t d = ds[i], n = ns[j];
                const size_t nq = nqs[(i + j + 3 * (size_t)cap) % (sizeof nqs / sizeof nqs[0])];
                float *q = xmalloc(nq * d * sizeof(float));
                uint16_t **k = xmalloc(n * sizeof *k), **v = xmalloc(n * sizeof *v);
                float *k_scale = xmalloc(n * sizeof(float)), *v_scale = xmalloc(n * sizeof(float));
                for (size_t t = 0; t < nq * d; t++)
                    q[t] = gauss() * 0.1f;
                for (size_t r = 0; r < n; r++) {
                    k[r] = xmalloc(d * sizeof(uint16_t)), v[r] = xmalloc(d * sizeof(uint16_t));
                    for (size_t t = 0; t < d; t++) {
                        k[r][t] = half(gauss() * 8000.0f);
                        v[r][t] = half(gauss() * 8000.0f);
                    }
                    k_scale[r] = ldexpf(1.0f, -12 - (int)(next_u32() % 4));
                    v_scale[r] = ldexpf(1.0f, -14 + (int)(next_u32() % 6));
                }
                const float_in in = {q, nq,
                                     {(const uint16_t *const *)k, (const uint16_t *const *)v,
                                      k_scale, v_scale, n, NULL},
                                     d,
                                     cap ? 15.0f : 0.0f};
                char what[64];
                snprintf(what, sizeof what, "d %zu, n %zu, nq %zu, cap %d", d, n, nq, cap);
                check(E_FLOAT, run_float, &in, what);
                for (size_t r = 0; r < n; r++)
                    free(k[r]), free(v[r]);
                free(q), free(k), free(v), free(k_scale), free(v_scale);
            }
}

/* -- half_row: finite |x| <= 2^64, d a multiple of 16 --------------------------------------- */

typedef struct {
    const float *x;
    size_t d;
} half_in;

static size_t run_half(const i8a_kernels *kt, const void *p, unsigned char *out)
{
    const half_in *in = p;
    uint16_t *h = (uint16_t *)(out + sizeof(float));
    const float scale = kt->half_row(in->x, in->d, h);
    memcpy(out, &scale, sizeof scale);
    return sizeof scale + in->d * sizeof(uint16_t);
}

static void half_cases(void)
{
    for (size_t d = 16; d <= I8A_MAX_HEAD_DIM; d += 16)
        for (int kind = 0; kind < 6; kind++) {
            float *x = xmalloc(d * sizeof(float));
            const float scale = ldexpf(1.0f, (int)(next_u32() % 41) - 20);
            for (size_t i = 0; i < d; i++)
                x[i] = gauss() * scale;
            if (kind == 1)
                memset(x, 0, d * sizeof(float));
            if (kind == 2)
                for (size_t i = 0; i < d; i++)
                    x[i] *= 0x1p-110f;                  /* the exponent's floor: subnormals */
            if (kind == 3)
                for (size_t i = 0; i < d; i++)
                    x[i] = ldexpf(x[i] / scale, 60);     /* near the bound 2^64 */
            if (kind == 4)                               /* the largest rounds up to 2^15 */
                x[d / 2] = ldexpf(65519.0f / 2.0f, (int)(next_u32() % 9) - 4);
            if (kind == 5)                               /* ties between two halves */
                for (size_t i = 0; i < d; i++)
                    x[i] = 16384.0f + 8.0f * (float)i + (i % 2 ? 4.0f : 12.0f);
            const half_in in = {x, d};
            char what[64];
            snprintf(what, sizeof what, "d %zu, kind %d", d, kind);
            check(E_HALF, run_half, &in, what);
            free(x);
        }
}

int main(void)
{
    const unsigned have = i8a_cpu_features();
    for (const i8a_kernels *const *tp = checked_tiers(); *tp; tp++)
        if (!strcmp((*tp)->name, "scalar"))
            tiers[n_tiers++].kt = *tp;
    for (const i8a_kernels *const *tp = checked_tiers(); *tp && n_tiers < MAX_TIERS; tp++) {
        const i8a_kernels *t = *tp;
        if (!strcmp(t->name, "scalar"))
            continue;
        if ((t->requires & have) != t->requires) {
            printf("%-14s skipped: not supported on this CPU\n", t->name);
            continue;
        }
        tiers[n_tiers++].kt = t;
    }
    for (size_t t = 0; t < n_tiers; t++)
        tiers[t].sum = 0xcbf29ce484222325ull;
    quantize_cases();
    attend_cases();
    merge_cases();
    rotate_cases();
    float_cases();
    half_cases();
    int failed = 0;
    for (size_t i = 1; i <= n_tiers; i++) {    /* the table's order: best first, scalar last */
        const tier_run *r = &tiers[i % n_tiers];
        size_t all = 0;
        printf("%-14s", r->kt->name);
        for (int e = 0; e < E_N; e++) {
            printf(" %s %zu", entry_name[e], r->cases[e]);
            all += r->cases[e];
        }
        printf("; %zu cases, %zu differ from scalar; outputs %016llx\n", all, r->diffs,
               (unsigned long long)r->sum);
        failed |= r->diffs != 0;
    }
    /* a NaN or an infinity would make agreement cheap: the inputs keep every output finite */
    printf("scalar outputs not finite: %zu\n", nonfinite);
    return failed || nonfinite;
}
