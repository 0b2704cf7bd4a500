# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: freethreading_compatible=True
"""The compiled front end, one extension module: the tier and thread settings, the store every
cache is built on (``_Store``: the buffers the engine laid out, the busy flag, one engine call
per method with the GIL released) and the batch decode, here; the paged pool (``_Paged``,
_paged_pool.pxi), a serving engine's tensors read in one call (_paged_tensors.pxi) and the
private hooks for tests and benchmarks (_hooks.pxi), included. ``_kvcache`` and ``_paged``
build the caches on it, checking every argument first (``_args``, ``_rules``, ``_state``);
this module passes C what they return and turns the engine's status into an exception."""

from cython.view cimport array as cvarray
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint64_t
from libc.float cimport FLT_MAX
from libc.math cimport sqrt
from libc.string cimport memcpy, memset

from ._capi cimport *

import os
import sys
import threading

import numpy as np

from . import _args
from . import _format as F
from . import _rules
from . import _state
from . import _tiers

# the compiled engine's limits (_kvcache checks them against _format's at import)
_C_LIMITS = dict(CHUNK=I8A_CHUNK, MAX_HEAD_DIM=I8A_MAX_HEAD_DIM, V_TILE=I8A_V_TILE,
                 K4_GROUP=I8A_K4_GROUP, NIB_BLOCK=I8A_NIB_BLOCK, OFFSET_MIN_ROWS=I8A_OFFSET_MIN_ROWS,
                 RECENT_MAX=I8A_RECENT_MAX, VALUE_MAX=I8A_VALUE_MAX, QSCALE_MAX=I8A_QSCALE_MAX,
                 MAX_THREADS=I8A_MAX_THREADS)


# ---------------------------------------------------------------------------------------------
# Tiers: detected once at import; every call reads the active one from _kt.

cdef const i8a_kernels *_kt = NULL        # i8a_load_tier / i8a_store_tier
cdef unsigned _have = i8a_cpu_features()
_COMPILED, _SUPPORTED = [], []             # tiers compiled into this build, best first; of
cdef int _i = 0                            # those, the ones this CPU runs
while i8a_tiers[_i].name != NULL:
    _COMPILED.append(i8a_tiers[_i].name.decode())
    if (i8a_tiers[_i].requires & _have) == i8a_tiers[_i].requires:
        _SUPPORTED.append(_COMPILED[len(_COMPILED) - 1])
    _i += 1
_COMPILED, _SUPPORTED = tuple(_COMPILED), tuple(_SUPPORTED)


def _set_isa(str name):
    """Make `name` the active tier (it must be supported). Private: tests switch tiers with it."""
    if name not in _SUPPORTED:
        raise ValueError(f"ISA tier {name!r} is not supported on this CPU; supported: "
                         f"{', '.join(_SUPPORTED)}")
    i8a_store_tier(&_kt, &i8a_tiers[_COMPILED.index(name)])


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


def _amx():
    """What became of AMX at import: "absent" (the CPU or the OS has none), "refused" (the CPU
    has it; the process was refused its tile data, e.g. a Linux before 5.16: the amx tier is
    not offered) or "granted"."""
    return ("absent", "refused", "granted")[i8a_amx_status()]


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


def _thread_source():
    """Where a decode's threads come from: "openmp" (the process's OpenMP team, as torch loads
    one) or "own" (int8attn's pool); chosen at the first call of this or of a decode on threads
    (_pool.h)."""
    return "openmp" if i8a_pool_uses_openmp() else "own"


# ---------------------------------------------------------------------------------------------
# The store
cdef object _allocate(const i8a_buffer *b, void **p):
    """Buffer b of the store's layout as a C-contiguous array, allocated by the engine at 64
    bytes (exactly its bytes: a sanitizer guards them), zeroed when b says so; *p its data."""
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


def _readonly(arr):
    """A view of arr that numpy will not let anyone make writeable again."""
    return np.frombuffer(memoryview(arr).toreadonly(), dtype=arr.dtype).reshape(arr.shape)


