"""Multi-token causal decode, sliding windows, attention sinks and the logit soft cap, each
against the numpy reference on every tier."""

import numpy as np
import pytest

import int8attn as ia
from conftest import CONTRACT, assert_tiers_agree, attention_over_history, each_tier, filled_cache
from int8attn import reference as R


def rel_err_t(out, ref):
    """Worst (position, head) of max|out - ref| / max|ref|."""
    num = np.max(np.abs(out.astype(np.float64) - ref), axis=-1)
    return float(np.max(num / np.max(np.abs(ref), axis=-1)))


@pytest.mark.parametrize("shape", [(8, 2, 64, 300, 5), (4, 4, 128, 600, 1), (16, 4, 48, 1030, 9),
                                   (2, 1, 1024, 260, 4), (8, 8, 32, 7, 7)])
def test_multi_token_equals_sequential_decodes(tier, shape):
    """T queries at the last T positions: each equals a single-token decode of the cache cut
    after its own position, bit for bit (same chunks, same merge order)."""
    h, hkv, d, s, t = shape
    rng = np.random.default_rng(s + t)
    cache, _, _ = filled_cache(rng, hkv, d, s, "outlier")
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    multi = cache.decode(q)
    assert multi.shape == (t, h, d)
    state = cache.state_dict()
    for i in range(t):
        cut = ia.Int8KVCache.from_state_dict(state)
        cut.truncate(s - t + i + 1)
        np.testing.assert_array_equal(multi[i], cut.decode(q[i]), err_msg=f"position {i}")
    assert rel_err_t(multi, attention_over_history(cache, q)) <= CONTRACT


WINDOWS = [
    # (H, Hkv, D, tokens, T, window, sinks)
    (8, 2, 64, 1000, 1, 100, 0),
    (8, 2, 64, 1000, 1, 100, 4),
    (4, 4, 128, 700, 3, 300, 2),       # window boundary inside a chunk, sinks in chunk 0
    (8, 2, 64, 1000, 6, 1, 0),         # each query sees itself only
    (8, 2, 64, 1000, 6, 1, 1),
    (4, 1, 32, 600, 5, 256, 256),      # sinks == window
    (4, 2, 64, 500, 4, 4096, 0),       # window longer than the cache: plain causal
    (4, 2, 64, 500, 4, 300, 299),      # sinks join the window for the later queries
    (6, 3, 80, 900, 17, 40, 3),
]


@pytest.mark.parametrize("case", WINDOWS, ids=lambda c: "-".join(map(str, c)))
def test_window_and_sinks_against_reference(tier, case):
    h, hkv, d, s, t, window, sinks = case
    rng = np.random.default_rng(s + window + sinks)
    cache, _, _ = filled_cache(rng, hkv, d, s, "outlier")
    q = rng.standard_normal((t, h, d)).astype(np.float32) * 2
    kd, vd = cache.dequantize()
    out = cache.decode(q, window=window, sinks=sinks)
    ref = attention_over_history(cache, q, window=window, sinks=sinks)
    assert rel_err_t(out, ref) <= CONTRACT
    # the window really hides the rest: far from the full-context answer
    if window < s - t and not sinks:
        assert rel_err_t(out, R.attention(q, kd, vd)) > 1e-2


@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
def test_softcap_against_reference(tier, softcap):
    rng = np.random.default_rng(int(softcap * 10))
    cache, _, _ = filled_cache(rng, 2, 64, 700, "outlier")
    q = rng.standard_normal((3, 8, 64)).astype(np.float32) * 4
    kd, vd = cache.dequantize()
    for t in (1, 3):
        qq = q[0] if t == 1 else q
        out = cache.decode(qq, softcap=softcap, scale=0.3)
        ref = attention_over_history(cache, qq, softcap=softcap, scale=0.3)
        assert rel_err_t(out, ref) <= CONTRACT
    out = cache.decode(q, softcap=softcap, window=50, sinks=2)
    assert rel_err_t(out, attention_over_history(cache, q, softcap=softcap, window=50,
                                                 sinks=2)) <= CONTRACT
    # a small cap flattens the softmax: clearly unlike the uncapped answer
    if softcap < 1:
        assert rel_err_t(out, R.attention(q, kd, vd, window=50, sinks=2)) > 1e-2


def test_options_give_every_tier_the_scalar_bits():
    rng = np.random.default_rng(3)
    cache, _, _ = filled_cache(rng, 4, 96, 1300, "outlier")
    q = rng.standard_normal((5, 8, 96)).astype(np.float32)
    assert_tiers_agree(each_tier(lambda: cache.decode(q, window=300, sinks=3, softcap=20.0, q_bits=8)))


def test_options_are_bit_identical_for_every_thread_count():
    rng = np.random.default_rng(4)
    cache, _, _ = filled_cache(rng, 4, 128, 3000)
    q = rng.standard_normal((4, 16, 128)).astype(np.float32)
    before = ia.get_num_threads()
    try:
        ia.set_num_threads(1)
        want = cache.decode(q, window=1000, sinks=4)
        for n in (2, 3, 5):
            ia.set_num_threads(n)
            np.testing.assert_array_equal(cache.decode(q, window=1000, sinks=4), want)
    finally:
        ia.set_num_threads(before)
