"""The random-sign Hadamard rotation of the cache: an orthonormal transform in every tier,
attention unchanged, outlier channels tamed."""

import numpy as np
import pytest

import int8attn as ia
from conftest import (CONTRACT, EMULATION, attention_over_history, each_tier, filled_cache, make_kv,
                      rel_err)
from int8attn import _cache
from int8attn import reference as R

DIMS = [16, 32, 48, 64, 80, 96, 128, 192, 256, 384, 512, 1024]


@pytest.mark.parametrize("d", DIMS)
def test_transform_is_orthonormal_and_undone_by_its_inverse(tier, d):
    sign = R.rotation_signs(d, 7)
    m = _cache._rotate(np.eye(d, dtype=np.float32), sign)          # rows: R applied to e_i
    rows = np.arange(d) if d <= 256 else np.random.default_rng(d).choice(d, 32, replace=False)
    np.testing.assert_allclose(m[rows] @ m.T, np.eye(d)[rows], atol=2e-6)   # R R^T = I
    x = np.random.default_rng(d).standard_normal((5, d)).astype(np.float32)
    y = _cache._rotate(x, sign)
    np.testing.assert_allclose(y, R.rotate(x, sign), rtol=0, atol=1e-5)
    np.testing.assert_allclose(_cache._rotate(y, sign, inverse=True), x, rtol=0, atol=1e-5)
    # its own inverse up to the sign vector: H H = B I, so R^T = diag(sign) H / sqrt(B)
    np.testing.assert_allclose(_cache._rotate(y, np.ones(d, np.float32)) * sign, x, atol=1e-5)


@pytest.mark.parametrize("d", DIMS)
def test_every_tier_rotates_to_the_same_bits(d):
    x = np.random.default_rng(d).standard_normal((9, d)).astype(np.float32)
    sign = R.rotation_signs(d, 3)
    outs = list(each_tier(lambda: (_cache._rotate(x, sign), _cache._rotate(x, sign, inverse=True))).values())
    for a, b in outs[1:]:
        np.testing.assert_array_equal(a, outs[0][0])
        np.testing.assert_array_equal(b, outs[0][1])


def test_logits_are_invariant():
    """(Rq).(Rk) = q.k: the emulation over a rotated cache matches the unrotated emulation up
    to the rounding of the codes, and the float dots agree exactly in exact arithmetic."""
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((4, 128)), rng.standard_normal((300, 128))
    sign = R.rotation_signs(128, 11)
    np.testing.assert_allclose(R.rotate(q, sign) @ R.rotate(k, sign).T, q @ k.T, rtol=1e-12, atol=1e-10)
    kk, vv = make_kv(rng, 300, 2, 128)
    plain, rot = ia.Int8KVCache(2, 300, 128), ia.Int8KVCache(2, 300, 128, rotate=True)
    plain.append(kk, vv)
    rot.append(kk, vv)
    qq = rng.standard_normal((4, 128)).astype(np.float32)
    ref = R.attention(qq, kk, vv)
    assert rel_err(R.emulate(qq, rot), ref) < 0.03 and rel_err(R.emulate(qq, plain), ref) < 0.03


@pytest.mark.parametrize("shape", [(8, 2, 128, 1100), (4, 4, 96, 300), (6, 3, 80, 17), (2, 1, 1024, 260)])
@pytest.mark.parametrize("q_bits", [16, 8])
def test_rotated_cache_within_contract_of_its_dequantized_history(tier, shape, q_bits):
    h, hkv, d, s = shape
    rng = np.random.default_rng(s + d)
    k, v = make_kv(rng, s, hkv, d, "outlier")
    cache = ia.Int8KVCache(hkv, s, d, rotate=True, rotation_seed=5)
    cache.append(k, v)
    q = rng.standard_normal((h, d)).astype(np.float32)
    kd, vd = cache.dequantize()                       # un-rotated
    ref = R.attention(q, kd, vd)
    out = cache.decode(q, q_bits=q_bits)
    if q_bits == 16:
        assert rel_err(out, ref) <= CONTRACT
    else:
        emu = R.emulate(q, cache, q_bits=8)
        err = np.max(np.abs(out - emu), axis=1) / np.max(np.abs(ref), axis=1)
        assert float(err.max()) <= EMULATION
    t = rng.standard_normal((3, h, d)).astype(np.float32)
    got = cache.decode(t, window=200, sinks=2, softcap=30.0)
    ref = attention_over_history(cache, t, window=200, sinks=2, softcap=30.0)
    assert rel_err(got.reshape(-1, d), ref.reshape(-1, d)) <= CONTRACT


def test_rotation_tames_k_outlier_channels():
    """The cache format's own error against the unquantized K/V: several times smaller with
    the rotation when K has outlier channels."""
    rng = np.random.default_rng(3)
    k, v = make_kv(rng, 1000, 4, 128, "outlier")
    q = rng.standard_normal((8, 128)).astype(np.float32) * 3
    ref = R.attention(q, k, v)
    errs = {}
    for rotate in (False, True):
        cache = ia.Int8KVCache(4, 1000, 128, rotate=rotate, center=False)
        cache.append(k, v)
        errs[rotate] = rel_err(cache.decode(q), ref)
        kd, _ = cache.dequantize()
        errs[(rotate, "k")] = float(np.sqrt(np.mean((kd - k) ** 2)))    # RMS error of K
    assert errs[True] * 3 < errs[False]                 # measured: 0.46 -> 0.08
    assert errs[(True, "k")] * 3 < errs[(False, "k")]   # measured: 0.071 -> 0.018