cdef class _Store:
    """The compiled part of a cache (KVCache subclasses it): its buffers, its busy flag, and one
    engine call per method, which takes checked arguments and needs the flag held (_enter)."""

    cdef i8a_cache _c
    cdef dict _buf                            # the store's buffers (numpy) by i8a_cache field,
                                              # written only by the engine
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
        sig = getattr(type(self), "__signature__", _args.GENERAL_SIGNATURE)
        o = _args.constructor(args, kwargs, "k_bits" in sig.parameters)
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
            i8a_rotation_signs(o.rotation_seed, o.head_dim, <float *>_ptr(self._sign))
        i8a_store_bind(&self._c, &f, mem, <float *>_ptr(self._sign))
        self._busy = 0
        self.k_bits, self.v_bits = o.k_bits, o.v_bits
        self.rotate, self.rotation_seed = o.rotate, o.rotation_seed
        self.keep_first, self.center, self.recent = o.keep_first, o.center, o.recent

    def __dealloc__(self):
        i8a_cache_free_work(&self._c)

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

    def __len__(self):
        return self._c.length

    @property
    def _offsets_set(self):
        return bool(self._c.offsets_set)

    def _buffers(self):
        """The buffers as the store laid them out (i8a_store_layout): name -> (numpy dtype
        char, shape, bytes)."""
        return {k: (a.dtype.char, a.shape, a.nbytes) for k, a in self._buf.items()}

    def _view(self, name):
        """A read-only view of buffer `name`'s first len positions (K's codes, the scales)."""
        return _readonly(self._buf[name])[:, :self._c.length]

    def _copy(self, name):                    # (a copy of a float row buffer)
        return self._buf[name].copy()

    def _v_tiles(self):
        """Read-only view of V's tiles, [Hkv, ceil(max_seq / 4), D, 4] int8: byte r of dimension
        i of tile t is position 4 t + r (slots past the length: undefined). For tests."""
        return _readonly(self._buf["v_codes"])

    def _enter(self):
        """Take the busy flag, first thing in every call that reads or changes the cache: the
        arguments are converted and checked after it (converting can run Python code, which
        can let another thread in), so what they were checked against cannot change."""
        self._take()

    cdef int _take(self) except -1:
        if self._c.v_scale == NULL:
            raise RuntimeError(f"this {type(self).__name__} was never initialized")
        if not i8a_try_acquire(&self._busy):
            raise RuntimeError(f"this {type(self).__name__} is in use by another thread")
        return 0

    def _leave(self):
        i8a_release(&self._busy)

    cdef _held(self, size_t tokens=0):
        """The busy flag is held (_enter), and `tokens` (a count to keep or forget) fits."""
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the cache's busy flag must be held (_enter) for this call")
        if tokens > self._c.length:
            raise ValueError(f"n must be at most len(cache)={self._c.length}, got {tokens}")

    def _append(self, ka, va):
        """Append k, v [T, Hkv, D] (aligned C-contiguous float32, T >= 1, fitting)."""
        self._held()
        cdef const float[:, :, ::1] kmv = ka
        cdef const float[:, :, ::1] vmv = va
        cdef size_t t = ka.shape[0], bad = 0
        if not (ka.shape == va.shape == (t, self._c.n_kv_heads, self._c.head_dim)
                and 0 < t <= self._c.max_seq - self._c.length):
            raise ValueError("_append: k, v do not fit this cache (see append)")
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

    def _truncate(self, size_t n):
        self._held(n)
        i8a_truncate(i8a_load_tier(&_kt), &self._c, n)

    def _evict(self, size_t n):
        self._held(n)
        _rules.check_evict(n, self._c.length, self.k_bits)
        i8a_evict(i8a_load_tier(&_kt), &self._c, n)

    def _dequantize(self):
        """(k, v), each [len, Hkv, D] float32 (i8a_dequantize)."""
        self._held()
        k = np.empty((self._c.length, self._c.n_kv_heads, self._c.head_dim), np.float32)
        v = np.empty_like(k)
        cdef float *kp = <float *>_ptr(k)
        cdef float *vp = <float *>_ptr(v)
        with nogil:
            i8a_dequantize(i8a_load_tier(&_kt), &self._c, kp, vp)
        return k, v

    def _export(self, keys):
        """The arrays `keys` of the cache's rows as its file holds them (i8a_export): new
        arrays, by name (their shapes: _state.shapes_of)."""
        self._held()
        cdef i8a_rows r
        memset(&r, 0, sizeof(i8a_rows))
        shapes = _state.shapes_of(self._c.n_kv_heads, self._c.length, self._c.head_dim,
                                  i8a_rows_held(&self._c))
        out = {key: np.empty(shapes[key][1], shapes[key][0]) for key in keys}
        _point(&r, out)
        i8a_export(&self._c, &r)
        return out

    def _import(self, size_t length, dict arrays, bint offsets_set, bint round_window):
        """Fill this new, empty cache with a checked state's arrays (i8a_import; round_window:
        the window's rows are rounded to halves, else refused unless they are halves)."""
        self._held()
        cdef i8a_rows r
        memset(&r, 0, sizeof(i8a_rows))
        a = {key: np.ascontiguousarray(x) for key, x in arrays.items()}
        held = a["k_recent"].shape[0]
        want = _state.shapes_of(self._c.n_kv_heads, length, self._c.head_dim, held)
        if (self._c.length or length > self._c.max_seq or held > min(length, self._c.ring)
                or any(k not in a or (a[k].dtype, a[k].shape) != want[k]
                       for k in _state.fields(self.k_bits, self.v_bits, self.keep_first,
                                              self.center))):
            raise ValueError("_import: the arrays do not fit this empty cache (see load)")
        _point(&r, a)
        r.length, r.held, r.offsets_set = length, held, offsets_set
        cdef size_t bad = 0
        cdef int rc = i8a_import(i8a_load_tier(&_kt), &self._c, &r, round_window, &bad)
        if rc:
            raise ValueError(_state.not_halves_message(rc - 1, bad, self._c.n_kv_heads, length,
                                                       held))


