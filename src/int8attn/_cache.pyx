# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: freethreading_compatible=True
"""The compiled front end: owns the cache buffers, validates every argument, maps GQA heads and
calls the active tier's kernels with the GIL released. Public names are re-exported by
``int8attn``; everything starting with an underscore is private (tests use it)."""

from libc.stdint cimport int8_t, int32_t, uint64_t

import contextlib
import math
import os

import numpy as np


cdef extern from "_simd/dispatch.h" nogil:
    enum:
        I8A_CHUNK
        I8A_MAX_HEAD_DIM
    ctypedef struct i8a_kernels:
        const char *name
        unsigned requires
        int (*quantize_row)(const float *x, size_t d, int8_t *codes, float *scale) noexcept nogil
        void (*dots)(const int8_t *q, const int8_t *k, size_t n, size_t d, int32_t *out) noexcept nogil
        void (*rotate)(const float *x, size_t d, const float *sign, int inverse, float *y) noexcept nogil
    const i8a_kernels i8a_tiers[]
    unsigned i8a_cpu_features()


cdef extern from "_engine.h" nogil:
    ctypedef struct i8a_cache:
        int8_t *k
        int8_t *v
        float *ks
        float *vs
        size_t hkv, cap, d, len
        const float *sign
        float *k_first
        float *v_first
        float *k_off
        float *v_off
    int i8a_append(const i8a_kernels *kt, const i8a_cache *c, const float *k, const float *v,
                   size_t t, size_t *bad)
    enum:
        I8A_OFFSET_MIN_ROWS
    ctypedef struct i8a_options:
        float scale
        int q_bits
        size_t window, sinks
        float softcap
    size_t i8a_decode_threads(const i8a_cache *c, size_t t, size_t h, const i8a_options *opt,
                              size_t max_threads)
    size_t i8a_decode_scratch_size(const i8a_cache *c, size_t t, size_t h,
                                   const i8a_options *opt, size_t threads)
    int i8a_decode(const i8a_kernels *kt, const i8a_cache *c, const float *q, size_t t, size_t h,
                   const i8a_options *opt, float *out, void *scratch, size_t threads, size_t *bad)
    uint64_t i8a_stream_read(const i8a_kernels *kt, const i8a_cache *c, size_t threads)


cdef extern from "_engine.h" nogil:
    float I8A_VALUE_MAX
    float I8A_QSCALE_MAX


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


# ---------------------------------------------------------------------------------------------
# Tiers: detection once at import, the override, and the table every call goes through.

cdef const i8a_kernels *_kt = NULL        # the active tier: i8a_load_tier / i8a_store_tier
cdef dict _tier_index = {}

_ENV_VARS = ("INT8ATTN_ISA", "CA_CPU_ISA")
# every tier of every architecture, best first within each; a build compiles its own
# architecture's (and scalar)
TIER_ARCH = {"avx512_vnni": "x86-64", "avx2": "x86-64", "neon_dotprod": "aarch64",
             "neon": "aarch64", "scalar": "any CPU"}
KNOWN_TIERS = tuple(TIER_ARCH)
DEFAULT_ROTATE = True
DEFAULT_KEEP_FIRST = True
DEFAULT_CENTER = None                     # center when keep_first
OFFSET_MIN_ROWS = I8A_OFFSET_MIN_ROWS
VALUE_MAX = float(I8A_VALUE_MAX)          # |k|, |v|, |q| the format takes: 2**64
QSCALE_MAX = float(I8A_QSCALE_MAX)        # scale * max|q| of a query row: at most 2**40
OFFSET_MAX = VALUE_MAX * 32               # an offset in the stored space: rotated, at most 2**69
SCALE_MAX = VALUE_MAX * 64 / 127          # the largest stored scale: rows of the stored space
                                          # (rotated and centered) stay within 2**70
SOFTCAP_RANGE = (2.0 ** -126, 2.0 ** 126) # so that 1 / softcap is a normal float32
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _compiled_isas():
    """Tiers compiled into this build, best first."""
    cdef int i = 0
    names = []
    while i8a_tiers[i].name != NULL:
        names.append(i8a_tiers[i].name.decode())
        i += 1
    return tuple(names)


def _supported_isas():
    cdef unsigned have = i8a_cpu_features()
    cdef int i = 0
    names = []
    while i8a_tiers[i].name != NULL:
        if (i8a_tiers[i].requires & have) == i8a_tiers[i].requires:
            names.append(i8a_tiers[i].name.decode())
        i += 1
    return tuple(names)


def _set_isa(str name):
    """Make `name` the active tier (it must be supported). Private: tests switch tiers with it."""
    if name not in _SUPPORTED:
        raise ValueError(f"ISA tier {name!r} is not supported on this CPU; supported: "
                         f"{', '.join(_SUPPORTED)}")
    i8a_store_tier(&_kt, &i8a_tiers[<int>_tier_index[name]])


def _requested_isa(environ):
    """The tier the environment asks for (INT8ATTN_ISA, else CA_CPU_ISA), or None for the best."""
    for var in _ENV_VARS:
        value = environ.get(var, "").strip().lower()
        if value and value != "auto":
            if value not in _SUPPORTED:
                if value in _COMPILED:
                    what = "is not a tier this CPU can run"
                elif value in TIER_ARCH:
                    what = (f"is a tier of {TIER_ARCH[value]} CPUs, not compiled into this "
                            f"build (it has {', '.join(_COMPILED)})")
                else:
                    what = f"is not a known tier (known: {', '.join(KNOWN_TIERS)})"
                raise ValueError(f"{var}={value!r} {what}; supported on this CPU: "
                                 f"{', '.join(_SUPPORTED)}")
            return value
    return None


