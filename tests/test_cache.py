"""The cache object: appends, views, dequantize, out=, input conversion, memory."""

import gc
import os
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import int8attn as ia
from conftest import CONTRACT, filled_cache, make_kv, rel_err
from int8attn import _args
from int8attn import reference as R


def test_readme_usage():
    rng = np.random.default_rng(0)
    cache = ia.Int8KVCache(n_kv_heads=8, max_seq=4096, head_dim=128)
    for _ in range(20):
        k, v = rng.standard_normal((2, 8, 128), dtype=np.float32)
        cache.append(k, v)
    q = rng.standard_normal((32, 128), dtype=np.float32)
    out = cache.decode(q)
    assert out.shape == (32, 128) and out.dtype == np.float32
    assert len(cache) == 20


def test_properties_and_nbytes():
    cache = ia.Int8KVCache(3, 100, 48)
    assert (cache.n_kv_heads, cache.max_seq, cache.head_dim, len(cache)) == (3, 100, 48, 0)
    # codes: 2 * Hkv * max_seq * D bytes; scales: 2 * Hkv * max_seq float32; keep_first and
    # center (both on by default): 2 * Hkv * D float32 each; the recent window (64 by default):
    # K and V rows of min(2 * 64, max_seq) positions as halves, with a float32 scale per row
    base = 2 * 3 * 100 * 48 + 2 * 3 * 100 * 4
    ring = 2 * 100 * 3 * (48 * 2 + 4)
    assert cache.nbytes == base + 4 * 3 * 48 * 4 + ring
    assert ia.Int8KVCache(3, 100, 48, keep_first=False, recent=0).nbytes == base
    assert ia.Int8KVCache(3, 100, 48, center=True, recent=0).nbytes == base + 4 * 3 * 48 * 4
    assert ia.Int8KVCache(3, 1000, 48, recent=16, center=False).nbytes == (
        10 * base + 2 * 3 * 48 * 4 + 2 * 32 * 3 * (48 * 2 + 4))
    # V's codes sit in tiles of 4 positions: max_seq rounded up to a multiple of 4
    assert ia.Int8KVCache(3, 101, 48, keep_first=False, recent=0).nbytes == (
        3 * 101 * 48 + 3 * 104 * 48 + 2 * 3 * 101 * 4)
    assert "holding 0 tokens" in repr(cache)


