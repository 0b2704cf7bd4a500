"""The benchmarks' helpers that decide what a run measures."""
from int8attn import _bench


def test_the_last_level_cache_is_read_past_other_files(tmp_path):
    """sysfs's cache folder holds index0 .. indexN and a uevent file: the size is the largest
    index's (a file without a size once made the whole read fall back to 32 MiB, so "cold"
    round robins of 256 MiB fit a 480 MiB L3)."""
    for name, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "491520K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "size").write_text(size + "\n")
    (tmp_path / "uevent").write_text("")
    (tmp_path / "index9").mkdir()                      # no size: skipped
    assert _bench.llc_bytes(str(tmp_path)) == 491520 << 10
    assert _bench.llc_bytes(str(tmp_path / "absent")) == 32 << 20


def test_interleaved_implementations_share_the_cold_working_set(monkeypatch):
    """Eight implementations of a 480 MiB last-level cache each holding 8x of it asked for 30 GiB
    (vllm_serve.py died of the OOM killer); with share, their copies total the 8x between them."""
    monkeypatch.setattr(_bench, "llc_bytes", lambda: 480 << 20)
    assert _bench.cold_copies(100 << 20) == 39                 # 3840 MiB of 100 MiB copies
    assert _bench.cold_copies(100 << 20, share=8) == 5         # 480 MiB each, 3840 MiB in all
    assert _bench.cold_copies(4 << 30, share=8) == 2           # never fewer than two


def test_a_prompt_chunk_case_counts_its_causal_work_and_meets_the_contract():
    """A case of T queries after S cached tokens: query t sees S + t + 1 positions, so the
    FLOPs are 4 D H (T S + T (T + 1) / 2); its int8attn run (prefill, truncated back between
    calls) is checked against each probed query's own history, a cache cut after it (the full
    cache's dequantize would hold the later positions' codes where that query read floats)."""
    case = _bench.Case("int8attn", 4, 2, 32, 300, "hot", queries=70)
    assert case.flops == 4 * 32 * 4 * (70 * 300 + 70 * 71 // 2)
    assert case.name == "int8attn/h4/kv2/d32/s300/T70/hot/q16/default/tdefault"
    assert _bench.Case("int8attn", 4, 2, 32, 300).flops == 4 * 32 * 4 * 300
    r = _bench.run_case(case, budget=0.01)
    assert r["error_vs_reference"] < 1e-3
    assert r["gflops"] > 0 and r["time"]["n"] >= 4
