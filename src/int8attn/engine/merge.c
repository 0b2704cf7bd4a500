/* A kv head's query rows after its chunks: position 0 from its float row, the recent window
 * from its halves, every state folded in position order, normalized and rotated back. */
#include "internal.h"

#include <math.h>
#include <string.h>

/* The state of position 0 read from its float row (kept first position): m = the logit
 * (soft-capped when the cap is on), l = 1, o = v0 (its V row in the stored space), minus
 * v_offset when `off` (the offset then joins every row at the end). */
static void pos0_state(const decode_job *job, size_t g, size_t r, const float *v0, int off,
                       const i8a_state *run)
{
    const i8a_cache *c = job->c;
    const float lg = ((const float *)(job->base + job->L.pos0_logit))[g * job->L.rows + r];
    const float cap = job->opt->softcap;
    run->m[0] = cap > 0.0f ? i8a_softcap(lg, cap, 1.0f / cap) : lg;
    run->l[0] = 1.0f;
    for (size_t i = 0; i < c->head_dim; i++)
        run->o[i] = off ? v0[i] - c->v_offset[g * c->head_dim + i] : v0[i];
}

/* The parts of a window item's scratch for n <= recent rows, each at a 64-byte aligned offset:
 * the rows' K and V pointers, their K and V scales, and attend_float's logits. */
#define WIN_KR(n) 0
#define WIN_VR(n) (WIN_KR(n) + i8a_align64((n) * sizeof(void *)))
#define WIN_KS(n) (WIN_VR(n) + i8a_align64((n) * sizeof(void *)))
#define WIN_VS(n) (WIN_KS(n) + i8a_align64((n) * sizeof(float)))
#define WIN_LOGIT(n) (WIN_VS(n) + i8a_align64((n) * sizeof(float)))
#define WIN_END(n) (WIN_LOGIT(n) + i8a_align64(I8A_WIN_HEADS * (n) * sizeof(float)))

size_t i8a_window_scratch_bytes(size_t recent)
{
    return WIN_END(recent);     /* recent <= I8A_RECENT_MAX: at most 40 KiB and change */
}

/* Whether query row r's output takes the V offset back: the cache's offsets hold and the row
 * saw coded positions (its window's state is taken minus l * v_offset to match). */
static int row_offset(const i8a_cache *c, const visible_ranges *vis)
{
    return has_offsets(c) && sees_codes(vis);
}

/* Whether a query that sees vis reads every row of the recent window from vis->fw to its own
 * position: none cut out between the sinks and the sliding window's start (a position p is cut
 * when sinks <= p < lo). */
static int sees_window_run(const visible_ranges *vis, size_t sinks)
{
    return vis->lo <= vis->fw || vis->lo <= sinks;
}

/* Query rows one window state takes at most: np positions of nq heads (each widened row then
 * serves up to I8A_WIN_HEADS of them at a time, the tier's blocks). */
#define I8A_WIN_GROUP 32

/* The states of kv head g's query rows [r, r + np * nq): np query positions from r / nq (vis[i]:
 * what position i sees), each with its nq heads, over the rows of the recent window each sees,
 * from its halves (the tier's
 * attend_float). With np > 1 (window_group) the positions see runs from the same first row,
 * each one row longer than the one before: the rows are the last one's, a position the first
 * end - fw of them. Each o is then rotated into the stored space, minus l * v_offset where the
 * row saw coded positions (row_offset: as the coded rows' states are). scratch:
 * i8a_window_scratch_bytes(c->recent) bytes, 64-byte aligned. Returns 0 when the rows see none
 * of the window (st untouched; np is 1 then). */
static int window_state(const decode_job *job, size_t g, size_t r, size_t np,
                        const visible_ranges *vis, const i8a_state *st, char *scratch)
{
    const i8a_cache *c = job->c;
    const size_t d = c->head_dim, sinks = job->opt->sinks, most = c->recent, nq = job->nq;
    const float *qf = (const float *)(job->base + job->L.q_float) + (g * job->L.rows + r) * d;
    const uint16_t **kr = (const uint16_t **)(void *)(scratch + WIN_KR(most));
    const uint16_t **vr = (const uint16_t **)(void *)(scratch + WIN_VR(most));
    float *ks = (float *)(void *)(scratch + WIN_KS(most));
    float *vs = (float *)(void *)(scratch + WIN_VS(most));
    float *logit = (float *)(void *)(scratch + WIN_LOGIT(most));
    const visible_ranges last = vis[np - 1];
    size_t n = 0;
    size_t s = slot_of(c, last.fw);                         /* p's slot, stepped along */
    for (size_t p = last.fw; p < last.end; p++, s = s + 1 < c->ring ? s + 1 : 0) {
        if (p < last.lo && p >= sinks)
            continue;
        if (n == most) {        /* never: the window holds at most recent visible rows */
            I8A_EXPECT(n < most);
            break;              /* (the bound of the scratch, whatever the build) */
        }
        const size_t at = g * c->ring + s;
        kr[n] = c->k_recent + at * d, vr[n] = c->v_recent + at * d;
        ks[n] = c->k_rscale[at], vs[n++] = c->v_rscale[at];
    }
    if (n == 0)
        return 0;
    size_t seen[I8A_WIN_GROUP];             /* np > 1: n >= np (the first sees one row) */
    for (size_t i = 0; np > 1 && i < np * nq; i++)
        seen[i] = n - (np - 1 - i / nq);
    const i8a_float_rows rows = {kr, vr, ks, vs, n, np > 1 ? seen : NULL};
    job->kt->attend_float(qf, np * nq, &rows, d, job->opt->softcap, logit, st);
    for (size_t i = 0; i < np; i++) {
        const int off = row_offset(c, &vis[i]);
        for (size_t j = i * nq; j < (i + 1) * nq; j++) {
            float *o = st->o + j * d;
            if (c->v_sign)
                job->kt->rotate(o, d, c->v_sign, 0, o);
            if (off)
                for (size_t e = 0; e < d; e++)
                    o[e] = o[e] - st->l[j] * c->v_offset[g * d + e];
        }
    }
    return 1;
}

