"""Kernel-level properties of every tier: the quantizer bit for bit, exact integer dots,
and the same output bits as the scalar tier (the contract fixes every operation's order)."""

import pickle

import numpy as np
import pytest

import int8attn as ia
from conftest import assert_tiers_agree, each_tier, filled_cache, make_kv
from int8attn import _cache
from int8attn import reference as R

ODD_WIDTHS = [1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 1023, 1024]


@pytest.mark.parametrize("d", ODD_WIDTHS)
def test_quantizer_matches_numpy_bit_for_bit(tier, d):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((9, d)).astype(np.float32) * np.float32(3.5)
    x[1] = 0.0                                   # all-zero row: scale 0, codes 0
    x[2, :] = 1e-35                              # below the 2^-100 floor: stored as zero
    x[3] = np.round(x[3] * 2) / 2                # ties for round-half-even
    x[4, 0] = -x[4].max() * 1.01                 # the negative extreme
    x[5] *= 1e30
    x[6] = np.linspace(-127, 127, d, dtype=np.float32) / 2  # x * inv lands on .5 ties
    codes, scales = _cache._quantize_rows(x)
    ref_codes, ref_scales = R.quantize_rows(x)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_array_equal(scales.view(np.int32), ref_scales.view(np.int32))
    assert codes.min() >= -127


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantizer_rejects_non_finite(tier, bad):
    for d in (5, 16, 40):
        x = np.ones((1, d), np.float32)
        x[0, d - 1] = bad
        with pytest.raises(ValueError):
            _cache._quantize_rows(x)


def attend(q_hi, q_lo, k, c_lo, two_planes):
    """The active tier's attend on one chunk with c_hi = 1, k_scale = 1 and no bias: each logit
    is float(dot_hi), plus c_lo * float(dot_lo) fused when two_planes."""
    nq, n = q_hi.shape[0], k.shape[0]
    ones = np.ones(n, np.float32)
    return _cache._attend(q_hi, q_lo, np.ones(nq, np.float32), np.full(nq, c_lo, np.float32), k,
                          ones, np.zeros_like(k), ones, np.zeros(nq, np.float32),
                          two_planes=two_planes)


@pytest.mark.parametrize("two_planes", [False, True], ids=["q_bits8", "q_bits16"])
@pytest.mark.parametrize("d", [16, 32, 48, 80, 128, 256, 1008, 1024])
def test_attend_dots_are_exact(tier, d, two_planes):
    """The integer dots decode runs (each tier's K pass, several rows at a time): with c_hi = 1
    the chunk's max logit is exactly the largest dot. The rows are sorted by their dot, so the
    chunk of the first n rows has its max in row n - 1: n = 1 .. 37 reads every row's dot, at
    every position of the tier's row blocks and tails. With two planes, q_lo in [-2, 2] and
    c_lo = 128 keep dot_hi + 128 dot_lo exact in float32 (|.| < 2^24) up to d = 256."""
    if two_planes and d > 256:
        pytest.skip("dot_hi + 128 dot_lo is exact in float32 up to d = 256 only")
    rng = np.random.default_rng(d)
    q_hi = rng.integers(-127, 128, size=(3, d), dtype=np.int8)
    q_hi[2] = -127                                 # the extremes: the largest dots there are
    q_lo = rng.integers(-2, 3, size=(3, d), dtype=np.int8)
    k = rng.integers(-127, 128, size=(37, d), dtype=np.int8)
    k[0], k[1] = 127, -127
    exact = k.astype(np.int64) @ q_hi.astype(np.int64).T            # [37, 3]
    if two_planes:
        exact = exact + 128 * (k.astype(np.int64) @ q_lo.astype(np.int64).T)
    for j in range(3):                             # each query row on its own ordering
        order = np.argsort(exact[:, j], kind="stable")
        ks, want = k[order], exact[order, j]
        for n in range(1, 38):
            m, _, _ = attend(q_hi[j:j + 1], q_lo[j:j + 1], ks[:n], 128.0, two_planes)
            assert m[0] == want[n - 1], (j, n)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 17, 255, 256])
