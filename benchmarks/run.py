"""The int8attn benchmark suite: one command, one JSON report.

    python benchmarks/run.py [--quick | --models] [--out benchmarks/results/NAME.json]

Runs every case of benchmarks/README.md (the seed's table per tier and q_bits, hot and cold regimes,
longer contexts, GQA 32/8, thread scaling 1..N, the real models' shapes and prompt chunks, and the
numpy / torch / vLLM peers found installed), then the decode under load (0 .. N busy-loop
processes on the N CPUs, 1 thread vs the default), prints a table, the real models' shapes side
by side (README's speed table) and the issues' targets, and writes the report (machine,
versions, commit, tier, threads, each figure's min / median / max). Compare two reports with
benchmarks/compare.py. With vLLM's peers: run it with the vLLM venv's Python.
"""

import argparse
import importlib.util
import os

# torch's OpenMP threads (SDPA, vLLM's kernels) spin after each parallel region by default, taking
# the CPUs the next case's threads need on a small machine; PASSIVE: they sleep at once (set
# before torch loads libgomp; an OMP_WAIT_POLICY in the environment wins)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import int8attn as ia   # the installed package: pip install '.[bench]'
from int8attn import _bench
from int8attn._bench import Case

import studies

SEED = [512, 2048, 8192]
FOUR = [(4, 4), (8, 4), (4, 8)]
# Real models' shapes (issue 31): Llama 3's 32 query heads over 8, Gemma 3's 4 over 1 at D = 256;
# a prompt chunk of 512 queries over the cache (the prefill cases: hot, T queries)
GQA, GEMMA, T = (32, 8, 128), (4, 1, 256), 512
PREFILL = [((8, 8, 128), 8192), (GQA, 8192), (GEMMA, 4096)]
VLLM = ("vllm-bf16", "vllm-fp32")


def vllm_available():
    """vLLM's CPU build importable (its kernels are then a peer of every shape run here)."""
    return importlib.util.find_spec("vllm") is not None and _bench.torch_available()


def run_vllm(case, budget, rng):
    """vLLM's CPU attention kernel as benchmarks/vllm_serve.py calls it (``Vllm``: the way its
    CPU backend does) over one sequence in its paged cache of the case's dtype: the case's tokens
    (and T more for a prompt chunk, its queries the last T positions, causal)."""
    import torch
    import vllm_serve as vs

    k, v, q = _bench._data(case, rng)
    t = case.queries if case.queries > 1 else 1
    one = vs.Case(case.h, case.hkv, case.d, k.shape[0])
    elem = vs.VLLM_KINDS[case.impl][2]
    nbytes = 2 * k.size * elem.itemsize
    copies = _bench.cold_copies(nbytes) if case.regime == "cold" else 1
    impl = vs.Vllm(one, k[None], v[None], q[None], case.impl, copies, rng, queries=t)
    before = torch.get_num_threads()
    torch.set_num_threads(case.threads or ia.get_num_threads())
    try:
        impl.set_threads()
        times = _bench._timed(impl, copies, 10, budget)
    finally:
        torch.set_num_threads(before)
    dec = _bench._stats(times)
    return {"copies": copies, "bytes": impl.nbytes, "time": dec,
            "gbps": impl.nbytes / dec["median"] / 1e9, "gflops": case.flops / dec["median"] / 1e9,
            "isa": impl.isa}


def model_cases(impls):
    """The real models' shapes for each implementation named: 8/8 x 128 from DRAM at 8192; GQA
    32/8 hot at 512 and 2048 and from DRAM at 8192 and 32768; Gemma's 4/1 x 256 from DRAM at
    1024 and 4096; the prompt chunks."""
    cases = []
    for impl in impls:
        cases += [Case(impl, 8, 8, 128, 8192, "cold")]     # the seed's shape, as a model reads it
        cases += [Case(impl, *GQA, s, "hot") for s in (512, 2048)]
        cases += [Case(impl, *GQA, s, "cold") for s in (8192, 32768)]
        cases += [Case(impl, *GEMMA, s, "cold") for s in (1024, 4096)]
        cases += [Case(impl, *shape, s, "hot", queries=T) for shape, s in PREFILL]
    return cases


def models_cases():
    """--models: the real models' shapes, the 8/8 twins their targets compare with, and each
    peer found at them (README's speed table and the targets at those shapes)."""
    cases = model_cases(["int8attn"]) + [Case("int8attn", 8, 8, 128, 32768, "cold")]
    peers = ["torch-fp32", "torch-bf16"] if _bench.torch_available() else []
    cases += model_cases(peers + (list(VLLM) if vllm_available() else []))
    return list(dict.fromkeys(cases))


