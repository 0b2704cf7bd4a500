"""Centering: position 0 kept as float32, the rows after it stored minus a per-kv-head offset.

Decode must stay attention over the cache's dequantized history (position 0 exact, every other
row codes * scale + offset) on every tier, under every decode option; the offsets must come from
the append that first reaches past position 0 and stay until a truncate to <= 1 token."""

import numpy as np
import pytest

import int8attn as ia
from conftest import (CONTRACT, EMULATION, assert_same_state, assert_tiers_agree, each_tier,
                      make_kv, rel_err, snapshot)
from int8attn import _format
from int8attn import reference as R


# These tests are of centering without a recent window (the "centered" format, the default
# before 0.4): the offsets come from the first append past position 0. With a window they
# come from positions 1 .. recent (tests/test_recent.py).
def Centered(*args, **kw):
    return ia.Int8KVCache(*args, center=True, recent=0, **kw)


def shifted_kv(rng, s, hkv, d, shift=6.0):
    """K and V with a large per-channel offset shared by every token (as real K has), and a
    position 0 unlike the rest (an attention sink)."""
    k, v = make_kv(rng, s, hkv, d)
    k += (rng.standard_normal((hkv, d)) * shift).astype(np.float32)
    v += (rng.standard_normal((hkv, d)) * shift / 2).astype(np.float32)
    k[0] = (rng.standard_normal((hkv, d)) * 4).astype(np.float32)
    return k, v


@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "plain"])
def test_offsets_come_from_the_first_append_past_position_0(rotate):
    rng = np.random.default_rng(1)
    k, v = shifted_kv(rng, 90, 3, 48)
    cache = Centered(3, 200, 48, rotate=rotate)
    assert cache.center and cache.k_first is None and cache.k_offset is None
    cache.append(k[:1], v[:1])                          # position 0 alone: no offsets yet
    np.testing.assert_array_equal(cache.k_first, k[0])
    np.testing.assert_array_equal(cache.v_first, v[0])
    assert cache.k_offset is None and cache.v_offset is None
    cache.append(k[1:50], v[1:50])
    sign = R.rotation_signs(48, 0)
    for got, x in ((cache.k_offset, k), (cache.v_offset, v)):
        mean = x[1:50].astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(got, R.rotate(mean, sign) if rotate else mean, atol=1e-5, rtol=0)
    before = cache.k_offset
    cache.append(k[50:], v[50:])                        # later appends keep them
    np.testing.assert_array_equal(cache.k_offset, before)
    kd, vd = cache.dequantize()
    np.testing.assert_array_equal(kd[0], k[0])          # position 0 exactly as appended
    np.testing.assert_array_equal(vd[0], v[0])
    # the codes hold the rows minus the offset: a far smaller error than codes of the rows
    plain = ia.Int8KVCache(3, 200, 48, rotate=rotate, center=False, recent=0)
    plain.append(k, v)
    rms = [float(np.sqrt(np.mean((c.dequantize()[0][1:] - k[1:]) ** 2))) for c in (cache, plain)]
    assert rms[0] * 3 < rms[1], rms


def test_an_append_that_starts_the_cache_past_position_0_uses_its_own_rows():
    rng = np.random.default_rng(2)
    k, v = shifted_kv(rng, 40, 2, 32)
    cache = Centered(2, 40, 32, rotate=False)
    cache.append(k, v)
    np.testing.assert_allclose(cache.k_offset, k[1:].astype(np.float64).mean(axis=0), atol=1e-5)


@pytest.mark.parametrize("rows", [_format.OFFSET_MIN_ROWS - 1, _format.OFFSET_MIN_ROWS])
def test_too_few_rows_for_a_mean_give_zero_offsets(rows):
    """The append that sets the offsets holds `rows` rows past position 0: from 16 on they are
    its mean, below that zeros."""
    assert _format.OFFSET_MIN_ROWS == 16
    rng = np.random.default_rng(2)
    k, v = shifted_kv(rng, 40, 2, 32)
    cache = Centered(2, 40, 32, rotate=False)
    cache.append(k[:1], v[:1])
    cache.append(k[1:1 + rows], v[1:1 + rows])
    if rows >= 16:
        mean = k[1:1 + rows].astype(np.float64).mean(0)
        np.testing.assert_allclose(cache.k_offset, mean, atol=1e-5)
        assert np.all(cache.v_offset != 0)
    else:
        assert not cache.k_offset.any() and not cache.v_offset.any()


