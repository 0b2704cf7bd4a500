"""Hugging Face transformers on int8attn caches: a cache and an attention implementation.

>>> import int8attn.hf                    # registers attn_implementation="int8attn"
>>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="int8attn")
>>> cache = int8attn.hf.Int8Cache(model.config, max_cache_len=8192)
>>> out = model.generate(**inputs, cache=cache, max_new_tokens=200)

Each layer of the model keeps one cache per sequence of the batch (``Int8KVCache`` in the
default format; a 4-bit ``KVCache`` with ``Int8Cache(..., k_bits=4, v_bits=4)``), and the
attention of the prompt (prefilled in one call per layer, each prompt token reading what a
token-by-token run reads) and of every generated token runs over
those caches directly: no float copy of K or V is kept or rebuilt. A
sliding-window layer keeps only what its window can still see (about its window plus a
chunk of slack), so its memory does not grow with the context. Both fp32 and bf16 models work:
q, k and v are converted to float32 on the way in and the output back to the model's dtype.

Supported: full-attention and sliding-window layers (each its own window), GQA/MQA, the
model's own softmax scale and logit soft cap (Gemma 2), batches of equal-length prompts
(decoded in one call per layer over the thread pool), greedy and sampling generation, beam
search (``reorder_cache``), ``crop`` (assisted generation), ``batch_repeat_interleave`` and
``batch_select_indices``. Refused with a clear error: padded batches (padding would enter the
caches), custom 4D attention masks, and layer types other than full and sliding attention.
Inference only: no gradient flows through the attention. A call that raises inside the model
(K, V or q holding NaN or Inf, say) leaves the layers before the failing one holding the call's
tokens: ``reset()`` the cache (or ``crop`` it) before using it again.

Without an ``Int8Cache`` (``use_cache=False``, or a transformers cache), the int8attn
attention still runs: it quantizes the K and V it is given into temporary int8 caches for
that call, so the numbers are the same kind, but nothing is kept between calls.

Needs torch and transformers 5 (``pip install 'int8attn[hf]'``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

try:
    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:                                  # pragma: no cover - depends on the venv
    raise ImportError("int8attn.hf needs torch and transformers>=5: "
                      "pip install 'int8attn[hf]'") from e

from . import FORMATS, Int8KVCache, KVCache, prefill_batch
from . import _args
from . import _rules as R
from ._cache import _prefill_layer as _engine   # (a module global: tests count its calls)

if int(transformers.__version__.split(".")[0]) < 5:        # pragma: no cover
    raise ImportError(f"int8attn.hf needs transformers>=5 (the cache= API), found "
                      f"{transformers.__version__}")

__all__ = ["Int8Cache", "Int8Layer", "NAME"]

NAME = "int8attn"
"""The ``attn_implementation`` this module registers."""

# A sliding-window layer's cache holds its window (less one: the query itself is new) plus
# SLACK tokens; when an append would not fit, it forgets all but the last window - 1 + ROLLBACK
# tokens (ROLLBACK: what crop() can take back after that). A prompt longer than SLACK - ROLLBACK
# is attended there in chunks of that many queries, which always fit after that. (Read when a
# layer is made.)
SLACK = 512
ROLLBACK = 64


class _Pending(torch.Tensor):
    """What a layer's update() returns instead of K and V: a marker carrying the layer, whose
    new tokens the int8attn attention appends and attends over. Any torch operation on it
    raises: only the int8attn attention can use it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__repr__:
            return "<int8attn pending K/V>"
        raise RuntimeError(
            "an int8attn.hf.Int8Cache returned this in place of K/V: the model must attend with "
            "attn_implementation='int8attn' (load it with that argument, or call "
            "model.set_attn_implementation('int8attn'))")


def _marker(layer: Int8Layer) -> torch.Tensor:
    t = torch.Tensor._make_subclass(_Pending, torch.empty(0))
    t.int8attn_layer = layer
    return t


def _as_rows(x: torch.Tensor) -> np.ndarray:
    """[B, heads, T, D] torch -> [B, T, heads, D] float32 C-contiguous numpy (a view when it
    already is one: a decode step's single token, in float32). A decode step makes three of
    these per layer, so the common case is three cheap calls (a torch call costs a microsecond
    or two inside a model's step: numpy's views cost less than torch's calls; a raised
    exception costs tens)."""
    if x.dtype is not torch.float32:
        x = x.to(torch.float32)
    try:
        a = x.numpy()
    except RuntimeError:               # a tensor that needs grad (the attention has none)
        a = x.detach().numpy()
    a = a.transpose(0, 2, 1, 3)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _heads_first(shape: tuple) -> list[int]:
    """A [B, T, Hkv, D] shape as the model's K and V have it: [B, Hkv, T, D]."""
    return [shape[0], shape[2], shape[1], shape[3]]


