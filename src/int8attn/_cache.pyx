# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: freethreading_compatible=True
"""The compiled front end: the tier and thread settings, the store every cache is built on
(``_Store``: the buffers the engine laid out, the busy flag, one engine call per method with
the GIL released) and the batch decode. ``_kvcache`` builds the caches on it, checking every
argument first (``_args``, ``_rules``, ``_state``); this module passes C what they return and
turns the engine's status into an exception. Private hooks for tests and benchmarks end it."""

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


# ---------------------------------------------------------------------------------------------
# The paged pool

# The element types a pool takes rows in (_engine.h), by the numpy dtype that carries them: a
# bfloat16 row arrives as its 16-bit patterns (numpy has no bfloat16).
_ROWS = {"float32": I8A_F32, "bfloat16": I8A_BF16, "float16": I8A_F16}
_CARRIER = {I8A_F32: np.dtype(np.float32), I8A_BF16: np.dtype(np.uint16),
            I8A_F16: np.dtype(np.float16)}


cdef bint _rows_are(a, int kind):
    """Whether a is an aligned C-contiguous array of element type kind's carrier."""
    return (kind in _CARRIER and a.dtype == _CARRIER[kind] and a.flags.c_contiguous
            and a.flags.aligned)


def _narrow(x, y, int kind):
    """y = x (float32, C-contiguous) in kind's type (bfloat16 or float16, y its carrier, the same
    size): nearest, ties to even (i8a_narrow)."""
    if not (kind in (I8A_BF16, I8A_F16) and x.dtype == np.float32 and x.flags.c_contiguous
            and _rows_are(y, kind) and x.size == y.size):
        raise ValueError("_narrow: x and y do not fit")
    cdef const float *xp = <const float *>_ptr(x)
    cdef uint16_t *yp = <uint16_t *>_ptr(y)
    cdef size_t n = x.size
    with nogil:
        i8a_narrow(xp, n, kind, yp)


# A serving engine's torch tensors, read by the pool's compiled calls (_write_tensors,
# _attend_tensors: int8attn.vllm's calls between a model's layers, where each Python operation
# costs microseconds of cold caches). Set at the first call that meets torch (not imported here):
# (torch.Tensor, {its float32 / bfloat16 / float16: their _ROWS}, torch.int64).
_TORCH = None


cdef struct _Rows:
    char *data                  # row 0
    int kind                    # _ROWS
    size_t n                    # rows
    size_t stride               # bytes from a row to the next
    size_t nbytes               # bytes a row's elements take


cdef object _torch_types(x):
    """_TORCH when x is a torch.Tensor (set at the first one), else None."""
    global _TORCH
    got = _TORCH
    if got is None:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(x, torch.Tensor):
            return None
        got = _TORCH = (torch.Tensor, {torch.float32: I8A_F32, torch.bfloat16: I8A_BF16,
                                       torch.float16: I8A_F16}, torch.int64)
    return got if type(x) is got[0] else None


cdef bint _tensor_rows(x, size_t h, size_t d, _Rows *r) except -1:
    """Whether x is a plain CPU torch.Tensor [N, h, d] (h 0: any H >= 1) of a row type (_ROWS)
    that needs no grad, each of its N rows' H * d elements contiguous (strides (s, d, 1)) at
    their alignment; *r its rows."""
    tt = _torch_types(x)
    if tt is None or not x.is_cpu or x.requires_grad:
        return False
    kind = tt[1].get(x.dtype)
    shape = x.shape
    if kind is None or len(shape) != 3 or shape[2] != d or shape[1] < 1 or (h and shape[1] != h):
        return False
    st = x.stride()
    cdef size_t item = 4 if kind == I8A_F32 else 2, n = shape[0], hh = shape[1]
    cdef size_t at = x.data_ptr()
    if st[2] != 1 or (hh > 1 and st[1] != d) or (n > 1 and st[0] < hh * d) or at % item:
        return False
    r.data, r.kind, r.n = <char *>at, kind, n
    r.stride, r.nbytes = (st[0] if n > 1 else hh * d) * item, hh * d * item
    return True