def full_cases():
    n = ia.get_num_threads()
    cases = []
    for tier in ia.supported_isas():
        for q_bits in (16, 8):
            cases += [Case("int8attn", 8, 8, 128, s, "hot", q_bits, tier) for s in SEED]
    for q_bits in (16, 8):
        cases += [Case("int8attn", 8, 8, 128, s, "cold", q_bits) for s in (8192, 32768)]
    cases += [Case("int8attn", 8, 8, 128, 32768, "hot")]
    for s in SEED:      # the format's cost: the default and the seed's plain format, back to back
        cases += [Case("int8attn", 8, 8, 128, s, "hot"), Case("int8attn", 8, 8, 128, s, "hot", rotate=False)]
    cases += [Case("int8attn", 32, 8, 128, s, regime) for s in (2048, 8192)
              for regime in ("hot", "cold")]
    cases += [Case("int8attn", 8, 8, 128, 8192, "cold")]  # the 8/8 twin of GQA cold, named alike
    for k_bits, v_bits in FOUR:                 # KVCache with a side at 4 bits (issue 18)
        cases += [Case("int8attn", 8, 8, 128, s, regime, k_bits=k_bits, v_bits=v_bits)
                  for s, regime in ((2048, "hot"), (8192, "hot"), (8192, "cold"), (32768, "cold"))]
    cases += [Case("int8attn", 32, 8, 128, 8192, "hot", k_bits=4, v_bits=4)]
    cases += model_cases(["int8attn"])          # and their twins at 8/8, 4/4 and 8/4:
    cases += [Case("int8attn", 8, 8, 128, s, "hot") for s in (512, 2048)]
    cases += [Case("int8attn", 8, 8, 128, 32768, "cold")]
    for k_bits, v_bits in ((4, 4), (8, 4)):
        cases += [Case("int8attn", *GQA, s, regime, k_bits=k_bits, v_bits=v_bits)
                  for s, regime in ((2048, "hot"), (8192, "hot"), (8192, "cold"), (32768, "cold"))]
    for t in range(1, n + 1):
        cases += [Case("int8attn", 8, 8, 128, s, regime, threads=t)
                  for s, regime in ((512, "hot"), (8192, "hot"), (8192, "cold"))]
    baselines = ["numpy-fp32"] + (["torch-fp32", "torch-bf16", "torch-fp16"]
                                  if _bench.torch_available() else [])
    for impl in baselines:
        cases += [Case(impl, 8, 8, 128, s, "hot") for s in SEED]
        cases += [Case(impl, 8, 8, 128, 8192, "cold"), Case(impl, 32, 8, 128, 8192, "hot")]
    cases += model_cases([b for b in baselines if b in ("torch-fp32", "torch-bf16")]
                         + (list(VLLM) if vllm_available() else []))
    return list(dict.fromkeys(cases))     # drop repeats, keep order


def quick_cases():
    cases = [Case("int8attn", 8, 8, 128, s, "hot") for s in SEED]
    cases += [Case("int8attn", 8, 8, 128, 8192, "cold"), Case("int8attn", 32, 8, 128, 8192, "hot"),
              Case("int8attn", 8, 8, 128, 8192, "hot", threads=1),
              Case("numpy-fp32", 8, 8, 128, 2048, "hot"),
              Case("int8attn", 8, 8, 128, 8192, "hot", k_bits=4, v_bits=4)]
    cases += [Case("int8attn", *GQA, 2048, "hot", queries=64)]
    if _bench.torch_available():
        cases += [Case("torch-fp32", 8, 8, 128, 8192, "cold"),
                  Case("torch-fp32", *GQA, 2048, "hot", queries=64)]
    return cases


def find(results, **want):
    for r in results:
        c = r["case"]
        if all(c.get(k) == v for k, v in want.items()):
            return r
    return None


def find_tier(results, tier, default_tier, **want):
    """find() for a case of `tier`, where the default tier's cases may name it or leave it ""."""
    for t in ("", default_tier) if tier in ("", default_tier) else (tier,):
        r = find(results, tier=t, **want)
        if r:
            return r
    return None


def print_table(results):
    print(f"{'case':<58} {'median ms':>10} {'min ms':>8} {'GB/s':>7} {'probe':>7} {'frac':>5} {'err':>8}")
    for r in results:
        t = r["time"]
        probe = f"{r['probe_gbps']:7.1f}" if "probe_gbps" in r else " " * 7
        frac = f"{r['fraction_of_probe']:5.2f}" if "fraction_of_probe" in r else " " * 5
        err = f"{r['error_vs_reference']:8.1e}" if "error_vs_reference" in r else " " * 8
        print(f"{r['name']:<58} {t['median'] * 1e3:10.3f} {t['min'] * 1e3:8.3f} {r['gbps']:7.1f} "
              f"{probe} {frac} {err}")


