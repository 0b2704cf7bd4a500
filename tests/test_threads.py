"""Threads: the output is bit-identical for every thread count, the settings are validated, and
the pool survives fork()."""

import os

import numpy as np
import pytest

import int8attn as ia
from int8attn import _cache
from conftest import filled_cache
from test_dispatch import run_python


@pytest.mark.parametrize("shape", [(8, 4, 128, 3000), (32, 8, 64, 1100), (6, 1, 1024, 2000),
                                   (4, 2, 48, 8001)])
@pytest.mark.parametrize("q_bits", [16, 8])
def test_output_is_bit_identical_for_every_thread_count(tier, threads, shape, q_bits):
    h, hkv, d, s = shape
    rng = np.random.default_rng(s)
    cache, _, _ = filled_cache(rng, hkv, d, s, "outlier")
    q = rng.standard_normal((h, d)).astype(np.float32)
    ia.set_num_threads(1)
    assert _cache._plan(cache, h)["threads"] == 1
    want = cache.decode(q, q_bits=q_bits)
    items = hkv * -(-s // 256)                        # (kv head, 256-token chunk) pairs
    for n in (2, 3, 4, 7):
        ia.set_num_threads(n)
        assert _cache._plan(cache, h)["threads"] == min(n, items)   # the work really is split
        got = cache.decode(q, q_bits=q_bits)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32), err_msg=f"{n} threads")


def test_short_contexts_use_fewer_threads(threads):
    ia.set_num_threads(8)
    cache, _, _ = filled_cache(np.random.default_rng(0), 8, 128, 64)
    assert _cache._plan(cache, 8)["threads"] == 1
    big = ia.Int8KVCache(8, 4096, 128)
    big.append(np.ones((4096, 8, 128), np.float32), np.ones((4096, 8, 128), np.float32))
    assert _cache._plan(big, 8)["threads"] == 8


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (257, ValueError), (-1, ValueError),
                                      (2.0, TypeError), ("2", TypeError), (True, TypeError)])
def test_set_num_threads_validates(threads, bad, exc):
    before = ia.get_num_threads()
    with pytest.raises(exc, match="n must be"):
        ia.set_num_threads(bad)
    assert ia.get_num_threads() == before


def test_set_and_get(threads):
    ia.set_num_threads(3)
    assert ia.get_num_threads() == 3
    ia.set_num_threads(np.int64(1))
    assert ia.get_num_threads() == 1


def test_environment_sets_the_default():
    r = run_python("import int8attn as ia; print(ia.get_num_threads())", INT8ATTN_NUM_THREADS="3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"
    for bad in ("0", "x", "1000"):
        r = run_python("import int8attn", INT8ATTN_NUM_THREADS=bad)
        assert r.returncode == 1
        assert "INT8ATTN_NUM_THREADS must be an integer from 1 to 256" in r.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_default_is_the_affinity_mask():
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "import int8attn as ia; print(ia.get_num_threads())")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
    r = run_python("import os, int8attn as ia; print(ia.get_num_threads(), len(os.sched_getaffinity(0)))")
    a, b = r.stdout.split()
    assert a == b


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_pool_survives_fork(threads):
    """After fork only the forking thread exists in the child: its pool starts afresh."""
    rng = np.random.default_rng(1)
    cache, _, _ = filled_cache(rng, 4, 64, 3000)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    ia.set_num_threads(2)
    want = cache.decode(q)                        # workers started in the parent
    pid = os.fork()
    if pid == 0:                                  # child: decode with threads again, report by exit code
        try:
            ok = np.array_equal(cache.decode(q), want) and _cache._plan(cache, 8)["threads"] == 2
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _fold(buf):
    """XOR of a buffer's little-endian 64-bit words, the last one zero-padded."""
    b = np.frombuffer(np.ascontiguousarray(buf).tobytes(), np.uint8)
    b = np.concatenate([b, np.zeros(-len(b) % 8, np.uint8)])
    return int(np.bitwise_xor.reduce(b.view("<u8"))) if len(b) else 0


