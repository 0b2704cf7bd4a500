"""What each integer plane buys on real activations: Gemma 3 270M's attention, emulated in numpy.

    pip install '.[examples]'
    python examples/plane_study.py [--every 256] [--limit N]

The decode's arithmetic is integer dots over planes: q in two int8 planes (``q_bits=16``; one with
``q_bits=8``) against K's codes, and each chunk's softmax weights in 7-bit planes against V's
codes (docs/architecture.md, the math contract: with V at 8 bits, two planes and the chunk's
largest weight in float, chosen by this study; three planes of every weight before issue 31).
Per query head and K/V row those planes of dot products, not the bytes, set the speed at
grouped-query shapes. This study measures what each plane buys where it matters, on Gemma 3's
own queries and caches: the text of the quality report (examples/quality_text.txt) goes through
the numpy model of examples/gemma3.py on int8 caches in ``FORMATS["recent"]`` (the rows rotated,
position 0 and the newest 64 positions kept as floats, no offsets: the paged pool's format), and
at every ``--every``-th position from 1024 on, each layer's last query is attended again by
``int8attn.reference.emulate`` under each variant of the planes below, against float attention
over the same cache's dequantized history (the contract's reference; a sliding-window layer
over its last 512 positions). Reported per variant: the largest error over layers and positions
(max over query heads of max|out - ref| / max|ref|, the contract's measure, whose bound is
1e-3), the median, and the layer and position of the largest.

Variants of the weights' planes (per chunk of 256 positions and query head): ``w3`` three planes
of every weight; ``w2`` two; ``w2+top`` two planes of every weight but the chunk's largest, which
is kept exact (the contract at 8 bits); ``w1+top`` one plane so; ``w exact`` the weights
unrounded (what the planes approximate). Of q's planes: ``q2`` (``q_bits=16``) and ``q1``
(``q_bits=8``). The kernel's own output (``w2+top q2``) is reported beside the emulation of the
same variant: they agree on the global layers; on a sliding-window layer the emulation cuts its
chunks from the window's first position where the kernel cuts them at multiples of 256, so each
chunk's top weight differs (at 2100 tokens, layer 16: 2.8e-4 emulated, 3.8e-4 the kernel). The model's forward runs on the installed kernel, so the queries and caches, and
the figures, move a little with the kernel's own rule: docs/architecture.md quotes the run that
chose the rule, on the three-plane kernel (w3 max 2.87e-4, w2+top 2.85e-4, w2 7.0e-4); on the
two-plane kernel the same command gives 3.06e-4, 3.06e-4 and 6.4e-4.
"""

import argparse
import contextlib
import functools
import os
import sys
import time
import types

import numpy as np

import int8attn as ia
from int8attn import reference as R

REFERENCE_PLANES = R.weight_planes             # the reference's, before any variant is set

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gemma3  # noqa: E402  (the numpy model beside this file)


def planes(n, top_exact=False):
    """The weights' integer planes: n planes of 0 .. 127, each 127 times finer than the one
    before (the last rounded to nearest, the others floored), scaled to the chunk's largest
    weight; with top_exact, the largest weight of each row is kept exact and the planes scale
    to the next largest (int8attn.reference.weight_planes with these settings)."""
    return functools.partial(REFERENCE_PLANES, planes=n, top_exact=top_exact)


def exact(w):
    """The weights as they are (no planes): what the planes approximate."""
    return np.asarray(w, np.float64)


VARIANTS = {                                   # name: (q_bits, the weights' planes)
    "w exact, q2": (16, exact),
    "w3 q2": (16, planes(3)),
    "w3 q1": (8, planes(3)),
    "w2 q2": (16, planes(2)),
    "w2+top q2 (contract)": (16, planes(2, True)),
    "w1+top q2": (16, planes(1, True)),
    "w2+top q1": (8, planes(2, True)),
}


@contextlib.contextmanager
def weight_planes(fn):
    before = R.weight_planes
    R.weight_planes = fn
    try:
        yield
    finally:
        R.weight_planes = before


