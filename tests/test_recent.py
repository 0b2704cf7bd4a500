"""The recent window (``recent=R``): the last R positions read from their floats, a state that
does not depend on how the appends were split, and the window's edges (a window longer than the
cache, truncate into and beyond it, more queries than R, attention windows shorter than R),
with and without centering, on every tier."""

import numpy as np
import pytest

import int8attn as ia
from conftest import (CONTRACT, EMULATED, assert_same_state, assert_tiers_agree,
                      attention_over_history, each_tier, make_kv, rel_err, snapshot)
from int8attn import reference as R

WINDOWED = {"default": ia.FORMATS["default"], "recent": ia.FORMATS["recent"],
            "plain_r16": {**ia.FORMATS["plain"], "recent": 16}}


def states_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        np.testing.assert_array_equal(np.asarray(sa[key]), np.asarray(sb[key]), err_msg=key)


def appended(k, v, cuts, cap=None, **options):
    """A cache with k, v appended in the pieces between consecutive cuts."""
    cache = ia.Int8KVCache(k.shape[1], cap or len(k), k.shape[2], **options)
    for a, b in zip(cuts[:-1], cuts[1:]):
        cache.append(k[a:b], v[a:b])
    return cache


def held(x):
    """What the window keeps of rows x [n, Hkv, D] appended from position 0 on with keep_first:
    position 0 as given (its float row), the others as halves."""
    out = R.half_rows(x)
    out[0] = x[0]
    return out


def random_cuts(rng, n, most):
    cuts = [0]
    while cuts[-1] < n:
        cuts.append(min(n, cuts[-1] + int(rng.integers(1, most + 1))))
    return cuts


@pytest.mark.parametrize("fmt", list(WINDOWED))
@pytest.mark.parametrize("n", [1, 16, 64, 65, 66, 200, 700])
def test_any_split_gives_the_same_state_and_decodes(tier, fmt, n):
    """One call, token by token, and random mixes store the same state, and decode it to the
    same bits (the tier fixture runs this on every tier)."""
    rng = np.random.default_rng(n)
    k, v = make_kv(rng, n, 2, 48, "outlier")
    k += 2.0                                     # a common offset, for the centered format
    options = WINDOWED[fmt]
    bulk = appended(k, v, [0, n], **options)
    q = rng.standard_normal((min(n, 5), 6, 48)).astype(np.float32)
    want = bulk.decode(q)
    splits = [list(range(n + 1))] if n <= 200 or not EMULATED else []
    splits += [random_cuts(rng, n, most) for most in (3, 40, 300)]
    for cuts in splits:
        other = appended(k, v, cuts, **options)
        states_equal(other, bulk)
        np.testing.assert_array_equal(other.decode(q), want)


@pytest.mark.parametrize("fmt", list(WINDOWED))
def test_the_window_is_read_exactly_and_the_rest_from_codes(fmt):
    rng = np.random.default_rng(1)
    options = WINDOWED[fmt]
    r = options["recent"]
    k, v = make_kv(rng, 300, 2, 64, "outlier")
    cache = appended(k, v, [0, 100, 300], **options)
    kd, vd = cache.dequantize()
    np.testing.assert_array_equal(kd[-r:], R.half_rows(k[-r:]))     # the window: its halves
    np.testing.assert_array_equal(vd[-r:], R.half_rows(v[-r:]))
    assert not np.array_equal(kd[1:-r], k[1:-r])            # before it: through the codes
    q = rng.standard_normal((8, 64)).astype(np.float32)
    out = each_tier(lambda: cache.decode(q))
    assert_tiers_agree(out)
    assert rel_err(out["scalar"], R.attention(q, kd, vd)) <= CONTRACT
    assert rel_err(out["scalar"], R.emulate(q, cache)) <= 1e-4
    # a query that looks only at the window gets float attention over the floats
    near = cache.decode(q, window=r)
    want = R.attention(q, R.half_rows(k), R.half_rows(v), window=r)
    np.testing.assert_allclose(near, want, rtol=0, atol=1e-5)
    assert rel_err(near, R.attention(q, k, v, window=r)) <= 2e-3            # 11 bits of k, v


