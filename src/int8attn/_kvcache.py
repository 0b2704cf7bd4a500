"""The caches: ``KVCache`` (and ``Int8KVCache``, its 8-bit form), ``decode_batch`` and
``prefill_batch``.

Python over the compiled store (``_cache._Store``, which owns the buffers and makes every engine
call with the GIL released) and ``_history.History`` (what the cache holds, read back, and its
file): each method takes the cache's busy flag first, converts and checks its arguments
(``_args``, ``_rules``, ``_state``) while it holds it, and hands the store what they return.
Public names are re-exported by ``int8attn``."""

from . import _args
from . import _cache
from . import _format
from . import _history
from . import _rules

for _name, _c_value in _cache._C_LIMITS.items():         # the C limits are _format's
    if getattr(_format, _name) != _c_value:
        raise ImportError(f"int8attn is built wrong: _format.{_name} is {getattr(_format, _name)}, "
                          f"the compiled engine's {_c_value}")


class KVCache(_history.History, _cache._Store):
    """A quantized KV cache for decode attention: K and V at 8 or 4 bits each.

    At 8 bits (the default, as ``Int8KVCache``) each token and kv head stores int8 codes with
    one float32 absmax scale per row (``scale = max|x| / 127``, codes ``round(x / scale)`` in
    [-127, 127]): half the bytes of an fp16 cache. At 4 bits K is stored per channel: each
    group of 32 positions of a kv head keeps, per channel, a minimum and a step (fp16 times a
    power of two per group) and every value a code 0 .. 15 (``min + step * code``); V is stored
    per token: a float32 minimum and step per row, codes 0 .. 15. 4/4 takes about 0.58x the
    bytes of 8/8 (with the recent window, at 8192 tokens of Hkv = 8, D = 128). All buffers are
    allocated once, for ``max_seq`` tokens.

    Parameters
    ----------
    n_kv_heads : int
        Key/value heads (Hkv), >= 1.
    max_seq : int
        Capacity in tokens, >= 1.
    head_dim : int
        Head dimension D: a multiple of 16 (of 32 with a side at 4 bits), at most 1024.
    k_bits, v_bits : {8, 4}
        Bits per stored K and V value. K at 4 bits needs ``recent >= 32`` (a group is read from
        the recent window until all its positions are appended) and is never rotated.
    rotate : bool
        True (the default): store the sides at 8 bits and V at 4 bits rotated by a fixed
        random-sign Walsh-Hadamard transform (orthonormal, block-diagonal over the largest
        power-of-two block dividing D), and rotate q and the output to match: attention is
        unchanged, while outlier channels no longer set every row's scale. ``k_i8``/``v_i8``
        then hold the rotated codes; ``dequantize`` returns the un-rotated values. False stores
        plain per-row codes (with ``q_bits=8``, the seed's exact method).
    rotation_seed : int
        Seed of the rotation's signs (0 .. 2**64 - 1).
    keep_first : bool
        True (the default): position 0 (the attention sink most models develop, which takes a
        large share of many heads' weight) is also kept as float32 (``k_first``/``v_first``),
        and decode reads it from there instead of from its codes. Costs 2 * Hkv * D floats.
    center : bool or None
        True: store every K and V row past position 0 minus its kv head's offset (``k_offset``/
        ``v_offset``, in the stored space); decode adds the offsets back (``q·offset`` joins
        each logit, the V offset the output), so each row's int8 steps are finer where real K
        shares a large offset across tokens. With a recent window the offsets are the mean of
        positions 1 .. ``recent``, set once the cache holds ``recent + 1`` tokens however the
        appends were split (the rows before are read from the window meanwhile). Without one,
        the append that first reaches past position 0 sets them from its own rows when it holds
        at least 16 of them, else to zeros (so they depend on how the appends were split). A
        kv head whose mean would more than double most of its rows (one huge outlier) gets
        zeros. Needs ``keep_first`` and both sides at 8 bits. None (the default): the value of
        ``keep_first`` for an 8-bit cache, False with a side at 4 bits.
    recent : int
        R, 64 by default, 0 to 1024: the last R positions are also kept as IEEE halves with a
        power-of-two scale per row (11 significant bits whatever the row's range:
        ``reference.half_rows``), and decode reads them from there in float32; a token leaves
        this window for its codes when R newer ones have been appended. Every row is quantized
        as it is appended (positions 1 .. R from their halves; K at 4 bits a group at a time,
        from its rows' halves), so the stored state does not depend on how appends were split.
        The cache holds the last ``2 * R`` positions (capped at ``max_seq``), so ``truncate``
        can take back up to R tokens exactly. Costs ``2 * min(2R, max_seq) * Hkv * (2 * D + 4)``
        bytes. 0: no window.

    Notes
    -----
    One cache is not meant to be used from two threads at once; a call that finds another in
    progress raises RuntimeError. The kernels run with the GIL released, so different caches
    decode in parallel from different Python threads.
    """

    __signature__ = _args.GENERAL_SIGNATURE
    __slots__ = ()

    @property
    def nbytes(self):
        """Bytes of the cache's buffers: K and V codes and their scales for max_seq tokens (V's
        codes for max_seq rounded up to a multiple of 4; at 4 bits half a byte a code, K's
        groups two halves per channel and two float32 scales, V two float32 per row); the float
        rows of position 0 with keep_first, the offsets with center, and the ring of the recent
        window: K and V rows of min(2 * recent, max_seq) positions as halves, a float32 scale
        per row."""
        return sum(size for _, _, size in self._buffers().values())

    def __repr__(self):
        bits = (f"k_bits={self.k_bits}, v_bits={self.v_bits}, "
                if not isinstance(self, Int8KVCache) else "")
        return (f"{type(self).__name__}(n_kv_heads={self.n_kv_heads}, "
                f"max_seq={self.max_seq}, head_dim={self.head_dim}, {bits}"
                f"rotate={self.rotate}, keep_first={self.keep_first}, center={self.center}, "
                f"recent={self.recent}) holding {len(self)} tokens")

    # -- operations -----------------------------------------------------------------------

    def _tokens(self, n):
        """n as a count of the cache's tokens, 0 .. len(cache), or the error naming it."""
        n = _args.as_int(n, "n")
        if not 0 <= n <= len(self):
            raise ValueError(f"n must be from 0 to len(cache)={len(self)}, got {n}")
        return n

    def reset(self):
        """Forget every token (capacity and buffers are kept): the cache is then as a fresh one,
        and codes what it is given next as a fresh one would (with center, new offsets)."""
        self.truncate(0)

    def truncate(self, n):
        """Keep the first n tokens and forget the rest (rejected speculative tokens): the cache
        then decodes exactly as it did after its n-th token was appended, and holds what it held
        then, when the tokens taken back since are at most ``recent`` (the ring's spare) or the
        cache has no recent window. Taking back more, the positions whose floats are gone are
        read from their codes until they leave the window. With center, truncating to before
        the offsets were set (n <= 1, or n <= recent with a window while the window's floats of
        those tokens are held) forgets them, as ``evict`` does. 0 <= n <= len(cache)."""
        self._enter()
        try:
            self._truncate(self._tokens(n))
        finally:
            self._leave()

    def evict(self, n):
        """Forget the n oldest tokens: token n + i becomes token i and len(cache) shrinks by n,
        freeing capacity for appends (a sliding-window layer keeps only what its window still
        sees). The tokens kept are read back exactly as before by a decode that sees them; with
        keep_first, the new first token's float row is what decode read for it (its floats in
        the recent window, else its dequantized codes, held within +-2**64 like every float
        row). With center, the offsets stay unless the tokens left are as few as ``truncate``
        forgets them at (1 or none; with a window, at most ``recent`` with their floats held):
        then they go, the tokens left are coded uncentered again (decode reads them from the
        window: its results do not change), and the next appends set new offsets as a fresh
        cache's would. ``evict(len(cache))`` is ``reset()``.
        0 <= n <= len(cache); with k_bits=4 a multiple of 32 (K's groups stay whole) or
        len(cache)."""
        self._enter()
        try:
            self._evict(self._tokens(n))         # (the store checks K's whole groups)
        finally:
            self._leave()

    def append(self, k, v):
        """Quantize and store tokens.

        Parameters
        ----------
        k, v : array-like, [Hkv, D] (one token) or [T, Hkv, D] (T tokens, one C call)
            Any real dtype and strides; converted to float32. Torch CPU tensors are accepted.
            Every value must be within +-2**64 (``VALUE_MAX``), far beyond any activation: the
            format's steps stay inside float32 there.

        Raises ValueError on a shape mismatch, on NaN or Inf or a value beyond +-2**64, or when
        the tokens would not fit in ``max_seq``; a batch is stored whole or not at all, and a
        failed call changes nothing.
        """
        self._enter()
        try:
            ka, va = _args.append(k, v, self.n_kv_heads, self.head_dim, len(self), self.max_seq)
            if ka.shape[0]:
                self._append(ka, va)
        finally:
            self._leave()

    def decode(self, q, *, scale=None, q_bits=16, out=None, window=None, sinks=0, softcap=None):
        """Attention of the queries over the cached tokens.

        Parameters
        ----------
        q : array-like or torch CPU tensor, [H, D] or [T, H, D]
            Queries, any real dtype (converted to float32); H a multiple of Hkv. Query head h
            reads kv head ``h // (H // Hkv)`` (GQA; MQA when Hkv == 1). With T queries they are
            the last T positions of the cache (1 <= T <= len), causal among themselves: query t
            sees positions up to ``len - T + t`` (verifying speculative tokens). Each query
            reads the history a single decode at its position read, bit for bit: with a
            recent window R, its last R positions from their floats, which the cache holds
            for the last 2R positions, so T is at most R + 1 there (any T while len <= 2R, or
            max_seq <= 2R); ``prefill`` appends and attends a chunk of any length. Each K/V
            row is read once for all T queries. Values within +-2**64.
        scale : float, optional
            Softmax scale applied to q.k, default ``1 / sqrt(D)``; positive, and with
            ``scale * max|q|`` at most 2**40 (``QSCALE_MAX``) in every query row, so that no
            logit can leave float32's range.
        q_bits : {16, 8}
            16 (default): q as two int8 planes, within 1e-3 of fp32 attention on the dequantized
            cache. 8: a single int8 q, the seed's method (about 1e-2).
        out : numpy.ndarray or torch CPU tensor, optional
            float32 C-contiguous, aligned buffer of q's shape to write into instead of
            allocating.
        window : int, optional
            Each query sees only the last ``window`` positions up to itself (sliding-window
            layers); the positions it cannot see are not read. Any window >= 1 (one longer
            than the cache sees everything).
        sinks : int
            With a window, the first ``sinks`` positions stay visible too (attention sinks);
            0 <= sinks <= window.
        softcap : float, optional
            Logits become ``softcap * tanh(logit / softcap)`` before the softmax (Gemma 2);
            from 2**-126 to 2**126.

        Returns
        -------
        float32, q's shape: ``out`` when given, else a torch tensor when q is one (sharing
        memory with the numpy result, no copy), else a numpy.ndarray.
        """
        self._enter()
        try:
            qa, out, result, s, bits, w, n, cap = _args.decode(
                q, scale, q_bits, out, window, sinks, softcap, len(self), self.n_kv_heads,
                self.head_dim, self.max_seq)
            _rules.check_decode_queries(_args.queries_of(qa), self.recent, self.max_seq,
                                        len(self))
            _cache._decode([self], qa, out, s, bits, w, n, cap, False)
            return result
        finally:
            self._leave()

    def prefill(self, k, v, q, *, scale=None, q_bits=16, out=None, window=None, sinks=0,
                softcap=None):
        """Append T tokens and attend their T queries, in one call (a prompt, or a chunk of
        one): ``append(k, v)`` then ``decode(q)``, except that T may be any length. Each query
        reads the history a single decode right after its own token's append read, bit for
        bit (its recent window from the floats of those positions, which the call keeps
        whatever T is), so a prompt prefilled in one call, in chunks of any sizes or token by
        token gives the same outputs and the same cache. (One exception, by the format: a
        centered cache without a window takes its offsets from the first append past position
        0, so they depend on how the rows were split.)

        Parameters
        ----------
        k, v : array-like or torch CPU tensors, [T, Hkv, D]
            The new tokens, as ``append`` takes them (T >= 1, fitting in ``max_seq``).
        q : array-like or torch CPU tensor, [T, H, D]
            Their queries: query t sits at position ``len - T + t`` of the cache after the
            append and sees the positions up to it.
        scale, q_bits, out, window, sinks, softcap
            As in ``decode``.

        Returns float32 [T, H, D] like ``decode``. A call that raises (bad k, v or q, or
        options) appends nothing and writes no output.
        """
        self._enter()
        try:
            ka, va = _args.append(k, v, self.n_kv_heads, self.head_dim, len(self), self.max_seq)
            qa, out, result, s, bits, w, n, cap = _args.prefill(
                ka, q, scale, q_bits, out, window, sinks, softcap, len(self), self.n_kv_heads,
                self.head_dim, self.max_seq)
            _cache._decode([self], qa, out, s, bits, w, n, cap, False, ka, va)
            return result
        finally:
            self._leave()