def print_rotation(results, default_tier, costs=()):
    """Decode and append cost of the default format (rotation, float position 0, the recent
    window) over the seed's plain one, from this run's medians: each plain case against its
    default twin (the default tier named or not); then the decodes of the default, the
    previous default ("centered") and plain interleaved (studies.format_cost), which a drift of
    the machine's speed does not tilt."""
    rows = []
    for r in results:
        c = r["case"]
        if c["impl"] != "int8attn" or c["rotate"]:
            continue
        rotated = find_tier(results, c["tier"], default_tier, impl="int8attn", h=c["h"],
                            hkv=c["hkv"], d=c["d"], tokens=c["tokens"], regime=c["regime"],
                            q_bits=c["q_bits"], threads=c["threads"], rotate=True, k_bits=8,
                            v_bits=8)
        if rotated:
            rows.append((c["tokens"], rotated, r))
    if rows:
        print("\ndefault format over plain, i.e. rotation + float position 0 + recent window "
              "(medians; decode, append of the whole context, append of one token):")
        for tokens, r, p in rows:
            dec = r["time"]["median"] / p["time"]["median"] - 1
            print(f"  {tokens:>6} tokens: decode {p['time']['median'] * 1e6:8.1f} -> "
                  f"{r['time']['median'] * 1e6:8.1f} us ({dec * 100:+.1f}%), append all "
                  f"{p['append_all_time']['median'] * 1e3:7.2f} -> {r['append_all_time']['median'] * 1e3:7.2f} ms, "
                  f"append one {p['append_one_time']['median'] * 1e6:5.2f} -> "
                  f"{r['append_one_time']['median'] * 1e6:5.2f} us")
    if costs:
        names = costs[0]["formats"]
        print(f"decode, the formats interleaved (median of per-round {names[0]} / other; "
              "medians of each, us):")
        for c in costs:
            cells = ", ".join(f"{name} {c['time'][name]['median'] * 1e6:.1f}" for name in names)
            ratios = ", ".join(f"over {name} {(c['ratio'][name] - 1) * 100:+.1f}%"
                               for name in names[1:])
            print(f"  {c['tokens']:>6} tokens: {cells}  ({names[0]} {ratios}; "
                  f"{c['time'][names[0]]['n']} rounds)")


def print_contention(rows):
    """Decode under load: busy-loop processes on the CPUs, one thread against the default count
    (their calls alternating, so both meet the same load)."""
    if not rows:
        return
    print(f"\ndecode with busy-loop processes on the CPUs (medians, us; default = "
          f"{rows[0]['threads']} threads):")
    for r in rows:
        print(f"  busy {r['busy']}, {r['tokens']:>6} tokens: 1 thread {r['one']['median'] * 1e6:8.1f}, "
              f"default {r['default']['median'] * 1e6:8.1f}  (default / 1 thread: {r['ratio']:.2f})")