cdef const char *_packed(const _Rows *r, char *scratch) noexcept nogil:
    """r's rows one after the other: r's own memory when they are, else copied into scratch
    (r.n * r.nbytes bytes)."""
    if r.stride == r.nbytes:
        return r.data
    cdef size_t i
    for i in range(r.n):
        memcpy(scratch + i * r.nbytes, r.data + i * r.stride, r.nbytes)
    return scratch


_local = threading.local()


cdef char *_scratch(size_t nbytes) except NULL:
    """nbytes at a 64-byte boundary, the calling thread's and kept for its next call (a serving
    engine's step would otherwise fault fresh pages in), valid until its next _scratch."""
    buf = getattr(_local, "buf", None)
    if buf is None or <size_t>buf.nbytes < nbytes + 64:
        buf = np.empty(max(nbytes + 64, 0 if buf is None else 2 * <size_t>buf.nbytes), np.uint8)
        _local.buf, _local.at = buf, (<size_t>_ptr(buf) + 63) & ~(<size_t>63)
    return <char *><size_t>_local.at


def _scratch_rows(shape):
    """A float32 array of this shape over the calling thread's scratch (_scratch)."""
    n = int(np.prod(shape))
    cdef size_t at = <size_t>_scratch(4 * n)
    return _local.buf[at - <size_t>_ptr(_local.buf):][:4 * n].view(np.float32).reshape(shape)


def _paged_block_bytes(size_t n_kv_heads, size_t head_dim, size_t block_size):
    """Bytes a block of a pool (i8a_paged_block_bytes), 0 when they do not fit a size_t."""
    return i8a_paged_block_bytes(n_kv_heads, head_dim, block_size)