class Int8KVCache(KVCache):
    """An int8 KV cache for decode attention: ``KVCache`` with K and V at 8 bits (its options but
    ``k_bits`` and ``v_bits``, the same methods and attributes).

    K and V are stored per token and kv head as int8 codes with one float32 absmax scale each
    (``scale = max|x| / 127``, codes ``round(x / scale)`` in [-127, 127]): half the bytes of an
    fp16 cache, a quarter of fp32. See ``KVCache`` for the parameters.
    """

    __signature__ = _args.SIGNATURE
    __slots__ = ()


def decode_batch(caches, q, *, scale=None, q_bits=16, out=None, window=None, sinks=0,
                 softcap=None):
    """``caches[b].decode(q[b], ...)`` for every b, in one call: the (kv head, chunk) work items
    of all the caches share the thread pool (a batch of sequences, one cache each).

    Parameters
    ----------
    caches : sequence of B distinct KVCache (Int8KVCache included)
        Equal ``n_kv_heads`` and ``head_dim``; lengths and formats may differ, each at least T
        long.
    q : array-like or torch CPU tensor, [B, H, D] or [B, T, H, D]
        Cache b's queries are ``q[b]``, as in ``Int8KVCache.decode``.
    scale, q_bits, out, window, sinks, softcap
        As in ``Int8KVCache.decode``, the same for every cache; ``out`` has q's shape.

    Returns float32 of q's shape, like ``decode``. Every cache is taken for the whole call (a
    cache in use by another thread raises RuntimeError); a call that raises writes no output.
    """
    with _taken(caches) as seq:
        c0 = seq[0]
        qa, out, result, s, bits, w, n, cap = _args.decode(
            q, scale, q_bits, out, window, sinks, softcap, min(len(c) for c in seq),
            c0.n_kv_heads, c0.head_dim, max(c.max_seq for c in seq), batch=len(seq))
        for i, c in enumerate(seq):
            _rules.check_decode_queries(_args.queries_of(qa, batch=True), c.recent, c.max_seq,
                                        len(c), f"caches[{i}] is ")
        _cache._decode(seq, qa, out, s, bits, w, n, cap, True)
        return result


