"""Which cache format does a real model need? Candidate K/V formats emulated in numpy on Gemma 3.

    pip install '.[examples]'
    python examples/kv_formats.py                          # every format, rotation seed 0
    python examples/kv_formats.py --seeds 0 1 2 3 --formats keep_first default k32

Each format is emulated: every appended K and V row goes through the format's rotation,
offset and quantizer (the cache's own rules, from int8attn.reference) and straight back to
float32, and attention runs in numpy over the result. This scores formats the kernels do not
have (scales per group of elements, quantizing only K or only V, K channels balanced against the
queries) with the report of
``examples/gemma3.py --compare``: top-1 agreement and KL divergence of the next-token
distributions after the first 1000 tokens of ``quality_text.txt``, against fp32 attention over
an unquantized cache. About 80 s per format and seed on 2 cores.

The formats the kernels have (rotated, keep_first, default) emulate to within a code step of
Int8KVCache.dequantize (the tests check it); the rest are what-ifs, not kernel features.
"""

import argparse
import os
import sys
import time

import numpy as np

import int8attn as ia
from int8attn import reference as R
from int8attn._format import OFFSET_MIN_ROWS

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gemma3  # noqa: E402


def quantize_groups(x, group):
    """x [..., D] float32 -> its int8 round trip with one absmax scale per `group` elements
    (the cache's row quantizer, run on each group)."""
    shape = x.shape
    codes, scale = R.quantize_rows(x.reshape(*shape[:-1], shape[-1] // group, group))
    return (codes.astype(np.float32) * scale[..., None]).reshape(shape)


class EmulatedCache:
    """One layer's cache in an emulated format.

    rotate, rotation_seed, keep_first, center, recent: as Int8KVCache's (``k``, ``v`` are the
    history a single-token decode reads: the last ``recent`` rows as the window keeps them,
    ``reference.half_rows``; a multi-token decode here reads that history for every query).
    k_group, v_group: elements per scale (None: the whole row, the kernels' format). quantize_k,
    quantize_v: False keeps that side as float32 (to see which side the loss is in). balance:
    K's channels are divided by d = (E (k - offset)^2 / E q^2) ** (1/4) before the rotation and
    q's multiplied by it, which leaves q.k as it is and shapes K's rounding error away from the
    channels q weighs most; E runs over the K rows past position 0 appended before the first
    decode and that decode's queries (of every head of the group), and those K rows wait as
    floats until then.
    """

    def __init__(self, n_kv, head_dim, *, rotate=True, rotation_seed=0, keep_first=True,
                 center=None, recent=ia.FORMATS["default"]["recent"], k_group=None,
                 v_group=None, quantize_k=True, quantize_v=True, balance=False):
        center = keep_first if center is None else center
        if center and not keep_first:
            raise ValueError("center needs keep_first, as in Int8KVCache")
        for name, g in (("k_group", k_group), ("v_group", v_group)):
            if g is not None and (g <= 0 or head_dim % g):
                raise ValueError(f"{name} must divide head_dim={head_dim}, got {g}")
        self._k = np.zeros((0, n_kv, head_dim), np.float32)    # through the format
        self._v = np.zeros((0, n_kv, head_dim), np.float32)
        self.raw_k = np.zeros((0, n_kv, head_dim), np.float32)  # as appended
        self.raw_v = np.zeros((0, n_kv, head_dim), np.float32)
        self.recent = recent
        self.sign = R.rotation_signs(head_dim, rotation_seed) if rotate else None
        self.keep_first, self.center = keep_first, center
        self.groups = (k_group or head_dim, v_group or head_dim)
        self.quantize = (quantize_k, quantize_v)
        self.offsets = None                       # [K, V] means, as appended (not rotated)
        self.d = None if balance else np.float32(1.0)      # K's channel divisors; None: not yet

    def _stored(self, x):
        return x if self.sign is None else R.rotate(x, self.sign).astype(np.float32)

    def _restored(self, x):
        return x if self.sign is None else R.rotate(x, self.sign, inverse=True).astype(np.float32)

    def _through(self, x, side, n0):
        """Rows n0 .. of one side through the format and back."""
        if not self.quantize[side]:
            return x
        d = self.d if side == 0 else np.float32(1.0)
        shift = self._shift(len(x), side, n0, d)
        y = self._stored(x / d) - shift
        y = self._restored(quantize_groups(y, self.groups[side]) + shift) * d
        if self.keep_first and n0 == 0:
            y[0] = x[0]
        return y

    def _shift(self, n, side, n0, d):
        """What rows n0 .. n0 + n of one side are centered on, in the stored space: the side's
        offset (0 before it is set; position 0 is never centered)."""
        if self.offsets is None:
            return 0
        past0 = (n0 + np.arange(n) >= 1)[:, None, None]
        return np.where(past0, self._stored(self.offsets[side] / d), 0)

    @property
    def k(self):
        return self._history(self._k, self.raw_k)

    @property
    def v(self):
        return self._history(self._v, self.raw_v)

    def _history(self, through, raw):
        n = min(self.recent, len(raw) - (1 if self.keep_first else 0))
        if n <= 0:
            return through
        return np.concatenate([through[:len(raw) - n], R.half_rows(raw[len(raw) - n:])])

    def append(self, k, v):
        k, v = np.asarray(k, np.float32), np.asarray(v, np.float32)
        n0, t = len(self._k), len(k)
        if self.recent:             # positions 1 .. recent code from their halves, as the ring's
            first = (n0 + np.arange(t) >= 1) & (n0 + np.arange(t) <= self.recent)
            k, v = (np.where(first[:, None, None], R.half_rows(x), x) for x in (k, v))
        self.raw_k = np.concatenate([self.raw_k, k])
        self.raw_v = np.concatenate([self.raw_v, v])
        if self.center and self.offsets is None and self.recent and n0 + t >= self.recent + 1:
            # with a recent window: the mean of positions 1 .. recent, whatever the appends
            rows = self.recent if self.recent >= OFFSET_MIN_ROWS else 0
            self.offsets = [x[1:1 + rows].astype(np.float64).mean(0).astype(np.float32) if rows
                            else np.zeros(k.shape[1:], np.float32) for x in (self.raw_k, self.raw_v)]
            self._k, self._v = self._k[:0], self._v[:0]     # every row again, centered
            k, v, n0 = self.raw_k, self.raw_v, 0
        elif self.center and self.offsets is None and not self.recent and n0 + t >= 2:
            if n0 + t - 1 < OFFSET_MIN_ROWS:
                self.offsets = [np.zeros(k.shape[1:], np.float32)] * 2
            else:                                 # the mean of the append's rows past position 0
                self.offsets = [x[1 - n0:].astype(np.float64).mean(0).astype(np.float32)
                                for x in (k, v)]
        self._k = np.concatenate([self._k, k if self.d is None else self._through(k, 0, n0)])
        self._v = np.concatenate([self._v, self._through(v, 1, n0)])

    def _set_balance(self, q):
        k = self._k[1:].astype(np.float64) - (0 if self.offsets is None else self.offsets[0])
        ek = np.mean(k * k, axis=0) if len(k) else np.ones(self._k.shape[1:])
        n_kv, dim = ek.shape
        eq = np.mean(np.square(q, dtype=np.float64).reshape(-1, n_kv, q.shape[1] // n_kv, dim),
                     axis=(0, 2))
        ek, eq = (np.maximum(e, 1e-6 * e.mean(-1, keepdims=True) + 1e-30) for e in (ek, eq))
        d = (ek / eq) ** 0.25
        self.d = (d / np.exp(np.log(d).mean(-1, keepdims=True))).astype(np.float32)
        self._k = self._through(self._k, 0, 0)

    def prefill(self, k, v, q, *, scale, window=None):
        self.append(k, v)
        return self.decode(q, scale=scale, window=window)

    def decode(self, q, *, scale, window=None):
        if self.d is None:
            self._set_balance(np.asarray(q))
        return R.attention(q, self.k, self.v, scale=scale, window=window)


def emulated(model, n_tokens, **options):
    """compare()'s cache factory: one EmulatedCache per layer."""
    return [EmulatedCache(model.n_kv, model.head_dim, **options) for _ in range(model.n_layers)]


# name -> EmulatedCache keywords (the rotation seed is added per run); "bf16" is the float
# cache rounded to bfloat16, for scale.
_OLD = ia.FORMATS["centered"]      # the what-ifs are variants of the default before 0.4
FORMATS = {
    "bf16": None,
    **{name: ia.FORMATS[name] for name in ("rotated", "keep_first", "centered", "recent",
                                            "default")},
    "K only": {**_OLD, "quantize_v": False},
    "V only": {**_OLD, "quantize_k": False},
    "k32": {**_OLD, "k_group": 32},
    "k16": {**_OLD, "k_group": 16},
    "balanced": {**_OLD, "balance": True},
    "balanced k16": {**_OLD, "balance": True, "k_group": 16},
}


def study(model, text, formats, seed, first=1000):
    variants = [("fp32", "fp32", {})]
    for name in formats:
        opts = FORMATS[name]
        variants.append((name, "bf16", {}) if opts is None
                        else (name, emulated, dict(opts, rotation_seed=seed)))
    return gemma3.compare(model, text, first, variants=variants)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="rotation seeds")
    ap.add_argument("--text", default=os.path.join(HERE, "quality_text.txt"))
    ap.add_argument("--first", type=int, default=1000)
    args = ap.parse_args(argv)
    model = gemma3.Gemma3(gemma3.model_path())
    totals = {name: [] for name in args.formats}
    for seed in args.seeds:
        t0 = time.perf_counter()
        rep = study(model, args.text, args.formats, seed, args.first)
        print(f"rotation seed {seed} ({time.perf_counter() - t0:.0f} s): {rep['positions']} "
              f"positions after the first {rep['first']} of {rep['tokens']} tokens")
        print(f"  {'format':<12} {'top-1':>7} {'flips':>6} {'KL mean':>9} {'median':>9} {'max':>9}"
              "  largest (position: KL)")
        for name, row in rep["rows"].items():
            totals[name].append(row)
            print(f"  {name:<12} {row['top1'] * 100:>6.2f}% {row['flips']:>6} "
                  f"{row['kl_mean']:>9.2e} {row['kl_median']:>9.2e} {row['kl_max']:>9.2e}  "
                  + ", ".join(f"{p}: {kl:.2e}" for p, kl in row["worst"][:2]))
        sys.stdout.flush()
    if len(args.seeds) > 1:
        print(f"mean over seeds {args.seeds}:")
        for name, rows in totals.items():
            mean = {key: float(np.mean([r[key] for r in rows]))
                    for key in ("top1", "kl_mean", "kl_median")}
            print(f"  {name:<12} {mean['top1'] * 100:>6.2f}% {mean['kl_mean']:>9.2e} "
                  f"{mean['kl_median']:>9.2e}  (top-1, KL mean, KL median)")


if __name__ == "__main__":
    main()