cdef class _Paged:
    """The compiled part of a PagedKVCache: the pool's memory (its own or the caller's numpy
    array, referenced here), the engine's i8a_paged over it, the busy flag, and one engine call
    per method on arguments _args has checked (the flag held)."""

    cdef i8a_paged _p
    cdef object _mem                          # uint8 [num_blocks, block_bytes], 64-byte aligned
    cdef object _sign                         # [1, D] float32 +-1 of the rotation
    cdef object _open                         # the open blocks' arrays (None without them)
    cdef int _busy
    cdef readonly object rotation_seed

    def __cinit__(self, *args, **kwargs):
        o = _args.paged_constructor(args, kwargs)
        bb = i8a_paged_block_bytes(o.n_kv_heads, o.head_dim, o.block_size)
        mem = _args.paged_buffer(o.buffer, o.num_blocks, bb)
        self._sign = np.empty((1, o.head_dim), np.float32)
        i8a_rotation_signs(o.rotation_seed, o.head_dim, <float *>_ptr(self._sign))
        self._mem = mem
        i8a_paged_init(&self._p, <uint8_t *>_ptr(mem), o.num_blocks, o.n_kv_heads, o.head_dim,
                       o.block_size, <float *>_ptr(self._sign))
        self._open = None
        if o.open_blocks:
            rows = (o.open_blocks, o.n_kv_heads, o.block_size)
            # zeros: pages of entries never opened are never touched (an engine sizes for its
            # most sequences and uses what it runs)
            k, v = (_args.aligned_zeros(rows + (o.head_dim,), np.uint16) for _ in range(2))
            ks, vs = (_args.aligned_zeros(rows, np.float32) for _ in range(2))
            of = np.empty(o.num_blocks, np.int32)
            entries = np.empty(o.open_blocks * sizeof(i8a_open_entry), np.uint8)
            # position 0 of the sequences whose first block a block is (touched for those only)
            fk, fv = (_args.aligned_zeros((o.num_blocks, o.n_kv_heads, o.head_dim), np.float32)
                      for _ in range(2))
            held = np.zeros(o.num_blocks, np.uint8)
            self._open = (k, v, ks, vs, of, entries, fk, fv, held)
            i8a_paged_open(&self._p, o.open_blocks, <uint16_t *>_ptr(k), <uint16_t *>_ptr(v),
                           <float *>_ptr(ks), <float *>_ptr(vs), <int32_t *>_ptr(of),
                           <i8a_open_entry *>_ptr(entries), <float *>_ptr(fk),
                           <float *>_ptr(fv), <uint8_t *>_ptr(held))
        self.rotation_seed = o.rotation_seed
        self._busy = 0

    def __dealloc__(self):
        i8a_paged_free_work(&self._p)

    @property
    def n_kv_heads(self):
        """Key/value heads (Hkv)."""
        return self._p.n_kv_heads

    @property
    def head_dim(self):
        """Head dimension D."""
        return self._p.head_dim

    @property
    def block_size(self):
        """Positions a block holds."""
        return self._p.block_rows

    @property
    def num_blocks(self):
        """Blocks in the pool."""
        return self._p.blocks

    @property
    def block_bytes(self):
        """Bytes a block: n_kv_heads * block_size * (2 * head_dim + 8)."""
        return self._p.block_bytes

    @property
    def open_blocks(self):
        """Entries for blocks not yet full whose rows the pool also keeps as halves (0: none)."""
        return self._p.open_cap

    @property
    def open_nbytes(self):
        """Bytes beside the blocks with open blocks, at most: the entries, open_blocks *
        n_kv_heads * block_size * (4 * head_dim + 8), and position 0 of the sequences, room for
        one a block, num_blocks * (8 * n_kv_heads * head_dim + 1) (zeros whose pages are touched
        as entries and first blocks are used)."""
        if not self._p.open_cap:
            return 0
        return (self._p.open_cap * i8a_paged_open_bytes(self._p.n_kv_heads, self._p.head_dim,
                                                        self._p.block_rows)
                + self._p.blocks * (self._p.n_kv_heads * 8 * self._p.head_dim + 1))

    def _open_entries(self):
        """{block: (first, top)} of the open entries (a test hook; the busy flag held)."""
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the pool's busy flag must be held (_enter) for this call")
        cdef const i8a_open_entry *e
        got = {}
        if self._open is None:
            return got
        e = <const i8a_open_entry *>_ptr(self._open[5])
        for i in range(self._p.open_cap):
            if e[i].block >= 0:
                got[e[i].block] = (e[i].first, e[i].top)
        return got

    def _first_held(self):
        """The blocks that keep a sequence's position 0 apart (a test hook; the flag held)."""
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the pool's busy flag must be held (_enter) for this call")
        return set() if self._open is None else set(np.flatnonzero(self._open[8]).tolist())

    @property
    def buffer(self):
        """The pool's memory, uint8 [num_blocks, block_bytes] (the array given as buffer=, or
        the pool's own). Its bytes are the engine's layout: read and written through the pool's
        methods only."""
        return self._mem

    def _enter(self):
        if self._mem is None:
            raise RuntimeError(f"this {type(self).__name__} was never initialized")
        if not i8a_try_acquire(&self._busy):
            raise RuntimeError(f"this {type(self).__name__} is in use by another thread")

    def _leave(self):
        i8a_release(&self._busy)

    def _write(self, slots, ka, va, int kind):
        """Rows ka, va [N, Hkv, D] (aligned C-contiguous, of the element type `kind`: _ROWS)
        into slots [N] int64 (checked: each negative or below num_blocks * block_size). Returns
        0, or the engine's 1 / 2 and the bad row (i * Hkv + head) with nothing written."""
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the pool's busy flag must be held (_enter) for this call")
        cdef size_t n = slots.shape[0], bad = 0
        if not (ka.shape == va.shape == (n, self._p.n_kv_heads, self._p.head_dim)
                and _rows_are(ka, kind) and _rows_are(va, kind)
                and slots.dtype == np.int64 and slots.ndim == 1 and slots.flags.c_contiguous
                and (n == 0 or int(slots.max()) < <long long>(self._p.blocks * self._p.block_rows))):
            raise ValueError("_write: slots, k or v do not fit the pool (see write)")
        if n == 0:
            return 0, 0
        cdef const int64_t *sp = <const int64_t *>_ptr(slots)
        cdef const void *kp = _ptr(ka)
        cdef const void *vp = _ptr(va)
        cdef int rc
        with nogil:
            rc = i8a_paged_write(i8a_load_tier(&_kt), &self._p, sp, n, kp, vp, kind,
                                 i8a_load_size(&_threads), &bad)
        return rc, bad

    cdef object _batch(self, starts, lens, table, size_t nq, i8a_paged_seq *few,
                       i8a_paged_seq **sp, size_t *ns):
        """The sequences of attend()'s batch with queries, checked as they are read (ValueError
        naming the first entry that does not fit): starts [B + 1], lens [B], table [B,
        max_blocks] int32 C-contiguous, nq the rows of q. *sp is `few` (16 entries) or an
        array the returned object keeps alive with the table's view (hold it for the call)."""
        cdef const int32_t[::1] smv = starts
        cdef const int32_t[::1] lmv = lens
        cdef const int32_t[:, ::1] tmv = table
        cdef size_t nb = lmv.shape[0], width = tmv.shape[1]
        cdef size_t rows = self._p.block_rows, blocks = self._p.blocks, b, j, need
        cdef int64_t t
        if <size_t>smv.shape[0] != nb + 1:
            raise ValueError(f"query_start must have B + 1 = {nb + 1} entries (seq_lens has "
                             f"B={nb}), got {smv.shape[0]}")
        if <size_t>tmv.shape[0] != nb:
            raise ValueError(f"block_table must have B={nb} rows (seq_lens has B), got "
                             f"{tmv.shape[0]}")
        if smv[0] != 0 or <size_t>smv[nb] != nq:
            raise ValueError(f"query_start must start at 0 and end at Nq={nq} (the rows of q); "
                             f"got {smv[0]} .. {smv[nb]}")
        seqs = None
        sp[0] = few
        if nb > 16:
            seqs = np.empty(nb * sizeof(i8a_paged_seq), np.uint8)
            sp[0] = <i8a_paged_seq *>_ptr(seqs)
        ns[0] = 0
        for b in range(nb):
            t = <int64_t>smv[b + 1] - smv[b]
            if t < 0:
                raise ValueError(f"query_start must never decrease; query_start[{b + 1}] = "
                                 f"{smv[b + 1]} < query_start[{b}] = {smv[b]}")
            if lmv[b] < t:
                raise ValueError(f"seq_lens[{b}] is {lmv[b]}, fewer than the request's {t} "
                                 f"queries (query_start[{b + 1}] - query_start[{b}]): its "
                                 f"queries are its last positions")
            if t == 0:
                continue
            need = (<size_t>lmv[b] + rows - 1) // rows
            if need > width:
                raise ValueError(f"seq_lens[{b}] = {lmv[b]} needs {need} blocks of {rows}, but "
                                 f"block_table has {width} columns")
            for j in range(need):
                if tmv[b, j] < 0 or <size_t>tmv[b, j] >= blocks:
                    raise ValueError(f"block_table[{b}, {j}] is {tmv[b, j]}, not a block of the "
                                     f"pool (0 .. {blocks - 1})")
            sp[0][ns[0]].blocks = &tmv[b, 0]
            sp[0][ns[0]].length = lmv[b]
            sp[0][ns[0]].t = t
            ns[0] += 1
        return tmv, seqs

    def _attend(self, qa, int kind, out, starts, lens, table, float scale, int q_bits,
                size_t window, size_t sinks, float softcap):
        """One i8a_paged_attend of the batch attend() describes: qa, out [Nq, H, D] float32
        (aligned, C-contiguous, H a multiple of Hkv), starts [B + 1], lens [B] and table [B,
        max_blocks] int32, C-contiguous; the options checked (_args.decode_options). The
        batch is checked here, under the busy flag, as it is read (ValueError naming the first
        entry that does not fit); the sequences without queries are left out. Returns 0, or the
        engine's status and its bad row."""
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the pool's busy flag must be held (_enter) for this call")
        # typed views: the shapes below are C reads (a call costs microseconds of Python
        # attribute lookups otherwise); q's elements are `kind`'s (_ROWS)
        if not (qa.ndim == 3 and _rows_are(qa, kind)):
            raise ValueError("_attend: q does not fit the pool (see attend)")
        cdef float[:, :, ::1] omv = out
        cdef size_t nq = qa.shape[0], h = qa.shape[1]
        if not (<size_t>qa.shape[2] == self._p.head_dim and h >= 1
                and h % self._p.n_kv_heads == 0 and <size_t>omv.shape[0] == nq
                and <size_t>omv.shape[1] == h and <size_t>omv.shape[2] == self._p.head_dim
                and scale > 0 and q_bits in (8, 16) and (sinks == 0 or sinks <= window)):
            raise ValueError("_attend: q, out or the options do not fit the pool (see attend)")
        cdef const void *qp = _ptr(qa)
        cdef i8a_paged_seq few[16]              # a batch of up to 16: no allocation
        cdef i8a_paged_seq *sp = few
        cdef size_t ns = 0, bad = 0
        keep = self._batch(starts, lens, table, nq, few, &sp, &ns)
        if ns == 0:
            return 0, 0
        cdef i8a_options opt
        opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = (scale, q_bits, window,
                                                                     sinks, softcap)
        cdef int rc
        with nogil:
            rc = i8a_paged_attend(i8a_load_tier(&_kt), &self._p, sp, ns, qp, kind, h, &opt,
                                  i8a_load_size(&_threads), &omv[0, 0, 0], &bad)
        return rc, bad

    def _write_tensors(self, slots, k, v):
        """write() of a serving engine's tensors in one compiled call: slots a CPU torch int64
        [N] (contiguous), k and v [N, Hkv, D] of one row type (_tensor_rows). True when
        written; False, the pool unchanged, when the arguments are anything else, the pool is
        busy or a row is refused (write's general path then takes them, and raises)."""
        cdef _Rows kr, vr
        cdef size_t hkv = self._p.n_kv_heads, d = self._p.head_dim, n, i, bad = 0
        cdef uint64_t limit = <uint64_t>self._p.blocks * self._p.block_rows
        if not (_tensor_rows(k, hkv, d, &kr) and _tensor_rows(v, hkv, d, &vr)
                and kr.kind == vr.kind and kr.n == vr.n):
            return False
        tt = _TORCH
        n = kr.n
        if not (type(slots) is tt[0] and slots.dtype is tt[2] and slots.is_cpu
                and slots.shape == (n,) and (n < 2 or slots.stride(0) == 1)):
            return False
        if n == 0 or not i8a_try_acquire(&self._busy):
            return False
        cdef int rc = 1
        cdef const char *kp
        cdef const char *vp
        cdef int64_t *sp
        cdef char *scratch
        try:
            # the slots copied before they are checked (the engine reads what was checked)
            scratch = _scratch(8 * n + 2 * n * kr.nbytes + 64)
            sp = <int64_t *>scratch
            memcpy(sp, <const void *><size_t>slots.data_ptr(), 8 * n)
            for i in range(n):
                if sp[i] >= 0 and <uint64_t>sp[i] >= limit:
                    return False
            with nogil:
                kp = _packed(&kr, scratch + 8 * n)
                vp = _packed(&vr, scratch + 8 * n + n * kr.nbytes)
                rc = i8a_paged_write(i8a_load_tier(&_kt), &self._p, sp, n, kp, vp, kr.kind,
                                     i8a_load_size(&_threads), &bad)
            return rc == 0
        finally:
            i8a_release(&self._busy)

    def _attend_tensors(self, q, starts, lens, table, scale, window, softcap, out):
        """attend() of a serving engine's call in one compiled call: q a CPU torch tensor [Nq,
        H, D] (_tensor_rows), out one of its shape, C-contiguous, of any row type; starts,
        lens, table int32 numpy arrays, C-contiguous (int8attn.vllm's metadata); scale a
        float (None: D ** -0.5), window None or an int, softcap None or a float, no sinks, q
        as it is (q_bits 16). True when out holds the attention; False, out and the pool
        untouched, when the arguments are anything else (attend's general path checks them:
        _args.decode_options), the pool is busy or a q row is refused. A batch that does not
        fit the pool raises ValueError as attend does."""
        cdef _Rows qr, orr
        cdef size_t d = self._p.head_dim, hkv = self._p.n_kv_heads, h, nq, ns = 0, bad = 0
        cdef double sc, cap = 0.0
        cdef size_t win = 0
        if not (_tensor_rows(q, 0, d, &qr) and _tensor_rows(out, 0, d, &orr)
                and out.shape == q.shape and orr.stride == orr.nbytes):
            return False
        h, nq = q.shape[1], qr.n
        if h % hkv or not all(type(a) is np.ndarray and a.dtype == np.int32
                              and a.flags.c_contiguous for a in (starts, lens, table)) \
                or starts.ndim != 1 or lens.ndim != 1 or table.ndim != 2:
            return False
        if scale is None:
            sc = 1.0 / sqrt(<double>d)
        elif type(scale) is float and 0.0 < scale <= FLT_MAX and <float>scale > 0:
            sc = scale
        else:
            return False
        if window is not None:
            if not (type(window) is int and 1 <= window <= (1 << 62)):
                return False
            win = window
        if softcap is not None:
            if not (type(softcap) is float
                    and F.SOFTCAP_RANGE[0] <= softcap <= F.SOFTCAP_RANGE[1]):
                return False
            cap = softcap
        if not i8a_try_acquire(&self._busy):
            return False
        cdef i8a_paged_seq few[16]              # a batch of up to 16: no allocation
        cdef i8a_paged_seq *sp = few
        cdef i8a_options opt
        cdef int rc = 0
        cdef const char *qp
        cdef float *rows
        cdef char *scratch
        try:
            keep = self._batch(starts, lens, table, nq, few, &sp, &ns)
            if ns == 0:
                return True
            scratch = _scratch(nq * qr.nbytes + nq * h * d * 4 + 64)
            rows = (<float *>orr.data if orr.kind == I8A_F32
                    else <float *>(scratch + ((nq * qr.nbytes + 63) & ~(<size_t>63))))
            opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = sc, 16, win, 0, cap
            with nogil:
                qp = _packed(&qr, scratch)
                rc = i8a_paged_attend(i8a_load_tier(&_kt), &self._p, sp, ns, qp, qr.kind, h,
                                      &opt, i8a_load_size(&_threads), rows, &bad)
                if rc == 0 and orr.kind != I8A_F32:
                    i8a_narrow(rows, nq * h * d, orr.kind, <uint16_t *>orr.data)
            if rc == 3:
                raise MemoryError("attend could not allocate its workspace")
            return rc == 0
        finally:
            i8a_release(&self._busy)

    def _dequantize(self, blocks, size_t length):
        """k, v [length, Hkv, D] float32 of the sequence whose blocks (int32, C-contiguous,
        checked) hold it."""
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the pool's busy flag must be held (_enter) for this call")
        cdef size_t need = (length + self._p.block_rows - 1) // self._p.block_rows
        if not (blocks.dtype == np.int32 and blocks.ndim == 1 and <size_t>blocks.shape[0] >= need
                and (need == 0 or (0 <= int(blocks[:need].min())
                                   and int(blocks[:need].max()) < <long long>self._p.blocks))):
            raise ValueError("_dequantize: the blocks do not fit the pool")
        k = np.zeros((length, self._p.n_kv_heads, self._p.head_dim), np.float32)
        v = np.zeros_like(k)
        if length == 0:
            return k, v
        cdef const int32_t[::1] bmv = blocks
        cdef float *kp = <float *>_ptr(k)
        cdef float *vp = <float *>_ptr(v)
        with nogil:
            i8a_paged_dequantize(i8a_load_tier(&_kt), &self._p, &bmv[0], length, kp, vp)
        return k, v