@pytest.mark.parametrize("lead", [0, 1, 3])
def test_attend_softmax_and_v_sum(tier, n, lead):
    """The chunk's l and o against float64: l = sum exp(logit - m), o = sum w v with the weights
    w = p v_scale as the V pass keeps them (the largest exact, the others in two integer planes,
    each within top2 / (2 * 127^2), top2 the largest of the others), V read from slot `lead` of
    its first tile (the other slots hold -127, with weight 0)."""
    rng = np.random.default_rng(n)
    d = 80
    q_hi = rng.integers(-5, 6, size=(3, d), dtype=np.int8)
    k = rng.integers(-127, 128, size=(n, d), dtype=np.int8)
    v = rng.integers(-127, 128, size=(n, d), dtype=np.int8)
    v_scale = rng.uniform(0.01, 0.1, n).astype(np.float32)
    logits = (k.astype(np.int64) @ q_hi.astype(np.int64).T).T.astype(np.float64) / 64  # [3, n]
    m2, l2, o2 = _cache._attend(q_hi, q_hi, np.full(3, 1 / 64, np.float32), np.zeros(3, np.float32),
                                k, np.ones(n, np.float32), v, v_scale, np.zeros(3, np.float32),
                                two_planes=False, lead=lead)
    np.testing.assert_array_equal(m2, logits.max(axis=1))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(l2, p.sum(axis=1), rtol=1e-6)
    w = p * v_scale
    exact = w @ v.astype(np.float64)
    scale = np.abs(exact).max()
    np.testing.assert_allclose(o2, R.weight_planes(w) @ v, rtol=1e-5, atol=1e-6 * scale)
    top2 = np.sort(w, axis=1)[:, -2:-1] if n > 1 else np.zeros((3, 1))
    bound = top2 / (2 * 127**2) * np.abs(v).sum(axis=0)                               # [3, d]
    assert np.all(np.abs(o2 - exact) <= bound * 1.01 + 1e-6 * scale)


def test_a_chunk_of_weights_below_2_to_minus_100_keeps_them(tier):
    """The largest weight far below 2^-100 (the top logit's V row is zeros, every other weight
    is exp(-87) * 0.01, a subnormal float): the planes take the weights lifted by 2^100 and their
    scales come back down, so o is their sum (near FLT_MIN, where the scales keep an absolute
    error below 2^-150: 2.2e-4 of o here), while l counts the top token."""
    d, n = 32, 9
    k = np.zeros((n, d), np.int8)
    k[0] = 100
    v = np.full((n, d), 90, np.int8)
    v_scale = np.full(n, 0.01, np.float32)
    v_scale[0] = 0.0
    q = np.full((1, d), 100, np.int8)
    m, l, o = _cache._attend(q, q, np.ones(1, np.float32), np.zeros(1, np.float32), k,
                             np.ones(n, np.float32), v, v_scale, np.zeros(1, np.float32),
                             two_planes=False, lead=2)
    assert m[0] == 100 * 100 * d and l[0] == 1.0      # (1 + 8 e^-87 in float32)
    w = float(np.float32(np.exp(-87.0)) * np.float32(0.01))       # the kernel's weights
    assert 0 < w < 2.0 ** -126
    np.testing.assert_allclose(o, 8 * w * 90, rtol=1e-3)


