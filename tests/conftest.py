import numpy as np
import pytest

import int8attn as ia
from int8attn import _cache

TIERS = ia.supported_isas()


@pytest.fixture(params=TIERS)
def tier(request):
    """Run the test once per tier this CPU supports, with that tier active."""
    before = ia.isa()
    _cache._set_isa(request.param)
    yield request.param
    _cache._set_isa(before)


def use_tier(name):
    _cache._set_isa(name)


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
    """Everything a cache holds (with centering, the float rows of position 0 and the offsets)."""
    return (len(cache), cache.k_i8.copy(), cache.v_i8.copy(), cache.k_scale.copy(),
            cache.v_scale.copy(), cache.k_first, cache.v_first, cache.k_offset, cache.v_offset)


def assert_same_state(cache, snap):
    now = snapshot(cache)
    assert now[0] == snap[0]
    for a, b in zip(now[1:], snap[1:]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)