def prefill_batch(caches, k, v, q, *, scale=None, q_bits=16, out=None, window=None, sinks=0,
                  softcap=None):
    """``caches[b].prefill(k[b], v[b], q[b], ...)`` for every b, in one call (the work items of
    all the caches share the thread pool, as in ``decode_batch``).

    Parameters
    ----------
    caches : sequence of B distinct KVCache (Int8KVCache included)
        Equal ``n_kv_heads`` and ``head_dim``; lengths and formats may differ, each with room
        for T more tokens.
    k, v : array-like or torch CPU tensors, [B, T, Hkv, D]
        Cache b's new tokens are ``k[b]``, ``v[b]``.
    q : array-like or torch CPU tensor, [B, T, H, D]
        Their queries, as in ``KVCache.prefill``.
    scale, q_bits, out, window, sinks, softcap
        As in ``KVCache.decode``, the same for every cache; ``out`` has q's shape.

    Returns float32 of q's shape. A call that raises appends to no cache and writes no output.
    """
    with _taken(caches) as seq:
        c0 = seq[0]
        ka, va = _args.append_batch(k, v, c0.n_kv_heads, c0.head_dim,
                                    [(len(c), c.max_seq) for c in seq])
        qa, out, result, s, bits, w, n, cap = _args.prefill(
            ka, q, scale, q_bits, out, window, sinks, softcap, min(len(c) for c in seq),
            c0.n_kv_heads, c0.head_dim, max(c.max_seq for c in seq), batch=len(seq))
        _cache._decode(seq, qa, out, s, bits, w, n, cap, True, ka, va)
        return result


