"""The plugin without an engine: its entry point, the platform hook's routing, and the clear
errors for what the int8attn kv_cache_dtype cannot serve."""
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch
from conftest import PLUGIN
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.selector import AttentionSelectorConfig

import int8attn.vllm as iv


def selector(**changes):
    base = dict(head_size=64, dtype=torch.float32, kv_cache_dtype=PLUGIN, block_size=None)
    return AttentionSelectorConfig(**{**base, **changes})


def backend_for(cfg):
    return CpuPlatform.get_attn_backend_cls(None, cfg)


def test_the_entry_point_is_installed():
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("int8attn") == "int8attn.vllm:register"


def test_the_kv_cache_dtypes_are_vllms_names():
    from typing import get_args

    from vllm.config.cache import CacheDType

    assert iv.KV_CACHE_DTYPES and set(iv.KV_CACHE_DTYPES) <= set(get_args(CacheDType))


def test_the_hook_routes_its_dtype_to_int8attn_and_the_rest_to_vllm():
    iv.register()
    iv.register()                      # vLLM may load a plugin more than once
    assert backend_for(selector()) == "int8attn.vllm.Int8AttnBackend"
    assert backend_for(selector(kv_cache_dtype="auto")).endswith("CPUAttentionBackend")
    assert backend_for(selector(kv_cache_dtype="fp8", head_size=24)).endswith(
        "CPUAttentionBackend")


@pytest.mark.parametrize("changes, named", [
    (dict(head_size=24), "head_size"),
    (dict(head_size=1040), "head_size"),
    (dict(block_size=48), "block_size"),
    (dict(block_size=512), "block_size"),
    (dict(has_sink=True), "sinks"),
    (dict(attn_type=AttentionType.ENCODER_DECODER), "attn_type"),
    (dict(attn_type=AttentionType.ENCODER_ONLY), "attn_type"),
    (dict(use_mla=True), "MLA"),
    (dict(use_non_causal=True), "causal"),
])
def test_what_int8attn_cannot_serve_is_refused_by_name(changes, named):
    iv.register()
    with pytest.raises(ValueError, match=named) as e:
        backend_for(selector(**changes))
    assert PLUGIN in str(e.value)


@pytest.mark.parametrize("kwargs, named", [
    (dict(alibi_slopes=[0.5, 0.25]), "alibi_slopes"),
    (dict(sinks=torch.zeros(2)), "sinks"),
    (dict(attn_type=AttentionType.ENCODER), "attn_type"),
    (dict(head_size=40), "head_size"),
    (dict(kv_cache_dtype="auto"), "kv_cache_dtype"),
    (dict(num_heads=3), "num_heads"),
])
def test_the_impl_refuses_by_name(kwargs, named):
    args = dict(num_heads=2, head_size=32, scale=0.1, num_kv_heads=2, kv_cache_dtype=PLUGIN)
    with pytest.raises(ValueError, match=named):
        iv.Int8AttnImpl(**{**args, **kwargs})


def test_the_impl_refuses_another_platform(monkeypatch):
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    with pytest.raises(ValueError, match="platform"):
        iv.Int8AttnImpl(2, 32, 0.1, 2, kv_cache_dtype=PLUGIN)


def test_the_spec_has_int8attns_bytes_per_token_and_head():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    spec = iv.Int8AttnBackend.customize_spec(FullAttentionSpec(
        block_size=128, num_kv_heads=2, head_size=64, dtype=torch.int8,
        kv_quant_mode=get_kv_quant_mode(PLUGIN)))
    assert spec.page_size_bytes == iv.ia.PagedKVCache.bytes_per_block(2, 64, 128) == 2 * 128 * 136


def test_the_rest_of_int8attn_imports_neither_torch_nor_vllm():
    code = ("import sys, int8attn, int8attn.reference; "
            "assert not {'torch', 'vllm'} & set(sys.modules), 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_layer_keeps_its_open_blocks_in_fp16(monkeypatch):
    # 2 per sequence that may hold one between steps and one more a step may open, and a step's
    # tokens spread over blocks; the environment sets another count or none
    assert iv.open_blocks(256, 8192, 128) == 2 * 256 + 64
    assert iv.open_blocks(4, 100, 16) == 8 + 7
    impl = iv.Int8AttnImpl(2, 32, 0.1, 2, kv_cache_dtype=PLUGIN)
    cache = torch.zeros(5, 2, 16, 2 * 32 + 8, dtype=torch.int8)
    seqs, tokens = impl._steps
    assert impl.pool(cache).open_blocks == iv.open_blocks(seqs, tokens, 16)
    monkeypatch.setenv(iv.OPEN_BLOCKS_ENV, "0")
    assert iv.open_blocks(256, 8192, 128) == 0
    fresh = iv.Int8AttnImpl(2, 32, 0.1, 2, kv_cache_dtype=PLUGIN)
    assert fresh.pool(cache).open_blocks == 0
    monkeypatch.setenv(iv.OPEN_BLOCKS_ENV, "many")
    with pytest.raises(ValueError, match="INT8ATTN_OPEN_BLOCKS must be a count of blocks"):
        iv.open_blocks(256, 8192, 128)
