"""Regression tests of the hardening audit (issue 13): one block per finding, each with the
audit's reproducer. Races and re-entry, float32's edges, careless files, misaligned buffers."""

import threading
import time

import numpy as np
import pytest

import int8attn as ia
from int8attn import reference as R
from conftest import (CONTRACT, assert_same_state, assert_tiers_agree, each_tier, filled_cache,
                      attention_over_history, rel_err, snapshot)

PLAIN = ia.FORMATS["plain"]
FORMATS = list(ia.FORMATS.values())       # plain .. default
FORMAT_IDS = list(ia.FORMATS)


def every_tier(fn):
    """fn() once per supported tier, the results' bits equal on all; returns the first."""
    outs = each_tier(fn)
    assert_tiers_agree(outs)
    return outs["scalar"]


# -- finding 1: every argument is converted and checked under the cache's busy flag -----------

class _Hook:
    """Runs `action` (catching what it raises) wherever Python lets us in mid-call."""

    def __init__(self, action):
        self.action, self.raised = action, []

    def __call__(self):
        try:
            self.action()
        except Exception as e:               # noqa: BLE001 -- recorded and asserted on
            self.raised.append(e)


class _ReentrantOut(np.ndarray):
    """An out= whose views run Python code: the hook fires as decode reshapes it."""

    hook = None

    def __array_finalize__(self, obj):
        if _ReentrantOut.hook is not None:
            _ReentrantOut.hook()


class _Number:
    def __init__(self, value, hook):
        self.value, self.hook = value, hook

    def __float__(self):
        self.hook()
        return float(self.value)

    def __index__(self):
        self.hook()
        return int(self.value)


def _mutations(cache, rng):
    """What another caller could do to the cache while a call is converting its arguments."""
    d, hkv = cache.head_dim, cache.n_kv_heads
    return {
        "truncate": lambda: cache.truncate(0),
        "append": lambda: cache.append(rng.standard_normal((1, hkv, d)), rng.standard_normal((1, hkv, d))),
        "reset": cache.reset,
        "decode": lambda: cache.decode(np.ones((hkv, d), np.float32)),
        "dequantize": cache.dequantize,
        "state_dict": cache.state_dict,
    }


@pytest.mark.parametrize("mutation", ["truncate", "append", "reset", "decode", "dequantize",
                                      "state_dict"])
@pytest.mark.parametrize("where", ["out", "scale", "window", "softcap"])
def test_python_code_inside_decode_cannot_touch_the_cache(mutation, where):
    rng = np.random.default_rng(1)
    cache, _, _ = filled_cache(rng, 2, 32, 300, cap=301)
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    want = cache.decode(q, window=280, softcap=30.0)
    before = snapshot(cache)
    hook = _Hook(_mutations(cache, rng)[mutation])
    kwargs = {"window": 280, "softcap": 30.0}
    if where == "out":
        kwargs["out"] = np.empty(q.shape, np.float32).view(_ReentrantOut)
        _ReentrantOut.hook = hook
    elif where == "scale":
        kwargs["scale"] = _Number(32 ** -0.5, hook)
    else:
        kwargs[where] = _Number(kwargs[where], hook)
    try:
        got = cache.decode(q, **kwargs)
    finally:
        _ReentrantOut.hook = None
    assert hook.raised and all(isinstance(e, RuntimeError) and "in use" in str(e) for e in hook.raised)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert_same_state(cache, before)


@pytest.mark.parametrize("mutation", ["truncate", "append", "decode"])
def test_python_code_inside_append_and_truncate_cannot_touch_the_cache(mutation):
    rng = np.random.default_rng(2)
    cache, _, _ = filled_cache(rng, 2, 32, 3, cap=4)
    hook = _Hook(_mutations(cache, rng)[mutation])

    class K(np.ndarray):                    # k whose conversion to float32 runs the hook
        def __array_finalize__(self, obj):
            if getattr(hook, "armed", False):
                hook()

    k = rng.standard_normal((1, 2, 32)).view(K)
    hook.armed = True
    cache.append(k, rng.standard_normal((1, 2, 32)))
    assert len(cache) == 4 == cache.max_seq          # not 5 > max_seq: the hook's append failed
    assert hook.raised and all(isinstance(e, RuntimeError) for e in hook.raised)
    hook.raised.clear()
    cache.truncate(_Number(2, hook))
    assert len(cache) == 2 and hook.raised


class _SlowMemmap(np.memmap):
    """A memmap whose views give the GIL away, so another thread runs mid-call."""

    def __array_finalize__(self, obj):
        super().__array_finalize__(obj)
        time.sleep(1e-4)


