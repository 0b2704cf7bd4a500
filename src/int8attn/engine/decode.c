/* The executor: a decode's workspace and q planes (prepare), its (kv head, chunk) items on the
 * pool (decode_range), and a batch of caches as one pool job. */
#include "internal.h"

#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "../_pool.h"

int i8a_reserve_work(i8a_cache *c, size_t bytes)
{
    if (c->work_bytes >= bytes)
        return 0;
    size_t grown = c->work_bytes + c->work_bytes / 2;
    grown = grown > bytes ? grown : bytes;
    void *p = i8a_alloc_aligned(grown);
    if (!p)
        return -1;
    i8a_free_aligned(c->work);
    c->work = p;
    c->work_bytes = grown;
    return 0;
}

void i8a_cache_free_work(i8a_cache *c)
{
    i8a_free_aligned(c->work);
    c->work = NULL;
    c->work_bytes = 0;
}

/* The two q planes of one query row: q_hi, s_hi quantize q; q_lo, s_lo quantize the residual
 * q - float(q_hi) * s_hi (multiply, then subtract). The plane scales times the softmax scale
 * are what the coded logits use. q_hat [d] (unless NULL) gets the vector the planes stand for,
 *     q_hat_i = float(q_hi_i * s_hi + q_lo_i * s_lo)    (s_lo = 0 with one plane),
 * the products and their sum in double (the products exact: 7 by 24 bits), rounded to float
 * once (reference.q_hat's operations, so the same bits): the q of every logit of a row that
 * sees coded positions. The K offset and the float rows (position 0, the recent window) are
 * dotted with it too, so that every logit carries the same rounding of q, which the softmax
 * cancels. (With q as given there, a K offset large against K's spread shifted the coded
 * logits alone, by nearly the same amount: 6e-3 off the contract's reference at an offset of
 * 1000 times the spread.) */
static void prepare_q(const i8a_kernels *kt, const float *q, size_t d, int two_planes,
                      float scale, int8_t *q_hi, int8_t *q_lo, float *c_hi, float *c_lo,
                      float *residual, float *q_hat)
{
    float s_hi, s_lo = 0.0f;
    kt->quantize_row(q, d, q_hi, &s_hi);        /* q finite (checked): it cannot fail */
    if (two_planes) {
        for (size_t i = 0; i < d; i++)
            residual[i] = q[i] - (float)q_hi[i] * s_hi;
        kt->quantize_row(residual, d, q_lo, &s_lo);
    } else {
        memset(q_lo, 0, d);
    }
    for (size_t i = 0; q_hat && i < d; i++)
        q_hat[i] = (float)((double)q_hi[i] * s_hi + (double)q_lo[i] * s_lo);
    *c_hi = s_hi * scale;
    *c_lo = s_lo * scale;
}

/* (x . y) * scale over d floats (d a multiple of 8), the dot in double (the dot of two rows in
 * range can exceed float32's range before the scale brings it back), rounded to float once.
 * The products are exact in double; they are summed in 8 lanes (element i to lane i mod 8, each
 * lane in index order), folded 0+4, 1+5, ..., then 0+2, 1+3, then 0+1: one dependent chain of
 * d adds was 4 us of a decode of 32 heads. */
static float dot_scaled(const float *x, const float *y, size_t d, float scale)
{
    double lane[8] = {0.0};
    for (size_t i = 0; i < d; i += 8)
        for (size_t t = 0; t < 8; t++)
            lane[t] = lane[t] + (double)x[i + t] * (double)y[i + t];
    for (size_t w = 4; w >= 1; w /= 2)
        for (size_t t = 0; t < w; t++)
            lane[t] = lane[t] + lane[t + w];
    return (float)(lane[0] * (double)scale);
}

/* The q planes, the biases, position 0's logits and the float q of kv head g's query rows
 * [r0, r1) (whole query positions), from the job's q as given. Every row has passed
 * i8a_check_query (finite, within +-I8A_VALUE_MAX; the rotation keeps it finite), so no step
 * can fail here. */
