"""Bad input: a clear ValueError/TypeError naming the argument, and the cache exactly as before."""

import numpy as np
import pytest

import int8attn as ia
from conftest import assert_same_state, filled_cache, snapshot


@pytest.mark.parametrize("args, exc, match", [
    ((0, 10, 16), ValueError, "n_kv_heads must be positive, got 0"),
    ((2, -1, 16), ValueError, "max_seq must be positive, got -1"),
    ((2, 10, 0), ValueError, "head_dim must be positive"),
    ((2, 10, 24), ValueError, "head_dim must be a multiple of 16 and at most 1024, got 24"),
    ((2, 10, 1040), ValueError, "head_dim .* got 1040"),
    ((2.0, 10, 16), TypeError, "n_kv_heads must be an int, got float"),
    ((2, "10", 16), TypeError, "max_seq must be an int, got str"),
    ((True, 10, 16), TypeError, "n_kv_heads must be an int, got bool"),
])
def test_constructor_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        ia.Int8KVCache(*args)


@pytest.fixture
def cache():
    c, _, _ = filled_cache(np.random.default_rng(0), 2, 32, 20, cap=24)
    return c


def good(*shape):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize("k, v, exc, match", [
    (good(3, 32), good(3, 32), ValueError, r"k must have shape .*Hkv=2, D=32.*got \[3, 32\]"),
    (good(2, 16), good(2, 16), ValueError, r"k must have shape .*got \[2, 16\]"),
    (good(32), good(32), ValueError, r"k must have shape .*got \[32\]"),
    (good(1, 1, 2, 32), good(1, 1, 2, 32), ValueError, r"k must have shape"),
    (good(2, 32), good(1, 2, 32), ValueError, r"v must have the shape of k, \[2, 32\]; got \[1, 2, 32\]"),
    (good(2, 2, 32), good(3, 2, 32), ValueError, r"v must have the shape of k"),
    (good(5, 2, 32), good(5, 2, 32), ValueError, r"appending 5 token\(s\) to a cache holding 20 would exceed max_seq=24"),
    (np.ones((2, 32), complex), good(2, 32), TypeError, r"k must hold real numbers .* complex128"),
    (good(2, 32), np.array([["a"] * 32] * 2), TypeError, r"v must hold real numbers"),
    ("abc", good(2, 32), TypeError, r"k must hold real numbers"),
    (object(), good(2, 32), TypeError, r"k must hold real numbers .*object"),
    ([[1.0] * 32, [1.0] * 31], good(2, 32), TypeError, r"k must be a float array-like"),
])
def test_append_bad_input_leaves_cache_unchanged(cache, k, v, exc, match):
    before = snapshot(cache)
    with pytest.raises(exc, match=match):
        cache.append(k, v)
    assert_same_state(cache, before)


@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])
def test_non_finite_batch_is_all_or_nothing(tier, cache, which, bad):
    k = np.ones((3, 2, 32), np.float32)
    v = np.ones((3, 2, 32), np.float64)
    arr = k if which == "k" else v
    with np.errstate(over="ignore"):
        arr[2, 1, 31] = bad                      # the last row of the batch: the rest was quantized
    before = snapshot(cache)
    with pytest.raises(ValueError, match=rf"{which} holds NaN or Inf, or a value beyond float32 range \(token 2, kv head 1\); nothing was appended"):
        cache.append(k, v)
    assert_same_state(cache, before)
    cache.append(np.ones((4, 2, 32)), np.ones((4, 2, 32)))   # it still takes a full batch
    assert len(cache) == 24


def test_batch_past_max_seq_appends_nothing(cache):
    before = snapshot(cache)
    with pytest.raises(ValueError, match="max_seq=24"):
        cache.append(good(5, 2, 32), good(5, 2, 32))
    assert_same_state(cache, before)
    cache.append(good(4, 2, 32), good(4, 2, 32))
    with pytest.raises(ValueError, match="holding 24 would exceed max_seq=24"):
        cache.append(good(2, 32), good(2, 32))
    assert len(cache) == 24


