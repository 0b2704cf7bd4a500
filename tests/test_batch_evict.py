"""decode_batch (several caches, one pool job) and evict (forget the oldest tokens)."""
import threading

import numpy as np
import pytest

import int8attn as ia
from conftest import (CONTRACT, EMULATED, assert_same_state, assert_tiers_agree, each_tier,
                      attention_over_history, filled_cache, make_kv, rel_err, snapshot)
from int8attn import reference as R

FORMATS = list(ia.FORMATS)


def _caches(rng, lengths, hkv, d, fmt, cap=None):
    return [filled_cache(rng, hkv, d, n, cap=cap or max(lengths), **ia.FORMATS[fmt])[0]
            for n in lengths]


# lengths that differ, cross chunk boundaries (256) and leave tails; GQA ratios 1, 3 and 8
BATCH_CASES = [
    dict(lengths=(300, 301, 557), hkv=2, h=6, d=64, t=1, opts={}),
    dict(lengths=(40, 700), hkv=1, h=8, d=128, t=7, opts=dict(window=90, softcap=30.0)),
    dict(lengths=(513, 257, 1, 260), hkv=3, h=3, d=32, t=1, opts=dict(window=200, sinks=4)),
    dict(lengths=(129,) * 3, hkv=2, h=4, d=48, t=65, opts=dict(q_bits=8)),   # T = R + 1
]


@pytest.mark.emulated
@pytest.mark.parametrize("case", BATCH_CASES[:2] if EMULATED else BATCH_CASES)
@pytest.mark.parametrize("fmt", FORMATS[:1] + FORMATS[-1:] if EMULATED else FORMATS)
def test_decode_batch_has_the_bits_of_one_decode_per_cache(case, fmt):
    rng = np.random.default_rng(len(case["lengths"]) * 7 + FORMATS.index(fmt))
    caches = _caches(rng, case["lengths"], case["hkv"], case["d"], fmt)
    t, h, d = case["t"], case["h"], case["d"]
    if t > min(case["lengths"]):
        t = min(case["lengths"])
    q = rng.standard_normal((len(caches), t, h, d)).astype(np.float32)

    def both():
        batch = ia.decode_batch(caches, q, **case["opts"])
        one = np.stack([c.decode(q[b], **case["opts"]) for b, c in enumerate(caches)])
        np.testing.assert_array_equal(batch.view(np.int32), one.view(np.int32))
        return batch

    outs = each_tier(both)
    assert_tiers_agree(outs, "decode_batch")
    # and single-token queries as [B, H, D]
    flat = ia.decode_batch(caches, q[:, -1], **{k: v for k, v in case["opts"].items()
                                                 if k != "window" or t == 1})
    assert flat.shape == (len(caches), h, d)


def test_decode_batch_splits_over_threads_without_changing_bits():
    rng = np.random.default_rng(3)
    caches = _caches(rng, (1500, 900, 1200), 2, 64, "default")
    q = rng.standard_normal((3, 2, 8, 64)).astype(np.float32)
    before = ia.get_num_threads()
    try:
        ia.set_num_threads(1)
        one = ia.decode_batch(caches, q)
        ia.set_num_threads(2)
        two = ia.decode_batch(caches, q)
    finally:
        ia.set_num_threads(before)
    np.testing.assert_array_equal(one.view(np.int32), two.view(np.int32))


def test_decode_batch_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    caches = _caches(rng, (50, 60), 1, 32, "default")
    q = torch.randn(2, 4, 32)
    out = ia.decode_batch(caches, q)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 4, 32)
    np.testing.assert_array_equal(out.numpy(), np.stack([c.decode(q[b].numpy())
                                                         for b, c in enumerate(caches)]))