static void prepare_rows(const decode_job *job, size_t g, size_t r0, size_t r1)
{
    const i8a_kernels *kt = job->kt;
    const i8a_cache *c = job->c;
    const i8a_options *opt = job->opt;
    const i8a_plan *L = &job->L;
    const size_t d = c->head_dim, h = job->h, nq = job->nq;
    int8_t *q_hi = (int8_t *)job->base, *q_lo = (int8_t *)(job->base + L->q_lo);
    float *c_hi = (float *)(job->base + L->c_hi), *c_lo = (float *)(job->base + L->c_lo);
    float *bias = (float *)(job->base + L->bias);
    float *pos0_logit = (float *)(job->base + L->pos0_logit);
    float *q_float = (float *)(job->base + L->q_float);
    const int shared = c->k_first || c->recent || has_offsets(c);  /* more than the codes */
    /* q rows in the order of the kernels: kv head, then query position, then head of the group */
    for (size_t tt = r0 / nq; tt < r1 / nq; tt++) {
        const visible_ranges vis = i8a_visible(c, job->t, tt, opt);
        const int coded = sees_codes(&vis);
        for (size_t j = 0; j < nq; j++) {
            const size_t r = g * L->rows + tt * nq + j;
            float tmp[I8A_MAX_HEAD_DIM], q_hat[I8A_MAX_HEAD_DIM], residual[I8A_MAX_HEAD_DIM];
            float wide[I8A_MAX_HEAD_DIM];
            const float *q0 = i8a_row_f32(job->q, tt * h + g * nq + j, d, job->q_type, wide);
            const float *qrow = maybe_rotated(kt, c, c->k_sign, q0, tmp);
            /* q_hat (prepare_q) when the row reads coded positions with K at 8 bits and
             * something shares their q (float rows, the offset); else none (K at 4 bits makes
             * each group's near exact planes from q_float in its attend) */
            float *hat = coded && c->k_bits == 8 && shared ? q_hat : NULL;
            if (c->k_bits == 8)
                prepare_q(kt, qrow, d, opt->q_bits == 16, opt->scale, q_hi + r * d,
                          q_lo + r * d, c_hi + r, c_lo + r, residual, hat);
            /* the q the float rows are dotted with, in their space (as given, unrotated):
             * q_hat rotated back, or q as given */
            const float *qx = q0;
            if (hat && c->k_sign) {
                kt->rotate(hat, d, c->k_sign, 1, tmp);          /* (qrow, in tmp, is used) */
                qx = tmp;
            } else if (hat) {
                qx = hat;
            }
            /* the K offset's part of every coded logit (q_hat in the rotated space, as the
             * offset; offsets only with K at 8 bits) and the logit of position 0 from its float
             * row: both q.x * scale, the dot in double */
            bias[r] = hat && has_offsets(c) ? dot_scaled(hat, c->k_offset + g * d, d, opt->scale)
                                            : 0.0f;
            if (c->k_first)
                pos0_logit[r] = dot_scaled(qx, c->k_first + g * d, d, opt->scale);
            if (c->recent || c->k_bits == 4)
                for (size_t i = 0; i < d; i++)
                    q_float[r * d + i] = qx[i] * opt->scale;
        }
    }
}

/* Kv head g's own part of the preparation: position 0's V row in the stored space (v_pos0),
 * which every row that sees position 0 starts from; in the chunk form also every query row
 * (prepare_rows; the row form's items prepare their own rows). */
static void prepare_kv_head(const decode_job *job, size_t g)
{
    const i8a_cache *c = job->c;
    const size_t d = c->head_dim;
    float *v0 = (float *)(job->base + job->L.v_pos0) + g * d;
    if (c->k_first && c->v_sign)
        job->kt->rotate(c->v_first + g * d, d, c->v_sign, 0, v0);
    else if (c->k_first)
        memcpy(v0, c->v_first + g * d, d * sizeof(float));
    if (!job->L.row_block)
        prepare_rows(job, g, 0, job->L.rows);
}

/* Kv head g prepared (prepare_kv_head) before anything reads it: the first thread to reach one
 * of g's items prepares it, and one that comes meanwhile waits for it, yielding (it takes about
 * a microsecond a query row of D = 128). The q preparation is so spread over the threads that
 * run the kv heads' items; on the calling thread alone it was 6-8 us of a decode of 32 heads.
 * Flag per kv head: 0 not started, 1 being prepared, 2 done. */