# ---------------------------------------------------------------------------------------------
# Private hooks: the benchmarks' bandwidth probe and thread count, the tests' kernel entry points.

def _plan(_Store cache, size_t h, size_t t=1, size_t window=0, size_t sinks=0):
    """The plan a decode of t positions of h query heads would run now (i8a_plan_decode) as a
    dict of i8a_plan's fields (_engine.h), "runs" as ((begin, count), (begin, count)); window
    (0: none) and sinks as decode takes them."""
    cdef i8a_options opt = _no_options()
    opt.window, opt.sinks = min(window, cache._c.max_seq), min(sinks, cache._c.max_seq)
    cache._enter()
    try:
        if not (1 <= t <= cache._c.length and h and h % cache._c.n_kv_heads == 0
                and opt.sinks <= (opt.window if opt.window else 0)):
            raise ValueError("_plan: t, h, window or sinks do not fit this cache")
        p = i8a_plan_decode(&cache._c, t, h, &opt, i8a_load_size(&_threads))
    finally:
        cache._leave()
    cdef dict plan = p                        # (a dict of the struct's fields)
    plan["runs"] = ((p.runs.begin[0], p.runs.count[0]), (p.runs.begin[1], p.runs.count[1]))
    return plan


def _stream_read(_Store cache, threads=None):
    """The benchmarks' bandwidth probe: every byte a decode reads, split over threads like a
    decode (default: a decode of H = Hkv's), by the best tier's widest loads. A checksum."""
    cdef const i8a_probe *best = &i8a_probes[_COMPILED.index(_SUPPORTED[0])]
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


