"""K with a large common offset (issue 29, finding 1): every K row carries C times its spread
along one direction u, as real K channels do. Every format holds the contract there: decode
within 1e-3 of float64 attention over the cache's own dequantize(), with q orthogonal to u (the
logits ordinary, the offset only in the rows) and not (every logit shifted by the same large
amount, which the softmax takes out).

The coded positions' logits dot the rows with the vector q's int8 planes stand for (q_hat), and
the planes' rounding times the offset shifts each of them by nearly the same amount. Position 0
and the recent window, read from their float rows, were dotted with q as given: their logits
missed that shift, which the softmax then could not cancel (up to 6e-3 here, on 8/8 with the
window and on 8/4). They now take q_hat too (reference.q_hat), so every logit shares it: at most
2.2e-4 here, as without the offset."""

import numpy as np
import pytest

import int8attn as ia
from conftest import CONTRACT, EMULATION, matrix, rel_err
from int8attn import reference as R

TOKENS = 600            # two whole chunks and part of a third

# every format, default first and plain last (conftest.matrix's convention): the 8/8 presets
# (centered, kept first position, the window), and the sides at 4 bits (KVCache's own defaults:
# rotation, keep_first, recent=64, no centering)
FORMATS = {
    "default": dict(ia.FORMATS["default"]),
    "recent": dict(ia.FORMATS["recent"]),
    "keep_first": dict(ia.FORMATS["keep_first"]),
    "recent_unrotated": {**ia.FORMATS["recent"], "rotate": False},
    "k8v4": {"k_bits": 8, "v_bits": 4},
    "k4v4": {"k_bits": 4, "v_bits": 4},
    "k4v8": {"k_bits": 4, "v_bits": 8},
    "plain": dict(ia.FORMATS["plain"]),
}
EIGHT = ("default", "recent", "keep_first", "recent_unrotated", "plain")   # both sides at 8 bits

# (H, Hkv, D, C, q orthogonal to u): MQA at D = 64, GQA 4:1 at D = 96 (rotation blocks of 32)
# and at D = 128
CASES = [(h, hkv, d, c, orth) for h, hkv, d in ((8, 1, 64), (8, 2, 96), (8, 2, 128))
         for c in (300, 1000) for orth in (True, False)]


def case_id(case):
    h, hkv, d, c, orth = case
    return f"H{h}-Hkv{hkv}-D{d}-C{c}-{'orth' if orth else 'any'}"


PAIRS = [pytest.param(case, name, id=f"{case_id(case)}-{name}")
         for case, name in matrix(CASES, list(FORMATS), every_format=(1, 6))]


def offset_data(case, seed=0):
    """K = randn + C u (u a random unit direction, one for the cache), V = randn, both [TOKENS,
    Hkv, D]; q = 3 randn [H, D] (max |logit| about 9 without the offset), made orthogonal to u
    when asked."""
    h, hkv, d, c, orth = case
    rng = np.random.default_rng(seed * 7919 + d * 31 + c + orth)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    k = (rng.standard_normal((TOKENS, hkv, d)) + c * u).astype(np.float32)
    v = rng.standard_normal((TOKENS, hkv, d)).astype(np.float32)
    q = 3.0 * rng.standard_normal((h, d))
    if orth:
        q -= np.outer(q @ u, u)
    return k, v, q.astype(np.float32)


def filled(case, name):
    k, v, q = offset_data(case)
    cache = ia.KVCache(case[1], TOKENS, case[2], **FORMATS[name])
    cache.append(k, v)
    return cache, q


@pytest.mark.parametrize("case, name", PAIRS)
def test_a_common_k_offset_keeps_decode_within_contract(tier, case, name):
    cache, q = filled(case, name)
    ref = R.attention(q, *cache.dequantize())
    assert rel_err(cache.decode(q), ref) <= CONTRACT


@pytest.mark.parametrize("case, name", [p for p in PAIRS if p.values[1] in EIGHT])
def test_emulation_models_every_logit_from_q_hat(tier, case, name):
    """The kernel's method (reference.emulate: q_hat for the offset, position 0 and the window)
    with one plane of q, where q's rounding is largest."""
    cache, q = filled(case, name)
    ref = R.attention(q, *cache.dequantize())
    err = np.max(np.abs(cache.decode(q, q_bits=8) - R.emulate(q, cache, q_bits=8)), axis=1)
    assert float(np.max(err / np.max(np.abs(ref), axis=1))) <= EMULATION