static void ensure_prepared(const decode_job *job, size_t g)
{
    atomic_int *flag = (atomic_int *)(job->base + job->L.prep) + g;
    if (atomic_load_explicit(flag, memory_order_acquire) == 2)
        return;
    int idle = 0;
    if (atomic_compare_exchange_strong_explicit(flag, &idle, 1, memory_order_acq_rel,
                                                memory_order_acquire)) {
        const uint64_t t0 = i8a_prof_start();
        prepare_kv_head(job, g);
        i8a_prof_add(I8A_PROF_PREPARE, t0, 1);
        atomic_store_explicit(flag, 2, memory_order_release);
        return;
    }
    while (atomic_load_explicit(flag, memory_order_acquire) != 2)
        sched_yield();
}

/* All of kv head g's items are done (the chunk form): its merges and output. */
static void finish_head(const decode_job *job, size_t g)
{
    const uint64_t t0 = i8a_prof_start();
    i8a_finish_head(job, g);
    i8a_prof_add(I8A_PROF_FINISH, t0, 1);
}

/* The first span an item reads (its chunk, or the first of its visible chunks; a window item's
 * halves), or none: the prefetch hint of the item before it on the same thread. */
static i8a_span item_span(const decode_job *job, size_t item)
{
    const i8a_cache *c = job->c;
    const size_t nvis = job->L.nvis;
    i8a_span none = {0};
    if (item >= job->L.items)
        return none;
    if (job->L.row_block) {
        const size_t g = item / job->L.per_head;
        return nvis ? i8a_chunk_span(c, g, i8a_visible_chunk(&job->L.runs, 0))
               : c->recent ? i8a_window_span(c, g) : none;
    }
    const size_t chunks = c->n_kv_heads * nvis;
    return item < chunks ? i8a_chunk_span(c, item / nvis,
                                          i8a_visible_chunk(&job->L.runs, item % nvis))
                         : i8a_window_span(c, item - chunks);
}

/* The states of kv head g's query rows [r0, r1) (whole query positions) over visible chunk vi,
 * into `slots` (part 0 the sinks', part parts - 1 the window's; m = -inf where a row sees none
 * of a part): the chunk at once for every row when each of their queries sees it whole, else
 * each query over its visible part. scratch: the worker's attend scratch for r1 - r0 rows, gather
 * its paged scales; next: what this thread reads after it (the prefetch hints). */
static void attend_chunk(const decode_job *job, size_t g, size_t vi, size_t r0, size_t r1,
                         const state_slots *slots, float *scratch, float *gather,
                         const i8a_span *next)
{
    const i8a_cache *c = job->c;
    const size_t nq = job->nq, parts = job->L.parts;
    const size_t chunk = i8a_visible_chunk(&job->L.runs, vi);
    const i8a_span whole_span = i8a_chunk_span(c, g, chunk);
    const size_t c0 = i8a_chunk_start(c, chunk), c1 = c0 + whole_span.n;
    for (size_t part = 0; part < parts; part++) {
        const i8a_state st = slot_state(slots, part, r0);
        for (size_t r = 0; r < r1 - r0; r++)
            st.m[r] = -INFINITY;                            /* empty until attended */
    }
    int whole = 1;
    for (size_t tt = r0 / nq; tt < r1 / nq && whole; tt++) {
        const visible_ranges v = i8a_visible(c, job->t, tt, job->opt);
        whole = v.win_begin <= c0 && c1 <= v.win_end;
    }
    if (has_four(c))
        i8a_prefetch_four(c, next);
    i8a_prefetch_scales(c, next);
    const i8a_attend_fn attend = job->kt->attend[k_format(c)][v_format(c)];
    if (whole) {                                            /* one pass serves all rows */
        i8a_span span = whole_span;
        i8a_gather_scales(c, &span, gather);
        i8a_hint_next(&span, next);
        const i8a_query q = query_at(job, g, r0, r1 - r0);
        const i8a_state st = slot_state(slots, parts - 1, r0);
        I8A_EXPECT(span.n >= 1 && span.n <= I8A_CHUNK && q.nq >= 1);
        attend(&q, &span, scratch, &st);
        return;
    }
    for (size_t tt = r0 / nq; tt < r1 / nq; tt++) {
        const visible_ranges v = i8a_visible(c, job->t, tt, job->opt);
        const size_t range[2][2] = {{v.sink_begin, v.sink_end}, {v.win_begin, v.win_end}};
        for (size_t k = 0; k < 2; k++) {
            const size_t a = range[k][0] > c0 ? range[k][0] : c0;
            const size_t b = range[k][1] < c1 ? range[k][1] : c1;
            if (a >= b)
                continue;
            i8a_span span = i8a_span_rows(c, g, a, b);
            i8a_gather_scales(c, &span, gather);
            i8a_hint_next(&span, next);
            const i8a_query q = query_at(job, g, tt * nq, nq);
            const i8a_state st = slot_state(slots, parts == 2 ? k : 0, tt * nq);
            I8A_EXPECT(span.n >= 1 && span.n <= I8A_CHUNK);
            attend(&q, &span, scratch, &st);
        }
    }
}

