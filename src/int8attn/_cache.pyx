# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: freethreading_compatible=True
"""The compiled front end: KVCache (and Int8KVCache, its 8-bit form) owns the cache buffers and calls the engine with the GIL
released. Arguments are converted and checked by ``_args`` and files by ``_state`` (plain
Python), always with the cache's busy flag held; this module passes C what they return and
turns the engine's status into an exception. Public names are re-exported by ``int8attn``;
names starting with an underscore are private (tests and benchmarks use them)."""

from cython.view cimport array as cvarray
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from ._capi cimport *

import os

import numpy as np

from . import _args
from . import _format as F
from . import _rules
from . import _state
from . import _tiers

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

cdef object _allocate(const i8a_buffer *b, void **p):
    """A C-contiguous numpy array for buffer b of the store's layout (its shape and type), whose
    data the engine allocated at a 64-byte boundary (exactly its bytes, which a sanitizer
    guards), zeros when b says so; *p its address. Freed with its last view."""
    p[0] = i8a_alloc_aligned(b.bytes)
    if p[0] == NULL:
        raise MemoryError(f"cannot allocate {b.bytes} bytes for the cache's {b.name.decode()}")
    if b.zeroed:
        memset(p[0], 0, b.bytes)
    shape = tuple(b.shape[i] for i in range(b.ndim))
    cdef cvarray a = cvarray(shape=shape, itemsize=b.item, format=chr(b.type), mode="c",
                             allocate_buffer=False)
    a.data = <char *>p[0]
    a.callback_free_data = i8a_free_aligned
    return np.asarray(a)


cdef float *_data(object arr):
    """The first float of a C-contiguous [n, m] float32 array (which its owner keeps alive)."""
    cdef float[:, ::1] m = arr
    return &m[0, 0]


cdef void *_ptr(a):
    """The data of a C-contiguous numpy array (its owner keeps it alive); NULL for None."""
    return NULL if a is None else <void *><size_t>a.ctypes.data


cdef _point(i8a_rows *r, dict a):
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


cdef i8a_format _format_of(size_t hkv, size_t cap, size_t d, int k_bits, int v_bits,
                           bint keep_first, bint center, size_t recent):
    cdef i8a_format f
    f.n_kv_heads, f.max_seq, f.head_dim, f.k_bits, f.v_bits = hkv, cap, d, k_bits, v_bits
    f.keep_first, f.center, f.recent = keep_first, center, recent
    return f


