"""NumPy references for int8attn, used by the tests and the benchmarks.

- :func:`quantize_rows`: the cache's row quantizer, bit for bit.
- :func:`rotate`, :func:`rotation_signs`, :func:`rotation_block`: the cache's rotation.
- :func:`q_planes`: the int8 planes decode makes of q (one for ``q_bits=8``, two for 16);
  :func:`q_hat`: the vector they stand for, the q of every logit with K at 8 bits.
- :func:`attention`: attention of float q over float K/V (float64 inside), the accuracy reference,
  with the decode options (several query positions, window, sinks, softcap); :func:`visible`
  says which positions each query sees.
- :func:`window_rows`: the floats decode reads for the recent window; :func:`half_rows`: how
  the window keeps a row (IEEE halves times a power of two per row).
- :func:`emulate`: the kernel's method, exactly where it rounds to integers (int8 q planes, exact
  integer dots, the softmax weights in integer planes against the V codes: :func:`weight_planes`)
  and in float64 everywhere else: what the kernel computes, minus its f32 rounding.
- :func:`quantize_rows4`, :func:`quantize_k4_group`: the sides at 4 bits of ``KVCache`` (V per
  row, K per channel over a group of positions), bit for bit.
"""

import math

import numpy as np

# Rows whose absmax is below this store as zeros with scale 0 (2^-100; _simd/quantize/scalar.h).
ABSMAX_MIN = np.float32(2.0**-100)


def quantize_rows(x):
    """Quantize along the last axis: ``(codes int8 [..., D], scales float32 [...])``.

    ``scale = absmax / 127``, ``codes = clip(rint(x * (127 / absmax)), -127, 127)``, all in float32;
    a row with absmax below ``ABSMAX_MIN`` gives zeros and scale 0.
    """
    x = np.asarray(x, dtype=np.float32)
    absmax = np.max(np.abs(x), axis=-1)
    zero = ~(absmax >= ABSMAX_MIN)
    safe = np.where(zero, np.float32(1), absmax).astype(np.float32)
    scale = np.where(zero, np.float32(0), safe / np.float32(127)).astype(np.float32)
    inv = (np.float32(127) / safe).astype(np.float32)
    codes = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8)
    codes[zero] = 0
    return codes, scale


def quantize_rows4(x):
    """Rows at 4 bits as ``KVCache`` stores V (after its rotation): ``(codes uint8 [..., D],
    minimum float32 [...], step float32 [...])`` with ``lo = min``, ``hi = max`` of each row;
    rows whose ``hi - lo`` is below ``ABSMAX_MIN`` get step 0 and codes 0; else ``step = (hi -
    lo) / 15`` and ``codes = clip(rint((x - lo) * (15 / (hi - lo))), 0, 15)``, in float32. A row
    reads back as ``lo + step * code``."""
    x = np.asarray(x, dtype=np.float32)
    lo, hi = x.min(axis=-1), x.max(axis=-1)
    rng = (hi - lo).astype(np.float32)
    some = rng >= ABSMAX_MIN
    inv = np.where(some, np.float32(15) / np.where(some, rng, np.float32(1)), np.float32(0))
    codes = np.clip(np.rint((x - lo[..., None]) * inv[..., None].astype(np.float32)), 0, 15)
    step = np.where(some, rng / np.float32(15), np.float32(0)).astype(np.float32)
    return codes.astype(np.uint8), lo.astype(np.float32), step


