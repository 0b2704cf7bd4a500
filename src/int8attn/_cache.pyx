# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: freethreading_compatible=True
"""The compiled front end: KVCache (and Int8KVCache, its 8-bit form) owns the cache buffers and calls the engine with the GIL
released. Arguments are converted and checked by ``_args`` and files by ``_state`` (plain
Python), always with the cache's busy flag held; this module passes C what they return and
turns the engine's status into an exception. Public names are re-exported by ``int8attn``;
names starting with an underscore are private (tests and benchmarks use them)."""

from cython.view cimport array as cvarray
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

import os

import numpy as np

from . import _args
from . import _format as F
from . import _rules
from . import _state
from . import _tiers


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
        void (*attend)(const i8a_query *q, const i8a_span *kv, float *scratch,
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
    ctypedef struct i8a_cache:
        int8_t *k_codes
        int8_t *v_codes
        float *k_scale
        float *v_scale
        size_t n_kv_heads, max_seq, head_dim, length
        const float *k_sign
        const float *v_sign
        float *k_first
        float *v_first
        float *k_offset
        float *v_offset
        int offsets_set
        size_t recent, ring
        uint16_t *k_recent
        uint16_t *v_recent
        float *k_rscale
        float *v_rscale
        size_t ring_shift, held_from
        void *work
        size_t work_bytes
        int k_bits, v_bits
        uint8_t *k4
        uint16_t *k4_min
        uint16_t *k4_step
        float *k4_min_scale
        float *k4_step_scale
        uint8_t *v4
        float *v4_min
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
    size_t i8a_decode_threads(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
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


# the C limits are the ones _format states (its docstring)
for _name, _c_value in (("CHUNK", I8A_CHUNK), ("MAX_HEAD_DIM", I8A_MAX_HEAD_DIM), ("V_TILE", I8A_V_TILE),
                        ("K4_GROUP", I8A_K4_GROUP), ("NIB_BLOCK", I8A_NIB_BLOCK),
                        ("OFFSET_MIN_ROWS", I8A_OFFSET_MIN_ROWS), ("RECENT_MAX", I8A_RECENT_MAX),
                        ("VALUE_MAX", I8A_VALUE_MAX),
                        ("QSCALE_MAX", I8A_QSCALE_MAX), ("MAX_THREADS", I8A_MAX_THREADS)):
    if getattr(F, _name) != _c_value:
        raise ImportError(f"int8attn is built wrong: _format.{_name} is {getattr(F, _name)}, "
                          f"the compiled engine's {_c_value}")


# ---------------------------------------------------------------------------------------------
# Tiers: detected once at import; every call reads the active one from _kt.

cdef const i8a_kernels *_kt = NULL        # i8a_load_tier / i8a_store_tier
cdef dict _tier_index = {}


def _table_names(bint supported_only):
    cdef unsigned have = i8a_cpu_features()
    cdef int i = 0
    names = []
    while i8a_tiers[i].name != NULL:
        if not supported_only or (i8a_tiers[i].requires & have) == i8a_tiers[i].requires:
            names.append(i8a_tiers[i].name.decode())
        i += 1
    return tuple(names)


_COMPILED = _table_names(False)            # compiled into this build, best first
_SUPPORTED = _table_names(True)            # of those, the ones this CPU runs
for _i, _name in enumerate(_COMPILED):
    _tier_index[_name] = _i


def _compiled_isas():
    """Tiers compiled into this build, best first."""
    return _COMPILED


def _set_isa(str name):
    """Make `name` the active tier (it must be supported). Private: tests switch tiers with it."""
    if name not in _SUPPORTED:
        raise ValueError(f"ISA tier {name!r} is not supported on this CPU; supported: "
                         f"{', '.join(_SUPPORTED)}")
    i8a_store_tier(&_kt, &i8a_tiers[<int>_tier_index[name]])


def _requested_isa(environ):
    """The tier the environment asks for, or None for the best (see _tiers.requested)."""
    return _tiers.requested(environ, _COMPILED, _SUPPORTED)


_set_isa(_requested_isa(os.environ) or _SUPPORTED[0])


def isa():
    """Name of the active kernel tier, e.g. ``'avx2'`` or ``'neon_dotprod'``."""
    return i8a_load_tier(&_kt).name.decode()


def supported_isas():
    """Tiers this CPU can run, best first (``INT8ATTN_ISA`` may demote to any of them)."""
    return _SUPPORTED


# ---------------------------------------------------------------------------------------------
# Threads

cdef size_t _threads = 1                  # i8a_load_size / i8a_store_size


def set_num_threads(n):
    """Use at most n threads per decode (1 .. 256). The default is the number of CPUs this
    process may run on (its affinity mask), or INT8ATTN_NUM_THREADS when set. Results do not
    depend on it: the output is bit-identical for every thread count."""
    n = _args.as_int(n, "n")
    if not 1 <= n <= I8A_MAX_THREADS:
        raise ValueError(f"n must be from 1 to {I8A_MAX_THREADS}, got {n}")
    i8a_store_size(&_threads, n)


def get_num_threads():
    """The most threads a decode uses (short contexts use fewer, when that is faster)."""
    return i8a_load_size(&_threads)


i8a_store_size(&_threads, _tiers.threads_from_env(os.environ, i8a_cpus_available()))


# ---------------------------------------------------------------------------------------------

def _aligned_empty(shape, str fmt, size_t itemsize):
    """An uninitialized C-contiguous numpy array of `shape`, whose data the engine allocated at a
    64-byte boundary (exactly its bytes, which a sanitizer guards); freed with its last view."""
    cdef size_t n = itemsize
    for s in shape:
        n *= s
    cdef void *p = i8a_alloc_aligned(n)
    if p == NULL:
        raise MemoryError(f"cannot allocate {n} bytes for the cache's buffers")
    cdef cvarray a = cvarray(shape=tuple(shape), itemsize=itemsize, format=fmt, mode="c",
                             allocate_buffer=False)
    a.data = <char *>p
    a.callback_free_data = i8a_free_aligned
    return np.asarray(a)


cdef float *_data(object arr):
    """The first float of a C-contiguous [n, m] float32 array (which its owner keeps alive)."""
    cdef float[:, ::1] m = arr
    return &m[0, 0]


def _hold(rows, halves, scales, size_t ring):
    """Rows [n, Hkv, D] float32 into slots 0 .. n-1 of a ring side (halves [Hkv * ring, D],
    scales [Hkv, ring]) as appends put them there (the tier's half_row)."""
    cdef float[:, :, ::1] x = np.ascontiguousarray(rows, dtype=np.float32)
    cdef uint16_t[:, ::1] h = halves
    cdef float[:, ::1] s = scales
    cdef size_t n = x.shape[0], hkv = x.shape[1], d = x.shape[2], pos, g
    cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
    for pos in range(n):
        for g in range(hkv):
            s[g, pos] = kt.half_row(&x[pos, g, 0], d, &h[g * ring + pos, 0])


def _tile_count(size_t cap):
    """V tiles per kv head for a capacity of cap positions (F.V_TILE positions a tile)."""
    return (cap + F.V_TILE - 1) // F.V_TILE


def _untile(tiles, size_t n):
    """Positions 0 .. n-1 of V tiles [Hkv, T, D, V_TILE] (byte r of dimension i of tile t:
    position V_TILE t + r) as rows [Hkv, n, D], a new array."""
    hkv, t, d = tiles.shape[0], tiles.shape[1], tiles.shape[2]
    rows = tiles.transpose(0, 1, 3, 2).reshape(hkv, F.V_TILE * t, d)
    return np.ascontiguousarray(rows[:, :n])


def _tile_into(tiles, rows):
    """Rows [Hkv, n, D] int8 into positions 0 .. n-1 of V tiles [Hkv, T, D, V_TILE] (_untile's
    inverse; the slots past n are left as they are)."""
    hkv, n, d = rows.shape
    whole, part, size = n // F.V_TILE, n % F.V_TILE, F.V_TILE
    tiles[:, :whole] = rows[:, :size * whole].reshape(hkv, whole, size, d).transpose(0, 1, 3, 2)
    if part:
        tiles[:, whole, :, :part] = rows[:, size * whole:].transpose(0, 2, 1)


def _aligned_zeros(shape, str fmt, size_t itemsize):
    """_aligned_empty, filled with zeros."""
    a = _aligned_empty(shape, fmt, itemsize)
    a.fill(0)
    return a


def _halves_into(values, halves, scales, str name):
    """Rows values [m, D] float32 (each a row of halves times a power of two, as the engine
    writes them) into halves [m, D] and scales [m] by the tier's half_row; ValueError naming
    `name` when a row does not come back exactly."""
    cdef float[:, ::1] x = np.ascontiguousarray(values, dtype=np.float32)
    cdef uint16_t[:, ::1] h = halves
    cdef float[::1] s = scales
    cdef size_t m = x.shape[0], d = x.shape[1], r
    cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
    for r in range(m):
        s[r] = kt.half_row(&x[r, 0], d, &h[r, 0])
    back = np.asarray(halves).view(np.float16).astype(np.float32) * np.asarray(scales)[:, None]
    if not np.array_equal(back, np.asarray(x)):
        raise ValueError(f"state {name} holds rows that are not halves times a power of two, "
                         f"as a cache writes them")


def _readonly(arr):
    """A view of arr that numpy will not let anyone make writeable again."""
    return np.frombuffer(memoryview(arr).toreadonly(), dtype=arr.dtype).reshape(arr.shape)


cdef class KVCache:
    """KVCache(n_kv_heads, max_seq, head_dim, *, k_bits=8, v_bits=8, rotate=True, rotation_seed=0, keep_first=True, center=None, recent=64)
--

A quantized KV cache for decode attention: K and V at 8 or 4 bits each.

    At 8 bits (the default, as ``Int8KVCache``) each token and kv head stores int8 codes with
    one float32 absmax scale per row (``scale = max|x| / 127``, codes ``round(x / scale)`` in
    [-127, 127]): half the bytes of an fp16 cache. At 4 bits K is stored per channel: each
    group of 32 positions of a kv head keeps, per channel, a minimum and a step (fp16 times a
    power of two per group) and every value a code 0 .. 15 (``min + step * code``); V is stored
    per token: a float32 minimum and step per row, codes 0 .. 15. 4/4 takes about 0.58x the
    bytes of 8/8 (with the recent window, at 8192 tokens of Hkv = 8, D = 128). All buffers are
    allocated once, for ``max_seq`` tokens.

    Parameters
    ----------
    n_kv_heads : int
        Key/value heads (Hkv), >= 1.
    max_seq : int
        Capacity in tokens, >= 1.
    head_dim : int
        Head dimension D: a multiple of 16 (of 32 with a side at 4 bits), at most 1024.
    k_bits, v_bits : {8, 4}
        Bits per stored K and V value. K at 4 bits needs ``recent >= 32`` (a group is read from
        the recent window until all its positions are appended) and is never rotated.
    rotate : bool
        True (the default): store the sides at 8 bits and V at 4 bits rotated by a fixed
        random-sign Walsh-Hadamard transform (orthonormal, block-diagonal over the largest
        power-of-two block dividing D), and rotate q and the output to match: attention is
        unchanged, while outlier channels no longer set every row's scale. ``k_i8``/``v_i8``
        then hold the rotated codes; ``dequantize`` returns the un-rotated values. False stores
        plain per-row codes (with ``q_bits=8``, the seed's exact method).
    rotation_seed : int
        Seed of the rotation's signs (0 .. 2**64 - 1).
    keep_first : bool
        True (the default): position 0 (the attention sink most models develop, which takes a
        large share of many heads' weight) is also kept as float32 (``k_first``/``v_first``),
        and decode reads it from there instead of from its codes. Costs 2 * Hkv * D floats.
    center : bool or None
        True: store every K and V row past position 0 minus its kv head's offset (``k_offset``/
        ``v_offset``, in the stored space); decode adds the offsets back (``q·offset`` joins
        each logit, the V offset the output), so each row's int8 steps are finer where real K
        shares a large offset across tokens. With a recent window the offsets are the mean of
        positions 1 .. ``recent``, set once the cache holds ``recent + 1`` tokens however the
        appends were split (the rows before are read from the window meanwhile). Without one,
        the append that first reaches past position 0 sets them from its own rows when it holds
        at least 16 of them, else to zeros (so they depend on how the appends were split). A
        kv head whose mean would more than double most of its rows (one huge outlier) gets
        zeros. Needs ``keep_first`` and both sides at 8 bits. None (the default): the value of
        ``keep_first`` for an 8-bit cache, False with a side at 4 bits.
    recent : int
        R, 64 by default, 0 to 1024: the last R positions are also kept as IEEE halves with a
        power-of-two scale per row (11 significant bits whatever the row's range:
        ``reference.half_rows``), and decode reads them from there in float32; a token leaves
        this window for its codes when R newer ones have been appended. Every row is quantized
        as it is appended (positions 1 .. R from their halves; K at 4 bits a group at a time,
        from its rows' halves), so the stored state does not depend on how appends were split.
        The cache holds the last ``2 * R`` positions (capped at ``max_seq``), so ``truncate``
        can take back up to R tokens exactly. Costs ``2 * min(2R, max_seq) * Hkv * (2 * D + 4)``
        bytes. 0: no window.

    Notes
    -----
    One cache is not meant to be used from two threads at once; a call that finds another in
    progress raises RuntimeError. The kernels run with the GIL released, so different caches
    decode in parallel from different Python threads.
    """

    __signature__ = _args.GENERAL_SIGNATURE

    cdef i8a_cache _c
    cdef object _k, _v, _ks, _vs              # owned buffers (numpy): codes and scales; at 4
                                              # bits _k, _v hold the nibbles and _ks K's groups
    cdef object _k4p, _k4s                    # K at 4 bits: [2, Hkv, groups, D] uint16 halves
                                              # (minima, steps), [2, Hkv, groups] float32 scales
    cdef object _v4m                          # V at 4 bits: [Hkv, max_seq] float32 minima
    cdef object _k_ro, _ks_ro, _vs_ro         # read-only views of the whole buffers
    cdef int _busy                            # taken by every call: i8a_try_acquire
    cdef object _sign                         # [D] float32 +-1 of the rotation, or None
    cdef object _kf, _vf                      # [Hkv, D] float32 with keep_first, else None
    cdef object _ko, _vo                      # [Hkv, D] float32 with center, else None
    cdef object _kr, _vr                      # [Hkv * ring, D] uint16 halves with recent
    cdef object _krs, _vrs                    # [Hkv, ring] float32 their scales (or None)
    cdef readonly int k_bits
    cdef readonly int v_bits
    cdef readonly bint rotate
    cdef readonly object rotation_seed
    cdef readonly bint keep_first
    cdef readonly bint center
    cdef readonly size_t recent

    def __cinit__(self, *args, **kwargs):
        # The buffers are made here, once: __init__ can be called again, __cinit__ cannot, so
        # no call can swap a buffer from under a decode running without the GIL.
        o = _args.constructor(args, kwargs, not isinstance(self, Int8KVCache))
        hkv, cap, d, recent = o.n_kv_heads, o.max_seq, o.head_dim, o.recent
        cdef int8_t[:, :, ::1] k
        cdef int8_t[:, :, :, ::1] v
        cdef uint8_t[:, :, ::1] k4
        cdef uint8_t[:, :, ::1] v4
        cdef uint16_t[:, :, :, ::1] k4p
        cdef float[:, :, ::1] k4s
        cdef size_t groups = i8a_k4_groups(cap)
        memset(&self._c, 0, sizeof(i8a_cache))   # every field zero: the sides fill theirs
        self._c.k_bits, self._c.v_bits = o.k_bits, o.v_bits
        self._k4p = self._k4s = self._v4m = None
        if o.k_bits == 8:
            self._k = _aligned_empty((hkv, cap, d), "b", 1)
            self._ks = _aligned_empty((hkv, cap), "f", 4)
            k = self._k
            self._c.k_codes, self._c.k_scale = &k[0, 0, 0], _data(self._ks)
            self._k_ro, self._ks_ro = _readonly(self._k), _readonly(self._ks)
        else:                                 # zeroed: groups never coded read as zeros
            self._k = _aligned_zeros((hkv, cap, d // 2), "B", 1)
            self._k4p = _aligned_zeros((2, hkv, groups, d), "H", 2)
            self._k4s = _aligned_zeros((2, hkv, groups), "f", 4)
            k4, k4p, k4s = self._k, self._k4p, self._k4s
            self._c.k4 = &k4[0, 0, 0]
            self._c.k4_min, self._c.k4_step = &k4p[0, 0, 0, 0], &k4p[1, 0, 0, 0]
            self._c.k4_min_scale, self._c.k4_step_scale = &k4s[0, 0, 0], &k4s[1, 0, 0]
            self._ks = self._k4s
            self._k_ro = self._ks_ro = None
        self._vs = _aligned_empty((hkv, cap), "f", 4)
        self._c.v_scale = _data(self._vs)
        self._vs_ro = _readonly(self._vs)
        if o.v_bits == 8:
            self._v = _aligned_empty((hkv, _tile_count(cap), d, F.V_TILE), "b", 1)   # (_untile)
            v = self._v
            self._c.v_codes = &v[0, 0, 0, 0]
        else:
            self._v = _aligned_zeros((hkv, _tile_count(cap), 2 * d), "B", 1)
            self._v4m = _aligned_empty((hkv, cap), "f", 4)
            v4 = self._v
            self._c.v4, self._c.v4_min = &v4[0, 0, 0], _data(self._v4m)
        self._c.n_kv_heads, self._c.max_seq, self._c.head_dim, self._c.length = hkv, cap, d, 0
        self._c.recent, self._c.ring = recent, min(2 * recent, cap)
        self._kr = self._vr = self._krs = self._vrs = None
        cdef uint16_t[:, ::1] halves
        if recent:
            self._kr = _aligned_empty((hkv * self._c.ring, d), "H", 2)
            self._vr = _aligned_empty((hkv * self._c.ring, d), "H", 2)
            self._krs = _aligned_empty((hkv, self._c.ring), "f", 4)
            self._vrs = _aligned_empty((hkv, self._c.ring), "f", 4)
            halves = self._kr
            self._c.k_recent = &halves[0, 0]
            halves = self._vr
            self._c.v_recent = &halves[0, 0]
            self._c.k_rscale, self._c.v_rscale = _data(self._krs), _data(self._vrs)
        self._busy = 0
        self.k_bits, self.v_bits = o.k_bits, o.v_bits
        self.rotate, self.rotation_seed = o.rotate, o.rotation_seed
        self.keep_first, self.center, self.recent = o.keep_first, o.center, recent
        self._sign = self._kf = self._vf = self._ko = self._vo = None
        if o.rotate:
            self._sign = np.empty((1, d), np.float32)
            i8a_rotation_signs(o.rotation_seed, d, _data(self._sign))
            self._c.v_sign = _data(self._sign)
            if o.k_bits == 8:                 # (K at 4 bits is stored per channel, unrotated)
                self._c.k_sign = _data(self._sign)
        if o.keep_first:
            self._kf, self._vf = np.zeros((hkv, d), np.float32), np.zeros((hkv, d), np.float32)
            self._c.k_first, self._c.v_first = _data(self._kf), _data(self._vf)
        if o.center:
            self._ko, self._vo = np.zeros((hkv, d), np.float32), np.zeros((hkv, d), np.float32)
            self._c.k_offset, self._c.v_offset = _data(self._ko), _data(self._vo)

    def __dealloc__(self):
        i8a_cache_free_work(&self._c)

    # -- shape and size -------------------------------------------------------------------

    @property
    def n_kv_heads(self):
        """Key/value heads (Hkv)."""
        return self._c.n_kv_heads

    @property
    def max_seq(self):
        """Capacity in tokens."""
        return self._c.max_seq

    @property
    def head_dim(self):
        """Head dimension D."""
        return self._c.head_dim

    @property
    def nbytes(self):
        """Bytes of the cache's buffers: K and V codes and their scales for max_seq tokens (V's
        codes for max_seq rounded up to a multiple of 4; at 4 bits half a byte a code, K's
        groups two halves per channel and two float32 scales, V two float32 per row); the float
        rows of position 0 with keep_first, the offsets with center, and the ring of the recent
        window: K and V rows of min(2 * recent, max_seq) positions as halves, a float32 scale
        per row."""
        hkv, d, cap = self._c.n_kv_heads, self._c.head_dim, self._c.max_seq
        groups = i8a_k4_groups(cap)
        extra = 2 * hkv * (int(self.keep_first) + int(self.center)) * d * 4
        extra += 2 * hkv * self._c.ring * (d * 2 + 4)
        k = cap * (d + 4) if self.k_bits == 8 else cap * d // 2 + groups * (4 * d + 8)
        v = (F.V_TILE * _tile_count(cap) * d + cap * 4 if self.v_bits == 8
             else 2 * _tile_count(cap) * d + cap * 8)
        return hkv * (k + v) + extra

    def __len__(self):
        return self._c.length

    def __repr__(self):
        bits = (f"k_bits={self.k_bits}, v_bits={self.v_bits}, "
                if not isinstance(self, Int8KVCache) else "")
        return (f"{type(self).__name__}(n_kv_heads={self._c.n_kv_heads}, "
                f"max_seq={self._c.max_seq}, head_dim={self._c.head_dim}, {bits}"
                f"rotate={self.rotate}, keep_first={self.keep_first}, center={self.center}, "
                f"recent={self.recent}) holding {self._c.length} tokens")

    cdef _eight(self, str name, int bits):
        """The int8 views exist only for a side at 8 bits."""
        if bits != 8:
            raise AttributeError(f"{name}: this cache stores {name[0].upper()} at {bits} bits, "
                                 f"without int8 codes (state_dict() holds its codes)")

    # -- the stored history ---------------------------------------------------------------

    @property
    def k_i8(self):
        """Read-only view of the stored K codes, [Hkv, len, D] int8 (no copy); K at 8 bits."""
        self._eight("k_i8", self.k_bits)
        return self._k_ro[:, :self._c.length]

    @property
    def v_i8(self):
        """The stored V codes, [Hkv, len, D] int8: a read-only copy (the cache keeps V in
        tiles of 4 positions, so that its integer dots sum 4 positions per lane; this gathers
        them back into rows); V at 8 bits."""
        self._eight("v_i8", self.v_bits)
        self._enter()
        try:
            return _readonly(self._v_i8_held())
        finally:
            self._leave()

    def _v_tiles(self):
        """Read-only view of the whole V buffer, [Hkv, ceil(max_seq / 4), D, 4] int8 (4:
        _format.V_TILE): byte r of dimension i of tile t is position 4 t + r (the slots past the length hold whatever was
        last written there, or nothing defined). For tests and the benchmarks' probe check."""
        return _readonly(self._v)

    def _v_i8_held(self):
        """The V codes [Hkv, len, D] int8, a new array; the caller holds the busy flag."""
        return _untile(self._v, self._c.length)

    def _sides(self):
        """The codes and scales of both sides for state_dict (copies): int8 ``k_i8``,
        ``k_scale`` / ``v_i8``, ``v_scale``; at 4 bits K's ``k_codes`` [Hkv, len, D] uint8 and
        ``k_group_min``, ``k_group_step`` [Hkv, ceil(len / 32), D] float32, V's ``v_codes``,
        ``v_min`` [Hkv, len] and ``v_scale`` (its steps). The caller holds the busy flag."""
        n = self._c.length
        out = {}
        if self.k_bits == 8:
            out["k_i8"], out["k_scale"] = self._k[:, :n].copy(), self._ks[:, :n].copy()
        else:
            g = i8a_k4_groups(n)
            h = self._k4p[:, :, :g].view(np.float16).astype(np.float32)
            vals = h * self._k4s[:, :, :g, None]
            out["k_codes"] = _state.unpack_rows(self._k[:, :n])
            out["k_group_min"], out["k_group_step"] = vals[0], vals[1]
        if self.v_bits == 8:
            out["v_i8"], out["v_scale"] = self._v_i8_held(), self._vs[:, :n].copy()
        else:
            out["v_codes"] = _state.unpack_tiles(self._v, n)
            out["v_min"], out["v_scale"] = self._v4m[:, :n].copy(), self._vs[:, :n].copy()
        return out

    @property
    def k_scale(self):
        """Read-only view of the K scales, [Hkv, len] float32 (no copy); K at 8 bits."""
        self._eight("k_scale", self.k_bits)
        return self._ks_ro[:, :self._c.length]

    @property
    def v_scale(self):
        """Read-only view of the V scales, [Hkv, len] float32 (no copy); V at 8 bits."""
        self._eight("v_scale", self.v_bits)
        return self._vs_ro[:, :self._c.length]

    @property
    def k_first(self):
        """Position 0 of K as appended, [Hkv, D] float32 (a copy), when the cache keeps it and
        holds a token; else None."""
        return self._kf.copy() if self.keep_first and self._c.length else None

    @property
    def v_first(self):
        """Position 0 of V as appended, like ``k_first``."""
        return self._vf.copy() if self.keep_first and self._c.length else None

    @property
    def k_offset(self):
        """The K offset per kv head, [Hkv, D] float32 (a copy) in the stored space (rotated when
        the cache rotates), when the cache centers and its offsets are set (see ``center``); else None."""
        return self._ko.copy() if self.center and self._c.offsets_set else None

    @property
    def v_offset(self):
        """The V offset per kv head, like ``k_offset``."""
        return self._vo.copy() if self.center and self._c.offsets_set else None

    def dequantize(self):
        """The history decode attends over, as floats: ``(k, v)``, each [len, Hkv, D] float32:
        code * scale (plus the offset when centered), rotated back when the cache rotates; with
        keep_first, position 0 is its float row."""
        self._enter()
        try:
            n, hkv, d = self._c.length, self._c.n_kv_heads, self._c.head_dim
            k = np.empty((n, hkv, d), np.float32)
            v = np.empty((n, hkv, d), np.float32)
            if n:
                self._dequantize_into(k, v)
            return k, v
        finally:
            self._leave()

    cdef _dequantize_into(self, k, v):
        cdef float[:, :, ::1] km = k
        cdef float[:, :, ::1] vm = v
        cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
        with nogil:
            i8a_dequantize(kt, &self._c, &km[0, 0, 0], &vm[0, 0, 0])

    # -- operations -----------------------------------------------------------------------

    cdef _enter(self):
        """Take the busy flag, first thing in every call that reads or changes the cache: the
        arguments are converted and checked after it (converting can run Python code, which
        can let another thread in), so what they were checked against cannot change."""
        if self._c.v_scale == NULL:
            raise RuntimeError(f"this {type(self).__name__} was never initialized")
        if not i8a_try_acquire(&self._busy):
            raise RuntimeError(f"this {type(self).__name__} is in use by another thread")

    cdef _leave(self):
        i8a_release(&self._busy)

    def reset(self):
        """Forget every token (capacity and buffers are kept)."""
        self.truncate(0)

    def truncate(self, n):
        """Keep the first n tokens and forget the rest (rejected speculative tokens): the cache
        then decodes exactly as it did after its n-th token was appended, and holds what it held
        then, when the tokens taken back since are at most ``recent`` (the ring's spare) or the
        cache has no recent window. Taking back more, the positions whose floats are gone are
        read from their codes until they leave the window. With center, truncating to before
        the offsets were set (n <= 1, or n <= recent with a window) forgets them. 0 <= n <=
        len(cache)."""
        self._enter()
        try:
            n = _args.as_int(n, "n")
            if not 0 <= n <= self._c.length:
                raise ValueError(f"n must be from 0 to len(cache)={self._c.length}, got {n}")
            i8a_truncate(i8a_load_tier(&_kt), &self._c, n)
        finally:
            self._leave()

    def evict(self, n):
        """Forget the n oldest tokens: token n + i becomes token i and len(cache) shrinks by n,
        freeing capacity for appends (a sliding-window layer keeps only what its window still
        sees). The tokens kept are read back exactly as before by a decode that sees them; with
        keep_first, the new first token's float row is what decode read for it (its floats in
        the recent window, else its dequantized codes, held within +-2**64 like every float
        row), and centering keeps its offsets.
        0 <= n <= len(cache); with k_bits=4 a multiple of 32 (K's groups stay whole)."""
        self._enter()
        try:
            n = _args.as_int(n, "n")
            if not 0 <= n <= self._c.length:
                raise ValueError(f"n must be from 0 to len(cache)={self._c.length}, got {n}")
            _rules.check_evict(n, self.k_bits)
            i8a_evict(i8a_load_tier(&_kt), &self._c, n)
        finally:
            self._leave()

    def append(self, k, v):
        """Quantize and store tokens.

        Parameters
        ----------
        k, v : array-like, [Hkv, D] (one token) or [T, Hkv, D] (T tokens, one C call)
            Any real dtype and strides; converted to float32. Torch CPU tensors are accepted.
            Every value must be within +-2**64 (``VALUE_MAX``), far beyond any activation: the
            format's steps stay inside float32 there.

        Raises ValueError on a shape mismatch, on NaN or Inf or a value beyond +-2**64, or when
        the tokens would not fit in ``max_seq``; a batch is stored whole or not at all, and a
        failed call changes nothing.
        """
        self._enter()
        try:
            ka, va = _args.append(k, v, self._c.n_kv_heads, self._c.head_dim, self._c.length,
                                  self._c.max_seq)
            if ka.shape[0]:
                self._append(ka, va)
        finally:
            self._leave()

    cdef _append(self, ka, va):
        cdef const float[:, :, ::1] kmv = ka
        cdef const float[:, :, ::1] vmv = va
        cdef size_t t = ka.shape[0], bad = 0
        cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
        cdef int rc
        with nogil:
            rc = i8a_append(kt, &self._c, &kmv[0, 0, 0], &vmv[0, 0, 0], t, &bad)
        if rc != 0:
            name, rows = ("k", ka) if rc == 1 else ("v", va)
            token, head = bad // self._c.n_kv_heads, bad % self._c.n_kv_heads
            raise ValueError(_args.bad_row_message(name, rows[token, head],
                                                   f"token {token}, kv head {head}")
                             + "; nothing was appended")

    def decode(self, q, *, scale=None, q_bits=16, out=None, window=None, sinks=0, softcap=None):
        """Attention of the queries over the cached tokens.

        Parameters
        ----------
        q : array-like or torch CPU tensor, [H, D] or [T, H, D]
            Queries, any real dtype (converted to float32); H a multiple of Hkv. Query head h
            reads kv head ``h // (H // Hkv)`` (GQA; MQA when Hkv == 1). With T queries they are
            the last T positions of the cache (1 <= T <= len), causal among themselves: query t
            sees positions up to ``len - T + t`` (verifying speculative tokens, chunked
            prefill). Each K/V row is read once for all T queries. Values within +-2**64.
        scale : float, optional
            Softmax scale applied to q.k, default ``1 / sqrt(D)``; positive, and with
            ``scale * max|q|`` at most 2**40 (``QSCALE_MAX``) in every query row, so that no
            logit can leave float32's range.
        q_bits : {16, 8}
            16 (default): q as two int8 planes, within 1e-3 of fp32 attention on the dequantized
            cache. 8: a single int8 q, the seed's method (about 1e-2).
        out : numpy.ndarray or torch CPU tensor, optional
            float32 C-contiguous, aligned buffer of q's shape to write into instead of
            allocating.
        window : int, optional
            Each query sees only the last ``window`` positions up to itself (sliding-window
            layers); the positions it cannot see are not read. Any window >= 1 (one longer
            than the cache sees everything).
        sinks : int
            With a window, the first ``sinks`` positions stay visible too (attention sinks);
            0 <= sinks <= window.
        softcap : float, optional
            Logits become ``softcap * tanh(logit / softcap)`` before the softmax (Gemma 2);
            from 2**-126 to 2**126.

        Returns
        -------
        float32, q's shape: ``out`` when given, else a torch tensor when q is one (sharing
        memory with the numpy result, no copy), else a numpy.ndarray.
        """
        self._enter()
        try:
            qa, out, result, s, bits, w, n, cap = _args.decode(
                q, scale, q_bits, out, window, sinks, softcap, self._c.length, self._c.n_kv_heads,
                self._c.head_dim, self._c.max_seq)
            _engine_decode([self], qa, out, s, bits, w, n, cap, False)
            return result
        finally:
            self._leave()

    # -- save and load --------------------------------------------------------------------

    def state_dict(self):
        """The cache as a dict of numpy arrays (copies), the content of ``save``'s file:

        ``format`` ("int8attn.Int8KVCache"), ``format_version`` (3), ``n_kv_heads``,
        ``max_seq``, ``head_dim``, ``length`` (ints); ``rotate`` (bool), ``rotation_seed`` and
        ``rotation_block`` (ints); ``keep_first``, ``center`` (bools); ``k_i8``, ``v_i8``
        [Hkv, length, D] int8 (rotated codes when the cache rotates); ``k_scale``, ``v_scale``
        [Hkv, length] float32; ``k_first``, ``v_first``, ``k_offset``, ``v_offset`` [Hkv, D]
        float32 (zeros where the cache has none); ``offsets_set`` (bool); ``recent`` (int);
        ``k_recent``, ``v_recent`` [n, Hkv, D] float32, the floats held for the last n
        positions (n = 0 without a recent window). Version 1 files (from before keep_first and
        center) load with both off, version 2 files (before the recent window) with recent=0.
        """
        self._enter()
        try:
            return _state.state_of(self)
        finally:
            self._leave()

    @classmethod
    def from_state_dict(cls, state, max_seq=None):
        """A cache holding exactly what ``state`` (from ``state_dict``) holds. ``max_seq``
        defaults to the saved capacity and must be at least the saved length. Raises ValueError
        naming what is missing, mis-shaped or impossible; nothing is half-loaded."""
        return _state.restore(cls, state, max_seq)

    def _held(self):
        """The floats held for the latest positions, oldest first: (k, v), each [n, Hkv, D]
        float32 (copies; n = 0 without a recent window). The caller holds the busy flag."""
        hkv, d = self._c.n_kv_heads, self._c.head_dim
        n = self._c.length - self._c.held_from
        if not self.recent:
            return np.zeros((0, hkv, d), np.float32), np.zeros((0, hkv, d), np.float32)
        slots = (np.arange(self._c.held_from, self._c.length) + self._c.ring_shift) % self._c.ring

        def rows(halves, scales):                   # h * scale is exact: the floats decode reads
            h = halves.reshape(hkv, self._c.ring, d)[:, slots].view(np.float16)
            x = h.astype(np.float32) * scales[:, slots][..., None]
            return np.ascontiguousarray(x.transpose(1, 0, 2))
        return rows(self._kr, self._krs), rows(self._vr, self._vrs)

    def _offsets_set(self):
        """Whether the offsets are set (center). The caller holds the busy flag."""
        return bool(self._c.offsets_set)

    def _restore(self, length, arrays, offsets_set):
        """Copy a checked state's arrays (_state.restore) into this new, empty cache."""
        self._enter()
        try:
            if self._c.length:
                raise RuntimeError("_restore needs an empty cache")
            n = length
            if self.keep_first:
                self._kf[:], self._vf[:] = arrays["k_first"], arrays["v_first"]
            if self.center:
                self._ko[:], self._vo[:] = arrays["k_offset"], arrays["v_offset"]
                self._c.offsets_set = 1 if offsets_set else 0
            if self.k_bits == 8:
                self._k[:, :n] = arrays["k_i8"]
                self._ks[:, :n] = arrays["k_scale"]
            else:
                hkv, d, g = self._c.n_kv_heads, self._c.head_dim, i8a_k4_groups(n)
                self._k[:, :n] = _state.pack_rows(arrays["k_codes"])
                for side, key in enumerate(("k_group_min", "k_group_step")):
                    halves = np.empty((hkv * g, d), np.uint16)
                    scales = np.empty(hkv * g, np.float32)
                    _halves_into(arrays[key].reshape(hkv * g, d), halves, scales, key)
                    self._k4p[side, :, :g] = halves.reshape(hkv, g, d)
                    self._k4s[side, :, :g] = scales.reshape(hkv, g)
            if self.v_bits == 8:
                _tile_into(self._v, arrays["v_i8"])
            else:
                _state.pack_tiles_into(self._v, arrays["v_codes"])
                self._v4m[:, :n] = arrays["v_min"]
            self._vs[:, :n] = arrays["v_scale"]
            held = arrays["k_recent"].shape[0]
            if self.recent and held:            # into slots 0 .. held-1, as halves
                _hold(arrays["k_recent"], self._kr, self._krs, self._c.ring)
                _hold(arrays["v_recent"], self._vr, self._vrs, self._c.ring)
            self._c.ring_shift = (self._c.ring - (n - held) % self._c.ring) % self._c.ring \
                if self.recent else 0
            self._c.held_from = n - held
            self._c.length = n
        finally:
            self._leave()

    def save(self, path):
        """Write the cache to ``path`` (a path, or a binary file object open for writing) as an
        uncompressed ``.npz`` (numpy can read it: ``numpy.load(path)`` gives the arrays of
        ``state_dict``; zip CRCs guard every array)."""
        _state.save(self, path)

    @classmethod
    def load(cls, path, max_seq=None):
        """A cache from a file written by ``save`` (a path, or a binary file object open for
        reading). A file that cannot be opened raises OSError
        (a missing file, FileNotFoundError); one that is truncated, corrupted or foreign raises
        ValueError."""
        return _state.load(cls, path, max_seq)


cdef class Int8KVCache(KVCache):
    """Int8KVCache(n_kv_heads, max_seq, head_dim, *, rotate=True, rotation_seed=0, keep_first=True, center=None, recent=64)
--

An int8 KV cache for decode attention: ``KVCache`` with K and V at 8 bits (its options but
    ``k_bits`` and ``v_bits``, the same methods and attributes).

    K and V are stored per token and kv head as int8 codes with one float32 absmax scale each
    (``scale = max|x| / 127``, codes ``round(x / scale)`` in [-127, 127]): half the bytes of an
    fp16 cache, a quarter of fp32. See ``KVCache`` for the parameters.
    """

    __signature__ = _args.SIGNATURE


def decode_batch(caches, q, *, scale=None, q_bits=16, out=None, window=None, sinks=0,
                 softcap=None):
    """``caches[b].decode(q[b], ...)`` for every b, in one call: the (kv head, chunk) work items
    of all the caches share the thread pool (a batch of sequences, one cache each).

    Parameters
    ----------
    caches : sequence of B distinct KVCache (Int8KVCache included)
        Equal ``n_kv_heads`` and ``head_dim``; lengths and formats may differ, each at least T
        long.
    q : array-like or torch CPU tensor, [B, H, D] or [B, T, H, D]
        Cache b's queries are ``q[b]``, as in ``Int8KVCache.decode``.
    scale, q_bits, out, window, sinks, softcap
        As in ``Int8KVCache.decode``, the same for every cache; ``out`` has q's shape.

    Returns float32 of q's shape, like ``decode``. Every cache is taken for the whole call (a
    cache in use by another thread raises RuntimeError); a call that raises writes no output.
    """
    if isinstance(caches, KVCache):
        raise TypeError(f"caches must be a sequence of KVCache, got one {type(caches).__name__}")
    seq = list(caches)
    if not seq:
        raise ValueError("caches must hold at least one KVCache, got an empty sequence")
    for i, c in enumerate(seq):
        if not isinstance(c, KVCache):
            raise TypeError(f"caches[{i}] must be a KVCache or Int8KVCache, got "
                            f"{type(c).__name__}")
    if len({id(c) for c in seq}) != len(seq):
        raise ValueError("caches must be distinct: the same cache appears more than once")
    cdef KVCache c0, ci
    cdef list taken = []
    try:
        for ci in seq:
            ci._enter()
            taken.append(ci)
        c0 = seq[0]
        shortest, widest = c0._c.length, c0._c.max_seq
        for i, ci in enumerate(seq):
            if (ci._c.n_kv_heads, ci._c.head_dim) != (c0._c.n_kv_heads, c0._c.head_dim):
                raise ValueError(
                    f"caches[{i}] has n_kv_heads={ci._c.n_kv_heads}, head_dim={ci._c.head_dim}; "
                    f"caches[0] has n_kv_heads={c0._c.n_kv_heads}, head_dim={c0._c.head_dim}: "
                    f"a batch needs them equal")
            shortest, widest = min(shortest, ci._c.length), max(widest, ci._c.max_seq)
        qa, out, result, s, bits, w, n, cap = _args.decode(
            q, scale, q_bits, out, window, sinks, softcap, shortest, c0._c.n_kv_heads,
            c0._c.head_dim, widest, batch=len(seq))
        _engine_decode(seq, qa, out, s, bits, w, n, cap, True)
        return result
    finally:
        for ci in taken:
            ci._leave()


cdef _engine_decode(list seq, qa, out, float scale, int q_bits, size_t window, size_t sinks,
                    float softcap, bint batch):
    """One i8a_decode_batch call over the caches of seq (taken by the caller), q and out checked:
    [T, H, D] or [H, D] for one cache, with a leading B when `batch`."""
    cdef i8a_options opt
    opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = (scale, q_bits, window, sinks,
                                                                 softcap)
    cdef int lead = 1 if batch else 0
    cdef size_t nb = len(seq), i
    cdef size_t t = 1 if qa.ndim == 2 + lead else qa.shape[lead], h = qa.shape[qa.ndim - 2]
    cdef size_t bad = 0
    cdef const float[::1] qmv = qa.reshape(-1)
    cdef float[::1] omv = out.reshape(-1)
    cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
    cdef size_t threads = i8a_load_size(&_threads)
    cdef int rc
    cdef i8a_cache *single = &(<KVCache>seq[0])._c
    cdef i8a_cache **cs = &single
    if nb > 1:
        cs = <i8a_cache **>malloc(nb * sizeof(i8a_cache *))
        if cs == NULL:
            raise MemoryError("decode_batch could not allocate its list of caches")
        for i in range(nb):
            cs[i] = &(<KVCache>seq[i])._c
    with nogil:
        rc = i8a_decode_batch(kt, cs, nb, &qmv[0], t, h, &opt, threads, &omv[0], &bad)
    if nb > 1:
        free(cs)
    if rc == 3:
        raise MemoryError("decode could not allocate its workspace")
    if rc != 0 and not batch:
        raise _args.decode_error(rc, bad, qa, scale)
    if rc != 0:
        b, row = divmod(bad, t * h)
        err = _args.decode_error(rc, row, qa[b], scale)
        raise type(err)(f"caches[{b}]: {err}")


# ---------------------------------------------------------------------------------------------
# Private hooks: the benchmarks' bandwidth probe and thread count, the tests' kernel entry points.

cdef i8a_options _no_options():
    """The options of a plain decode: scale 1, q_bits 16, no window, sinks or soft cap."""
    cdef i8a_options opt
    opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = 1.0, 16, 0, 0, 0.0
    return opt


def _decode_threads(KVCache cache, h, t=1):
    """Threads a decode of t positions of h query heads (no window) would use now."""
    cdef i8a_options opt = _no_options()
    cache._enter()
    try:
        return i8a_decode_threads(&cache._c, t, h, &opt, i8a_load_size(&_threads))
    finally:
        cache._leave()


def _stream_read(KVCache cache, threads=None):
    """Read every byte a decode reads (codes and scales of all heads and tokens), split over
    threads like a decode, with the best supported tier's widest loads: the benchmarks'
    bandwidth probe. Returns a checksum. threads defaults to what a decode of H = Hkv would use."""
    cdef const i8a_probe *best = &i8a_probes[<int>_tier_index[_SUPPORTED[0]]]
    cdef i8a_options opt = _no_options()
    cdef size_t n
    cdef uint64_t x
    cache._enter()
    try:
        n = (i8a_decode_threads(&cache._c, 1, cache._c.n_kv_heads, &opt, i8a_load_size(&_threads))
             if threads is None else _args.int_from(threads, "threads", 1))
        with nogil:
            x = i8a_stream_read(best, &cache._c, n)
    finally:
        cache._leave()
    return x


def _quantize_rows(x):
    """Quantize each row of x [n, d] float32 with the active tier: (codes int8, scales float32)."""
    cdef const float[:, ::1] xm = _args.c_aligned(np.asarray(x, dtype=np.float32))
    n, d = xm.shape[0], xm.shape[1]
    codes = np.zeros((n, d), np.int8)
    scales = np.zeros(n, np.float32)
    cdef int8_t[:, ::1] cm = codes
    cdef float[::1] sm = scales
    cdef Py_ssize_t r
    for r in range(n):
        if i8a_load_tier(&_kt).quantize_row(&xm[r, 0], d, &cm[r, 0], &sm[r]) != 0:
            raise ValueError(f"row {r} holds NaN or Inf")
    return codes, scales


def _attend(q_hi, q_lo, c_hi, c_lo, k, k_scale, v, v_scale, bias, softcap=0.0, two_planes=True,
            lead=0):
    """The active tier's attend (what decode runs per chunk) on one chunk: q_hi, q_lo [nq, d]
    int8, c_hi, c_lo, bias [nq] float32, k, v [n, d] int8 (1 <= n <= 256), k_scale, v_scale [n]
    float32; V goes into tiles from slot `lead` (0 .. 3) of the first, the other slots holding
    -127. Returns the chunk's state: (m [nq], l [nq], o [nq, d]) float32."""
    cdef const int8_t[:, ::1] qh = np.ascontiguousarray(q_hi, np.int8)
    cdef const int8_t[:, ::1] ql = np.ascontiguousarray(q_lo, np.int8)
    cdef const int8_t[:, ::1] km = np.ascontiguousarray(k, np.int8)
    v = np.asarray(v)
    if not (v.ndim == 2 and 0 <= lead < F.V_TILE):
        raise ValueError("_attend: v must be [n, d] and lead in 0 .. 3")
    rows = np.full((1, lead + v.shape[0], v.shape[1]), -127, np.int8)   # the unread slots
    rows[0, lead:] = v
    tiles = np.full((1, _tile_count(rows.shape[1]), v.shape[1], F.V_TILE), -127, np.int8)
    _tile_into(tiles, rows)
    cdef const int8_t[:, :, :, ::1] vt = tiles
    cdef const int8_t[:, ::1] vm = np.ascontiguousarray(v, np.int8)
    cdef const float[::1] ch = np.ascontiguousarray(c_hi, np.float32)
    cdef const float[::1] cl = np.ascontiguousarray(c_lo, np.float32)
    cdef const float[::1] bm = np.ascontiguousarray(bias, np.float32)
    cdef const float[::1] ksm = np.ascontiguousarray(k_scale, np.float32)
    cdef const float[::1] vsm = np.ascontiguousarray(v_scale, np.float32)
    nq, d, n = qh.shape[0], qh.shape[1], km.shape[0]
    fits = ((ql.shape[0], ql.shape[1]) == (nq, d) and km.shape[1] == d
            and (vm.shape[0], vm.shape[1]) == (n, d)
            and ch.shape[0] == cl.shape[0] == bm.shape[0] == nq and ksm.shape[0] == vsm.shape[0] == n
            and d % 16 == 0 and 16 <= d <= I8A_MAX_HEAD_DIM and 1 <= n <= I8A_CHUNK and nq >= 1)
    if not fits:
        raise ValueError("_attend: shapes do not fit one chunk (see its docstring)")
    m = np.empty(nq, np.float32)
    l = np.empty(nq, np.float32)
    o = np.empty((nq, d), np.float32)
    raw = np.empty(2 * nq * I8A_CHUNK * 4 + 64, np.uint8)   # the attend scratch, 64-byte aligned
    off = (-raw.ctypes.data) % 64
    cdef float[::1] sc = raw[off:off + 2 * nq * I8A_CHUNK * 4].view(np.float32)
    cdef float[::1] mm = m
    cdef float[::1] lm = l
    cdef float[:, ::1] om = o
    cdef i8a_query q
    q.d, q.nq, q.two_planes = d, nq, 1 if two_planes else 0
    q.q_hi, q.q_lo, q.c_hi, q.c_lo, q.bias = &qh[0, 0], &ql[0, 0], &ch[0], &cl[0], &bm[0]
    q.softcap = softcap
    q.inv_softcap = 1.0 / softcap if softcap > 0 else 0.0
    cdef i8a_span span
    span.k, span.v, span.ks, span.vs, span.n = &km[0, 0], &vt[0, 0, 0, 0], &ksm[0], &vsm[0], n
    span.v_lead = lead
    span.next_k = span.next_v = NULL
    span.next_n = 0
    span.k4 = span.v4 = NULL
    cdef i8a_state st
    st.m, st.l, st.o = &mm[0], &lm[0], &om[0, 0]
    i8a_load_tier(&_kt).attend(&q, &span, &sc[0], &st)
    return m, l, o


def _rotate(x, sign, inverse=False):
    """The active tier's rotation of each row of x [n, d] float32, into a new array (the tier
    reads x and writes the copy: the out-of-place path; decode's inverse runs in place)."""
    cdef const float[:, ::1] xm = _args.c_aligned(np.asarray(x, dtype=np.float32))
    out = np.empty((xm.shape[0], xm.shape[1]), dtype=np.float32)
    cdef float[:, ::1] om = out
    cdef const float[::1] sm = _args.c_aligned(np.asarray(sign, dtype=np.float32))
    if xm.shape[1] != sm.shape[0] or xm.shape[1] % 16 or xm.shape[1] > I8A_MAX_HEAD_DIM:
        raise ValueError("x [n, d] and sign [d] need the same d, a multiple of 16 up to 1024")
    cdef Py_ssize_t r
    for r in range(xm.shape[0]):
        i8a_load_tier(&_kt).rotate(&xm[r, 0], xm.shape[1], &sm[0], 1 if inverse else 0, &om[r, 0])
    return out


def _rotation_signs(d, seed):
    """The engine's rotation signs [d] float32 for seed (the reference draws them independently)."""
    out = np.empty((1, _args.int_from(d, "d", 1)), np.float32)
    i8a_rotation_signs(_args.as_int(seed, "seed"), out.shape[1], _data(out))
    return out[0]
