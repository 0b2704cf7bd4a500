import contextlib
import gc
import os

import numpy as np
import pytest

import int8attn as ia
from int8attn import _cache
from int8attn import reference as R

# The tiers a run tests. A run that pins one with INT8ATTN_ISA (.ci/test_wheel.py runs the suite
# once per tier) tests that tier only: the other runs test the others. A run without it tests
# every tier this CPU has.
PINNED = _cache._requested_isa(os.environ)
TIERS = (PINNED,) if PINNED else ia.supported_isas()
# The tiers a cross-tier test compares: those under test, and the scalar tier they must equal.
AGREEING = tuple(dict.fromkeys(("scalar",) + TIERS))
# The contract every tier is tested against (docs/architecture.md, "Accuracy"): q_bits=16 within
# CONTRACT of fp32 attention over the cache's dequantize() (rel_err), q_bits=8 within EMULATION
# (relative to max|ref|) of reference.emulate, the kernel's method in float64.
CONTRACT = 1e-3
EMULATION = 1e-4
# Under a CPU emulator (the qemu lanes of .ci/run) numpy's float code runs 20 to 1000 times
# slower; matrix() then keeps every case but fewer combinations of them.
EMULATED = bool(os.environ.get("INT8ATTN_TEST_LAUNCHER") or os.environ.get("QEMU_CPU"))


def matrix(cases, formats, every_format):
    """(case, format) pairs: all of them natively; under emulation every case with the first
    and the last format (the default and the plain one, by convention) and every format with
    the cases at the indices `every_format`."""
    if not EMULATED:
        return [(c, f) for c in cases for f in formats]
    pairs = [(c, f) for c in cases for f in (formats[0], formats[-1])]
    pairs += [(cases[i], f) for i in every_format for f in formats[1:-1]]
    return pairs


@contextlib.contextmanager
def active_tier(name):
    """Make `name` the active tier inside the block, and the previous one active again after it
    (also when the block raises)."""
    before = ia.isa()
    _cache._set_isa(name)
    try:
        yield name
    finally:
        _cache._set_isa(before)


def skip_reason(name):
    """Why this run does not test tier `name` (one this build has), or None when it does."""
    if name not in ia.supported_isas():
        return f"{name}: not on this CPU"
    if name not in TIERS:
        return f"{name}: this run tests INT8ATTN_ISA={PINNED} only"
    return None


def pytest_report_header(config):
    return (f"int8attn tiers: compiled {', '.join(_cache._COMPILED)}; this CPU has "
            f"{', '.join(ia.supported_isas())}; under test {', '.join(TIERS)}"
            + (f" (INT8ATTN_ISA={PINNED})" if PINNED else ""))


@pytest.fixture(params=_cache._COMPILED)
def tier(request):
    """Run the test once per tier this build has, with that tier active; the tiers this run does
    not test (the CPU lacks them, or the run pins another) are skipped with the reason."""
    reason = skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    with active_tier(request.param):
        yield request.param


@pytest.fixture
def threads():
    """Puts the thread count back after the test."""
    before = ia.get_num_threads()
    yield
    ia.set_num_threads(before)


def each_tier(fn):
    """{tier: fn()} with each tier of AGREEING active in turn."""
    outs = {}
    for name in AGREEING:
        with active_tier(name):
            outs[name] = fn()
    return outs


def assert_tiers_agree(outs, what=""):
    """Every float32 result of each_tier has the scalar tier's bits."""
    for name, out in outs.items():
        np.testing.assert_array_equal(np.asarray(out).view(np.int32),
                                      np.asarray(outs["scalar"]).view(np.int32),
                                      err_msg=f"{name} {what}".strip())


def assert_tiers_and_threads_agree(fn, what="", threads=(1, 2, 3)):
    """fn() on every tier of AGREEING at each thread count: the same bits at every count, and
    every tier the scalar tier's."""
    def run():
        outs = []
        for n in threads:
            ia.set_num_threads(n)
            outs.append(fn())
        return outs

    before = ia.get_num_threads()
    try:
        outs = each_tier(run)
    finally:
        ia.set_num_threads(before)
    for name, per_threads in outs.items():
        for out in per_threads[1:]:
            np.testing.assert_array_equal(out.view(np.int32), per_threads[0].view(np.int32),
                                          err_msg=f"{name} {what}".strip())
    assert_tiers_agree({name: o[0] for name, o in outs.items()}, what)