def _clone(c: KVCache) -> KVCache:
    return type(c).from_state_dict(c.state_dict(), max_seq=c.max_seq)


def _pick(caches: list[KVCache], index: list[int]) -> list[KVCache]:
    """caches[i] for i in index, each cache used once and copied when picked again."""
    used: set[int] = set()
    out = []
    for i in index:
        out.append(caches[i] if i not in used else _clone(caches[i]))
        used.add(i)
    return out


def _format_options(kv_format: str, k_bits: int, v_bits: int) -> dict:
    """The KVCache options of a named format at these widths (no offsets with a 4-bit side)."""
    opts = dict(FORMATS[kv_format])
    if R.has_four_bit_side(k_bits, v_bits):
        opts["center"] = False
    return opts


def _new_cache(hkv: int, cap: int, d: int, kv_format: str, k_bits: int, v_bits: int) -> KVCache:
    opts = _format_options(kv_format, k_bits, v_bits)
    if (k_bits, v_bits) == (8, 8):
        return Int8KVCache(hkv, cap, d, **opts)
    return KVCache(hkv, cap, d, k_bits=k_bits, v_bits=v_bits, **opts)


class Int8Layer(CacheLayerMixin):
    """One attention layer's cache: a ``KVCache`` per sequence of the batch (K and V at
    ``k_bits``, ``v_bits``), created at the first update from the shapes of K and V ([B, Hkv,
    T, D]).

    ``max_cache_len`` bounds the tokens a sequence may reach; a full-attention layer allocates
    all of them up front, a sliding-window one at most ``sliding_window - 1 + SLACK`` (with K at
    4 bits, 31 more: it forgets whole groups of 32 positions).
    """

    is_compileable = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, max_cache_len: int, sliding_window: int | None = None,
                 kv_format: str = "default", k_bits: int = 8, v_bits: int = 8):
        super().__init__()
        self.max_cache_len = max_cache_len
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.kv_format = kv_format
        self.k_bits, self.v_bits = k_bits, v_bits
        self.evict_step = R.evict_step(k_bits)    # evict takes whole K groups at 4 bits
        self.slack, self.rollback = SLACK, ROLLBACK
        self.caches: list[KVCache] = []
        self.seen = 0                  # positions of the sequence this layer has attended
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.marker = _marker(self)    # what update() returns
        self.kv_shape: tuple[int, int] | None = None     # (Hkv, D), set at the first update
        self.key: tuple | None = None  # the (scale, window, softcap) of `options`, checked
        self.options: tuple = ()       # the engine's options of `key` (_engine's last five)

    def __repr__(self) -> str:
        kind = f"sliding_window={self.sliding_window}" if self.is_sliding else "full"
        return (f"Int8Layer({kind}, batch={len(self.caches)}, seen={self.seen}, "
                f"max_cache_len={self.max_cache_len})")

    @property
    def capacity(self) -> int:
        if self.is_sliding:
            return min(self.max_cache_len,
                       self.sliding_window - 1 + self.slack + self.evict_step - 1)
        return self.max_cache_len

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.device.type != "cpu":
            raise ValueError(f"int8attn runs on the CPU; K/V are on {key_states.device}")
        b, hkv, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.caches = [_new_cache(hkv, self.capacity, d, self.kv_format, self.k_bits,
                                  self.v_bits) for _ in range(b)]
        self.kv_shape = (hkv, d)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the new tokens' K and V ([B, Hkv, T, D], kept as they are); the int8attn attention
        of this layer, which runs next, checks them, stores them and attends. Returns markers,
        not tensors of K and V. (A decode step calls this and ``attend`` once per layer, so
        both do as few Python operations as they can: the checks are ``attend``'s, on numpy
        shapes.)"""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.pending = (key_states, value_states)
        return self.marker, self.marker

    def attend(self, query: torch.Tensor, scale: float | None, window: int | None,
               softcap: float | None) -> torch.Tensor:
        """Store the pending tokens and attend: query [B, H, T, D] -> [B, T, H, D] in the
        query's dtype. Raises before anything is stored when K, V or the arguments do not fit."""
        pending = self.pending
        if pending is None:
            raise RuntimeError("int8attn: attention without a preceding cache update")
        self.pending = None
        if self.key != (scale, window, softcap):
            self._set_options(scale, window, softcap)
        q, k, v = _as_rows(query), _as_rows(pending[0]), _as_rows(pending[1])
        t = q.shape[1]
        if k.shape != (len(self.caches), t) + self.kv_shape or v.shape != k.shape:
            self._refuse(k.shape, v.shape, t)
        if self.seen + t > self.max_cache_len:
            raise ValueError(f"int8attn: {t} new token(s) after {self.seen} exceed "
                             f"max_cache_len={self.max_cache_len}; make the Int8Cache larger")
        if not self.is_sliding:
            out = _engine(self.caches, k, v, q, *self.options)
            self.seen += t
        else:
            # prefill_batch: every query reads what token-by-token steps read, however long the
            # call; a sliding layer's steps leave room to evict between them
            step = self.slack - self.rollback
            parts = []
            for a in range(0, t, step):
                z = min(t, a + step)
                self._make_room(z - a)
                parts.append(_engine(self.caches, k[:, a:z], v[:, a:z], q[:, a:z],
                                     *self.options))
                self.seen += z - a
            out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        out = torch.from_numpy(out)
        return out if query.dtype is torch.float32 else out.to(query.dtype)

    def _refuse(self, k_shape: tuple, v_shape: tuple, t: int) -> None:
        """The error for K and V ([B, T, Hkv, D] here) that do not fit t queries or the cache."""
        hkv, d = self.kv_shape
        if k_shape[1] != t:
            raise ValueError(f"int8attn: {t} queries for {k_shape[1]} new K/V tokens; int8attn "
                             f"attends each new token's query over the cache")
        if k_shape != v_shape:
            raise ValueError(f"int8attn: K of shape {_heads_first(k_shape)} and V of shape "
                             f"{_heads_first(v_shape)} differ")
        raise ValueError(f"int8attn: K/V of shape {_heads_first(k_shape)} do not fit this cache "
                         f"(batch {len(self.caches)}, {hkv} kv heads, head dim {d}); reset() it "
                         f"or make a new Int8Cache")

    def _set_options(self, scale: float | None, window: int | None,
                     softcap: float | None) -> None:
        """Check the attention's arguments (_args.decode_options) and keep the engine's options
        of them: a model passes the same ones every call, so this runs once per layer."""
        if window != self.sliding_window:
            raise ValueError(f"int8attn: the model attends with sliding_window={window} but the "
                             f"config makes this layer's window {self.sliding_window}")
        s, q_bits, w, sinks, cap = _args.decode_options(scale, 16, window, 0, softcap,
                                                        self.kv_shape[1])
        most = self.capacity                 # every cache of the layer holds this many
        self.options = (s, q_bits, min(w, most), min(sinks, most), cap)
        self.key = (scale, window, softcap)

    def _make_room(self, n: int) -> None:
        """A sliding layer's caches forget what no query sees, when n more tokens would not
        fit (whole K groups at 4 bits)."""
        for c in self.caches:
            if len(c) + n > c.max_seq:
                gone = len(c) - min(len(c), self.sliding_window - 1 + self.rollback)
                c.evict(gone - gone % self.evict_step)

    def __deepcopy__(self, memo: dict) -> Int8Layer:
        """A copy with its own caches (prompt reuse: ``copy.deepcopy(cache)``)."""
        new = Int8Layer.__new__(Int8Layer)
        new.__dict__.update(self.__dict__)
        new.caches = [_clone(c) for c in self.caches]
        new.marker = _marker(new)
        return new

    # -- what transformers asks of a layer ---------------------------------------------------

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.max_cache_len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def reset(self) -> None:
        for c in self.caches:
            c.reset()
        self.seen = 0
        self.pending = None

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` tokens (a negative count, as transformers
        passes it; 0 does nothing). A sliding-window layer can take back at most what it still
        holds beyond its window."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got "
                             f"{tokens_to_remove}")
        n = -tokens_to_remove
        if n == 0 or not self.caches:
            return
        if n > self.seen:
            raise ValueError(f"crop: cannot remove {n} tokens from {self.seen}")
        held = len(self.caches[0])
        need = min(self.seen - n, self.sliding_window - 1) if self.is_sliding else 0
        if held - n < need:
            raise RuntimeError(f"crop: this sliding-window layer holds {held} tokens; removing "
                               f"{n} would leave fewer than the {need} its window still sees")
        for c in self.caches:
            c.truncate(len(c) - n)
        self.seen -= n

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.caches = _pick(self.caches, [int(i) for i in beam_idx])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.caches = _pick(self.caches, [i for i in range(len(self.caches))
                                          for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.caches = _pick(self.caches, [int(i) for i in indices])

    @property
    def batch_size(self) -> int:
        return len(self.caches)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)


class Int8Cache(Cache):
    """A transformers ``Cache`` whose layers keep K and V in int8attn caches.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's config (``model.config``); its text config gives the layer types and
        sliding windows. The model must use ``attn_implementation="int8attn"``.
    max_cache_len : int
        The most tokens (prompt and generated) a sequence may reach.
    kv_format : str
        One of ``int8attn.FORMATS`` (default ``"default"``).
    k_bits, v_bits : int
        8 (default) or 4 each, as in ``int8attn.KVCache``: with a side at 4 bits the format's
        offsets are off (``center``; the 4-bit sides keep their own minima), K at 4 bits needs
        a format with a recent window (``"default"`` or ``"recent"``), and the model's head dim
        a multiple of 32.
    """

    def __init__(self, config: Any, max_cache_len: int, *, kv_format: str = "default",
                 k_bits: int = 8, v_bits: int = 8):
        if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) \
                or max_cache_len < 1:
            raise ValueError(f"max_cache_len must be a positive int, got {max_cache_len!r}")
        if kv_format not in FORMATS:
            raise ValueError(f"kv_format must be one of {sorted(FORMATS)}, got {kv_format!r}")
        options = {"rotation_seed": 0, **_format_options(kv_format, k_bits, v_bits),
                   "k_bits": k_bits, "v_bits": v_bits}
        R.resolve(options.__getitem__, src=R.named_format(kv_format))   # (head_dim: the model's)
        text = config.get_text_config(decoder=True)
        impl = getattr(text, "_attn_implementation", None)
        if impl != NAME:
            raise ValueError(f"Int8Cache needs the model loaded with attn_implementation="
                             f"'{NAME}' (this config has {impl!r}); import int8attn.hf first")
        if getattr(text, "use_bidirectional_attention", False):
            raise ValueError("int8attn attends causally; this config uses bidirectional "
                             "attention")
        types, kwargs = get_layer_types_and_kwargs(text)
        layers = []
        for i, (kind, kw) in enumerate(zip(types, kwargs)):
            if kind == "full_attention":
                layers.append(Int8Layer(max_cache_len, None, kv_format, k_bits, v_bits))
            elif kind == "sliding_attention":
                layers.append(Int8Layer(max_cache_len, int(kw["sliding_window"]), kv_format,
                                        k_bits, v_bits))
            else:
                raise ValueError(f"int8attn caches full and sliding-window attention layers; "
                                 f"layer {i} is {kind!r}")
        super().__init__(layers=layers)
        self.max_cache_len = max_cache_len

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's caches (codes, scales and float rows)."""
        return sum(layer.nbytes for layer in self.layers)


# -- the attention and mask functions -------------------------------------------------------

def _ephemeral(key: torch.Tensor, value: torch.Tensor, query: torch.Tensor,
               scale: float | None, window: int | None, softcap: float | None) -> torch.Tensor:
    """K and V as given (no Int8Cache): quantized into temporary caches for this call only (the
    last T positions appended with their queries, so each reads its own recent window)."""
    _, hkv, s, d = key.shape
    t = query.shape[2]
    if t > s:
        raise ValueError(f"int8attn: {t} queries for {s} key/value positions; the queries must "
                         f"be the last of them")
    k, v = _as_rows(key), _as_rows(value)
    caches = [Int8KVCache(hkv, s, d, **FORMATS["default"]) for _ in range(k.shape[0])]
    for c, kb, vb in zip(caches, k, v):
        if s > t:
            c.append(kb[:s - t], vb[:s - t])
    out = prefill_batch(caches, k[:, s - t:], v[:, s - t:], _as_rows(query), scale=scale,
                        window=window, softcap=softcap)
    return torch.from_numpy(out).to(query.dtype)


_warned = False


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float | None = None,
              dropout: float = 0.0, sliding_window: int | None = None, softcap: float | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention registered as ``"int8attn"``: query [B, H, T, D]; key and value the
    markers of an ``Int8Layer`` (or, without an Int8Cache, float [B, Hkv, S, D]). Returns
    ([B, T, H, D] in the query's dtype, None)."""
    global _warned
    if attention_mask is not None:
        raise ValueError("int8attn attends causally (with each layer's window) and takes no "
                         "attention mask; this call was given one")
    if kwargs.get("output_attentions"):
        raise ValueError("int8attn does not return attention weights (output_attentions)")
    layer = getattr(key, "int8attn_layer", None)       # scaling None: decode's 1/sqrt(D)
    if layer is not None:
        return layer.attend(query, scaling, sliding_window, softcap), None
    if query.shape[2] != key.shape[2] and not _warned:
        _warned = True
        warnings.warn("int8attn attention without an int8attn.hf.Int8Cache: the past K/V are "
                      "quantized again on every call; pass cache=int8attn.hf.Int8Cache(model.config,"
                      " max_cache_len=...) to keep them in int8", stacklevel=2)
    return _ephemeral(key, value, query, scaling, sliding_window, softcap), None


def mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
         mask_function: Any = None, attention_mask: torch.Tensor | None = None,
         **kwargs: Any) -> None:
    """The mask function registered as ``"int8attn"``: the attention is causal with each
    layer's window by construction, so no mask is built; a padded batch is refused here,
    before any layer runs."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(
            "int8attn: this batch is padded (attention_mask holds zeros). int8attn keeps one "
            "cache per sequence and does not take padding yet: pass prompts of equal length "
            "(or one prompt at a time)")
    return None


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, mask)