@pytest.mark.parametrize("shape", [(2, 64, 1), (3, 48, 700), (1, 1024, 257)])
def test_bandwidth_probe_reads_every_byte(threads, shape):
    """The benchmarks' probe folds exactly the codes and scales a decode reads, whatever the
    threads."""
    hkv, d, s = shape
    cache, _, _ = filled_cache(np.random.default_rng(s), hkv, d, s, cap=s + 9)
    want = 0
    for g in range(hkv):
        for c0 in range(0, s, 256):
            c1 = min(s, c0 + 256)
            c0 = max(c0, 1)             # centered: decode reads position 0 from its float row
            tiles = cache._v_tiles()[g, c0 // 4:(c1 + 3) // 4]    # V: whole tiles of 4 positions
            for buf in (cache.k_i8[g, c0:c1], tiles, cache.k_scale[g, c0:c1],
                        cache.v_scale[g, c0:c1]):
                want ^= _fold(buf)
    for n in (1, 2, 3):
        assert _cache._stream_read(cache, n) == want


@pytest.mark.parametrize("fmt", ["plain", "default"])
def test_the_plan_reads_the_visible_chunks_only(threads, fmt):
    """The plan as data: which chunks a decode reads, its items and its thread count, from the
    cache's length and the options alone (the chunks of 256 positions; with a recent window
    of R = 64 the last 64 positions are one more item per kv head, read from its floats)."""
    hkv, d, n = 2, 64, 1000
    recent = ia.FORMATS[fmt]["recent"]
    cache = ia.Int8KVCache(hkv, n, d, **ia.FORMATS[fmt])
    cache.append(np.ones((n, hkv, d), np.float32), np.ones((n, hkv, d), np.float32))
    ia.set_num_threads(1)
    coded_end = n - recent                                   # the window reads the rest
    whole = _cache._plan(cache, 4)
    assert whole["runs"][0] == (0, -(-coded_end // 256)) and whole["runs"][1][1] == 0
    assert whole["nvis"] == -(-coded_end // 256)
    assert whole["per_head"] == whole["nvis"] + (1 if recent else 0)
    assert whole["items"] == hkv * whole["per_head"] and whole["threads"] == 1
    assert whole["rows"] == 2 and whole["parts"] == 1
    # a window of 300 with 5 sinks: the sinks' chunk, then the window's chunks (the window
    # starts at position 700, so chunk 2 on; they are runs apart)
    cut = _cache._plan(cache, 4, window=300, sinks=5)
    assert cut["runs"] == ((0, 1), (2, -(-coded_end // 256) - 2)) and cut["parts"] == 2
    # three queries: rows per kv head grow, the chunks read do not (the same history)
    many = _cache._plan(cache, 4, t=3)
    assert many["rows"] == 6 and many["runs"] == whole["runs"]
    # the workspace: every part inside it, in the documented order, 64-byte aligned
    for p in (whole, cut, many):
        offsets = [p[k] for k in ("q_lo", "c_hi", "c_lo", "bias", "pos0_logit", "q_float",
                                  "v_pos0", "prep", "left", "run_m", "run_l", "states",
                                  "windows", "workers")]
        assert offsets == sorted(offsets) and all(o % 64 == 0 for o in offsets)
        assert p["end"] == p["workers"] + p["threads"] * p["worker_bytes"]
        assert p["windows"] - p["states"] == hkv * p["nvis"] * p["parts"] * p["state_bytes"]
    ia.set_num_threads(2)
    assert _cache._plan(cache, 16)["threads"] == 2           # 1000 tokens of 8 rows pay for two


_TEAM_CHILD = """
import ctypes, ctypes.util, hashlib, os, sys
if sys.argv[1] == "load":                  # an OpenMP runtime in the process, as torch loads one
    ctypes.CDLL(ctypes.util.find_library("gomp"), mode=ctypes.RTLD_GLOBAL)
import numpy as np
import int8attn as ia
from int8attn import _cache
rng = np.random.default_rng(3)
digest = hashlib.sha256()
cache = ia.Int8KVCache(4, 3000, 64)
cache.append(*rng.standard_normal((2, 2900, 4, 64)).astype(np.float32))
pool = ia.PagedKVCache(2, 48, 16, 64, open_blocks=8)
pool.write(np.arange(700), *rng.standard_normal((2, 700, 2, 48)).astype(np.float32))
table = rng.permutation(64)[None, :44].astype(np.int32)
for n in (1, 2, 3):
    ia.set_num_threads(n)
    digest.update(cache.decode(rng.standard_normal((16, 64)).astype(np.float32)).tobytes())
    q = rng.standard_normal((37, 6, 48)).astype(np.float32)
    digest.update(pool.attend(q, [0, 37], [700], table).tobytes())
q = rng.standard_normal((16, 64)).astype(np.float32)
want = cache.decode(q)
pid = os.fork()                            # a child of a process whose team ran: the own pool
if pid == 0:
    os._exit(0 if np.array_equal(cache.decode(q), want) and _cache._thread_source() == "own" else 1)
_, status = os.waitpid(pid, 0)
print(_cache._thread_source(), os.WEXITSTATUS(status), digest.hexdigest())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_an_openmp_team_runs_the_jobs_with_the_same_bits():
    """In a process with an OpenMP runtime (torch's), decodes and paged attends run on its team
    (INT8ATTN_POOL=own: the pool's own threads), with the bits of the pool's own threads at every
    thread count; a forked child of such a process decodes on its own pool."""
    import ctypes.util
    if not ctypes.util.find_library("gomp"):
        pytest.skip("no libgomp to load")
    runs = {}
    for how, env in (("load", {}), ("load", {"INT8ATTN_POOL": "own"}), ("none", {})):
        r = run_python(_TEAM_CHILD.replace("sys.argv[1]", repr(how)), **env)
        assert r.returncode == 0, r.stderr
        runs[how + env.get("INT8ATTN_POOL", "")] = r.stdout.split()
    assert runs["load"][:2] == ["openmp", "0"]
    assert runs["loadown"][:2] == ["own", "0"] and runs["none"][:2] == ["own", "0"]
    assert runs["load"][2] == runs["loadown"][2] == runs["none"][2]
