"""prefill(k, v, q): append T tokens and attend their queries in one call, each query reading the
history a single decode after its own token's append reads, bit for bit, for any T (issue 29,
finding 2: a multi-token decode longer than the recent window read codes where token-by-token
decoding read floats)."""

import numpy as np
import pytest

import int8attn as ia
from conftest import (CONTRACT, EMULATED, assert_same_states, assert_tiers_agree, each_tier,
                      make_kv, rel_err)
from int8attn import reference as R

# every format the package names, and the 4-bit caches (recent 32: T = 65 and 150 are past
# R + 1 = 33, and 2R)
FORMATS = [("KVCache", dict(ia.FORMATS[name]), name) for name in ia.FORMATS] + [
    ("KVCache", dict(k_bits=4, v_bits=4), "4/4"),
    ("KVCache", dict(k_bits=8, v_bits=4), "8/4"),
    ("KVCache", dict(k_bits=4, v_bits=8), "4/8"),
]


def _make(fmt, hkv, cap, d, recent):
    options = dict(fmt)
    if options.get("recent", 1):               # formats with a window get this one
        options["recent"] = recent
    return ia.KVCache(hkv, cap, d, **options)


def _rows(rng, n, hkv, h, d):
    k, v = make_kv(rng, n, hkv, d, "outlier")
    k = k + 2.5 * rng.standard_normal(d).astype(np.float32)   # a common offset: centering sets one
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    return k.astype(np.float32), v, q


def _token_by_token(cache, k, v, q, **options):
    out = []
    for t in range(len(k)):
        cache.append(k[t], v[t])
        out.append(cache.decode(q[t], **options))
    return np.stack(out)


@pytest.mark.emulated
@pytest.mark.parametrize("t", [1, 33, 34, 65, 150])
@pytest.mark.parametrize("pre", [0, 1, 70])
@pytest.mark.parametrize("fmt", FORMATS[:2] + FORMATS[-3:-1] if EMULATED else FORMATS,
                         ids=lambda f: f[2])
def test_prefill_has_the_bits_of_token_by_token_decodes(fmt, pre, t):
    """Every tier: the outputs and the cache a prefill of T rows leaves equal those of T
    append-then-decode steps (GQA 3:1, D = 64, options that cut chunks per query)."""
    rng = np.random.default_rng(31 * t + pre)
    hkv, h, d, recent = 2, 6, 64, 32
    k, v, q = _rows(rng, pre + t, hkv, h, d)
    options = dict(window=90, sinks=3, softcap=25.0) if t == 150 else {}

    def both():
        a, b = (_make(fmt[1], hkv, 400, d, recent) for _ in range(2))
        if pre:
            a.append(k[:pre], v[:pre])
            b.append(k[:pre], v[:pre])
        if fmt[2] == "centered":         # no window: the offsets come from the first append
            a.append(k[pre:], v[pre:])   # past position 0, so from its split (documented)
            want = a.decode(q[pre:], **options)
        else:
            want = _token_by_token(a, k[pre:], v[pre:], q[pre:], **options)
        got = b.prefill(k[pre:], v[pre:], q[pre:], **options)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
        assert_same_states(a, b)
        return got

    assert_tiers_agree(each_tier(both), "prefill")


# the long prefill's length: 4096 natively; under emulation, where the avx2 and arm64 lanes spent
# two minutes a tier on it, 1024 (still 16 rings' worth and the plan's row form)
LONG = 1024 if EMULATED else 4096


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f[2] in ("default", "4/4")],
                         ids=lambda f: f[2])
