"""The vLLM tests' engines: tiny random-weight models saved locally, each engine run once per
session (start-ups are the cost) and its outputs kept for every test that reads them.

Engines run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), one at a time, with 1 GiB of KV
cache. Without vllm (the main suite's venvs) the tests here are not collected.
"""
import functools
import gc
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
try:
    # not find_spec("vllm"): with tests/ on sys.path this directory passes for a namespace package
    import vllm.platforms  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]

import pytest

PLUGIN = "int8_per_token_head"
REFERENCE = "auto"          # vLLM's own CPU backend; with dtype float32 its cache is fp32
VOCAB = 512
# Every engine: fp32 activations, prompts as token ids, chunked prefill in chunks of 64 tokens
# (so a step mixes prefill chunks and decodes), prefix caching on unless a test says otherwise,
# 128 blocks (of vLLM's CPU default of 128 tokens) per layer.
ENGINE = dict(skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=320,
              max_num_batched_tokens=64, enable_prefix_caching=True, disable_log_stats=False,
              num_gpu_blocks_override=128, seed=0)


def model_config(name):
    """A tiny transformers config; weights 5x the usual init scale (initializer_range 0.1) so
    attention and the logits are peaked (tests/test_hf.py does the same): random weights at the
    usual scale leave near ties that any change of rounding flips."""
    from transformers import Gemma2Config, LlamaConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  max_position_embeddings=1024, initializer_range=0.1)
    if name == "llama":           # GQA 4:1, full attention
        return LlamaConfig(num_attention_heads=8, num_key_value_heads=2, head_dim=32, **common)
    if name == "llama-head-24":   # a head size int8attn does not take
        return LlamaConfig(num_attention_heads=8, num_key_value_heads=2, head_dim=24, **common)
    if name == "qwen2":           # MQA, attention biases, every layer sliding (window 24: vLLM's
        # Qwen2 takes no mix of sliding and full layers)
        return Qwen2Config(num_attention_heads=4, num_key_value_heads=1, use_sliding_window=True,
                           sliding_window=24, max_window_layers=0, **common)
    if name == "gemma2":          # alternating sliding (24) and full layers, soft cap 5, scale 32**-0.5
        return Gemma2Config(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                            sliding_window=24, attn_logit_softcapping=5.0,
                            query_pre_attn_scalar=32, **common)
    raise KeyError(name)


@functools.cache
def model_dir(name, root):
    import torch
    from transformers import AutoModelForCausalLM

    path = os.path.join(root, name)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(model_config(name), dtype=torch.float32).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """name -> the directory of a saved tiny model (made on first use)."""
    root = str(tmp_path_factory.mktemp("models"))
    return lambda name: model_dir(name, root)


@pytest.fixture
def switch_tier():
    """_cache._set_isa, for a test that switches int8attn's tier; the tier it found is active
    again after it, whatever happened."""
    from int8attn import _cache
    import int8attn as ia

    was = ia.isa()
    yield _cache._set_isa
    _cache._set_isa(was)


def token_prompts(lengths, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, n).tolist() for n in lengths]


class Run:
    """What one engine produced: per job name, a list of (token ids, logprobs) per prompt,
    where logprobs[t] maps token id -> logprob at step t (the top 5 and the sampled one);
    `metrics`: the engine's counters by name; `impls`: the attention impl classes used."""

    def __init__(self, outputs, metrics, impls):
        self.outputs, self.metrics, self.impls = outputs, metrics, impls


def run_engine(model, kv_cache_dtype, jobs, before=None, **engine):
    """Start an engine, run `jobs` (name -> (prompts, max_tokens); greedy, all prompts of a
    job submitted together; before(name), if given, is called before each), shut it down and
    return a Run."""
    from vllm import LLM, SamplingParams

    llm = None
    try:
        llm = LLM(model=model, kv_cache_dtype=kv_cache_dtype, **{**ENGINE, **engine})
        outputs = {}
        for name, (prompts, max_tokens) in jobs.items():
            if before:
                before(name)
            params = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=5,
                                    ignore_eos=True)
            got = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
            outputs[name] = [(list(o.outputs[0].token_ids),
                              [{t: lp.logprob for t, lp in step.items()}
                               for step in o.outputs[0].logprobs]) for o in got]
        metrics = {}
        for m in llm.get_metrics():
            if hasattr(m, "value"):
                metrics[m.name] = metrics.get(m.name, 0) + m.value
        impls = set(llm.apply_model(
            lambda model: sorted({type(mod.impl).__name__ for mod in model.modules()
                                  if hasattr(mod, "impl")}))[0])
    finally:
        del llm
        _free_engine()
    return Run(outputs, metrics, impls)


def _free_engine():
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()