def test_empty_batch_is_a_no_op(cache):
    before = snapshot(cache)
    cache.append(np.zeros((0, 2, 32)), np.zeros((0, 2, 32)))
    assert_same_state(cache, before)


@pytest.mark.parametrize("q, kwargs, exc, match", [
    (good(4, 16), {}, ValueError, r"q must have shape \[H, D\] or \[T, H, D\] with D=32, H >= 1, T >= 1; got \[4, 16\]"),
    (good(32), {}, ValueError, r"q must have shape \[H, D\] or \[T, H, D\]"),
    (good(1, 1, 4, 32), {}, ValueError, r"q must have shape \[H, D\] or \[T, H, D\]"),
    (good(0, 32), {}, ValueError, r"got \[0, 32\]"),
    (good(0, 4, 32), {}, ValueError, r"got \[0, 4, 32\]"),
    (good(21, 4, 32), {}, ValueError, r"q holds T=21 query positions but the cache holds 20 tokens"),
    (good(4, 32), {"window": 0}, ValueError, r"window must be positive, got 0"),
    (good(4, 32), {"window": 2.5}, TypeError, r"window must be an int, got float"),
    (good(4, 32), {"sinks": 2}, ValueError, r"sinks=2 needs a window"),
    (good(4, 32), {"window": 4, "sinks": 5}, ValueError, r"sinks must be at most window=4, got 5"),
    (good(4, 32), {"window": 4, "sinks": -1}, ValueError, r"sinks must be at least 0, got -1"),
    (good(4, 32), {"softcap": 0.0}, ValueError, r"softcap must be positive, got 0.0"),
    (good(4, 32), {"softcap": -3}, ValueError, r"softcap must be positive"),
    (good(4, 32), {"softcap": float("inf")}, ValueError, r"softcap must be finite"),
    (good(4, 32), {"softcap": "x"}, TypeError, r"softcap must be a real number, got str"),
    (good(2, 4, 32), {"out": np.empty((4, 32), np.float32)}, ValueError, r"out must have shape \[2, 4, 32\], got \[4, 32\]"),
    (good(3, 32), {}, ValueError, r"q has H=3 query heads, not a multiple of n_kv_heads=2"),
    (good(4, 32), {"q_bits": 4}, ValueError, r"q_bits must be 16 or 8, got 4"),
    (good(4, 32), {"q_bits": True}, TypeError, r"q_bits must be an int, got bool"),
    (good(4, 32), {"q_bits": 8.0}, TypeError, r"q_bits must be an int, got float"),
    (good(4, 32), {"scale": 0.0}, ValueError, r"scale must be positive, got 0.0"),
    (good(4, 32), {"scale": -0.3}, ValueError, r"scale must be positive, got -0.3"),
    (good(4, 32), {"scale": 1e-50}, ValueError, r"scale must be positive in float32, got 1e-50 \(rounds to 0\)"),
    (good(4, 32), {"window": 2 ** 64}, ValueError, r"window must be at most 2\*\*63 - 1, got 18446744073709551616"),
    (good(4, 32), {"window": 4, "sinks": 2 ** 64}, ValueError, r"sinks must be at most 2\*\*63 - 1"),
    (good(4, 32), {"softcap": 1e-39}, ValueError, r"softcap must be from 2\*\*-126 to 2\*\*126, got 1e-39"),
    (good(4, 32), {"softcap": 1e38}, ValueError, r"softcap must be from 2\*\*-126 to 2\*\*126"),
    (good(4, 32), {"scale": float("nan")}, ValueError, r"scale must be finite"),
    (good(4, 32), {"scale": 1e39}, ValueError, r"scale must be finite in float32"),
    (good(4, 32), {"scale": "x"}, TypeError, r"scale must be a real number, got str"),
    (good(4, 32), {"out": np.empty((4, 32), np.float64)}, TypeError, r"out must have dtype float32"),
    (good(4, 32), {"out": np.empty((2, 32), np.float32)}, ValueError, r"out must have shape \[4, 32\]"),
    (good(4, 32), {"out": np.empty((32, 4), np.float32).T}, ValueError, r"out must be C-contiguous"),
    (good(4, 32), {"out": [[0.0] * 32] * 4}, TypeError, r"out must be a numpy.ndarray or a torch tensor, got list"),
    (np.ones((4, 32), complex), {}, TypeError, r"q must hold real numbers"),
])
def test_decode_bad_input(cache, q, kwargs, exc, match):
    before = snapshot(cache)
    with pytest.raises(exc, match=match):
        cache.decode(q, **kwargs)
    assert_same_state(cache, before)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_decode_non_finite_q(tier, cache, bad):
    q = np.ones((4, 32), np.float32)
    q[3, 5] = bad
    out = np.full((4, 32), 7.0, np.float32)
    before = snapshot(cache)
    with pytest.raises(ValueError, match=r"q holds NaN or Inf, or a value beyond float32 range \(query head 3\)"):
        cache.decode(q, out=out)
    assert np.all(out == 7.0)                      # out untouched too
    assert_same_state(cache, before)


