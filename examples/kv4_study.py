"""Which 4-bit cache format does a real model need? Low-bit K/V formats emulated on Gemma 3.

    pip install '.[examples]'
    python examples/kv4_study.py                               # every format of FORMATS
    python examples/kv4_study.py --formats k4g64-v4g32 k8-v4g32 --text /usr/share/common-licenses/GPL-3

Each format is emulated in numpy: K and V rows go through the format's quantizer and back to
floats, and attention runs over the result, scored like ``examples/gemma3.py --compare``
(top-1 agreement and KL divergence of the next-token distributions after the first 1000 tokens,
against fp32 attention over an unquantized cache). What the formats share with the int8 cache:
position 0 kept as given (``keep_first``) and the latest ``recent`` positions read as IEEE halves
(each query reads the window of its own position, as the kernels do).

The quantizers (``levels`` = 2^bits):

- K per channel (``k_group`` = G tokens, the KIVI scheme): positions [j G, (j + 1) G) share, per
  kv head and channel, a minimum and a step (max - min) / (levels - 1), both fp16; position 0
  stays out of group 0's range when kept apart. A group is quantized once it is complete; until
  then its positions are in the recent window (``recent`` >= G), so decode never reads a
  half-made group.
- K or V per token (``*_group`` = g channels, or the whole row): each row's groups of g channels
  get a minimum and a step (asymmetric, ``*_sym=False``) or a step alone (symmetric, codes
  -(levels/2 - 1) .. levels/2 - 1), fp16; or a 16-level normal-float codebook (``v_codebook``,
  QLoRA's NF4 levels times the group's absmax).
- K's widest channels (``k_wide`` = a fraction w of the channels, ``k_wide_bits`` = b): in each
  K group, per kv head, the w D channels with the largest max - min take b-bit codes (the same
  min/max rule), the rest ``k_bits``; which ones is a mask of D bits a group.
- 8 bits: the int8 cache's row quantizer (absmax / 127 per row).
- ``rotate_k``, ``rotate_v``: the cache's random-sign Hadamard rotation before quantizing.

Bits per value count the codes and their fp16 parameters (not the window), for D = 128.
About 90 s per format on 2 cores for the 2575 tokens of quality_text.txt.
"""

import argparse
import os
import sys
import time

import numpy as np

from int8attn import reference as R

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gemma3  # noqa: E402

# QLoRA's NormalFloat4 levels (quantiles of a standard normal, scaled to [-1, 1]).
NF4 = np.array([-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1848737, -0.0910500,
                0.0, 0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170,
                0.7229568, 1.0], np.float32)


def fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def uniform(x, axis, bits, sym):
    """x's round trip through `bits`-bit uniform levels whose range is taken along `axis`
    (min/max, or absmax when sym), range parameters in fp16."""
    x = np.asarray(x, np.float32)
    if sym:
        top = (1 << (bits - 1)) - 1
        step = fp16(np.max(np.abs(x), axis=axis, keepdims=True) / top)
        safe = np.where(step > 0, step, 1.0)
        return (np.clip(np.rint(x / safe), -top, top) * step).astype(np.float32)
    lo = fp16(np.min(x, axis=axis, keepdims=True))
    step = fp16((np.max(x, axis=axis, keepdims=True) - lo) / ((1 << bits) - 1))
    safe = np.where(step > 0, step, 1.0)
    codes = np.clip(np.rint((x - lo) / safe), 0, (1 << bits) - 1)
    return (lo + codes * step).astype(np.float32)


