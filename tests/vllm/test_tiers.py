"""Through vLLM the plugin's results do not depend on the kernel tier: a tiny model's greedy
tokens and every logprob vLLM returns, the same floats on each tier this CPU runs (the tier
switched between the jobs of one engine, int8attn._cache._set_isa; prefix caching off, so each
job computes its prompts anew). On a CPU with AVX-512 VNNI that is avx512_vnni, avx2 (what an
AVX2-only CPU runs, where vLLM has no quantized KV cache of its own) and scalar."""
import pytest
from conftest import PLUGIN, run_engine, token_prompts

import int8attn as ia

# prompts across a block of 128 and past the sliding layers' window of 24, prefilled in chunks
# of 64 while others decode
PROMPTS = token_prompts([5, 24, 25, 63, 64, 65, 127, 128, 129, 200], seed=11)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_every_tier_gives_the_same_tokens_and_logprobs(models, name, switch_tier):
    tiers = ia.supported_isas()
    assert "scalar" in tiers and len(tiers) >= 2, tiers
    run = run_engine(models(name), PLUGIN, {tier: (PROMPTS, 12) for tier in tiers},
                     before=switch_tier, enable_prefix_caching=False)
    assert run.impls == {"Int8AttnImpl"}
    for tier in tiers:
        for i, (got, want) in enumerate(zip(run.outputs[tier], run.outputs["scalar"],
                                            strict=True)):
            assert got[0] == want[0], f"{name}, {tier}, prompt {i}: tokens differ from scalar's"
            assert got[1] == want[1], f"{name}, {tier}, prompt {i}: logprobs differ from scalar's"