def test_zero_offsets_center_nothing(tier):
    """A cache filled token by token gets zero offsets, and then holds the codes and returns
    the values of a cache without centering, under every decode option."""
    rng = np.random.default_rng(12)
    k, v = shifted_kv(rng, 300, 2, 64)
    one, plain = Centered(2, 300, 64), ia.Int8KVCache(2, 300, 64, center=False, recent=0)
    for t in range(300):
        one.append(k[t], v[t])
    plain.append(k, v)
    assert not one.k_offset.any() and not one.v_offset.any()
    for a, b in zip(snapshot(one)[:7], snapshot(plain)[:7]):
        np.testing.assert_array_equal(a, b)
    q = rng.standard_normal((5, 8, 64)).astype(np.float32)
    for opts in ({}, {"window": 100, "sinks": 2}, {"softcap": 30.0}, {"q_bits": 8}):
        np.testing.assert_array_equal(one.decode(q, **opts), plain.decode(q, **opts))


@pytest.mark.parametrize("split", [1, 100, 257])
def test_grouping_after_the_offsets_are_set_does_not_change_a_bit(tier, split):
    rng = np.random.default_rng(3)
    k, v = make_kv(rng, 300, 4, 64, "outlier")
    bulk = Centered(4, 300, 64)
    bulk.append(k[:split + 1], v[:split + 1])
    bulk.append(k[split + 1:], v[split + 1:])
    one = Centered(4, 300, 64)
    one.append(k[:split + 1], v[:split + 1])
    for t in range(split + 1, 300):
        one.append(k[t], v[t])
    assert_same_state(one, snapshot(bulk))
    q = rng.standard_normal((8, 64)).astype(np.float32)
    np.testing.assert_array_equal(bulk.decode(q), one.decode(q))


def test_truncating_to_one_token_drops_the_offsets():
    rng = np.random.default_rng(4)
    k, v = shifted_kv(rng, 80, 2, 64)
    k2, v2 = shifted_kv(rng, 30, 2, 64)
    cache = Centered(2, 100, 64)
    cache.append(k, v)
    cache.truncate(40)                                  # rows past 0 remain: offsets stay
    kept = cache.k_offset
    assert kept is not None
    cache.truncate(1)
    assert cache.k_offset is None and cache.k_first is not None
    cache.append(k2[1:], v2[1:])                         # new offsets from these rows
    direct = Centered(2, 100, 64)
    direct.append(k[:1], v[:1])
    direct.append(k2[1:], v2[1:])
    assert_same_state(cache, snapshot(direct))
    assert not np.array_equal(cache.k_offset, kept)
    q = rng.standard_normal((6, 64)).astype(np.float32)
    np.testing.assert_array_equal(cache.decode(q), direct.decode(q))
    cache.reset()
    assert cache.k_first is None and cache.k_offset is None and len(cache) == 0


SHAPES = [(8, 2, 64, 300), (12, 3, 48, 1030), (4, 4, 128, 2), (6, 1, 80, 257), (2, 2, 16, 1)]