def test_decode_batch_errors_name_the_argument_and_write_nothing():
    rng = np.random.default_rng(5)
    a, b = _caches(rng, (20, 30), 2, 32, "default")
    other = ia.Int8KVCache(1, 8, 32)
    other.append(np.ones((1, 32)), np.ones((1, 32)))
    q = np.ones((2, 4, 32), np.float32)
    out = np.full((2, 4, 32), 7.0, np.float32)
    cases = [
        (([a, a], q), ValueError, "distinct"),
        (([], q), ValueError, "at least one"),
        ((a, q[0]), TypeError, "sequence of KVCache, got one Int8KVCache"),
        (([a, "b"], q), TypeError, r"caches\[1\] must be a KVCache or Int8KVCache, got str"),
        (([a, other], q), ValueError, r"caches\[1\] has n_kv_heads=1"),
        (([a, b], q[:1]), ValueError, r"B=2"),
        (([a, b], np.ones((2, 21, 4, 32))), ValueError, "the shortest cache holds 20"),
    ]
    for (args, exc, match) in cases:
        with pytest.raises(exc, match=match):
            ia.decode_batch(*args, out=out)
    bad = q.copy()
    bad[1, 3, 5] = np.inf
    with pytest.raises(ValueError, match=r"caches\[1\]: .*head 3"):
        ia.decode_batch([a, b], bad, out=out)
    with pytest.raises(ValueError, match=r"caches\[0\]: scale \* max\|q\|"):
        ia.decode_batch([a, b], q, scale=2.0 ** 41, out=out)
    assert (out == 7.0).all()
    # and every cache is free again: each decodes on its own
    for c in (a, b, other):
        c.decode(np.ones((c.n_kv_heads, 32)))


def test_decode_batch_refuses_a_cache_in_use_and_frees_the_others():
    rng = np.random.default_rng(6)
    a, b = _caches(rng, (40, 40), 1, 32, "default")
    entered, release = threading.Event(), threading.Event()

    class Slow(float):                         # converting scale runs Python code in a.decode
        def __float__(self):
            entered.set()
            release.wait(5)
            return 0.125

    holder = threading.Thread(target=lambda: a.decode(np.ones((1, 32)), scale=Slow(0.125)))
    holder.start()
    try:
        assert entered.wait(5)
        with pytest.raises(RuntimeError, match="in use by another thread"):
            ia.decode_batch([b, a], np.ones((2, 1, 32)))
    finally:
        release.set()
        holder.join()
    ia.decode_batch([b, a], np.ones((2, 1, 32)))      # b was released by the failed call


# -- evict -----------------------------------------------------------------------------------

@pytest.mark.emulated
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n, length", [(1, 300), (100, 300), (256, 513), (299, 300), (300, 300)])
def test_evict_keeps_the_newest_tokens_as_they_were(fmt, n, length):
    rng = np.random.default_rng(n + length)
    cache, _, _ = filled_cache(rng, 2, 64, length, cap=length, **ia.FORMATS[fmt])
    k0, v0 = cache.dequantize()
    cache.evict(n)
    assert len(cache) == length - n
    k1, v1 = cache.dequantize()
    np.testing.assert_array_equal(k1, k0[n:])           # every kept row reads back the same
    np.testing.assert_array_equal(v1, v0[n:])
    if len(cache) == 0:
        return
    q = rng.standard_normal((min(3, len(cache)), 4, 64)).astype(np.float32)

    def run():
        out = cache.decode(q, window=50)
        ref = R.attention(q, k1, v1, window=50)
        assert rel_err(out.reshape(-1, 64), ref.reshape(-1, 64)) < CONTRACT
        return out

    assert_tiers_agree(each_tier(run), "decode after evict")


@pytest.mark.parametrize("fmt", FORMATS[:1] + FORMATS[-1:] if EMULATED else FORMATS)
def test_a_sliding_cache_evicts_and_appends_for_ever(fmt):
    """A cache of capacity 200 kept under a window of 64 over 1000 tokens (400 under
    emulation): every decode equals the window's attention over what the cache holds, and the
    cache never outgrows 200."""
    rng = np.random.default_rng(11)
    cap, window, total = 200, 64, 400 if EMULATED else 1000
    cache = ia.Int8KVCache(1, cap, 32, **ia.FORMATS[fmt])
    k, v = make_kv(rng, total, 1, 32)
    pos = 0
    while pos < total:
        step = int(rng.integers(1, 40))
        step = min(step, total - pos)
        if len(cache) + step > cap:
            cache.evict(len(cache) - (window - 1))
        cache.append(k[pos:pos + step], v[pos:pos + step])
        pos += step
        q = rng.standard_normal((step, 2, 32)).astype(np.float32)
        kd, vd = cache.dequantize()
        out = cache.decode(q, window=window)
        ref = attention_over_history(cache, q, window=window)
        assert rel_err(out.reshape(-1, 32), ref.reshape(-1, 32)) < CONTRACT
        # what the window sees is the original tokens, quantized (never re-quantized)
        seen = kd[-min(window, len(cache)):]
        assert np.max(np.abs(seen - k[pos - len(seen):pos])) < 0.05 * np.max(np.abs(k))


