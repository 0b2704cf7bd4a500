"""PagedKVCache(..., open_blocks=N): the rows of blocks not yet full are also kept as halves (as
the recent window keeps a row), and a query reads the rows of its own block from them, the
earlier blocks from their codes. Against numpy (codes dequantized, R.half_rows of the rows as
given) within the contract; the same bits however a sequence's tokens are split into calls,
on every tier and thread count; entries freed once their block is full, the least recently
used taken back when none is free; bad input refused by name with nothing changed."""

import numpy as np
import pytest

import int8attn as ia
from int8attn import _cache
from int8attn import reference as R

from conftest import CONTRACT, assert_tiers_and_threads_agree, rel_err


class Seqs:
    """Sequences of the given lengths in shuffled blocks of one pool with open blocks, their
    rows and queries drawn once; `steps` writes and attends them in calls."""

    def __init__(self, rng, hkv, d, bs, lens, h, open_blocks, spare=3):
        self.hkv, self.d, self.bs, self.h, self.lens = hkv, d, bs, h, list(lens)
        need = [-(-n // bs) for n in lens]
        self.num_blocks = sum(need) + spare
        free = list(rng.permutation(self.num_blocks))
        self.table = np.full((len(lens), max(need) + 1), -1, np.int32)
        for b, nb in enumerate(need):
            self.table[b, :nb] = [free.pop() for _ in range(nb)]
        self.k = [(rng.standard_normal((n, hkv, d)) + 0.5).astype(np.float32) for n in lens]
        self.v = [rng.standard_normal((n, hkv, d)).astype(np.float32) for n in lens]
        self.q = [(rng.standard_normal((n, h, d)) * 2).astype(np.float32) for n in lens]
        self.open_blocks = open_blocks

    def pool(self):
        return ia.PagedKVCache(self.hkv, self.d, self.bs, self.num_blocks,
                               open_blocks=self.open_blocks)

    def slots(self, b, a, z):
        pos = np.arange(a, z)
        return self.table[b][pos // self.bs].astype(np.int64) * self.bs + pos % self.bs

    def steps(self, pool, cuts, **options):
        """cuts[b]: sequence b's call boundaries (0 < c1 < ... < len); call i writes and attends
        every sequence's i-th piece in one batch (a sequence whose pieces ran out sits it
        out). Returns each sequence's outputs [len, H, D]."""
        outs = [np.empty_like(q) for q in self.q]
        bounds = [[0, *c] for c in cuts]
        for i in range(max(len(c) for c in cuts)):
            part = [b for b in range(len(self.lens)) if i + 1 < len(bounds[b])]
            for b in part:
                a, z = bounds[b][i], bounds[b][i + 1]
                pool.write(self.slots(b, a, z), self.k[b][a:z], self.v[b][a:z])
            t = [bounds[b][i + 1] - bounds[b][i] for b in part]
            starts = np.concatenate([[0], np.cumsum(t)]).astype(np.int32)
            q = np.concatenate([self.q[b][bounds[b][i]:bounds[b][i + 1]] for b in part])
            out = pool.attend(q, starts, [bounds[b][i + 1] for b in part], self.table[part],
                              **options)
            for j, b in enumerate(part):
                outs[b][bounds[b][i]:bounds[b][i + 1]] = out[starts[j]:starts[j + 1]]
        return outs

    def reference(self, b, pos, **options):
        """float64 attention of query pos of sequence b: its block's rows from pos's block start
        as halves, and position 0 (kept apart once the first block is full), the rest
        dequantized codes (a pool without open blocks dequantizes them)."""
        plain = ia.PagedKVCache(self.hkv, self.d, self.bs, self.num_blocks)
        plain.write(self.slots(b, 0, pos + 1), self.k[b][:pos + 1], self.v[b][:pos + 1])
        k, v = plain.dequantize(self.table[b], pos + 1)
        for start in {0, pos // self.bs * self.bs}:
            end = pos + 1 if start == pos // self.bs * self.bs else 1
            k[start:end] = R.half_rows(self.k[b][start:end])
            v[start:end] = R.half_rows(self.v[b][start:end])
        return R.attention(self.q[b][pos:pos + 1], k, v, **options)[0]


def token_cuts(n):
    return list(range(1, n + 1))


@pytest.mark.parametrize("bs", [16, 128])
def test_each_query_reads_its_own_blocks_rows_as_halves(tier, bs):
    rng = np.random.default_rng(bs)
    seqs = Seqs(rng, 2, 64, bs, (2 * bs + 7, bs + 1), 8, open_blocks=8)
    options = dict(window=bs + 20, sinks=3, softcap=25.0)
    outs = seqs.steps(seqs.pool(), [[5, bs, 2 * bs + 2, 2 * bs + 7], [bs - 1, bs, bs + 1]],
                      **options)
    for b, n in enumerate(seqs.lens):
        for pos in sorted({0, 4, bs - 1, bs, n - 1} & set(range(n))):
            ref = seqs.reference(b, pos, **options)
            assert rel_err(outs[b][pos], ref) < CONTRACT, (b, pos)


def test_the_halves_matter():
    # the same rows read from codes alone differ by far more than the contract
    rng = np.random.default_rng(1)
    seqs = Seqs(rng, 1, 32, 16, (40,), 2, open_blocks=2)
    with_halves = seqs.steps(seqs.pool(), [[40]])[0]
    seqs.open_blocks = 0
    codes = seqs.steps(seqs.pool(), [[40]])[0]
    assert rel_err(codes[-1], with_halves[-1]) > 10 * rel_err(
        with_halves[-1], seqs.reference(0, 39))


def test_the_same_bits_however_the_tokens_are_split(tier):
    rng = np.random.default_rng(7)
    seqs = Seqs(rng, 2, 96, 32, (150, 97, 33), 6, open_blocks=12)
    options = dict(window=70, softcap=20.0)
    one_by_one = seqs.steps(seqs.pool(), [token_cuts(n) for n in seqs.lens], **options)
    chunked = seqs.steps(seqs.pool(), [[3, 40, 100, 150], [97], [31, 32, 33]], **options)
    for b in range(3):
        np.testing.assert_array_equal(chunked[b].view(np.int32), one_by_one[b].view(np.int32),
                                      err_msg=f"sequence {b}")


def test_tiers_and_thread_counts_agree():
    rng = np.random.default_rng(3)
    seqs = Seqs(rng, 4, 64, 16, (90, 41), 16, open_blocks=8)

    def run():
        outs = seqs.steps(seqs.pool(), [[20, 50, 51, 52, 90], [41]], window=30, sinks=2)
        return np.concatenate(outs)

    assert_tiers_and_threads_agree(run, "open blocks")


def under_flag(hook):
    """A pool's test hook, called with its busy flag held."""
    def call(pool):
        pool._enter()
        try:
            return hook(pool)
        finally:
            pool._leave()
    return call


entries = under_flag(_cache._open_entries)
first_held = under_flag(_cache._first_held)


def test_a_full_block_frees_its_entry():
    rng = np.random.default_rng(2)
    seqs = Seqs(rng, 1, 32, 16, (40,), 2, open_blocks=3)
    pool = seqs.pool()
    seqs.steps(pool, [[10]])
    b0, b1, b2 = (int(x) for x in seqs.table[0, :3])
    assert entries(pool) == {b0: (0, 10)}
    pool.write(seqs.slots(0, 10, 33), seqs.k[0][10:33], seqs.v[0][10:33])
    assert entries(pool) == {b0: (0, 16), b1: (0, 16), b2: (0, 1)}     # written, not attended
    pool.attend(seqs.q[0][10:33], [0, 23], [33], seqs.table[:1])
    assert entries(pool) == {b2: (0, 1)}
    # the next query of the last block reads its two rows as halves, the full blocks as codes
    pool.write(seqs.slots(0, 33, 34), seqs.k[0][33:34], seqs.v[0][33:34])
    got = pool.attend(seqs.q[0][33:34], [0, 1], [34], seqs.table[:1])[0]
    assert rel_err(got, seqs.reference(0, 33)) < CONTRACT
    k, v = pool.dequantize(seqs.table[0], 34)
    np.testing.assert_array_equal(k[32:], R.half_rows(seqs.k[0][32:34]))


def test_the_least_recently_used_entry_is_taken_and_its_block_read_from_codes():
    rng = np.random.default_rng(4)
    seqs = Seqs(rng, 1, 32, 16, (12, 12), 2, open_blocks=1)
    pool = seqs.pool()
    seqs.steps(pool, [[5], [5]])        # the second sequence takes the only entry
    a, b = int(seqs.table[0, 0]), int(seqs.table[1, 0])
    assert entries(pool) == {b: (0, 5)}
    # sequence 0 writes again: its block opens from offset 5, positions 0 .. 4 are codes now
    pool.write(seqs.slots(0, 5, 8), seqs.k[0][5:8], seqs.v[0][5:8])
    assert entries(pool) == {a: (5, 8)}
    got = pool.attend(seqs.q[0][5:8], [0, 3], [8], seqs.table[:1])
    plain = ia.PagedKVCache(1, 32, 16, seqs.num_blocks)
    plain.write(seqs.slots(0, 0, 8), seqs.k[0][:8], seqs.v[0][:8])
    k, v = plain.dequantize(seqs.table[0], 8)
    k[5:], v[5:] = R.half_rows(seqs.k[0][5:8]), R.half_rows(seqs.v[0][5:8])
    for i, pos in enumerate(range(5, 8)):
        ref = R.attention(seqs.q[0][pos:pos + 1], k[:pos + 1], v[:pos + 1])[0]
        assert rel_err(got[i], ref) < CONTRACT
    # sequence 1's block lost its entry: its next write starts a new run there
    pool.write(seqs.slots(1, 5, 6), seqs.k[1][5:6], seqs.v[1][5:6])
    assert entries(pool) == {b: (5, 6)}


def test_a_write_at_offset_0_starts_the_block_again():
    rng = np.random.default_rng(5)
    seqs = Seqs(rng, 1, 16, 16, (9,), 1, open_blocks=2)
    pool = seqs.pool()
    seqs.steps(pool, [[9]])
    block = int(seqs.table[0, 0])
    assert entries(pool) == {block: (0, 9)}
    pool.write(seqs.slots(0, 0, 2), seqs.k[0][:2] * 3, seqs.v[0][:2])     # a new owner
    assert entries(pool) == {block: (0, 2)}


def test_a_refused_call_changes_no_entry():
    rng = np.random.default_rng(6)
    seqs = Seqs(rng, 2, 32, 16, (20,), 2, open_blocks=2)
    pool = seqs.pool()
    seqs.steps(pool, [[15]])
    before = entries(pool)
    k = seqs.k[0][15:17].copy()
    k[1, 0, 3] = np.inf
    with pytest.raises(ValueError, match="nothing was written"):
        pool.write(seqs.slots(0, 15, 17), k, seqs.v[0][15:17])
    assert entries(pool) == before
    pool.write(seqs.slots(0, 15, 16), seqs.k[0][15:16], seqs.v[0][15:16])
    after_write = entries(pool)
    q = seqs.q[0][15:16].copy()
    q[0, 1, 0] = np.nan
    with pytest.raises(ValueError, match="q row 0"):
        pool.attend(q, [0, 1], [16], seqs.table[:1])
    assert entries(pool) == after_write          # the block stays open: its last query failed


def test_open_blocks_is_checked_and_reported():
    pool = ia.PagedKVCache(2, 64, 32, 5, open_blocks=3)
    assert pool.open_blocks == 3
    assert pool.open_nbytes == 3 * 2 * 32 * (4 * 64 + 8) + 5 * (8 * 2 * 64 + 1)
    assert ia.PagedKVCache(2, 64, 32, 5).open_blocks == 0
    with pytest.raises(ValueError, match="open_blocks must be at least 0, got -1"):
        ia.PagedKVCache(2, 64, 32, 5, open_blocks=-1)
    with pytest.raises(TypeError, match="open_blocks must be an int"):
        ia.PagedKVCache(2, 64, 32, 5, open_blocks=1.5)


def test_a_sequences_position_0_is_kept_apart_once_its_first_block_is_full():
    rng = np.random.default_rng(8)
    seqs = Seqs(rng, 2, 32, 16, (40, 40), 4, open_blocks=4)
    pool = seqs.pool()
    first = int(seqs.table[0, 0])
    seqs.steps(pool, [[15], []])
    assert first_held(pool) == set()                     # the block is not full yet
    pool.write(seqs.slots(0, 15, 20), seqs.k[0][15:20], seqs.v[0][15:20])
    got = pool.attend(seqs.q[0][15:20], [0, 5], [20], seqs.table[:1])
    assert first_held(pool) == {first}
    for i, pos in enumerate(range(15, 20)):           # 16 .. 19 read position 0 apart
        assert rel_err(got[i], seqs.reference(0, pos)) < CONTRACT
    k, _ = pool.dequantize(seqs.table[0], 20)
    np.testing.assert_array_equal(k[0], R.half_rows(seqs.k[0][:1])[0])
    # a second sequence whose table names the same first block (a shared prefix) reads it too
    table = seqs.table.copy()
    table[1, 0] = first
    own = table[1, 1] * 16 + np.arange(2, dtype=np.int64)             # positions 16, 17
    pool.write(own, seqs.k[1][16:18], seqs.v[1][16:18])
    k1, _ = pool.dequantize(table[1], 18)
    np.testing.assert_array_equal(k1[0], k[0])
    # the block written again from offset 0 (a new owner) forgets it
    pool.write(seqs.slots(0, 0, 1), seqs.k[1][:1], seqs.v[1][:1])
    assert first_held(pool) == set()


def test_a_first_block_that_lost_its_entry_keeps_no_position_0():
    rng = np.random.default_rng(9)
    seqs = Seqs(rng, 1, 32, 16, (20, 20), 2, open_blocks=1)
    pool = seqs.pool()
    seqs.steps(pool, [[4], [4]])          # sequence 1 takes sequence 0's only entry
    pool.write(seqs.slots(0, 4, 20), seqs.k[0][4:20], seqs.v[0][4:20])
    pool.attend(seqs.q[0][4:20], [0, 16], [20], seqs.table[:1])
    assert first_held(pool) == set()      # its block was held from offset 4 only
    plain = ia.PagedKVCache(1, 32, 16, seqs.num_blocks)
    plain.write(seqs.slots(0, 0, 20), seqs.k[0], seqs.v[0])
    k, _ = pool.dequantize(seqs.table[0], 20)
    np.testing.assert_array_equal(k[:16], plain.dequantize(seqs.table[0], 20)[0][:16])
