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

/* The states of query rows [r, r + nq) of kv head g (one query position's heads: they see the
 * same positions, vis) over the positions of the recent window they see, from its halves (the
 * tier's attend_float, which widens each row once for the heads); each o is then rotated into
 * the stored space, minus l * v_offset when `off` (as the coded rows' states are). scratch:
 * i8a_window_scratch_bytes(c->recent) bytes, 64-byte aligned. Returns 0 when the rows see none
 * of the window (st untouched). */
static int window_state(const decode_job *job, size_t g, size_t r, size_t nq,
                        const visible_ranges *vis, int off, const i8a_state *st, char *scratch)
{
    const i8a_cache *c = job->c;
    const size_t d = c->head_dim, sinks = job->opt->sinks, most = c->recent;
    const float *qf = (const float *)(job->base + job->L.q_float) + (g * job->L.rows + r) * d;
    const uint16_t **kr = (const uint16_t **)(void *)(scratch + WIN_KR(most));
    const uint16_t **vr = (const uint16_t **)(void *)(scratch + WIN_VR(most));
    float *ks = (float *)(void *)(scratch + WIN_KS(most));
    float *vs = (float *)(void *)(scratch + WIN_VS(most));
    float *logit = (float *)(void *)(scratch + WIN_LOGIT(most));
    size_t n = 0;
    size_t s = slot_of(c, vis->fw);                         /* p's slot, stepped along */
    for (size_t p = vis->fw; p < vis->end; p++, s = s + 1 < c->ring ? s + 1 : 0) {
        if (p < vis->lo && p >= sinks)
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
    const i8a_float_rows rows = {kr, vr, ks, vs, n};
    job->kt->attend_float(qf, nq, &rows, d, job->opt->softcap, logit, st);
    for (size_t j = 0; j < nq; j++) {
        float *o = st->o + j * d;
        if (c->v_sign)
            job->kt->rotate(o, d, c->v_sign, 0, o);
        if (off)
            for (size_t i = 0; i < d; i++)
                o[i] = o[i] - st->l[j] * c->v_offset[g * d + i];
    }
    return 1;
}

/* Whether query row r's output takes the V offset back: the cache's offsets hold and the row
 * saw coded positions (its window's state is taken minus l * v_offset to match). */
static int row_offset(const i8a_cache *c, const visible_ranges *vis)
{
    return has_offsets(c) && sees_codes(vis);
}

void i8a_window_rows(const decode_job *job, size_t g, size_t r0, size_t r1, char *scratch,
                     const state_slots *dest)
{
    const size_t nq = job->nq;
    for (size_t r = r0; r < r1; r += nq) {              /* a query position's heads at once */
        const visible_ranges vis = i8a_visible(job->c, job->t, r / nq, job->opt);
        const i8a_state st = slot_state(dest, 0, r);
        if (!window_state(job, g, r, nq, &vis, row_offset(job->c, &vis), &st, scratch))
            for (size_t j = 0; j < nq; j++)
                st.m[j] = -INFINITY;
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
