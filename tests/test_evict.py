"""evict and reset leave nothing of the history they forget (issue 29, findings 4 and 5): an
emptied cache codes its next history as a fresh one does (no offsets of a history it no longer
holds, no stale 4-bit K codes or group ranges), evict may always forget everything (also at 4
bits with a length that is not whole groups), and a cache left with a few tokens forgets its
offsets by the same rule whether truncate or evict shrank it."""

import numpy as np
import pytest

import int8attn as ia
from conftest import EMULATED, assert_same_states, assert_tiers_agree, each_tier

# every format: the named 8-bit ones, and each width with a side at 4 bits with and without the
# rotation (their other options the defaults: keep_first, a window of 64)
FORMATS = {name: dict(fmt) for name, fmt in ia.FORMATS.items()}
for _kb, _vb in ((8, 4), (4, 4), (4, 8)):
    for _rot in (True, False):
        FORMATS[f"k{_kb}v{_vb}{'' if _rot else '-plain'}"] = dict(k_bits=_kb, v_bits=_vb,
                                                                  rotate=_rot)
K4 = [name for name, fmt in FORMATS.items() if fmt.get("k_bits") == 4]
K4_BUFFERS = ("k4", "k4_wide", "k4_min", "k4_step", "k4_min_scale", "k4_step_scale")
HKV, D, CAP = 2, 64, 400


def rows(rng, n, shift, d=D, hkv=HKV):
    """K, V [n, Hkv, D] with a large common offset per channel (what centering takes out), of
    the size `shift`: one history's offsets are far from another's."""
    k = rng.standard_normal((n, hkv, d)) + shift * rng.standard_normal(d)
    v = rng.standard_normal((n, hkv, d)) + shift * rng.standard_normal(d)
    return k.astype(np.float32), v.astype(np.float32)


def halves(rng, n, d=D, hkv=HKV):
    """Rows whose values are quarters of integers below 32 in magnitude: exact as the recent
    window's halves, so every way of coding them (as given, or from their halves) agrees and two
    caches holding them by different histories can hold the same bits."""
    return (rng.integers(-127, 128, (n, hkv, d)) / 4).astype(np.float32)


def make(fmt, cap=CAP, d=D, hkv=HKV):
    return ia.KVCache(hkv, cap, d, **FORMATS[fmt])


def state_arrays(cache):
    s = cache.state_dict()
    return {key: np.asarray(val) for key, val in s.items()}


def assert_same_cache(a, b):
    """a and b hold the same state (every state_dict array, bit for bit) and decode alike."""
    assert_same_states(a, b)
    q = np.random.default_rng(len(a)).standard_normal((3, 2 * a.n_kv_heads, a.head_dim))
    q = q.astype(np.float32)
    outs = each_tier(lambda: np.stack([a.decode(q), b.decode(q)]))
    assert_tiers_agree(outs, "decode")
    np.testing.assert_array_equal(outs["scalar"][0].view(np.int32),
                                  outs["scalar"][1].view(np.int32))


