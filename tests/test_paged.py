"""PagedKVCache: one layer's rows of many sequences in shuffled blocks, written by slot and
attended in one varlen call. Each sequence must give the bits the same rows give in a
contiguous cache of the same format (FORMATS["rotated"]), on every tier and thread count, and
stay within the contract of float attention over what it dequantizes to."""

import math

import numpy as np
import pytest

import int8attn as ia
from int8attn import _cache
from int8attn import reference as R

from conftest import CONTRACT, EMULATED, assert_tiers_and_threads_agree, rel_err

ROTATED = ia.FORMATS["rotated"]


def slots_of(table_row, n, bs, start=0):
    """The slots of positions start .. n - 1 of a sequence whose blocks are table_row."""
    pos = np.arange(start, n)
    return np.asarray(table_row, np.int64)[pos // bs] * bs + pos % bs


class Batch:
    """Sequences of the given lengths in a pool (blocks shuffled among spare ones; with
    `share`, sequence 1 starts with sequence 0's full blocks, as prefix caching shares them),
    each also in a contiguous rotated cache, with t[b] queries each."""

    def __init__(self, rng, hkv, d, bs, lens, t, h, share=False, seed=0):
        self.lens, self.t, self.h, self.bs = list(lens), list(t), h, bs
        need = [-(-n // bs) for n in lens]
        spare = 3
        self.pool = ia.PagedKVCache(hkv, d, bs, sum(need) + spare, rotation_seed=seed)
        free = list(rng.permutation(sum(need) + spare))
        width = max(need) + 2
        self.table = np.full((len(lens), width), -1, np.int32)      # unread entries: -1
        self.k, self.v = [], []
        for b, n in enumerate(lens):
            k = rng.standard_normal((n, hkv, d)).astype(np.float32) + 0.5
            v = rng.standard_normal((n, hkv, d)).astype(np.float32)
            shared = min(lens[0], n) // bs if share and b == 1 else 0
            if shared:
                k[:shared * bs], v[:shared * bs] = self.k[0][:shared * bs], self.v[0][:shared * bs]
            for j in range(need[b]):
                self.table[b, j] = self.table[0, j] if j < shared else free.pop()
            self.pool.write(slots_of(self.table[b], n, bs, shared * bs), k[shared * bs:],
                            v[shared * bs:])
            self.k.append(k), self.v.append(v)
        self.starts = np.concatenate([[0], np.cumsum(t)]).astype(np.int32)
        self.q = (rng.standard_normal((int(self.starts[-1]), h, d)) * 2).astype(np.float32)
        self.seed = seed

    def attend(self, **options):
        return self.pool.attend(self.q, self.starts, np.array(self.lens), self.table, **options)

    def contiguous(self, b, **options):
        """Sequence b's queries decoded by a contiguous cache holding its rows."""
        n = self.lens[b]
        cache = ia.KVCache(self.pool.n_kv_heads, n, self.pool.head_dim,
                           rotation_seed=self.seed, **ROTATED)
        cache.append(self.k[b], self.v[b])
        return cache.decode(self.q[self.starts[b]:self.starts[b + 1]], **options), cache


CASES = [
    # hkv, d, block size, lengths, queries each, query heads, options
    (8, 128, 16, (300, 517, 1), (1, 1, 1), 8, {}),
    (2, 64, 32, (613, 613, 258), (1, 40, 258), 6, dict(window=100, sinks=4, softcap=30.0)),
    (1, 256, 64, (700, 900, 33), (5, 1, 17), 4, dict(window=512)),
    (2, 96, 128, (257, 700, 77), (1, 120, 0), 16, dict(q_bits=8)),
    (1, 32, 256, (45, 300, 512, 16), (3, 300, 1, 16), 7, dict(softcap=5.0, scale=0.3)),
    # 19 sequences, a third of them without queries: past the batches held on the stack
    (2, 64, 16, tuple(17 + 29 * i for i in range(19)), tuple(i % 3 for i in range(19)), 4,
     dict(window=70, sinks=1)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hkv{c[0]}-d{c[1]}-bs{c[2]}")
def test_each_sequence_has_the_bits_of_a_contiguous_cache(tier, case):
    hkv, d, bs, lens, t, h, options = case
    rng = np.random.default_rng(bs + d)
    batch = Batch(rng, hkv, d, bs, lens, t, h, share=True)
    out = batch.attend(**options)
    for b in range(len(lens)):
        if t[b] == 0:
            continue
        ref, cache = batch.contiguous(b, **options)
        got = out[batch.starts[b]:batch.starts[b + 1]]
        np.testing.assert_array_equal(got.reshape(ref.shape).view(np.int32), ref.view(np.int32),
                                      err_msg=f"sequence {b}")
        k, v = batch.pool.dequantize(batch.table[b], lens[b])
        kc, vc = cache.dequantize()
        np.testing.assert_array_equal(k.view(np.int32), kc.view(np.int32))
        np.testing.assert_array_equal(v.view(np.int32), vc.view(np.int32))


@pytest.mark.parametrize("bs", [16, 64, 128])
def test_attend_meets_the_contract_against_float_attention(tier, bs):
    rng = np.random.default_rng(bs)
    hkv, d, h = 2, 128, 8
    batch = Batch(rng, hkv, d, bs, (200, 333, 517), (1, 7, 20), h)
    options = dict(window=300, sinks=2, softcap=20.0)
    out = batch.attend(**options)
    for b, n in enumerate(batch.lens):
        k, v = batch.pool.dequantize(batch.table[b], n)
        q = batch.q[batch.starts[b]:batch.starts[b + 1]]
        ref = R.attention(q, k, v, **options)
        got = out[batch.starts[b]:batch.starts[b + 1]]
        assert rel_err(got.reshape(-1, d), ref.reshape(-1, d)) < CONTRACT


def test_dequantize_is_the_reference_quantizer_of_the_rotated_rows():
    rng = np.random.default_rng(5)
    batch = Batch(rng, 2, 64, 16, (77,), (1,), 2, seed=11)
    k, v = batch.pool.dequantize(batch.table[0], 77)
    signs = R.rotation_signs(64, 11)
    for got, rows in ((k, batch.k[0]), (v, batch.v[0])):
        codes, scale = R.quantize_rows(R.rotate(rows, signs))
        want = R.rotate(codes * scale[..., None], signs, inverse=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(rows).max())


def test_tiers_and_thread_counts_agree():
    rng = np.random.default_rng(3)
    lens, t = ((300, 420, 100), (1, 30, 3)) if EMULATED else ((1000, 1300, 600), (1, 100, 3))
    batch = Batch(rng, 4, 64, 32, lens, t, 16, share=True)

    assert_tiers_and_threads_agree(lambda: batch.attend(window=280, sinks=3), "attend")


def test_a_shared_block_is_read_by_every_sequence_that_names_it():
    rng = np.random.default_rng(9)
    pool = ia.PagedKVCache(2, 32, 16, 8)
    k, v = rng.standard_normal((2, 40, 2, 32)).astype(np.float32)
    prefix = np.array([5, 2], np.int32)                  # 32 positions, both sequences
    table = np.array([[5, 2, 7], [5, 2, 0]], np.int32)
    pool.write(slots_of(table[0], 40, 16), k, v)
    pool.write(slots_of(table[1], 40, 16, 32), k[32:] * 2, v[32:])   # its own third block
    q = rng.standard_normal((2, 4, 32)).astype(np.float32)
    out = pool.attend(q, [0, 1, 2], [40, 40], table)
    for b, scale_k in ((0, 1.0), (1, 2.0)):
        kk = k.copy()
        kk[32:] *= scale_k
        cache = ia.KVCache(2, 40, 32, **ROTATED)
        cache.append(kk, v)
        np.testing.assert_array_equal(out[b], cache.decode(q[b]))
    np.testing.assert_array_equal(pool.dequantize(prefix, 32)[0],
                                  pool.dequantize(table[1], 40)[0][:32])


def test_negative_slots_are_skipped_and_a_bad_row_writes_nothing():
    rng = np.random.default_rng(1)
    pool = ia.PagedKVCache(2, 32, 16, 4)
    k, v = rng.standard_normal((2, 5, 2, 32)).astype(np.float32)
    pool.write([3, -1, 20, -1, 63], k, v)
    before = pool.buffer.copy()
    k[2, 1, 7] = np.nan                          # a row that is written
    with pytest.raises(ValueError, match=r"k holds NaN.*row 2, kv head 1.*nothing was written"):
        pool.write([0, 1, 2, 3, 4], k, v)
    np.testing.assert_array_equal(pool.buffer, before)
    k[2, 1, 7] = 0.0
    v[1] = np.inf                                # a skipped row may hold anything
    pool.write([0, -1, 2, 3, 4], k, v)
    assert not np.array_equal(pool.buffer, before)


@pytest.mark.parametrize("open_blocks", [0, 8])
def test_a_write_whose_rows_fill_v_tiles_is_the_rows_written_one_by_one(open_blocks):
    # V codes sit in tiles of 4 positions, and a write codes a tile's 4 rows together when their
    # slots are the tile's in order: here 1200 distinct slots (the write on 2 threads) whose
    # tiles come whole and in order, reversed, with a skipped row, started one slot late, and
    # cut by the threads' ranges wherever they fall
    rng = np.random.default_rng(21)
    hkv, d, bs = 3, 48, 16
    slots = np.arange(1200, dtype=np.int64)
    slots[100:104] = slots[100:104][::-1].copy()      # a tile reversed
    slots[205] = -1                                   # a tile with a skipped row
    slots[301:1200] = np.arange(302, 1201)            # tiles from their second slot on
    k, v = rng.standard_normal((2, 1200, hkv, d)).astype(np.float32)
    pools = [ia.PagedKVCache(hkv, d, bs, 80, open_blocks=open_blocks) for _ in range(2)]
    before = ia.get_num_threads()
    try:
        ia.set_num_threads(2)
        pools[0].write(slots, k, v)
        for i in range(len(slots)):
            pools[1].write(slots[i:i + 1], k[i:i + 1], v[i:i + 1])
    finally:
        ia.set_num_threads(before)
    np.testing.assert_array_equal(pools[0].buffer, pools[1].buffer)


@pytest.mark.parametrize("open_blocks", [0, 6])
def test_a_long_write_on_threads_is_the_rows_written_one_by_one(open_blocks):
    # 700 rows of 4 kv heads (the write's K and V sides run on the threads): 668 in shuffled
    # slots of blocks 0-22, where slot 50 is given three times and 300 twice (each ends as its
    # last row) and two rows are skipped, then block 23 in order (its halves then read by the
    # attend, with open blocks)
    rng = np.random.default_rng(12)
    hkv, d, bs, n = 4, 64, 32, 700
    slots = np.concatenate([rng.permutation(23 * bs)[:n - bs], 23 * bs + np.arange(bs)])
    slots[[10, 400, 650]] = 50
    slots[[20, 30]] = 300
    slots[[5, 600]] = -1
    k, v = rng.standard_normal((2, n, hkv, d)).astype(np.float32)
    pools = [ia.PagedKVCache(hkv, d, bs, 24, open_blocks=open_blocks) for _ in range(3)]
    before = ia.get_num_threads()
    try:
        for pool, threads in zip(pools, (2, 1)):
            ia.set_num_threads(threads)
            pool.write(slots, k, v)
        for i in range(n):
            pools[2].write(slots[i:i + 1], k[i:i + 1], v[i:i + 1])
    finally:
        ia.set_num_threads(before)
    for pool in pools[1:]:
        np.testing.assert_array_equal(pools[0].buffer, pool.buffer)
    # refused rows, checked on the threads: the first in row order is named, nothing written
    before_write = pools[0].buffer.copy()
    bad_k, bad_v = k.copy(), v.copy()
    bad_v[650, 3, 9] = np.inf
    bad_k[651, 0, 0] = np.nan
    bad_k[690, 1, 5] = 1e30
    try:
        ia.set_num_threads(2)
        with pytest.raises(ValueError, match=r"v holds .*row 650, kv head 3.*nothing was written"):
            pools[0].write(slots, bad_k, bad_v)
    finally:
        ia.set_num_threads(before)
    np.testing.assert_array_equal(pools[0].buffer, before_write)
    table = np.arange(24, dtype=np.int32)
    kd, _ = pools[0].dequantize(table, 23 * bs)
    signs = R.rotation_signs(d, 0)
    for s in (50, 300):             # the slot's last row
        last = max(i for i in range(n) if slots[i] == s)
        codes, scale = R.quantize_rows(R.rotate(k[last], signs))
        want = R.rotate(codes * scale[..., None], signs, inverse=True)
        np.testing.assert_allclose(kd[s], want, rtol=0, atol=1e-5 * np.abs(k[last]).max())
    q = rng.standard_normal((1, 8, d)).astype(np.float32)
    outs = [p.attend(q, np.array([0, 1], np.int32), np.array([24 * bs], np.int32), table[None])
            for p in pools[:2]]
    np.testing.assert_array_equal(outs[0].view(np.int32), outs[1].view(np.int32))


def test_a_given_buffer_is_the_pools_memory():
    rng = np.random.default_rng(2)
    bb = ia.PagedKVCache.bytes_per_block(2, 64, 32)
    assert bb == 2 * 32 * (2 * 64 + 8)
    raw = np.zeros(6 * bb + 64, np.uint8)
    at = -raw.ctypes.data % 64
    mem = raw[at:at + 6 * bb]
    a = ia.PagedKVCache(2, 64, 32, 6, buffer=mem)
    k, v = rng.standard_normal((2, 40, 2, 64)).astype(np.float32)
    table = np.array([[4, 1]], np.int32)
    a.write(slots_of(table[0], 40, 32), k, v)
    assert np.any(mem != 0) and a.buffer.base is not None
    b = ia.PagedKVCache(2, 64, 32, 6, buffer=mem)     # another pool over the same bytes
    q = rng.standard_normal((1, 2, 64)).astype(np.float32)
    np.testing.assert_array_equal(a.attend(q, [0, 1], [40], table),
                                  b.attend(q, [0, 1], [40], table))
    with pytest.raises(ValueError, match="multiple of 64"):
        ia.PagedKVCache(2, 64, 32, 6, buffer=raw[at + 1:at + 1 + 6 * bb])
    with pytest.raises(ValueError, match=rf"num_blocks \* block_bytes = 5 \* {bb}"):
        ia.PagedKVCache(2, 64, 32, 5, buffer=mem)
    with pytest.raises(TypeError, match="dtype uint8 or int8"):
        ia.PagedKVCache(2, 64, 32, 6, buffer=mem.view(np.float32))


def test_a_torch_buffer_and_torch_arguments():
    torch = pytest.importorskip("torch")
    bb = ia.PagedKVCache.bytes_per_block(1, 32, 16)
    mem = torch.zeros(3 * bb, dtype=torch.uint8)
    pool = ia.PagedKVCache(1, 32, 16, 3, buffer=mem)
    k = torch.randn(20, 1, 32, dtype=torch.bfloat16)
    pool.write(torch.arange(20, dtype=torch.int64) + 16, k, k)
    assert int(mem.count_nonzero()) > 0
    q = torch.randn(2, 2, 32)
    out = pool.attend(q, torch.tensor([0, 2], dtype=torch.int32), torch.tensor([20]),
                      torch.tensor([[1, 2]], dtype=torch.int32))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 2, 32)


def _sixteen_bit_case(rows, to16, back):
    """A pool written and attended with 16-bit rows (to16 of float32 rows) beside one given the
    same values as float32 (back of them): (the first's output, the second's)."""
    k, v = rows((2, 150, 2, 64)) * 3
    q = rows((70, 6, 64)) * 2
    k[3, 1, 5], v[7, 0, 2] = 60000.0, -1e-6       # near float16's largest, below its normals
    table = np.array([[4, 0, 2], [1, 3, -1]], np.int32)
    starts, lens = [0, 50, 70], [150, 20]
    out = []
    for conv in (to16, lambda x: back(to16(x))):
        pool = ia.PagedKVCache(2, 64, 64, 5, open_blocks=4)
        for b, n in enumerate(lens):
            pool.write(slots_of(table[b], n, 64), conv(k[:n]), conv(v[:n]))
        out.append(pool.attend(conv(q), starts, lens, table))
    return out


def test_float16_rows_are_read_as_their_values():
    """float16 k, v and q give the bits of the same values as float32 (each row widened as it is
    read), and out= float16 is the float32 result rounded as numpy rounds it."""
    rng = np.random.default_rng(7)
    rows = lambda shape: rng.standard_normal(shape).astype(np.float32)
    got16, got32 = _sixteen_bit_case(rows, lambda x: x.astype(np.float16),
                                     lambda x: x.astype(np.float32))
    np.testing.assert_array_equal(got16.view(np.int32), got32.view(np.int32))
    pool = ia.PagedKVCache(1, 32, 16, 2)
    k = rng.standard_normal((20, 1, 32)).astype(np.float16)
    pool.write(np.arange(20), k, k)
    q = rng.standard_normal((3, 2, 32)).astype(np.float16)
    want = pool.attend(q, [0, 3], [20], [[0, 1]])
    half = np.full((3, 2, 32), np.nan, np.float16)
    assert pool.attend(q, [0, 3], [20], [[0, 1]], out=half) is half
    np.testing.assert_array_equal(half.view(np.uint16), want.astype(np.float16).view(np.uint16))
    k[4, 0, 9] = np.inf                           # a float16 Inf is refused, as float32's is
    with pytest.raises(ValueError, match=r"k holds NaN or Inf.*row 4, kv head 0"):
        pool.write(np.arange(20), k, k)
    with pytest.raises(TypeError, match="k and v must have one dtype"):
        pool.write(np.arange(20), k, k.astype(np.float32))
    raw = np.zeros(half.nbytes + 1, np.uint8)     # a float16 out= at an odd address: refused
    odd = np.ndarray(half.shape, np.float16, buffer=raw[1:].data)   # before the engine runs
    with pytest.raises(ValueError, match=r"out must be a writable aligned C-contiguous array"):
        pool.attend(q, [0, 3], [20], [[0, 1]], out=odd)
    assert not raw.any()


def test_sixteen_bit_rows_are_refused_where_their_float32_values_are():
    """A write checks bfloat16 and float16 rows on their bits: each value in turn, at one place
    of k or of v, is written or refused (naming the argument, row and kv head) exactly as the same
    value as float32 is. bfloat16 reaches past the format's +-2**64 (the next value above is
    refused, 2**64 is not); every finite float16 is within it."""
    torch = pytest.importorskip("torch")
    bf16 = lambda bits: torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)
    f16 = lambda bits: torch.tensor(bits, dtype=torch.int16).view(torch.float16)
    cases = [(bf16, b) for b in (0x5f80, 0x5f81, -0x2080, -0x207f, 0x7f7f, 0x7f80, 0x7fc0,
                                 0x0001)]                 # 2^64 and the next, both signs; ...
    cases += [(f16, b) for b in (0x7bff, -0x0401, 0x7c00, -0x0400, 0x7e00, 0x0001)]
    rng = np.random.default_rng(11)
    base = torch.from_numpy(rng.standard_normal((9, 3, 32)).astype(np.float32))
    for make, bits in cases:
        value = make(bits)
        for name, row, head in (("k", 5, 2), ("v", 7, 0)):
            results = []
            for dt in (value.dtype, torch.float32):
                k, v = base.to(value.dtype).to(dt), base.to(value.dtype).to(dt)
                (k if name == "k" else v)[row, head, 17] = value.to(dt)
                pool = ia.PagedKVCache(3, 32, 16, 2)
                try:
                    pool.write(torch.arange(9), k, v)
                    results.append("written")
                except ValueError as e:
                    results.append(str(e))
            assert results[0] == results[1], (value, name, results)
            refused = not math.isfinite(float(value)) or abs(float(value)) > 2.0 ** 64
            assert (results[0] != "written") == refused, (value, name, results)
            if refused:
                assert results[0].startswith(name) and f"row {row}, kv head {head}" in results[0]


def test_every_finite_float16_is_widened_to_its_value():
    """Each of the 63488 finite halves (subnormals, both zeros, the largest) as k, v and q
    gives the pool and the output that the same values as float32 give, bit for bit; a NaN
    half, whatever its payload, is refused as Inf is."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    half = bits.view(np.float16)
    finite = half[np.isfinite(half)]                          # 63488 values
    rows = finite[:len(finite) // 64 * 64].reshape(-1, 1, 64)   # 992 rows of 64
    n = len(rows)
    pools = []
    for conv in (lambda x: x, lambda x: x.astype(np.float32)):
        pool = ia.PagedKVCache(1, 64, 16, n // 16 + 1, open_blocks=2)
        pool.write(np.arange(n), conv(rows), conv(rows[::-1].copy()))
        out = pool.attend(conv(rows[:8] / 4096), [0, 8], [n],
                          [np.arange(n // 16 + 1)])
        pools.append((pool.buffer.copy(), out))
    np.testing.assert_array_equal(pools[0][0], pools[1][0])
    np.testing.assert_array_equal(pools[0][1].view(np.int32), pools[1][1].view(np.int32))
    pool = ia.PagedKVCache(1, 64, 16, 2)
    for payload in (0x7c01, 0xfe00, 0x7fff):
        k = np.zeros((1, 1, 64), np.float16)
        k.view(np.uint16)[0, 0, 7] = payload
        with pytest.raises(ValueError, match=r"k holds NaN or Inf.*row 0, kv head 0"):
            pool.write(np.arange(1), k, np.zeros_like(k))


def test_bfloat16_rows_are_read_as_their_values():
    """torch bfloat16 k, v and q (a serving engine's model dtype) give the bits of the same values
    as float32, and out= bfloat16 is the float32 result as torch rounds it."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    rows = lambda shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    got16, got32 = _sixteen_bit_case(rows, lambda x: x.to(torch.bfloat16), lambda x: x.float())
    np.testing.assert_array_equal(got16.numpy().view(np.int32), got32.numpy().view(np.int32))
    pool = ia.PagedKVCache(1, 32, 16, 2)
    kv = torch.randn(20, 1, 32, dtype=torch.bfloat16)
    pool.write(torch.arange(20), kv, kv)
    q = torch.randn(3, 2, 32, dtype=torch.bfloat16)
    want = pool.attend(q, [0, 3], [20], [[0, 1]])
    out = torch.full((3, 2, 32), float("nan"), dtype=torch.bfloat16)
    assert pool.attend(q, [0, 3], [20], [[0, 1]], out=out) is out
    assert torch.equal(out.view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
    qs = torch.randn(3, 4, 32, dtype=torch.bfloat16)[:, ::2]          # strided: copied first
    np.testing.assert_array_equal(pool.attend(qs, [0, 3], [20], [[0, 1]]).numpy(),
                                  pool.attend(qs.contiguous(), [0, 3], [20], [[0, 1]]).numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_serving_engines_tensors_take_one_compiled_call(dtype):
    """vLLM's calls: q, k, v views of one qkv tensor (their rows strided), int64 slots with
    padding, out= of the model's dtype with rows beyond the batch. The compiled path takes them
    (_write_tensors, _attend_tensors say so) and gives the general path's bits (numpy float32
    of the same values); anything else it leaves to the general path, the pool untouched."""
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    rng = np.random.default_rng(11)
    hkv, h, d, bs, n = 2, 6, 64, 16, 45         # sequences of 37 and 8 rows, 3 of padding
    qkv = torch.from_numpy(rng.standard_normal((n + 3, (h + 2 * hkv) * d)).astype(np.float32)
                           * 2).to(dt)
    q, k, v = (qkv[:, a * d:b * d].view(-1, b - a, d)
               for a, b in ((0, h), (h, h + hkv), (h + hkv, h + 2 * hkv)))
    table = np.array([[3, 0, 5], [1, 6, -1]], np.int32)
    starts, lens = np.array([0, 37, 45], np.int32), np.array([37, 8], np.int32)
    slots = torch.from_numpy(np.concatenate([slots_of(table[0], 37, bs),
                                             slots_of(table[1], 8, bs), [-1] * 3]))
    f32 = lambda x: x.float().numpy()
    fast, slow = (ia.PagedKVCache(hkv, d, bs, 8, open_blocks=4) for _ in range(2))
    assert _cache._write_tensors(fast, slots, k, v)
    slow.write(slots.numpy(), f32(k), f32(v))
    np.testing.assert_array_equal(fast.buffer, slow.buffer)
    for b in range(2):
        for x, y in zip(fast.dequantize(table[b], lens[b]), slow.dequantize(table[b], lens[b])):
            np.testing.assert_array_equal(x, y)
    options = dict(scale=0.125, window=20, softcap=30.0)
    want = slow.attend(f32(q[:n]), starts, lens, table, **options)
    out = torch.full((n + 3, h, d), float("nan"), dtype=dt)
    assert _cache._attend_tensors(fast, q[:n], starts, lens, table, *options.values(), out[:n])
    bits = lambda x: x.view(torch.int32 if x.dtype == torch.float32 else torch.int16)
    assert torch.equal(bits(out[:n]), bits(torch.from_numpy(want).to(dt)))
    assert out[n:].isnan().all()
    # the public method takes the same path (a second attend: the blocks whose last position
    # was read are now read from their codes, in both pools)
    want = slow.attend(f32(q[:n]), starts, lens, table, **options)
    again = torch.empty(n, h, d, dtype=dt)
    assert fast.attend(q[:n], starts, lens, table, out=again, **options) is again
    assert torch.equal(bits(again), bits(torch.from_numpy(want).to(dt)))

    before = fast.buffer.copy()
    assert not _cache._write_tensors(fast, slots.numpy(), k, v)             # not torch
    assert not _cache._write_tensors(fast, slots, k.detach().requires_grad_(), v)
    assert not _cache._write_tensors(fast, slots.to(torch.int32), k, v)
    assert not _cache._write_tensors(fast, slots[:-1], k, v)                # N differs
    assert not _cache._write_tensors(fast, slots, k, v.float() if dt != torch.float32 else v.half())
    assert not _cache._write_tensors(fast, slots, k.transpose(1, 2).contiguous().transpose(1, 2), v)
    over = slots.clone()
    over[5] = 8 * bs
    assert not _cache._write_tensors(fast, over, k, v)
    with pytest.raises(ValueError, match=r"slots\[5\] is 128, beyond the pool's"):
        fast.write(over, k, v)
    bad = k.clone()
    bad[40, 1, 3] = float("inf")
    assert not _cache._write_tensors(fast, slots, bad, v)
    with pytest.raises(ValueError, match=r"k holds NaN or Inf.*row 40, kv head 1"):
        fast.write(slots, bad, v)
    fast._enter()
    try:
        assert not _cache._write_tensors(fast, slots, k, v)              # busy
        assert not _cache._attend_tensors(fast, q[:n], starts, lens, table, None, None, None,
                                          out[:n])
    finally:
        fast._leave()
    np.testing.assert_array_equal(fast.buffer, before)
    out.fill_(float("nan"))
    for args in [(q[:n], starts, lens, table, 1, None, None, out[:n]),        # an int scale
                 (q[:n], starts, lens, table, None, 0, None, out[:n]),        # window 0
                 (q[:n], starts, lens, table, None, None, -1.0, out[:n]),
                 (q[:n], starts.astype(np.int64), lens, table, None, None, None, out[:n]),
                 (q[:n], starts, lens, table, None, None, None,            # out's rows strided
                  out[:n].transpose(0, 1).contiguous().transpose(0, 1)),
                 (q[:n].numpy() if dt == torch.float32 else q[:n].float().numpy(), starts, lens,
                  table, None, None, None, out[:n])]:
        assert not _cache._attend_tensors(fast, *args)
    assert out.isnan().all()
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] is 9, not a block"):
        _cache._attend_tensors(fast, q[:n], starts, lens,
                               np.array([[3, 0, 5], [9, 6, -1]], np.int32), None, None, None,
                               out[:n])
    badq = q[:n].clone()
    badq[40, 4, 0] = float("nan")
    assert not _cache._attend_tensors(fast, badq, starts, lens, table, None, None, None, out[:n])
    with pytest.raises(ValueError, match="q row 40"):
        fast.attend(badq, starts, lens, table, out=out[:n])
    assert out.isnan().all()


BAD = [
    (dict(q=np.zeros((1, 3, 32), np.float32)), ValueError, "not a multiple of n_kv_heads=2"),
    (dict(q=np.zeros((1, 2, 16), np.float32)), ValueError, r"q must have shape \[Nq, H, D\] with D=32"),
    (dict(query_start=[0, 1]), ValueError, "query_start must have B \\+ 1 = 3 entries"),
    (dict(query_start=[0, 3, 2]), ValueError, r"query_start must never decrease; query_start\[2\] = 2"),
    (dict(query_start=[0, 1, 3]), ValueError, "query_start must start at 0 and end at Nq=2"),
    (dict(query_start=[0.0, 1.0, 2.0]), TypeError, "query_start must hold integers"),
    (dict(seq_lens=[20, 0]), ValueError, r"seq_lens\[1\] is 0, fewer than the request's 1"),
    (dict(seq_lens=[20, 50]), ValueError, r"seq_lens\[1\] = 50 needs 4 blocks of 16, but "
                                          r"block_table has 3 columns"),
    (dict(block_table=[[0, 1, 2], [3, 9, 0]]), ValueError,
     r"block_table\[1, 1\] is 9, not a block of the pool \(0 .. 7\)"),
    (dict(block_table=[[0, 1, 2]]), ValueError, "block_table must have B=2 rows"),
    (dict(options=dict(window=0)), ValueError, "window must be positive"),
    (dict(options=dict(sinks=2)), ValueError, "sinks=2 needs a window"),
    (dict(options=dict(softcap=-1.0)), ValueError, "softcap"),
    (dict(options=dict(q_bits=4)), ValueError, "q_bits must be 16 or 8"),
    (dict(options=dict(out=np.zeros((2, 2, 16), np.float32))), ValueError, "out must have shape"),
]


@pytest.mark.parametrize("bad", BAD, ids=lambda b: b[2][:40])
def test_bad_attend_arguments_are_named(bad):
    change, kind, message = bad
    rng = np.random.default_rng(0)
    pool = ia.PagedKVCache(2, 32, 16, 8)
    k, v = rng.standard_normal((2, 40, 2, 32)).astype(np.float32)
    pool.write(np.arange(40) + 16, k, v)
    before = pool.buffer.copy()
    args = dict(q=rng.standard_normal((2, 2, 32)).astype(np.float32), query_start=[0, 1, 2],
                seq_lens=[20, 40], block_table=[[1, 2, 3], [1, 2, 3]])
    args.update({key: val for key, val in change.items() if key != "options"})
    with pytest.raises(kind, match=message):
        pool.attend(**args, **change.get("options", {}))
    np.testing.assert_array_equal(pool.buffer, before)


def test_bad_write_and_constructor_arguments_are_named():
    pool = ia.PagedKVCache(2, 32, 16, 4)
    rows = np.zeros((3, 2, 32), np.float32)
    with pytest.raises(ValueError, match=r"slots\[1\] is 64, beyond the pool's num_blocks \* "
                                         r"block_size = 64 slots"):
        pool.write([0, 64, 1], rows, rows)
    with pytest.raises(ValueError, match=r"k must have shape \[N, Hkv, D\] with N=2"):
        pool.write([0, 1], rows, rows)
    with pytest.raises(ValueError, match="block_size must be one of 16, 32, 64, 128, 256, got 48"):
        ia.PagedKVCache(2, 32, 48, 4)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16"):
        ia.PagedKVCache(2, 40, 16, 4)
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        ia.PagedKVCache(2, 32, 16, 0)
    with pytest.raises(TypeError, match="PagedKVCache()"):
        ia.PagedKVCache(2, 32, 16)
    with pytest.raises(ValueError, match=r"blocks\[1\] is 4, not a block"):
        pool.dequantize([0, 4], 20)


def test_a_pool_serves_one_call_at_a_time():
    pool = ia.PagedKVCache(1, 16, 16, 2)
    pool._enter()
    try:
        with pytest.raises(RuntimeError, match="in use by another thread"):
            pool.write([0], np.zeros((1, 1, 16)), np.zeros((1, 1, 16)))
    finally:
        pool._leave()


def test_requests_without_queries_are_skipped():
    rng = np.random.default_rng(4)
    batch = Batch(rng, 1, 32, 16, (50, 60, 70), (0, 2, 0), 2)
    out = batch.attend()
    ref, _ = batch.contiguous(1)
    np.testing.assert_array_equal(out, ref)
    empty = batch.pool.attend(np.zeros((0, 2, 32), np.float32), [0, 0], [10], [[0]])
    assert empty.shape == (0, 2, 32)


@pytest.mark.skipif(EMULATED, reason="the long prefill is left to the native lanes")
def test_a_long_prefill_chunk_over_a_long_history(tier):
    rng = np.random.default_rng(6)
    batch = Batch(rng, 2, 64, 128, (3000,), (1024,), 4)
    out = batch.attend(window=1500)
    ref, _ = batch.contiguous(0, window=1500)
    np.testing.assert_array_equal(out, ref)
