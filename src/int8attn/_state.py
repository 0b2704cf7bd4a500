"""A cache's state as a dict of arrays, and its file (an uncompressed ``.npz``): writing, reading
and checking it. The fields are listed in ``Int8KVCache.state_dict``'s docstring."""

import contextlib
from typing import NamedTuple

import numpy as np

from . import _format as F
from . import _rules as R
from ._args import INT_MAX, int_from

_INTS = ("n_kv_heads", "max_seq", "head_dim", "length")
# the codes and scales of a side, by its bits
_SIDE = {("k", 8): ("k_i8", "k_scale"), ("k", 4): ("k_codes", "k_group_min", "k_group_step"),
         ("v", 8): ("v_i8", "v_scale"), ("v", 4): ("v_codes", "v_min", "v_scale")}
_FLOAT_ROWS = ("k_first", "v_first", "k_offset", "v_offset")


class State(NamedTuple):
    """A checked state: the constructor's arguments, the length, and the arrays to copy in
    (each side's codes and scales, _SIDE, and the float rows the options need)."""
    n_kv_heads: int
    max_seq: int
    head_dim: int
    length: int
    k_bits: int
    v_bits: int
    rotate: bool
    rotation_seed: int
    keep_first: bool
    center: bool
    recent: int
    offsets_set: bool
    round_window: bool          # the window's rows are rounded to halves (version 3), else exact
    arrays: dict