def test_decode_empty_cache():
    c = ia.Int8KVCache(2, 8, 16)
    with pytest.raises(ValueError, match="decode on an empty cache"):
        c.decode(good(2, 16))


def test_read_only_out_rejected(cache):
    out = np.empty((4, 32), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        cache.decode(good(4, 32), out=out)


# -- numeric arguments given what is not a number (issue 29, finding 5) ------------------------

NOT_NUMBERS = ["0.5", b"16", [2], None, object(), 1j, True]
DECODE_NUMBERS = {"scale": "a real number", "softcap": "a real number", "window": "an int",
                  "sinks": "an int", "q_bits": "an int"}


def _type_name(x):
    return type(x).__name__


@pytest.mark.parametrize("value", NOT_NUMBERS, ids=_type_name)
@pytest.mark.parametrize("name", list(DECODE_NUMBERS))
@pytest.mark.parametrize("batch", [False, True], ids=["decode", "decode_batch"])
def test_decode_numbers_refuse_what_is_not_a_number(cache, name, value, batch):
    """A str (or bytes, a list, None, any object, a complex or a bool) for a numeric argument of
    decode or decode_batch is a TypeError naming the argument, what it must be and what it got.
    Before the fix scale="0.5" and softcap=b"30" were parsed as floats. (window=None is its
    default and sinks=0 needs no window; a bool is no int for the counts, nor a float.)"""
    if value is None and name in ("scale", "softcap", "window"):
        pytest.skip("None is this argument's default")
    kw = {name: value}
    if name == "sinks":
        kw["window"] = 4
    before = snapshot(cache)
    with pytest.raises(TypeError, match=f"^{name} must be {DECODE_NUMBERS[name]}, got "
                                        f"{_type_name(value)}$"):
        if batch:
            ia.decode_batch([cache], good(1, 4, 32), **kw)
        else:
            cache.decode(good(4, 32), **kw)
    assert_same_state(cache, before)


@pytest.mark.parametrize("value", NOT_NUMBERS, ids=_type_name)
@pytest.mark.parametrize("name", ["n_kv_heads", "max_seq", "head_dim", "k_bits", "v_bits",
                                  "recent", "rotation_seed"])
def test_constructor_numbers_refuse_what_is_not_a_number(name, value):
    args = {"n_kv_heads": 2, "max_seq": 10, "head_dim": 32}
    kw = {}
    (args if name in args else kw)[name] = value
    with pytest.raises(TypeError, match=f"^{name} must be an int, got {_type_name(value)}$"):
        ia.KVCache(*args.values(), **kw)
