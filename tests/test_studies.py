"""The benchmark suite's studies (benchmarks/studies.py): the interleaved timing of the formats'
decode cost, and the decode under load."""

import importlib.util
import os

import pytest

import int8attn as ia

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
if not os.path.exists(os.path.join(BENCHMARKS, "studies.py")):
    pytest.skip("benchmarks/ is not beside these tests", allow_module_level=True)
_spec = importlib.util.spec_from_file_location("studies", os.path.join(BENCHMARKS, "studies.py"))
studies = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(studies)


def test_interleaved_timing_alternates_and_keeps_the_calls_apart():
    """The format-cost measurement: per round each fn twice in turn (the second call timed),
    each fn's times in its own list, after three untimed rounds of one call each."""
    calls = []
    times = studies.interleaved([lambda: calls.append("a"), lambda: calls.append("b"),
                                 lambda: calls.append("c")], 5, 0.0)
    assert [len(t) for t in times] == [5, 5, 5]
    assert "".join(calls) == "abc" * 3 + "aabbcc" * 5


def test_format_cost_times_every_format():
    c = studies.format_cost(40, 0.0, h=4, hkv=2, d=16, pairs=3)
    assert (c["tokens"], c["h"], c["hkv"], c["d"], c["pairs"]) == (40, 4, 2, 16, 3)
    assert c["formats"] == ["default", "centered", "plain"]
    assert all(c["time"][name]["n"] == 30 for name in c["formats"])
    assert c["ratio"]["default"] == 1.0 and c["ratio"]["plain"] > 0


def test_contention_times_both_thread_counts_under_load(threads):
    ia.set_num_threads(2)
    c = studies.contention(40, 1, 0.0, h=4, hkv=2, d=16, blocks=3)
    assert (c["tokens"], c["busy"], c["threads"]) == (40, 1, 2)
    assert c["one"]["n"] == c["default"]["n"] == 15 and c["ratio"] > 0
    assert ia.get_num_threads() == 2
    with studies.busy_processes(2) as procs:
        assert all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
