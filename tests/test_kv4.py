"""KVCache with a side at 4 bits (K per channel over groups of 32 positions, V per row): the
format against numpy's rules, decode against fp32 attention over the cache's own history on every
tier, bit for bit across tiers and thread counts, and the cache's life (splits, truncate, evict,
save and load, errors)."""

import numpy as np
import pytest

import int8attn as ia
from int8attn import _cache
from conftest import (CONTRACT, assert_tiers_and_threads_agree, attention_over_history, make_kv,
                      rel_err)
from int8attn import reference as R

WIDTHS = [(4, 4), (8, 4), (4, 8)]
G = 32


def ids(w):
    return f"k{w[0]}v{w[1]}"


def kv4_cache(rng, hkv, d, s, widths, cap=None, kind="gauss", **options):
    k, v = make_kv(rng, s, hkv, d, kind)
    k = k + rng.standard_normal(d).astype(np.float32)      # per-channel offsets, as real K has
    cache = ia.KVCache(hkv, cap or s, d, k_bits=widths[0], v_bits=widths[1], **options)
    cache.append(k, v)
    return cache, k, v


def history(k, v, cache):
    """The floats decode reads for the last position of a cache holding k, v [n, Hkv, D] (as
    appended), by numpy's rules from the appended rows alone: position 0 as given (keep_first),
    the last `recent` rows as halves, the rest through each side's format (4 bits: V per row in
    the rotated space, K per channel over whole groups of 32 from the rows' halves; 8 bits: the
    rotated int8 row quantizer; positions 1 .. recent coded from their halves)."""
    n, hkv, d = k.shape
    sign = R.rotation_signs(d, cache.rotation_seed) if cache.rotate else None

    def rot(x, inverse=False):
        return x if sign is None else R.rotate(x, sign, inverse=inverse).astype(np.float32)

    out = []
    for side, x in enumerate((k, v)):
        bits = cache.k_bits if side == 0 else cache.v_bits
        y = np.empty_like(x)
        coded = x.copy()                    # positions 1 .. recent are coded from their halves
        coded[1:cache.recent + 1] = R.half_rows(x[1:cache.recent + 1])
        if bits == 8:
            codes, scale = R.quantize_rows(rot(coded))
            y = rot(codes * scale[..., None], inverse=True)
        elif side == 1:
            codes, lo, step = R.quantize_rows4(rot(coded))
            y = rot(lo[..., None] + step[..., None] * codes, inverse=True)
        else:
            halves = R.half_rows(x)
            for a in range(0, n - n % G, G):
                for g in range(hkv):
                    codes, lo, step = R.quantize_k4_group(halves[a:a + G, g],
                                                          skip_first=a == 0 and cache.keep_first)
                    y[a:a + G, g] = lo + step * codes
        if cache.keep_first:
            y[0] = x[0]
        last = max(n - cache.recent, 1 if cache.keep_first else 0)
        y[last:] = R.half_rows(x[last:])
        out.append(y)
    return out


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "plain"])
def test_the_stored_format_is_numpys_rule(widths, rotate):
    """dequantize() equals numpy's reading of the format from the appended rows alone, to the
    float32 step of the back rotation."""
    rng = np.random.default_rng(1)
    cache, k, v = kv4_cache(rng, 2, 64, 203, widths, rotate=rotate, kind="outlier")
    kd, vd = cache.dequantize()
    kr, vr = history(k, v, cache)
    np.testing.assert_allclose(kd, kr, rtol=0, atol=2e-6 * np.abs(kr).max())
    np.testing.assert_allclose(vd, vr, rtol=0, atol=2e-6 * np.abs(vr).max())


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_state_holds_numpys_codes_and_groups(widths):
    rng = np.random.default_rng(2)
    cache, k, v = kv4_cache(rng, 3, 96, 100, widths)
    s = cache.state_dict()
    assert (s["k_bits"], s["v_bits"]) == widths and s["format_version"] == 4
    if widths[0] == 4:
        halves = R.half_rows(k)
        assert s["k_codes"].shape == (3, 100, 96) and s["k_group_min"].shape == (3, 4, 96)
        for a in range(0, 96, G):                       # the three whole groups
            for g in range(3):
                codes, lo, step = R.quantize_k4_group(halves[a:a + G, g], skip_first=a == 0)
                np.testing.assert_array_equal(s["k_codes"][g, a:a + G], codes)
                np.testing.assert_array_equal(s["k_group_min"][g, a // G], lo)
                np.testing.assert_array_equal(s["k_group_step"][g, a // G], step)
        assert "k_i8" not in s
    if widths[1] == 4:          # (the engine's own rotation: numpy's rounds its sums otherwise)
        sign = R.rotation_signs(96, 0)
        coded = v.copy()        # positions 1 .. recent are coded from their halves, as with int8
        coded[1:65] = R.half_rows(v[1:65])
        rotated = _cache._rotate(coded.reshape(-1, 96), sign).reshape(coded.shape)
        codes, lo, step = R.quantize_rows4(rotated)
        np.testing.assert_array_equal(s["v_codes"], codes.transpose(1, 0, 2))
        np.testing.assert_array_equal(s["v_min"], lo.T)
        np.testing.assert_array_equal(s["v_scale"], step.T)


CASES = [  # (H, Hkv, D, tokens, T queries)
    (8, 8, 128, 1, 1), (4, 2, 32, 31, 1), (4, 2, 32, 33, 1), (8, 2, 64, 257, 1),
    (12, 4, 96, 600, 3), (2, 1, 256, 1100, 1), (6, 3, 64, 70, 70), (32, 8, 128, 513, 2),
]


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "H{}-Hkv{}-D{}-S{}-T{}".format(*c))
def test_decode_within_contract_of_its_own_history(tier, widths, case):
    h, hkv, d, s, t = case
    rng = np.random.default_rng(s + d)
    cache, _, _ = kv4_cache(rng, hkv, d, s, widths, kind="outlier")
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    q = q[0] if t == 1 else q
    out = cache.decode(q)
    assert rel_err(out.reshape(-1, d), attention_over_history(cache, q).reshape(-1, d)) <= CONTRACT


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_windows_sinks_softcap_and_q8(tier, widths):
    rng = np.random.default_rng(3)
    cache, _, _ = kv4_cache(rng, 2, 64, 700, widths)
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    for opts in ({"window": 300}, {"window": 100, "sinks": 5}, {"softcap": 3.0},
                 {"window": 40, "softcap": 30.0}):
        ref = attention_over_history(cache, q, **opts)
        assert rel_err(cache.decode(q, **opts).reshape(-1, 64), ref.reshape(-1, 64)) <= CONTRACT
    ref = attention_over_history(cache, q[-1])
    assert rel_err(cache.decode(q[-1], q_bits=8), ref) <= 3e-2


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_tiers_and_thread_counts_agree(widths):
    rng = np.random.default_rng(4)
    cache, _, _ = kv4_cache(rng, 4, 64, 1500, widths, rotate=True)
    q = rng.standard_normal((2, 16, 64)).astype(np.float32)

    assert_tiers_and_threads_agree(lambda: cache.decode(q, window=900, sinks=3), "decode")


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_any_split_of_appends_gives_the_same_state(widths):
    rng = np.random.default_rng(5)
    k, v = make_kv(rng, 230, 2, 64)
    whole = ia.KVCache(2, 230, 64, k_bits=widths[0], v_bits=widths[1])
    whole.append(k, v)
    split = ia.KVCache(2, 230, 64, k_bits=widths[0], v_bits=widths[1])
    cuts = [0, 1, 2, 31, 32, 33, 90, 96, 97, 200, 230]
    for a, b in zip(cuts[:-1], cuts[1:]):
        split.append(k[a:b], v[a:b])
    one, two = whole.state_dict(), split.state_dict()
    assert one.keys() == two.keys()
    for key in one:
        np.testing.assert_array_equal(np.asarray(one[key]), np.asarray(two[key]), err_msg=key)


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_truncate_gives_back_what_the_cache_decoded_then(widths):
    """Up to `recent` tokens back (into a whole K group too), decode equals what the cache gave
    after that many appends; the group fills up again from new rows."""
    rng = np.random.default_rng(6)
    k, v = make_kv(rng, 300, 2, 64)
    cache = ia.KVCache(2, 300, 64, k_bits=widths[0], v_bits=widths[1])
    q = rng.standard_normal((4, 64)).astype(np.float32)
    cache.append(k[:200], v[:200])
    then = cache.decode(q)
    state = cache.state_dict()
    cache.append(k[200:250], v[200:250])
    cache.truncate(200)
    np.testing.assert_array_equal(cache.decode(q), then)
    cache.truncate(150)                                 # into a whole group: [128, 160)
    cache.append(k[150:200], v[150:200])
    np.testing.assert_array_equal(cache.decode(q), then)
    for key, a in cache.state_dict().items():     # (the ring holds fewer old rows now)
        if key not in ("k_recent", "v_recent"):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(state[key]), err_msg=key)


def test_truncate_deeper_than_the_ring_reads_the_old_codes():
    """Positions whose floats a deep truncate took keep their codes' values, also when their
    group is coded again: from those values and the new rows' halves."""
    rng = np.random.default_rng(7)
    k, v = make_kv(rng, 400, 1, 32)
    cache = ia.KVCache(1, 400, 32, k_bits=4, v_bits=4)
    cache.append(k, v)
    cache.truncate(210)                  # the ring held 272 .. 399: 192 .. 209 from their codes
    q = rng.standard_normal((2, 32)).astype(np.float32)
    assert rel_err(cache.decode(q), attention_over_history(cache, q)) <= CONTRACT
    old = cache.dequantize()[0]
    new = 3 * k[210:260]                  # other rows: group [192, 224) gets other ranges
    cache.append(new, v[210:260])
    assert rel_err(cache.decode(q), attention_over_history(cache, q)) <= CONTRACT
    rows = np.concatenate([old[192:210, 0], R.half_rows(new[:14, 0])])
    codes, lo, step = R.quantize_k4_group(rows)
    s = cache.state_dict()
    np.testing.assert_array_equal(s["k_codes"][0, 192:224], codes)
    np.testing.assert_array_equal(s["k_group_min"][0, 6], lo)
    np.testing.assert_array_equal(s["k_group_step"][0, 6], step)


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_evict_keeps_what_decode_reads(widths):
    rng = np.random.default_rng(8)
    cache, k, v = kv4_cache(rng, 2, 64, 300, widths, cap=400)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    kd, vd = cache.dequantize()
    n = 96 if widths[0] == 4 else 97
    cache.evict(n)
    kd2, vd2 = cache.dequantize()
    assert len(cache) == 300 - n
    np.testing.assert_array_equal(kd2, kd[n:])
    np.testing.assert_array_equal(vd2, vd[n:])
    assert rel_err(cache.decode(q), R.attention(q, kd2, vd2)) <= CONTRACT
    cache.append(k[:100], v[:100])                      # room again, and the groups go on
    assert rel_err(cache.decode(q), attention_over_history(cache, q)) <= CONTRACT
    if widths[0] == 4:
        with pytest.raises(ValueError, match=r"n must be a multiple of 32 with k_bits=4 \(.*\), or len\(cache\)=304, got 5"):
            cache.evict(5)


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_save_and_load_are_exact(tmp_path, widths):
    rng = np.random.default_rng(9)
    cache, _, _ = kv4_cache(rng, 2, 64, 150, widths, cap=200)
    q = rng.standard_normal((3, 2, 64)).astype(np.float32)
    cache.save(tmp_path / "c.npz")
    back = ia.KVCache.load(tmp_path / "c.npz")
    assert (back.k_bits, back.v_bits, len(back), back.max_seq) == (*widths, 150, 200)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    for a, b in zip(back.dequantize(), cache.dequantize()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="load it as a KVCache"):
        ia.Int8KVCache.load(tmp_path / "c.npz")
    s = cache.state_dict()
    side, top = ("k", 31) if widths[0] == 4 else ("v", 15)
    bad = dict(s, **{f"{side}_codes": s[f"{side}_codes"] + top + 1})
    with pytest.raises(ValueError, match=f"{side}_codes holds codes above {top}"):
        ia.KVCache.from_state_dict(bad)
    if widths[0] == 4:
        # 16 in a channel that is not wide (an even step half) at kv head 1, position 37
        step = s["k_group_step"][1, 1]
        halves, _ = R._halves(step)
        narrow = int(np.flatnonzero((halves.view(np.uint16) & 1) == 0)[0])
        codes = s["k_codes"].copy()
        codes[1, 37, narrow] = 16
        with pytest.raises(ValueError, match=r"a code above 15 in a channel whose k_group_step "
                                             r"is not a wide channel's .*\[1, 37\]"):
            ia.KVCache.from_state_dict(dict(s, k_codes=codes))
        wide = int(np.flatnonzero(halves.view(np.uint16) & 1)[0])
        assert codes[1, 32:64, wide].max() > 15          # the wide channels use their fifth bit
        odd = dict(s, k_group_min=s["k_group_min"] + np.float32(1e-3))
        with pytest.raises(ValueError, match="not halves times a power of two"):
            ia.KVCache.from_state_dict(odd)


@pytest.mark.parametrize("widths", WIDTHS, ids=ids)
def test_an_empty_or_reset_cache_saves_and_loads(tmp_path, widths):
    """No positions: the 4-bit code arrays are empty (their unpacking once failed on that)."""
    rng = np.random.default_rng(4)
    cache = ia.KVCache(2, 40, 64, k_bits=widths[0], v_bits=widths[1])
    for filled in (False, True):
        if filled:
            k, v = make_kv(rng, 35, 2, 64, "gauss")
            cache.append(k, v)
            cache.reset()
        cache.save(tmp_path / "e.npz")
        back = ia.KVCache.load(tmp_path / "e.npz")
        assert (len(back), back.k_bits, back.v_bits, back.max_seq) == (0, *widths, 40)
        again = ia.KVCache.from_state_dict(cache.state_dict())
        k, v = make_kv(rng, 3, 2, 64, "gauss")
        for c in (back, again, cache):
            c.append(k, v)
        q = rng.standard_normal((4, 64)).astype(np.float32)
        np.testing.assert_array_equal(back.decode(q), cache.decode(q))
        np.testing.assert_array_equal(again.decode(q), cache.decode(q))
        cache.reset()


def test_memory_at_llama_3_8b_shape():
    """4/4 holds at most 0.62x the bytes of 8/8 at 8192 tokens (Hkv = 8, D = 128): issue 41's
    bound, with K's wide channels' fifth bits."""
    eight = ia.Int8KVCache(8, 8192, 128).nbytes
    sizes = {w: ia.KVCache(8, 8192, 128, k_bits=w[0], v_bits=w[1]).nbytes for w in WIDTHS}
    assert sizes[4, 4] <= 0.62 * eight
    assert sizes[4, 4] < sizes[8, 4] < eight and sizes[4, 4] < sizes[4, 8] < eight


def test_constructor_checks():
    with pytest.raises(ValueError, match="k_bits must be one of 8, 4, got 2"):
        ia.KVCache(1, 8, 32, k_bits=2)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 32 with a side at 4 bits"):
        ia.KVCache(1, 8, 48, v_bits=4)
    with pytest.raises(ValueError, match=r"recent must be at least 32 with k_bits=4 \(.*\), got 16"):
        ia.KVCache(1, 8, 32, k_bits=4, recent=16)
    with pytest.raises(ValueError, match="center=True needs k_bits=8 and v_bits=8"):
        ia.KVCache(1, 8, 32, v_bits=4, center=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'k_bits'"):
        ia.Int8KVCache(1, 8, 32, k_bits=4)
    c = ia.KVCache(1, 8, 32, k_bits=4, v_bits=4)
    assert (c.center, c.keep_first, c.rotate) == (False, True, True)
    assert isinstance(ia.Int8KVCache(1, 8, 32), ia.KVCache)
    with pytest.raises(AttributeError, match="k_i8: this cache stores K at 4 bits"):
        c.k_i8
    with pytest.raises(AttributeError, match="v_scale: this cache stores V at 4 bits"):
        c.v_scale
    assert "k_bits=4, v_bits=4" in repr(c)


def test_batch_of_formats():
    """decode_batch takes caches of different formats; each gets its own decode's bits."""
    rng = np.random.default_rng(10)
    caches = [kv4_cache(rng, 2, 64, 80 + 30 * i, w)[0] for i, w in enumerate(WIDTHS)]
    caches.append(ia.Int8KVCache(2, 90, 64))
    caches[-1].append(*make_kv(rng, 90, 2, 64))
    q = rng.standard_normal((4, 8, 64)).astype(np.float32)
    out = ia.decode_batch(caches, q)
    for b, c in enumerate(caches):
        np.testing.assert_array_equal(out[b], c.decode(q[b]))