def assert_k4_buffers_fresh_above(cache, partial_kept=False):
    """K's 4-bit buffers hold zeros from the cache's length on (codes, fifth bits) and from its
    first incomplete group on (minima, steps and their scales: past it when a truncate deeper
    than the ring kept it), as a fresh cache's do."""
    n = len(cache)
    g = -(-n // 32) if partial_kept else n // 32
    for name in K4_BUFFERS[:2]:               # by position: the codes, the fifth bits
        assert not cache._copy(name)[:, n:].any(), f"stale {name} above the length"
    for name in K4_BUFFERS[2:]:
        assert not cache._copy(name)[:, g:].any(), f"stale {name} above the complete groups"


# -- finding 4 (and 5's evict to empty): an emptied cache is a fresh one -----------------------

HISTORIES = [150, 37, 100] if not EMULATED else [150]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("forget", ["evict", "reset"])
@pytest.mark.parametrize("length", HISTORIES)
def test_an_emptied_cache_codes_the_next_history_as_a_fresh_one(fmt, forget, length):
    """A history of `length` tokens (past R + 1 = 65, so a centered cache set its offsets, and
    not whole K groups at 37 and 150), evict(len(cache)) or reset(), then 120 tokens of another
    history (offsets far from the first's): the state and decode of a fresh cache given those
    120 tokens, bit for bit. Before the fix evict kept the first history's offsets (the second
    coded against them: K error 6% of max|k| instead of 0.1%), and a cache with K at 4 bits
    refused evict(37) and evict(150) and kept the first history's group ranges."""
    rng = np.random.default_rng(length + len(fmt))
    cache = make(fmt)
    cache.append(*rows(rng, length, 40.0))
    if forget == "evict":
        cache.evict(len(cache))
    else:
        cache.reset()
    assert len(cache) == 0
    assert cache.k_offset is None and cache.k_first is None
    k, v = rows(rng, 120, -25.0)
    fresh = make(fmt)
    for c in (cache, fresh):
        c.append(k[:50], v[:50])
        c.append(k[50:], v[50:])
    assert_same_cache(cache, fresh)
    if cache.k_bits == 4:
        assert_k4_buffers_fresh_above(cache)


@pytest.mark.parametrize("fmt", K4)
@pytest.mark.parametrize("length", [1, 31, 37, 100])
def test_evict_forgets_everything_at_any_length_with_k_at_4_bits(fmt, length):
    rng = np.random.default_rng(length)
    cache = make(fmt)
    cache.append(*rows(rng, length, 3.0))
    if (length - 1) % 32:                    # part of a group: refused
        with pytest.raises(ValueError, match="multiple of 32"):
            cache.evict(length - 1)
    cache.evict(length)                      # everything: accepted
    assert len(cache) == 0
    k, v = rows(rng, 70, 3.0)
    cache.append(k, v)
    fresh = make(fmt)
    fresh.append(k, v)
    assert_same_cache(cache, fresh)


# -- finding 5: K at 4 bits, nothing stale above the length -------------------------------------

@pytest.mark.parametrize("fmt", K4)
def test_evict_leaves_k4_buffers_as_a_fresh_cache_has_them(fmt):
    """After evict(n) (whole groups) the 4-bit K buffers above the new length hold zeros, so two
    caches holding the same rows by different histories hold the same state, and the same
    buffers (keep_first off: with it, a fresh cache leaves position 0 out of group 0's ranges,
    an evicted one has its group 0 from positions that all counted). Before the fix evict left
    the old codes and ranges above the new length, which the next rows' partial group showed."""
    rng = np.random.default_rng(21)
    opts = dict(FORMATS[fmt], keep_first=False)
    old, x = halves(rng, 128), halves(rng, 70)
    a, b = ia.KVCache(HKV, CAP, D, **opts), ia.KVCache(HKV, CAP, D, **opts)
    a.append(x, x)
    b.append(old, old)
    b.append(x[:64], x[:64])                 # 192 tokens, 6 whole groups
    b.evict(128)
    assert_k4_buffers_fresh_above(b)
    b.append(x[64:], x[64:])                 # a partial group over the old codes
    assert_k4_buffers_fresh_above(b)
    assert_same_cache(a, b)
    for name in K4_BUFFERS:
        np.testing.assert_array_equal(b._copy(name), a._copy(name), err_msg=name)


@pytest.mark.parametrize("fmt", K4)
@pytest.mark.parametrize("before", ["evict", "deep truncate"])
def test_reset_gives_a_fresh_caches_k4_buffers(fmt, before):
    """reset() after an evict, or after a truncate deeper than the ring (which keeps a group's
    codes for the positions it left without floats, some of them above the new length), leaves
    the 4-bit K buffers as a fresh cache has them: the next history's state is a fresh one's.
    Before the fix both left codes above the length, which the next partial group showed."""
    rng = np.random.default_rng(22)
    opts = dict(FORMATS[fmt], keep_first=False, recent=32)
    old, x = halves(rng, 200), halves(rng, 50)
    a, b = ia.KVCache(HKV, CAP, D, **opts), ia.KVCache(HKV, CAP, D, **opts)
    b.append(old, old)
    if before == "evict":
        b.evict(64)
    else:
        b.truncate(40)                       # the ring held 136 .. 199: group 1 keeps its codes
    b.reset()
    for name in K4_BUFFERS:
        assert not b._copy(name).any(), name
    for c in (a, b):
        c.append(x, x)
    assert_same_cache(a, b)
    for name in K4_BUFFERS:
        np.testing.assert_array_equal(b._copy(name), a._copy(name), err_msg=name)


def test_a_deep_truncate_keeps_no_codes_above_the_length():
    rng = np.random.default_rng(23)
    cache = ia.KVCache(1, 300, 32, k_bits=4, v_bits=4, recent=32)
    x = halves(rng, 200, d=32, hkv=1)
    cache.append(x, x)
    cache.truncate(40)                       # group 1 keeps its codes: 32 .. 39 have no floats
    assert_k4_buffers_fresh_above(cache, partial_kept=True)
    assert cache._copy("k4_min")[:, 1].any()
    cache.append(x[:60], x[:60])             # group 1 is coded again, from its codes and the rows
    assert len(cache) == 100


# -- a few tokens left: truncate and evict forget the offsets alike ------------------------------

@pytest.mark.parametrize("fmt, left", [("default", 1), ("default", 30), ("default", 64),
                                       ("default", 65), ("centered", 1), ("centered", 2)])
def test_evict_and_truncate_to_a_few_tokens_forget_the_offsets_alike(fmt, left):
    """A centered cache shrunk to `left` tokens has offsets afterwards exactly when it had them
    after its `left`-th append: with a window of R = 64 while it holds more than R tokens,
    without one more than 1. Shrunk by evict or truncate it then holds the same: evict leaves
    the rows as truncate does (the new first row aside: its float row is what decode read), the
    rows past position 0 coded uncentered again when the offsets go, and decode unchanged.
    Before the fix evict kept the offsets whatever it left."""
    rng = np.random.default_rng(left)
    k, v = rows(rng, 200, 40.0)
    q = rng.standard_normal((4, D)).astype(np.float32)
    evicted = make(fmt)
    evicted.append(k, v)
    # the positions past the new first one (which decode reads from a float row afterwards)
    before = evicted.decode(q, window=left - 1) if left >= 3 else None
    evicted.evict(200 - left)
    assert len(evicted) == left
    keeps = left > (64 if fmt == "default" else 1)
    assert (evicted.k_offset is not None) == keeps
    if before is not None:                   # what decode reads did not change
        np.testing.assert_array_equal(evicted.decode(q, window=left - 1), before)
    # a fresh cache given the same rows, the first as the float row the evicted one keeps
    fresh = make(fmt)
    first_k, first_v = evicted.k_first[None], evicted.v_first[None]
    fresh.append(np.concatenate([first_k, k[201 - left:]]),
                 np.concatenate([first_v, v[201 - left:]]))
    if not keeps:                            # the same rows, coded the same (but position 0)
        se, sf = state_arrays(evicted), state_arrays(fresh)
        for key in se:
            a, b = se[key], sf[key]
            if key in ("k_i8", "v_i8", "k_scale", "v_scale"):
                a, b = a[:, 1:], b[:, 1:]
            np.testing.assert_array_equal(a, b, err_msg=key)
    # and whatever the cache holds next, it codes as the fresh one does
    more_k, more_v = rows(rng, 90, -25.0)
    for c in (evicted, fresh):
        c.append(more_k, more_v)
    for a, b in zip(evicted.dequantize(), fresh.dequantize()):
        if not keeps:
            np.testing.assert_array_equal(a, b)
    if not keeps:
        np.testing.assert_array_equal(evicted.decode(q), fresh.decode(q))
    # truncate to the same length keeps or forgets them alike (taking back fewer than the ring
    # holds, so that the floats of the rows left are held, as evict's are)
    truncated = make(fmt)
    truncated.append(k[:left + 65], v[:left + 65])
    assert truncated.k_offset is not None
    truncated.truncate(left)
    assert (truncated.k_offset is not None) == keeps