def _layout(n_kv_heads, max_seq, head_dim, *, k_bits=8, v_bits=8, keep_first=True,
            center=False, recent=64):
    """The store's layout of a cache with these options (checked by the caller): a dict of the
    buffers it has, name -> (numpy dtype char, shape, bytes), in i8a_store_layout's order. For
    the benchmarks and tests; a cache allocates from the same function."""
    cdef i8a_format f = _format_of(n_kv_heads, max_seq, head_dim, k_bits, v_bits, keep_first,
                                   center, recent)
    cdef i8a_buffer buf[I8A_BUFFERS]
    cdef size_t total
    if i8a_store_layout(&f, buf, &total) != 0:
        raise ValueError("the layout's sizes do not fit this platform's size_t")
    return {buf[i].name.decode(): (chr(buf[i].type), tuple(buf[i].shape[j] for j in range(buf[i].ndim)),
                                   buf[i].bytes)
            for i in range(I8A_BUFFERS) if buf[i].bytes}


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
    cdef dict _buf                            # the store's buffers (numpy), by i8a_cache field:
                                              # written only by the engine
    cdef object _k_ro, _ks_ro, _vs_ro         # read-only views of K's codes and both scales
    cdef int _busy                            # taken by every call: i8a_try_acquire
    cdef object _sign                         # [1, D] float32 +-1 of the rotation, or None
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
        cdef i8a_format f = _format_of(o.n_kv_heads, o.max_seq, o.head_dim, o.k_bits, o.v_bits,
                                       o.keep_first, o.center, o.recent)
        cdef i8a_buffer buf[I8A_BUFFERS]
        cdef void *mem[I8A_BUFFERS]
        cdef size_t total
        if i8a_store_layout(&f, buf, &total) != 0 or total > _args.INT_MAX:
            raise ValueError(f"max_seq={o.max_seq} with n_kv_heads={o.n_kv_heads}, "
                             f"head_dim={o.head_dim} needs more bytes of buffers than this "
                             f"platform can address")
        self._buf = {}
        for i in range(I8A_BUFFERS):
            mem[i] = NULL
            if buf[i].bytes:
                self._buf[buf[i].name.decode()] = _allocate(&buf[i], &mem[i])
        self._sign = None
        if o.rotate:
            self._sign = np.empty((1, o.head_dim), np.float32)
            i8a_rotation_signs(o.rotation_seed, o.head_dim, _data(self._sign))
        i8a_store_bind(&self._c, &f, mem, _data(self._sign) if o.rotate else NULL)
        self._k_ro = _readonly(self._buf["k_codes"]) if o.k_bits == 8 else None
        self._ks_ro = _readonly(self._buf["k_scale"]) if o.k_bits == 8 else None
        self._vs_ro = _readonly(self._buf["v_scale"])
        self._busy = 0
        self.k_bits, self.v_bits = o.k_bits, o.v_bits
        self.rotate, self.rotation_seed = o.rotate, o.rotation_seed
        self.keep_first, self.center, self.recent = o.keep_first, o.center, o.recent

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
        return sum(a.nbytes for a in self._buf.values())      # (the store's layout)

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
            return _readonly(self._export(("v_i8",))["v_i8"])
        finally:
            self._leave()

    def _v_tiles(self):
        """Read-only view of the whole V buffer, [Hkv, ceil(max_seq / 4), D, 4] int8 (4:
        _format.V_TILE): byte r of dimension i of tile t is position 4 t + r (the slots past the length hold whatever was
        last written there, or nothing defined). For tests and the benchmarks' probe check."""
        return _readonly(self._buf["v_codes"])

    cdef dict _export(self, keys):
        """The arrays `keys` of the cache's rows as its file holds them (i8a_export; the
        caller holds the busy flag): new arrays, by name."""
        cdef size_t hkv = self._c.n_kv_heads, n = self._c.length, d = self._c.head_dim
        cdef size_t groups = i8a_k4_groups(n)
        cdef i8a_rows r
        memset(&r, 0, sizeof(i8a_rows))
        shapes = {"k_i8": ("b", (hkv, n, d)), "v_i8": ("b", (hkv, n, d)),
                  "k_codes": ("B", (hkv, n, d)), "v_codes": ("B", (hkv, n, d)),
                  "k_scale": ("f", (hkv, n)), "v_scale": ("f", (hkv, n)), "v_min": ("f", (hkv, n)),
                  "k_group_min": ("f", (hkv, groups, d)), "k_group_step": ("f", (hkv, groups, d)),
                  "k_first": ("f", (hkv, d)), "v_first": ("f", (hkv, d)),
                  "k_offset": ("f", (hkv, d)), "v_offset": ("f", (hkv, d)),
                  "k_recent": ("f", (i8a_rows_held(&self._c), hkv, d)),
                  "v_recent": ("f", (i8a_rows_held(&self._c), hkv, d))}
        out = {key: np.empty(shapes[key][1], shapes[key][0]) for key in keys}
        _point(&r, out)
        i8a_export(&self._c, &r)
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
        return self._buf["k_first"].copy() if self.keep_first and self._c.length else None

    @property
    def v_first(self):
        """Position 0 of V as appended, like ``k_first``."""
        return self._buf["v_first"].copy() if self.keep_first and self._c.length else None

    @property
    def k_offset(self):
        """The K offset per kv head, [Hkv, D] float32 (a copy) in the stored space (rotated when
        the cache rotates), when the cache centers and its offsets are set (see ``center``); else None."""
        return self._buf["k_offset"].copy() if self.center and self._c.offsets_set else None

    @property
    def v_offset(self):
        """The V offset per kv head, like ``k_offset``."""
        return self._buf["v_offset"].copy() if self.center and self._c.offsets_set else None

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
            rows = self._export(_state.fields(self.k_bits, self.v_bits))
            return _state.state_of(self.n_kv_heads, self.max_seq, self.head_dim, self.k_bits,
                                   self.v_bits, self.rotate, self.rotation_seed, self.keep_first,
                                   self.center, self.recent, len(self), bool(self._c.offsets_set),
                                   rows)
        finally:
            self._leave()

    @classmethod
    def from_state_dict(cls, state, max_seq=None):
        """A cache holding exactly what ``state`` (from ``state_dict``) holds. ``max_seq``
        defaults to the saved capacity and must be at least the saved length. Raises ValueError
        naming what is missing, mis-shaped or impossible; nothing is half-loaded."""
        s = _state.check(state, max_seq)
        general = "k_bits" in cls.__signature__.parameters
        try:
            cache = cls(s.n_kv_heads, s.max_seq, s.head_dim, **_state.options(s, general, cls.__name__))
        except (MemoryError, ValueError) as e:
            raise _state.allocation_error(s, max_seq, e) from None
        cache._import(s.length, s.arrays, s.offsets_set)
        return cache

    def _import(self, size_t length, dict arrays, bint offsets_set):
        """Fill this new, empty cache with a checked state's arrays (i8a_import)."""
        cdef i8a_rows r
        memset(&r, 0, sizeof(i8a_rows))
        cdef int rc
        a = {key: np.ascontiguousarray(x) for key, x in arrays.items()}
        _point(&r, a)
        r.length, r.held, r.offsets_set = length, a["k_recent"].shape[0], offsets_set
        self._enter()
        try:
            if self._c.length:
                raise RuntimeError("_import needs an empty cache")
            rc = i8a_import(i8a_load_tier(&_kt), &self._c, &r)
            if rc:
                raise ValueError(f"state {('k_group_min', 'k_group_step')[rc - 1]} holds rows "
                                 f"that are not halves times a power of two, as a cache writes them")
        finally:
            self._leave()

    def save(self, path):
        """Write the cache to ``path`` (a path, or a binary file object open for writing) as an
        uncompressed ``.npz`` (numpy can read it: ``numpy.load(path)`` gives the arrays of
        ``state_dict``; zip CRCs guard every array)."""
        _state.save(self.state_dict(), path)

    @classmethod
    def load(cls, path, max_seq=None):
        """A cache from a file written by ``save`` (a path, or a binary file object open for
        reading). A file that cannot be opened raises OSError
        (a missing file, FileNotFoundError); one that is truncated, corrupted or foreign raises
        ValueError."""
        return cls.from_state_dict(_state.read(path), max_seq)


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