# the engine's profile parts (_engine.h, I8A_PROF_*), in their order
_PROFILE_PARTS = ("write", "attend", "setup", "pool", "prepare", "coded", "window", "finish")
if len(_PROFILE_PARTS) != I8A_PROF_PARTS:
    raise ImportError("_cache: the profile's parts do not match the engine's")


def _profile(bint on):
    """Switch the engine's profile counters on (zeroed) or off (kept); see _profile_read."""
    i8a_profile(on)


def _profile_read():
    """The engine's profile: {part: (seconds, count)} summed over threads since _profile(True)
    (_engine.h, I8A_PROF_*; pool's count is the threads its jobs were split for)."""
    cdef uint64_t ns[I8A_PROF_PARTS]
    cdef uint64_t count[I8A_PROF_PARTS]
    i8a_profile_read(ns, count)
    return {name: (ns[i] * 1e-9, count[i]) for i, name in enumerate(_PROFILE_PARTS)}


def _quantize_rows(x):
    """Quantize each row of x [n, d] float32 with the active tier: (codes int8, scales float32)."""
    xa = _args.c_aligned(np.asarray(x, dtype=np.float32).reshape(len(x), -1))
    cdef size_t n = xa.shape[0], d = xa.shape[1], r
    codes, scales = np.zeros((n, d), np.int8), np.zeros(n, np.float32)
    for r in range(n):
        if i8a_load_tier(&_kt).quantize_row(<float *>_ptr(xa) + r * d, d,
                                            <int8_t *>_ptr(codes) + r * d,
                                            <float *>_ptr(scales) + r) != 0:
            raise ValueError(f"row {r} holds NaN or Inf")
    return codes, scales