/* An item of the chunk form: chunk vi of kv head g for all its rows, or (vi == nvis) its
 * window; the kv head's last item to finish folds them. */
static void chunk_item(const decode_job *job, size_t g, size_t vi, size_t worker,
                       const i8a_span *next)
{
    char *scratch = job->base + job->L.workers + worker * job->L.worker_bytes;
    atomic_size_t *left = (atomic_size_t *)(job->base + job->L.left);
    ensure_prepared(job, g);
    const uint64_t t0 = i8a_prof_start();
    if (vi == job->L.nvis) {
        const state_slots win = window_slots(job, g);
        i8a_window_rows(job, g, 0, job->L.rows, scratch, &win);
        i8a_prof_add(I8A_PROF_WINDOW, t0, 1);
    } else {
        const state_slots slots = chunk_slots(job, g, vi);
        attend_chunk(job, g, vi, 0, job->L.rows, &slots, (float *)scratch,
                     (float *)(scratch + job->L.gather), next);
        i8a_prof_add(I8A_PROF_CODED, t0, 1);
    }
    if (atomic_fetch_sub_explicit(left + g, 1, memory_order_acq_rel) == 1)
        finish_head(job, g);
}

/* An item of the row form: kv head g's rows [r0, r1) prepared, started, folded over each
 * visible chunk in position order and then over the recent window, and finished, in the
 * worker's own states. */
static void row_item(const decode_job *job, size_t g, size_t r0, size_t r1, size_t worker,
                     const i8a_span *after)
{
    const i8a_cache *c = job->c;
    const size_t nvis = job->L.nvis;
    char *scratch = job->base + job->L.workers + worker * job->L.worker_bytes;
    const state_slots block = {scratch + job->L.block_states, job->L.state_bytes, r1 - r0, r0,
                               c->head_dim};
    ensure_prepared(job, g);
    uint64_t t0 = i8a_prof_start();
    prepare_rows(job, g, r0, r1);
    i8a_rows_begin(job, g, r0, r1);
    i8a_prof_add(I8A_PROF_PREPARE, t0, 1);
    for (size_t vi = 0; vi < nvis; vi++) {
        const i8a_span next = vi + 1 < nvis
            ? i8a_chunk_span(c, g, i8a_visible_chunk(&job->L.runs, vi + 1))
            : c->recent ? i8a_window_span(c, g) : *after;
        t0 = i8a_prof_start();
        attend_chunk(job, g, vi, r0, r1, &block, (float *)scratch,
                     (float *)(scratch + job->L.gather), &next);
        i8a_prof_add(I8A_PROF_CODED, t0, 1);
        t0 = i8a_prof_start();
        i8a_rows_fold(job, g, r0, r1, &block, job->L.parts);
        i8a_prof_add(I8A_PROF_FINISH, t0, 1);
    }
    t0 = i8a_prof_start();
    if (c->recent) {
        i8a_window_rows(job, g, r0, r1, scratch, &block);
        i8a_rows_fold(job, g, r0, r1, &block, 1);
    }
    i8a_prof_add(I8A_PROF_WINDOW, t0, 1);
    t0 = i8a_prof_start();
    i8a_rows_end(job, g, r0, r1);
    i8a_prof_add(I8A_PROF_FINISH, t0, 1);
}

/* Items [begin, end) of a decode. The chunk form: first every (kv head, visible chunk), kv head
 * by kv head, then every kv head's recent window. The windows come last so that each chunk
 * prefetches the next one (across kv heads too) as in a cache without a window; a window
 * between two chunks broke that chain, and the chunk after it started cold (3-4% at 2048
 * tokens, one thread). The last chunk prefetches the first window. The row form: the blocks of
 * rows, kv head by kv head. */