@pytest.mark.parametrize("center", [True, False], ids=["centered", "uncentered"])
@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "plain"])
def test_stored_bytes_identical_whichever_tier_appended(rotate, center):
    rng = np.random.default_rng(1)
    k, v = make_kv(rng, 77, 3, 80, "outlier")

    def filled():
        c = ia.Int8KVCache(3, 100, 80, rotate=rotate, center=center, recent=0)
        c.append(k[:40], v[:40])
        for t in range(40, 77):
            c.append(k[t], v[t])
        return c

    caches = each_tier(filled)
    stores = [(c.k_i8.tobytes(), c.v_i8.tobytes(), c.k_scale.tobytes(), c.v_scale.tobytes(),
               pickle.dumps(c.k_offset)) for c in caches.values()]
    assert all(s == stores[0] for s in stores)
    cache = caches["scalar"]
    stored = k.copy()
    if rotate:       # append = the tier's rotation (bit-identical across tiers), then quantize
        stored = _cache._rotate(k.reshape(-1, 80), R.rotation_signs(80, 0)).reshape(k.shape)
    if center:       # position 0 kept as given; the rows after it minus the offset
        np.testing.assert_array_equal(cache.k_first, k[0])
        mean = k[1:40].astype(np.float64).mean(axis=0)
        if rotate:
            mean = R.rotate(mean, R.rotation_signs(80, 0))
        np.testing.assert_allclose(cache.k_offset, mean, rtol=0, atol=1e-5)
        stored[1:] -= cache.k_offset
    else:
        assert cache.k_offset is None
    codes, scales = R.quantize_rows(stored)
    assert stores[0][0] == codes.transpose(1, 0, 2).tobytes()
    assert stores[0][2] == scales.T.tobytes()


@pytest.mark.parametrize("q_bits", [16, 8])
@pytest.mark.parametrize("shape", [(8, 8, 128, 1), (8, 2, 48, 257), (32, 8, 128, 1100),
                                   (4, 1, 1024, 300), (6, 3, 16, 513)])
def test_every_tier_returns_the_scalar_tiers_bits(shape, q_bits):
    h, hkv, d, s = shape
    rng = np.random.default_rng(s + d)
    cache, _, _ = filled_cache(rng, hkv, d, s, "outlier")
    q = rng.standard_normal((h, d)).astype(np.float32)
    assert_tiers_agree(each_tier(lambda: cache.decode(q, q_bits=q_bits)))


@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "plain"])
@pytest.mark.parametrize("construction", ["q_zero", "identical_keys"])
@pytest.mark.parametrize("s", [1, 17, 256, 1000])
def test_uniform_logits_bit_exact_across_tiers(construction, s, rotate):
    """All logits equal: p = exp(0) = 1 exactly, so out is the plain mean of the dequantized V
    rows in the contract's order (rotated back when the cache rotates), whichever tier runs."""
    rng = np.random.default_rng(s)
    hkv, d, h = 2, 64, 4
    k, v = make_kv(rng, s, hkv, d)
    if construction == "identical_keys":
        k[:] = k[:1]
        q = rng.standard_normal((h, d)).astype(np.float32)
    else:
        q = np.zeros((h, d), np.float32)
    # identical keys give identical logits only without the float position 0 (its logit is a
    # float dot, the others integer dots, plus the offset's part when centered)
    # (and without the recent window, whose logits are float dots too)
    cache = ia.Int8KVCache(hkv, s, d, rotate=rotate, keep_first=construction == "q_zero",
                           center=construction == "q_zero", recent=0)
    cache.append(k, v)
    outs = [out for pair in each_tier(lambda: (cache.decode(q), cache.decode(q, q_bits=8))).values()
            for out in pair]
    for out in outs[1:]:
        np.testing.assert_array_equal(out.view(np.int32), outs[0].view(np.int32))
    mean = cache.dequantize()[1].astype(np.float64).mean(axis=0)
    # (the weights, p * v_scale = v_scale, in integer planes: within 1 / (2 * 127^3) of the largest)
    np.testing.assert_allclose(outs[0], np.repeat(mean, h // hkv, axis=0), rtol=0, atol=5e-5)
    np.testing.assert_allclose(outs[0], R.emulate(q, cache), rtol=0, atol=1e-6)