def _plan(KVCache cache, h, t=1, window=None, sinks=0):
    """The plan a decode of t positions of h query heads would run now (i8a_plan_decode), as a
    dict: the visible chunks as two runs ("runs": ((begin, count), (begin, count))), the item
    and thread counts, the cost model's work and the workspace's offsets and size (_engine.h
    says what each is). window and sinks as in decode; the other options do not change it."""
    cdef i8a_options opt = _no_options()
    cdef i8a_plan p
    cdef dict plan
    cache._enter()
    try:
        _, _, _, _, _, w, n, _ = _args.decode(np.zeros((t, h, cache._c.head_dim), np.float32),
                                              None, 16, None, window, sinks, None,
                                              cache._c.length, cache._c.n_kv_heads,
                                              cache._c.head_dim, cache._c.max_seq)
        opt.window, opt.sinks = w, n
        p = i8a_plan_decode(&cache._c, t, h, &opt, i8a_load_size(&_threads))
    finally:
        cache._leave()
    plan = p                                  # (a dict of the struct's fields)
    plan["runs"] = ((p.runs.begin[0], p.runs.count[0]), (p.runs.begin[1], p.runs.count[1]))
    return plan


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
        n = (i8a_plan_decode(&cache._c, 1, cache._c.n_kv_heads, &opt,
                             i8a_load_size(&_threads)).threads
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
    cdef const int8_t[:, ::1] vrows = np.ascontiguousarray(v, np.int8)
    tiles = np.full((1, -(-(lead + v.shape[0]) // F.V_TILE), v.shape[1], F.V_TILE), -127,
                    np.int8)                            # the unread slots hold -127
    if v.shape[0] and v.shape[1]:
        i8a_tile_rows(&vrows[0, 0], v.shape[0], v.shape[1], lead, <int8_t *>_ptr(tiles))
    cdef const int8_t[:, :, :, ::1] vt = tiles
    cdef const float[::1] ch = np.ascontiguousarray(c_hi, np.float32)
    cdef const float[::1] cl = np.ascontiguousarray(c_lo, np.float32)
    cdef const float[::1] bm = np.ascontiguousarray(bias, np.float32)
    cdef const float[::1] ksm = np.ascontiguousarray(k_scale, np.float32)
    cdef const float[::1] vsm = np.ascontiguousarray(v_scale, np.float32)
    nq, d, n = qh.shape[0], qh.shape[1], km.shape[0]
    fits = ((ql.shape[0], ql.shape[1]) == (nq, d) and km.shape[1] == d
            and (vrows.shape[0], vrows.shape[1]) == (n, d)
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
    i8a_load_tier(&_kt).attend[0][0](&q, &span, &sc[0], &st)
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
