"""The benchmark suite's two studies beside its cases (benchmarks/run.py): the formats' decode
cost, their decodes interleaved, and the decode under load (busy-loop processes on the CPUs, one
thread against the default count)."""

import contextlib
import subprocess
import sys
import time

import numpy as np

import int8attn as ia
from int8attn import _bench


def interleaved(fns, min_reps, budget):
    """Time each of fns in rounds: per round, each fn in turn is called twice and the second call
    timed, so it runs hot (after itself) however large the others' data, and the fns' timed calls
    lie microseconds apart: a drift of the machine's speed lands on every fn alike. Three
    untimed rounds first. Returns one list of times per fn."""
    for _ in range(3):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    start, r = time.perf_counter(), 0
    while r < min_reps or (time.perf_counter() - start < budget and r < 100000):
        for fn, t in zip(fns, times):
            fn()
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        r += 1
    return times


def format_cost(tokens, budget, h=8, hkv=8, d=128, seed=0, pairs=4,
                formats=("default", "centered", "plain")):
    """Decode time of the named formats (int8attn.FORMATS) on the same K/V, their decodes
    interleaved (hot: see interleaved; q_bits=16, the default tier and threads), over `pairs`
    fresh sets of caches a share of the budget each (where the buffers land moves one set's
    ratio by several percent at 8192 tokens on this VM). ``ratio[name]`` is the median over all
    rounds of name's time / the first format's."""
    case = _bench.Case("int8attn", h, hkv, d, tokens)
    k, v, q = _bench._data(case, np.random.default_rng(seed))
    out = np.empty((h, d), np.float32)
    times = {name: [] for name in formats}
    for _ in range(pairs):
        caches = [ia.Int8KVCache(hkv, tokens, d, **ia.FORMATS[name]) for name in formats]
        for c in caches:
            c.append(k, v)
        got = interleaved([lambda c=c: c.decode(q, out=out) for c in caches], 10, budget / pairs)
        for name, t in zip(formats, got):
            times[name] += t
    first = times[formats[0]]
    return {"tokens": tokens, "h": h, "hkv": hkv, "d": d, "pairs": pairs,
            "formats": list(formats),
            "time": {name: _bench._stats(t) for name, t in times.items()},
            "ratio": {name: float(np.median(np.divide(first, t))) for name, t in times.items()}}


@contextlib.contextmanager
def busy_processes(n):
    """n processes that each keep one CPU busy (a Python busy loop) while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.3 if n else 0.0)                # let them start spinning
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a busy-loop process did not start")
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def contention(tokens, busy, budget, h=8, hkv=8, d=128, seed=0, blocks=10):
    """Decode with one thread and with the default thread count while `busy` busy-loop processes
    hold CPUs (0 = an idle machine). The thread counts alternate in blocks of calls (a tenth of
    the budget each, its first calls untimed), so both meet the same load while neither's calls
    follow the other's directly (a pool's idle workers then spin or sleep as in a run of that
    count alone). ``ratio`` is the default's median time over the one thread's."""
    case = _bench.Case("int8attn", h, hkv, d, tokens)
    k, v, q = _bench._data(case, np.random.default_rng(seed))
    cache = _bench._cache_for(case)
    cache.append(k, v)
    out = np.empty((h, d), np.float32)
    n = ia.get_num_threads()
    times = {1: [], n: []}
    try:
        with busy_processes(busy):
            for _ in range(blocks):
                for t in times:
                    ia.set_num_threads(t)
                    times[t] += _bench._timed(lambda i: cache.decode(q, out=out), 1, 5,
                                       budget / blocks / 2)
    finally:
        ia.set_num_threads(n)
    one, default = _bench._stats(times[1]), _bench._stats(times[n])
    return {"tokens": tokens, "busy": busy, "threads": n, "one": one, "default": default,
            "ratio": default["median"] / one["median"]}
