"""``python -m int8attn``: the decode at the seed's shape on this machine.

Prints the active tier, then for H = Hkv = 8, D = 128 at 512 / 2048 / 8192 tokens and each q_bits:
the error against fp32 attention over the dequantized cache (the kernel's error), the error against
fp32 attention over the unquantized K/V (what the int8 format costs), the median time of one
decode, and the bytes the history takes as int8 and as fp32.
"""

import argparse
import platform
import time

import numpy as np

from . import Int8KVCache, __version__, isa, supported_isas
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
    """K and V for `tokens` tokens: codes plus (for int8) one float32 scale per row."""
    scales = 4 if code_bytes == 1 else 0
    return 2 * tokens * hkv * (d * code_bytes + scales)


def demo(contexts, heads, kv_heads, head_dim, repeats, seed):
    rng = np.random.default_rng(seed)
    print(f"int8attn {__version__} on {platform.machine()}: tier {isa()} "
          f"(supported: {', '.join(supported_isas())})")
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
                  f"{sec * 1e3:>10.3f} {history_bytes(n, kv_heads, head_dim, 1) / 1e6:>8.2f} "
                  f"{history_bytes(n, kv_heads, head_dim, 4) / 1e6:>8.2f}")
    print("\nerrors: per query head max|out - ref| / max|ref|, worst head; "
          "the contract for q_bits=16 is 1e-3 against the dequantized cache.")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m int8attn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--heads", type=int, default=8, help="query heads H (default 8)")
    parser.add_argument("--kv-heads", type=int, default=8, help="kv heads Hkv (default 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim D (default 128)")
    parser.add_argument("--repeats", type=int, default=50, help="timed decodes per row")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    demo(args.contexts, args.heads, args.kv_heads, args.head_dim, args.repeats, args.seed)


if __name__ == "__main__":
    main()
