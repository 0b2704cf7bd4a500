"""``python -m int8attn``: the decode at the seed's shape on this machine.

Prints the active tier, then for H = Hkv = 8, D = 128 at 512 / 2048 / 8192 tokens and each q_bits:
the error against fp32 attention over the dequantized cache (the kernel's error), the error against
fp32 attention over the unquantized K/V (what the int8 format costs), the median time of one
decode, and the bytes the history takes as int8 and as fp32.

``python -m int8attn bench [--plot FILE.png]``: the seed's table measured against this machine's
memory: time per decode, GB/s, the fraction of a same-run streaming-read probe over the same
bytes, and, with --plot, time against context for every tier and baseline (needs matplotlib).

``python -m int8attn kernels-layout OUT``: this install in the layout the Hugging Face kernels
library loads (see int8attn._kernels_layout).
"""

import argparse
import platform
import time

import numpy as np

from . import Int8KVCache, __version__, _cache, get_num_threads, isa, supported_isas
from .reference import attention


def rel_err(out, ref):
    """Worst query head of max|out - ref| / max|ref|."""
    num = np.max(np.abs(out.astype(np.float64) - ref), axis=1)
    return float(np.max(num / np.max(np.abs(ref), axis=1)))


def median_seconds(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def history_bytes(tokens, hkv, d, code_bytes):
    """K and V for `tokens` tokens: codes plus (for int8) one float32 scale per row; code_bytes
    2 and 4 are fp16 and fp32 caches (no scales)."""
    scales = 4 if code_bytes == 1 else 0
    return 2 * tokens * hkv * (d * code_bytes + scales)


def demo(contexts, heads, kv_heads, head_dim, repeats, seed):
    rng = np.random.default_rng(seed)
    print(f"int8attn {__version__} on {platform.machine()}: tier {isa()} "
          f"(supported: {', '.join(supported_isas())})")
    if _cache._amx() != "absent":
        print(f"AMX: the CPU has it; the OS {_cache._amx()} the tile data to this process")
    print(f"decode of H={heads} query heads over Hkv={kv_heads} kv heads, D={head_dim}, "
          f"gaussian K/V/q; median of {repeats} decodes\n")
    header = (f"{'tokens':>7} {'q_bits':>6} {'err vs dequant':>15} {'err vs fp32 K/V':>16} "
              f"{'ms/decode':>10} {'int8 MB':>8} {'fp32 MB':>8}")
    print(header)
    print("-" * len(header))
    for n in contexts:
        k = rng.standard_normal((n, kv_heads, head_dim), dtype=np.float32)
        v = rng.standard_normal((n, kv_heads, head_dim), dtype=np.float32)
        q = rng.standard_normal((heads, head_dim), dtype=np.float32)
        cache = Int8KVCache(kv_heads, n, head_dim)
        cache.append(k, v)
        ref_dq = attention(q, *cache.dequantize())
        ref_fp = attention(q, k, v)
        out = np.empty((heads, head_dim), np.float32)
        for q_bits in (16, 8):
            got = cache.decode(q, q_bits=q_bits)
            sec = median_seconds(lambda: cache.decode(q, q_bits=q_bits, out=out), repeats)
            print(f"{n:>7} {q_bits:>6} {rel_err(got, ref_dq):>15.2e} {rel_err(got, ref_fp):>16.2e} "
                  f"{sec * 1e3:>10.3f} {cache.nbytes / 1e6:>8.2f} "
                  f"{history_bytes(n, kv_heads, head_dim, 4) / 1e6:>8.2f}")
    print("\nerrors: per query head max|out - ref| / max|ref|, worst head; "
          "the contract for q_bits=16 is 1e-3 against the dequantized cache.")


def bench(contexts, regime, plot, budget):
    from . import _bench
    from ._bench import Case

    cases = [Case("int8attn", 8, 8, 128, n, regime, q_bits) for n in contexts for q_bits in (16, 8)]
    plot_cases = []
    if plot:
        span = [512, 1024, 2048, 4096, 8192, 16384, 32768]
        impls = ["numpy-fp32"] + (["torch-fp32", "torch-bf16"] if _bench.torch_available() else [])
        plot_cases = [Case("int8attn", 8, 8, 128, n, regime, 16, t) for t in supported_isas() for n in span]
        plot_cases += [Case(i, 8, 8, 128, n, regime) for i in impls for n in span]
    results = _bench.run_cases(cases + plot_cases, budget)
    head = results[0]
    print(f"int8attn {__version__} on {platform.machine()}: tier {head['tier']}, "
          f"{get_num_threads()} threads max; {regime} regime; H = Hkv = 8, D = 128; "
          f"median of each decode, probe = streaming read of the same bytes, same threads\n")
    header = (f"{'tokens':>7} {'q_bits':>6} {'threads':>7} {'ms/decode':>10} {'GB/s':>7} "
              f"{'probe GB/s':>10} {'of probe':>8} {'err vs ref':>10} {'int8 MB':>8} {'fp16 MB':>8} "
              f"{'fp32 MB':>8}")
    print(header)
    print("-" * len(header))
    for r in results[:len(cases)]:
        c = r["case"]
        n = c["tokens"]
        print(f"{n:>7} {c['q_bits']:>6} {r['threads']:>7} {r['time']['median'] * 1e3:>10.3f} "
              f"{r['gbps']:>7.1f} {r['probe_gbps']:>10.1f} {r['fraction_of_probe']:>8.2f} "
              f"{r['error_vs_reference']:>10.1e} {history_bytes(n, 8, 128, 1) / 1e6:>8.2f} "
              f"{history_bytes(n, 8, 128, 2) / 1e6:>8.2f} {history_bytes(n, 8, 128, 4) / 1e6:>8.2f}")
    if plot:
        draw(results[len(cases):], plot, regime)
        print(f"\nplot: {plot}")


def pyplot():
    """matplotlib's pyplot (non-interactive), or SystemExit saying how to install it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'int8attn[bench]'") from None
    return plt


def draw(results, path, regime):
    plt = pyplot()
    series = {}
    for r in results:
        c = r["case"]
        label = f"int8attn {r['tier']}" if c["impl"] == "int8attn" else c["impl"]
        series.setdefault(label, []).append((c["tokens"], r["time"]["median"] * 1e3))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in series.items():
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("ms per decode (median)")
    ax.set_title(f"decode, H = Hkv = 8, D = 128, {regime} regime, {platform.machine()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m int8attn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["demo", "bench", "kernels-layout"],
                        default="demo", help="demo (default): errors and times; bench: the "
                        "bandwidth table; kernels-layout OUT: a kernels-loadable folder")
    parser.add_argument("out", nargs="?", help="kernels-layout: the folder to write")
    parser.add_argument("--name", default="cpu-attn", help="kernels-layout: kernel name")
    parser.add_argument("--kernel-version", type=int, default=1, help="kernels-layout: version")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--heads", type=int, default=8, help="demo: query heads H (default 8)")
    parser.add_argument("--kv-heads", type=int, default=8, help="demo: kv heads Hkv (default 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="demo: head dim D (default 128)")
    parser.add_argument("--repeats", type=int, default=50, help="demo: timed decodes per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regime", choices=["hot", "cold"], default="hot",
                        help="bench: one cache decoded again and again (hot) or a round robin "
                             "of caches past the last-level cache (cold)")
    parser.add_argument("--plot", metavar="FILE.png", help="bench: also plot time vs context")
    parser.add_argument("--budget", type=float, default=0.4, help="bench: seconds per case")
    args = parser.parse_args(argv)
    if args.heads < 1 or args.kv_heads < 1 or args.heads % args.kv_heads:
        parser.error(f"--heads must be a positive multiple of --kv-heads (GQA), got "
                     f"--heads {args.heads} --kv-heads {args.kv_heads}")
    if args.head_dim % 16 or not 16 <= args.head_dim <= 1024:
        parser.error(f"--head-dim must be a multiple of 16 from 16 to 1024, got {args.head_dim}")
    if min(args.contexts) < 1 or args.repeats < 1:
        parser.error("--contexts and --repeats must be positive")
    if args.command == "bench" and args.plot:
        pyplot()                    # before minutes of measuring, not after
    if args.command == "kernels-layout":
        if not args.out:
            parser.error("kernels-layout needs the folder to write: kernels-layout OUT")
        from ._kernels_layout import write_layout
        print(write_layout(args.out, args.name, args.kernel_version))
    elif args.command == "bench":
        bench(args.contexts, args.regime, args.plot, args.budget)
    else:
        demo(args.contexts, args.heads, args.kv_heads, args.head_dim, args.repeats, args.seed)


if __name__ == "__main__":
    main()
