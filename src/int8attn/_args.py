"""Argument conversion and validation for the compiled front end (``_cache``).

Every function here either returns what C can take (C-contiguous, aligned float32 arrays and
plain ints and floats) or raises TypeError / ValueError naming the argument, the expected and
the actual value. ``_cache`` calls them with the cache's busy flag held: converting an argument
can run Python code (``__index__``, ``__float__``, an ndarray subclass), which can let another
thread in, so what they check against must not change meanwhile.
"""

import inspect
import math
from typing import NamedTuple

import numpy as np

from . import _format as F
from . import _rules as R

INT_MAX = (1 << 63) - 1                  # what any count of the cache fits in
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# -- scalars ------------------------------------------------------------------------------

def as_int(value, name):
    """value as a Python int (anything with __index__ but bool), or TypeError naming it."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value.__index__()


def int_from(value, name, low):
    """as_int(value), at least `low` and at most 2**63 - 1."""
    value = as_int(value, name)
    if value < low:
        raise ValueError(f"{name} must be {'positive' if low == 1 else f'at least {low}'}, "
                         f"got {value}")
    if value > INT_MAX:
        raise ValueError(f"{name} must be at most 2**63 - 1, got {value}")
    return value


def positive_float(value, name):
    """value as a float, finite and above 0 also in float32 (the kernels' type). A real number is
    what has __float__ or __index__ (float() would also parse a str or bytes), but not a bool
    (as for as_int)."""
    x = None
    if not isinstance(value, bool) and (hasattr(value, "__float__") or hasattr(value, "__index__")):
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            pass
    if x is None:
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not abs(x) <= _FLOAT32_MAX:
        raise ValueError(f"{name} must be finite in float32, got {value!r}")
    if not x > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if np.float32(x) == 0:
        raise ValueError(f"{name} must be positive in float32, got {value!r} (rounds to 0)")
    return x


def as_bool(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


# -- arrays -------------------------------------------------------------------------------

def is_torch(x):
    return type(x).__module__.partition(".")[0] == "torch"


def as_float32(x, name):
    """x as a float32 numpy array (no copy when it already is one), or TypeError naming `name`.
    Values beyond float32's range become inf, which the kernels then reject."""
    if type(x) is np.ndarray and x.dtype == np.float32:
        return x
    if is_torch(x):
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
        with np.errstate(over="ignore", invalid="ignore"):
            a = a.astype(np.float32)
    return a


def _torch_to_numpy(t, name):
    """A torch tensor as numpy, without a copy when it is a CPU float32 tensor (bfloat16 and the
    other float types numpy lacks are converted first)."""
    import torch
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got one on device {t.device}")
    t = t.detach()
    if t.is_floating_point() and t.dtype != torch.float32:
        t = t.float()
    return t.numpy()


def c_aligned(a):
    """a as a C-contiguous array whose items sit on their natural alignment (a itself when it is
    one: a buffer at an odd address, from a bytes object or a packed record, is copied)."""
    flags = a.flags
    if flags.c_contiguous and flags.aligned:
        return a
    return np.array(a, order="C")


def bad_row_message(name, x, where):
    """Why row x (float32, of argument `name`) is refused: NaN/Inf, or beyond VALUE_MAX."""
    if not np.all(np.isfinite(x)):
        return f"{name} holds NaN or Inf, or a value beyond float32 range ({where})"
    worst = float(np.max(np.abs(x)))
    return (f"{name} holds {worst:.3g} ({where}), beyond +-2**64 ({F.VALUE_MAX:.3g}), the largest "
            f"magnitude the cache format takes")


# -- the constructor ----------------------------------------------------------------------

def _constructor(n_kv_heads, max_seq, head_dim, *, rotate=F.DEFAULT["rotate"], rotation_seed=0,
                 keep_first=F.DEFAULT["keep_first"], center=None, recent=F.DEFAULT["recent"]):
    """Int8KVCache's signature (its C-level constructor takes any arguments)."""


def _general_constructor(n_kv_heads, max_seq, head_dim, *, k_bits=8, v_bits=8,
                         rotate=F.DEFAULT["rotate"], rotation_seed=0,
                         keep_first=F.DEFAULT["keep_first"], center=None,
                         recent=F.DEFAULT["recent"]):
    """KVCache's signature."""


SIGNATURE = inspect.signature(_constructor)
GENERAL_SIGNATURE = inspect.signature(_general_constructor)


def _as_center(value, name):
    return None if value is None else as_bool(value, name)     # None: the default


# the conversions of the format's options (the rules check the values: _rules.resolve)
_CONVERT = {"k_bits": as_int, "v_bits": as_int, "rotate": as_bool, "keep_first": as_bool,
            "center": _as_center, "recent": as_int, "rotation_seed": as_int}


class Options(NamedTuple):
    """A cache's constructor arguments, checked."""
    n_kv_heads: int
    max_seq: int
    head_dim: int
    k_bits: int
    v_bits: int
    rotate: bool
    rotation_seed: int
    keep_first: bool
    center: bool
    recent: int


def _bound(signature, args, kwargs, name, positional):
    """A constructor's arguments by name, the defaults filled in; TypeError naming the class
    when they do not bind."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{name}(): {e} ({positional} positional, the options keyword-only)") \
            from None
    bound.apply_defaults()
    return bound.arguments


def constructor(args, kwargs, general):
    """The arguments of KVCache (`general`) or Int8KVCache (8-bit sides only), checked."""
    a = _bound(GENERAL_SIGNATURE if general else SIGNATURE, args, kwargs,
               "KVCache" if general else "Int8KVCache", "n_kv_heads, max_seq and head_dim are")
    hkv = int_from(a["n_kv_heads"], "n_kv_heads", 1)
    cap = int_from(a["max_seq"], "max_seq", 1)
    d = int_from(a["head_dim"], "head_dim", 1)
    f = R.resolve(lambda name: _CONVERT[name](a.get(name, 8), name), d)   # (Int8KVCache: 8 bits)
    return Options(hkv, cap, d, *f)


# -- append and decode --------------------------------------------------------------------

def append(k, v, hkv, d, length, cap):
    """k and v as aligned C-contiguous float32 [T, Hkv, D] (T may be 0)."""
    ka = as_float32(k, "k")
    va = as_float32(v, "v")
    if ka.ndim not in (2, 3) or ka.shape[ka.ndim - 2:] != (hkv, d):
        raise ValueError(f"k must have shape [Hkv, D] or [T, Hkv, D] with Hkv={hkv}, D={d}; "
                         f"got {list(ka.shape)}")
    if va.shape != ka.shape:
        raise ValueError(f"v must have the shape of k, {list(ka.shape)}; got {list(va.shape)}")
    if ka.ndim == 2:
        ka, va = ka[None], va[None]
    t = ka.shape[0]
    if length + t > cap:
        raise ValueError(f"appending {t} token(s) to a cache holding {length} would exceed "
                         f"max_seq={cap}; nothing was appended")
    return c_aligned(ka), c_aligned(va)


def append_batch(k, v, hkv, d, room):
    """k and v as aligned C-contiguous float32 [B, T, Hkv, D] (T >= 1) for B caches whose
    (length, max_seq) are room[b]."""
    ka = as_float32(k, "k")
    va = as_float32(v, "v")
    b = len(room)
    if ka.ndim != 4 or ka.shape[0] != b or ka.shape[2:] != (hkv, d) or ka.shape[1] == 0:
        raise ValueError(f"k must have shape [B, T, Hkv, D] with B={b}, Hkv={hkv}, D={d}, "
                         f"T >= 1; got {list(ka.shape)}")
    if va.shape != ka.shape:
        raise ValueError(f"v must have the shape of k, {list(ka.shape)}; got {list(va.shape)}")
    t = ka.shape[1]
    for i, (length, cap) in enumerate(room):
        if length + t > cap:
            raise ValueError(f"caches[{i}]: appending {t} token(s) to a cache holding {length} "
                             f"would exceed max_seq={cap}; nothing was appended")
    return c_aligned(ka), c_aligned(va)


def queries_of(qa, batch=False):
    """T of decode's q ([B,] [T,] H, D as decode() gives it)."""
    return qa.shape[1 if batch else 0] if qa.ndim == (4 if batch else 3) else 1


def prefill(ka, q, scale, q_bits, out, window, sinks, softcap, length, hkv, d, cap,
            batch=None):
    """decode()'s checks for the queries of prefill's rows ka ([B,] T, Hkv, D, from append or
    append_batch) on caches of `length` tokens before them: q must be [B,] [T, H, D]."""
    lead = 0 if batch is None else 1
    t = ka.shape[lead]
    qa = as_float32(q, "q")
    if qa.ndim != 3 + lead or qa.shape[lead] != t:
        want = f"[T, H, D] with T={t}" if not lead else f"[B, T, H, D] with B={batch}, T={t}"
        raise ValueError(f"q must have shape {want} (a query for every new token, T as k's); "
                         f"got {list(qa.shape)}")
    return decode(q if is_torch(q) else qa, scale, q_bits, out, window,
                  sinks, softcap, length + t, hkv, d, cap, batch)


def decode(q, scale, q_bits, out, window, sinks, softcap, length, hkv, d, cap, batch=None):
    """The decode's arguments, checked: (q as aligned C-contiguous float32 [T, H, D] or
    [H, D], out as a writable float32 array of q's shape, what decode returns, scale, q_bits,
    window (0: none), sinks, softcap (0: none)). Windows and sinks past the capacity change
    nothing and are clamped to it. With `batch` (decode_batch: B caches, the shortest holding
    `length` tokens), q is [B, T, H, D] or [B, H, D]."""
    if length == 0:
        raise ValueError("decode on an empty cache: append at least one token first")
    qa = as_float32(q, "q")
    lead = 0 if batch is None else 1
    if (qa.ndim - lead not in (2, 3) or qa.shape[qa.ndim - 1] != d or 0 in qa.shape
            or lead and qa.shape[0] != batch):
        want = "[H, D] or [T, H, D] with" if not lead else f"[B, H, D] or [B, T, H, D] with B={batch},"
        raise ValueError(f"q must have shape {want} D={d}, H >= 1, T >= 1; "
                         f"got {list(qa.shape)}")
    shape = qa.shape
    core = shape[lead:]
    t, h = (1, core[0]) if len(core) == 2 else (core[0], core[1])
    if h % hkv != 0:
        raise ValueError(f"q has H={h} query heads, not a multiple of n_kv_heads={hkv}")
    if t > length:
        holds = "the cache holds" if not lead else "the shortest cache holds"
        raise ValueError(f"q holds T={t} query positions but {holds} {length} "
                         f"tokens: the queries must be the last T of them")
    scale, q_bits, window, sinks, cap_value = decode_options(scale, q_bits, window, sinks,
                                                             softcap, d)
    out, result = out_for(out, shape, q)
    return (c_aligned(qa), out, result, scale, q_bits, min(window, cap), min(sinks, cap),
            cap_value)


def decode_options(scale, q_bits, window, sinks, softcap, d):
    """A decode's options beyond q, checked: (scale, q_bits, window (0: none), sinks, softcap
    (0: none)); scale None is head_dim ** -0.5."""
    q_bits = as_int(q_bits, "q_bits")
    if q_bits not in (8, 16):
        raise ValueError(f"q_bits must be 16 or 8, got {q_bits!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else positive_float(scale, "scale")
    if window is not None:
        window = int_from(window, "window", 1)
    sinks = int_from(sinks, "sinks", 0)
    if sinks and window is None:
        raise ValueError(f"sinks={sinks} needs a window: sinks are the positions kept visible "
                         f"outside it")
    if window is not None and sinks > window:
        raise ValueError(f"sinks must be at most window={window}, got {sinks}")
    cap_value = 0.0
    if softcap is not None:
        cap_value = positive_float(softcap, "softcap")
        if not F.SOFTCAP_RANGE[0] <= cap_value <= F.SOFTCAP_RANGE[1]:
            raise ValueError(f"softcap must be from 2**-126 to 2**126, got {softcap!r}")
    return scale, q_bits, 0 if window is None else window, sinks, cap_value


def out_for(out, shape, q):
    """(the float32 array the engine writes, what the call returns) for out= of this shape: a
    new array (a torch tensor when q is one) when out is None."""
    result = out
    if out is None:
        out = np.empty(shape, np.float32)
        result = _torch_from_numpy(out) if is_torch(q) else out
    elif is_torch(out):
        out = _torch_out(out, shape)
    else:
        _check_out(out, shape)
    return out, result


def decode_error(rc, bad, q, scale):
    """The ValueError of a decode the engine refused (rc 1 or 2) for q row `bad`."""
    h = q.shape[q.ndim - 2]
    where = f"query head {bad % h}" if q.ndim == 2 else f"position {bad // h}, head {bad % h}"
    row = q.reshape(-1, q.shape[-1])[bad]
    if rc == 1:
        return ValueError(bad_row_message("q", row, where))
    worst = float(np.max(np.abs(row))) * scale
    return ValueError(f"scale * max|q| is {worst:.3g} ({where}), above 2**40 "
                      f"({F.QSCALE_MAX:.3g}): the logits could leave float32's range; "
                      f"lower the scale or the magnitude of q")


def _check_out(out, shape):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray or a torch tensor, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise TypeError(f"out must have dtype float32, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"out must have shape {list(shape)}, got {list(out.shape)}")
    if not out.flags.c_contiguous or not out.flags.aligned or not out.flags.writeable:
        raise ValueError("out must be C-contiguous, aligned and writeable")


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
    a = t.numpy() if t.is_contiguous() else None
    if a is None or not a.flags.aligned or not a.flags.writeable:
        raise ValueError("out must be C-contiguous, aligned and writeable")
    return a


def _torch_from_numpy(a):
    import torch
    return torch.from_numpy(a)


# -- the paged pool -----------------------------------------------------------------------

def _paged_constructor(n_kv_heads, head_dim, block_size, num_blocks, *, buffer=None,
                       rotation_seed=0, open_blocks=0):
    """PagedKVCache's signature."""


PAGED_SIGNATURE = inspect.signature(_paged_constructor)


class PagedOptions(NamedTuple):
    """A paged pool's constructor arguments, checked."""
    n_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    buffer: object
    rotation_seed: int
    open_blocks: int


def paged_constructor(args, kwargs):
    """The arguments of PagedKVCache, checked."""
    a = _bound(PAGED_SIGNATURE, args, kwargs, "PagedKVCache",
               "n_kv_heads, head_dim, block_size and num_blocks are")
    hkv = int_from(a["n_kv_heads"], "n_kv_heads", 1)
    d = int_from(a["head_dim"], "head_dim", 1)
    R.check_head_dim(d)
    bs = as_int(a["block_size"], "block_size")
    R.check_block_size(bs)
    blocks = int_from(a["num_blocks"], "num_blocks", 1)
    seed = as_int(a["rotation_seed"], "rotation_seed")
    R.check_seed(seed)
    if hkv * bs * (2 * d + 8) * blocks > INT_MAX:
        raise ValueError(f"num_blocks={blocks} blocks of {bs} positions with n_kv_heads={hkv}, "
                         f"head_dim={d} need more bytes than this platform can address")
    opened = int_from(a["open_blocks"], "open_blocks", 0)
    if opened >= 1 << 31 or hkv * bs * (4 * d + 8) * opened > INT_MAX:
        raise ValueError(f"open_blocks={opened} entries of {bs} positions with n_kv_heads={hkv}, "
                         f"head_dim={d} need more bytes than this platform can address")
    return PagedOptions(hkv, d, bs, blocks, a["buffer"], seed, opened)


def aligned_zeros(shape, dtype):
    """A C-contiguous array of zeros of shape and dtype starting at a 64-byte boundary."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at:at + nbytes].view(dtype).reshape(shape)


def paged_buffer(buffer, num_blocks, block_bytes):
    """The pool's memory as a writable uint8 numpy array [num_blocks, block_bytes] at a 64-byte
    boundary: new zeros when buffer is None, else buffer's own memory (a numpy array or a CPU
    torch tensor of 1-byte items, C-contiguous, exactly num_blocks * block_bytes bytes)."""
    nbytes = num_blocks * block_bytes
    if buffer is None:
        return aligned_zeros((num_blocks, block_bytes), np.uint8)
    a = buffer
    if is_torch(buffer):
        if buffer.device.type != "cpu":
            raise ValueError(f"buffer must be a CPU tensor, got one on device {buffer.device}")
        if buffer.element_size() != 1 or buffer.is_floating_point():
            raise TypeError(f"buffer must hold bytes (torch.uint8 or torch.int8), got "
                            f"{buffer.dtype}")
        a = buffer.detach().numpy() if buffer.is_contiguous() else None
        if a is None:
            raise ValueError("buffer must be C-contiguous")
    if not isinstance(a, np.ndarray):
        raise TypeError(f"buffer must be a numpy.ndarray or a torch tensor, got "
                        f"{type(buffer).__name__}")
    if a.dtype not in (np.uint8, np.int8):
        raise TypeError(f"buffer must have dtype uint8 or int8, got {a.dtype}")
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("buffer must be C-contiguous and writeable")
    if a.nbytes != nbytes:
        raise ValueError(f"buffer must hold num_blocks * block_bytes = {num_blocks} * "
                         f"{block_bytes} = {nbytes} bytes, got {a.nbytes}")
    if a.ctypes.data % 64:
        raise ValueError(f"buffer must start at a multiple of 64 bytes, got address "
                         f"{a.ctypes.data:#x}")
    return a.view(np.uint8).reshape(num_blocks, block_bytes)


def _int_array(x, name, ndim, dtype=np.int64):
    """x as a C-contiguous numpy array of ndim dimensions of dtype (int64, or int32 when every
    value fits it), or TypeError / ValueError naming it."""
    if type(x) is np.ndarray and x.dtype == dtype and x.ndim == ndim and x.flags.c_contiguous:
        return x                            # a serving engine's own arrays: nothing to do
    a = x.detach().numpy() if is_torch(x) else np.asarray(x)
    if a.dtype.kind not in "iu" or a.dtype == np.uint64:
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension{'s' if ndim > 1 else ''}, "
                         f"got shape {list(a.shape)}")
    if a.dtype.itemsize > np.dtype(dtype).itemsize and a.size:
        info = np.iinfo(dtype)
        if int(a.min()) < info.min or int(a.max()) > info.max:
            raise ValueError(f"{name} holds values beyond {np.dtype(dtype).name}")
    return a if a.dtype == dtype and a.flags.c_contiguous else np.ascontiguousarray(a, dtype)