def window_view(cache, last):
    """The cache seen by a query whose sliding window holds its `last` positions: the codes and
    scales of those positions (no float position 0: it lies outside), the recent window's floats
    as they are."""
    state = cache.state_dict()
    n = len(cache)

    def state_dict():
        return {"k_recent": state["k_recent"], "v_recent": state["v_recent"], "length": last,
                "keep_first": False}

    return types.SimpleNamespace(
        rotate=cache.rotate, rotation_seed=cache.rotation_seed, recent=cache.recent,
        k_i8=cache.k_i8[:, n - last:], k_scale=cache.k_scale[:, n - last:],
        v_i8=cache.v_i8[:, n - last:], v_scale=cache.v_scale[:, n - last:],
        keep_first=False, center=False, state_dict=state_dict)


def study(model, text, every, limit=None, progress=None, fmt="recent"):
    """{variant: [(error, layer, position)]} and the kernel's own errors, over every layer at
    every `every`-th position from 1024 on (module docstring)."""
    ids = model.tokenizer.encode(open(text, encoding="utf-8").read())[:limit]
    n, first, step = len(ids), 1024, 64
    caches = model.caches(n, "int8", **ia.FORMATS[fmt])
    errs = {name: [] for name in VARIANTS}
    kernel = []
    at = set(range(first + every, n + 1, every)) | {n}

    def record(i, q, a):
        e = record.end
        if e not in at:
            return
        c = caches[i]
        view = window_view(c, model.window) if model.local(i) and e > model.window else c
        if view is not c and c.center:
            raise ValueError("a window's view of a cache with offsets is not emulated here")
        kd, vd = c.dequantize()
        if view is not c:
            kd, vd = kd[-model.window:], vd[-model.window:]
        ref = R.attention(q[-1], kd, vd, scale=model.scale)
        kernel.append(gemma3.rel_err(a[-1], ref))
        for name, (q_bits, fn) in VARIANTS.items():
            with weight_planes(fn):
                out = R.emulate(q[-1], view, scale=model.scale, q_bits=q_bits)
            errs[name].append((gemma3.rel_err(out, ref), i, e - 1))

    t0 = time.perf_counter()
    bounds = [0, *range(first, n, step), n]
    for s, e in zip(bounds[:-1], bounds[1:]):
        record.end = e
        model.forward(ids[s:e], s, caches, record)
        if progress and e in at:
            progress(f"[{time.perf_counter() - t0:6.1f} s] position {e - 1} of {n}")
    return errs, kernel, n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", default=os.path.join(HERE, "quality_text.txt"))
    ap.add_argument("--every", type=int, default=256, help="positions between two looks")
    ap.add_argument("--limit", type=int, default=None, help="the text's first N tokens only")
    ap.add_argument("--format", default="recent", choices=["recent", "keep_first", "rotated",
                                                           "plain"],
                    help="the caches' FORMATS entry (those without offsets)")
    args = ap.parse_args(argv)
    model = gemma3.Gemma3(gemma3.model_path())
    errs, kernel, n = study(model, args.text, args.every, args.limit,
                            progress=lambda m: print(m, file=sys.stderr, flush=True),
                            fmt=args.format)
    looks = len(next(iter(errs.values())))
    print(f"Gemma 3 270M, format {args.format}, {n} tokens, {looks} looks (layer x position); "
          f"error of the attention output against float attention over the dequantized history "
          f"(contract: 1e-3)")
    print(f"  {'variant':<22} {'max':>9} {'median':>9} {'> 1e-3':>7}  worst (layer, position)")
    for name, rows in errs.items():
        e = np.array([r[0] for r in rows])
        worst = rows[int(np.argmax(e))]
        print(f"  {name:<22} {e.max():>9.2e} {np.median(e):>9.2e} {int(np.sum(e > 1e-3)):>7}  "
              f"({worst[1]}, {worst[2]})")
    k = np.array(kernel)
    print(f"  {'the kernel (w2+top q2)':<22} {k.max():>9.2e} {np.median(k):>9.2e} "
          f"{int(np.sum(k > 1e-3)):>7}")


if __name__ == "__main__":
    main()
