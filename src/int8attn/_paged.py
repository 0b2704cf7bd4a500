"""PagedKVCache: one layer's K/V rows of many sequences in a pool of fixed-size blocks, as a
serving engine lays out its KV memory (vLLM's block tables and slot mappings), attended by the
contiguous cache's kernels with the same contract. Python over the compiled pool (``_cache._Paged``):
every method takes the pool's busy flag before it reads an argument, converts and checks them
(``_args``), makes one engine call and drops the flag."""

import numpy as np

from . import _args
from . import _cache


class PagedKVCache(_cache._Paged):
    """A pool of ``num_blocks`` blocks of ``block_size`` positions for one attention layer.

    ``PagedKVCache(n_kv_heads, head_dim, block_size, num_blocks, *, buffer=None,
    rotation_seed=0, open_blocks=0)``. The format is ``FORMATS["rotated"]``: K and V rotated by
    the random-sign Hadamard transform of ``rotation_seed``, int8 codes and a float32 scale per
    token and kv head (``2 * head_dim + 8`` bytes; no offsets). ``block_size`` is 16, 32, 64, 128
    or 256; ``head_dim`` a multiple of 16 up to 1024. ``buffer``: None (the pool allocates zeros)
    or the memory to use, a C-contiguous uint8/int8 numpy array or CPU torch tensor of exactly
    ``num_blocks * block_bytes`` bytes at a 64-byte boundary (a serving engine's KV tensor; the
    pool keeps a reference). A position is written once (``write``) and read by every sequence
    whose block table names its block: a full block never changes, so sequences share the
    blocks of a common prefix. One call at a time (another thread gets RuntimeError); the GIL is
    released while the engine runs.

    ``open_blocks=N`` (N >= 1) keeps the rows of up to N blocks that are not yet full also as
    fp16 (halves with a power-of-two scale per row, as the contiguous cache's recent window
    keeps them), beside the blocks (``open_nbytes``), and each query reads its own block's rows,
    from the block's start up to itself, from those halves: the newest tokens of a sequence, the
    ones attention leans on, unquantized. A sequence's position 0 (often an attention sink) is
    kept apart too, as floats, once its first block is full, and read as a contiguous cache
    with ``keep_first`` reads it (Gemma 3 270M through vLLM: KL 5.6e-5 against the fp32 cache,
    6.4e-4 from codes alone). A block's first write opens its entry (a write at offset 0
    starts it again: a new owner, which also drops a position 0 kept from it), and the entry
    is freed once an attend has read the block's last position. When all N are taken, a write that opens a block takes the entry used least
    recently, whose block is then read from its codes up to its next write: size N for the
    sequences that hold an open block at once plus the blocks one call's writes open
    (``int8attn.vllm`` takes ``2 * max_num_seqs + max_num_batched_tokens / block_size``). A
    serving engine shares only full blocks, so the halves a query reads are its own sequence's.
    """

    @staticmethod
    def bytes_per_block(n_kv_heads, head_dim, block_size):
        """Bytes a block takes: ``n_kv_heads * block_size * (2 * head_dim + 8)``."""
        o = _args.paged_constructor((n_kv_heads, head_dim, block_size, 1), {})
        return _cache._paged_block_bytes(o.n_kv_heads, o.head_dim, o.block_size)

    def write(self, slots, k, v):
        """Quantize N rows into their slots.

        slots: int ``[N]``, slot = ``block * block_size + offset`` (negative: skipped, as a
        serving engine's padding), each below ``num_blocks * block_size``. k, v: float ``[N,
        n_kv_heads, head_dim]`` (numpy or torch; converted to float32). A row that is not skipped
        and holds NaN, Inf or a value beyond +-2**64 raises ValueError naming it, and nothing is
        written.
        """
        self._enter()
        try:
            sa, ka, va = _args.paged_write(slots, k, v, self.n_kv_heads, self.head_dim,
                                           self.num_blocks * self.block_size)
            rc, bad = self._write(sa, ka, va)
            if rc:
                i, head = divmod(bad, self.n_kv_heads)
                row = (ka if rc == 1 else va)[i, head]
                raise ValueError(_args.bad_row_message("kv"[rc - 1], row,
                                                       f"row {i}, kv head {head}")
                                 + "; nothing was written")
        finally:
            self._leave()

    def attend(self, q, query_start, seq_lens, block_table, *, scale=None, window=None, sinks=0,
               softcap=None, q_bits=16, out=None):
        """Attend a batch of B sequences in one call (decodes and prefill chunks alike).

        q: float ``[Nq, H, D]``, H a multiple of n_kv_heads (GQA/MQA). query_start: int ``[B +
        1]``, 0 first, never decreasing, Nq last: sequence b's queries are rows
        ``query_start[b]:query_start[b + 1]`` (T_b of them; 0: skipped). seq_lens: int ``[B]``,
        the positions each holds (its new rows already written), at least T_b. block_table: int
        ``[B, max_blocks]``, row b naming sequence b's blocks in position order (the first
        ``ceil(seq_lens[b] / block_size)`` are read). Query i of sequence b sits at position
        ``seq_lens[b] - T_b + i`` and sees the positions up to itself; ``window=W`` keeps the
        last W of them (its own included) plus the first ``sinks``; ``softcap`` caps the logits
        (``softcap * tanh(logit / softcap)``); ``scale`` defaults to ``head_dim ** -0.5``.
        Returns float32 ``[Nq, H, D]`` (into ``out`` when given; a torch tensor when q is one).

        Each output has the bits a contiguous ``KVCache(..., **FORMATS["rotated"])`` holding
        the same rows gives (every tier, every thread count), within 1e-3 of float attention
        over ``dequantize``. With open blocks each query reads its own block's rows (and, past
        the first block, position 0) as halves, within 1e-3 of float attention over them and
        the other rows' codes, with the same bits however a sequence's tokens were split into
        calls (given entries enough).
        """
        self._enter()
        try:
            qa, starts, lens, table = _args.paged_attend(q, query_start, seq_lens, block_table,
                                                         self.n_kv_heads, self.head_dim)
            scale, q_bits, window, sinks, cap = _args.decode_options(scale, q_bits, window,
                                                                     sinks, softcap,
                                                                     self.head_dim)
            out, result = _args.out_for(out, qa.shape, q)
            rc, bad = self._attend(qa, out, starts, lens, table, scale, q_bits, window, sinks,
                                   cap)
            if rc == 3:
                raise MemoryError("attend could not allocate its workspace")
            if rc:
                row, head = divmod(bad, qa.shape[1])
                err = _args.decode_error(rc, head, qa[row], scale)
                raise type(err)(f"q row {row}: {err}")
            return result
        finally:
            self._leave()

    def dequantize(self, blocks, length):
        """k, v float32 ``[length, n_kv_heads, head_dim]``: what attend reads for a query at the
        last position of the sequence whose blocks (int ``[>= ceil(length / block_size)]``) hold
        ``length`` positions (with open blocks, its own block's held rows and position 0 as
        their halves)."""
        self._enter()
        try:
            length = _args.int_from(length, "length", 0)
            ba = _args._int_array(blocks, "blocks", 1)
            need = -(-length // self.block_size)
            if ba.shape[0] < need:
                raise ValueError(f"length={length} needs {need} blocks of {self.block_size}, "
                                 f"got {ba.shape[0]}")
            wrong = np.flatnonzero((ba[:need] < 0) | (ba[:need] >= self.num_blocks))
            if wrong.size:
                j = int(wrong[0])
                raise ValueError(f"blocks[{j}] is {int(ba[j])}, not a block of the pool "
                                 f"(0 .. {self.num_blocks - 1})")
            return self._dequantize(np.ascontiguousarray(ba, np.int32), length)
        finally:
            self._leave()