static void decode_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    const decode_job *job = (const decode_job *)ctx;
    const size_t hkv = job->c->n_kv_heads, nvis = job->L.nvis, chunks = hkv * nvis;
    for (size_t item = begin; item < end; item++) {
        const i8a_span next = item_span(job, item + 1 < end ? item + 1 : after);
        if (job->L.row_block) {
            const size_t g = item / job->L.per_head, r0 = item % job->L.per_head * job->L.row_block;
            const size_t r1 = r0 + job->L.row_block < job->L.rows ? r0 + job->L.row_block
                                                                  : job->L.rows;
            row_item(job, g, r0, r1, worker, &next);
        } else if (item < chunks) {
            chunk_item(job, item / nvis, item % nvis, worker, &next);
        } else {
            chunk_item(job, item - chunks, nvis, worker, &next);
        }
    }
}

float i8a_q_limit(float scale)
{
    /* |q| may reach I8A_VALUE_MAX and I8A_QSCALE_MAX / scale, whichever is lower: the largest
     * float not above it (a float q is at most x exactly when it is at most that float) */
    double most = (double)I8A_QSCALE_MAX / (double)scale;
    most = most < (double)I8A_VALUE_MAX ? most : (double)I8A_VALUE_MAX;
    float limit = (float)most;
    if ((double)limit > most)
        limit = nextafterf(limit, 0.0f);
    return limit;
}

int i8a_check_query(const float *q, size_t d, float limit)
{
    if (within(q, d, limit))
        return 0;
    return in_range(q, d) ? 2 : 1;
}

/* Set up job for a decode of cache c by its plan L: its workspace, every q row checked (in
 * order, so that *bad is the first bad row), the chunk counters and the kv heads' prepared
 * flags (the rows are prepared by the items: ensure_prepared). Returns 0, or i8a_decode's
 * codes with *bad the q row. */
static int prepare(const i8a_kernels *kt, i8a_cache *c, const void *q, int q_type, size_t t,
                   size_t h, const i8a_options *opt, const i8a_plan L, float *out,
                   decode_job *job, size_t *bad)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, nq = h / hkv;
    I8A_EXPECT(t >= 1 && t <= c->length && h >= hkv && h % hkv == 0);
    if (i8a_reserve_work(c, L.end) != 0)
        return 3;
    const decode_job init = {kt, c, opt, (char *)c->work, L, t, h, nq, q, q_type, out};
    *job = init;
    const float q_limit = i8a_q_limit(opt->scale);
    for (size_t row = 0; row < t * h; row++) {
        float wide[I8A_MAX_HEAD_DIM];
        const int refused = i8a_check_query(i8a_row_f32(q, row, d, q_type, wide), d, q_limit);
        if (refused) {
            *bad = row;
            return refused;
        }
    }
    atomic_size_t *left = (atomic_size_t *)(job->base + L.left);
    atomic_int *prepared = (atomic_int *)(job->base + L.prep);
    for (size_t g = 0; g < hkv; g++) {
        atomic_init(left + g, L.per_head);
        atomic_init(prepared + g, 0);
    }
    return 0;
}

/* The items of a batch: cache b's (kv head, chunk) items are [first[b], first[b + 1]). */
typedef struct {
    const decode_job *jobs;
    const size_t *first;
} batch_job;

static void batch_range(void *ctx, size_t begin, size_t end, size_t after, size_t worker)
{
    const batch_job *batch = (const batch_job *)ctx;
    size_t b = 0;
    while (batch->first[b + 1] <= begin)
        b++;
    while (begin < end) {
        const size_t lo = batch->first[b], hi = batch->first[b + 1];
        const size_t stop = end < hi ? end : hi;
        const size_t then = stop < end ? stop : after;          /* the next item, if this cache's */
        decode_range((void *)&batch->jobs[b], begin - lo, stop - lo,
                     then >= lo && then < hi ? then - lo : hi - lo, worker);
        begin = stop;
        b++;
    }
}

