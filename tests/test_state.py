"""truncate, state_dict / from_state_dict, save / load: round trips are bit-exact, bad files are
clear errors."""

import numpy as np
import pytest

import int8attn as ia
from conftest import assert_same_state, filled_cache, make_kv, snapshot


def same_cache(a, b):
    assert len(a) == len(b)
    for name in ("k_i8", "v_i8", "k_scale", "v_scale"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_truncate_then_append_equals_a_cache_built_directly(tier):
    rng = np.random.default_rng(0)
    k, v = make_kv(rng, 300, 2, 64, "outlier")
    k2, v2 = make_kv(rng, 40, 2, 64)
    cache = ia.Int8KVCache(2, 400, 64, center=False)   # centered: test_centering
    cache.append(k, v)
    cache.truncate(260)                      # roll back 40 rejected tokens
    cache.append(k2, v2)
    direct = ia.Int8KVCache(2, 400, 64, center=False)
    direct.append(k[:260], v[:260])
    direct.append(k2, v2)
    same_cache(cache, direct)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(cache.decode(q), direct.decode(q))
    cache.truncate(len(cache))               # a no-op
    assert len(cache) == 300
    cache.truncate(0)
    assert len(cache) == 0


@pytest.mark.parametrize("n, exc", [(31, ValueError), (-1, ValueError), (2.0, TypeError),
                                    (True, TypeError), ("3", TypeError)])
def test_truncate_rejects(n, exc):
    cache, _, _ = filled_cache(np.random.default_rng(1), 2, 16, 30, cap=40)
    before = snapshot(cache)
    with pytest.raises(exc, match="n must be"):
        cache.truncate(n)
    assert_same_state(cache, before)


def test_state_dict_round_trip_is_bit_exact():
    rng = np.random.default_rng(2)
    cache, _, _ = filled_cache(rng, 3, 48, 77, "outlier", cap=100)
    state = cache.state_dict()
    assert state["length"] == 77 and state["max_seq"] == 100
    back = ia.Int8KVCache.from_state_dict(state)
    same_cache(back, cache)
    assert back.max_seq == 100
    q = rng.standard_normal((6, 48)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    bigger = ia.Int8KVCache.from_state_dict(state, max_seq=500)
    assert bigger.max_seq == 500
    same_cache(bigger, cache)
    with pytest.raises(ValueError, match="does not fit max_seq=50"):
        ia.Int8KVCache.from_state_dict(state, max_seq=50)
    before = cache.k_i8.copy()
    state["k_i8"][...] = 7                   # a state dict holds copies, not views
    np.testing.assert_array_equal(cache.k_i8, before)


def test_save_load_round_trip_and_numpy_reads_it(tmp_path):
    rng = np.random.default_rng(3)
    cache, _, _ = filled_cache(rng, 2, 128, 1000, cap=1200)
    path = tmp_path / "cache.npz"
    cache.save(path)
    back = ia.Int8KVCache.load(path)
    same_cache(back, cache)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    with np.load(path) as z:                  # the documented format
        assert set(z.files) >= {"k_i8", "v_i8", "k_scale", "v_scale", "length", "format"}
        np.testing.assert_array_equal(z["k_i8"], cache.k_i8)
    empty = ia.Int8KVCache(2, 10, 16)
    empty.save(tmp_path / "empty.npz")
    assert len(ia.Int8KVCache.load(tmp_path / "empty.npz")) == 0


def corrupt(path, offset_fraction):
    data = bytearray(path.read_bytes())
    i = int(len(data) * offset_fraction)
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip_data", "flip_early", "truncate", "text"])
def test_damaged_file_is_a_clear_error(tmp_path, damage):
    cache, _, _ = filled_cache(np.random.default_rng(4), 2, 64, 200)
    path = tmp_path / "c.npz"
    cache.save(path)
    if damage == "flip_data":
        corrupt(path, 0.5)
    elif damage == "flip_early":
        corrupt(path, 0.02)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_text("not a cache")
    with pytest.raises(ValueError):
        ia.Int8KVCache.load(path)


def test_missing_file():
    with pytest.raises(OSError):
        ia.Int8KVCache.load("/nonexistent/int8attn-cache.npz")


def tamper(state, **changes):
    out = dict(state)
    out.update(changes)
    return out


def test_mismatched_state_is_a_clear_error(tmp_path):
    cache, _, _ = filled_cache(np.random.default_rng(5), 2, 32, 20, cap=30)
    s = cache.state_dict()
    bad_code = s["k_i8"].copy()
    bad_code[1, 3, 5] = -128
    nan_scale = s["v_scale"].copy()
    nan_scale[0, 0] = np.nan
    cases = [
        ({k: v for k, v in s.items() if k != "v_i8"}, "lacks v_i8"),
        (tamper(s, format="something.else"), "format is"),
        (tamper(s, format_version=5), "format_version is 5"),
        (tamper(s, format_version=0), "format_version is 0"),
        (tamper(s, recent=2000), "recent must be from 0 to 1024, got 2000"),
        (tamper(s, k_recent=s["k_recent"][:, :1]), r"k_recent must be float32 \[n, 2, 32\]"),
        (tamper(s, v_recent=s["v_recent"][:5]), "k_recent and v_recent must have one shape"),
        (tamper(s, k_recent=np.concatenate([s["k_recent"]] * 2)), "holds 40 positions"),
        (tamper(s, offsets_set=True, center=False), "offsets_set without center"),
        (tamper(s, k_i8=s["k_i8"][:, :10]), r"k_i8 must be int8 \[2, 20, 32\]"),
        (tamper(s, k_scale=s["k_scale"].astype(np.float64)), "k_scale must be float32"),
        (tamper(s, length=np.float64(20)), "length must be an integer"),
        (tamper(s, length=25), r"k_i8 must be int8 \[2, 25, 32\]"),
        (tamper(s, k_i8=bad_code), "holds -128"),
        (tamper(s, v_scale=nan_scale), r"v_scale holds scales outside \[0, 9.3e\+18\] \(negative, NaN"),
        (tamper(s, head_dim=24), r"state head_dim must be a multiple of 16 and at most 1024, got 24"),
        (tamper(s, head_dim=48), r"k_i8 must be int8 \[2, 20, 48\]"),
    ]
    for state, match in cases:
        with pytest.raises(ValueError, match=match):
            ia.Int8KVCache.from_state_dict(state)
    # the same through a file numpy wrote by hand: a foreign npz
    np.savez(tmp_path / "foreign.npz", weights=np.ones(3))
    with pytest.raises(ValueError, match="lacks"):
        ia.Int8KVCache.load(tmp_path / "foreign.npz")
    with pytest.raises(TypeError, match="state must be a dict"):
        ia.Int8KVCache.from_state_dict([1, 2])


def test_max_seq_may_be_positional(tmp_path):
    cache = ia.Int8KVCache(2, 8, 32)
    cache.append(np.ones((3, 2, 32)), np.ones((3, 2, 32)))
    cache.save(tmp_path / "c.npz")
    assert ia.Int8KVCache.load(tmp_path / "c.npz", 20).max_seq == 20
    assert ia.Int8KVCache.from_state_dict(cache.state_dict(), 16).max_seq == 16
