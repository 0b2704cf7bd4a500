# cython: language_level=3
"""The C declarations the compiled front end (_cache.pyx) uses: the tier table (_simd/dispatch.h),
the engine's public API (_engine.h), the atomics (_guard.h) and the pool's limits (_pool.h).
Only what the front end reads is declared; the headers are the reference. At the end, the
inline helpers that fill these structs from numpy arrays."""

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "_simd/dispatch.h" nogil:
    enum:
        I8A_CHUNK
        I8A_MAX_HEAD_DIM
        I8A_V_TILE
        I8A_K4_GROUP
        I8A_NIB_BLOCK
        I8A_FMT8
        I8A_ONE_BLOCK_SHIFT
    const int32_t i8a_one_block[1]
    ctypedef struct i8a_query:
        size_t d, nq
        int two_planes
        const int8_t *q_hi
        const int8_t *q_lo
        const float *c_hi
        const float *c_lo
        float softcap, inv_softcap
        const float *bias
    ctypedef struct i8a_span:
        const int8_t *k
        const int8_t *v
        const int32_t *blocks
        size_t block_bytes
        unsigned block_shift
        size_t lead, vlead
        const float *ks
        const float *vs
        size_t n
        size_t v_lead
        const int8_t *next_k
        const int8_t *next_v
        const int32_t *next_blocks
        size_t next_n
        const uint8_t *k4
        const uint8_t *v4
    ctypedef struct i8a_state:
        float *m
        float *l
        float *o
    ctypedef struct i8a_kernels:
        const char *name
        unsigned requires
        int (*quantize_row)(const float *x, size_t d, int8_t *codes, float *scale) noexcept nogil
        void (*attend[2][2])(const i8a_query *q, const i8a_span *kv, float *scratch,
                             const i8a_state *out) noexcept nogil
        void (*rotate)(const float *x, size_t d, const float *sign, int inverse,
                       float *y) noexcept nogil
        float (*half_row)(const float *x, size_t d, uint16_t *h) noexcept nogil
    ctypedef struct i8a_probe:
        const char *name
    const i8a_kernels i8a_tiers[]
    const i8a_probe i8a_probes[]
    unsigned i8a_cpu_features()
    int i8a_amx_status()


cdef extern from "_engine.h" nogil:
    enum:
        I8A_OFFSET_MIN_ROWS
        I8A_RECENT_MAX
    float I8A_VALUE_MAX
    float I8A_QSCALE_MAX
    ctypedef struct i8a_cache:               # (the fields the front end reads)
        size_t n_kv_heads, max_seq, head_dim, length, ring
        int offsets_set
        float *v_scale
    ctypedef struct i8a_format:
        size_t n_kv_heads, max_seq, head_dim
        int k_bits, v_bits, keep_first, center
        size_t recent
    enum:
        I8A_BUFFERS
    ctypedef struct i8a_buffer:
        const char *name
        char type
        size_t item, ndim
        size_t shape[4]
        size_t bytes
        int zeroed
    int i8a_store_layout(const i8a_format *f, i8a_buffer *buf, size_t *total)
    void i8a_store_bind(i8a_cache *c, const i8a_format *f, void **mem, const float *sign)
    ctypedef struct i8a_rows:
        size_t length, held
        int offsets_set
        int8_t *k_i8
        int8_t *v_i8
        float *k_scale
        float *v_scale
        uint8_t *k_codes
        uint8_t *v_codes
        float *k_group_min
        float *k_group_step
        float *v_min
        float *k_first
        float *v_first
        float *k_offset
        float *v_offset
        float *k_recent
        float *v_recent
    size_t i8a_rows_held(const i8a_cache *c)
    void i8a_export(const i8a_cache *c, i8a_rows *r)
    int i8a_import(const i8a_kernels *kt, i8a_cache *c, const i8a_rows *r, int round_window,
                   size_t *bad)
    void i8a_tile_rows(const int8_t *rows, size_t n, size_t d, size_t lead, int8_t *tiles)
    ctypedef struct i8a_options:
        float scale
        int q_bits
        size_t window, sinks
        float softcap
    void i8a_cache_free_work(i8a_cache *c)
    size_t i8a_k4_groups(size_t cap)
    void *i8a_alloc_aligned(size_t bytes)
    void i8a_free_aligned(void *p)
    void i8a_rotation_signs(uint64_t seed, size_t d, float *sign)
    int i8a_append(const i8a_kernels *kt, i8a_cache *c, const float *k, const float *v,
                   size_t t, size_t *bad)
    void i8a_truncate(const i8a_kernels *kt, i8a_cache *c, size_t n)
    ctypedef struct i8a_chunk_runs:
        size_t begin[2]
        size_t count[2]
    ctypedef struct i8a_plan:
        i8a_chunk_runs runs
        size_t nvis, rows, parts, per_head, items, work, threads
        size_t q_lo, c_hi, c_lo, bias, pos0_logit, q_float, v_pos0, prep, left, run_m, run_l
        size_t states, windows, workers, end
        size_t state_bytes, worker_bytes
    i8a_plan i8a_plan_decode(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                             size_t max_threads)
    int i8a_decode_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *q,
                         size_t t, size_t h, const i8a_options *opt, size_t max_threads,
                         float *out, size_t *bad)
    int i8a_prefill_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *k,
                          const float *v, const float *q, size_t t, size_t h,
                          const i8a_options *opt, size_t max_threads, float *out, size_t *bad)
    void i8a_dequantize(const i8a_kernels *kt, const i8a_cache *c, float *k, float *v)
    void i8a_evict(const i8a_kernels *kt, i8a_cache *c, size_t n)
    uint64_t i8a_stream_read(const i8a_probe *probe, const i8a_cache *c, size_t threads)
    enum: I8A_PROF_PARTS
    void i8a_profile(int on)
    void i8a_profile_read(uint64_t *ns, uint64_t *count)
    ctypedef struct i8a_open_entry:
        int32_t block
        uint32_t first, top
        uint64_t stamp
    ctypedef struct i8a_paged:
        size_t blocks, n_kv_heads, head_dim, block_rows, block_bytes, open_cap
    ctypedef struct i8a_paged_seq:
        const int32_t *blocks
        size_t length, t
    size_t i8a_paged_block_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows)
    void i8a_paged_init(i8a_paged *p, uint8_t *base, size_t blocks, size_t n_kv_heads,
                        size_t head_dim, size_t block_rows, const float *sign)
    void i8a_paged_free_work(i8a_paged *p)
    size_t i8a_paged_open_bytes(size_t n_kv_heads, size_t head_dim, size_t block_rows)
    void i8a_paged_open(i8a_paged *p, size_t cap, uint16_t *k, uint16_t *v, float *ks,
                        float *vs, int32_t *of, i8a_open_entry *entries, float *first_k,
                        float *first_v, uint8_t *first_held)
    enum: I8A_F32, I8A_BF16, I8A_F16
    void i8a_narrow(const float *x, size_t n, int type, uint16_t *y)
    int i8a_paged_write(const i8a_kernels *kt, i8a_paged *p, const int64_t *slots,
                        size_t n, const void *k, const void *v, int type, size_t max_threads,
                        size_t *bad)
    int i8a_paged_attend(const i8a_kernels *kt, i8a_paged *p, const i8a_paged_seq *seqs,
                         size_t n, const void *q, int q_type, size_t h, const i8a_options *opt,
                         size_t max_threads, float *out, size_t *bad)
    void i8a_paged_dequantize(const i8a_kernels *kt, const i8a_paged *p, const int32_t *blocks,
                              size_t length, float *k, float *v)