def edge_rows(rng, d):
    """Rows [n, 1, d] that probe the window's rounding: ties between two halves, rows that
    round up to the next power of two, huge and tiny magnitudes, subnormal halves, zeros."""
    base = rng.standard_normal((12, d)).astype(np.float32)
    rows = [base[0], np.zeros(d, np.float32), base[1] * np.float32(2.0**60),
            base[2] * np.float32(2.0**-90), base[3] * np.float32(2.0**-120)]
    tie = np.float32(1.0) + np.float32(2.0**-11) * rng.integers(0, 2, d)   # ties at 1 + ulp/2
    rows.append((tie * np.float32(2.0**14) * rng.choice([-1, 1], d)).astype(np.float32))
    up = base[4].copy()
    up[0] = np.float32(32767.5)      # rounds to 2^15 at e = 0: the row takes the next exponent
    rows.append(up)
    wide = base[5].copy()
    wide[:4] = [1e4, 1e-3, 3e-8, -6e-9]          # subnormal halves beside a large value
    rows.append(wide)
    for x in base[6:]:
        rows.append(x * np.float32(2.0 ** rng.integers(-40, 40)))
    return np.stack(rows)[:, None, :].astype(np.float32)


def test_the_window_rounds_as_numpy_does(tier):
    """The ring's halves are numpy's float16 rounding of each row scaled by its power of two
    (ties to even, subnormals, rows that round up), and a saved window loads back bit for bit."""
    rng = np.random.default_rng(8)
    k = edge_rows(rng, 48)
    v = edge_rows(rng, 48)[::-1].copy()
    cache = ia.Int8KVCache(1, len(k), 48, rotate=False, keep_first=False, center=False,
                           recent=len(k))
    cache.append(k, v)
    s = cache.state_dict()
    np.testing.assert_array_equal(s["k_recent"], R.half_rows(k))
    np.testing.assert_array_equal(s["v_recent"], R.half_rows(v))
    np.testing.assert_array_equal(R.half_rows(R.half_rows(k)), R.half_rows(k))
    again = ia.Int8KVCache.from_state_dict(s)
    states_equal(again, cache)
    q = rng.standard_normal((3, 48)).astype(np.float32)
    np.testing.assert_array_equal(again.decode(q), cache.decode(q))