_COMPILED = _compiled_isas()
_SUPPORTED = _supported_isas()
for _i, _name in enumerate(_COMPILED):
    _tier_index[_name] = _i
_set_isa(_requested_isa(os.environ) or _SUPPORTED[0])


# ---------------------------------------------------------------------------------------------
# Threads

cdef size_t _threads = 1                  # i8a_load_size / i8a_store_size


def _threads_from_env(environ):
    value = environ.get("INT8ATTN_NUM_THREADS", "").strip()
    if not value:
        return min(i8a_cpus_available(), I8A_MAX_THREADS)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= I8A_MAX_THREADS:
        raise ValueError(f"INT8ATTN_NUM_THREADS must be an integer from 1 to {I8A_MAX_THREADS}, "
                         f"got {value!r}")
    return n


def set_num_threads(n):
    """Use at most n threads per decode (1 .. 256). The default is the number of CPUs this
    process may run on (its affinity mask), or INT8ATTN_NUM_THREADS when set. Results do not
    depend on it: the output is bit-identical for every thread count."""
    n = _as_int(n, "n")
    if not 1 <= n <= I8A_MAX_THREADS:
        raise ValueError(f"n must be from 1 to {I8A_MAX_THREADS}, got {n}")
    i8a_store_size(&_threads, n)


def get_num_threads():
    """The most threads a decode uses (short contexts use fewer, when that is faster)."""
    return i8a_load_size(&_threads)


i8a_store_size(&_threads, _threads_from_env(os.environ))


def isa():
    """Name of the active kernel tier, e.g. ``'avx2'`` or ``'neon_dotprod'``."""
    return i8a_load_tier(&_kt).name.decode()


def supported_isas():
    """Tiers this CPU can run, best first (``INT8ATTN_ISA`` may demote to any of them)."""
    return _SUPPORTED


# ---------------------------------------------------------------------------------------------
# Input conversion

cdef _is_torch(x):
    return type(x).__module__.partition(".")[0] == "torch"


cpdef _as_float32(x, str name):
    """x as a float32 numpy array (no copy when it already is one), or TypeError naming `name`."""
    if _is_torch(x):
        x = _torch_to_numpy(x, name)
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            a = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be a float array-like, got {type(x).__name__}: {e}") from None
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers (float32 preferred), got dtype {a.dtype}")
    if a.dtype != np.float32:
        with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values become inf,
            a = a.astype(np.float32)                       # which the kernels then reject
    return a


def _torch_to_numpy(t, str name):
    """A torch tensor as numpy, without a copy when it is a CPU float32 tensor (bfloat16 and the
    other float types numpy lacks are converted first)."""
    import torch
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got one on device {t.device}")
    t = t.detach()
    if t.is_floating_point() and t.dtype != torch.float32:
        t = t.float()
    return t.numpy()


cdef _c_aligned(a):
    """a as a C-contiguous array whose items sit on their natural alignment (a itself when it is
    one: a buffer at an odd address, from a bytes object or a packed record, is copied)."""
    flags = a.flags
    if flags.c_contiguous and flags.aligned:
        return a
    return np.array(a, order="C")                   # a fresh allocation is aligned


def _aligned_empty(size_t n, dtype):
    """An uninitialized 1-D array of n items whose data starts on a 64-byte boundary."""
    dt = np.dtype(dtype)
    raw = np.empty(n * dt.itemsize + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n * dt.itemsize].view(dt)


cdef float *_data(object arr):
    """The first float of a C-contiguous [n, m] float32 array (which its owner keeps alive)."""
    cdef float[:, ::1] m = arr
    return &m[0, 0]


def _readonly(arr):
    """A view of arr that numpy will not let anyone make writeable again."""
    return np.frombuffer(memoryview(arr).toreadonly(), dtype=arr.dtype).reshape(arr.shape)


cdef i8a_options _default_options():
    cdef i8a_options opt
    opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = 1.0, 16, 0, 0, 0.0
    return opt


cdef _finite_float(value, str name):
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}") from None
    if not abs(x) <= _FLOAT32_MAX:
        raise ValueError(f"{name} must be finite in float32, got {value!r}")
    return x


cdef _positive_float(value, str name):
    """value as a float above 0 also as float32 (the kernels' type), or ValueError naming it."""
    x = _finite_float(value, name)
    cdef float f = x
    if not x > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if f == 0:
        raise ValueError(f"{name} must be positive in float32, got {value!r} (rounds to 0)")
    return x