@pytest.mark.parametrize("bits", [(8, 8), (8, 4)], ids=["k8v8", "k8v4"])
def test_evict_keeps_a_first_row_at_the_edge_of_the_range_loadable(tmp_path, bits):
    """Rows of +-2**64 rotated and quantized come back a little beyond 2**64 (the codes' rounding
    in the rotated space): the float row evict makes of such a token stays within the format's
    range, so the cache still saves and loads (the fuzz test found a file load refused)."""
    rng = np.random.default_rng(13)
    d = 64
    k = (np.sign(rng.standard_normal((40, 2, d))) * 2.0 ** 64).astype(np.float32)
    k[:, :, ::3] *= rng.uniform(0.5, 1.0, (40, 2, (d + 2) // 3)).astype(np.float32)
    v = k[::-1].copy()
    cache = ia.KVCache(2, 40, d, k_bits=bits[0], v_bits=bits[1], rotate=True, keep_first=True,
                       recent=0)
    cache.append(k, v)
    beyond = max(float(np.abs(x[1:]).max()) for x in cache.dequantize())
    assert beyond > 2.0 ** 64                          # the case this test is about
    cache.evict(1)
    assert np.abs(cache.k_first).max() <= 2.0 ** 64 and np.abs(cache.v_first).max() <= 2.0 ** 64
    cache.save(tmp_path / "edge.npz")
    back = ia.KVCache.load(tmp_path / "edge.npz")
    q = rng.standard_normal((4, d)).astype(np.float32) * 1e-20
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))


@pytest.mark.parametrize("fmt", ["centered", "default"])
@pytest.mark.parametrize("left", [1, 0])
def test_a_centered_cache_evicted_to_one_token_or_none_saves_and_loads(tmp_path, fmt, left):
    """evict to one token or none forgets the offsets, as truncate does there (tests/
    test_evict.py), and the cache saves, loads and goes on as the one saved."""
    rng = np.random.default_rng(14)
    cache, _, _ = filled_cache(rng, 2, 32, 90, cap=100, **ia.FORMATS[fmt])
    assert cache.k_offset is not None
    cache.evict(90 - left)
    assert cache.k_offset is None
    cache.save(tmp_path / "c.npz")
    back = ia.Int8KVCache.load(tmp_path / "c.npz")
    assert len(back) == left and back.k_offset is None
    k, v = make_kv(rng, 5, 2, 32)
    for c in (back, cache):
        c.append(k, v)
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    for a, b in zip(back.dequantize(), cache.dequantize()):
        np.testing.assert_array_equal(a, b)


def test_evict_errors_leave_the_cache_as_it_was():
    rng = np.random.default_rng(12)
    cache, k, v = filled_cache(rng, 1, 32, 30, **ia.FORMATS["default"])
    snap = snapshot(cache)
    for n, exc in ((31, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError)):
        with pytest.raises(exc, match="n"):
            cache.evict(n)
        assert_same_state(cache, snap)
    cache.evict(0)
    assert_same_state(cache, snap)
    cache.evict(30)
    assert len(cache) == 0
    fresh = ia.Int8KVCache(1, 30, 32, **ia.FORMATS["default"])
    for c in (cache, fresh):                                # as good as a new cache
        c.append(k[:20], v[:20])
    assert_same_state(cache, snapshot(fresh))
    q = rng.standard_normal((3, 1, 32)).astype(np.float32)
    np.testing.assert_array_equal(cache.decode(q), fresh.decode(q))