def test_a_window_longer_than_the_cache():
    """recent >= max_seq: every position is read from its floats (the ring is max_seq long)."""
    rng = np.random.default_rng(2)
    k, v = make_kv(rng, 40, 2, 32)
    cache = appended(k, v, [0, 7, 40], recent=100)
    assert cache.nbytes == ia.Int8KVCache(2, 40, 32, recent=0).nbytes + 2 * 40 * 2 * (32 * 2 + 4)
    kd, vd = cache.dequantize()
    np.testing.assert_array_equal(kd, held(k))
    np.testing.assert_array_equal(vd, held(v))
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    out = each_tier(lambda: cache.decode(q, window=9, sinks=2))
    assert_tiers_agree(out)
    np.testing.assert_allclose(out["scalar"], R.attention(q, kd, vd, window=9, sinks=2),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("fmt", list(WINDOWED))
def test_truncate_into_the_window_is_exact(fmt):
    """Taking back up to R tokens, or any number while every float is still held (a cache of
    at most 2R tokens): the cache decodes what n appends give, and once appended on, holds
    it too (with centering, truncating to R tokens or fewer forgets the offsets)."""
    rng = np.random.default_rng(3)
    options = WINDOWED[fmt]
    r = options["recent"]
    k, v = make_kv(rng, 600, 2, 32)
    k += 1.5
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    for total, n in ((500, 500 - r), (500, 499), (500, 500 - r // 2), (2 * r, r + 1), (2 * r, r),
                     (2 * r, 3), (2 * r, 1), (2 * r, 0)):
        cache = appended(k, v, [0, total - 10, total], cap=600, **options)
        cache.truncate(n)
        fresh = appended(k, v, [0, n], cap=600, **options) if n else None
        if fresh is None:
            assert len(cache) == 0
            continue
        for a, b in zip(cache.dequantize(), fresh.dequantize()):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(cache.decode(q[0]), fresh.decode(q[0]))
        assert (cache.k_offset is None) == (fresh.k_offset is None)
        cache.append(k[n:n + 90], v[n:n + 90])             # and goes on as the fresh one
        fresh.append(k[n:n + 90], v[n:n + 90])
        states_equal(cache, fresh)
        np.testing.assert_array_equal(cache.decode(q), fresh.decode(q))


def test_truncate_beyond_the_ring_reads_codes_until_the_window_refills():
    rng = np.random.default_rng(4)
    k, v = make_kv(rng, 500, 1, 32)
    cache = appended(k, v, [0, 500], recent=16)             # the ring holds 32 positions
    cache.truncate(300)                                     # its floats are gone
    kd, _ = cache.dequantize()
    assert not np.array_equal(kd[-16:], k[284:300])         # read from the codes
    q = rng.standard_normal((2, 32)).astype(np.float32)
    assert rel_err(cache.decode(q), R.attention(q, *cache.dequantize())) <= CONTRACT
    cache.append(k[300:310], v[300:310])                    # the window refills
    kd, _ = cache.dequantize()
    np.testing.assert_array_equal(kd[-10:], R.half_rows(k[300:310]))
    assert not np.array_equal(kd[-16:-10], R.half_rows(k[294:300]))
    cache.append(k[310:330], v[310:330])
    np.testing.assert_array_equal(cache.dequantize()[0][-16:], R.half_rows(k[314:330]))


@pytest.mark.parametrize("t", [3, 64, 65])
def test_multi_token_decode_reads_each_querys_own_window(tier, t):
    """Every query reads the window of its own position: up to R + 1 queries decode to the bits
    of single-token decodes of the cache cut after each one."""
    rng = np.random.default_rng(t)
    k, v = make_kv(rng, 600, 2, 64, "outlier")
    cache = appended(k, v, [0, 1, 600])
    q = rng.standard_normal((t, 8, 64)).astype(np.float32)
    multi = cache.decode(q)
    state = cache.state_dict()
    for i in range(0, t, max(1, t // 8)):
        cut = ia.Int8KVCache.from_state_dict(state)
        cut.truncate(600 - t + i + 1)
        np.testing.assert_array_equal(multi[i], cut.decode(q[i]))
    assert rel_err(multi.reshape(-1, 64), attention_over_history(cache, q).reshape(-1, 64)) <= CONTRACT
    out = cache.decode(q, window=20, sinks=3, softcap=10.0)
    ref = attention_over_history(cache, q, window=20, sinks=3, softcap=10.0)
    assert rel_err(out.reshape(-1, 64), ref.reshape(-1, 64)) <= CONTRACT


@pytest.mark.parametrize("recent, cap, length, most", [
    (64, 600, 600, 65), (32, 600, 600, 33), (32, 600, 64, 64), (32, 600, 65, 33),
    (64, 100, 100, 100), (32, 64, 64, 64), (0, 600, 600, 600)])
def test_decode_takes_the_queries_whose_windows_the_ring_holds(recent, cap, length, most):
    """T <= R + 1 queries, or any T while the ring (min(2R, max_seq) slots) holds every
    position; one more is refused naming prefill, and the refused call changes nothing."""
    rng = np.random.default_rng(recent + cap + length)
    k, v = make_kv(rng, length, 1, 32)
    cache = ia.Int8KVCache(1, cap, 32, recent=recent, center=False, keep_first=bool(recent))
    cache.append(k, v)
    q = rng.standard_normal((length, 2, 32)).astype(np.float32)
    assert cache.decode(q[-most:]).shape == (most, 2, 32)
    if most == length:
        return
    before = snapshot(cache)
    with pytest.raises(ValueError, match=rf"T={most + 1} .*recent={recent}.*T <= {most}.*prefill"):
        cache.decode(q[-most - 1:])
    assert_same_state(cache, before)


@pytest.mark.parametrize("window, sinks", [(1, 0), (5, 0), (16, 4), (63, 1), (64, 0), (65, 2),
                                           (300, 300)])
def test_attention_windows_around_the_recent_window(window, sinks):
    rng = np.random.default_rng(window + sinks)
    k, v = make_kv(rng, 500, 2, 32, "outlier")
    cache = appended(k, v, [0, 250, 500], **ia.FORMATS["default"])
    q = rng.standard_normal((4, 4, 32)).astype(np.float32)
    out = each_tier(lambda: cache.decode(q, window=window, sinks=sinks))
    assert_tiers_agree(out)
    ref = attention_over_history(cache, q, window=window, sinks=sinks)
    assert rel_err(out["scalar"].reshape(-1, 32), ref.reshape(-1, 32)) <= CONTRACT


def test_offsets_come_from_positions_1_to_r_once_the_cache_holds_r_plus_1():
    rng = np.random.default_rng(5)
    k, v = make_kv(rng, 100, 2, 32)
    k += 3.0
    cache = ia.Int8KVCache(2, 100, 32, center=True, recent=20)
    cache.append(k[:20], v[:20])
    assert cache.k_offset is None                           # 20 tokens: not yet
    q = rng.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_allclose(cache.decode(q), R.attention(q, held(k[:20]), held(v[:20])),
                               atol=1e-5)
    cache.append(k[20:21], v[20:21])
    mean = R.rotate(R.half_rows(k[1:21]).astype(np.float64).mean(0), R.rotation_signs(32, 0))
    np.testing.assert_allclose(cache.k_offset, mean, rtol=0, atol=1e-5)
    cache.truncate(20)                                      # back before them: forgotten
    assert cache.k_offset is None
    fresh = ia.Int8KVCache(2, 100, 32, center=True, recent=20)
    fresh.append(k[:20], v[:20])
    states_equal(cache, fresh)
    small = ia.Int8KVCache(2, 100, 32, center=True, recent=8)   # fewer than 16 rows: zeros
    small.append(k, v)
    assert not small.k_offset.any()


@pytest.mark.parametrize("fmt", list(WINDOWED))
def test_save_load_and_evict_keep_the_window(tmp_path, fmt):
    rng = np.random.default_rng(6)
    k, v = make_kv(rng, 300, 2, 32, "outlier")
    cache = appended(k, v, [0, 120, 300], cap=320, **WINDOWED[fmt])
    cache.evict(37)                                         # the ring's slots move
    cache.append(k[:5], v[:5])
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    cache.save(tmp_path / "c.npz")
    back = ia.Int8KVCache.load(tmp_path / "c.npz")
    states_equal(back, cache)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    back.append(k[5:9], v[5:9])
    cache.append(k[5:9], v[5:9])
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    # evict keeps what decode reads; the new position 0 from the window's floats
    before = cache.decode(q, window=40)
    cache.evict(len(cache) - 50)
    np.testing.assert_array_equal(cache.decode(q, window=40), before)
    if cache.keep_first:
        np.testing.assert_array_equal(cache.k_first, cache.dequantize()[0][0])


def test_version_2_files_load_without_a_window():
    rng = np.random.default_rng(7)
    k, v = make_kv(rng, 40, 2, 32)
    old = appended(k, v, [0, 40], **ia.FORMATS["centered"])
    state = {key: val for key, val in old.state_dict().items()
             if key not in ("recent", "offsets_set", "k_recent", "v_recent")}
    state["format_version"] = 2
    back = ia.Int8KVCache.from_state_dict(state)
    assert back.recent == 0 and back.center and back.k_offset is not None
    q = rng.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), old.decode(q))


def test_a_failed_append_leaves_the_window_as_it_was():
    rng = np.random.default_rng(8)
    k, v = make_kv(rng, 400, 2, 32)
    cache = appended(k, v, [0, 100], cap=400, **ia.FORMATS["default"])
    before = cache.state_dict()
    bad = v[100:400].copy()
    bad[-1, 1, 3] = np.nan                                  # the last row of a long append
    with pytest.raises(ValueError, match=r"v holds NaN .*token 299, kv head 1"):
        cache.append(k[100:400], bad)
    after = cache.state_dict()
    for key in before:
        np.testing.assert_array_equal(np.asarray(after[key]), np.asarray(before[key]), err_msg=key)


@pytest.mark.parametrize("value, err, match", [
    (-1, ValueError, "recent must be from 0 to 1024, got -1"),
    (1025, ValueError, "recent must be from 0 to 1024, got 1025"),
    (2.0, TypeError, "recent must be an int, got float"),
])
def test_recent_argument_is_checked(value, err, match):
    with pytest.raises(err, match=match):
        ia.Int8KVCache(2, 10, 16, recent=value)


def test_window_items_split_over_threads_without_changing_bits():
    """A cache read only from its window (recent >= its length): one work item per kv head,
    run by several threads when the window is long, the same bits as one thread."""
    from int8attn import _cache
    rng = np.random.default_rng(9)
    k, v = make_kv(rng, 1000, 8, 128, "outlier")
    cache = appended(k, v, [0, 1000], recent=1024)
    q = rng.standard_normal((3, 16, 128)).astype(np.float32)
    before = ia.get_num_threads()
    try:
        ia.set_num_threads(1)
        want = cache.decode(q, softcap=30.0)
        ia.set_num_threads(4)
        assert _cache._plan(cache, 16, 3)["threads"] > 1          # the windows really are split
        got = cache.decode(q, softcap=30.0)
    finally:
        ia.set_num_threads(before)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    kd, vd = cache.dequantize()
    assert rel_err(want[-1], R.attention(q[-1], kd, vd, softcap=30.0)) <= 1e-5