def print_targets(results, default_tier, contention=()):
    """The issue's targets, each from this run's medians (q_bits=16, default threads)."""
    lines = []
    for r in contention:
        if r["busy"]:
            lines.append((f"busy {r['busy']}, {r['tokens']} tokens: default threads at most 1.5x "
                          f"one thread", r["ratio"], r["ratio"] <= 1.5))

    def ours(tokens, regime, h=8, bits=(8, 8)):
        return find_tier(results, "", default_tier, impl="int8attn", h=h, tokens=tokens,
                         regime=regime, q_bits=16, threads=0, rotate=True, k_bits=bits[0],
                         v_bits=bits[1], queries=1)

    def frac(tokens, regime):
        r = ours(tokens, regime)
        return r and r["fraction_of_probe"]

    for s in (8192, 32768):
        f = frac(s, "cold")
        if f is not None:
            lines.append((f"cold {s}: fraction of probe >= 0.85", f, f >= 0.85))
    for s in (2048, 8192):
        f = frac(s, "hot")
        if f is not None:
            lines.append((f"hot {s}: fraction of probe >= 0.60", f, f >= 0.60))
    f = frac(512, "hot")
    if f is not None:
        lines.append(("hot 512: within 2x of the bandwidth bound (fraction >= 0.50)", f, f >= 0.5))
    mine = ours(8192, "cold")
    torch32 = find(results, impl="torch-fp32", h=8, tokens=8192, regime="cold")
    if mine and torch32:
        x = torch32["time"]["median"] / mine["time"]["median"]
        lines.append(("cold 8192: >= 4x faster than torch SDPA fp32", x, x >= 4))
    g, b = ours(8192, "hot", h=32), ours(8192, "hot")       # from DRAM: model_targets
    if g and b:
        x = g["time"]["median"] / b["time"]["median"]
        lines.append(("hot 8192: GQA 32/8 within 1.3x of 8/8", x, x <= 1.3))
    # issue 18: the 4-bit cache against the int8 one
    eight = ia.Int8KVCache(8, 8192, 128).nbytes
    four = ia.KVCache(8, 8192, 128, k_bits=4, v_bits=4).nbytes
    lines.append(("nbytes of 4/4 at 8192 tokens (Hkv 8, D 128) <= 0.6x of 8/8", four / eight,
                  four <= 0.6 * eight))
    for s, regime, most in ((32768, "cold", 0.65), (2048, "hot", 1.0), (8192, "hot", 1.0)):
        g, b = ours(s, regime, bits=(4, 4)), ours(s, regime)
        if g and b:
            x = g["time"]["median"] / b["time"]["median"]
            lines.append((f"{regime} {s}: 4/4 at most {most}x the time of 8/8", x, x <= most))
    lines += model_targets(results, ours, default_tier)
    if lines:
        print("\ntargets (medians of this run):")
        for text, value, ok in lines:
            print(f"  {'met ' if ok else 'MISS'}  {text}: {value:.2f}")


def model_targets(results, ours, tier):
    """The targets at the real models' shapes (issue 31's, as issue 40 set them again for the
    grouped heads, Gemma's probe fraction and the prefill against SDPA fp32: 3x on AMX, 2x on
    the other tiers), each from this run's medians."""
    lines = []

    def time_of(r):
        return r["time"]["median"]

    for s in (8192, 32768):
        g, b = ours(s, "cold", h=32), ours(s, "cold")
        if g and b:
            x = time_of(g) / time_of(b)
            lines.append((f"cold {s}: GQA 32/8 within 1.3x of 8/8", x, x <= 1.3))
    for s in (1024, 4096):
        r = find(results, impl="int8attn", h=4, hkv=1, d=256, tokens=s, regime="cold", k_bits=8)
        if r:
            f = r["fraction_of_probe"]
            lines.append((f"cold {s}: Gemma 4/1 x 256 at >= 0.6 of the probe", f, f >= 0.6))
    for s in (512, 2048):
        g = ours(s, "hot", h=32)
        peers = [find(results, impl=i, h=32, tokens=s, regime="hot", queries=1) for i in VLLM]
        peers = [p for p in peers if p]
        if g and peers:
            x = min(time_of(p) for p in peers) / time_of(g)
            lines.append((f"hot {s}: GQA 32/8 >= 1.5x faster than the fastest vLLM kernel", x,
                          x >= 1.5))
    for (h, hkv, d), s in PREFILL:
        mine = find(results, impl="int8attn", h=h, hkv=hkv, d=d, tokens=s, queries=T, k_bits=8)
        for impl, most in (("torch-fp32", 3 if tier == "amx" else 2), ("torch-bf16", 2)):
            sdpa = find(results, impl=impl, h=h, hkv=hkv, d=d, tokens=s, queries=T)
            if mine and sdpa:
                x = time_of(sdpa) / time_of(mine)
                lines.append((f"prefill {T} over {s}, {h}/{hkv} x {d}: >= {most}x faster than "
                              f"SDPA {impl[6:]} ({mine['gflops']:.0f} GFLOP/s)", x, x >= most))
    for bits in ((4, 4), (8, 4)):
        for s, regime in ((8192, "hot"), (2048, "hot"), (8192, "cold"), (32768, "cold")):
            for h in (8, 32):
                g, b = ours(s, regime, h=h, bits=bits), ours(s, regime, h=h)
                if g and b and s > 2048:
                    x = time_of(g) / time_of(b)
                    lines.append((f"{regime} {s}, {h}/8: {bits[0]}/{bits[1]} no slower than 8/8",
                                  x, x <= 1.0))
    for h in (8, 32):
        g, b = ours(32768, "cold", h=h, bits=(4, 4)), ours(32768, "cold", h=h)
        if g and b:
            x = time_of(g) / time_of(b)
            lines.append((f"cold 32768, {h}/8: 4/4 at most 0.7x of 8/8", x, x <= 0.7))
    return lines


