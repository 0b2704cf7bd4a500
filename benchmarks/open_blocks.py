"""What a pool's open blocks cost a decode: ``PagedKVCache.attend`` of one query over a
sequence whose last block is being written, with ``open_blocks`` (its rows read as fp16) and
without (every row from its codes), the two pools' calls interleaved.

    python benchmarks/open_blocks.py [--rounds N] [--threads T ...]

Each case puts a sequence of ``blocks * 128 + open`` positions in a pool of blocks of 128, so
the query reads ``open`` rows of its own block as halves (1 to 127; the mean over a block is
64); the figures are medians of one run, hot (the sequence fits the last-level cache here), the
ratio the median of the rounds' ratios. Prints a markdown table.
"""
import argparse
import time

import numpy as np

import int8attn as ia
from int8attn._bench import markdown_table

BLOCK = 128
SHAPES = [(8, 8, 128), (32, 8, 128), (4, 1, 256)]
CASES = [(16, 1), (16, 64), (16, 127)]          # (full blocks, rows of the open one)


def pools(h, hkv, d, n, rng):
    """Two pools holding the same n rows (one sequence, its blocks in order), without and with
    open blocks; the table, the query and an output array."""
    nb = -(-n // BLOCK)
    k = rng.standard_normal((n, hkv, d), dtype=np.float32)
    v = rng.standard_normal((n, hkv, d), dtype=np.float32)
    out = {}
    for name, entries in (("codes", 0), ("open", 2)):
        pool = ia.PagedKVCache(hkv, d, BLOCK, nb, open_blocks=entries)
        pool.write(np.arange(n, dtype=np.int64), k, v)
        out[name] = pool
    q = rng.standard_normal((1, h, d), dtype=np.float32)
    return out, np.arange(nb, dtype=np.int32)[None], q, np.empty_like(q)


def measure(h, hkv, d, n, rounds, rng):
    ps, table, q, out = pools(h, hkv, d, n, rng)
    args = (np.array([0, 1], np.int32), np.array([n], np.int32), table)
    times = {name: [] for name in ps}
    for r in range(rounds + 50):                  # the first 50 rounds warm up
        for name, pool in ps.items():
            t = time.perf_counter()
            pool.attend(q, *args, out=out)
            if r >= 50:
                times[name].append(time.perf_counter() - t)
    ratio = float(np.median(np.divide(times["open"], times["codes"])))
    return {name: float(np.median(t)) for name, t in times.items()}, ratio


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    before = ia.get_num_threads()
    try:
        for threads in args.threads:
            ia.set_num_threads(threads)
            for h, hkv, d in SHAPES:
                for full, opened in CASES:
                    n = full * BLOCK + opened
                    med, ratio = measure(h, hkv, d, n, args.rounds, rng)
                    rows.append([f"{h}/{hkv} x {d}", str(n), str(opened), str(threads),
                                 f"{med['codes'] * 1e6:.1f}", f"{med['open'] * 1e6:.1f}",
                                 f"{ratio:.3f}"])
    finally:
        ia.set_num_threads(before)
    print(f"int8attn {ia.__version__}, tier {ia.isa()}: one decode, us (medians of "
          f"{args.rounds} interleaved rounds, hot)")
    print(markdown_table(["H/Hkv x D", "tokens", "rows open", "threads", "codes", "open blocks",
                          "open / codes"], rows, labels=4))


if __name__ == "__main__":
    main()
