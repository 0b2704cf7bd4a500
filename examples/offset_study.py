"""Why the default format's offsets cost quality where they do (issue 41): Gemma 3 270M.

    pip install '.[examples]'
    python examples/offset_study.py drift [--text T] [--at 1879]
    python examples/offset_study.py layers [--text T] [--limit 1900]
    python examples/offset_study.py sides [--text T] [--limit 1900]
    python examples/offset_study.py young [--text T] [--limit 1900]
    python examples/offset_study.py hf [--text T] [--limit 1900]     # pip install '.[hf,examples]'
    python examples/offset_study.py layers --text /usr/share/common-licenses/GPL-3 --bytes 14000 --limit 2000

``drift``: per layer, the fp32 model's K and V rows as the cache would center them: the norm of
the offset (the mean of positions 1 .. 64, as the default format sets it), of the mean of the
rows a query at position ``--at`` sees (its sliding window, or all of them), of their
difference, and the rows' mean largest |value| after centering over before (below 1: centering
narrows the rows the codes cover; above 1: it widens them). K is taken after RoPE, as the cache
stores it; the last column is K's |offset - mean seen| before RoPE (its rows turned back).

``layers``: the report of ``examples/gemma3.py --compare`` for caches that center in some
layers only (the others ``recent``): all, none, the global layers, the sliding-window layers,
layers 0-5, 6-11, 12-17.

``sides``: the same for centering K only or V only, emulated (``examples/kv_formats.py``'s
EmulatedCache: the cache's rules in numpy), beside the emulated ``recent`` and ``default``.

``young``: offsets per chunk of 256 positions, each the mean of the 64 rows before its chunk
(chunk 0: positions 1 .. 64, as now), for K and V or for K alone, emulated, beside ``default``.

``hf``: ``recent`` and ``default`` through transformers (``int8attn.hf.Int8Cache``, the model from
the same GGUF in float32, its own tokenizer), the text teacher-forced in one ``model(...)`` call
(int8attn.hf decodes a prefill in chunks of at most 64 queries), against the fp32
``DynamicCache``; the same report (KL over the whole vocabulary; benchmarks/hf_generate.py's
teacher-forced run and KL, so it needs benchmarks/ beside examples/).
"""

import argparse
import os
import sys
import tempfile

import numpy as np

import int8attn as ia

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gemma3 as G  # noqa: E402
import kv_formats as KF  # noqa: E402


def drift(model, text, at):
    ids = model.tokenizer.encode(open(text, encoding="utf-8").read())[:at + 1]
    caches = model.caches(len(ids), "fp32")
    for s in range(0, len(ids), 256):
        model.forward(ids[s:s + 256], s, caches)
    recent = ia.FORMATS["default"]["recent"]
    print(f"position {at}; per layer, K | V: |offset|, |mean seen|, |offset - mean seen|, "
          f"mean max|row| centered / raw | K before RoPE: |offset - mean seen|")
    pos = np.arange(len(ids))
    for i, c in enumerate(caches):
        lo = max(0, at + 1 - model.window) if model.local(i) else 0
        base = model.rope_local if model.local(i) else model.rope_global
        cells = []
        for x in (c.k[:, 0], c.v[:, 0], G.rope(c.k, -pos, base)[:, 0]):   # one kv head
            off, seen = x[1:1 + recent].mean(0), x[lo:at + 1]
            ratio = np.abs(seen - off).max(1).mean() / np.abs(seen).max(1).mean()
            cells.append(f"{np.linalg.norm(off):6.1f} {np.linalg.norm(seen.mean(0)):6.1f} "
                         f"{np.linalg.norm(off - seen.mean(0)):6.1f} {ratio:5.2f}")
        cells[2] = cells[2].split()[2]
        print(f"{i:3d} {'local ' if model.local(i) else 'global'}  " + "  |  ".join(cells))


def report(model, text, limit, variants):
    r = G.compare(model, text, limit=limit, variants=[("fp32", "fp32", {}), *variants],
                  progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"{r['positions']} positions after the first {r['first']}; top-1 / KL mean / KL "
          f"median; the largest KL (position: KL)")
    for name, row in r["rows"].items():
        worst = ", ".join(f"{p}: {k:.1e}" for p, k in row["worst"])
        print(f"  {name:<22} {row['top1']:.2%} / {row['kl_mean']:.2e} / {row['kl_median']:.2e}"
              f"   {worst}")


def centered_in(layers):
    """compare()'s cache factory: Int8KVCache per layer, the default format in `layers`, the
    window alone (recent) elsewhere."""
    def make(model, n, **_):
        return [ia.Int8KVCache(model.n_kv, n, model.head_dim,
                               **ia.FORMATS["default" if i in layers else "recent"])
                for i in range(model.n_layers)]
    return make