def _attend(q_hi, q_lo, c_hi, c_lo, k, k_scale, v, v_scale, bias, softcap=0.0, two_planes=True,
            lead=0):
    """The active tier's attend (what decode runs per chunk) on one chunk: q_hi, q_lo [nq, d]
    int8, c_hi, c_lo, bias [nq] float32, k, v [n, d] int8 (1 <= n <= 256), k_scale, v_scale [n]
    float32; V goes into tiles from slot `lead` (0 .. 3) of the first, the other slots holding
    -127. Returns the chunk's state: (m [nq], l [nq], o [nq, d]) float32."""
    a = [np.ascontiguousarray(x, t) for x, t in ((q_hi, np.int8), (q_lo, np.int8), (k, np.int8),
         (v, np.int8), (c_hi, np.float32), (c_lo, np.float32), (bias, np.float32),
         (k_scale, np.float32), (v_scale, np.float32))]
    nq, d = a[0].shape if a[0].ndim == 2 else (0, 0)
    n = len(a[2])
    if not ([x.shape for x in a] == [(nq, d)] * 2 + [(n, d)] * 2 + [(nq,)] * 3 + [(n,)] * 2
            and d % 16 == 0 and 16 <= d <= I8A_MAX_HEAD_DIM and 1 <= n <= I8A_CHUNK
            and nq >= 1 and 0 <= lead < F.V_TILE):
        raise ValueError("_attend: shapes do not fit one chunk (see its docstring)")
    tiles = np.full((-(-(lead + n) // F.V_TILE), d, F.V_TILE), -127, np.int8)  # unread: -127
    i8a_tile_rows(<int8_t *>_ptr(a[3]), n, d, lead, <int8_t *>_ptr(tiles))
    m, l, o = np.empty(nq, np.float32), np.empty(nq, np.float32), np.empty((nq, d), np.float32)
    raw = np.empty(2 * nq * I8A_CHUNK * 4 + 64, np.uint8)   # the attend scratch, 64-byte aligned
    cdef float *scratch = <float *>(<char *>_ptr(raw) + <size_t>((-raw.ctypes.data) % 64))
    cdef i8a_query q
    memset(&q, 0, sizeof(q))
    q.d, q.nq, q.two_planes, q.softcap = d, nq, 1 if two_planes else 0, softcap
    q.q_hi, q.q_lo, q.c_hi = <int8_t *>_ptr(a[0]), <int8_t *>_ptr(a[1]), <float *>_ptr(a[4])
    q.c_lo, q.bias = <float *>_ptr(a[5]), <float *>_ptr(a[6])
    q.inv_softcap = 1.0 / softcap if softcap > 0 else 0.0
    cdef i8a_span span
    memset(&span, 0, sizeof(span))
    span.k, span.v, span.n, span.v_lead = <int8_t *>_ptr(a[2]), <int8_t *>_ptr(tiles), n, lead
    span.blocks = span.next_blocks = i8a_one_block
    span.block_shift = I8A_ONE_BLOCK_SHIFT
    span.ks, span.vs = <float *>_ptr(a[7]), <float *>_ptr(a[8])
    cdef i8a_state st
    st.m, st.l, st.o = <float *>_ptr(m), <float *>_ptr(l), <float *>_ptr(o)
    i8a_load_tier(&_kt).attend[I8A_FMT8][I8A_FMT8](&q, &span, scratch, &st)
    return m, l, o


def _rotate(x, sign, inverse=False):
    """The active tier's rotation of each row of x [n, d] float32 into a new array (the
    out-of-place path; decode's inverse runs in place)."""
    xa = _args.c_aligned(np.asarray(x, dtype=np.float32))
    sa = _args.c_aligned(np.asarray(sign, dtype=np.float32))
    if xa.ndim != 2 or sa.shape != (xa.shape[1],) or xa.shape[1] % 16 or xa.shape[1] > I8A_MAX_HEAD_DIM:
        raise ValueError("x [n, d] and sign [d] need the same d, a multiple of 16 up to 1024")
    out = np.empty(xa.shape, np.float32)
    cdef size_t n = xa.shape[0], d = xa.shape[1], r
    for r in range(n):
        i8a_load_tier(&_kt).rotate(<float *>_ptr(xa) + r * d, d, <float *>_ptr(sa),
                                   1 if inverse else 0, <float *>_ptr(out) + r * d)
    return out


def _rotation_signs(d, seed):
    """The engine's rotation signs [d] float32 for seed (the reference draws them independently)."""
    out = np.empty((1, _args.int_from(d, "d", 1)), np.float32)
    i8a_rotation_signs(_args.as_int(seed, "seed"), out.shape[1], <float *>_ptr(out))
    return out[0]
