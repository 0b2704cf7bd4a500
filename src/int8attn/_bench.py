"""Benchmark machinery shared by ``python -m int8attn bench`` and ``benchmarks/run.py``.

Every timed figure is the time of one decode call from Python (call overhead included), taken
many times; a case reports min / median / max. Beside each int8attn case the same run measures
the physical limit: a streaming read of exactly the bytes the decode reads (K and V codes and
scales of every kv head and token), with the same caches, regime and thread count.

Regimes: ``hot`` decodes one cache again and again (it stays in the caches of the CPU as far as it
fits); ``cold`` decodes a round robin of caches whose total is at least eight times the last-level
cache, like the layers of a model, so every decode streams from memory.
"""

import contextlib
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

from . import (FORMATS, Int8KVCache, KVCache, __version__, get_num_threads, isa, set_num_threads,
               supported_isas)
from . import _cache
from .reference import attention

IMPLS = ("int8attn", "numpy-fp32", "torch-fp32", "torch-bf16", "torch-fp16")


@dataclasses.dataclass(frozen=True)
class Case:
    impl: str               # one of IMPLS
    h: int                  # query heads
    hkv: int                # kv heads
    d: int                  # head dim
    tokens: int             # context length
    regime: str = "hot"     # "hot" or "cold"
    q_bits: int = 16        # int8attn only
    tier: str = ""          # int8attn only; "" = the default tier
    threads: int = 0        # 0 = the default thread count
    rotate: bool = True     # int8attn only: the default format (rotated, position 0 and the
                            # recent window kept as floats); False: the seed's plain format
    k_bits: int = 8         # int8attn only: a KVCache with K and V at these bits (8 or 4)
    v_bits: int = 8
    queries: int = 1        # > 1: a prompt chunk of that many queries after the `tokens` cached
                            # ones (int8attn: prefill, the rows appended and truncated away
                            # again between calls, untimed; the others: causal attention of the
                            # queries over tokens + queries positions); hot only

    @property
    def name(self):
        """Stable id of the case: what the regression gate matches reports by."""
        parts = [self.impl, f"h{self.h}", f"kv{self.hkv}", f"d{self.d}", f"s{self.tokens}"]
        parts += ([f"T{self.queries}"] if self.queries > 1 else []) + [self.regime]
        if self.impl == "int8attn":
            parts += [f"q{self.q_bits}", self.tier or "default"] + ([] if self.rotate else ["plain"])
            if (self.k_bits, self.v_bits) != (8, 8):
                parts.append(f"k{self.k_bits}v{self.v_bits}")
        parts.append(f"t{self.threads}" if self.threads else "tdefault")
        return "/".join(parts)

    @property
    def flops(self):
        """Attention's floating-point operations: 4 D per (query head, visible position)
        (the two products with K and V, a multiply and an add each)."""
        t = self.queries
        seen = t * self.tokens + t * (t + 1) // 2 if t > 1 else self.tokens
        return 4 * self.d * self.h * seen


def _cache_for(case):
    """An empty cache of the case's format: the default, or the seed's plain one; a KVCache with
    the case's bits (its defaults otherwise) when a side is at 4 bits."""
    if (case.k_bits, case.v_bits) != (8, 8):
        return KVCache(case.hkv, case.tokens, case.d, k_bits=case.k_bits, v_bits=case.v_bits)
    return Int8KVCache(case.hkv, case.tokens, case.d,
                       **FORMATS["default" if case.rotate else "plain"])


# The buffers a decode streams (the store's names, KVCache._buffers): the codes and scales, K's
# groups at 4 bits and V's minima; not the float rows of position 0, the offsets or the ring.
_STREAMED = ("k_codes", "k_scale", "k4", "k4_wide", "k4_min", "k4_step", "k4_min_scale",
             "k4_step_scale", "v_codes", "v_scale", "v4", "v4_min")


def cache_bytes(case):
    """Bytes a decode of the case's cache reads: the streamed buffers of a cache holding just
    the case's tokens, as the store lays them out."""
    buffers = _cache_for(case)._buffers()
    return sum(size for name, (_, _, size) in buffers.items() if name in _STREAMED)


