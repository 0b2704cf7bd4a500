/* The plan of a decode (i8a_plan_decode): which positions each query sees, the chunks that
 * makes visible, the thread count from the cost model, and the workspace's layout. Reads the
 * cache's length and format, never its rows. */
#include "internal.h"

size_t i8a_window_start(const i8a_cache *c)
{
    return window_start(c);
}

static size_t clip(size_t x, size_t lo, size_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

visible_ranges i8a_visible(const i8a_cache *c, size_t t, size_t tt, const i8a_options *opt)
{
    const size_t end = c->length - t + tt + 1;              /* the query's position + 1 */
    const size_t lo = opt->window && end > opt->window ? end - opt->window : 0;
    const size_t e = coded_from(c), fw = float_start(c, end);
    visible_ranges v = {0, 0, lo, end, 0, lo, end, fw};
    if (opt->sinks >= lo)
        v.win_begin = 0;                                    /* the sinks join the window */
    else
        v.sink_end = opt->sinks;
    v.pos0 = e && (v.win_begin == 0 || v.sink_end > 0);
    /* the coded ranges: within [e, fw) (empty ranges collapse to begin == end) */
    v.sink_end = clip(v.sink_end, e, fw);
    v.sink_begin = clip(v.sink_begin, e, v.sink_end);
    v.win_end = clip(v.win_end, e, fw);
    v.win_begin = clip(v.win_begin, e, v.win_end);
    return v;
}

i8a_chunk_runs i8a_visible_chunks(const i8a_cache *c, size_t t, const i8a_options *opt)
{
    const visible_ranges v0 = i8a_visible(c, t, 0, opt), vl = i8a_visible(c, t, t - 1, opt);
    i8a_chunk_runs runs = {{0, 0}, {0, 0}};
    size_t k = 0;
    if (vl.sink_begin < vl.sink_end) {
        runs.begin[0] = vl.sink_begin / I8A_CHUNK;
        runs.count[0] = (vl.sink_end - 1) / I8A_CHUNK + 1 - runs.begin[0];
        k = 1;
    }
    const size_t fw = window_start(c);
    if (v0.win_begin < fw) {
        size_t b = v0.win_begin / I8A_CHUNK, e = (fw - 1) / I8A_CHUNK + 1;
        if (k && b <= runs.begin[0] + runs.count[0]) {      /* meets the sinks' run: one run */
            runs.count[0] = e - runs.begin[0];
        } else {
            runs.begin[k] = b;
            runs.count[k] = e - b;
        }
    }
    return runs;
}

/* Work per thread below which another thread costs more than it saves, in kv rows of 128
 * dims times (1 + query rows per kv head) / 2 (each query row of a group adds a dot and an
 * accumulation), a row of the recent window counting as I8A_WINDOW_ROW_COST coded rows.
 * Measured on the 2-core development VM (avx512_vnni): H = Hkv = 8, D = 128 gains from a
 * second thread at 256 tokens (19 -> 15 us) and loses at 128 (10.5 -> 11.4 us). */
#define I8A_ROWS_PER_THREAD 1024

/* A row of the recent window against a coded row, in time: its float dots and sums take about
 * twice a coded row's (one chunk against one window, D = 128, avx512_vnni: 39 against 19
 * cycles a row at 1 head a group, 106 against 58 at 4). */
#define I8A_WINDOW_ROW_COST 2

size_t i8a_work_of(const i8a_cache *c, size_t t, size_t h, size_t nvis)
{
    const size_t hkv = c->n_kv_heads, rows_per_kv = t * (h / hkv);
    const size_t fw = window_start(c), chunked = nvis * I8A_CHUNK;
    const size_t rows = (chunked < fw ? chunked : fw) + I8A_WINDOW_ROW_COST * (c->length - fw);
    return hkv * rows * (c->head_dim / 16) * (1 + rows_per_kv) / 16;
}

size_t i8a_threads_for(size_t work, size_t items, size_t max_threads)
{
    size_t n = work / I8A_ROWS_PER_THREAD;
    n = n < 1 ? 1 : n;
    n = n < max_threads ? n : max_threads;
    return n < items ? n : (items ? items : 1);
}

/* Query rows per kv head from which a decode takes the row form (i8a_plan: items of whole
 * blocks of rows, each attending its chunks in order), and the rows of such a block. Below,
 * the chunk form splits a long history of few rows over the threads, a chunk an item, and keeps
 * each chunk's state of every row until the kv head's last item folds them: for a prefill's
 * rows (a view of 128 queries over thousands of positions) those states were the workspace's
 * bulk (rows x chunks x head_dim floats: 1 GiB for 4096 queries of 32/8 x 128 over 4096
 * positions) and the fold a second pass over them. A block of 128 rows shares each transposed K
 * tile between them (the tiled K pass) as a chunk item's rows do. */
#define I8A_ROW_FORM_ROWS 64
#define I8A_ROW_BLOCK 128

i8a_plan i8a_plan_with_threads(i8a_plan L, size_t threads)
{
    L.threads = threads;
    L.end = L.workers + threads * L.worker_bytes;
    return L;
}

i8a_plan i8a_plan_decode(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                         size_t max_threads)
{
    const size_t d = c->head_dim, f = sizeof(float), hkv = c->n_kv_heads;
    const size_t nq = h / hkv;
    i8a_plan L;
    L.rows = t * nq;
    L.parts = opt->window && opt->sinks ? 2 : 1;
    L.runs = i8a_visible_chunks(c, t, opt);
    L.nvis = L.runs.count[0] + L.runs.count[1];
    /* the row form: blocks of whole query positions, at least one position's heads */
    L.row_block = L.rows < I8A_ROW_FORM_ROWS ? 0
                  : nq >= I8A_ROW_BLOCK ? nq : (I8A_ROW_BLOCK / nq) * nq;
    L.per_head = L.row_block ? (L.rows + L.row_block - 1) / L.row_block
                             : L.nvis + (c->recent ? 1 : 0);
    L.items = hkv * L.per_head;
    L.work = i8a_work_of(c, t, h, L.nvis);
    const size_t attended = L.row_block ? L.row_block : L.rows;     /* rows of one attend */
    L.state_bytes = i8a_align64(attended * (d + 2) * f);
    L.gather = i8a_align64(2 * attended * I8A_CHUNK * f)
               + (has_four(c) ? i8a_align64(I8A_ATTEND4_EXTRA) : 0);
    L.worker_bytes = L.gather + (c->paged ? i8a_align64(2 * I8A_CHUNK * f) : 0);
    const size_t window_bytes = c->recent ? i8a_window_scratch_bytes(c->recent) : 0;
    L.worker_bytes = window_bytes > L.worker_bytes ? window_bytes : L.worker_bytes;
    L.block_states = L.worker_bytes;            /* the row form's block: after the scratch */
    if (L.row_block)
        L.worker_bytes += L.parts * L.state_bytes;
    const size_t qrows = hkv * L.rows;
    L.q_lo = i8a_align64(qrows * d);
    L.c_hi = L.q_lo + i8a_align64(qrows * d);
    L.c_lo = L.c_hi + i8a_align64(qrows * f);
    L.bias = L.c_lo + i8a_align64(qrows * f);
    L.pos0_logit = L.bias + i8a_align64(qrows * f);
    L.q_float = L.pos0_logit + i8a_align64(qrows * f);
    L.v_pos0 = L.q_float + (c->recent || c->k_bits == 4 ? i8a_align64(qrows * d * f) : 0);
    L.prep = L.v_pos0 + i8a_align64(hkv * d * f);
    L.left = L.prep + i8a_align64(hkv * sizeof(atomic_int));
    L.run_m = L.left + i8a_align64(hkv * sizeof(atomic_size_t));
    L.run_l = L.run_m + i8a_align64(qrows * f);
    L.states = L.run_l + i8a_align64(qrows * f);
    L.windows = L.states + (L.row_block ? 0 : hkv * L.nvis * L.parts * L.state_bytes);
    L.workers = L.windows + (c->recent && !L.row_block ? hkv * L.state_bytes : 0);
    return i8a_plan_with_threads(L, i8a_threads_for(L.work, L.items, max_threads));
}
