#include "_engine.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "_pool.h"
#include "_simd/common.h"

/* x itself, or (with a rotation) its rotated copy in tmp. */
static const float *maybe_rotated(const i8a_kernels *kt, const i8a_cache *c, const float *x,
                                  float *tmp)
{
    if (!c->sign)
        return x;
    kt->rotate(x, c->d, c->sign, 0, tmp);
    return tmp;
}

/* The offsets exist (decode adds them back) once a centered cache holds `len` >= 2 tokens. */
static int has_offsets(const i8a_cache *c, size_t len)
{
    return c->k_off != NULL && len >= 2;
}

/* Whether every one of the d values at x has |x| <= limit (a non-negative float): false for
 * NaN and Inf. On the bits: without their sign, floats order as integers do, with NaN and Inf
 * above every finite value, so one integer compare per value answers (and vectorizes, where a
 * float compare that must fail on NaN is left scalar). */
static int within(const float *x, size_t d, float limit)
{
    int32_t top, over = 0;               /* signed: both sides are below 2^31 */
    memcpy(&top, &limit, sizeof top);
    for (size_t i = 0; i < d; i++) {
        int32_t b;
        memcpy(&b, x + i, sizeof b);
        over |= (b & 0x7fffffff) > top;
    }
    return !over;
}

static int in_range(const float *x, size_t d)
{
    return within(x, d, I8A_VALUE_MAX);
}

/* Doubles of set_offset's sums on the stack: the heads are summed this many elements at a time
 * (at least 4 heads of the largest head dim), so a token's rows are read in one sweep. */
#define I8A_OFFSET_SUMS 4096

/* Rows (at most) that decide whether a head keeps its offset. */
#define I8A_OFFSET_SAMPLE 64

/* A mean is kept as the offset only when it does not dwarf the rows it comes from: of (up to)
 * I8A_OFFSET_SAMPLE rows evenly spread over x's rows [from, t) of head `head`, at most half may
 * grow by centering to more than twice their norm. One outlier (a single huge element in a
 * prefill) drags the mean far from every other row, and centering would then store every later
 * row as about minus that mean, its own values lost in the steps; with a zero offset the
 * outlier only sets its own row's scale. */
static int offset_keeps(const float *x, size_t t, size_t from, size_t hkv, size_t d, size_t head,
                        const double *mean)
{
    const size_t rows = t - from, n = rows < I8A_OFFSET_SAMPLE ? rows : I8A_OFFSET_SAMPLE;
    size_t grown = 0;
    for (size_t j = 0; j < n; j++) {
        const float *row = x + ((from + j * rows / n) * hkv + head) * d;
        double raw = 0.0, centered = 0.0;
        for (size_t i = 0; i < d; i++) {
            const double c = (double)row[i] - mean[i];
            raw += (double)row[i] * (double)row[i];
            centered += c * c;
        }
        grown += centered > 4.0 * raw;
    }
    return 2 * grown <= n;
}

/* off[head] = R (the mean of x's rows from token `from` on), per kv head (rotated when the
 * cache rotates): sums in double, in token order. Fewer than I8A_OFFSET_MIN_ROWS rows make no
 * estimate worth its noise, and a mean that offset_keeps rejects is no offset of its rows: the
 * offsets are then zero, which centers nothing (the same codes, and decode values, as without
 * centering). The same pass finds the first row (token * hkv + head) of x [t * hkv][d] that is
 * not in range (in_range), returned (t * hkv when there is none: the offsets are then
 * unspecified, and the caller must not commit them). Too few rows read nothing and return
 * t * hkv: the rows are checked as they are stored. */