def per_token(x, bits, group, sym=False, codebook=None):
    """Rows x [..., D] through a per-token format: groups of `group` channels (None: the row)."""
    shape = x.shape
    g = group or shape[-1]
    y = x.reshape(*shape[:-1], shape[-1] // g, g)
    if bits == 8:
        codes, scale = R.quantize_rows(y)
        return (codes * scale[..., None]).reshape(shape).astype(np.float32)
    if codebook is not None:
        top = fp16(np.max(np.abs(y), axis=-1, keepdims=True))
        safe = np.where(top > 0, top, 1.0)
        idx = np.abs(y[..., None] / safe[..., None] - codebook).argmin(-1)
        return (codebook[idx] * top).reshape(shape).astype(np.float32)
    return uniform(y, -1, bits, sym).reshape(shape)


class LowBitCache:
    """One layer's cache in an emulated low-bit format (see the module docstring). Options:
    k_bits, v_bits (8, 4 or 2); k_mode "channel" (groups of k_group tokens) or "token" (groups of
    k_group channels); v_group channels; k_sym, v_sym; v_codebook; rotate_k, rotate_v with
    rotation_seed; keep_first; recent; k_wide, k_wide_bits (K per channel only)."""

    def __init__(self, n_kv, head_dim, *, k_bits=4, v_bits=4, k_mode="channel", k_group=64,
                 v_group=32, k_sym=False, v_sym=False, v_codebook=False, rotate_k=False,
                 rotate_v=False, keep_first=True, recent=64, rotation_seed=0, k_wide=0.0,
                 k_wide_bits=8):
        if k_mode == "channel" and recent < k_group:
            raise ValueError(f"recent={recent} must cover a K group of {k_group} tokens")
        if not 0.0 <= k_wide <= 1.0 or (k_wide and k_wide_bits <= k_bits):
            raise ValueError(f"k_wide={k_wide} must lie in [0, 1] and k_wide_bits={k_wide_bits} "
                             f"exceed k_bits={k_bits}")
        self.opt = dict(k_bits=k_bits, v_bits=v_bits, k_mode=k_mode, k_group=k_group,
                        v_group=v_group, k_sym=k_sym, v_sym=v_sym,
                        v_codebook=NF4 if v_codebook else None,
                        k_wide=int(round(k_wide * head_dim)), k_wide_bits=k_wide_bits)
        sign = R.rotation_signs(head_dim, rotation_seed)
        self.sign = (sign if rotate_k else None, sign if rotate_v else None)
        self.keep_first, self.recent = keep_first, recent
        self.raw = [np.zeros((0, n_kv, head_dim), np.float32) for _ in range(2)]
        self.coded = [np.zeros((0, n_kv, head_dim), np.float32) for _ in range(2)]

    def _rot(self, x, side, inverse=False):
        s = self.sign[side]
        return x if s is None else R.rotate(x, s, inverse=inverse).astype(np.float32)

    def _code(self, x, side):
        """Rows x through the per-token format of one side (rotated and back)."""
        o = self.opt
        if side == 0:
            y = per_token(self._rot(x, 0), o["k_bits"], o["k_group"] if o["k_bits"] < 8 else None,
                          o["k_sym"])
        else:
            y = per_token(self._rot(x, 1), o["v_bits"], o["v_group"] if o["v_bits"] < 8 else None,
                          o["v_sym"], o["v_codebook"])
        return self._rot(y, side, inverse=True)

    def append(self, k, v):
        o = self.opt
        for side, x in enumerate((k, v)):
            self.raw[side] = np.concatenate([self.raw[side], np.asarray(x, np.float32)])
        n0, n = len(self.coded[0]), len(self.raw[0])
        self.coded[1] = np.concatenate([self.coded[1], self._code(self.raw[1][n0:], 1)])
        if o["k_mode"] == "token" or o["k_bits"] == 8:
            self.coded[0] = np.concatenate([self.coded[0], self._code(self.raw[0][n0:], 0)])
            return
        g = o["k_group"]
        done = n // g * g                       # K groups complete: quantize the new ones
        have = len(self.coded[0]) // g * g
        parts = [self.coded[0][:have]]
        for a in range(have, done, g):
            x = self._rot(self.raw[0][a:a + g], 0)
            lo = 1 if (a == 0 and self.keep_first) else 0      # position 0 stays out
            y = x.copy()
            y[lo:] = uniform(x[lo:], 0, o["k_bits"], o["k_sym"])
            if o["k_wide"]:                     # the group's widest channels at k_wide_bits
                span = x[lo:].max(0) - x[lo:].min(0)                    # [n_kv, D]
                top = np.argsort(-span, axis=-1)[:, :o["k_wide"]]
                wide = np.zeros(span.shape, bool)
                np.put_along_axis(wide, top, True, axis=-1)
                y[lo:] = np.where(wide, uniform(x[lo:], 0, o["k_wide_bits"], o["k_sym"]), y[lo:])
            parts.append(self._rot(y, 0, inverse=True))
        parts.append(self.raw[0][done:])        # incomplete: read from the window anyway
        self.coded[0] = np.concatenate(parts)

    def prefill(self, k, v, q, *, scale, window=None):
        """append(k, v), then decode(q): gemma3.compare's one call per block of positions."""
        self.append(k, v)
        return self.decode(q, scale=scale, window=window)

    def decode(self, q, *, scale, window=None):
        """Attention of q [T, H, D] (the last T positions) with each query's own window."""
        q = np.asarray(q, np.float64)
        t, h, d = q.shape
        n = len(self.raw[0])
        hkv = self.raw[0].shape[1]
        pos = n - t + np.arange(t)
        s = np.arange(n)
        floats = (s[None] > pos[:, None] - self.recent) & (s[None] <= pos[:, None])
        if self.keep_first:
            floats[:, 0] = True
        seen = R.visible(n, t, window=window)
        hist = [[c.astype(np.float64) for c in self.coded], [R.half_rows(x).astype(np.float64)
                                                            for x in self.raw]]
        if self.keep_first and n:
            for side in range(2):
                hist[1][side][0] = self.raw[side][0]
        qg = q.reshape(t, hkv, h // hkv, d)
        lg = [np.einsum("tgjd,sgd->tgjs", qg, hk[0]) * scale for hk in hist]
        m = np.where(floats[:, None, None], lg[1], lg[0])
        m = np.where(seen[:, None, None], m, -np.inf)
        m -= m.max(-1, keepdims=True)
        p = np.exp(m)
        p /= p.sum(-1, keepdims=True)
        pf = np.where(floats[:, None, None], p, 0.0)
        out = (np.einsum("tgjs,sgd->tgjd", p - pf, hist[0][1])
               + np.einsum("tgjs,sgd->tgjd", pf, hist[1][1]))
        return out.reshape(t, h, d).astype(np.float32)


def bits(opts, d=128):
    """Bits per K and per V value: codes plus their fp16 parameters, head_dim d."""
    out = []
    for side in ("k", "v"):
        b = opts.get(f"{side}_bits", 4)
        if b == 8:
            out.append(8 + 32 / d)
            continue
        g = opts.get(f"{side}_group", 64 if side == "k" else 32) or d
        params = 1 if (opts.get(f"{side}_sym") or (side == "v" and opts.get("v_codebook"))) else 2
        wide = opts.get("k_wide", 0.0) if side == "k" else 0.0  # wider channels, a mask of them
        extra = opts.get("k_wide_bits", 8) - b
        out.append(b + 16 * params / g + (wide * extra + 1 / g if wide else 0))
    return out


def emulated(model, n_tokens, **options):
    return [LowBitCache(model.n_kv, model.head_dim, **options) for _ in range(model.n_layers)]


FORMATS = {
    "k4g32-v4g32": dict(k_group=32, v_group=32),
    "k4g64-v4g32": dict(k_group=64, v_group=32),
    "k4g128-v4g32": dict(k_group=128, v_group=32, recent=128),
    "k4g64-v4g64": dict(k_group=64, v_group=64),
    "k4g64-v4g128": dict(k_group=64, v_group=128),
    "k4g64-v4row": dict(k_group=64, v_group=None),
    "k4g64-v4g32sym": dict(k_group=64, v_group=32, v_sym=True),
    "k4g64-v4g32rot": dict(k_group=64, v_group=32, rotate_v=True),
    "k4g64-v4rowrot": dict(k_group=64, v_group=None, rotate_v=True),
    "k4g64-v4g32nf4rot": dict(k_group=64, v_group=32, rotate_v=True, v_codebook=True),
    "k4g64rot-v4g32": dict(k_group=64, v_group=32, rotate_k=True),
    "k4g64-v4g32-r128": dict(k_group=64, v_group=32, recent=128),
    "k4g32-v4g64": dict(k_group=32, v_group=64),
    "k4g32-v4g64-r128": dict(k_group=32, v_group=64, recent=128),
    "k4g32-v8": dict(k_group=32, v_bits=8, rotate_v=True),
    "k8-v4g64": dict(k_bits=8, rotate_k=True, v_group=64),
    "k4g32-v4rowrot": dict(k_group=32, v_group=None, rotate_v=True),
    "k4g32-v4rowrot-r128": dict(k_group=32, v_group=None, rotate_v=True, recent=128),
    "k8-v4rowrot": dict(k_bits=8, rotate_k=True, v_group=None, rotate_v=True),
    "k4tok32rot-v4g32": dict(k_mode="token", k_group=32, rotate_k=True, v_group=32),
    "k4g64-v4g32-nofirst": dict(k_group=64, v_group=32, keep_first=False),
    "k8-v4g32": dict(k_bits=8, rotate_k=True, v_group=32),
    "k4g64-v8": dict(k_group=64, v_bits=8, rotate_v=True),
    "k4g64-v2g32": dict(k_group=64, v_bits=2, v_group=32),
    "k8-v8": dict(k_bits=8, v_bits=8, rotate_k=True, rotate_v=True),
    "k4g32w16-v4rowrot": dict(k_group=32, k_wide=1 / 16, v_group=None, rotate_v=True),
    "k4g32w8-v4rowrot": dict(k_group=32, k_wide=1 / 8, v_group=None, rotate_v=True),
    "k4g32w4-v4rowrot": dict(k_group=32, k_wide=1 / 4, v_group=None, rotate_v=True),
    "k4g32w8b6-v4rowrot": dict(k_group=32, k_wide=1 / 8, k_wide_bits=6, v_group=None, rotate_v=True),
    "k4g32w4b6-v4rowrot": dict(k_group=32, k_wide=1 / 4, k_wide_bits=6, v_group=None, rotate_v=True),
    "k4g32w4b5-v4rowrot": dict(k_group=32, k_wide=1 / 4, k_wide_bits=5, v_group=None, rotate_v=True),
    "k4g32w2b5-v4rowrot": dict(k_group=32, k_wide=1 / 2, k_wide_bits=5, v_group=None, rotate_v=True),
    "k4g32w7/16b5-v4rowrot": dict(k_group=32, k_wide=7 / 16, k_wide_bits=5, v_group=None,
                                  rotate_v=True),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--text", default=os.path.join(HERE, "quality_text.txt"))
    ap.add_argument("--bytes", type=int, default=None, help="only the text's first N bytes")
    ap.add_argument("--seed", type=int, default=0, help="rotation seed")
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=None, help="only the text's first N tokens")
    args = ap.parse_args(argv)
    text = args.text
    if args.bytes:
        import tempfile
        with open(args.text, "rb") as f:
            data = f.read()[:args.bytes]
        tmp = tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False)
        tmp.write(data)
        tmp.close()
        text = tmp.name
    model = gemma3.Gemma3(gemma3.model_path())
    variants = [("fp32", "fp32", {})] + [
        (name, emulated, dict(FORMATS[name], rotation_seed=args.seed)) for name in args.formats]
    t0 = time.perf_counter()
    rep = gemma3.compare(model, text, args.first, variants=variants, limit=args.limit,
                         progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"{os.path.basename(args.text)}{f' (first {args.bytes} bytes)' if args.bytes else ''}, "
          f"rotation seed {args.seed} ({time.perf_counter() - t0:.0f} s): {rep['positions']} "
          f"positions after the first {rep['first']} of {rep['tokens']} tokens")
    print(f"  {'format':<22} {'bits K/V':>10} {'top-1':>7} {'flips':>6} {'KL mean':>9} "
          f"{'median':>9} {'max':>9}")
    for name, row in rep["rows"].items():
        bk, bv = bits(FORMATS[name])
        print(f"  {name:<22} {bk:>4.2f}/{bv:<5.2f} {row['top1'] * 100:>6.2f}% {row['flips']:>6} "
              f"{row['kl_mean']:>9.2e} {row['kl_median']:>9.2e} {row['kl_max']:>9.2e}")


if __name__ == "__main__":
    main()