cdef extern from "_guard.h" nogil:
    int i8a_try_acquire(int *flag)
    void i8a_release(int *flag)
    int i8a_is_taken(const int *flag)
    const i8a_kernels *i8a_load_tier(const i8a_kernels **slot)
    void i8a_store_tier(const i8a_kernels **slot, const i8a_kernels *tier)
    size_t i8a_load_size(const size_t *slot)
    void i8a_store_size(size_t *slot, size_t value)


cdef extern from "_pool.h" nogil:
    enum:
        I8A_MAX_THREADS
    size_t i8a_cpus_available()
    int i8a_pool_uses_openmp()


# -- numpy arrays into the structs above ------------------------------------------------------

cdef inline void *_ptr(a):
    """The data of a C-contiguous numpy array (its owner keeps it alive); NULL for None."""
    return NULL if a is None else <void *><size_t>a.ctypes.data


cdef inline _point(i8a_rows *r, dict a):
    """r's arrays at the C-contiguous arrays of a, by name (NULL for a name a lacks)."""
    get = a.get
    r.k_i8, r.v_i8 = <int8_t *>_ptr(get("k_i8")), <int8_t *>_ptr(get("v_i8"))
    r.k_codes, r.v_codes = <uint8_t *>_ptr(get("k_codes")), <uint8_t *>_ptr(get("v_codes"))
    r.k_scale, r.v_scale = <float *>_ptr(get("k_scale")), <float *>_ptr(get("v_scale"))
    r.v_min = <float *>_ptr(get("v_min"))
    r.k_group_min = <float *>_ptr(get("k_group_min"))
    r.k_group_step = <float *>_ptr(get("k_group_step"))
    r.k_first, r.v_first = <float *>_ptr(get("k_first")), <float *>_ptr(get("v_first"))
    r.k_offset, r.v_offset = <float *>_ptr(get("k_offset")), <float *>_ptr(get("v_offset"))
    r.k_recent, r.v_recent = <float *>_ptr(get("k_recent")), <float *>_ptr(get("v_recent"))


cdef inline i8a_format _format_of(size_t hkv, size_t cap, size_t d, int k_bits, int v_bits,
                           bint keep_first, bint center, size_t recent):
    cdef i8a_format f
    f.n_kv_heads, f.max_seq, f.head_dim, f.k_bits, f.v_bits = hkv, cap, d, k_bits, v_bits
    f.keep_first, f.center, f.recent = keep_first, center, recent
    return f


cdef inline i8a_options _no_options():
    """The options of a plain decode: scale 1, q_bits 16, no window, sinks or soft cap."""
    cdef i8a_options opt
    opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = 1.0, 16, 0, 0, 0.0
    return opt
