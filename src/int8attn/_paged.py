"""PagedKVCache: one layer's K/V rows of many sequences in a pool of fixed-size blocks, as a
serving engine lays out its KV memory (vLLM's block tables and slot mappings), attended by the
contiguous cache's kernels with the same contract. Python over the compiled pool (``_cache._Paged``):
every method takes the pool's busy flag before it reads an argument, converts and checks them
(``_args``), makes one engine call and drops the flag."""

import numpy as np

from . import _args
from . import _cache


def _sixteen(x):
    """A CPU torch bfloat16 / float16 tensor or a numpy float16 array as (the numpy array over
    its memory, its _cache._ROWS type), else None; bfloat16 as its 16-bit patterns (numpy has
    no bfloat16)."""
    if isinstance(x, np.ndarray):
        return (x, _cache._ROWS["float16"]) if x.dtype == np.float16 else None
    if _args.is_torch(x) and x.device.type == "cpu":
        if str(x.dtype) == "torch.bfloat16":
            import torch
            return x.detach().view(torch.int16).numpy().view(np.uint16), _cache._ROWS["bfloat16"]
        if str(x.dtype) == "torch.float16":
            return x.detach().numpy(), _cache._ROWS["float16"]
    return None


def _rows(x, name):
    """x as the engine reads it: (an aligned C-contiguous numpy array, its element type, _cache's
    _ROWS): float32 and 16-bit floats (_sixteen) as they are (no conversion: the engine widens
    each row as it reads it), anything else as float32."""
    got = _sixteen(x)
    if got is not None:
        return _args.c_aligned(got[0]), got[1]
    return _args.c_aligned(_args.as_float32(x, name)), _cache._ROWS["float32"]


def _values(row, kind):
    """A row of _rows's array as float32 values (an error message's)."""
    if kind == _cache._ROWS["bfloat16"]:
        return (row.astype(np.uint32) << 16).view(np.float32)
    return row.astype(np.float32)


def _write_args(slots, k, v, hkv, d, num_slots):
    """write()'s arguments: slots int64 [N]; k, v [N, Hkv, D] of one element type (_rows)."""
    sa = _args._int_array(slots, "slots", 1)
    (ka, kind), (va, vkind) = _rows(k, "k"), _rows(v, "v")
    n = sa.shape[0]
    if ka.shape != (n, hkv, d):
        raise ValueError(f"k must have shape [N, Hkv, D] with N={n} (the slots), Hkv={hkv}, "
                         f"D={d}; got {list(ka.shape)}")
    if va.shape != ka.shape:
        raise ValueError(f"v must have the shape of k, {list(ka.shape)}; got {list(va.shape)}")
    if vkind != kind:
        raise TypeError(f"k and v must have one dtype, got {k.dtype} and {v.dtype}")
    over = np.flatnonzero(sa >= num_slots)
    if over.size:
        i = int(over[0])
        raise ValueError(f"slots[{i}] is {int(sa[i])}, beyond the pool's "
                         f"num_blocks * block_size = {num_slots} slots; nothing was written")
    return sa, ka, va, kind


def _attend_args(q, query_start, seq_lens, block_table, hkv, d):
    """attend()'s arrays (their values are checked by the compiled pool, under its lock): q
    [Nq, H, D] as _rows makes it and its element type; query_start [.], seq_lens [.] and
    block_table [., .] int32 C-contiguous (a serving engine's own arrays need no copy)."""
    qa, kind = _rows(q, "q")
    if qa.ndim != 3 or qa.shape[2] != d or qa.shape[1] == 0:
        raise ValueError(f"q must have shape [Nq, H, D] with D={d}, H >= 1; got "
                         f"{list(qa.shape)}")
    if qa.shape[1] % hkv:
        raise ValueError(f"q has H={qa.shape[1]} query heads, not a multiple of "
                         f"n_kv_heads={hkv}")
    table = _args._int_array(block_table, "block_table", 2, np.int32)
    return (qa, kind, _args._int_array(query_start, "query_start", 1, np.int32),
            _args._int_array(seq_lens, "seq_lens", 1, np.int32), table)