static size_t set_offset(const i8a_kernels *kt, const i8a_cache *c, const float *x, size_t t,
                         size_t from, float *off)
{
    const size_t d = c->d, hkv = c->hkv, per_block = I8A_OFFSET_SUMS / d;
    double sum[I8A_OFFSET_SUMS];
    size_t bad = t * hkv;
    if (t - from < I8A_OFFSET_MIN_ROWS) {
        memset(off, 0, hkv * d * sizeof(float));
        return bad;
    }
    for (size_t h0 = 0; h0 < hkv; h0 += per_block) {
        const size_t nh = hkv - h0 < per_block ? hkv - h0 : per_block, n = nh * d;
        for (size_t i = 0; i < n; i++)
            sum[i] = 0.0;
        for (size_t tok = 0; tok < t; tok++) {
            const float *rows = x + (tok * hkv + h0) * d;    /* heads h0 .. h0+nh-1, adjacent */
            for (size_t h = 0; h < nh; h++)
                if (!in_range(rows + h * d, d) && tok * hkv + h0 + h < bad)
                    bad = tok * hkv + h0 + h;
            if (tok >= from)
                for (size_t i = 0; i < n; i++)
                    sum[i] += rows[i];
        }
        for (size_t i = 0; i < n; i++)
            sum[i] = sum[i] / (double)(t - from);          /* now the means */
        for (size_t h = 0; h < nh; h++) {
            float *o = off + (h0 + h) * d;
            const int keep = offset_keeps(x, t, from, hkv, d, h0 + h, sum + h * d);
            for (size_t i = 0; i < d; i++)
                o[i] = keep ? (float)sum[h * d + i] : 0.0f;
            if (c->sign)
                kt->rotate(o, d, c->sign, 0, o);
        }
    }
    return bad;
}

/* One row into codes and scale: rotated when the cache rotates, minus off when off != NULL. */
static int store_row(const i8a_kernels *kt, const i8a_cache *c, const float *x, const float *off,
                     int8_t *codes, float *scale)
{
    float tmp[I8A_MAX_HEAD_DIM];
    const float *y = maybe_rotated(kt, c, x, tmp);
    if (off) {
        for (size_t i = 0; i < c->d; i++)
            tmp[i] = y[i] - off[i];
        y = tmp;
    }
    return kt->quantize_row(y, c->d, codes, scale);
}