def print_models(results, compact=False):
    """The real models' shapes side by side: int8attn's default format and each peer this run
    found, ms per call (medians); prompt chunks also GFLOP/s (benchmarks/README.md's table).
    compact (README's speed table): int8attn's time and each peer family's times over it, SDPA
    fp32 / bf16 and vLLM bf16 / fp32, in one cell each."""
    peers = [i for i in ("torch-fp32", "torch-bf16") + VLLM if find(results, impl=i)]
    rows = []

    def order(r):                               # decodes hot, from DRAM, then prompt chunks
        c = r["case"]
        return c["queries"] > 1, c["regime"] == "cold", c["tokens"]

    def ratios(group, others, ms):
        got = [f"{o['time']['median'] * 1e3 / ms:.1f}x" if o else "-"
               for i, o in zip(peers, others) if i in group]
        return " / ".join(got)

    for (h, hkv, d) in ((8, 8, 128), GQA, GEMMA):
        for r in sorted(results, key=order):
            c = r["case"]
            if (c["impl"], c["h"], c["hkv"], c["d"], c["q_bits"], c["tier"], c["threads"],
                    c["rotate"], c["k_bits"], c["v_bits"]) != ("int8attn", h, hkv, d, 16, "", 0,
                                                               True, 8, 8):
                continue
            if h == hkv and c["regime"] == "hot" and c["queries"] == 1:
                continue                        # the seed's shape hot: the table above
            others = [find(results, impl=i, h=h, hkv=hkv, d=d, tokens=c["tokens"],
                           regime=c["regime"], queries=c["queries"], threads=0) for i in peers]
            if not any(others):
                continue
            what = (f"{c['queries']} queries over {c['tokens']}" if c["queries"] > 1
                    else f"{c['tokens']}, {'from DRAM' if c['regime'] == 'cold' else 'hot'}")
            ms = r["time"]["median"] * 1e3
            cell = f"{ms:.3g}" + (f" ({r['gflops']:.0f} GFLOP/s)" if c["queries"] > 1 else
                                  f" ({r['fraction_of_probe']:.2f} of probe)")
            if compact:
                cells = [ratios(("torch-fp32", "torch-bf16"), others, ms), ratios(VLLM, others, ms)]
            else:
                cells = [f"{o['time']['median'] * 1e3:.3g} ({o['time']['median'] * 1e3 / ms:.1f}x)"
                         if o else "" for o in others]
            rows.append([f"{h}/{hkv} x {d}", what, cell] + cells)
    if rows:
        head = ["heads x D", "context", "int8attn ms"]
        head += ["SDPA fp32 / bf16", "vLLM bf16 / fp32"] if compact else peers
        print(f"\nreal models' shapes{' (compact)' if compact else ''}: ms per call, medians (a "
              "peer's time over int8attn's):")
        print(_bench.markdown_table(head, rows, labels=2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset, in well under a minute")
    ap.add_argument("--models", action="store_true",
                    help="only the real models' shapes and their peers (README's speed table)")
    ap.add_argument("--out", help="report path (default benchmarks/results/<time>.json)")
    ap.add_argument("--budget", type=float, help="seconds of timing per case")
    args = ap.parse_args(argv)
    if vllm_available():
        _bench.RUNNERS.update(dict.fromkeys(VLLM, run_vllm))
    cases = quick_cases() if args.quick else models_cases() if args.models else full_cases()
    budget = args.budget or (0.25 if args.quick else 1.5)
    results = _bench.run_cases(cases, budget)
    whole = not (args.quick or args.models)
    costs = [studies.format_cost(s, 2 * budget) for s in SEED] if whole else []
    cpus = _bench.machine_info()["affinity_cpus"]
    busy = range(cpus + 1) if whole else (0, cpus) if args.quick else ()
    load = [studies.contention(s, b, budget) for b in busy for s in (512, 8192)]
    rep = _bench.report(results, {"quick": args.quick, "models": args.models, "budget_s": budget})
    rep["format_cost"] = costs
    rep["contention"] = load
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   rep["created"].replace(":", "") + ".json")
    _bench.write_json(rep, out)
    m = rep["machine"]
    print(f"int8attn {rep['versions']['int8attn']} commit {rep['commit']}; {m['cpu']} "
          f"({m['affinity_cpus']} CPUs); tier {rep['tier']}; threads {rep['threads']}")
    print_table(results)
    print_rotation(results, rep["tier"], costs)
    print_contention(load)
    print_models(results)
    print_models(results, compact=True)
    print_targets(results, rep["tier"], load)
    print(f"\nreport: {out}")


if __name__ == "__main__":
    main()
