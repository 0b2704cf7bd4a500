"""Numpy pools with ``int8attn.PagedKVCache``'s API, which the vLLM tests put in its place in an
engine. ``PagedKVCache`` here quantizes rows per token and kv head to int8 with absmax / 127
scales (not rotated); ``ExactPool`` attends over exact float rows. Slow and simple: tests only.

A block's bytes: K codes int8 [bs, Hkv, D], V codes int8 [bs, Hkv, D], K scales float32
[bs, Hkv], V scales float32 [bs, Hkv].
"""
import numpy as np


class PagedKVCache:
    def __init__(self, n_kv_heads, head_dim, block_size, num_blocks, *, buffer=None,
                 rotation_seed=0):
        if block_size not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_size: expected a power of two 16..256, got {block_size}")
        if head_dim % 16 or not 16 <= head_dim <= 1024:
            raise ValueError(f"head_dim: expected a multiple of 16 in 16..1024, got {head_dim}")
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.block_size, self.num_blocks = block_size, num_blocks
        self.block_bytes = self.bytes_per_block(n_kv_heads, head_dim, block_size)
        size = num_blocks * self.block_bytes
        if buffer is None:
            buffer = np.zeros(size, np.uint8)
        if (not isinstance(buffer, np.ndarray) or buffer.dtype != np.uint8
                or buffer.size != size or not buffer.flags.c_contiguous
                or not buffer.flags.writeable):
            raise ValueError(f"buffer: expected a writable C-contiguous uint8 array of {size} "
                             f"bytes, got {getattr(buffer, 'dtype', type(buffer))} of "
                             f"{getattr(buffer, 'size', '?')}")
        if buffer.ctypes.data % 64:
            raise ValueError("buffer: address is not a multiple of 64")
        self.buffer = buffer.reshape(num_blocks, self.block_bytes)
        n = block_size * n_kv_heads * head_dim
        codes = self.buffer[:, :2 * n].view(np.int8).reshape(num_blocks, 2, block_size,
                                                             n_kv_heads, head_dim)
        scales = self.buffer[:, 2 * n:].view(np.float32).reshape(num_blocks, 2, block_size,
                                                                 n_kv_heads)
        self._codes, self._scales = codes, scales

    @staticmethod
    def bytes_per_block(n_kv_heads, head_dim, block_size):
        return n_kv_heads * block_size * (2 * head_dim + 8)

    def write(self, slots, k, v):
        slots = np.asarray(slots, np.int64)
        k = np.asarray(k, np.float32)
        v = np.asarray(v, np.float32)
        for name, x in (("k", k), ("v", v)):
            if not np.isfinite(x).all() or np.abs(x).max(initial=0) > 2.0 ** 64:
                raise ValueError(f"{name}: a row holds NaN, Inf or a value beyond 2^64")
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
        if slots.size and slots.max() >= self.num_blocks * self.block_size:
            raise ValueError(f"slots: {slots.max()} is past the pool")
        block, off = np.divmod(slots, self.block_size)
        for side, x in enumerate((k, v)):
            amax = np.abs(x).max(-1)
            scale = np.where(amax > 0, amax / 127, 1).astype(np.float32)
            self._codes[block, side, off] = np.rint(x / scale[..., None]).astype(np.int8)
            self._scales[block, side, off] = scale

    def dequantize(self, blocks, length):
        blocks = np.asarray(blocks)
        pos = np.arange(length)
        block, off = blocks[pos // self.block_size], pos % self.block_size
        k, v = (self._codes[block, s, off] * self._scales[block, s, off][..., None]
                for s in (0, 1))
        return k.astype(np.float32), v.astype(np.float32)

    def attend(self, q, query_start, seq_lens, block_table, *, scale=None, window=None,
               sinks=0, softcap=None, q_bits=16, out=None):
        q = np.asarray(q, np.float32)
        nq, h, d = q.shape
        group = h // self.n_kv_heads
        scale = d ** -0.5 if scale is None else scale
        if out is None:
            out = np.empty_like(q)
        for b in range(len(seq_lens)):
            lo, hi, n = int(query_start[b]), int(query_start[b + 1]), int(seq_lens[b])
            if hi == lo:
                continue
            k, v = self.dequantize(block_table[b], n)
            k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)         # [n, H, D]
            qpos = n - (hi - lo) + np.arange(hi - lo)
            logits = np.einsum("thd,nhd->htn", q[lo:hi], k) * scale
            if softcap:
                logits = softcap * np.tanh(logits / softcap)
            kpos = np.arange(n)
            seen = kpos[None, :] <= qpos[:, None]
            if window is not None:
                seen &= (kpos[None, :] > qpos[:, None] - window) | (kpos[None, :] < sinks)
            logits = np.where(seen[None], logits, -np.inf)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            out[lo:hi] = np.einsum("htn,nhd->thd", w, v)
        return out


class ExactPool(PagedKVCache):
    """The numpy pool that also keeps every row in float32 and attends over those: no
    quantization error, so an engine on it must give vLLM's fp32 results up to float rounding
    (what the tests check of the backend's plumbing: slots, block tables, window, soft cap,
    scale, GQA)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rows = (self.num_blocks * self.block_size, self.n_kv_heads, self.head_dim)
        self._exact = np.zeros((2,) + rows, np.float32)

    def write(self, slots, k, v):
        super().write(slots, k, v)
        slots = np.asarray(slots)
        keep = slots >= 0
        self._exact[0, slots[keep]] = np.asarray(k)[keep]
        self._exact[1, slots[keep]] = np.asarray(v)[keep]

    def dequantize(self, blocks, length):
        pos = np.arange(length)
        slots = np.asarray(blocks)[pos // self.block_size] * self.block_size + pos % self.block_size
        return self._exact[0, slots], self._exact[1, slots]