def llc_bytes(base="/sys/devices/system/cpu/cpu0/cache"):
    """Size of the last-level cache (Linux sysfs), 32 MiB when it cannot be read."""
    best = 0
    try:
        entries = os.listdir(base)
    except OSError:
        entries = []
    for entry in entries:                 # index0, index1, ...; other files (uevent) have no size
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError, IndexError):
            continue
    return best or 32 << 20


def markdown_table(header, rows, labels=3):
    """A markdown table: header cells, then rows of cells (the first `labels` columns left-
    aligned, the numbers after them right-aligned)."""
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if i < labels else "---:" for i in range(len(header)))
             + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def cold_copies(nbytes, share=1):
    """How many separate caches of nbytes make a working set of at least eight last-level
    caches (a VM's vCPUs may sit on different dies, each with its own last-level cache), at
    least 2. share: how many implementations interleave their calls, each with its own copies:
    all of theirs pass between two calls on one copy, so each needs 1 / share of the set (with
    8 of them each holding 8x, a 480 MiB last-level cache asked for 30 GiB)."""
    return max(2, math.ceil(8 * llc_bytes() / share / nbytes))


def _timed(fn, copies, min_reps, budget):
    """Time fn(i) over the copies round robin: at least min_reps calls, about `budget` seconds,
    after a warm-up of a tenth of the budget (at least 3 calls: caches, pool, clock speed)."""
    start, i = time.perf_counter(), 0
    while i < 3 or time.perf_counter() - start < budget / 10:
        fn(i % copies)
        i += 1
    times = []                # i runs on: a cold round robin never meets a copy it just read
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget and len(times) < 100000):
        t0 = time.perf_counter()
        fn(i % copies)
        times.append(time.perf_counter() - t0)
        i += 1
    return times


def _stats(times):
    t = np.asarray(times)
    return {"min": float(t.min()), "median": float(np.median(t)), "max": float(t.max()), "n": len(t)}


def _data(case, rng):
    """k, v [S, Hkv, D] and q [H, D]; with T > 1 queries, S = tokens + T and q [T, H, D] (the
    last T positions')."""
    extra = case.queries if case.queries > 1 else 0
    k = rng.standard_normal((case.tokens + extra, case.hkv, case.d), dtype=np.float32)
    v = rng.standard_normal((case.tokens + extra, case.hkv, case.d), dtype=np.float32)
    q = rng.standard_normal(((extra,) if extra else ()) + (case.h, case.d), dtype=np.float32)
    return k, v, q


@contextlib.contextmanager
def _setting(get, set_, value):
    """Set a process-wide setting for one case (when value is truthy), restore it after;
    yields the value in force."""
    before = get()
    if value:
        set_(value)
    try:
        yield get()
    finally:
        set_(before)


def _rel_err(got, ref):
    """The error of a decode's output [H, D] against its reference: max over query heads of
    max|got - ref| / max|ref| (the contract's measure)."""
    return float(np.max(np.max(np.abs(got - ref), axis=1) / np.max(np.abs(ref), axis=1)))