def test_views_hold_rotated_codes_and_dequantize_rotates_back():
    rng = np.random.default_rng(4)
    k, v = make_kv(rng, 20, 2, 64)
    cache = ia.Int8KVCache(2, 20, 64, rotate=True, rotation_seed=9, center=False)
    cache.append(k, v)
    sign = R.rotation_signs(64, 9)
    codes, scales = R.quantize_rows(R.rotate(k, sign).astype(np.float32))
    assert np.mean(cache.k_i8 == codes.transpose(1, 0, 2)) > 0.99   # float32 vs float64 rotation
    kd, vd = cache.dequantize()
    assert np.abs(kd - k).max() < 0.05 and np.abs(vd - v).max() < 0.05
    assert cache.rotate and cache.rotation_seed == 9
    assert "rotate=True" in repr(cache)


def test_save_load_records_the_rotation(tmp_path):
    rng = np.random.default_rng(5)
    k, v = make_kv(rng, 50, 2, 96)
    cache = ia.Int8KVCache(2, 60, 96, rotate=True, rotation_seed=123)
    cache.append(k, v)
    cache.save(tmp_path / "r.npz")
    back = ia.Int8KVCache.load(tmp_path / "r.npz")
    assert back.rotate and back.rotation_seed == 123
    q = rng.standard_normal((4, 96)).astype(np.float32)
    np.testing.assert_array_equal(back.decode(q), cache.decode(q))
    state = cache.state_dict()
    assert state["rotation_block"] == 32
    state["rotation_block"] = 16
    with pytest.raises(ValueError, match="state rotation_block must be 32 for head_dim 96 with "
                                         "rotate=True, got 16"):
        ia.Int8KVCache.from_state_dict(state)


def test_state_without_rotation_keys_loads_unrotated(tmp_path):
    """Files written before the rotation existed (version 1, 365dbfb: the shape, the codes and
    the scales) hold plain codes: they load with rotate=False although the default now rotates,
    and decode as they did."""
    rng = np.random.default_rng(6)
    k, v = make_kv(rng, 30, 2, 64)
    plain = ia.Int8KVCache(2, 40, 64, rotate=False, keep_first=False, recent=0)
    plain.append(k, v)
    written = ("format", "n_kv_heads", "max_seq", "head_dim", "length", "k_i8", "v_i8",
               "k_scale", "v_scale")
    state = {key: plain.state_dict()[key] for key in written}
    state["format_version"] = 1
    np.savez(tmp_path / "old.npz", **state)
    for back in (ia.Int8KVCache.from_state_dict(state), ia.Int8KVCache.load(tmp_path / "old.npz")):
        assert back.rotate is False
        q = rng.standard_normal((4, 64)).astype(np.float32)
        np.testing.assert_array_equal(back.decode(q), plain.decode(q))


@pytest.mark.parametrize("kwargs, exc, match", [({"rotate": 1}, TypeError, "rotate must be True or False"),
                                                ({"rotation_seed": -1}, ValueError, r"rotation_seed must be from 0 to 2\*\*64 - 1, got -1"),
                                                ({"rotation_seed": 1 << 64}, ValueError, r"rotation_seed must be from 0 to 2\*\*64 - 1"),
                                                ({"rotation_seed": 1.5}, TypeError, "rotation_seed must be an int")])
def test_rotation_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ia.Int8KVCache(2, 10, 16, **kwargs)


@pytest.mark.parametrize("seed", [0, 1, 12345, 2 ** 63, 2 ** 64 - 1])
def test_engine_signs_are_the_references(seed):
    """The C engine draws the rotation's signs (part of the file format: a file stores the
    seed); the reference draws them independently in Python."""
    for d in (16, 80, 1024):
        np.testing.assert_array_equal(_cache._rotation_signs(d, seed), R.rotation_signs(d, seed))


@pytest.mark.parametrize("options", [{"recent": 0}, {"center": True, "recent": 0},
                                     {"keep_first": False, "recent": 0}, {}])
def test_dequantize_is_codes_times_scales_rotated_back(tier, options):
    """dequantize() (the engine's, in float32) against the same history rebuilt in float64 from
    the views: within float32 rounding, position 0 exact with keep_first, the recent window's
    positions exactly as appended."""
    rng = np.random.default_rng(9)
    cache, k, _ = filled_cache(rng, 2, 96, 40, "outlier", **options)
    kd, vd = cache.dequantize()
    for got, codes, scales, off in ((kd, cache.k_i8, cache.k_scale, cache.k_offset),
                                    (vd, cache.v_i8, cache.v_scale, cache.v_offset)):
        rows = codes.astype(np.float64) * scales[..., None]        # [Hkv, len, D]
        if off is not None:
            rows[:, 1:] += off[:, None]
        want = R.rotate(rows, R.rotation_signs(96, 0), inverse=True).transpose(1, 0, 2)
        if cache.keep_first:
            want[0] = (cache.k_first if got is kd else cache.v_first)
        window = R.window_rows(cache)[0 if got is kd else 1]
        if len(window):
            np.testing.assert_array_equal(got[len(got) - len(window):], window)
            want[len(got) - len(window):] = window
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    if cache.keep_first:
        np.testing.assert_array_equal(kd[0], k[0])