def make_kv(rng, s, hkv, d, kind="gauss"):
    """K, V [s, hkv, d] float32. kind 'outlier': K has a few channels 20x larger (real K does)."""
    k = rng.standard_normal((s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((s, hkv, d)).astype(np.float32)
    if kind == "outlier":
        chans = rng.choice(d, size=max(1, d // 32), replace=False)
        k[:, :, chans] *= 20.0
    return k, v


def filled_cache(rng, h_kv, d, s, kind="gauss", cap=None, **options):
    """A cache of s random tokens (options: Int8KVCache keywords, e.g. rotate); also K and V."""
    k, v = make_kv(rng, s, h_kv, d, kind)
    cache = ia.Int8KVCache(h_kv, cap or s, d, **options)
    cache.append(k, v)
    return cache, k, v


def rel_err(out, ref):
    """Per query head: max|out - ref| / max|ref|; returns the worst head."""
    num = np.max(np.abs(out.astype(np.float64) - ref), axis=1)
    den = np.max(np.abs(ref.astype(np.float64)), axis=1)
    return float(np.max(num / den))


def snapshot(cache):
    """Everything a cache holds (with centering, the float rows of position 0 and the offsets;
    with a side at 4 bits, every array of its state_dict but the capacity)."""
    if (getattr(cache, "k_bits", 8), getattr(cache, "v_bits", 8)) != (8, 8):
        state = cache.state_dict()
        return (len(cache), *(np.array(state[k], copy=True) for k in sorted(state) if k != "max_seq"))
    return (len(cache), cache.k_i8.copy(), cache.v_i8.copy(), cache.k_scale.copy(),
            cache.v_scale.copy(), cache.k_first, cache.v_first, cache.k_offset, cache.v_offset)


def assert_same_state(cache, snap):
    now = snapshot(cache)
    assert now[0] == snap[0]
    for a, b in zip(now[1:], snap[1:]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


# The fields each file format version writes (docs/architecture.md, "The file format"): those
# it added and every earlier version's, and each side's codes and scales by its bits.
WRITES = {1: ("format", "format_version", "n_kv_heads", "max_seq", "head_dim", "length",
              "rotate", "rotation_seed", "rotation_block"),
          2: ("keep_first", "center", "k_first", "v_first", "k_offset", "v_offset"),
          3: ("offsets_set", "recent", "k_recent", "v_recent"),
          4: ("k_bits", "v_bits")}
SIDE_ARRAYS = {("k", 8): ("k_i8", "k_scale"), ("v", 8): ("v_i8", "v_scale"),
               ("k", 4): ("k_codes", "k_group_min", "k_group_step"),
               ("v", 4): ("v_codes", "v_min", "v_scale")}


def written(state):
    """The fields a state's format_version writes, for its sides' bits (8 before version 4)."""
    version = int(state["format_version"])
    bits = (int(state["k_bits"]), int(state["v_bits"])) if version >= 4 else (8, 8)
    return [*(key for v in range(1, version + 1) for key in WRITES[v]),
            *SIDE_ARRAYS["k", bits[0]], *SIDE_ARRAYS["v", bits[1]]]


def assert_same_states(a, b, skip=()):
    """Caches a and b hold the same state: every state_dict field but those in skip, of the same
    dtype and shape and bit for bit (so -0.0 is not 0.0)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if key in skip:
            continue
        x, y = np.asarray(sa[key]), np.asarray(sb[key])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)), key


def assert_loads_exactly(given, cache):
    """cache, loaded from the state `given` without a new max_seq, gives it back: every field
    given's format_version writes, bit for bit and of the same kind (bool, integer, the array's
    dtype and shape). The documented upgrades of older versions: format_version becomes the
    current one, and version 3's window rows are rounded to halves (files from before them)."""
    got = cache.state_dict()
    version = int(given["format_version"])
    for key in written(given):
        a, b = np.asarray(given[key]), np.asarray(got[key])
        if key == "format_version":
            a = np.asarray(4)
        elif key.endswith("_recent") and version == 3:
            a = R.half_rows(a)
        if a.ndim == 0 and a.dtype.kind in "biu":
            assert (a.dtype.kind == "b") == (b.dtype.kind == "b") and a.item() == b.item(), key
        else:
            assert (a.dtype, a.shape) == (b.dtype, b.shape), (key, a.dtype, a.shape, b.dtype, b.shape)
            assert a.tobytes() == b.tobytes(), key


def live_caches():
    """How many caches exist (after a collection): a refused load must leave none behind."""
    gc.collect()
    return sum(isinstance(o, ia.KVCache) for o in gc.get_objects())


def attention_over_history(cache, q, **options):
    """R.attention of q ([H, D], or [T, H, D] at the last T positions) over what each query
    reads: the history the cache, cut after the query's own position, dequantizes to (with a
    recent window each query reads the window of its own position)."""
    q = np.asarray(q, np.float32)
    rows = q[None] if q.ndim == 2 else q
    t, n = len(rows), len(cache)
    state = cache.state_dict() if t > 1 else None
    outs = []
    for i in range(t):
        cut = cache if t == 1 else type(cache).from_state_dict(state)
        if t > 1:
            cut.truncate(n - t + i + 1)
        outs.append(R.attention(rows[i], *cut.dequantize(), **options))
    out = np.stack(outs)
    return out[0] if q.ndim == 2 else out
