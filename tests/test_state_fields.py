"""Every field a file format version writes is required, and loads exactly or is refused (issue
29): a state (a dict, or a saved file) lacking one is refused naming it; a value the loaded cache
would not give back is refused naming the field (window rows and K's group rows that are not
halves times a power of two, by their first bad row; float rows a cache does not hold that are
not zeros; a rotation block that does not follow from head_dim); every other state loads into a
cache whose state_dict() is the state, bit for bit (older versions: after their documented
upgrade). tests/test_fuzz.py perturbs random states the same way."""

import os

import numpy as np
import pytest

import int8attn as ia
from conftest import assert_loads_exactly, live_caches, written

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
N, CAP, HKV, D = 100, 150, 2, 64


def golden(name):
    with np.load(os.path.join(GOLDEN, f"{name}.npz")) as z:
        return {k: z[k] for k in z.files}


def fresh(n=N, **options):
    """The state of a KVCache(HKV, CAP, D, **options) holding n random tokens (K off zero, so
    that centering has offsets to set)."""
    cache = ia.KVCache(HKV, CAP, D, **options)
    rng = np.random.default_rng(n)
    k = rng.standard_normal((n, HKV, D)).astype(np.float32) + 2
    cache.append(k, rng.standard_normal((n, HKV, D)).astype(np.float32))
    return cache.state_dict()


# states of every version: the golden files (written by the commits that wrote versions 1 to 4)
# and today's caches of several formats, empty ones and one without a window included
STATES = {
    **{name: (lambda name=name: golden(name)) for name in (
        "v1_rotated", "v2_centered", "v3_default", "v3_f32window", "v4_default", "v4_k4v4",
        "v4_k8v4")},
    "default": lambda: fresh(),
    "plain": lambda: fresh(rotate=False, keep_first=False, recent=0),
    "k4v8": lambda: fresh(k_bits=4, recent=32),
    "k4v4_empty": lambda: fresh(0, k_bits=4, v_bits=4),
    "default_empty": lambda: fresh(0),
}
# what two early writers did not write yet, whose absence has a documented meaning (loaded by
# test_rotation.test_state_without_rotation_keys_loads_unrotated and below)
DOCUMENTED_ABSENCE = {("v2_centered", "keep_first")}


def load_both(state, tmp_path):
    """KVCache.from_state_dict(state) and KVCache.load of state saved by numpy."""
    path = tmp_path / "state.npz"
    np.savez(path, **state)
    return ia.KVCache.from_state_dict(state), ia.KVCache.load(path)


def refusals(state, tmp_path, count_caches=True):
    """The messages of from_state_dict(state) and of loading its file, both of which must raise
    ValueError and leave no cache behind (counted unless count_caches is False: a check that
    refuses before any cache is made)."""
    path = tmp_path / "state.npz"
    np.savez(path, **state)
    before = live_caches() if count_caches else 0
    out = []
    for load in (lambda: ia.KVCache.from_state_dict(state), lambda: ia.KVCache.load(path)):
        with pytest.raises(ValueError) as e:
            load()
        out.append(str(e.value))
        del e
    assert not count_caches or live_caches() == before
    return out


@pytest.mark.parametrize("name", STATES)
def test_a_state_loads_exactly(name, tmp_path):
    state = STATES[name]()
    for cache in load_both(state, tmp_path):
        assert_loads_exactly(state, cache)


FIELDS = [(name, key) for name, make in STATES.items() for key in written(make())
          if (name, key) not in DOCUMENTED_ABSENCE]


@pytest.mark.parametrize("name, key", FIELDS, ids=[f"{n}-{k}" for n, k in FIELDS])
def test_a_missing_field_is_refused_naming_it(name, key, tmp_path):
    state = STATES[name]()
    version = int(state["format_version"])
    del state[key]
    want = (f"state lacks {key}: not an int8attn cache" if key.startswith("format") else
            f"state lacks {key}, which format_version {version} writes")
    assert refusals(state, tmp_path, count_caches=False) == [want, want]


def test_version_2_without_keep_first_reads_it_from_center(tmp_path):
    """d12a0ac, the first commit that wrote version 2, had no keep_first: its center kept
    position 0 too (docs/architecture.md). Such a file loads with keep_first = center."""
    state = golden("v2_centered")
    del state["keep_first"]
    for cache in load_both(state, tmp_path):
        assert cache.keep_first and cache.center
        assert_loads_exactly(dict(state, keep_first=np.bool_(True)), cache)
    plain = fresh(rotate=False, keep_first=False, center=False, recent=0)
    old = {key: plain[key] for key in written(dict(plain, format_version=2)) if key != "keep_first"}
    old["format_version"] = np.int64(2)
    for cache in load_both(old, tmp_path):
        assert not cache.keep_first and not cache.center
        assert_loads_exactly(dict(old, keep_first=np.bool_(False)), cache)


def nudged(a, at):
    """A copy of float32 array a with element `at` moved to the next float up: no longer
    halves times the row's power of two."""
    a = a.copy()
    a[at] = np.nextafter(a[at], np.float32(np.inf))
    return a