@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (8, 4), (4, 8)])
@pytest.mark.parametrize("opts", [{}, {"keep_first": False, "recent": 32}])
def test_the_store_layout_is_what_the_cache_allocates(bits, opts):
    """One statement of the buffers (the engine's i8a_store_layout): the cache holds exactly
    the buffers its format needs, of their shapes and types (nbytes sums them), and its views
    have their shapes."""
    hkv, cap, d = 3, 101, 64
    cache = ia.KVCache(hkv, cap, d, k_bits=bits[0], v_bits=bits[1], **opts)
    layout = cache._buffers()
    assert cache.nbytes == sum(size for _, _, size in layout.values())
    ring = min(2 * cache.recent, cap)
    groups, tiles = -(-cap // 32), -(-cap // 4)
    want = {"v_scale": ("f", (hkv, cap))}
    if bits[0] == 8:
        want.update(k_codes=("b", (hkv, cap, d)), k_scale=("f", (hkv, cap)))
    else:
        want.update(k4=("B", (hkv, cap, d // 2)), k4_wide=("B", (hkv, cap, d // 16)),
                    k4_min=("H", (hkv, groups, d)),
                    k4_step=("H", (hkv, groups, d)), k4_min_scale=("f", (hkv, groups)),
                    k4_step_scale=("f", (hkv, groups)))
    if bits[1] == 8:
        want.update(v_codes=("b", (hkv, tiles, d, 4)))
    else:
        want.update(v4=("B", (hkv, tiles, 2 * d)), v4_min=("f", (hkv, cap)))
    if cache.keep_first:
        want.update(k_first=("f", (hkv, d)), v_first=("f", (hkv, d)))
    if cache.center:
        want.update(k_offset=("f", (hkv, d)), v_offset=("f", (hkv, d)))
    want.update(k_recent=("H", (hkv, ring, d)), v_recent=("H", (hkv, ring, d)),
                k_rscale=("f", (hkv, ring)), v_rscale=("f", (hkv, ring)))
    assert {k: v[:2] for k, v in layout.items()} == want
    for name, (kind, shape, size) in layout.items():
        assert size == np.dtype(kind).itemsize * int(np.prod(shape)), name
    if bits[0] == 8:
        assert cache.k_i8.shape == (hkv, 0, d) and cache.k_scale.shape == (hkv, 0)
    if bits[1] == 8:
        assert cache._v_tiles().shape == layout["v_codes"][1]


def test_bulk_append_equals_per_token_append_bit_for_bit(tier):
    """Without centering every row is stored alone (with it, the append that sets the offsets
    matters: test_centering)."""
    rng = np.random.default_rng(2)
    k, v = make_kv(rng, 300, 4, 64, "outlier")
    bulk = ia.Int8KVCache(4, 300, 64, center=False)
    bulk.append(k, v)
    one = ia.Int8KVCache(4, 300, 64, center=False)
    for t in range(300):
        one.append(k[t], v[t])
    mixed = ia.Int8KVCache(4, 300, 64, center=False)
    mixed.append(k[:1], v[:1])
    mixed.append(k[1:257], v[1:257])
    mixed.append(k[257:], v[257:])
    for c in (one, mixed):
        for name in ("k_i8", "v_i8", "k_scale", "v_scale"):
            np.testing.assert_array_equal(getattr(c, name), getattr(bulk, name))
    q = rng.standard_normal((8, 64)).astype(np.float32)
    np.testing.assert_array_equal(bulk.decode(q), one.decode(q))


def test_views_layout_and_dequantize():
    rng = np.random.default_rng(3)
    cache, k, v = filled_cache(rng, 3, 32, 21, cap=50, rotate=False, keep_first=False,
                               recent=0)  # else: test_rotation, test_centering, test_recent
    assert cache.k_i8.shape == (3, 21, 32) and cache.k_i8.dtype == np.int8
    assert cache.v_scale.shape == (3, 21) and cache.v_scale.dtype == np.float32
    codes, scales = R.quantize_rows(v)
    np.testing.assert_array_equal(cache.v_i8, codes.transpose(1, 0, 2))
    np.testing.assert_array_equal(cache.v_scale, scales.T)
    kd, vd = cache.dequantize()
    assert kd.shape == (21, 3, 32) and kd.dtype == np.float32
    kc, ks = R.quantize_rows(k)
    np.testing.assert_array_equal(kd, kc.astype(np.float32) * ks[..., None])
    # the cache format's error: half a quantization step at most
    assert np.all(np.abs(vd - v) <= scales[..., None] * 0.5001)


@pytest.mark.parametrize("length", [1, 21, 48])
def test_v_codes_sit_in_tiles_of_four_positions_and_v_i8_copies_them(length):
    """Byte r of dimension i of V tile t is position 4 t + r; v_i8 gathers the rows back, as a
    read-only copy that later appends and resets leave alone."""
    rng = np.random.default_rng(length)
    cache, _, v = filled_cache(rng, 3, 32, length, cap=50, rotate=False, keep_first=False, recent=0)
    tiles = cache._v_tiles()
    assert tiles.shape == (3, 13, 32, 4) and not tiles.flags.writeable
    rows = cache.v_i8
    np.testing.assert_array_equal(rows, R.quantize_rows(v)[0].transpose(1, 0, 2))
    for p in range(length):
        np.testing.assert_array_equal(tiles[:, p // 4, :, p % 4], rows[:, p])
    before = rows.copy()
    cache.reset()
    cache.append(*make_kv(rng, length, 3, 32))
    np.testing.assert_array_equal(rows, before)
    assert not rows.flags.writeable


def test_views_are_read_only_and_not_copies():
    rng = np.random.default_rng(4)
    cache, _, _ = filled_cache(rng, 2, 16, 10, cap=20)
    for name in ("k_i8", "v_i8", "k_scale", "v_scale"):     # (v_i8: a copy, read-only too)
        view = getattr(cache, name)
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[...] = 0
        with pytest.raises(ValueError):
            view.flags.writeable = True
    a = cache.k_i8
    k, v = make_kv(rng, 1, 2, 16)
    before = a.copy()
    cache.append(k, v)
    np.testing.assert_array_equal(a, before)      # the old view still shows its 10 tokens
    # no copy: a view reads the cache's buffer, so after reset it shows what is stored anew
    cache.reset()
    k, v = make_kv(rng, 10, 2, 16)
    cache.append(k * 3, v)
    np.testing.assert_array_equal(a, cache.k_i8)
    assert not np.array_equal(a, before)


def test_reset_forgets_tokens_and_cache_is_reusable():
    rng = np.random.default_rng(5)
    cache, _, _ = filled_cache(rng, 2, 32, 30)
    cache.reset()
    assert len(cache) == 0 and cache.k_i8.shape == (2, 0, 32)
    with pytest.raises(ValueError, match="empty"):
        cache.decode(np.ones((2, 32), np.float32))
    k, v = make_kv(rng, 30, 2, 32)
    cache.append(k, v)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    assert rel_err(cache.decode(q), R.attention(q, *cache.dequantize())) <= CONTRACT


def test_out_argument_writes_in_place():
    rng = np.random.default_rng(6)
    cache, _, _ = filled_cache(rng, 2, 32, 50)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    out = np.full((4, 32), np.nan, np.float32)
    got = cache.decode(q, out=out)
    assert got is out
    np.testing.assert_array_equal(out, cache.decode(q))


def test_any_float_array_like_and_strides():
    rng = np.random.default_rng(7)
    k, v = make_kv(rng, 12, 2, 32)
    ref = ia.Int8KVCache(2, 12, 32, center=False)     # the lists go in token by token
    ref.append(k, v)
    # float64, non-contiguous, Fortran order, lists, float16
    c64 = ia.Int8KVCache(2, 12, 32, center=False)
    c64.append(k.astype(np.float64), v.astype(np.float64))
    big_k = np.zeros((12, 2, 64), np.float32)
    big_k[:, :, ::2] = k
    big_v = np.zeros((12, 2, 64), np.float32)
    big_v[:, :, ::2] = v
    strided = ia.Int8KVCache(2, 12, 32, center=False)
    strided.append(big_k[:, :, ::2], big_v[:, :, ::2])
    fortran = ia.Int8KVCache(2, 12, 32, center=False)
    fortran.append(np.asfortranarray(k), np.asfortranarray(v))
    lists = ia.Int8KVCache(2, 12, 32, center=False)
    for t in range(12):
        lists.append(k[t].tolist(), v[t].tolist())
    for c in (c64, strided, fortran, lists):
        np.testing.assert_array_equal(c.k_i8, ref.k_i8)
        np.testing.assert_array_equal(c.v_scale, ref.v_scale)
    q = rng.standard_normal((4, 32))
    np.testing.assert_array_equal(ref.decode(q), ref.decode(q.astype(np.float32)))
    np.testing.assert_array_equal(ref.decode(q[:, ::-1][:, ::-1]), ref.decode(q.astype(np.float32)))
    np.testing.assert_array_equal(ref.decode(q.T.copy().T), ref.decode(q.astype(np.float32)))
    half = ia.Int8KVCache(2, 12, 32, rotate=False, center=False)  # codes comparable to the quantizer's
    half.append(k.astype(np.float16), v.astype(np.float16))
    np.testing.assert_array_equal(half.k_i8, R.quantize_rows(k.astype(np.float16))[0].transpose(1, 0, 2))


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    k, v = make_kv(rng, 9, 2, 32)
    a = ia.Int8KVCache(2, 9, 32)
    a.append(torch.from_numpy(k), torch.from_numpy(v).to(torch.float64))
    b = ia.Int8KVCache(2, 9, 32)
    b.append(k, v)
    np.testing.assert_array_equal(a.k_i8, b.k_i8)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    got = a.decode(torch.from_numpy(q).requires_grad_())
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == (4, 32)
    np.testing.assert_array_equal(got.numpy(), b.decode(q))
    # no copies: a CPU float32 tensor is read in place, and out= may be a tensor
    qt = torch.from_numpy(q)
    assert np.shares_memory(_args.as_float32(qt, "q"), q)
    out = torch.full((4, 32), float("nan"))
    assert a.decode(qt, out=out) is out
    np.testing.assert_array_equal(out.numpy(), b.decode(q))
    with pytest.raises(TypeError, match="out must have dtype float32, got torch.float64"):
        a.decode(qt, out=torch.zeros((4, 32), dtype=torch.float64))
    with pytest.raises(ValueError, match="out must not require grad"):
        a.decode(qt, out=torch.zeros((4, 32), requires_grad=True))
    with pytest.raises(ValueError, match=r"out must have shape \[4, 32\], got \[32, 4\]"):
        a.decode(qt, out=torch.zeros((32, 4)))
    with pytest.raises(ValueError, match="C-contiguous"):
        a.decode(qt, out=torch.zeros((32, 4)).t())
    # bfloat16, which numpy lacks: converted through float32
    kb = torch.from_numpy(k).to(torch.bfloat16)
    c = ia.Int8KVCache(2, 9, 32, rotate=False, center=False)  # codes comparable to the quantizer's
    c.append(kb, kb)
    np.testing.assert_array_equal(c.k_i8, R.quantize_rows(kb.float().numpy())[0].transpose(1, 0, 2))


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_memory_growth_over_many_appends_and_decodes(tier):
    """Traced allocations (Python objects and numpy buffers) come back to where they were, and
    the process does not grow by a leaked buffer per call (RSS, with room for an emulator's
    translation cache)."""
    rng = np.random.default_rng(9)
    k, v = make_kv(rng, 64, 4, 64)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    out = np.empty((8, 64), np.float32)
    cache = ia.Int8KVCache(4, 64, 64)

    def cycle(n):
        for _ in range(n):
            cache.reset()
            cache.append(k[:32], v[:32])
            for t in range(32, 64):
                cache.append(k[t], v[t])
            cache.decode(q)
            cache.decode(q, out=out, q_bits=8)
            cache.dequantize()
            len(cache.k_i8), len(cache.v_scale)

    cycle(20)
    gc.collect()
    linux = sys.platform.startswith("linux")
    rss = _rss_bytes() if linux else 0
    # A leak grows the traced memory in every window of calls; a bounded pool filling up once
    # (an allocator's free list, numpy's small-array caches, a free-threaded build's delayed
    # frees) grows it in one window and not the next. So: up to three windows of 300 cycles
    # (37 calls each), and one of them must stay under 16 kB (a leak of 55 bytes a cycle fails).
    tracemalloc.start()
    grown = []
    try:
        cycle(20)
        for _ in range(3):
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0]
            cycle(300)
            gc.collect()
            grown.append(tracemalloc.get_traced_memory()[0] - traced)
            if grown[-1] < 16 * 1024:
                break
    finally:
        tracemalloc.stop()
    assert min(grown) < 16 * 1024, f"traced memory grew in every window of 300 cycles: {grown}"
    # untraced memory (a C buffer per call, e.g. the decode scratch of ~11 kB) would show here;
    # not under AddressSanitizer, whose quarantine holds freed memory back by design (the
    # sanitizer lane's C cross-check runs LeakSanitizer instead)
    if linux and not os.environ.get("INT8ATTN_SANITIZED"):
        assert _rss_bytes() - rss < 8 * 1024 * 1024


def test_gil_is_released_while_a_kernel_runs():
    """While one thread is inside decode, another thread runs Python: it sees the cache busy.
    That can only happen if the kernel runs without the GIL (the busy flag is set and cleared
    in compiled code around the GIL-free call)."""
    rng = np.random.default_rng(10)
    cache, _, _ = filled_cache(rng, 4, 128, 4096)
    q = rng.standard_normal((16, 128)).astype(np.float32)
    done = threading.Event()
    seen_busy = []

    def work():
        deadline = time.monotonic() + 10.0
        while not seen_busy and time.monotonic() < deadline:
            try:
                cache.decode(q)
            except RuntimeError:
                pass              # the main thread held it (with no GIL, often): try again
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not done.is_set() and not seen_busy:
        try:
            cache.decode(q[:4])
        except RuntimeError as e:
            assert "in use by another thread" in str(e)
            seen_busy.append(True)
    t.join()
    assert seen_busy


def test_buffers_start_on_a_cache_line_and_outlive_the_cache():
    """The codes and scales sit at 64-byte boundaries (every 64-byte row load stays in one cache
    line), and a view taken from a cache keeps its memory after the cache is gone."""
    for shape in ((1, 1, 16), (3, 1000, 80), (8, 8192, 128)):
        cache = ia.Int8KVCache(*shape)
        for view in (cache.k_i8, cache._v_tiles(), cache.k_scale, cache.v_scale):
            assert view.__array_interface__["data"][0] % 64 == 0
    cache = ia.Int8KVCache(2, 4, 16)
    cache.append(np.ones((4, 2, 16)), np.ones((4, 2, 16)))
    k, want = cache.k_i8, cache.k_i8.copy()
    del cache
    gc.collect()
    np.testing.assert_array_equal(k, want)