/* The query positions from r / nq that one window state takes (rows [r, r1) whole positions),
 * what each sees in vis[0, np) (vis: I8A_WIN_GROUP entries): 1, or a run of positions that see
 * the window from the same first row, each one row further than the one before, at most
 * I8A_WIN_GROUP rows (a prefill's queries in their own block). */
static size_t window_group(const decode_job *job, size_t r, size_t r1, visible_ranges *vis)
{
    const size_t nq = job->nq, sinks = job->opt->sinks;
    vis[0] = i8a_visible(job->c, job->t, r / nq, job->opt);
    if (!sees_window_run(&vis[0], sinks) || vis[0].fw >= vis[0].end)
        return 1;
    size_t np = 1;
    while (r + (np + 1) * nq <= r1 && (np + 1) * nq <= I8A_WIN_GROUP) {
        vis[np] = i8a_visible(job->c, job->t, r / nq + np, job->opt);
        if (!sees_window_run(&vis[np], sinks) || vis[np].fw != vis[0].fw
            || vis[np].end != vis[0].end + np)
            break;
        np++;
    }
    return np;
}

void i8a_window_rows(const decode_job *job, size_t g, size_t r0, size_t r1, char *scratch,
                     const state_slots *dest)
{
    const size_t nq = job->nq;
    for (size_t r = r0; r < r1;) {                      /* whole query positions at once */
        visible_ranges vis[I8A_WIN_GROUP];
        const size_t np = window_group(job, r, r1, vis);
        const i8a_state st = slot_state(dest, 0, r);
        if (!window_state(job, g, r, np, vis, &st, scratch))
            for (size_t j = 0; j < nq; j++)
                st.m[j] = -INFINITY;
        r += np * nq;
    }
}

/* Row r of kv head g's running state: run_m, run_l and its row of out. */
static i8a_state running(const decode_job *job, size_t g, size_t r)
{
    const size_t tt = r / job->nq, j = r % job->nq, at = g * job->L.rows + r;
    const i8a_state run = {(float *)(job->base + job->L.run_m) + at,
                           (float *)(job->base + job->L.run_l) + at,
                           job->out + (tt * job->h + g * job->nq + j) * job->c->head_dim};
    return run;
}

void i8a_rows_begin(const decode_job *job, size_t g, size_t r0, size_t r1)
{
    const i8a_cache *c = job->c;
    const float *v0 = (const float *)(job->base + job->L.v_pos0) + g * c->head_dim;
    for (size_t r = r0; r < r1; r++) {
        const i8a_state run = running(job, g, r);
        const visible_ranges vis = i8a_visible(c, job->t, r / job->nq, job->opt);
        if (vis.pos0)
            pos0_state(job, g, r, v0, row_offset(c, &vis), &run);
        else
            run.m[0] = -INFINITY;                       /* nothing yet */
    }
}

void i8a_rows_fold(const decode_job *job, size_t g, size_t r0, size_t r1,
                   const state_slots *states, size_t parts)
{
    for (size_t r = r0; r < r1; r++) {
        const i8a_state run = running(job, g, r);
        for (size_t part = 0; part < parts; part++) {
            const i8a_state st = slot_state(states, part, r);
            if (st.m[0] == -INFINITY)                   /* the row saw nothing there */
                continue;
            if (run.m[0] != -INFINITY) {
                job->kt->merge(&run, &st, job->c->head_dim);
            } else {                                    /* its first state */
                run.m[0] = st.m[0], run.l[0] = st.l[0];
                memcpy(run.o, st.o, job->c->head_dim * sizeof(float));
            }
        }
    }
}

void i8a_rows_end(const decode_job *job, size_t g, size_t r0, size_t r1)
{
    const i8a_cache *c = job->c;
    const size_t d = c->head_dim;
    for (size_t r = r0; r < r1; r++) {
        const i8a_state run = running(job, g, r);
        const visible_ranges vis = i8a_visible(c, job->t, r / job->nq, job->opt);
        float *o = run.o;
        const float inv = 1.0f / run.l[0];
        for (size_t i = 0; i < d; i++)
            o[i] = o[i] * inv;
        if (row_offset(c, &vis))
            for (size_t i = 0; i < d; i++)
                o[i] = o[i] + c->v_offset[g * d + i];
        if (c->v_sign)
            job->kt->rotate(o, d, c->v_sign, 1, o);         /* back from the rotated space */
    }
}

void i8a_finish_head(const decode_job *job, size_t g)
{
    const size_t rows = job->L.rows;
    i8a_rows_begin(job, g, 0, rows);
    for (size_t vi = 0; vi < job->L.nvis; vi++) {
        const state_slots chunk = chunk_slots(job, g, vi);
        i8a_rows_fold(job, g, 0, rows, &chunk, job->L.parts);
    }
    if (job->c->recent) {
        const state_slots win = window_slots(job, g);
        i8a_rows_fold(job, g, 0, rows, &win, 1);
    }
    i8a_rows_end(job, g, 0, rows);
}