def test_a_long_prefill_equals_chunks_of_r_plus_1(tier, fmt):
    """Every tier, T = LONG in one call (the ring holds 2R = 128 positions): the bits of prefills
    in chunks of at most R + 1 = 65, which read what single decodes read (above), and of uneven
    chunks."""
    if EMULATED and tier == "scalar":
        pytest.skip("the scalar tier's long prefill takes minutes under emulation; the "
                    "native lanes run it")
    rng = np.random.default_rng(4096)
    hkv, h, d, n = 1, 4, 32, LONG + 100
    k, v, q = _rows(rng, n, hkv, h, d)
    one, chunks, uneven = (_make(fmt[1], hkv, n, d, 64) for _ in range(3))
    for c in (one, chunks, uneven):
        c.prefill(k[:100], v[:100], q[:100])
    got = one.prefill(k[100:], v[100:], q[100:])
    parts = [chunks.prefill(k[a:a + 65], v[a:a + 65], q[a:a + 65]) for a in range(100, n, 65)]
    np.testing.assert_array_equal(got, np.concatenate(parts))
    cuts = [100, 101, 100 + LONG // 4, 164 + LONG // 4, 100 + 3 * LONG // 4, n]
    parts = [uneven.prefill(k[a:b], v[a:b], q[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    np.testing.assert_array_equal(got, np.concatenate(parts))
    assert_same_states(one, chunks)
    assert_same_states(one, uneven)
    # and within the contract of attention over the history each query had: the last query's
    # is the whole cache's
    ref = R.attention(q[-1], *one.dequantize())
    assert rel_err(got[-1], ref) <= CONTRACT


def test_prefill_threads_do_not_change_bits():
    rng = np.random.default_rng(5)
    k, v, q = _rows(rng, 900, 2, 8, 64)
    outs = []
    before = ia.get_num_threads()
    try:
        for threads in (1, 2):
            ia.set_num_threads(threads)
            c = ia.Int8KVCache(2, 900, 64)
            c.append(k[:300], v[:300])
            outs.append(c.prefill(k[300:], v[300:], q[300:]))
    finally:
        ia.set_num_threads(before)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_prefill_batch_has_the_bits_of_one_prefill_per_cache():
    """Caches of different lengths and formats, T past 2R: one call, every cache's bits."""
    rng = np.random.default_rng(6)
    hkv, h, d, t = 2, 4, 64, 150
    lengths = (0, 37, 300)
    fmts = (FORMATS[0][1], dict(k_bits=4, v_bits=4), dict(ia.FORMATS["plain"]))
    k, v, q = _rows(rng, 500 * len(lengths), hkv, h, d)
    batch, single = [], []
    for i, (n, fmt) in enumerate(zip(lengths, fmts)):
        pair = [_make(fmt, hkv, 600, d, 32) for _ in range(2)]
        for c in pair:
            if n:
                c.append(k[i * 500:i * 500 + n], v[i * 500:i * 500 + n])
        batch.append(pair[0])
        single.append(pair[1])
    kb = np.stack([k[i * 500 + n:i * 500 + n + t] for i, n in enumerate(lengths)])
    vb = np.stack([v[i * 500 + n:i * 500 + n + t] for i, n in enumerate(lengths)])
    qb = np.stack([q[i * 500 + n:i * 500 + n + t] for i, n in enumerate(lengths)])
    got = ia.prefill_batch(batch, kb, vb, qb)
    want = np.stack([c.prefill(kb[b], vb[b], qb[b]) for b, c in enumerate(single)])
    np.testing.assert_array_equal(got, want)
    for a, b in zip(batch, single):
        assert_same_states(a, b)


def _refused(cache, call, match, exc=ValueError):
    before = cache.state_dict()
    with pytest.raises(exc, match=match):
        call()
    after = cache.state_dict()
    assert sorted(before) == sorted(after)
    for key in before:
        assert np.array_equal(np.asarray(before[key]), np.asarray(after[key])), key


def test_prefill_refuses_bad_rows_and_shapes_and_changes_nothing():
    rng = np.random.default_rng(7)
    k, v, q = _rows(rng, 200, 2, 4, 32)
    cache = ia.Int8KVCache(2, 260, 32, recent=16)
    cache.append(k[:50], v[:50])
    out = np.full((150, 4, 32), 7.0, np.float32)
    bad_k, bad_v, bad_q = k[50:].copy(), v[50:].copy(), q[50:].copy()
    bad_k[120, 1, 3] = np.nan
    bad_v[149, 0, 0] = np.inf
    bad_q[77, 2, 5] = 3e19
    _refused(cache, lambda: cache.prefill(bad_k, v[50:], q[50:], out=out),
             r"k .*token 120, kv head 1.*nothing was appended")
    _refused(cache, lambda: cache.prefill(k[50:], bad_v, q[50:], out=out),
             r"v .*token 149, kv head 0.*nothing was appended")
    _refused(cache, lambda: cache.prefill(k[50:], v[50:], bad_q, out=out),
             r"q .*position 77, head 2.*nothing was appended")
    _refused(cache, lambda: cache.prefill(k[50:], v[50:], q[50:] * 1e12, scale=1.0),
             r"scale \* max\|q\|.*nothing was appended")
    assert np.all(out == 7.0)                              # no output written
    _refused(cache, lambda: cache.prefill(k[50:], v[50:], q[51:]), r"q must have shape \[T, H, D\] with T=150")
    _refused(cache, lambda: cache.prefill(k[50:], v[50:], q[50]), r"q must have shape")
    big = np.zeros((211, 2, 32), np.float32)
    _refused(cache, lambda: cache.prefill(big, big, np.zeros((211, 4, 32), np.float32)),
             r"exceed max_seq=260")
    _refused(cache, lambda: cache.prefill(k[50:], v[50:], q[50:], window=0), r"window")
    assert len(cache) == 50
    got = cache.prefill(k[50:], v[50:], q[50:], out=out)   # and then it works
    assert got is out and len(cache) == 200


def test_prefill_batch_refuses_one_bad_cache_and_appends_to_none():
    rng = np.random.default_rng(8)
    k, v, q = _rows(rng, 300, 1, 2, 32)
    caches = [ia.Int8KVCache(1, 300, 32, recent=16) for _ in range(3)]
    for c in caches:
        c.append(k[:10], v[:10])
    kb, vb, qb = (np.stack([x[10:110]] * 3) for x in (k, v, q))
    kb = kb.copy()
    kb[2, 99, 0, 1] = np.nan
    with pytest.raises(ValueError, match=r"caches\[2\]: k .*token 99, kv head 0"):
        ia.prefill_batch(caches, kb, vb, qb)
    assert [len(c) for c in caches] == [10, 10, 10]
    small = ia.Int8KVCache(1, 50, 32, recent=16)
    with pytest.raises(ValueError, match=r"caches\[1\]: appending 100 token\(s\) .* max_seq=50"):
        ia.prefill_batch([caches[0], small], kb[:2], vb[:2], qb[:2])
    assert len(caches[0]) == 10 and len(small) == 0
    with pytest.raises(ValueError, match=r"k must have shape \[B, T, Hkv, D\] with B=3"):
        ia.prefill_batch(caches, kb[0], vb[0], qb[0])


@pytest.mark.parametrize("keep_first", [False, True])
def test_prefill_after_a_deep_truncate_with_k_at_4_bits(tier, keep_first):
    """A truncate deeper than the ring leaves positions of K's open group without floats, read
    from the group's old codes until the group fills and is coded again: the queries of a
    prefill before that row read the old codes, as single decodes do (the call splits there)."""
    rng = np.random.default_rng(9)
    k, v, q = _rows(rng, 200, 2, 4, 32)
    caches = [ia.KVCache(2, 200, 32, k_bits=4, v_bits=4, recent=32, keep_first=keep_first)
              for _ in range(2)]
    for c in caches:
        c.append(k[:100], v[:100])       # the ring holds positions 36 .. 99
        c.truncate(40)                   # 32 .. 35 of group 1 without floats
    got = caches[0].prefill(k[100:130], v[100:130], q[100:130])
    want = _token_by_token(caches[1], k[100:130], v[100:130], q[100:130])
    np.testing.assert_array_equal(got, want)
    assert_same_states(*caches)