def shapes_of(hkv, n, d, held=0):
    """Each array of a state (of n positions, `held` of them in the recent window) as its
    (dtype, shape): what the engine exports and load checks."""
    groups = -(-n // F.K4_GROUP)
    rows = {key: (np.float32, (hkv, d)) for key in _FLOAT_ROWS}
    return {"k_i8": (np.int8, (hkv, n, d)), "v_i8": (np.int8, (hkv, n, d)),
            "k_scale": (np.float32, (hkv, n)), "v_scale": (np.float32, (hkv, n)),
            "k_codes": (np.uint8, (hkv, n, d)), "v_codes": (np.uint8, (hkv, n, d)),
            "k_group_min": (np.float32, (hkv, groups, d)),
            "k_group_step": (np.float32, (hkv, groups, d)), "v_min": (np.float32, (hkv, n)),
            **rows, "k_recent": (np.float32, (held, hkv, d)),
            "v_recent": (np.float32, (held, hkv, d))}


def float_rows(keep_first, center):
    """The float rows a cache of these options holds: position 0 with keep_first, the offsets
    with center."""
    return (_FLOAT_ROWS[:2] if keep_first else ()) + (_FLOAT_ROWS[2:] if center else ())


def fields(k_bits, v_bits, keep_first=True, center=True):
    """The arrays a state of this format holds beside its settings: each side's codes and scales
    (_SIDE), the float rows (a saved state has all four, zeros where the cache has none; a
    cache loads those its options need) and the recent window's rows."""
    return (*_SIDE["k", k_bits], *_SIDE["v", v_bits], *float_rows(keep_first, center),
            "k_recent", "v_recent")


def state_of(n_kv_heads, max_seq, head_dim, k_bits, v_bits, rotate, rotation_seed, keep_first,
             center, recent, length, offsets_set, rows):
    """The state dict of a cache with these settings whose rows (``fields``' arrays, exported by
    the engine) are `rows`."""
    return {
        "format": F.FILE_FORMAT, "format_version": F.FILE_VERSION,
        "n_kv_heads": n_kv_heads, "max_seq": max_seq, "head_dim": head_dim, "length": length,
        "k_bits": k_bits, "v_bits": v_bits,
        "rotate": rotate, "rotation_seed": rotation_seed,
        "rotation_block": R.rotation_block(head_dim) if rotate else 0,
        **{key: rows[key] for k in ("k", "v") for key in _SIDE[k, (k_bits, v_bits)[k == "v"]]},
        "keep_first": keep_first, "center": center,
        **{key: rows[key] for key in _FLOAT_ROWS},
        "offsets_set": offsets_set, "recent": recent,
        "k_recent": rows["k_recent"], "v_recent": rows["v_recent"],
    }


# The fields each format version writes, by the version that added them: a version writes its
# own and those of the versions before it, and each side's codes and scales (_SIDE) beside.
_ROTATION = ("rotate", "rotation_seed", "rotation_block")
_ADDED = {1: (*_INTS, *_ROTATION), 2: ("keep_first", "center", *_FLOAT_ROWS),
          3: ("offsets_set", "recent", "k_recent", "v_recent"), 4: ("k_bits", "v_bits")}


def written(version):
    """The fields a state of format_version `version` holds beside its sides' codes and scales.
    (Two early writers held fewer, and check reads what their absence meant: version 1 before
    the rotation, without _ROTATION; version 2's first commit, without keep_first.)"""
    return tuple(key for v in range(1, version + 1) for key in _ADDED[v])


def _require(state, keys, version):
    """Each of keys is in state, or ValueError naming those that are not."""
    lacking = [key for key in keys if key not in state]
    if lacking:
        raise ValueError(f"state lacks {', '.join(lacking)}, which format_version {version} "
                         f"writes")


def _scalar(state, key, kind):
    """state[key] as a Python int ('int') or bool ('bool'): a 0-d array of an integer or bool
    dtype (ints, unsigned ones included, convert exactly), or ValueError naming the field."""
    try:
        a = np.asarray(state[key])
    except Exception:
        a = None
    if a is None or a.shape != () or a.dtype.kind not in ("b" if kind == "bool" else "iu"):
        what = "a bool" if kind == "bool" else "an integer"
        got = "an object numpy cannot read" if a is None else f"dtype {a.dtype}, shape {a.shape}"
        raise ValueError(f"state {key} must be {what}, got {got}")
    return bool(a) if kind == "bool" else int(a)


def _array(state, key, dtype, shape):
    """state[key] as a numpy array of exactly this dtype (native byte order) and shape (None:
    any length), or ValueError naming the field: nothing is cast."""
    try:
        a = np.asarray(state[key])
    except Exception:
        raise ValueError(f"state {key} must be an array, got an object numpy cannot read") from None
    if (a.dtype != dtype or not a.dtype.isnative or a.ndim != len(shape)
            or any(want is not None and got != want for got, want in zip(a.shape, shape))):
        want = ", ".join("n" if x is None else str(x) for x in shape)
        got = a.dtype.name if a.dtype.isnative else a.dtype.str
        raise ValueError(f"state {key} must be {np.dtype(dtype).name} [{want}], got {got} "
                         f"{list(a.shape)}")
    return a


def _zeros(a, key, why):
    """a (float32) is all +0.0, bit for bit (what a cache writes where it holds no row), or
    ValueError naming the field and the first other value."""
    bits = np.ascontiguousarray(a).view(np.uint32)
    if bits.any():
        at = tuple(int(i) for i in np.argwhere(bits)[0])
        raise ValueError(f"state {key} must be zeros {why}, got {float(a[at])} at {list(at)}")


def check(state, max_seq):
    """Validate a state dict (from state_dict or a file): a State, or ValueError naming the field
    (TypeError when state is not a mapping). Every field its format_version writes is required
    (nothing defaults), and each is taken exactly as it is or refused: what it loads into gives
    the same state_dict (of an older version: upgraded as docs/architecture.md says)."""
    if not hasattr(state, "keys"):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    missing = [k for k in ("format", "format_version") if k not in state]
    if missing:
        raise ValueError(f"state lacks {', '.join(missing)}: not an int8attn cache")
    fmt = np.asarray(state["format"])
    if fmt.shape != () or fmt.dtype.kind != "U" or str(fmt) != F.FILE_FORMAT:
        raise ValueError(f"state format is {str(fmt)[:60]!r}, expected {F.FILE_FORMAT!r}")
    version = _scalar(state, "format_version", "int")
    if not 1 <= version <= F.FILE_VERSION:
        raise ValueError(f"state format_version is {version}; this int8attn reads 1 to "
                         f"{F.FILE_VERSION}")
    # what the two early writers of a version did not write yet: version 1 before the rotation
    # (none), version 2 at its first commit (whose center kept position 0 too: keep_first = center)
    unrotated = version == 1 and not any(key in state for key in _ROTATION)
    first_of_2 = version == 2 and "keep_first" not in state
    absent = (_ROTATION if unrotated else ()) + (("keep_first",) if first_of_2 else ())
    _require(state, [key for key in written(version) if key not in absent], version)
    ints = {key: _scalar(state, key, "int") for key in _INTS}
    hkv, d, n = ints["n_kv_heads"], ints["head_dim"], ints["length"]
    for key in ("n_kv_heads", "max_seq", "head_dim"):
        if not 1 <= ints[key] <= INT_MAX:
            raise ValueError(f"state {key} must be from 1 to 2**63 - 1, got {ints[key]}")
    R.check_head_dim(d, R.STATE)
    cap = ints["max_seq"] if max_seq is None else int_from(max_seq, "max_seq", 1)
    if not 0 <= n <= cap:
        what = "the state's max_seq" if max_seq is None else "max_seq"
        raise ValueError(f"state length {n} does not fit {what}={cap}")
    bits = {side: (_scalar(state, f"{side}_bits", "int") if version >= 4 else 8)
            for side in ("k", "v")}
    for side, b in bits.items():
        R.check_bits(b, f"{side}_bits", R.STATE)
    R.check_head_dim_at_4_bits(d, bits["k"], bits["v"], R.STATE)
    sides = (*_SIDE["k", bits["k"]], *_SIDE["v", bits["v"]])
    _require(state, sides, version)
    shapes = shapes_of(hkv, n, d)
    arrays = {key: _array(state, key, *shapes[key]) for key in sides}
    for key in ("k_i8", "v_i8"):
        if key in arrays and n and arrays[key].min() < -127:
            raise ValueError(f"state {key} holds -128, which the quantizer never stores")
    for key, top, why in (("k_codes", 31, "K's wide channels"), ("v_codes", 15, "4 bits")):
        if key in arrays and n and arrays[key].max() > top:
            raise ValueError(f"state {key} holds codes above {top}, which {why} cannot hold")
    # the largest step or scale and minimum a side stores (rows within 2**70 in the stored
    # space: VALUE_MAX, grown by the rotation and the offsets)
    limits = {"k_scale": (0, F.SCALE_MAX),
              "v_scale": (0, F.SCALE_MAX) if bits["v"] == 8 else (0, F.STEP4_MAX),
              "k_group_step": (0, F.STEP4_MAX), "k_group_min": (-F.VALUE_MAX, F.VALUE_MAX),
              "v_min": (-F.OFFSET_MAX * 2, F.OFFSET_MAX * 2)}
    for key, (lo, hi) in limits.items():
        if key in arrays and not np.all((arrays[key] >= lo) & (arrays[key] <= hi)):
            what = "scales" if key.endswith("scale") else "values"
            raise ValueError(f"state {key} holds {what} outside [{lo:.3g}, {hi:.3g}] (negative, "
                             f"NaN, or beyond any row the format stores)")
    # the rotation: its block follows from head_dim (none without rotate)
    rotate, seed, block = (False, 0, 0) if unrotated else (
        _scalar(state, "rotate", "bool"), _scalar(state, "rotation_seed", "int"),
        _scalar(state, "rotation_block", "int"))
    R.check_seed(seed, R.STATE)
    want = R.rotation_block(d) if rotate else 0
    if block != want:
        raise ValueError(f"state rotation_block must be {want} for head_dim {d} with "
                         f"rotate={rotate}, got {block}")
    # the kept first position and the offsets (version 2; version 1 files have neither)
    center = version >= 2 and _scalar(state, "center", "bool")
    keep_first = center if first_of_2 else version >= 2 and _scalar(state, "keep_first", "bool")
    R.check_center(keep_first, center, bits["k"], bits["v"], R.STATE)
    # the recent window (version 3; before it, none) and whether the offsets are set (version 2
    # caches set them with their second token)
    recent = _scalar(state, "recent", "int") if version >= 3 else 0
    R.check_recent(recent, bits["k"], R.STATE)
    offsets_set = _scalar(state, "offsets_set", "bool") if version >= 3 else center and n >= 2
    if offsets_set and not center:
        raise ValueError("state has offsets_set without center, which int8attn never writes")
    # (any length: evict keeps the offsets of a cache it leaves with one token or none)
    # the float rows: a cache holds position 0 with keep_first and a token, the offsets while
    # they are set; zeros where it holds none (version 1: none)
    held_rows = {"first": (keep_first and n > 0, "without keep_first or a token"),
                 "offset": (offsets_set, "while the offsets are not set (offsets_set)")}
    for key in _FLOAT_ROWS:
        if version < 2:
            arrays[key] = np.zeros((hkv, d), np.float32)
            continue
        a = _array(state, key, np.float32, (hkv, d))
        held, why = held_rows[key.split("_")[1]]
        bound = F.VALUE_MAX if key.endswith("first") else F.OFFSET_MAX
        if not held:
            _zeros(a, key, why)
        elif not np.all(np.abs(a) <= bound):
            raise ValueError(f"state {key} holds NaN, Inf or values beyond +-{bound:.3g}")
        arrays[key] = a
    # the window's rows: at most what its ring holds of the positions the cache holds
    for key in ("k_recent", "v_recent"):
        if version < 3:
            arrays[key] = np.zeros((0, hkv, d), np.float32)
            continue
        a = _array(state, key, np.float32, (None, hkv, d))
        most = min(n, R.ring_slots(recent, cap))
        if len(a) > most:
            raise ValueError(f"state {key} holds {len(a)} positions; a cache of length {n} with "
                             f"recent={recent} and max_seq={cap} holds at most {most}")
        if not np.all(np.abs(a) <= F.VALUE_MAX):
            raise ValueError(f"state {key} holds NaN, Inf or values beyond +-{F.VALUE_MAX:.3g}")
        arrays[key] = a
    if arrays["k_recent"].shape != arrays["v_recent"].shape:
        raise ValueError(f"state k_recent and v_recent must have one shape, got "
                         f"{list(arrays['k_recent'].shape)} and {list(arrays['v_recent'].shape)}")
    # (the engine refuses group rows, and window rows but version 3's, that are not halves)
    return State(hkv, cap, d, n, bits["k"], bits["v"], rotate, seed, keep_first, center, recent,
                 offsets_set, version == 3, arrays)


def not_halves_message(which, bad, n_kv_heads, length, held):
    """The ValueError message of i8a_import's refusal: row `bad` of k_group_min, k_group_step,
    k_recent or v_recent (`which` 0 .. 3) is not halves times a power of two (state of `length`
    positions, `held` of them in the window); or (`which` 4) k_codes' row `bad` holds a code
    above 15 in a channel that is not wide."""
    if which == 4:
        g, pos = divmod(bad, length)
        return (f"state k_codes holds a code above 15 in a channel whose k_group_step is not a "
                f"wide channel's (an odd half): the first is in [{g}, {pos}] (kv head {g}, "
                f"position {pos})")
    key = ("k_group_min", "k_group_step", "k_recent", "v_recent")[which]
    if which < 2:
        g, j = divmod(bad, -(-length // F.K4_GROUP))
        where = f"[{g}, {j}] (kv head {g}, group {j})"
    else:
        j, g = divmod(bad, n_kv_heads)
        where = f"[{j}, {g}] (position {length - held + j}, kv head {g})"
    return (f"state {key} holds rows that are not halves times a power of two, as a cache writes "
            f"them: the first is {where}")


def options(s, general, name):
    """The constructor's options of the cache a checked state s holds: KVCache's (`general`)
    or Int8KVCache's (named `name`), which holds 8-bit sides only."""
    if (s.k_bits, s.v_bits) != (8, 8) and not general:
        raise ValueError(f"state holds a cache with k_bits={s.k_bits}, v_bits={s.v_bits}: load "
                         f"it as a KVCache ({name} is the 8-bit cache)")
    bits = {"k_bits": s.k_bits, "v_bits": s.v_bits} if general else {}
    return dict(rotate=s.rotate, rotation_seed=s.rotation_seed, keep_first=s.keep_first,
                center=s.center, recent=s.recent, **bits)


def allocation_error(s, max_seq, e):
    """The ValueError of a state s whose cache could not be made (e: why)."""
    what = "state max_seq" if max_seq is None else "max_seq"
    return ValueError(f"{what} {s.max_seq} cannot be allocated for n_kv_heads={s.n_kv_heads}, "
                      f"head_dim={s.head_dim} ({type(e).__name__}: {e}); pass a smaller "
                      f"max_seq (at least the state's length, {s.length})")


def save(state, path):
    """Write a state dict to path (a path, or a binary file object open for writing)."""
    with contextlib.nullcontext(path) if hasattr(path, "write") else open(path, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in state.items()})


def read(path):
    """The state dict in a file written by save (not yet checked): OSError when the file cannot
    be opened, ValueError when its content is truncated, corrupted or foreign (naming the array
    it could not read, when it got that far)."""
    with contextlib.nullcontext(path) if hasattr(path, "read") else open(path, "rb") as f:
        key = None
        try:
            with np.load(f, allow_pickle=False) as z:
                state = {}
                for key in z.files:
                    state[key] = z[key]
        except Exception as e:                   # zip, CRC, header, seek and pickle errors
            if "allow_pickle" in str(e):
                why = (("it" if key is None else f"its array {key}")
                       + " holds pickled Python objects, which a cache file never does")
            else:
                why = ("" if key is None else f"its array {key}: ") + f"{type(e).__name__}: {e}"
            raise ValueError(f"{path!s} is not a readable int8attn cache file: {why}") from None
    return state