@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "plain"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "H{}-Hkv{}-D{}-S{}".format(*s))
def test_centered_cache_is_attention_over_its_dequantized_history(tier, shape, rotate):
    """Against fp32 attention over dequantize() (position 0 exact, rows codes * scale + offset),
    within the contract's 1e-3 for q_bits=16, under windows, sinks, softcap and T queries; and
    equal to the kernel-exact emulation for q_bits=8."""
    h, hkv, d, s = shape
    rng = np.random.default_rng(s + d + h)
    k, v = shifted_kv(rng, s, hkv, d)
    cache = Centered(hkv, s, d, rotate=rotate)
    cache.append(k[:1], v[:1])
    if s > 1:
        cache.append(k[1:], v[1:])
    kd, vd = cache.dequantize()
    q = (rng.standard_normal((h, d)) * 0.5).astype(np.float32)
    assert rel_err(cache.decode(q), R.attention(q, kd, vd)) <= CONTRACT
    out8 = cache.decode(q, q_bits=8)
    emu = R.emulate(q, cache, q_bits=8)
    scale = np.max(np.abs(R.attention(q, kd, vd)), axis=1, keepdims=True)
    assert float(np.max(np.abs(out8 - emu) / scale)) <= EMULATION
    t = min(s, 3)
    qt = (rng.standard_normal((t, h, d)) * 0.5).astype(np.float32)
    for opts in ({}, {"window": 5}, {"window": 5, "sinks": 1}, {"window": 2, "sinks": 2},
                 {"softcap": 3.0}, {"window": 300, "sinks": 3, "softcap": 2.0}):
        ref = R.attention(qt, kd, vd, **opts)
        got = cache.decode(qt, **opts)
        for i in range(t):
            assert rel_err(got[i], ref[i]) <= CONTRACT, (opts, i)


def test_every_tier_returns_the_same_bits_under_every_option():
    rng = np.random.default_rng(6)
    k, v = shifted_kv(rng, 700, 2, 96)
    cache = Centered(2, 700, 96)
    cache.append(k, v)
    q = rng.standard_normal((4, 4, 96)).astype(np.float32)
    for opts in ({}, {"window": 300}, {"window": 300, "sinks": 1}, {"softcap": 5.0},
                 {"window": 10, "sinks": 4, "softcap": 1.5}, {"q_bits": 8}):
        assert_tiers_agree(each_tier(lambda: cache.decode(q, **opts)), str(opts))


def test_centering_tames_a_common_k_offset(tier):
    """The format's own error against the unquantized K/V: several times smaller with centering
    when every K row shares a large offset and position 0 is a sink unlike the rest."""
    rng = np.random.default_rng(7)
    k, v = shifted_kv(rng, 600, 2, 128)
    q = (rng.standard_normal((8, 128)) * 0.3).astype(np.float32)
    ref = R.attention(q, k, v)
    errs = {}
    for center in (False, True):
        cache = ia.Int8KVCache(2, 600, 128, center=center, recent=0)
        cache.append(k, v)
        errs[center] = rel_err(cache.decode(q), ref)
    assert errs[True] * 3 < errs[False], errs


def test_a_failed_first_append_past_position_0_sets_nothing(tier):
    rng = np.random.default_rng(8)
    k, v = shifted_kv(rng, 20, 2, 32)
    cache = Centered(2, 40, 32)
    cache.append(k[:1], v[:1])
    snap = snapshot(cache)
    bad_v = v[1:].copy()
    bad_v[5, 1, 3] = np.nan                              # token 5 of this append, kv head 1
    with pytest.raises(ValueError, match=r"v holds NaN.*token 5, kv head 1"):
        cache.append(k[1:], bad_v)
    assert_same_state(cache, snap)
    bad_k = k[1:].copy()
    bad_k[7, 0, 0] = np.inf
    bad_k[9, 1, 0] = np.nan
    with pytest.raises(ValueError, match=r"k holds NaN.*token 7, kv head 0"):
        cache.append(bad_k, v[1:])
    assert_same_state(cache, snap)
    cache.append(k[1:], v[1:])                          # and then it works
    assert cache.k_offset is not None and len(cache) == 20