def quantize_k4_group(rows, skip_first=False):
    """A group of K rows [G, D] (as the recent window keeps them: ``half_rows``) at 4 bits per
    channel, as ``KVCache`` stores K: ``(codes uint8 [G, D], minimum float32 [D], step float32
    [D])``. Per channel ``lo``, ``hi`` over the rows (not row 0 when ``skip_first``: position 0
    kept apart); the minima are ``half_rows(lo)`` (fp16 times a power of two); ``span = hi -
    minimum``, and the D / 2 channels of the largest spans (ties: the lower channel first) are
    wide; the steps are ``max(span / 31, 0)`` for a wide channel, ``max(span / 15, 0)`` else, as
    ``half_rows`` makes them, each half then made odd for a wide channel (unless 0) and even for
    the others, so that a channel is wide exactly when its step's half is odd; ``codes =
    clip(rint((x - minimum) * (1 / step)), 0, 31 wide, 15 else)`` (0 where the step is 0), in
    float32. A value reads back as ``minimum + step * code``."""
    x = np.asarray(rows, dtype=np.float32)
    part = x[1:] if skip_first else x
    d = x.shape[-1]
    minimum = half_rows(part.min(axis=0))
    span = (part.max(axis=0) - minimum).astype(np.float32)
    wide = np.zeros(d, bool)
    wide[np.lexsort((np.arange(d), -span))[:d // 2]] = True
    h, e = _halves(np.maximum(span / np.where(wide, np.float32(31), np.float32(15)),
                              np.float32(0)).astype(np.float32))
    bits = h.view(np.uint16)
    bits = np.where(wide & (bits > 0), bits | 1, bits & ~np.uint16(1)).astype(np.uint16)
    step = np.ldexp(bits.view(np.float16).astype(np.float32), e).astype(np.float32)
    inv = np.where(step > 0, np.float32(1) / np.where(step > 0, step, np.float32(1)),
                   np.float32(0)).astype(np.float32)
    codes = np.clip(np.rint((x - minimum) * inv), 0, np.where(bits & 1, 31, 15))
    return codes.astype(np.uint8), minimum.astype(np.float32), step


_MASK64 = (1 << 64) - 1


def rotation_signs(d, seed):
    """The +-1 signs [d] float32 of the cache's rotation: bit 63 of splitmix64 draws from seed."""
    out = np.empty(d, np.float32)
    state = seed & _MASK64
    for i in range(d):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        out[i] = -1.0 if z >> 63 else 1.0
    return out


def rotation_block(d):
    """Block size of the rotation: the largest power of two dividing d."""
    return d & -d


def rotate(x, signs, *, inverse=False):
    """The random-sign Walsh-Hadamard rotation along the last axis (float64 inside):
    ``H (signs * x) / sqrt(B)`` per block of B = rotation_block(D); ``inverse`` undoes it."""
    x = np.array(x, dtype=np.float64)
    d = x.shape[-1]
    b = rotation_block(d)
    lead = x.shape[:-1]
    if not inverse:
        x = x * signs
    h = 1
    while h < b:                      # pairs (i, i + h) with i & h == 0, blocks aligned
        y = x.reshape(*lead, d // (2 * h), 2, h)
        a, c = y[..., 0, :], y[..., 1, :]
        x = np.stack([a + c, a - c], axis=-2).reshape(*lead, d)
        h *= 2
    x = x / np.sqrt(b)
    return x * signs if inverse else x


def q_planes(q, q_bits=16):
    """The int8 planes of q [H, D]: ``[(codes, scales)]`` for q_bits=8, two pairs for 16.

    The second plane quantizes the residual ``q - codes * scale`` (float32) of the first.
    """
    q = np.asarray(q, dtype=np.float32)
    hi, s_hi = quantize_rows(q)
    if q_bits == 8:
        return [(hi, s_hi)]
    residual = q - hi.astype(np.float32) * s_hi[:, None]
    return [(hi, s_hi), quantize_rows(residual)]


def q_hat(q, q_bits=16):
    """The vector q's int8 planes (``q_planes``) stand for, float32 [H, D]: ``codes_hi * s_hi +
    codes_lo * s_lo`` (one plane: ``codes_hi * s_hi``) in float64, where the products are exact,
    rounded to float32 once (the engine's operations: its bits), in the space the planes are
    made in. With K at 8 bits it is the q of every logit of a query that sees coded positions:
    the coded rows' integer dots, the K offset's part, position 0's float row and the recent
    window's (rotated back first when the cache rotates), so every logit carries the same
    rounding of q, which the softmax cancels. A query that sees float rows alone dots them with
    q as given."""
    total = 0.0
    for codes, s in q_planes(q, q_bits):
        total = total + codes.astype(np.float64) * s.astype(np.float64)[:, None]
    return np.asarray(total, np.float64).astype(np.float32)


def _softmax_attend(logits, v):
    """logits [H, S] float64 per query head, v [S, H, D] per query head: softmax(logits) @ v."""
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return np.einsum("hs,shd->hd", p, v)


def _expand(x, h):
    """[S, Hkv, D] -> [S, H, D]: query head i reads kv head i // (H // Hkv)."""
    return np.repeat(x, h // x.shape[1], axis=1)


def visible(length, t, *, window=None, sinks=0):
    """[t, length] bool: which positions each of the last t query positions sees (causal; with a
    window, the last `window` positions up to itself and the first `sinks`)."""
    pos = length - t + np.arange(t)[:, None]
    s = np.arange(length)[None, :]
    seen = s <= pos
    if window is not None:
        seen &= (s > pos - window) | (s < sinks)
    return seen


def attention(q, k, v, *, scale=None, window=None, sinks=0, softcap=None):
    """Attention of q [H, D] or [T, H, D] over k, v [S, Hkv, D] (GQA by head index), float64
    inside. With T queries they are the last T positions, causal among themselves; ``window``,
    ``sinks`` and ``softcap`` as in ``Int8KVCache.decode``. Returns q's shape, float32."""
    q = np.asarray(q, dtype=np.float64)
    single = q.ndim == 2
    q = q[None] if single else q
    t, h, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    k = _expand(np.asarray(k, dtype=np.float64), h)
    v = _expand(np.asarray(v, dtype=np.float64), h)
    logits = np.einsum("thd,shd->ths", q, k) * scale
    if softcap is not None:
        logits = softcap * np.tanh(logits / softcap)
    seen = visible(k.shape[0], t, window=window, sinks=sinks)
    logits = np.where(seen[:, None, :], logits, -np.inf)
    logits -= logits.max(axis=2, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=2, keepdims=True)
    out = np.einsum("ths,shd->thd", p, v).astype(np.float32)
    return out[0] if single else out


# The smallest exponent of a window row's scale (I8A_HALF_EXP_MIN in _simd/half_row/scalar.h).
HALF_EXP_MIN = -100


def half_rows(x):
    """The rows x [..., D] as the recent window keeps them, float32 of x's shape: each row is
    scaled by 2^-e, e the exponent that puts its largest rounded |value| in [2^14, 2^15) (at
    least HALF_EXP_MIN; 0 for a zero row), rounded to IEEE halves (numpy's conversion: nearest,
    ties to even), and scaled back (exactly)."""
    h, e = _halves(x)
    return np.ldexp(h.astype(np.float32), e).astype(np.float32)


def _halves(x):
    """half_rows' halves (float16, x's shape) and exponents (one a row, kept as an axis)."""
    x = np.asarray(x, dtype=np.float32)
    top = np.max(np.abs(x), axis=-1, keepdims=True)
    e = np.maximum(np.frexp(top)[1] - 15, HALF_EXP_MIN)
    e = np.where(top == 0, 0, e)
    h = np.ldexp(x, -e).astype(np.float16)
    up = np.max(np.abs(h), axis=-1, keepdims=True) >= 2.0**15     # rounded up to 2^15
    e = np.where(up, e + 1, e)
    h = np.where(up, np.ldexp(x, -e).astype(np.float16), h)
    return h, e


def window_rows(cache):
    """The floats decode reads for the recent window of an Int8KVCache: (k, v), each [n, Hkv, D]
    float32 for its last n positions (n = 0 without a window): the last ``recent`` positions
    whose floats the cache holds, position 0 excepted when the cache keeps it apart."""
    recent = getattr(cache, "recent", 0)
    if not recent:
        return np.zeros((0,)), np.zeros((0,))
    state = cache.state_dict()
    k, v, length = state["k_recent"], state["v_recent"], int(state["length"])
    n = min(recent, len(k), length - (1 if state["keep_first"] else 0))
    n = max(n, 0)
    return k[len(k) - n:], v[len(v) - n:]


# The contract's softmax chunk (I8A_CHUNK, _simd/dispatch.h) and the weights' integer planes
# (I8A_WPLANES, _simd/planes/scalar.h).
CHUNK = 256
WEIGHT_PLANES = 2


def weight_planes(w, planes=WEIGHT_PLANES, top_exact=True):
    """The V pass's weights w [..., n] (>= 0, one chunk along the last axis) as the kernel uses
    them, float64: the largest of each row exact (the first position holding it: the top row,
    added in float), the others in `planes` planes of integers 0 .. 127 with steps ``top2 /
    127``, ``top2 / 127**2``, ... (``top2`` the largest of the others; none when it is 0): each
    plane but the last takes the floor of what the ones before left, the last rounds it to
    nearest. Returns the weights so kept, each within ``top2 / (2 * 127**planes)`` of w. With
    V at 4 bits the kernel keeps three planes; ``top_exact=False`` puts every weight in the
    planes (scaled to the largest), the rule before issue 31 (examples/plane_study.py)."""
    w = np.asarray(w, np.float64)
    keep = np.zeros_like(w)
    if top_exact:
        at = np.argmax(w, axis=-1)[..., None]
        np.put_along_axis(keep, at, np.take_along_axis(w, at, axis=-1), axis=-1)
    w = w - keep
    top = w.max(axis=-1, keepdims=True)
    some = top > 0
    step = np.where(some, top, 1.0)
    out, rest = np.zeros_like(w), w
    for k in range(planes):
        step = step / 127
        last = k == planes - 1
        b = np.clip(np.rint(rest / step) if last else np.floor(rest / step), 0, 127)
        out, rest = out + b * step, rest - b * step
    return np.where(some, out, 0.0) + keep


def emulate(q, cache, *, scale=None, q_bits=16):
    """The kernel's method in numpy, for q [H, D] over an Int8KVCache (or anything with its
    ``k_i8, k_scale, v_i8, v_scale`` views, and ``k_first``, ``v_first`` when it keeps the first
    position, ``k_offset``, ``v_offset`` when it centers, ``state_dict()`` when it has a recent
    window): exact int8 planes of q and exact integer dots, and q_hat (what the planes stand
    for) dotted with the offset and the float rows; per chunk of CHUNK positions of the
    codes, the softmax weights times the V scales in integer planes (weight_planes) against
    the V codes; float64 everywhere else; the positions of the recent window from their floats.
    Returns [H, D] float32."""
    q_plain = np.asarray(q, dtype=np.float32)
    h, d = q_plain.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # the codes live in the rotated space
    signs = rotation_signs(d, cache.rotation_seed) if getattr(cache, "rotate", False) else None
    q = q_plain if signs is None else rotate(q_plain, signs).astype(np.float32)

    def per_query_head(x):                            # [Hkv, D] -> [H, D] float64
        return _expand(np.asarray(x, np.float64)[None], h)[0]

    k_i8 = _expand(np.asarray(cache.k_i8).transpose(1, 0, 2), h).astype(np.int64)
    ks = _expand(np.asarray(cache.k_scale).T[..., None], h)[..., 0].astype(np.float64)
    v_codes = _expand(np.asarray(cache.v_i8).transpose(1, 0, 2), h).astype(np.float64)  # [S, H, D]
    vs = _expand(np.asarray(cache.v_scale).T[..., None], h)[..., 0].astype(np.float64)  # [S, H]
    # every logit's q (q_hat), in the rotated space of the codes and the offsets, and as
    # position 0's and the window's float rows are stored (q as given when they are all it sees)
    kw, vw = window_rows(cache)
    first = 1 if getattr(cache, "keep_first", False) else 0
    fw = len(k_i8) - len(kw)                          # the first position of the window
    qh = q_hat(q, q_bits).astype(np.float64)
    qh_given = qh if signs is None else rotate(qh, signs, inverse=True)
    if fw <= first:
        qh_given = q_plain.astype(np.float64)
    logits = 0.0
    for codes, s in q_planes(q, q_bits):
        dots = np.einsum("hd,shd->hs", codes.astype(np.int64), k_i8)
        logits = logits + dots.astype(np.float64) * s.astype(np.float64)[:, None]
    logits = logits * ks.T * scale
    v_off = np.zeros((h, d))
    if getattr(cache, "center", False) and cache.k_offset is not None:
        # rows past position 0: codes * scale + offset
        k_off = per_query_head(cache.k_offset)
        logits[:, 1:] += np.einsum("hd,hd->h", qh, k_off)[:, None] * scale
        v_off = per_query_head(cache.v_offset)
    floats = {}                                       # position -> its V row [H, D], stored space
    if first:                                         # position 0 from its float row
        k0 = per_query_head(cache.k_first)
        logits[:, 0] = np.einsum("hd,hd->h", qh_given, k0) * scale
        v0 = per_query_head(cache.v_first)
        floats[0] = v0 if signs is None else rotate(v0, signs)
    if len(kw):                                  # the recent window from its floats
        logits[:, fw:] = np.einsum("hd,shd->hs", qh_given,
                                   _expand(kw.astype(np.float64), h)) * scale
        vw = _expand(vw.astype(np.float64), h)
        vw = vw if signs is None else rotate(vw, signs)
        for i in range(len(kw)):
            floats[fw + i] = vw[i]
    top = logits.max(axis=1)                          # [H]
    o, lsum = np.zeros((h, d)), np.zeros(h)
    for pos, row in floats.items():
        p = np.exp(logits[:, pos] - top)
        o += p[:, None] * row
        lsum += p
    for c0 in range(0, fw, CHUNK):                    # the coded positions, chunk by chunk
        a, b = max(c0, first), min(c0 + CHUNK, fw)
        if a >= b:
            continue
        m = logits[:, a:b].max(axis=1)
        p = np.exp(logits[:, a:b] - m[:, None])       # [H, n]
        w = weight_planes(p * vs[a:b].T)
        chunk = np.einsum("hs,shd->hd", w, v_codes[a:b]) + p.sum(axis=1)[:, None] * v_off
        f = np.exp(m - top)
        o += f[:, None] * chunk
        lsum += f * p.sum(axis=1)
    out = o / lsum[:, None]
    if signs is not None:                            # back from the rotated space
        out = rotate(out, signs, inverse=True)
    return out.astype(np.float32)