def test_window_rows_that_are_not_halves_are_refused_naming_the_first(tmp_path):
    s = fresh()
    held = len(s["k_recent"])
    assert held == min(N, 2 * 64)
    first = N - held
    for key, at in (("k_recent", (5, 1, 7)), ("v_recent", (0, 0, 63))):
        msg = refusals(dict(s, **{key: nudged(s[key], at)}), tmp_path)
        j, g = at[:2]
        assert msg[0] == msg[1] == (f"state {key} holds rows that are not halves times a power "
                                    f"of two, as a cache writes them: the first is [{j}, {g}] "
                                    f"(position {first + j}, kv head {g})")
    # K's group rows the same way
    s4 = fresh(k_bits=4, v_bits=4, recent=32)
    for key in ("k_group_min", "k_group_step"):
        msg = refusals(dict(s4, **{key: nudged(s4[key], (1, 2, 10))}), tmp_path)
        assert msg[0] == (f"state {key} holds rows that are not halves times a power of two, as "
                          f"a cache writes them: the first is [1, 2] (kv head 1, group 2)")


def test_float_rows_a_cache_does_not_hold_must_be_zeros(tmp_path):
    s = fresh(keep_first=False, center=False)
    k = s["k_first"].copy()
    k[0, 4] = 1.5
    assert refusals(dict(s, k_first=k), tmp_path)[0] == (
        "state k_first must be zeros without keep_first or a token, got 1.5 at [0, 4]")
    s = fresh(0)                                         # keep_first, but no token yet
    v = s["v_first"].copy()
    v[1, 3] = -0.0
    assert refusals(dict(s, v_first=v), tmp_path)[0] == (
        "state v_first must be zeros without keep_first or a token, got -0.0 at [1, 3]")
    s = fresh(20)                                        # centered; offsets set at 65 tokens
    assert not s["offsets_set"]
    k = s["k_offset"].copy()
    k[1, 0] = 2.0
    assert refusals(dict(s, k_offset=k), tmp_path)[0] == (
        "state k_offset must be zeros while the offsets are not set (offsets_set), got 2.0 at "
        "[1, 0]")


def test_window_rows_without_a_window_are_refused(tmp_path):
    s = fresh(rotate=False, keep_first=False, recent=0)
    rows = np.zeros((2, HKV, D), np.float32)
    msg = refusals(dict(s, k_recent=rows, v_recent=rows), tmp_path)
    assert msg[0] == (f"state k_recent holds 2 positions; a cache of length {N} with recent=0 "
                      f"and max_seq={CAP} holds at most 0")


def test_the_rotation_fields_are_checked_with_or_without_rotate(tmp_path):
    s = fresh(rotate=False)
    assert refusals(dict(s, rotation_block=np.int64(64)), tmp_path)[0] == (
        "state rotation_block must be 0 for head_dim 64 with rotate=False, got 64")
    assert refusals(dict(s, rotation_seed=np.int64(-1)), tmp_path)[0] == (
        "state rotation_seed must be from 0 to 2**64 - 1, got -1")
    seeded = fresh(rotate=False, rotation_seed=2 ** 64 - 1)       # kept without rotate too
    for cache in load_both(seeded, tmp_path):
        assert cache.rotation_seed == 2 ** 64 - 1
        assert_loads_exactly(seeded, cache)


def test_only_exact_conversions(tmp_path):
    s = fresh()
    # integers of another width or signedness hold the same value: taken
    exact = dict(s, length=np.int32(N), recent=np.uint16(64), n_kv_heads=np.uint8(HKV))
    for cache in load_both(exact, tmp_path):
        assert_loads_exactly(exact, cache)
    # nothing else is converted: another float width, byte order, bools from ints
    assert refusals(dict(s, k_scale=s["k_scale"].astype(">f4")), tmp_path)[0] == (
        f"state k_scale must be float32 [{HKV}, {N}], got >f4 [{HKV}, {N}]")
    assert refusals(dict(s, k_recent=s["k_recent"].astype(np.float64)), tmp_path)[0] == (
        f"state k_recent must be float32 [n, {HKV}, {D}], got float64 [{N}, {HKV}, {D}]")
    assert refusals(dict(s, offsets_set=np.int64(1)), tmp_path)[0] == (
        "state offsets_set must be a bool, got dtype int64, shape ()")


def test_rows_of_tiny_values_keep_the_signs_of_their_zeros(tmp_path):
    """Rows below the window's smallest scale (2**-100 times a half's least) are stored as zeros
    that keep their signs: a saved state holds -0.0 there, and it loads back bit for bit (the
    load had made them +0.0)."""
    cache = ia.KVCache(HKV, CAP, D, k_bits=4, v_bits=4, recent=32)
    rng = np.random.default_rng(1)
    tiny = (rng.standard_normal((40, HKV, D)) * 1e-41).astype(np.float32)
    cache.append(tiny, tiny)
    s = cache.state_dict()
    for key in ("k_recent", "v_recent"):
        assert not np.any(s[key]) and np.any(np.signbit(s[key])), key
    for back in load_both(s, tmp_path):
        assert_loads_exactly(s, back)