def test_decode_into_a_memmap_while_another_thread_appends(tmp_path):
    """The audit's heap overflow: decode sized its scratch from len, another thread appended
    while out= ran Python code, and the kernels wrote past the scratch. Each call now holds the
    cache from its first argument to its return: the loser of a race raises RuntimeError."""
    rng = np.random.default_rng(3)
    cap, d = 600, 64
    cache, _, v0 = filled_cache(rng, 2, d, 4, cap=cap)
    out = _SlowMemmap(tmp_path / "out.f32", dtype=np.float32, mode="w+", shape=(4, 4, d))
    q = rng.standard_normal((4, 4, d)).astype(np.float32)
    rows = rng.standard_normal((8, 2, d)).astype(np.float32)
    lo = min(v0.min(), rows.min()) - 0.05
    hi = max(v0.max(), rows.max()) + 0.05
    stop = threading.Event()
    counts = {"busy": 0, "appended": 0, "decoded": 0, "refused": 0}

    def writer():
        while not stop.is_set():
            try:
                if len(cache) + 8 > cap:
                    cache.truncate(4)
                else:
                    cache.append(rows, rows)
                    counts["appended"] += 1
            except RuntimeError:
                counts["busy"] += 1
            time.sleep(0)                            # give the GIL away with the cache free

    t = threading.Thread(target=writer)
    t.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                res = cache.decode(q, out=out)
            except RuntimeError:
                counts["refused"] += 1
                time.sleep(0)
                continue
            res = np.asarray(res)                    # a weighted mean of V rows: inside their range
            assert np.all((res >= lo) & (res <= hi)), "decode read rows it was not sized for"
            counts["decoded"] += 1
    finally:
        stop.set()
        t.join()
    assert counts["decoded"] and counts["appended"] and counts["busy"]   # the race was run
    assert 4 <= len(cache) <= cap
    kd, vd = cache.dequantize()                      # and the cache is whole
    assert rel_err(cache.decode(q[-1]), R.attention(q[-1], kd, vd)) <= CONTRACT


def test_no_cache_exists_without_its_buffers():
    """The buffers are made by the C-level constructor, which __new__ runs too and which
    cannot be called again, so no call can swap them from under a running decode."""
    cache = ia.Int8KVCache.__new__(ia.Int8KVCache, 1, 4, 16)
    assert len(cache) == 0 and cache.max_seq == 4
    with pytest.raises(TypeError, match=r"Int8KVCache\(\): missing a required argument"):
        ia.Int8KVCache.__new__(ia.Int8KVCache)
    cache.append(np.ones((1, 16)), np.ones((1, 16)))
    cache.__init__(2, 8, 32)                        # a no-op: the cache keeps its buffers
    assert (len(cache), cache.n_kv_heads, cache.max_seq) == (1, 1, 4)
    with pytest.raises(TypeError, match=r"Int8KVCache\(\): too many positional arguments"):
        ia.Int8KVCache(1, 4, 16, True)


# -- finding 2: logits that would leave float32 are refused, not computed --------------------

def test_a_scale_whose_logits_could_overflow_is_refused(tier):
    cache = ia.Int8KVCache(1, 4, 16, **PLAIN)
    one = np.ones((1, 16), np.float32)
    cache.append(one, one)
    cache.append(-one, 2 * one)
    before = snapshot(cache)
    out = np.full((1, 16), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"scale \* max\|q\| is 1e\+38 \(query head 0\), above 2\*\*40"):
        cache.decode(one, scale=1e38, out=out)
    with pytest.raises(ValueError, match=r"scale must be positive, got -1e\+38"):
        cache.decode(one, scale=-1e38, out=out)
    assert np.all(out == 7.0)
    assert_same_state(cache, before)
    # at the bound the logits are +-2**44: one-hot on position 0, exactly 1
    np.testing.assert_array_equal(cache.decode(one, scale=2.0 ** 40), one)
    np.testing.assert_array_equal(cache.decode(one, scale=2.0 ** 40, q_bits=8), one)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_the_largest_inputs_give_finite_one_hot_attention_on_every_tier(fmt):
    """Values at +-2**64 and scale * max|q| at 2**40: logits near 2**86, every tier the same
    bits, each output a V row (the softmax is one-hot at that size)."""
    rng = np.random.default_rng(4)
    big = np.float32(2.0 ** 64)
    k = (np.sign(rng.standard_normal((40, 2, 32))) * big).astype(np.float32)
    v = rng.standard_normal((40, 2, 32)).astype(np.float32)
    cache = ia.Int8KVCache(2, 40, 32, **fmt)
    cache.append(k, v)
    q = (np.sign(rng.standard_normal((4, 32))) * big).astype(np.float32)
    scale = 2.0 ** 40 / float(big)
    out = every_tier(lambda: cache.decode(q, scale=scale))
    kd, vd = cache.dequantize()
    assert np.all(np.isfinite(out)) and np.all(np.abs(out) <= np.abs(vd).max() * (1 + 1e-5))
    if fmt is PLAIN:        # exact codes and logits: the same ties as float64 attention (the
        # weights of the ties in integer planes: within 1 / (2 * 127^3) of the largest, emulated)
        np.testing.assert_allclose(out, R.emulate(q, cache, scale=scale), atol=1e-6)
        np.testing.assert_allclose(out, R.attention(q, kd, vd, scale=scale), atol=1e-4)