def _decode(list seq, qa, out, float scale, int q_bits, size_t window, size_t sinks,
            float softcap, bint batch, ka=None, va=None):
    """One i8a_decode_batch over the caches of seq (their flags held), q and out as _args.decode
    gives them ([B,] [T,] H, D); with ka, va ([B,] T, Hkv, D, as _args.append gives them) one
    i8a_prefill_batch: the T rows appended, then their queries. Refused here too when they do
    not fit (the engine's last guard)."""
    _run(seq, qa, out, scale, q_bits, window, sinks, softcap, batch, ka, va)


cdef int _run(list seq, qa, out, float scale, int q_bits, size_t window, size_t sinks,
              float softcap, bint batch, ka, va) except -1:
    """_decode's work (also _prefill_layer's)."""
    cdef _Store c, c0 = seq[0]
    cdef int lead = 1 if batch else 0
    cdef size_t nb = len(seq), t = 1 if qa.ndim == 2 + lead else qa.shape[lead], bad = 0
    cdef size_t h = qa.shape[qa.ndim - 2], d = c0._c.head_dim, hkv = c0._c.n_kv_heads
    cdef const float[::1] qmv = qa.reshape(-1)
    cdef float[::1] omv = out.reshape(-1)
    cdef const float[::1] kmv, vmv
    cdef size_t new = 0 if ka is None else t
    for c in seq:
        c._held()
        if not (c._c.n_kv_heads == hkv and c._c.head_dim == d
                and 1 <= t <= c._c.length + new and c._c.length + new <= c._c.max_seq):
            raise ValueError("_decode: the caches do not fit one batch (see decode_batch)")
    if not (<size_t>qmv.shape[0] == <size_t>omv.shape[0] == nb * t * h * d and h
            and h % hkv == 0 and scale > 0 and q_bits in (8, 16) and sinks <= window):
        raise ValueError("_decode: q, out or the options do not fit (see decode)")
    if new:
        kmv, vmv = ka.reshape(-1), va.reshape(-1)
        if not (<size_t>kmv.shape[0] == <size_t>vmv.shape[0] == nb * t * hkv * d):
            raise ValueError("_decode: k, v do not fit the queries (see prefill)")
    cdef i8a_options opt
    opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = (scale, q_bits, window, sinks,
                                                                 softcap)
    cdef i8a_cache *single = &c0._c
    cdef i8a_cache **cs = &single
    if nb > 1:                                # (the pointers in an array the call keeps)
        ptrs = np.array([<size_t>&(<_Store>c)._c for c in seq], np.uintp)
        cs = <i8a_cache **>_ptr(ptrs)
    cdef int rc
    with nogil:
        if new:
            rc = i8a_prefill_batch(i8a_load_tier(&_kt), cs, nb, &kmv[0], &vmv[0], &qmv[0], t,
                                   h, &opt, i8a_load_size(&_threads), &omv[0], &bad)
        else:
            rc = i8a_decode_batch(i8a_load_tier(&_kt), cs, nb, &qmv[0], t, h, &opt,
                                  i8a_load_size(&_threads), &omv[0], &bad)
    if rc == 3:
        raise MemoryError("decode could not allocate its workspace")
    if rc == 0:
        return 0
    if rc in (1, 2) and new:                  # a k or v row
        b, row = divmod(bad, t * hkv)
        rows = (ka if rc == 1 else va).reshape(nb, t, hkv, d)
        err = ValueError(_args.bad_row_message("kv"[rc - 1], rows[b, row // hkv, row % hkv],
                                               f"token {row // hkv}, kv head {row % hkv}")
                         + "; nothing was appended")
    else:
        b, row = divmod(bad, t * h)
        err = _args.decode_error(rc - 3 if new else rc, row, qa[b] if batch else qa, scale)
        if new:
            err = type(err)(f"{err}; nothing was appended")
    if batch:
        raise type(err)(f"caches[{b}]: {err}")
    raise err


def _prefill_layer(list seq, ka, va, qa, float scale, int q_bits, size_t window, size_t sinks,
                   float softcap):
    """int8attn.hf's call per layer (``_decode``'s prefill with batch, and no Python around it):
    the busy flags of seq's caches (a layer's own list of distinct caches) taken here, an output
    allocated, the rows appended and attended, the flags given back. ka, va float32
    C-contiguous [B, T, Hkv, D], qa [B, T, H, D]; the options as _args.decode_options gives them,
    with window and sinks at most the caches' max_seq. Returns float32 [B, T, H, D]."""
    cdef _Store c
    cdef size_t taken = 0
    try:
        for c in seq:
            c._take()
            taken += 1
        out = np.empty(qa.shape, np.float32)
        _run(seq, qa, out, scale, q_bits, window, sinks, softcap, True, ka, va)
        return out
    finally:
        for c in seq[:taken]:
            i8a_release(&c._busy)


include "_paged_pool.pxi"
include "_paged_tensors.pxi"
include "_hooks.pxi"
