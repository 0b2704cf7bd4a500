"""The backend's layer without an engine: Int8AttnImpl.do_kv_cache_update and .forward called
as vLLM's CPU model runner calls them (q, k and v views of one bfloat16 qkv tensor, padding
rows past the step's tokens with slot -1, metadata of steps that mix prefill chunks and
decodes), over three steps. The output stays near float attention over the rows given, and
every tier gives the scalar tier's bits, the pool's bytes included. Cheap enough for the
emulated lanes: the AVX2-only one runs it under qemu's Haswell model, where vLLM loads its
_C_AVX2 kernels and int8attn its avx2 tier."""
import numpy as np
import torch
from conftest import PLUGIN

import int8attn as ia
import int8attn.vllm as iv
from int8attn import reference as R

H, HKV, D, BS, BLOCKS = 8, 2, 64, 16, 24
OPTIONS = dict(scale=0.125, sliding_window=37, logits_soft_cap=20.0)
# per step, the tokens each sequence brings (0: none this step): a prompt of 40 in one chunk
# and one of 7, then a decode beside a second chunk and a new prompt, then decodes
STEPS = [(40, 7, 0), (1, 30, 3), (1, 1, 1)]
PAD = 5                                          # rows past the step's tokens (slot -1)


def run_steps(seed=0):
    """The STEPS through a fresh layer: (each step's output rows [n, H, D] float32, every row
    given per sequence as float32 [S, HKV, D] for K and V, the layer's cache bytes)."""
    rng = np.random.default_rng(seed)
    impl = iv.Int8AttnImpl(H, D, OPTIONS["scale"], HKV, kv_cache_dtype=PLUGIN,
                           sliding_window=OPTIONS["sliding_window"],
                           logits_soft_cap=OPTIONS["logits_soft_cap"])
    kv_cache = torch.zeros(BLOCKS, HKV, BS, 2 * D + 8, dtype=torch.int8)
    table = rng.permutation(BLOCKS).astype(np.int32).reshape(3, BLOCKS // 3)
    lens, outs = [0, 0, 0], []
    rows = [([], []) for _ in lens]
    for step in STEPS:
        live = [b for b, t in enumerate(step) if t]
        n = sum(step)
        g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        qkv = torch.randn(n + PAD, (H + 2 * HKV) * D, generator=g).to(torch.bfloat16)
        q = qkv[:, :H * D].view(-1, H, D)
        k = qkv[:, H * D:(H + HKV) * D].view(-1, HKV, D)
        v = qkv[:, (H + HKV) * D:].view(-1, HKV, D)
        slots, at = [], 0
        for b in live:
            pos = np.arange(lens[b], lens[b] + step[b])
            slots += list(table[b][pos // BS].astype(np.int64) * BS + pos % BS)
            rows[b][0].append(k[at:at + step[b]].float().numpy())
            rows[b][1].append(v[at:at + step[b]].float().numpy())
            lens[b] += step[b]
            at += step[b]
        slot_mapping = torch.tensor(slots + [-1] * PAD, dtype=torch.int64)
        impl.do_kv_cache_update(None, k, v, kv_cache, slot_mapping)
        meta = iv.Int8AttnMetadata(
            num_actual_tokens=n,
            query_start=np.concatenate([[0], np.cumsum([step[b] for b in live])]).astype(np.int32),
            seq_lens=np.array([lens[b] for b in live], np.int32),
            block_table=np.ascontiguousarray(table[live]))
        output = torch.full((n + PAD, H, D), 7.0, dtype=torch.bfloat16)
        impl.forward(None, q, k, v, kv_cache, meta, output)
        assert torch.all(output[n:] == 7.0), "a padding row of the output was written"
        outs.append((output[:n].float().numpy(), q[:n].float().numpy(), step, list(lens)))
    given = [(np.concatenate(kb), np.concatenate(vb)) for kb, vb in rows]
    return outs, given, kv_cache.numpy().copy()


def rel_err(out, ref):
    """max |out - ref| / max |ref| over the rows, per query head; the worst head."""
    num = np.abs(out.astype(np.float64) - ref).max(axis=(0, 2))
    return float((num / np.abs(ref).max(axis=(0, 2))).max())


# When set: the worst over the steps' sequences was 0.017 (int8 rows outside the query's own
# open block, halves within it, the output rounded to bfloat16)
NEAR = 0.03


def test_each_step_is_near_float_attention_over_the_rows_given():
    outs, given, _ = run_steps()
    for i, (out, q, step, lens) in enumerate(outs):
        at = 0
        for b, t in enumerate(step):
            if not t:
                continue
            k, v = given[b][0][:lens[b]], given[b][1][:lens[b]]
            ref = R.attention(q[at:at + t], k, v, scale=OPTIONS["scale"],
                              window=OPTIONS["sliding_window"],
                              softcap=OPTIONS["logits_soft_cap"])
            err = rel_err(out[at:at + t], ref)
            assert err < NEAR, f"step {i}, sequence {b}: {err:.3g}"
            at += t


def test_every_tier_gives_the_scalar_tiers_bits(switch_tier):
    tiers = ia.supported_isas()
    runs = {}
    for tier in tiers:
        switch_tier(tier)
        runs[tier] = run_steps()
    want_outs, _, want_cache = runs["scalar"]
    for tier, (outs, _, cache) in runs.items():
        np.testing.assert_array_equal(cache, want_cache, err_msg=f"{tier}: the pool's bytes")
        for i, (got, want) in enumerate(zip(outs, want_outs)):
            np.testing.assert_array_equal(got[0].view(np.int32), want[0].view(np.int32),
                                          err_msg=f"{tier}, step {i}")