def test_the_bounds_are_exact_at_their_edge():
    cache = ia.Int8KVCache(1, 2, 16, **PLAIN)
    cache.append(np.ones((1, 16)), np.ones((1, 16)))
    q = np.full((1, 16), 3.0, np.float32)
    edge = np.float32(2.0 ** 40 / 3.0)
    while float(edge) * 3.0 > 2.0 ** 40:            # the largest float32 scale at the bound
        edge = np.nextafter(edge, np.float32(0))
    cache.decode(q, scale=float(edge))
    with pytest.raises(ValueError, match=r"above 2\*\*40"):
        cache.decode(q, scale=float(np.nextafter(edge, np.float32(np.inf))))
    top = np.float32(2.0 ** 64)
    cache.decode(np.full((1, 16), top), scale=2.0 ** -30)
    with pytest.raises(ValueError, match=r"beyond \+-2\*\*64"):
        cache.decode(np.full((1, 16), np.nextafter(top, np.float32(np.inf))), scale=2.0 ** -30)
    with pytest.raises(ValueError, match=r"beyond \+-2\*\*64"):
        cache.append(np.full((1, 16), -np.nextafter(top, np.float32(np.inf))), np.ones((1, 16)))


# -- finding 3: the V sums cannot overflow ------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_v_at_the_limit_over_a_whole_chunk_stays_finite(fmt):
    cache = ia.Int8KVCache(1, 600, 16, **fmt)
    with pytest.raises(ValueError, match=r"v holds 1e\+37 \(token 0, kv head 0\), beyond \+-2\*\*64"):
        cache.append(np.zeros((256, 1, 16), np.float32), np.full((256, 1, 16), 1e37, np.float32))
    assert len(cache) == 0
    top = np.float32(2.0 ** 64)
    v = np.full((600, 1, 16), top, np.float32)
    v[::2] *= -1
    v[:, :, 1::2] = top                       # half the channels cancel, half add up
    cache.append(np.zeros((600, 1, 16), np.float32), v)
    out = every_tier(lambda: cache.decode(np.ones((1, 16), np.float32)))
    kd, vd = cache.dequantize()
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(vd))
    np.testing.assert_allclose(out, R.attention(np.ones((1, 16)), kd, vd), atol=1e-3 * float(top))


# -- finding 4: one outlier in the prefill that sets the offsets ---------------------------

@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("outlier", [1e12, 1e18])
def test_an_outlier_in_the_offset_prefill_does_not_break_later_decodes(tier, which, outlier):
    rng = np.random.default_rng(5)
    cache = ia.Int8KVCache(2, 400, 64, **ia.FORMATS["centered"])
    k = rng.standard_normal((100, 2, 64)).astype(np.float32) + 2.0
    v = rng.standard_normal((100, 2, 64)).astype(np.float32) - 1.0
    (k if which == "k" else v)[50, 1, 7] = outlier
    cache.append(k[:1], v[:1])
    cache.append(k[1:], v[1:])                      # sets the offsets
    off = cache.k_offset if which == "k" else cache.v_offset
    assert np.all(off[1] == 0)                      # the outlier's head: no offset ...
    assert np.abs(off[0]).max() > 1.0               # ... the other still centered
    cache.append(rng.standard_normal((200, 2, 64)).astype(np.float32) + 2.0,
                 rng.standard_normal((200, 2, 64)).astype(np.float32) - 1.0)
    kd, vd = cache.dequantize()
    for t in (1, 5):
        q = rng.standard_normal((t, 4, 64)).astype(np.float32)
        assert rel_err(cache.decode(q).reshape(-1, 64),
                       R.attention(q, kd, vd).reshape(-1, 64)) <= 1e-3
    with pytest.raises(ValueError, match=r"beyond \+-2\*\*64"):   # 3e30: past the format's range
        big = k.copy()
        big[50, 1, 7] = 3e30
        ia.Int8KVCache(2, 400, 64).append(big, v)