def _out_args(out, shape, q):
    """(the float32 array the engine writes, the 16-bit target and its type or None, what the
    call returns) for out= of this shape: float32 out= as _args.out_for takes it; a 16-bit one
    (_sixteen: torch, or numpy float16) C-contiguous of the shape, written by narrowing."""
    narrow = None if out is None else _sixteen(out)
    if narrow is None:
        engine_out, result = _args.out_for(out, shape, q)
        return engine_out, None, result
    a = narrow[0]
    if _args.is_torch(out):
        if a.shape != tuple(shape) or not (a.flags.c_contiguous and a.flags.aligned) \
                or out.requires_grad:
            raise ValueError(f"out must be a C-contiguous tensor of shape {list(shape)} that "
                             f"does not require grad, got shape {list(out.shape)}")
    elif a.shape != tuple(shape) or not (a.flags.c_contiguous and a.flags.aligned
                                         and a.flags.writeable):
        raise ValueError(f"out must be a writable aligned C-contiguous array of shape "
                         f"{list(shape)}, got shape {list(a.shape)}")
    return _cache._scratch_rows(shape), narrow, out


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
        n_kv_heads, head_dim]`` of one dtype (numpy or torch): float32, float16 and torch's
        bfloat16 are read as they are, each row widened exactly as it is coded (no conversion
        pass); other dtypes are converted to float32 first. A row that is not skipped and holds
        NaN, Inf or a value beyond +-2**64 raises ValueError naming it, and nothing is
        written.
        """
        if _cache._write_tensors(self, slots, k, v):     # a serving engine's tensors: one call
            return
        self._enter()
        try:
            sa, ka, va, kind = _write_args(slots, k, v, self.n_kv_heads, self.head_dim,
                                           self.num_blocks * self.block_size)
            rc, bad = self._write(sa, ka, va, kind)
            if rc:
                i, head = divmod(bad, self.n_kv_heads)
                row = _values((ka if rc == 1 else va)[i, head], kind)
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
        q: float32, float16 or torch bfloat16 as they are (widened row by row), other dtypes
        converted to float32. Returns float32 ``[Nq, H, D]`` (a torch tensor when q is one), or
        writes ``out``: float32, or float16 / torch bfloat16 (C-contiguous), the float32 result
        rounded to nearest, ties to even, as torch converts.

        Each output has the bits a contiguous ``KVCache(..., **FORMATS["rotated"])`` holding
        the same rows gives (every tier, every thread count), within 1e-3 of float attention
        over ``dequantize``. With open blocks each query reads its own block's rows (and, past
        the first block, position 0) as halves, within 1e-3 of float attention over them and
        the other rows' codes, with the same bits however a sequence's tokens were split into
        calls (given entries enough).
        """
        if (out is not None and not sinks and q_bits == 16
                and _cache._attend_tensors(self, q, query_start, seq_lens, block_table, scale,
                                           window, softcap, out)):
            return out                          # a serving engine's call: one compiled call
        self._enter()
        try:
            qa, kind, starts, lens, table = _attend_args(q, query_start, seq_lens, block_table,
                                                         self.n_kv_heads, self.head_dim)
            scale, q_bits, window, sinks, cap = _args.decode_options(scale, q_bits, window,
                                                                     sinks, softcap,
                                                                     self.head_dim)
            rows, narrow, result = _out_args(out, qa.shape, q)
            rc, bad = self._attend(qa, kind, rows, starts, lens, table, scale, q_bits, window,
                                   sinks, cap)
            if rc == 3:
                raise MemoryError("attend could not allocate its workspace")
            if rc:
                row, head = divmod(bad, qa.shape[1])
                err = _args.decode_error(rc, head, _values(qa[row], kind), scale)
                raise type(err)(f"q row {row}: {err}")
            if narrow is not None:
                _cache._narrow(rows, *narrow)
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