cpdef _as_int(value, str name):
    """value as a Python int (anything with __index__ but bool), or TypeError naming it."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value.__index__()


_INT_MAX = (1 << 63) - 1                  # what any count of the cache fits in


cdef _nonnegative_int(value, str name):
    value = _as_int(value, name)
    if value < 0:
        raise ValueError(f"{name} must be at least 0, got {value}")
    if value > _INT_MAX:
        raise ValueError(f"{name} must be at most 2**63 - 1, got {value}")
    return value


cdef _positive_int(value, str name):
    value = _as_int(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if value > _INT_MAX:
        raise ValueError(f"{name} must be at most 2**63 - 1, got {value}")
    return value


def _bad_row_message(str name, x, str where):
    """Why row x (float32, of argument `name`) is refused: NaN/Inf, or beyond VALUE_MAX."""
    if not np.all(np.isfinite(x)):
        return f"{name} holds NaN or Inf, or a value beyond float32 range ({where})"
    worst = float(np.max(np.abs(x)))
    return (f"{name} holds {worst:.3g} ({where}), beyond +-2**64 ({VALUE_MAX:.3g}), the largest "
            f"magnitude the cache format takes")


def _constructor(n_kv_heads, max_seq, head_dim, *, rotate=DEFAULT_ROTATE, rotation_seed=0,
                 keep_first=DEFAULT_KEEP_FIRST, center=DEFAULT_CENTER):
    """The constructor's signature (Int8KVCache's C-level constructor takes any arguments)."""


_SIGNATURE = None


def _bind_arguments(args, kwargs):
    """The constructor's arguments by name, with the errors Python gives for its own functions
    (named Int8KVCache, not after the type's C-level constructor)."""
    global _SIGNATURE
    import inspect
    if _SIGNATURE is None:
        _SIGNATURE = inspect.signature(_constructor)
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"Int8KVCache(): {e} (n_kv_heads, max_seq and head_dim are positional, "
                        f"the options keyword-only)") from None
    bound.apply_defaults()
    return bound.arguments


# ---------------------------------------------------------------------------------------------