class Sided(KF.EmulatedCache):
    """An emulated cache whose offsets apply to one side only (sides: center K, center V)."""

    def __init__(self, *args, sides=(True, True), **kwargs):
        super().__init__(*args, **kwargs)
        self.sides = sides

    def _shift(self, n, side, n0, d):
        return super()._shift(n, side, n0, d) if self.sides[side] else 0


class Young(Sided):
    """An emulated cache whose offsets are per chunk of 256 positions: chunk c >= 1 is centered
    on the mean of positions 256 c - 64 .. 256 c - 1 (rows the ring holds as the chunk starts),
    chunk 0 on positions 1 .. 64's."""

    def _shift(self, n, side, n0, d):
        if self.offsets is None or not self.sides[side]:
            return super()._shift(n, side, n0, d)
        raw = (self.raw_k, self.raw_v)[side]
        pos = n0 + np.arange(n)
        shift = np.zeros((n,) + raw.shape[1:], np.float32)
        for c in np.unique(pos // 256):
            lo, hi = (1, 65) if c == 0 else (256 * c - 64, 256 * c)
            mean = raw[lo:hi].astype(np.float64).mean(0).astype(np.float32)
            shift[pos // 256 == c] = self._stored(mean[None] / d)[0]
        shift[pos == 0] = 0
        return shift


def sided(cls=Sided, **options):
    def make(model, n, **_):
        return [cls(model.n_kv, model.head_dim, **options) for _ in range(model.n_layers)]
    return make


def hf(text, limit, first=1000):
    """The hf study's report, from benchmarks/hf_generate.py's teacher-forced run and KL."""
    sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
    import torch
    from transformers import DynamicCache

    import hf_generate as HG
    import int8attn.hf as ih

    tok, model = HG.load_gemma(torch.float32)
    runs = {}
    for label, attn, make in (
            ("fp32", "sdpa", lambda m, n: DynamicCache(config=m.config)),
            ("recent", ih.NAME, lambda m, n: ih.Int8Cache(m.config, max_cache_len=n,
                                                          kv_format="recent")),
            ("default", ih.NAME, lambda m, n: ih.Int8Cache(m.config, max_cache_len=n,
                                                           kv_format="default"))):
        model.set_attn_implementation(attn)
        runs[label] = HG.teacher_forced(model, make, tok, first, text, limit)
        print(f"  {label} done", file=sys.stderr, flush=True)
    print(f"{runs['fp32'][0].shape[0]} positions after the first {first}; top-1 / KL mean / KL "
          f"median; the largest KL (position: KL)")
    for label in ("recent", "default"):
        agree, kl = (x.numpy() for x in HG.kl_rows(runs["fp32"], runs[label]))
        worst = ", ".join(f"{first + p}: {kl[p]:.1e}" for p in np.argsort(kl)[::-1][:3])
        print(f"  {label:<22} {agree.mean():.2%} / {kl.mean():.2e} / {np.median(kl):.2e}"
              f"   {worst}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", choices=["drift", "layers", "sides", "young", "hf"])
    ap.add_argument("--text", default=os.path.join(HERE, "quality_text.txt"))
    ap.add_argument("--limit", type=int, default=1900, help="the text's first N tokens")
    ap.add_argument("--at", type=int, default=1879, help="drift: the query's position")
    ap.add_argument("--bytes", type=int, default=None, help="the text's first N bytes")
    args = ap.parse_args(argv)
    if args.bytes:
        with open(args.text, "rb") as f:
            head = f.read(args.bytes)
        args.text = os.path.join(tempfile.mkdtemp(), os.path.basename(args.text))
        with open(args.text, "wb") as f:
            f.write(head)
    if args.study == "hf":
        return hf(args.text, args.limit)
    model = G.Gemma3(G.model_path())
    if args.study == "drift":
        return drift(model, args.text, args.at)
    if args.study == "layers":
        local = {i for i in range(model.n_layers) if model.local(i)}
        every = set(range(model.n_layers))
        groups = {"every layer (default)": every, "none (recent)": set(),
                  "global layers": every - local, "sliding layers": local,
                  "layers 0-5": set(range(6)), "layers 6-11": set(range(6, 12)),
                  "layers 12-17": set(range(12, 18))}
        return report(model, args.text, args.limit,
                      [(name, centered_in(layers), {}) for name, layers in groups.items()])
    d = ia.FORMATS["default"]
    if args.study == "young":
        return report(model, args.text, args.limit,
                      [("default", sided(**d), {}),
                       ("young K and V", sided(Young, **d), {}),
                       ("young K, V none", sided(Young, **d, sides=(True, False)), {})])
    report(model, args.text, args.limit,
           [("recent", sided(**ia.FORMATS["recent"]), {}), ("default", sided(**d), {}),
            ("K centered only", sided(**d, sides=(True, False)), {}),
            ("V centered only", sided(**d, sides=(False, True)), {})])


if __name__ == "__main__":
    main()