def test_a_prefill_with_a_real_common_offset_keeps_it():
    rng = np.random.default_rng(6)
    cache = ia.Int8KVCache(2, 100, 64, **ia.FORMATS["centered"])
    base = rng.standard_normal((2, 64)).astype(np.float32) * 4
    cache.append(base + rng.standard_normal((100, 2, 64)).astype(np.float32), np.zeros((100, 2, 64)))
    assert np.abs(cache.k_offset).max() > 1.0 and np.all(cache.v_offset == 0)


# -- finding 5: the soft cap keeps full precision for logits far below it ------------------

@pytest.mark.parametrize("cap", [30.0, 1e5, 1e8, 2.0 ** 126])
def test_soft_cap_without_cancellation(cap):
    rng = np.random.default_rng(7)
    cache, _, _ = filled_cache(rng, 2, 64, 700, "outlier")
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    out = every_tier(lambda: cache.decode(q, softcap=cap))
    ref = attention_over_history(cache, q, softcap=cap)
    assert rel_err(out.reshape(-1, 64), ref.reshape(-1, 64)) <= CONTRACT
    if cap >= 1e5:      # the cap changes no logit by more than a float32 step (which can move
        # a weight across a rounding boundary of its integer planes: 1 / 127^3 of the chunk's top)
        np.testing.assert_allclose(out, cache.decode(q), rtol=0, atol=1e-5)


def test_soft_cap_saturates_huge_logits_to_the_cap():
    cache = ia.Int8KVCache(1, 3, 16, **PLAIN)
    one = np.ones((3, 1, 16), np.float32)
    cache.append(one * np.array([1.0, -1.0, 0.5], np.float32)[:, None, None], one * np.arange(3)[:, None, None])
    # logits 2**40 * 16 * (1, -1, 0.5): capped to (1, -1, ~1) * 2 -> weights e^2, e^-2, e^2
    out = every_tier(lambda: cache.decode(np.ones((1, 16), np.float32), scale=2.0 ** 40, softcap=2.0))
    w = np.exp([2.0, -2.0, 2.0])
    np.testing.assert_allclose(out[0, 0], (w @ np.arange(3)) / w.sum(), rtol=4e-5)
    # exactly: V rows 0, 1, 2 are codes 0, 127, 127 at scales 0, 1/127, 2/127, and the weights
    # p * scale (p = 1, e^-4, 1 after the chunk's max) go through the integer planes
    p = np.exp([0.0, -4.0, 0.0])
    planes = R.weight_planes(p * np.array([0.0, 1.0, 2.0], np.float32) / np.float32(127))
    np.testing.assert_allclose(out[0, 0], planes @ [0.0, 127.0, 127.0] / p.sum(), rtol=1e-6)


# -- finding 6: finite rows beyond the format's range are refused by name ----------------

@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_rows_past_the_range_are_refused_with_their_value(fmt):
    cache = ia.Int8KVCache(1, 4, 16, **fmt)
    with pytest.raises(ValueError, match=r"k holds 1e\+38 \(token 0, kv head 0\), beyond \+-2\*\*64 "
                                         r"\(1.84e\+19\), the largest magnitude the cache format takes"):
        cache.append(np.full((1, 16), 1e38), np.ones((1, 16)))
    with pytest.raises(ValueError, match=r"q holds 3e\+20 \(query head 0\), beyond \+-2\*\*64"):
        cache.append(np.ones((1, 16)), np.ones((1, 16)))
        cache.decode(np.full((1, 16), 3e20), scale=1e-20)
    top = np.full((2, 1, 16), 2.0 ** 64, np.float32)
    cache.append(top, -top)                                       # the limit itself is taken
    kd, vd = cache.dequantize()
    assert np.all(np.isfinite(kd)) and np.all(np.isfinite(vd))


# -- finding 7: misaligned buffers --------------------------------------------------------

