"""The format study's emulation (examples/kv_formats.py): the formats the kernels have emulate
to the kernels' own history; the what-if formats do what they say."""

import os
import sys

import numpy as np
import pytest

import int8attn as ia
from conftest import make_kv
from int8attn import reference as R

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
if not os.path.exists(os.path.join(EXAMPLES, "kv_formats.py")):
    pytest.skip("examples/ is not beside these tests", allow_module_level=True)
sys.path.insert(0, EXAMPLES)
import kv_formats as F  # noqa: E402

KERNEL_FORMATS = [*ia.FORMATS.values(), {"rotation_seed": 7}]


# position 0 alone, then uneven appends; a first append with too few rows for offsets
PIECES = [((0, 1), (1, 38), (38, 39), (39, 70)), ((0, 5), (5, 70))]


@pytest.mark.parametrize("pieces", PIECES, ids=["offsets", "zero-offsets"])
@pytest.mark.parametrize("options", KERNEL_FORMATS)
@pytest.mark.parametrize("d", [48, 256])
def test_kernel_formats_emulate_to_the_kernels_history(options, d, pieces):
    """Appended in pieces: the emulated history is the cache's dequantized one, row for row, up
    to rounding that moves one code (float32 against float64 rotation); a wrong format (no
    offsets, no rotation, the wrong seed) moves most rows."""
    rng = np.random.default_rng(d)
    k, v = make_kv(rng, 70, 3, d, "outlier")
    k += 3.0 * rng.standard_normal(d).astype(np.float32)     # a shared K offset
    cache = ia.Int8KVCache(3, 70, d, **options)
    emu = F.EmulatedCache(3, d, **options)
    for a, b in pieces:
        cache.append(k[a:b], v[a:b])
        emu.append(k[a:b], v[a:b])
    for got, want, scale in ((emu.k, cache.dequantize()[0], cache.k_scale),
                             (emu.v, cache.dequantize()[1], cache.v_scale)):
        step = scale.T[:, :, None]                              # [len, Hkv, 1]
        diff = np.abs(got.astype(np.float64) - want)
        assert np.all(diff <= step * 1.001 + 1e-6)
        same = np.all(diff <= 1e-3 * step, axis=-1)     # a code moved: >= step / 32
        assert same.mean() >= 0.99
        if options.get("keep_first", True):
            np.testing.assert_array_equal(got[0], want[0])


def test_a_wrong_format_does_not_pass_for_the_kernels():
    """The check above can fail: the emulation without the offsets against a centered cache."""
    rng = np.random.default_rng(5)
    k, v = make_kv(rng, 40, 2, 64)
    k += 3.0
    cache = ia.Int8KVCache(2, 40, 64, **ia.FORMATS["centered"])
    emu = F.EmulatedCache(2, 64, center=False, recent=0)
    cache.append(k, v)
    emu.append(k, v)
    diff = np.abs(emu.k - cache.dequantize()[0])
    assert np.mean(np.all(diff <= 1e-3 * cache.k_scale.T[:, :, None], axis=-1)) < 0.5


def test_groups_of_the_whole_row_are_the_row_quantizer():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 4, 64)).astype(np.float32)
    codes, scale = R.quantize_rows(x)
    want = codes.astype(np.float32) * scale[..., None]
    np.testing.assert_array_equal(F.quantize_groups(x, 64), want)


def test_group_scales_spare_the_quiet_groups():
    """One loud group of 32 sets a per-row scale; with a scale per group the other groups keep
    their own precision (error many times smaller there), the loud group the same."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 128)).astype(np.float32)
    x[:, :32] *= 50.0
    err_row = np.abs(F.quantize_groups(x, 128) - x)
    err_grp = np.abs(F.quantize_groups(x, 32) - x)
    assert err_grp[:, 32:].mean() * 20 < err_row[:, 32:].mean()
    np.testing.assert_array_equal(err_grp[:, :32], err_row[:, :32])


def test_one_side_unquantized_and_the_first_position_kept():
    rng = np.random.default_rng(3)
    k, v = make_kv(rng, 20, 2, 32)
    for side, opts in ((0, {"quantize_k": False}), (1, {"quantize_v": False})):
        emu = F.EmulatedCache(2, 32, recent=0, **opts)
        emu.append(k[:5], v[:5])
        emu.append(k[5:], v[5:])
        kept, coded = (emu.k, emu.v) if side == 0 else (emu.v, emu.k)
        np.testing.assert_array_equal(kept, (k, v)[side])
        np.testing.assert_array_equal(coded[0], (v, k)[side][0])     # keep_first
        assert not np.array_equal(coded[1:], (v, k)[side][1:])


@pytest.mark.parametrize("kwargs, match", [
    ({"center": True, "keep_first": False}, "center needs keep_first"),
    ({"k_group": 24}, "k_group must divide head_dim=64, got 24"),
    ({"v_group": 0}, "v_group must divide head_dim=64, got 0"),
])
def test_bad_formats(kwargs, match):
    with pytest.raises(ValueError, match=match):
        F.EmulatedCache(2, 64, **kwargs)


def test_balance_shapes_the_k_error_away_from_what_q_reads():
    """K whose loud channels q ignores, and q reading quiet ones (Gemma 3's global layers): the
    balanced format waits for the first decode's queries, then its logit error is ten times
    smaller than the default format's, while its K rows stay within a few steps of the row scale."""
    rng = np.random.default_rng(4)
    n, d = 200, 64
    k = rng.standard_normal((n, 1, d)).astype(np.float32)
    k[:, :, :8] *= 30.0                                     # loud K channels
    v = rng.standard_normal((n, 1, d)).astype(np.float32)
    q = 0.1 * rng.standard_normal((n, 2, d)).astype(np.float32)
    q[:, :, 8:16] *= 100.0                                  # q reads quiet channels
    plain, bal = F.EmulatedCache(1, d, recent=0), F.EmulatedCache(1, d, recent=0, balance=True)
    for emu in (plain, bal):
        emu.append(k[:100], v[:100])
    np.testing.assert_array_equal(bal.k, k[:100])           # waiting for queries
    for emu in (plain, bal):
        emu.decode(q[:100], scale=1.0)
        emu.append(k[100:], v[100:])
    assert bal.d.shape == (1, d) and bal.d[0, :8].min() > 5 * bal.d[0, 8:16].max()
    np.testing.assert_array_equal(bal.v, plain.v)           # V is not balanced
    assert not np.array_equal(bal.k, k)
    np.testing.assert_array_equal(bal.k[0], k[0])           # keep_first
    err = [np.abs(np.einsum("tgd,sd->tgs", q, (emu.k - k)[:, 0])).mean() for emu in (plain, bal)]
    assert err[1] * 10 < err[0]
    step = np.abs(k).max(-1, keepdims=True) / 127
    assert np.all(np.abs(bal.k - k) <= 4 * step)