int i8a_decode_views(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const void *q,
                     int q_type, size_t t, const size_t *ts, size_t h, const i8a_options *opt,
                     size_t max_threads, float *out, size_t *bad, i8a_cache *owner)
{
    I8A_EXPECT(n >= 1);
    I8A_EXPECT(opt->scale > 0.0f && opt->scale <= FLT_MAX);
    I8A_EXPECT(opt->q_bits == 16 || opt->q_bits == 8);
    I8A_EXPECT(opt->window ? opt->sinks <= opt->window : opt->sinks == 0);
    I8A_EXPECT(opt->softcap == 0.0f || (opt->softcap >= 0x1p-126f && opt->softcap <= 0x1p126f));
    I8A_EXPECT(max_threads >= 1);
    const uint64_t t_setup = i8a_prof_start();
    decode_job stack_jobs[I8A_BATCH_STACK];
    size_t stack_first[I8A_BATCH_STACK + 1];
    decode_job *jobs = stack_jobs;
    size_t *first = stack_first;
    if (n > I8A_BATCH_STACK) {
        jobs = (decode_job *)malloc(n * sizeof *jobs);
        first = (size_t *)malloc((n + 1) * sizeof *first);
        if (!jobs || !first) {
            free(jobs);
            free(first);
            return 3;
        }
    }
    /* one thread count for the whole batch, from the work of all its caches (a batch of one
     * runs its plan's own count) */
    size_t work = 0;
    first[0] = 0;
    for (size_t b = 0; b < n; b++) {
        jobs[b].L = i8a_plan_decode(cs[b], ts ? ts[b] : t, h, opt, max_threads);
        work += jobs[b].L.work;
        first[b + 1] = first[b] + jobs[b].L.items;
    }
    const size_t threads = i8a_threads_for(work, first[n], max_threads);
    size_t total = 0;       /* the workspaces, each 64-byte aligned */
    for (size_t b = 0; b < n; b++) {
        jobs[b].L = i8a_plan_with_threads(jobs[b].L, threads);
        total += i8a_align64(jobs[b].L.end);
    }
    int rc = 0;
    if (owner) {            /* one workspace, the owner's, cut into the caches' */
        rc = i8a_reserve_work(owner, total) != 0 ? 3 : 0;
        for (size_t b = 0, at = 0; b < n && rc == 0; b++) {
            cs[b]->work = (char *)owner->work + at;
            cs[b]->work_bytes = jobs[b].L.end;
            at += i8a_align64(cs[b]->work_bytes);
        }
    }
    size_t row = 0;         /* cache b's first q row: the earlier caches' t * h */
    for (size_t b = 0; b < n && rc == 0; b++) {
        const size_t tb = ts ? ts[b] : t;
        I8A_EXPECT(cs[b]->head_dim == cs[0]->head_dim && cs[b]->n_kv_heads == cs[0]->n_kv_heads);
        const size_t at = row * cs[0]->head_dim;
        const void *qb = (const char *)q + at * (q_type == I8A_F32 ? sizeof(float) : 2);
        rc = prepare(kt, cs[b], qb, q_type, tb, h, opt, jobs[b].L, out + at, &jobs[b], bad);
        if (rc != 0 && rc != 3)
            *bad += row;
        row += tb * h;
    }
    if (rc == 0) {
        for (size_t b = 0; b < n; b++)              /* a cache whose queries see only position 0 */
            if (jobs[b].L.per_head == 0)
                for (size_t g = 0; g < cs[b]->n_kv_heads; g++) {
                    ensure_prepared(&jobs[b], g);
                    finish_head(&jobs[b], g);
                }
        i8a_prof_add(I8A_PROF_SETUP, t_setup, 1);
        const batch_job batch = {jobs, first};
        const uint64_t t_pool = i8a_prof_start();
        if (first[n])
            i8a_prof_add(I8A_PROF_POOL, t_pool,
                         i8a_pool_run(first[n], threads, batch_range, (void *)&batch));
    }
    if (n > I8A_BATCH_STACK) {
        free(jobs);
        free(first);
    }
    return rc;
}

int i8a_decode_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *q,
                     size_t t, size_t h, const i8a_options *opt, size_t max_threads, float *out,
                     size_t *bad)
{
    return i8a_decode_views(kt, cs, n, q, I8A_F32, t, NULL, h, opt, max_threads, out, bad, NULL);
}

int i8a_decode(const i8a_kernels *kt, i8a_cache *c, const float *q, size_t t, size_t h,
               const i8a_options *opt, size_t max_threads, float *out, size_t *bad)
{
    return i8a_decode_batch(kt, &c, 1, q, t, h, opt, max_threads, out, bad);
}
