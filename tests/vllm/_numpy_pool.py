"""Numpy pools with ``int8attn.PagedKVCache``'s API, which the vLLM tests put in its place in an
engine. ``PagedKVCache`` here quantizes rows per token and kv head to int8 with absmax / 127
scales (not rotated); ``ExactPool`` attends over exact float rows. Slow and simple: tests only.

A block's bytes: K codes int8 [bs, Hkv, D], V codes int8 [bs, Hkv, D], K scales float32
[bs, Hkv], V scales float32 [bs, Hkv].
"""
import numpy as np


def as_f32(x):
    """x (numpy, or a CPU torch tensor of any float dtype, as int8attn's pool takes them) as a
    float32 numpy array."""
    if hasattr(x, "detach"):
        return x.detach().float().numpy()
    return np.asarray(x, np.float32)


class PagedKVCache:
    open_blocks = 0          # the stand-ins keep no rows in fp16 (open_blocks= is taken, unused)

    def __init__(self, n_kv_heads, head_dim, block_size, num_blocks, *, buffer=None,
                 rotation_seed=0, open_blocks=0):
        if block_size not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_size: expected a power of two 16..256, got {block_size}")
        if head_dim % 16 or not 16 <= head_dim <= 1024:
            raise ValueError(f"head_dim: expected a multiple of 16 in 16..1024, got {head_dim}")
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.block_size, self.num_blocks = block_size, num_blocks
        self.block_bytes = self.bytes_per_block(n_kv_heads, head_dim, block_size)
        size = num_blocks * self.block_bytes
        if buffer is None:
            raw = np.zeros(size + 64, np.uint8)
            buffer = raw[-raw.ctypes.data % 64:][:size]
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
        k, v = as_f32(k), as_f32(v)
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
        q = as_f32(q)
        options = dict(scale=q.shape[2] ** -0.5 if scale is None else scale, window=window,
                       sinks=sinks, softcap=softcap, q_bits=q_bits)
        if out is None:
            out = np.empty_like(q)
        for b in range(len(seq_lens)):
            lo, hi, n = int(query_start[b]), int(query_start[b + 1]), int(seq_lens[b])
            if hi > lo:
                rows = self.attend_one(q[lo:hi], block_table[b], n, **options)
                if hasattr(out, "copy_"):      # a torch out= of the model's dtype, as the pool's
                    import torch
                    out[lo:hi].copy_(torch.from_numpy(np.ascontiguousarray(rows, np.float32)))
                else:
                    out[lo:hi] = rows
        return out

    def attend_one(self, q, blocks, n, *, scale, window, sinks, softcap, q_bits):
        """One sequence's queries q [T, H, D] (its last T positions) over its n positions."""
        k, v = self.dequantize(blocks, n)
        w = weights(np.einsum("thd,nhd->htn", q, by_head(k, q)) * scale, n, window, sinks,
                    softcap)
        return np.einsum("htn,nhd->thd", w, by_head(v, q))


def by_head(x, q):
    """Rows x [n, Hkv, D] repeated for q's [T, H, D] query heads (GQA): [n, H, D]."""
    return np.repeat(x, q.shape[1] // x.shape[1], 1)


def positions(t, n):
    """The positions of a sequence's last t queries [t, 1] and of its n rows [1, n]."""
    return (n - t + np.arange(t))[:, None], np.arange(n)[None, :]


def weights(logits, n, window, sinks, softcap):
    """Softmax weights [H, T, n] of the logits [H, T, n] of a sequence's last T queries over its
    n positions: soft cap, causal mask, window with sinks."""
    if softcap:
        logits = softcap * np.tanh(logits / softcap)
    qpos, kpos = positions(logits.shape[1], n)
    seen = kpos <= qpos
    if window is not None:
        seen &= (kpos > qpos - window) | (kpos < sinks)
    logits = np.where(seen[None], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


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
        self._exact[0, slots[keep]] = as_f32(k)[keep]
        self._exact[1, slots[keep]] = as_f32(v)[keep]

    def dequantize(self, blocks, length):
        pos = np.arange(length)
        slots = np.asarray(blocks)[pos // self.block_size] * self.block_size + pos % self.block_size
        return self._exact[0, slots], self._exact[1, slots]


class FormatPool(ExactPool):
    """The pool that attends each sequence through a contiguous int8attn ``KVCache`` of the
    format ``options`` (KVCache's keyword arguments), made anew at every call from the
    sequence's exact rows: the rows before the call's queries appended, then the queries'
    own rows prefilled with them. What that format of int8attn's contiguous cache (its real
    kernels, its float rows and window) would give inside the engine, whatever fits a block:
    examples/vllm_gemma3.py's format rows. Slow (each call appends the whole history)."""

    options: dict = {}

    def attend_one(self, q, blocks, n, *, scale, window, sinks, softcap, q_bits):
        import int8attn as ia

        k, v = self.dequantize(blocks, n)
        t = len(q)
        cache = ia.KVCache(self.n_kv_heads, n, self.head_dim, **self.options)
        if n > t:
            cache.append(k[:n - t], v[:n - t])
        return cache.prefill(k[n - t:], v[n - t:], q, scale=scale, q_bits=q_bits, window=window,
                             sinks=sinks, softcap=softcap)


class FreshRowsPool(ExactPool):
    """Rotated int8 rows (int8attn's ``FORMATS["rotated"]``, dequantized) except where
    ``fresh(query position, row position)`` holds: there the row is read in fp16 (the exact row
    rounded to float16). Attention in float64 numpy: a format study inside the engine, not
    int8attn's kernels. ``fresh`` is a class attribute: the newest W positions of each query
    (``window_rows(W)``), or the rows of the query's own block (``own_block``): the rows
    a pool keeps in fp16 beside its blocks until their block is full (``open_blocks``)."""

    @staticmethod
    def fresh(qpos, kpos):
        raise NotImplementedError

    def attend_one(self, q, blocks, n, *, scale, window, sinks, softcap, q_bits):
        import int8attn as ia

        k, v = self.dequantize(blocks, n)
        coded = ia.KVCache(self.n_kv_heads, n, self.head_dim, **ia.FORMATS["rotated"])
        coded.append(k, v)
        kq, vq = coded.dequantize()
        kh, vh = (x.astype(np.float16).astype(np.float64) for x in (k, v))
        fresh = self.fresh(*positions(len(q), n))[None]                  # [1, t, n]
        qq = q.astype(np.float64) * scale
        w = weights(np.where(fresh, np.einsum("thd,nhd->htn", qq, by_head(kh, q)),
                             np.einsum("thd,nhd->htn", qq, by_head(kq, q))), n, window, sinks,
                    softcap)
        return (np.einsum("htn,nhd->thd", np.where(fresh, w, 0), by_head(vh, q))
                + np.einsum("htn,nhd->thd", np.where(fresh, 0, w), by_head(vq, q)))


def window_rows(w):
    """A FreshRowsPool whose queries read their newest `w` positions in fp16."""
    return type(f"Window{w}Pool", (FreshRowsPool,),
                {"fresh": staticmethod(lambda qpos, kpos: kpos > qpos - w)})


def own_block(block_size):
    """A FreshRowsPool whose queries read the rows of their own block (of `block_size`
    positions: those written since it began) in fp16."""
    return type(f"OwnBlock{block_size}Pool", (FreshRowsPool,),
                {"fresh": staticmethod(lambda qpos, kpos: kpos >= qpos // block_size
                                       * block_size)})


def format_pool(**options):
    """A FormatPool of int8attn's contiguous format `options` (KVCache's keyword arguments)."""
    return type("FormatPool", (FormatPool,), {"options": options})