class _taken:
    """``with _taken(caches) as seq``: caches as a list of distinct KVCache of equal n_kv_heads
    and head_dim, each one's busy flag held for the block (a cache in use by another thread
    raises RuntimeError, and those taken before it are given back)."""

    def __init__(self, caches):
        if isinstance(caches, KVCache):
            raise TypeError(f"caches must be a sequence of KVCache, got one "
                            f"{type(caches).__name__}")
        seq = list(caches)
        if not seq:
            raise ValueError("caches must hold at least one KVCache, got an empty sequence")
        for i, c in enumerate(seq):
            if not isinstance(c, KVCache):
                raise TypeError(f"caches[{i}] must be a KVCache or Int8KVCache, got "
                                f"{type(c).__name__}")
        if len({id(c) for c in seq}) != len(seq):
            raise ValueError("caches must be distinct: the same cache appears more than once")
        self.seq, self.held = seq, []

    def __enter__(self):
        try:
            for c in self.seq:
                c._enter()
                self.held.append(c)
            c0 = self.seq[0]
            for i, c in enumerate(self.seq):
                if (c.n_kv_heads, c.head_dim) != (c0.n_kv_heads, c0.head_dim):
                    raise ValueError(
                        f"caches[{i}] has n_kv_heads={c.n_kv_heads}, head_dim={c.head_dim}; "
                        f"caches[0] has n_kv_heads={c0.n_kv_heads}, head_dim={c0.head_dim}: "
                        f"a batch needs them equal")
        except BaseException:
            self.__exit__()
            raise
        return self.seq

    def __exit__(self, *exc):
        for c in self.held:
            c._leave()
        self.held = []
