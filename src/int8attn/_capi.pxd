# cython: language_level=3
"""The C declarations the compiled front end (_cache.pyx) uses: the tier table (_simd/dispatch.h),
the engine's public API (_engine.h), the atomics (_guard.h) and the pool's limits (_pool.h).
Only what the front end reads is declared; the headers are the reference."""

from libc.stdint cimport int8_t, uint8_t, uint16_t, uint64_t


cdef extern from "_simd/dispatch.h" nogil:
    enum:
        I8A_CHUNK
        I8A_MAX_HEAD_DIM
        I8A_V_TILE
        I8A_K4_GROUP
        I8A_NIB_BLOCK
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
        const float *ks
        const float *vs
        size_t n
        size_t v_lead
        const int8_t *next_k
        const int8_t *next_v
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


cdef extern from "_engine.h" nogil:
    enum:
        I8A_OFFSET_MIN_ROWS
        I8A_RECENT_MAX
    float I8A_VALUE_MAX
    float I8A_QSCALE_MAX
    ctypedef struct i8a_cache:               # (the fields the front end reads)
        size_t n_kv_heads, max_seq, head_dim, length
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
    int i8a_import(const i8a_kernels *kt, i8a_cache *c, const i8a_rows *r)
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
        size_t q_lo, c_hi, c_lo, bias, pos0_logit, q_float, v_pos0, residual, left, run_m, run_l
        size_t states, windows, workers, end
        size_t state_bytes, worker_bytes
    i8a_plan i8a_plan_decode(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                             size_t max_threads)
    int i8a_decode_batch(const i8a_kernels *kt, i8a_cache *const *cs, size_t n, const float *q,
                         size_t t, size_t h, const i8a_options *opt, size_t max_threads,
                         float *out, size_t *bad)
    void i8a_dequantize(const i8a_kernels *kt, const i8a_cache *c, float *k, float *v)
    void i8a_evict(const i8a_kernels *kt, i8a_cache *c, size_t n)
    uint64_t i8a_stream_read(const i8a_probe *probe, const i8a_cache *c, size_t threads)


cdef extern from "_guard.h" nogil:
    int i8a_try_acquire(int *flag)
    void i8a_release(int *flag)
    const i8a_kernels *i8a_load_tier(const i8a_kernels **slot)
    void i8a_store_tier(const i8a_kernels **slot, const i8a_kernels *tier)
    size_t i8a_load_size(const size_t *slot)
    void i8a_store_size(size_t *slot, size_t value)


cdef extern from "_pool.h" nogil:
    enum:
        I8A_MAX_THREADS
    size_t i8a_cpus_available()
