"""What int8attn.hf costs per layer call beyond the engine: the Python glue of a decode step.

    python benchmarks/hf_glue.py [--context 64] [--steps 200] [--dtype float32]

A tiny random Llama (4 layers, 8 query heads over 2 kv heads of 32, hidden 256) generates one
token at a time after a prompt of ``--context`` tokens with an ``int8attn.hf.Int8Cache``. Each
layer call is timed in its two parts, the cache's ``update`` and the registered attention
function, and the compiled call inside the attention (``int8attn.hf._engine``, which takes the
caches' flags, allocates the output and runs the engine) is timed apart: the glue is update +
attention - engine, the wrappers' own calls included. Prints the medians over every layer call of
the timed steps (the first 20 steps warm up), in microseconds.
"""
import argparse
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import int8attn.hf as ih


def tiny_llama(dtype):
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=4096)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=ih.NAME,
                                            dtype=dtype).eval()


def timed(fn, times, on):
    """fn, whose calls' times go to `times` while on[0] (a closure: the wrapper's own cost,
    which the glue would count, is a call and two clock reads)."""
    clock = time.perf_counter_ns

    def call(*args, **kwargs):
        if not on[0]:
            return fn(*args, **kwargs)
        t = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            times.append(clock() - t)
    return call


def measure(context, steps, dtype):
    model = tiny_llama(dtype)
    cache = ih.Int8Cache(model.config, max_cache_len=context + steps + 1)
    times = {"update": [], "attention": [], "engine": []}
    on = [False]
    old = (ih.Int8Layer.update, ih.AttentionInterface._global_mapping[ih.NAME], ih._engine)
    ih.Int8Layer.update = timed(old[0], times["update"], on)
    ih.AttentionInterface._global_mapping[ih.NAME] = timed(old[1], times["attention"], on)
    ih._engine = timed(old[2], times["engine"], on)      # the compiled call a layer makes
    try:
        ids = torch.randint(0, 512, (1, context))
        with torch.no_grad():
            model(ids, cache=cache)
            token = ids[:, -1:]
            for i in range(steps):
                on[0] = i >= 20
                token = model(token, cache=cache).logits[:, -1:].argmax(-1)
    finally:
        ih.Int8Layer.update, ih.AttentionInterface._global_mapping[ih.NAME], ih._engine = old
    med = {name: float(np.median(t)) / 1e3 for name, t in times.items()}
    glue = np.array(times["update"]) + np.array(times["attention"]) - np.array(times["engine"])
    return med, float(np.median(glue)) / 1e3, len(glue)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    med, glue, calls = measure(args.context, args.steps, getattr(torch, args.dtype))
    print(f"int8attn.hf per layer call, {args.dtype}, {args.context} tokens of context, medians "
          f"of {calls} calls: update {med['update']:.1f} us, attention {med['attention']:.1f} us "
          f"(of which the engine call {med['engine']:.1f} us): glue {glue:.1f} us")


if __name__ == "__main__":
    main()