int i8a_append(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
               size_t t, size_t *bad)
{
    const size_t d = c->d, hkv = c->hkv;
    if (!has_offsets(c, c->len) && has_offsets(c, c->len + t)) {
        /* the offsets come from this append: a bad row anywhere in it is reported before any
         * row is stored (the first in row order, k before v, as the loop below would) */
        const size_t from = 1 - c->len;                     /* the token at position 1 */
        const size_t bk = set_offset(kt, c, k, t, from, c->k_off);
        const size_t bv = set_offset(kt, c, v, t, from, c->v_off);
        if (bk < t * hkv || bv < t * hkv) {
            *bad = bk <= bv ? bk : bv;
            return bk <= bv ? 1 : 2;
        }
    }
    for (size_t r = 0; r < t * hkv; r++) {
        const size_t tok = r / hkv, head = r % hkv, pos = c->len + tok;
        const size_t row = head * c->cap + pos;
        const int centered = c->k_off && pos >= 1;
        if (c->k_first && pos == 0) {
            memcpy(c->k_first + head * d, k + r * d, d * sizeof(float));
            memcpy(c->v_first + head * d, v + r * d, d * sizeof(float));
        }
        /* rows in range stay finite through the rotation and the offset (I8A_VALUE_MAX), so
         * the quantizer's own check of the stored row never fails after this one */
        if (!in_range(k + r * d, d)
            || store_row(kt, c, k + r * d, centered ? c->k_off + head * d : NULL,
                         c->k + row * d, c->ks + row) != 0) {
            *bad = r;
            return 1;
        }
        if (!in_range(v + r * d, d)
            || store_row(kt, c, v + r * d, centered ? c->v_off + head * d : NULL,
                         c->v + row * d, c->vs + row) != 0) {
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

/* Positions before this one are read from float rows, not from the codes. */
static size_t first_coded(const i8a_cache *c)
{
    return c->k_first ? 1 : 0;
}

/* The positions query tt of t sees, as two half-open ranges of coded positions in position
 * order: the sinks [a0, b0) (empty without them) and the window up to the query itself
 * [a1, b1); and whether it sees position 0 from its float row (kept first position). */
typedef struct {
    size_t a0, b0, a1, b1;
    int first;
} i8a_visible;

static i8a_visible visible(const i8a_cache *c, size_t t, size_t tt, const i8a_options *opt)
{
    const size_t end = c->len - t + tt + 1;                 /* the query's position + 1 */
    size_t lo = opt->window && end > opt->window ? end - opt->window : 0;
    i8a_visible v = {0, 0, lo, end, 0};
    if (opt->sinks >= lo)
        v.a1 = 0;                                           /* the sinks join the window */
    else
        v.b0 = opt->sinks;
    const size_t e = first_coded(c);
    v.first = e && (v.a1 == 0 || v.b0 > 0);
    v.a0 = v.a0 > e ? v.a0 : e;
    v.a1 = v.a1 > e ? v.a1 : e;
    return v;
}

/* Chunks any query sees, in order, written to list (when not NULL); returns how many. */
static size_t visible_chunks(const i8a_cache *c, size_t t, const i8a_options *opt, size_t *list)
{
    size_t count = 0;
    for (size_t k = 0; k < n_chunks(c); k++) {
        const size_t c0 = k * I8A_CHUNK, c1 = c0 + I8A_CHUNK;
        int seen = 0;
        for (size_t tt = 0; tt < t && !seen; tt++) {
            const i8a_visible v = visible(c, t, tt, opt);
            seen = (v.a0 < v.b0 && v.a0 < c1 && c0 < v.b0)
                || (v.a1 < v.b1 && v.a1 < c1 && c0 < v.b1);
        }
        if (seen) {
            if (list)
                list[count] = k;
            count++;
        }
    }
    return count;
}

/* Work per thread below which another thread costs more than it saves, in kv rows of 128
 * dims times (1 + query rows per kv head) / 2 (each query row of a group adds a dot and an
 * accumulation). Measured on the 2-core development VM (avx512_vnni): H = Hkv = 8, D = 128
 * gains from a second thread at 256 tokens (19 -> 15 us) and loses at 128 (10.5 -> 11.4 us). */
#define I8A_ROWS_PER_THREAD 1024

size_t i8a_decode_threads(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                          size_t max_threads)
{
    const size_t rows_per_kv = t * (h / c->hkv);
    const size_t items = c->hkv * visible_chunks(c, t, opt, NULL);
    const size_t tokens = items / c->hkv * I8A_CHUNK;       /* an upper bound of rows read */
    const size_t work = c->hkv * (tokens < c->len ? tokens : c->len) * (c->d / 16)
                      * (1 + rows_per_kv) / 16;
    size_t n = work / I8A_ROWS_PER_THREAD;
    n = n < 1 ? 1 : n;
    n = n < max_threads ? n : max_threads;
    return n < items ? n : (items ? items : 1);
}

/* Scratch layout, every part 64-byte aligned (R = t * nq query rows per kv head):
 *   q_hi, q_lo [hkv][R][d] int8;  c_hi, c_lo, bias, first [hkv][R] float;  residual [d] float;
 *   position 0's V row in the stored space, first_v [hkv][d] float;
 *   the visible chunks [nvis] size_t;  chunks left per kv head [hkv] (atomic);
 *   running max and sum per kv head [hkv][R] float each;
 *   per (kv head, visible chunk, part): the state of R rows: o [R][d], m [R], l [R]; the part is
 *     0 for the sinks and 1 for the window when both are on, else 0;
 *   per thread: the attend scratch, 2 * R * I8A_CHUNK floats. */
typedef struct {
    size_t rows, parts, nvis;
    size_t q_lo, c_hi, c_lo, bias, first, first_v, residual, vis, left, run_m, run_l, states;
    size_t workers, end;
    size_t state_bytes, worker_bytes;
} layout;

static layout plan(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt, size_t threads)
{
    const size_t d = c->d, f = sizeof(float), hkv = c->hkv;
    layout L;
    L.rows = t * (h / hkv);
    L.parts = opt->window && opt->sinks ? 2 : 1;
    L.nvis = visible_chunks(c, t, opt, NULL);
    L.state_bytes = align64(L.rows * (d + 2) * f);
    L.worker_bytes = align64(2 * L.rows * I8A_CHUNK * f);
    const size_t qrows = hkv * L.rows;
    L.q_lo = align64(qrows * d);
    L.c_hi = L.q_lo + align64(qrows * d);
    L.c_lo = L.c_hi + align64(qrows * f);
    L.bias = L.c_lo + align64(qrows * f);
    L.first = L.bias + align64(qrows * f);
    L.first_v = L.first + align64(qrows * f);
    L.residual = L.first_v + align64(hkv * d * f);
    L.vis = L.residual + align64(d * f);
    L.left = L.vis + align64(n_chunks(c) * sizeof(size_t));
    L.run_m = L.left + align64(hkv * sizeof(atomic_size_t));
    L.run_l = L.run_m + align64(qrows * f);
    L.states = L.run_l + align64(qrows * f);
    L.workers = L.states + hkv * L.nvis * L.parts * L.state_bytes;
    L.end = L.workers + (threads ? threads : 1) * L.worker_bytes;
    return L;
}

size_t i8a_decode_scratch_size(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                               size_t threads)
{
    return plan(c, t, h, opt, threads).end;
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

/* (x . y) * scale over d floats, summed in double in index order, rounded to float once (the
 * dot of two rows in range can exceed float32's range before the scale brings it back). */
static float dot_scaled(const float *x, const float *y, size_t d, float scale)
{
    double acc = 0.0;
    for (size_t i = 0; i < d; i++)
        acc += (double)x[i] * (double)y[i];
    return (float)(acc * (double)scale);
}

typedef struct {
    const i8a_kernels *kt;
    const i8a_cache *c;
    const i8a_options *opt;
    char *base;
    layout L;
    size_t t, h, nq;
    const size_t *vis;
    float *out;
} decode_job;

/* The state of rows [r, r + count) of kv head g, visible chunk vi, part. */
static i8a_state state_at(const decode_job *job, size_t g, size_t vi, size_t part, size_t r)
{
    const size_t slot = (g * job->L.nvis + vi) * job->L.parts + part, rows = job->L.rows;
    float *p = (float *)(job->base + job->L.states + slot * job->L.state_bytes);
    i8a_state s = {p + rows * job->c->d + r, p + rows * job->c->d + rows + r, p + r * job->c->d};
    return s;
}

/* Query rows [r, r + count) of kv head g. */
static i8a_query query_at(const decode_job *job, size_t g, size_t r, size_t count)
{
    const size_t d = job->c->d, row = g * job->L.rows + r;
    const i8a_query q = {
        d, count, job->opt->q_bits == 16,
        (const int8_t *)job->base + row * d,
        (const int8_t *)job->base + job->L.q_lo + row * d,
        (const float *)(job->base + job->L.c_hi) + row,
        (const float *)(job->base + job->L.c_lo) + row,
        job->opt->softcap,
        job->opt->softcap > 0.0f ? 1.0f / job->opt->softcap : 0.0f,
        (const float *)(job->base + job->L.bias) + row,
    };
    return q;
}

/* Positions [a, b) of kv head g as a span (without a prefetch hint). */
static i8a_span span_rows(const i8a_cache *c, size_t g, size_t a, size_t b)
{
    const size_t row = g * c->cap + a, d = c->d;
    i8a_span span = {c->k + row * d, c->v + row * d, c->ks + row, c->vs + row, b - a, NULL, NULL, 0};
    return span;
}

/* The first coded position of chunk `chunk`. */
static size_t chunk_start(const i8a_cache *c, size_t chunk)
{
    const size_t c0 = chunk * I8A_CHUNK;
    return c0 > first_coded(c) ? c0 : first_coded(c);
}

/* Chunk `chunk` of kv head g as a span: its coded positions, the last chunk cut at len. */
static i8a_span chunk_span(const i8a_cache *c, size_t g, size_t chunk)
{
    const size_t c1 = chunk * I8A_CHUNK + I8A_CHUNK;
    return span_rows(c, g, chunk_start(c, chunk), c1 < c->len ? c1 : c->len);
}

/* The state of position 0 read from its float row (kept first position): m = the logit
 * (soft-capped when the cap is on), l = 1, o = v0 (its V row in the stored space), minus v_off
 * when `off` (the offset then joins every row at the end). */
static void first_state(const decode_job *job, size_t g, size_t r, const float *v0, int off,
                        const i8a_state *run)
{
    const i8a_cache *c = job->c;
    const float lg = ((const float *)(job->base + job->L.first))[g * job->L.rows + r];
    const float cap = job->opt->softcap;
    run->m[0] = cap > 0.0f ? i8a_softcap(lg, cap, 1.0f / cap) : lg;
    run->l[0] = 1.0f;
    for (size_t i = 0; i < c->d; i++)
        run->o[i] = off ? v0[i] - c->v_off[g * c->d + i] : v0[i];
}

/* All chunks of kv head g are done: per query row, fold the states it has in position order
 * (position 0 from its float row, chunks, and within a chunk the sinks before the window),
 * normalize into out, add the V offset when the row saw coded positions (so a row that sees
 * only position 0 gets the same bits whatever the cache's length). */
static void finish_head(const decode_job *job, size_t g)
{
    const i8a_cache *c = job->c;
    const size_t d = c->d, nq = job->nq, rows = job->L.rows;
    float *rm = (float *)(job->base + job->L.run_m) + g * rows;
    float *rl = (float *)(job->base + job->L.run_l) + g * rows;
    float *v0 = (float *)(job->base + job->L.first_v) + g * d;
    if (c->k_first && c->sign)
        job->kt->rotate(c->v_first + g * d, d, c->sign, 0, v0);    /* once for the head's rows */
    else if (c->k_first)
        memcpy(v0, c->v_first + g * d, d * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        const size_t tt = r / nq, j = r % nq;
        float *o = job->out + (tt * job->h + g * nq + j) * d;
        const i8a_state run = {rm + r, rl + r, o};
        const i8a_visible vis = visible(c, job->t, tt, job->opt);
        const int off = has_offsets(c, c->len) && (vis.a0 < vis.b0 || vis.a1 < vis.b1);
        int started = vis.first;
        if (started)
            first_state(job, g, r, v0, off, &run);
        for (size_t vi = 0; vi < job->L.nvis; vi++) {
            for (size_t part = 0; part < job->L.parts; part++) {
                const i8a_state st = state_at(job, g, vi, part, r);
                if (st.m[0] == -INFINITY)
                    continue;                               /* the row saw nothing here */
                if (!started) {
                    rm[r] = st.m[0], rl[r] = st.l[0];
                    memcpy(o, st.o, d * sizeof(float));
                    started = 1;
                } else {
                    job->kt->merge(&run, &st, 1, d);
                }
            }
        }
        const float inv = 1.0f / rl[r];
        for (size_t i = 0; i < d; i++)
            o[i] = o[i] * inv;
        if (off)
            for (size_t i = 0; i < d; i++)
                o[i] = o[i] + c->v_off[g * d + i];
        if (c->sign)
            job->kt->rotate(o, d, c->sign, 1, o);           /* back from the rotated space */
    }
}

static void decode_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    const decode_job *job = (const decode_job *)ctx;
    const i8a_cache *c = job->c;
    const size_t nq = job->nq, rows = job->L.rows, nvis = job->L.nvis;
    float *scratch = (float *)(job->base + job->L.workers + worker * job->L.worker_bytes);
    for (size_t item = begin; item < end; item++) {
        const size_t g = item / nvis, vi = item % nvis, chunk = job->vis[vi];
        const i8a_span whole_span = chunk_span(c, g, chunk);
        const size_t c0 = chunk_start(c, chunk), c1 = c0 + whole_span.n;
        for (size_t part = 0; part < job->L.parts; part++) {
            const i8a_state st = state_at(job, g, vi, part, 0);
            for (size_t r = 0; r < rows; r++)
                st.m[r] = -INFINITY;                        /* empty until attended */
        }
        /* the whole chunk for every query: one pass serves all rows */
        int whole = 1;
        for (size_t tt = 0; tt < job->t && whole; tt++) {
            const i8a_visible v = visible(c, job->t, tt, job->opt);
            whole = v.a1 <= c0 && c1 <= v.b1;
        }
        const size_t then = item + 1 < end ? item + 1 : after;   /* this thread's next item */
        i8a_span next = {0};
        if (then < c->hkv * nvis)
            next = chunk_span(c, then / nvis, job->vis[then % nvis]);
        if (whole) {
            i8a_span span = whole_span;
            span.next_k = next.k, span.next_v = next.v, span.next_n = next.n;
            const i8a_query q = query_at(job, g, 0, rows);
            const i8a_state st = state_at(job, g, vi, job->L.parts - 1, 0);
            job->kt->attend(&q, &span, scratch, &st);
        } else {
            for (size_t tt = 0; tt < job->t; tt++) {
                const i8a_visible v = visible(c, job->t, tt, job->opt);
                const size_t range[2][2] = {{v.a0, v.b0}, {v.a1, v.b1}};
                for (size_t k = 0; k < 2; k++) {
                    const size_t a = range[k][0] > c0 ? range[k][0] : c0;
                    const size_t b = range[k][1] < c1 ? range[k][1] : c1;
                    if (a >= b)
                        continue;
                    i8a_span span = span_rows(c, g, a, b);
                    span.next_k = next.k, span.next_v = next.v, span.next_n = next.n;
                    const i8a_query q = query_at(job, g, tt * nq, nq);
                    const i8a_state st = state_at(job, g, vi, job->L.parts == 2 ? k : 0, tt * nq);
                    job->kt->attend(&q, &span, scratch, &st);
                }
            }
        }
        atomic_size_t *left = (atomic_size_t *)(job->base + job->L.left) + g;
        if (atomic_fetch_sub_explicit(left, 1, memory_order_acq_rel) == 1)
            finish_head(job, g);
    }
}

int i8a_decode(const i8a_kernels *kt, const i8a_cache *c, const float *q, size_t t, size_t h,
               const i8a_options *opt, float *out, void *scratch, size_t threads, size_t *bad)
{
    const size_t d = c->d, hkv = c->hkv, nq = h / hkv;
    decode_job job = {kt, c, opt, (char *)scratch, plan(c, t, h, opt, threads), t, h, nq, NULL, out};
    int8_t *q_hi = (int8_t *)job.base, *q_lo = (int8_t *)(job.base + job.L.q_lo);
    float *c_hi = (float *)(job.base + job.L.c_hi), *c_lo = (float *)(job.base + job.L.c_lo);
    float *residual = (float *)(job.base + job.L.residual);
    float *bias = (float *)(job.base + job.L.bias), *first = (float *)(job.base + job.L.first);
    /* |q| may reach I8A_VALUE_MAX and I8A_QSCALE_MAX / scale, whichever is lower: the largest
     * float not above it (a float q is at most x exactly when it is at most that float) */
    double most = (double)I8A_QSCALE_MAX / (double)opt->scale;
    most = most < (double)I8A_VALUE_MAX ? most : (double)I8A_VALUE_MAX;
    float q_limit = (float)most;
    if ((double)q_limit > most)
        q_limit = nextafterf(q_limit, 0.0f);
    /* q rows in the order of the kernels: kv head, then query position, then head of the group */
    for (size_t tt = 0; tt < t; tt++) {
        for (size_t head = 0; head < h; head++) {
            const size_t g = head / nq, r = g * job.L.rows + tt * nq + head % nq;
            float tmp[I8A_MAX_HEAD_DIM];
            const float *q0 = q + (tt * h + head) * d;
            if (!within(q0, d, q_limit)) {
                *bad = tt * h + head;
                return in_range(q0, d) ? 2 : 1;
            }
            const float *qrow = maybe_rotated(kt, c, q0, tmp);
            if (prepare_q(kt, qrow, d, opt->q_bits == 16, opt->scale, q_hi + r * d, q_lo + r * d,
                          c_hi + r, c_lo + r, residual) != 0) {
                *bad = tt * h + head;
                return 1;
            }
            /* the logit of position 0 from its float row, and the K offset's part
             * of every other logit (both q.x * scale, the dot in double) */
            bias[r] = has_offsets(c, c->len) ? dot_scaled(qrow, c->k_off + g * d, d, opt->scale)
                                             : 0.0f;
            if (c->k_first)
                first[r] = dot_scaled(q0, c->k_first + g * d, d, opt->scale);
        }
    }
    size_t *vis = (size_t *)(job.base + job.L.vis);
    visible_chunks(c, t, opt, vis);
    job.vis = vis;
    atomic_size_t *left = (atomic_size_t *)(job.base + job.L.left);
    for (size_t g = 0; g < hkv; g++)
        atomic_init(left + g, job.L.nvis);
    if (job.L.nvis)
        i8a_pool_run(hkv * job.L.nvis, threads, decode_range, &job);
    else                                    /* only position 0, from its float row */
        for (size_t g = 0; g < hkv; g++)
            finish_head(&job, g);
    return 0;
}

typedef struct {
    const i8a_kernels *kt;
    const i8a_cache *c;
    size_t chunks;
    _Atomic uint64_t sum;
} stream_job;

static void stream_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    (void)worker;
    stream_job *job = (stream_job *)ctx;
    const i8a_cache *c = job->c;
    const i8a_stream_fn stream = job->kt->stream;
    uint64_t x = 0;
    for (size_t item = begin; item < end; item++) {
        /* the same items, ranges and prefetch of the next item as a decode */
        const i8a_span s = chunk_span(c, item / job->chunks, item % job->chunks);
        const size_t then = item + 1 < end ? item + 1 : after;
        i8a_span next = {0};                                /* no next: NULL, no prefetch */
        if (then < c->hkv * job->chunks)
            next = chunk_span(c, then / job->chunks, then % job->chunks);
        x ^= stream(s.k, s.n * c->d, next.k);
        x ^= stream(s.v, s.n * c->d, next.v);
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