def _misaligned(a):
    """A copy of float32 a whose data starts one byte past an aligned address."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    m = np.frombuffer(raw.data, dtype=np.float32, count=a.size, offset=1).reshape(a.shape)
    m[...] = a
    assert not m.flags.aligned
    return m


def test_misaligned_inputs_are_read_as_their_values(tier):
    rng = np.random.default_rng(8)
    k = rng.standard_normal((40, 2, 32)).astype(np.float32)
    v = rng.standard_normal((40, 2, 32)).astype(np.float32)
    q = rng.standard_normal((2, 4, 32)).astype(np.float32)
    a, b = ia.Int8KVCache(2, 40, 32), ia.Int8KVCache(2, 40, 32)
    a.append(k, v)
    b.append(_misaligned(k), _misaligned(v))
    np.testing.assert_array_equal(b.k_i8, a.k_i8)
    np.testing.assert_array_equal(b.decode(_misaligned(q)), a.decode(q))
    with pytest.raises(ValueError, match="out must be C-contiguous, aligned and writeable"):
        a.decode(q, out=_misaligned(np.zeros(q.shape, np.float32)))


# -- finding 8: careless arguments and files raise ValueError naming the field -------------

def test_windows_and_sinks_longer_than_the_cache_see_everything():
    rng = np.random.default_rng(9)
    cache, _, _ = filled_cache(rng, 2, 32, 50)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    want = cache.decode(q)
    np.testing.assert_array_equal(cache.decode(q, window=2 ** 63 - 1), want)
    np.testing.assert_array_equal(cache.decode(q, window=2 ** 62, sinks=2 ** 61), want)


def _state(**changes):
    cache, _, _ = filled_cache(np.random.default_rng(10), 2, 32, 5, cap=8)
    s = cache.state_dict()
    s.update(changes)
    return s


@pytest.mark.parametrize("changes, match", [
    ({"max_seq": 2 ** 62}, r"max_seq 4611686018427387904 cannot be allocated"),
    ({"max_seq": 2 ** 64}, r"state max_seq must be an integer, got dtype object"),
    ({"max_seq": 2 ** 40}, r"max_seq 1099511627776 cannot be allocated"),
    ({"format_version": [2, 2]}, r"state format_version must be an integer, got dtype int64, shape \(2,\)"),
    ({"format_version": 2.0}, r"state format_version must be an integer, got dtype float64"),
    ({"keep_first": "no"}, r"state keep_first must be a bool, got dtype <U2"),
    ({"center": 1}, r"state center must be a bool, got dtype int64"),
    ({"rotate": np.array([True])}, r"state rotate must be a bool"),
    ({"length": 9}, r"state length 9 does not fit the state's max_seq=8"),
    ({"n_kv_heads": 0}, r"state n_kv_heads must be from 1"),
    ({"format": np.array(["int8attn.Int8KVCache"] * 2)}, r"state format is"),
])
def test_bad_state_fields_raise_value_error_naming_them(changes, match):
    with pytest.raises(ValueError, match=match):
        ia.Int8KVCache.from_state_dict(_state(**changes))


def test_scales_and_float_rows_beyond_the_format_are_refused():
    s = _state()
    ks = s["k_scale"].copy()
    ks[0, 2] = 3e38
    with pytest.raises(ValueError, match=r"state k_scale holds scales outside \[0, 9.3e\+18\]"):
        ia.Int8KVCache.from_state_dict(dict(s, k_scale=ks))
    kf = s["k_first"].copy()
    kf[1, 3] = 1e30
    with pytest.raises(ValueError, match=r"state k_first holds NaN, Inf or values beyond \+-1.84e\+19"):
        ia.Int8KVCache.from_state_dict(dict(s, k_first=kf))


def test_corrupt_files_raise_value_error(tmp_path):
    cache, _, _ = filled_cache(np.random.default_rng(11), 2, 32, 5, cap=8)
    path = tmp_path / "c.npz"
    cache.save(path)
    data = bytearray(path.read_bytes())
    end = data.rindex(b"PK\x05\x06")                # the zip's end-of-central-directory record
    data[end + 16] ^= 0x40                          # its central-directory offset, one bit
    (tmp_path / "flipped.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"flipped.npz is not a readable int8attn cache file"):
        ia.Int8KVCache.load(tmp_path / "flipped.npz")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "objects.npz", format=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"holds pickled Python objects") as e:
        ia.Int8KVCache.load(tmp_path / "objects.npz")
    assert "allow_pickle" not in str(e.value)
    with pytest.raises(FileNotFoundError):
        ia.Int8KVCache.load(tmp_path / "missing.npz")
    s = cache.state_dict()
    s["max_seq"] = 2 ** 40
    np.savez(tmp_path / "huge.npz", **{k: np.asarray(v) for k, v in s.items()})
    with pytest.raises(ValueError, match=r"state max_seq 1099511627776 cannot be allocated"):
        ia.Int8KVCache.load(tmp_path / "huge.npz")
    assert len(ia.Int8KVCache.load(tmp_path / "huge.npz", max_seq=8)) == 5