def run_prefill(case, budget, rng):
    """A prompt chunk over the cache: ``prefill`` of the case's T rows and queries into a cache
    holding `tokens`, timed; ``truncate(tokens)`` between calls, untimed."""
    k, v, q = _data(case, rng)
    s, t = case.tokens, case.queries
    cache = _cache_for(dataclasses.replace(case, tokens=s + t))
    cache.append(k[:s], v[:s])
    out = np.empty_like(q)
    times = []
    with _setting(isa, _cache._set_isa, case.tier) as tier, \
            _setting(get_num_threads, set_num_threads, case.threads) as max_threads:
        got = cache.prefill(k[s:], v[s:], q, q_bits=case.q_bits)
        start, i = time.perf_counter(), 0
        while i < 5 or time.perf_counter() - start < budget:
            cache.truncate(s)
            t0 = time.perf_counter()
            cache.prefill(k[s:], v[s:], q, q_bits=case.q_bits, out=out)
            times.append(time.perf_counter() - t0)
            i += 1
        used = _cache._plan(cache, case.h, t)["threads"]
    err = 0.0       # three queries, each against what a cache cut after it dequantizes to
    for i in (0, t // 3, t - 1):
        cut = _cache_for(dataclasses.replace(case, tokens=s + i + 1))
        cut.append(k[:s + i + 1], v[:s + i + 1])
        ref = attention(q[i], *cut.dequantize())
        err = max(err, _rel_err(got[i], ref))
    dec = _stats(times[1:])
    return {"tier": tier, "threads": used, "max_threads": max_threads, "copies": 1,
            "bytes": cache_bytes(case), "time": dec, "gbps": cache_bytes(case) / dec["median"] / 1e9,
            "gflops": case.flops / dec["median"] / 1e9, "error_vs_reference": err}


def run_int8attn(case, budget, rng):
    if case.queries > 1:
        return run_prefill(case, budget, rng)
    k, v, q = _data(case, rng)
    nbytes = cache_bytes(case)
    copies = cold_copies(nbytes) if case.regime == "cold" else 1
    caches = []
    for _ in range(copies):
        c = _cache_for(case)
        c.append(k, v)
        caches.append(c)
    out = np.empty((case.h, case.d), np.float32)
    with _setting(isa, _cache._set_isa, case.tier) as tier, \
            _setting(get_num_threads, set_num_threads, case.threads) as max_threads:
        used = _cache._plan(caches[0], case.h)["threads"]
        got = caches[0].decode(q, q_bits=case.q_bits)
        decode = _timed(lambda i: caches[i].decode(q, q_bits=case.q_bits, out=out), copies, 20, budget)
        probe = _timed(lambda i: _cache._stream_read(caches[i], used), copies, 20, budget)
        # append: the whole context in one call (prefill), then one token at a time
        spare = _cache_for(case)
        bulk = _timed(lambda i: (spare.reset(), spare.append(k, v)), 1, 3, budget / 4)
        one = _timed(lambda i: (spare.reset(), spare.append(k[0], v[0])), 1, 20, budget / 8)
    ref = attention(q, *caches[0].dequantize())
    err = _rel_err(got, ref)
    dec, prb = _stats(decode), _stats(probe)
    return {
        "tier": tier, "threads": used, "max_threads": max_threads, "copies": copies,
        "bytes": nbytes, "time": dec, "probe_time": prb,
        "gbps": nbytes / dec["median"] / 1e9, "probe_gbps": nbytes / prb["median"] / 1e9,
        "fraction_of_probe": prb["median"] / dec["median"], "error_vs_reference": err,
        "append_all_time": _stats(bulk), "append_one_time": _stats(one),
    }


def run_numpy(case, budget, rng):
    """fp32 attention in numpy (its BLAS) over a float32 copy of the dequantized cache."""
    k, v, q = _data(case, rng)
    c = Int8KVCache(case.hkv, case.tokens, case.d)
    c.append(k, v)
    kd, vd = c.dequantize()
    kd = np.ascontiguousarray(kd.transpose(1, 0, 2))          # [Hkv, S, D]
    vd = np.ascontiguousarray(vd.transpose(1, 0, 2))
    nbytes = 2 * kd.nbytes
    copies = cold_copies(nbytes) if case.regime == "cold" else 1
    sets = [(kd, vd)] + [(kd.copy(), vd.copy()) for _ in range(copies - 1)]
    qg = q.reshape(case.hkv, case.h // case.hkv, case.d)
    scale = np.float32(1 / math.sqrt(case.d))

    def step(i):
        kk, vv = sets[i]
        logits = np.matmul(qg, kk.transpose(0, 2, 1)) * scale
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        return np.matmul(p, vv)

    times = _timed(step, copies, 10, budget)
    dec = _stats(times)
    return {"copies": copies, "bytes": nbytes, "time": dec, "gbps": nbytes / dec["median"] / 1e9}


def torch_available():
    try:
        import torch  # noqa: F401
        return True
    except Exception:      # absent, or an install that does not load
        return False


def run_torch(case, budget, rng):
    """torch SDPA over a float cache ([1, Hkv, S, D]) in the impl's dtype, GQA by enable_gqa."""
    import torch
    import torch.nn.functional as F

    dtype = {"torch-fp32": torch.float32, "torch-bf16": torch.bfloat16,
             "torch-fp16": torch.float16}[case.impl]
    k, v, q = _data(case, rng)
    kt = torch.from_numpy(np.ascontiguousarray(k.transpose(1, 0, 2)))[None].to(dtype)
    vt = torch.from_numpy(np.ascontiguousarray(v.transpose(1, 0, 2)))[None].to(dtype)
    kw = {"enable_gqa": True} if case.h != case.hkv else {}
    if case.queries > 1:                    # [1, H, T, D], query t sees positions <= tokens + t
        qt = torch.from_numpy(np.ascontiguousarray(q.transpose(1, 0, 2)))[None].to(dtype)
        t, s = case.queries, case.tokens
        kw["attn_mask"] = torch.from_numpy(np.arange(s + t)[None, :] <= s + np.arange(t)[:, None])
    else:
        qt = torch.from_numpy(q)[None, :, None, :].to(dtype)
    nbytes = 2 * kt.numel() * kt.element_size()
    copies = cold_copies(nbytes) if case.regime == "cold" else 1
    sets = [(kt, vt)] + [(kt.clone(), vt.clone()) for _ in range(copies - 1)]
    before = torch.get_num_threads()
    torch.set_num_threads(case.threads or get_num_threads())
    try:
        with torch.inference_mode():
            times = _timed(lambda i: F.scaled_dot_product_attention(qt, *sets[i], **kw),
                           copies, 10, budget)
    finally:
        torch.set_num_threads(before)
    dec = _stats(times)
    return {"copies": copies, "bytes": nbytes, "time": dec, "gbps": nbytes / dec["median"] / 1e9,
            "gflops": case.flops / dec["median"] / 1e9, "torch_version": torch.__version__}


# Runners by impl beside int8attn's, numpy's and torch's: benchmarks/run.py adds vLLM's kernels
# when vLLM is installed (a runner takes case, budget, rng and returns the case's result dict).
RUNNERS = {}


def run_case(case, budget=0.5, seed=0):
    rng = np.random.default_rng(seed)
    runner = {"int8attn": run_int8attn, "numpy-fp32": run_numpy, **RUNNERS}.get(case.impl,
                                                                                 run_torch)
    result = runner(case, budget, rng)
    return {"name": case.name, "case": dataclasses.asdict(case), **result}


def machine_info():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {"machine": platform.machine(), "system": platform.system(), "cpu": model,
            "cpus": os.cpu_count(), "affinity_cpus": affinity, "llc_bytes": llc_bytes(),
            "node": platform.node()}


def versions():
    out = {"python": platform.python_version(), "numpy": np.__version__, "int8attn": __version__}
    if torch_available():
        import torch
        out["torch"] = torch.__version__
    return out


def git_commit(path=None):
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=path or os.getcwd(), timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=path or os.getcwd(), timeout=10)
        if r.returncode == 0:
            return r.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def report(cases_results, settings):
    return {
        "schema": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "versions": versions(),
        "commit": git_commit(),
        "tier": isa(),
        "supported_tiers": list(supported_isas()),
        "threads": get_num_threads(),
        "settings": settings,
        "cases": cases_results,
    }


class Progress:
    """One status line on stderr, rewritten in place when stderr is a terminal."""

    def __init__(self, total, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.tty = stream.isatty()
        self.start = time.perf_counter()

    def step(self, label):
        self.done += 1
        elapsed = time.perf_counter() - self.start
        line = f"[{self.done}/{self.total}] {elapsed:5.1f}s {label}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def run_cases(cases, budget, seed=0, progress=True):
    bar = Progress(len(cases)) if progress else None
    results = []
    for case in cases:
        if bar:
            bar.step(case.name)
        results.append(run_case(case, budget, seed))
    if bar:
        bar.close()
    return results


def write_json(obj, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