cdef class Int8KVCache:
    """Int8KVCache(n_kv_heads, max_seq, head_dim, *, rotate=True, rotation_seed=0, keep_first=True, center=None)
--

An int8 KV cache for single-token decode attention.

    Stores K and V per token and kv head as int8 codes with one float32 absmax scale each
    (``scale = max|x| / 127``, codes ``round(x / scale)`` in [-127, 127]): half the bytes of an
    fp16 cache, a quarter of fp32. All buffers are allocated once, for ``max_seq`` tokens.

    Parameters
    ----------
    n_kv_heads : int
        Key/value heads (Hkv), >= 1.
    max_seq : int
        Capacity in tokens, >= 1.
    head_dim : int
        Head dimension D: a multiple of 16, at most 1024.
    rotate : bool
        True (the default): store K and V rotated by a fixed random-sign Walsh-Hadamard
        transform (orthonormal, block-diagonal over the largest power-of-two block dividing D),
        and rotate q and the output to match: attention is unchanged, while outlier channels of
        K no longer set every row's scale. ``k_i8``/``v_i8`` then hold the rotated codes;
        ``dequantize`` returns the un-rotated values. False stores plain per-row absmax codes
        (with ``q_bits=8``, the seed's exact method).
    rotation_seed : int
        Seed of the rotation's signs (0 .. 2**64 - 1).
    keep_first : bool
        True (the default): position 0 (the attention sink most models develop, which takes a
        large share of many heads' weight) is also kept as float32 (``k_first``/``v_first``),
        and decode reads it from there instead of from its codes. Costs 2 * Hkv * D floats.
    center : bool or None
        True: store every K and V row past position 0 minus its kv head's offset (``k_offset``/
        ``v_offset``, in the stored space), the mean of the rows past position 0 of the append
        that first reaches past it when it holds at least 16 of them (a prefill), zeros
        otherwise (a cache filled token by token stays uncentered), and zeros for a kv head
        whose mean would more than double most of its rows (one huge outlier in the prefill). Decode adds the offsets
        back: ``q·offset`` joins each logit, the V offset the output. Real K shares a large
        offset across tokens; without it each row's int8 steps are finer. The offsets stay
        until the cache is truncated to 1 token or fewer. Needs ``keep_first``. None (the
        default): the value of ``keep_first``. False: no offsets.

    Notes
    -----
    One cache is not meant to be used from two threads at once; a call that finds another in
    progress raises RuntimeError. The kernels run with the GIL released, so different caches
    decode in parallel from different Python threads.
    """

    cdef i8a_cache _c
    cdef object _k, _v, _ks, _vs            # owned buffers (numpy, 64-byte aligned)
    cdef object _k_ro, _v_ro, _ks_ro, _vs_ro  # read-only views of the whole buffers
    cdef object _scratch
    cdef int _busy                            # taken by every call: i8a_try_acquire
    cdef object _sign                         # [D] float32 +-1 of the rotation, or None
    cdef readonly bint rotate
    cdef readonly object rotation_seed
    cdef readonly bint keep_first
    cdef readonly bint center
    cdef object _kf, _vf                      # [Hkv, D] float32 with keep_first, else None
    cdef object _ko, _vo                      # [Hkv, D] float32 with center, else None

    def __cinit__(self, *args, **kwargs):
        # The buffers are made here, once: __init__ can be called again, __cinit__ cannot, so
        # no call can swap a buffer from under a decode running without the GIL.
        a = _bind_arguments(args, kwargs)
        hkv = _positive_int(a["n_kv_heads"], "n_kv_heads")
        cap = _positive_int(a["max_seq"], "max_seq")
        d = _positive_int(a["head_dim"], "head_dim")
        if d % 16 != 0 or d > I8A_MAX_HEAD_DIM:
            raise ValueError(f"head_dim must be a multiple of 16 and at most {I8A_MAX_HEAD_DIM}, "
                             f"got {d}")
        rotate, keep_first, center = a["rotate"], a["keep_first"], a["center"]
        if center is None:
            center = keep_first
        for name, value in (("rotate", rotate), ("keep_first", keep_first), ("center", center)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
        seed = _as_int(a["rotation_seed"], "rotation_seed")
        if not 0 <= seed < 1 << 64:
            raise ValueError(f"rotation_seed must be from 0 to 2**64 - 1, got {seed}")
        if center and not keep_first:
            raise ValueError("center=True needs keep_first=True: the offsets come from the rows "
                             "past position 0, so position 0 is kept as floats")
        need = 2 * hkv * cap * (d + 4) + 4 * hkv * d * 4
        if need > _INT_MAX:
            raise ValueError(f"max_seq={cap} with n_kv_heads={hkv}, head_dim={d} needs {need} "
                             f"bytes of buffers, more than this platform can address")
        self._k = _aligned_empty(hkv * cap * d, np.int8).reshape(hkv, cap, d)
        self._v = _aligned_empty(hkv * cap * d, np.int8).reshape(hkv, cap, d)
        self._ks = _aligned_empty(hkv * cap, np.float32).reshape(hkv, cap)
        self._vs = _aligned_empty(hkv * cap, np.float32).reshape(hkv, cap)
        self._k_ro, self._v_ro = _readonly(self._k), _readonly(self._v)
        self._ks_ro, self._vs_ro = _readonly(self._ks), _readonly(self._vs)
        cdef int8_t[:, :, ::1] k = self._k
        cdef int8_t[:, :, ::1] v = self._v
        cdef float[:, ::1] ks = self._ks
        cdef float[:, ::1] vs = self._vs
        self._c.k, self._c.v, self._c.ks, self._c.vs = &k[0, 0, 0], &v[0, 0, 0], &ks[0, 0], &vs[0, 0]
        self._c.hkv, self._c.cap, self._c.d, self._c.len = hkv, cap, d, 0
        self._scratch = None
        self._busy = 0
        self.rotate, self.rotation_seed = rotate, seed
        self._sign = None
        self._c.sign = NULL
        cdef float[::1] sm
        if rotate:
            from .reference import rotation_signs
            self._sign = _aligned_empty(d, np.float32)
            self._sign[:] = rotation_signs(d, seed)
            sm = self._sign
            self._c.sign = &sm[0]
        self.keep_first, self.center = keep_first, center
        self._kf = self._vf = self._ko = self._vo = None
        self._c.k_first = self._c.v_first = self._c.k_off = self._c.v_off = NULL
        if keep_first:
            self._kf, self._vf = np.zeros((hkv, d), np.float32), np.zeros((hkv, d), np.float32)
            self._c.k_first, self._c.v_first = _data(self._kf), _data(self._vf)
        if center:
            self._ko, self._vo = np.zeros((hkv, d), np.float32), np.zeros((hkv, d), np.float32)
            self._c.k_off, self._c.v_off = _data(self._ko), _data(self._vo)

    # -- shape and size -------------------------------------------------------------------

    @property
    def n_kv_heads(self):
        """Key/value heads (Hkv)."""
        return self._c.hkv

    @property
    def max_seq(self):
        """Capacity in tokens."""
        return self._c.cap

    @property
    def head_dim(self):
        """Head dimension D."""
        return self._c.d

    @property
    def nbytes(self):
        """Bytes of the cache's buffers (K and V codes and scales for max_seq tokens; the float
        rows of position 0 with keep_first, the offsets with center)."""
        extra = 2 * self._c.hkv * self._c.d * 4 * (int(self.keep_first) + int(self.center))
        return 2 * self._c.hkv * self._c.cap * (self._c.d + 4) + extra

    def __len__(self):
        return self._c.len

    def __repr__(self):
        return (f"Int8KVCache(n_kv_heads={self._c.hkv}, max_seq={self._c.cap}, "
                f"head_dim={self._c.d}, rotate={self.rotate}, keep_first={self.keep_first}, "
                f"center={self.center}) holding {self._c.len} tokens")

    # -- the stored history ---------------------------------------------------------------

    @property
    def k_i8(self):
        """Read-only view of the stored K codes, [Hkv, len, D] int8 (no copy)."""
        return self._k_ro[:, :self._c.len]

    @property
    def v_i8(self):
        """Read-only view of the stored V codes, [Hkv, len, D] int8 (no copy)."""
        return self._v_ro[:, :self._c.len]

    @property
    def k_scale(self):
        """Read-only view of the K scales, [Hkv, len] float32 (no copy)."""
        return self._ks_ro[:, :self._c.len]

    @property
    def v_scale(self):
        """Read-only view of the V scales, [Hkv, len] float32 (no copy)."""
        return self._vs_ro[:, :self._c.len]

    @property
    def k_first(self):
        """Position 0 of K as appended, [Hkv, D] float32 (a copy), when the cache keeps it and
        holds a token; else None."""
        return self._kf.copy() if self.keep_first and self._c.len else None

    @property
    def v_first(self):
        """Position 0 of V as appended, like ``k_first``."""
        return self._vf.copy() if self.keep_first and self._c.len else None

    @property
    def k_offset(self):
        """The K offset per kv head, [Hkv, D] float32 (a copy) in the stored space (rotated when
        the cache rotates), when the cache centers and holds 2 or more tokens; else None."""
        return self._ko.copy() if self.center and self._c.len >= 2 else None

    @property
    def v_offset(self):
        """The V offset per kv head, like ``k_offset``."""
        return self._vo.copy() if self.center and self._c.len >= 2 else None

    def dequantize(self):
        """The history decode attends over, as floats: ``(k, v)``, each [len, Hkv, D] float32:
        code * scale (plus the offset when centered), rotated back when the cache rotates; with
        keep_first, position 0 is its float row."""
        self._enter()
        try:
            n = self._c.len
            k = self._k[:, :n].astype(np.float32) * self._ks[:, :n, None]
            v = self._v[:, :n].astype(np.float32) * self._vs[:, :n, None]
            if self.center and n >= 2:
                k[:, 1:] += self._ko[:, None]
                v[:, 1:] += self._vo[:, None]
            if self.rotate:
                from .reference import rotate
                k = rotate(k, self._sign, inverse=True).astype(np.float32)
                v = rotate(v, self._sign, inverse=True).astype(np.float32)
            if self.keep_first and n:
                k[:, 0], v[:, 0] = self._kf, self._vf
            return (np.ascontiguousarray(k.transpose(1, 0, 2)),
                    np.ascontiguousarray(v.transpose(1, 0, 2)))
        finally:
            self._leave()

    # -- operations -----------------------------------------------------------------------

    cdef _enter(self):
        """Take the busy flag, first thing in every call that reads or changes the cache: the
        arguments are converted and checked after it (converting can run Python code, which
        can let another thread in), so what they were checked against cannot change."""
        if self._c.k == NULL:
            raise RuntimeError("this Int8KVCache was never initialized")
        if not i8a_try_acquire(&self._busy):
            raise RuntimeError("this Int8KVCache is in use by another thread")

    cdef _leave(self):
        i8a_release(&self._busy)

    def reset(self):
        """Forget every token (capacity and buffers are kept)."""
        self.truncate(0)

    def truncate(self, n):
        """Keep the first n tokens and forget the rest (rejected speculative tokens): the cache
        is then exactly as it was after its n-th token was appended (with center, n <= 1 also
        drops the offsets: the next append sets new ones). 0 <= n <= len(cache)."""
        self._enter()
        try:
            n = _as_int(n, "n")
            if not 0 <= n <= self._c.len:
                raise ValueError(f"n must be from 0 to len(cache)={self._c.len}, got {n}")
            self._c.len = n
        finally:
            self._leave()

    # -- save and load --------------------------------------------------------------------

    def state_dict(self):
        """The cache as a dict of numpy arrays (copies), the content of ``save``'s file:

        ``format`` ("int8attn.Int8KVCache"), ``format_version`` (2), ``n_kv_heads``,
        ``max_seq``, ``head_dim``, ``length`` (ints); ``rotate`` (bool), ``rotation_seed`` and
        ``rotation_block`` (ints); ``keep_first``, ``center`` (bools); ``k_i8``, ``v_i8``
        [Hkv, length, D] int8 (rotated codes when the cache rotates); ``k_scale``, ``v_scale``
        [Hkv, length] float32; ``k_first``, ``v_first``, ``k_offset``, ``v_offset`` [Hkv, D]
        float32 (zeros where the cache has none). Version 1 files (from before keep_first and
        center) load with both off.
        """
        self._enter()
        try:
            zeros = np.zeros((self._c.hkv, self._c.d), np.float32)
            return {
                "format": _FORMAT, "format_version": _FORMAT_VERSION,
                "n_kv_heads": int(self._c.hkv), "max_seq": int(self._c.cap),
                "head_dim": int(self._c.d), "length": int(self._c.len),
                "rotate": bool(self.rotate), "rotation_seed": int(self.rotation_seed),
                "rotation_block": int(self._c.d & -self._c.d) if self.rotate else 0,
                "k_i8": self.k_i8.copy(), "v_i8": self.v_i8.copy(),
                "k_scale": self.k_scale.copy(), "v_scale": self.v_scale.copy(),
                "keep_first": bool(self.keep_first), "center": bool(self.center),
                **{key: zeros.copy() if value is None else value
                   for key, value in (("k_first", self.k_first), ("v_first", self.v_first),
                                      ("k_offset", self.k_offset), ("v_offset", self.v_offset))},
            }
        finally:
            self._leave()

    @classmethod
    def from_state_dict(cls, state, *, max_seq=None):
        """A cache holding exactly what ``state`` (from ``state_dict``) holds. ``max_seq``
        defaults to the saved capacity and must be at least the saved length. Raises ValueError
        naming what is missing, mis-shaped or impossible; nothing is half-loaded."""
        hkv, cap, d, n, arrays, rotate, seed, keep_first, center = _check_state(state, max_seq)
        try:
            cache = cls(hkv, cap, d, rotate=rotate, rotation_seed=seed, keep_first=keep_first,
                        center=center)
        except (MemoryError, ValueError) as e:
            what = "state max_seq" if max_seq is None else "max_seq"
            raise ValueError(f"{what} {cap} cannot be allocated for n_kv_heads={hkv}, "
                             f"head_dim={d} ({type(e).__name__}: {e}); pass a smaller max_seq "
                             f"(at least the state's length, {n})") from None
        cdef Int8KVCache c = cache
        if keep_first:
            c._kf[:], c._vf[:] = arrays["k_first"], arrays["v_first"]
        if center:
            c._ko[:], c._vo[:] = arrays["k_offset"], arrays["v_offset"]
        c._k[:, :n] = arrays["k_i8"]
        c._v[:, :n] = arrays["v_i8"]
        c._ks[:, :n] = arrays["k_scale"]
        c._vs[:, :n] = arrays["v_scale"]
        c._c.len = n
        return cache

    def save(self, path):
        """Write the cache to ``path`` (a path, or a binary file object open for writing) as an
        uncompressed ``.npz`` (numpy can read it: ``numpy.load(path)`` gives the arrays of
        ``state_dict``; zip CRCs guard every array)."""
        state = self.state_dict()
        with (contextlib.nullcontext(path) if hasattr(path, "write") else open(path, "wb")) as f:
            np.savez(f, **{k: np.asarray(v) for k, v in state.items()})

    @classmethod
    def load(cls, path, *, max_seq=None):
        """A cache from a file written by ``save`` (a path, or a binary file object open for
        reading). A file that cannot be opened raises OSError
        (a missing file, FileNotFoundError); one that is truncated, corrupted or foreign raises
        ValueError."""
        # open here, so that OSError means the file and a ValueError its content
        with (contextlib.nullcontext(path) if hasattr(path, "read") else open(path, "rb")) as f:
            try:
                with np.load(f, allow_pickle=False) as z:
                    state = {k: z[k] for k in z.files}
            except Exception as e:                   # zip, CRC, header, seek and pickle errors
                why = (f"{type(e).__name__}: {e}" if "allow_pickle" not in str(e)
                       else "it holds pickled Python objects, which a cache file never does")
                raise ValueError(f"{path!s} is not a readable int8attn cache file: {why}") from None
        return cls.from_state_dict(state, max_seq=max_seq)

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
            self._append(k, v)
        finally:
            self._leave()

    cdef _append(self, k, v):
        ka = _as_float32(k, "k")
        va = _as_float32(v, "v")
        hkv, d = self._c.hkv, self._c.d
        if ka.ndim not in (2, 3) or ka.shape[ka.ndim - 2:] != (hkv, d):
            raise ValueError(f"k must have shape [Hkv, D] or [T, Hkv, D] with Hkv={hkv}, D={d}; "
                             f"got {list(ka.shape)}")
        if va.shape != ka.shape:
            raise ValueError(f"v must have the shape of k, {list(ka.shape)}; got {list(va.shape)}")
        if ka.ndim == 2:
            ka, va = ka[None], va[None]
        t = ka.shape[0]
        if self._c.len + t > self._c.cap:
            raise ValueError(f"appending {t} token(s) to a cache holding {self._c.len} would exceed "
                             f"max_seq={self._c.cap}; nothing was appended")
        if t == 0:
            return
        ka, va = _c_aligned(ka), _c_aligned(va)
        cdef const float[:, :, ::1] kmv = ka
        cdef const float[:, :, ::1] vmv = va
        cdef size_t nt = t, bad = 0
        cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
        cdef int rc
        with nogil:
            rc = i8a_append(kt, &self._c, &kmv[0, 0, 0], &vmv[0, 0, 0], nt, &bad)
        if rc != 0:
            name, rows = ("k", ka) if rc == 1 else ("v", va)
            where = f"token {bad // hkv}, kv head {bad % hkv}"
            raise ValueError(_bad_row_message(name, rows[bad // hkv, bad % hkv], where)
                             + "; nothing was appended")
        self._c.len += t

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
            return self._decode(q, scale, q_bits, out, window, sinks, softcap)
        finally:
            self._leave()

    cdef _decode(self, q, scale, q_bits, out, window, sinks, softcap):
        if self._c.len == 0:
            raise ValueError("decode on an empty cache: append at least one token first")
        qa = _as_float32(q, "q")
        hkv, d = self._c.hkv, self._c.d
        if qa.ndim not in (2, 3) or qa.shape[qa.ndim - 1] != d or 0 in qa.shape:
            raise ValueError(f"q must have shape [H, D] or [T, H, D] with D={d}, H >= 1, T >= 1; "
                             f"got {list(qa.shape)}")
        shape = qa.shape
        t, h = (1, shape[0]) if qa.ndim == 2 else (shape[0], shape[1])
        if h % hkv != 0:
            raise ValueError(f"q has H={h} query heads, not a multiple of n_kv_heads={hkv}")
        if t > self._c.len:
            raise ValueError(f"q holds T={t} query positions but the cache holds {self._c.len} "
                             f"tokens: the queries must be the last T of them")
        q_bits = _as_int(q_bits, "q_bits")
        if q_bits not in (8, 16):
            raise ValueError(f"q_bits must be 16 or 8, got {q_bits!r}")
        cdef i8a_options opt
        opt.scale = 1.0 / math.sqrt(d) if scale is None else _positive_float(scale, "scale")
        opt.q_bits = q_bits
        # windows and sinks past the capacity change nothing: clamped to it
        window = None if window is None else _positive_int(window, "window")
        opt.window = 0 if window is None else min(window, self._c.cap)
        sinks = _nonnegative_int(sinks, "sinks")
        if sinks and window is None:
            raise ValueError(f"sinks={sinks} needs a window: sinks are the positions kept "
                             f"visible outside it")
        if window is not None and sinks > window:
            raise ValueError(f"sinks must be at most window={window}, got {sinks}")
        opt.sinks = min(sinks, self._c.cap)
        opt.softcap = 0.0
        if softcap is not None:
            cap = _positive_float(softcap, "softcap")
            if not SOFTCAP_RANGE[0] <= cap <= SOFTCAP_RANGE[1]:
                raise ValueError(f"softcap must be from 2**-126 to 2**126, got {softcap!r}")
            opt.softcap = cap
        result = out
        if out is None:
            out = np.empty(shape, np.float32)
            result = _torch_from_numpy(out) if _is_torch(q) else out
        elif _is_torch(out):
            out = _torch_out(out, shape)
        else:
            _check_out(out, shape)
        qa = _c_aligned(qa)
        cdef size_t nt = t, nh = h, bad = 0
        cdef const i8a_kernels *kt = i8a_load_tier(&_kt)
        cdef size_t threads = i8a_decode_threads(&self._c, nt, nh, &opt, i8a_load_size(&_threads))
        cdef size_t need = i8a_decode_scratch_size(&self._c, nt, nh, &opt, threads)
        if self._scratch is None or self._scratch.shape[0] < need:
            self._scratch = _aligned_empty(need, np.uint8)
        cdef const float[::1] qmv = qa.reshape(-1)
        cdef float[::1] omv = out.reshape(-1)
        cdef unsigned char[::1] smv = self._scratch
        cdef int rc
        with nogil:
            rc = i8a_decode(kt, &self._c, &qmv[0], nt, nh, &opt, &omv[0], &smv[0], threads, &bad)
        if rc != 0:
            where = f"query head {bad % h}" if qa.ndim == 2 else f"position {bad // h}, head {bad % h}"
            row = qa.reshape(-1, d)[bad]
            if rc == 1:
                raise ValueError(_bad_row_message("q", row, where))
            worst = float(np.max(np.abs(row))) * opt.scale
            raise ValueError(f"scale * max|q| is {worst:.3g} ({where}), above 2**40 "
                             f"({QSCALE_MAX:.3g}): the logits could leave float32's range; "
                             f"lower the scale or the magnitude of q")
        return result

    def _stream_read(self, threads=None):
        """Read every byte a decode reads (codes and scales of all heads and tokens), split over
        threads like a decode, with the best supported tier's widest loads: the benchmarks' bandwidth
        probe. Returns a checksum. threads defaults to what a decode of H = Hkv would use."""
        cdef i8a_options opt = _default_options()
        cdef size_t t
        cdef uint64_t x
        # the best tier this CPU supports (the table's first may be one it lacks)
        cdef const i8a_kernels *best = &i8a_tiers[<int>_tier_index[_SUPPORTED[0]]]
        self._enter()
        try:
            t = (i8a_decode_threads(&self._c, 1, self._c.hkv, &opt, i8a_load_size(&_threads))
                 if threads is None else _positive_int(threads, "threads"))
            with nogil:
                x = i8a_stream_read(best, &self._c, t)
        finally:
            self._leave()
        return x

    def _decode_threads(self, h, t=1):
        """Threads a decode of t positions of h query heads (no window) would use now."""
        cdef i8a_options opt = _default_options()
        self._enter()
        try:
            return i8a_decode_threads(&self._c, t, h, &opt, i8a_load_size(&_threads))
        finally:
            self._leave()


def _torch_out(t, shape):
    """A torch out= tensor as a writable numpy view of its memory, after the same checks."""
    import torch
    if t.device.type != "cpu":
        raise ValueError(f"out must be a CPU tensor, got one on device {t.device}")
    if t.dtype != torch.float32:
        raise TypeError(f"out must have dtype float32, got {t.dtype}")
    if t.requires_grad:
        raise ValueError("out must not require grad")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"out must have shape {list(shape)}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError("out must be C-contiguous, aligned and writeable")
    a = t.numpy()
    if not a.flags.aligned or not a.flags.writeable:
        raise ValueError("out must be C-contiguous, aligned and writeable")
    return a


def _torch_from_numpy(a):
    import torch
    return torch.from_numpy(a)


_FORMAT = "int8attn.Int8KVCache"
_FORMAT_VERSION = 2
_STATE_INTS = ("n_kv_heads", "max_seq", "head_dim", "length")


def _state_scalar(state, str key, str kind, default=None):
    """state[key] as a Python int ('int') or bool ('bool'): a 0-d array of an integer or bool
    dtype, or ValueError naming the field. `default` when the key is absent and one is given."""
    if key not in state and default is not None:
        return default
    try:
        a = np.asarray(state[key])
    except Exception:
        a = None
    if a is None or a.shape != () or a.dtype.kind not in ("b" if kind == "bool" else "iu"):
        what = ("a bool" if kind == "bool" else "an integer")
        got = ("an object numpy cannot read" if a is None
               else f"dtype {a.dtype}, shape {a.shape}")
        raise ValueError(f"state {key} must be {what}, got {got}")
    return bool(a) if kind == "bool" else int(a)


def _check_state(state, max_seq):
    """Validate a state dict: returns (hkv, cap, d, length, arrays, rotate, seed, keep_first,
    center) or raises ValueError naming the field."""
    if not hasattr(state, "keys"):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    missing = [k for k in ("format", "format_version", *_STATE_INTS, "k_i8", "v_i8", "k_scale",
                           "v_scale") if k not in state]
    if missing:
        raise ValueError(f"state lacks {', '.join(missing)}: not an int8attn cache")
    fmt = np.asarray(state["format"])
    if fmt.shape != () or fmt.dtype.kind != "U" or str(fmt) != _FORMAT:
        raise ValueError(f"state format is {str(fmt)[:60]!r}, expected {_FORMAT!r}")
    version = _state_scalar(state, "format_version", "int")
    if version not in (1, _FORMAT_VERSION):
        raise ValueError(f"state format_version is {version}; this int8attn reads 1 and "
                         f"{_FORMAT_VERSION}")
    ints = {key: _state_scalar(state, key, "int") for key in _STATE_INTS}
    hkv, d, n = ints["n_kv_heads"], ints["head_dim"], ints["length"]
    for key in ("n_kv_heads", "max_seq", "head_dim"):
        if not 1 <= ints[key] <= _INT_MAX:
            raise ValueError(f"state {key} must be from 1 to 2**63 - 1, got {ints[key]}")
    if d % 16 != 0 or d > I8A_MAX_HEAD_DIM:
        raise ValueError(f"state head_dim must be a multiple of 16 and at most "
                         f"{I8A_MAX_HEAD_DIM}, got {d}")
    cap = ints["max_seq"] if max_seq is None else _positive_int(max_seq, "max_seq")
    if not 0 <= n <= cap:
        what = "the state's max_seq" if max_seq is None else "max_seq"
        raise ValueError(f"state length {n} does not fit {what}={cap}")
    arrays = {}
    for key, dtype, shape in (("k_i8", np.int8, (hkv, n, d)), ("v_i8", np.int8, (hkv, n, d)),
                              ("k_scale", np.float32, (hkv, n)), ("v_scale", np.float32, (hkv, n))):
        a = np.asarray(state[key])
        if a.dtype != dtype or a.shape != shape:
            raise ValueError(f"state {key} must be {np.dtype(dtype).name} {list(shape)}, "
                             f"got {a.dtype} {list(a.shape)}")
        arrays[key] = a
    for key in ("k_i8", "v_i8"):
        if n and arrays[key].min() < -127:
            raise ValueError(f"state {key} holds -128, which the quantizer never stores")
    for key in ("k_scale", "v_scale"):
        s = arrays[key]
        if not np.all((s >= 0) & (s <= SCALE_MAX)):
            raise ValueError(f"state {key} holds scales outside [0, {SCALE_MAX:.3g}] (negative, "
                             f"NaN, or larger than any row the format stores)")
    # the rotation (absent from files written before it existed: none)
    rotate = _state_scalar(state, "rotate", "bool", False)
    seed = _state_scalar(state, "rotation_seed", "int", 0)
    block = _state_scalar(state, "rotation_block", "int", 0)
    if rotate and (block != d & -d or not 0 <= seed < 1 << 64):
        raise ValueError(f"state rotation does not match this int8attn: block {block} and seed "
                         f"{seed} for head_dim {d} (expected block {d & -d})")
    # the kept first position and the offsets (version 2; version 1 files have neither)
    keep_first = version >= 2 and _state_scalar(state, "keep_first", "bool", False)
    center = version >= 2 and _state_scalar(state, "center", "bool", False)
    if center and not keep_first:
        raise ValueError("state has center without keep_first, which int8attn never writes")
    need = ((("k_first", "v_first") if keep_first else ())
            + (("k_offset", "v_offset") if center else ()))
    lacking = [k for k in need if k not in state]
    if lacking:
        raise ValueError(f"state lacks {', '.join(lacking)}, which its keep_first/center need")
    for key in need:
        a = np.asarray(state[key])
        if a.dtype != np.float32 or a.shape != (hkv, d):
            raise ValueError(f"state {key} must be float32 {[hkv, d]}, got {a.dtype} "
                             f"{list(a.shape)}")
        bound = VALUE_MAX if key.endswith("first") else OFFSET_MAX
        if not np.all(np.abs(a) <= bound):
            raise ValueError(f"state {key} holds NaN, Inf or values beyond +-{bound:.3g}")
        arrays[key] = a
    return hkv, cap, d, n, arrays, rotate, seed, keep_first, center


cdef _check_out(out, shape):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray or a torch tensor, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise TypeError(f"out must have dtype float32, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"out must have shape {list(shape)}, got {list(out.shape)}")
    if not out.flags.c_contiguous or not out.flags.aligned or not out.flags.writeable:
        raise ValueError("out must be C-contiguous, aligned and writeable")


# ---------------------------------------------------------------------------------------------
# Kernel-level entry points for the tests (active tier).

def _quantize_rows(x):
    """Quantize each row of x [n, d] float32 with the active tier: (codes int8, scales float32)."""
    cdef const float[:, ::1] xm = _c_aligned(np.asarray(x, dtype=np.float32))
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


def _dots(q, k):
    """Exact int32 dots of q [d] int8 with each row of k [n, d] int8, by the active tier."""
    cdef const int8_t[::1] qm = np.ascontiguousarray(q, dtype=np.int8)
    cdef const int8_t[:, ::1] km = np.ascontiguousarray(k, dtype=np.int8)
    if km.shape[1] != qm.shape[0] or qm.shape[0] % 16 or qm.shape[0] > I8A_MAX_HEAD_DIM:
        raise ValueError("q [d] and k [n, d] need the same d, a multiple of 16 up to 1024")
    out = np.zeros(km.shape[0], np.int32)
    cdef int32_t[::1] om = out
    if km.shape[0]:
        i8a_load_tier(&_kt).dots(&qm[0], &km[0, 0], km.shape[0], qm.shape[0], &om[0])
    return out


def _rotate(x, sign, inverse=False):
    """The active tier's rotation of each row of x [n, d] float32, into a new array (the tier
    reads x and writes the copy: the out-of-place path; decode's inverse runs in place)."""
    cdef const float[:, ::1] xm = _c_aligned(np.asarray(x, dtype=np.float32))
    out = np.empty((xm.shape[0], xm.shape[1]), dtype=np.float32)
    cdef float[:, ::1] om = out
    cdef const float[::1] sm = _c_aligned(np.asarray(sign, dtype=np.float32))
    if xm.shape[1] != sm.shape[0] or xm.shape[1] % 16 or xm.shape[1] > I8A_MAX_HEAD_DIM:
        raise ValueError("x [n, d] and sign [d] need the same d, a multiple of 16 up to 1024")
    cdef Py_ssize_t r
    for r in range(xm.shape[0]):
        i8a_load_tier(&_kt).rotate(&xm[r, 0], xm.shape[1], &sm[0], 1 if inverse else 0, &om[r, 0])
    return out


CHUNK = I8A_CHUNK