@pytest.mark.parametrize("hkv, d", [(5, 16), (6, 1024)])    # (6, 1024): two blocks of heads
def test_the_offset_append_reports_the_bad_row_an_uncentered_one_does(hkv, d):
    """The offset-setting append checks every row before it stores one, summing heads in blocks;
    whatever rows hold NaN or Inf, it names the row a cache without centering names (the first
    in row order, k before v) and stores nothing."""
    rng = np.random.default_rng(13)
    k, v = shifted_kv(rng, 40, hkv, d)
    # (side, token, head): position 0 before a later row; the same row in k and v; the last head
    fixed = [[(1, 9, 0), (1, 0, hkv - 1)], [(1, 4, 2), (0, 4, 2)], [(0, 30, hkv - 1)]]
    trials = fixed + [[(int(rng.integers(0, 2)), int(rng.integers(0, 40)), int(rng.integers(0, hkv)))
                       for _ in range(1 + i % 3)] for i in range(12)]
    for trial, rows in enumerate(trials):
        bk, bv = k.copy(), v.copy()
        for side, tok, head in rows:
            (bk, bv)[side][tok, head, rng.integers(0, d)] = (np.nan, np.inf)[trial % 2]
        messages = []
        for center in (True, False):
            cache = ia.Int8KVCache(hkv, 40, d, center=center, recent=0)
            with pytest.raises(ValueError) as err:
                cache.append(bk, bv)
            assert len(cache) == 0 and cache.k_offset is None
            messages.append(str(err.value))
        assert messages[0] == messages[1]


@pytest.mark.parametrize("n", [0, 1, 2, 50])
def test_save_and_load_keep_the_centering(tmp_path, n):
    rng = np.random.default_rng(9)
    k, v = shifted_kv(rng, 50, 2, 32)
    cache = Centered(2, 60, 32, rotation_seed=3)
    if n:
        cache.append(k[:n], v[:n])
    cache.save(tmp_path / "c.npz")
    back = ia.Int8KVCache.load(tmp_path / "c.npz")
    assert back.center and back.rotation_seed == 3
    assert_same_state(back, snapshot(cache))
    k2, v2 = shifted_kv(rng, 5, 2, 32)
    cache.append(k2, v2)                                 # both go on alike
    back.append(k2, v2)
    assert_same_state(back, snapshot(cache))
    q = rng.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))


def test_version_1_files_load_uncentered_and_bad_centering_state_is_refused():
    rng = np.random.default_rng(10)
    k, v = shifted_kv(rng, 30, 2, 32)
    plain = ia.Int8KVCache(2, 30, 32, keep_first=False, recent=0)
    plain.append(k, v)
    old = {key: val for key, val in plain.state_dict().items()
           if key not in ("keep_first", "center", "k_first", "v_first", "k_offset", "v_offset")}
    old["format_version"] = 1
    back = ia.Int8KVCache.from_state_dict(old)
    assert not back.center and not back.keep_first
    q = rng.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), plain.decode(q))
    cache = Centered(2, 30, 32)
    cache.append(k, v)
    s = cache.state_dict()
    nan = s["k_offset"].copy()
    nan[1, 2] = np.nan
    for state, match in (
        ({key: val for key, val in s.items() if key != "v_offset"}, "lacks v_offset"),
        (dict(s, k_first=s["k_first"][:1]), r"k_first must be float32 \[2, 32\]"),
        (dict(s, v_offset=s["v_offset"].astype(np.float64)), "v_offset must be float32"),
        (dict(s, k_offset=nan), "k_offset holds NaN, Inf or values beyond"),
        (dict(s, keep_first=False), "center without keep_first"),
    ):
        with pytest.raises(ValueError, match=match):
            ia.Int8KVCache.from_state_dict(state)


def test_center_argument_is_checked():
    with pytest.raises(TypeError, match="center must be True or False, got int"):
        ia.Int8KVCache(2, 10, 16, center=1)
    with pytest.raises(TypeError, match="keep_first must be True or False, got NoneType"):
        ia.Int8KVCache(2, 10, 16, keep_first=None)
    with pytest.raises(ValueError, match="center=True needs keep_first=True"):
        ia.Int8KVCache(2, 10, 16, keep_first=False, center=True)
    assert "keep_first=True, center=True, recent=64" in repr(ia.Int8KVCache(2, 10, 16))
    assert not ia.Int8KVCache(2, 10, 16, keep_first=False).center      # None: keep_first's value
    assert ia.Int8KVCache(2, 10, 16, center=None).center
