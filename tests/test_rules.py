"""The format's cross-field rules (int8attn._rules): each bad combination is refused alike by the
constructor (KVCache, Int8KVCache), the loader (from_state_dict, a valid state with a field
edited) and int8attn.hf.Int8Cache (where torch and transformers are installed; those parts skip
otherwise), and each caller's message is the one the rule's function gives for that caller:
the function is the one place the rule is checked."""

import numpy as np
import pytest

import int8attn as ia
from int8attn import _args
from int8attn import _rules as R

WIDTHS_4 = [(4, 4), (8, 4), (4, 8)]


def message(rule, *args):
    """The ValueError message of the rule function rule(*args), which must raise."""
    with pytest.raises(ValueError) as e:
        rule(*args)
    return str(e.value)


def refused(make):
    """The ValueError message of make(), which must raise."""
    with pytest.raises(ValueError) as e:
        make()
    return str(e.value)


def state(k_bits=8, v_bits=8, n=37, cap=40, **options):
    """The state dict of a KVCache(2, cap, 32, ...) holding n random tokens."""
    cache = ia.KVCache(2, cap, 32, k_bits=k_bits, v_bits=v_bits, **options)
    rng = np.random.default_rng(0)
    cache.append(rng.standard_normal((n, 2, 32)), rng.standard_normal((n, 2, 32)))
    return cache.state_dict()


def load(s, **edits):
    """KVCache.from_state_dict of state s with some fields replaced."""
    return ia.KVCache.from_state_dict({**s, **{k: np.asarray(v) for k, v in edits.items()}})


@pytest.fixture(scope="module")
def hf():
    """new(kv_format, k_bits, v_bits, head_dim): an int8attn.hf.Int8Cache of a small Llama
    config, its first layer initialized for K/V of that head_dim (skips without torch and
    transformers)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ih = pytest.importorskip("int8attn.hf")
    from transformers import LlamaConfig
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    config._attn_implementation = ih.NAME

    def new(kv_format="default", k_bits=8, v_bits=8, head_dim=None):
        cache = ih.Int8Cache(config, max_cache_len=100, kv_format=kv_format, k_bits=k_bits,
                             v_bits=v_bits)
        if head_dim is not None:
            kv = torch.zeros(1, 1, 1, head_dim)
            cache.layers[0].lazy_initialization(kv, kv)
        return cache

    new.ih = ih
    return new


# -- head_dim: a multiple of 16, at most MAX_HEAD_DIM -------------------------------------

@pytest.mark.parametrize("d", [24, 1040])
def test_head_dim_a_multiple_of_16(d):
    want = message(R.check_head_dim, d)
    assert want == f"head_dim must be a multiple of 16 and at most 1024, got {d}"
    assert refused(lambda: ia.KVCache(1, 8, d)) == want
    assert refused(lambda: ia.Int8KVCache(1, 8, d)) == want
    got = refused(lambda: load(state(), head_dim=d))
    assert got == message(R.check_head_dim, d, R.STATE) == "state " + want


def test_head_dim_a_multiple_of_16_hf(hf):
    # hf learns the model's head_dim at the first update: the constructor's check, its message
    assert refused(lambda: hf(head_dim=24)) == message(R.check_head_dim, 24)


# -- head_dim a multiple of NIB_BLOCK with a side at 4 bits ---------------------------------

@pytest.mark.parametrize("k_bits, v_bits", WIDTHS_4)
def test_head_dim_at_4_bits(k_bits, v_bits):
    want = message(R.check_head_dim_at_4_bits, 48, k_bits, v_bits)
    core = "head_dim must be a multiple of 32 with a side at 4 bits"
    assert core in want and want.endswith("got 48")
    assert refused(lambda: ia.KVCache(1, 8, 48, k_bits=k_bits, v_bits=v_bits)) == want
    got = refused(lambda: load(state(k_bits, v_bits, recent=32), head_dim=48))
    assert got == message(R.check_head_dim_at_4_bits, 48, k_bits, v_bits, R.STATE)
    assert got == f"state {core}, got 48"
    ia.KVCache(1, 8, 48)                                    # 8/8: a multiple of 16 is enough


@pytest.mark.parametrize("k_bits, v_bits", WIDTHS_4)
def test_head_dim_at_4_bits_hf(hf, k_bits, v_bits):
    got = refused(lambda: hf(k_bits=k_bits, v_bits=v_bits, head_dim=48))
    assert got == message(R.check_head_dim_at_4_bits, 48, k_bits, v_bits)
    hf(k_bits=k_bits, v_bits=v_bits, head_dim=64)


# -- k_bits, v_bits in BITS -------------------------------------------------------------------

@pytest.mark.parametrize("side, bad", [("k_bits", 2), ("v_bits", 3), ("k_bits", 16)])
def test_bits(side, bad):
    want = message(R.check_bits, bad, side)
    assert want == f"{side} must be one of 8, 4, got {bad}"
    assert refused(lambda: ia.KVCache(1, 8, 32, **{side: bad})) == want
    got = refused(lambda: load(state(), **{side: bad}))
    assert got == message(R.check_bits, bad, side, R.STATE) == "state " + want


@pytest.mark.parametrize("side, bad", [("k_bits", 2), ("v_bits", 3), ("k_bits", 16)])
def test_bits_hf(hf, side, bad):
    assert refused(lambda: hf(**{side: bad})) == message(R.check_bits, bad, side)


# -- recent: 0 .. RECENT_MAX; at least K4_GROUP with K at 4 bits ------------------------------

@pytest.mark.parametrize("bad", [-1, 1025, 2000])
def test_recent_range(bad):
    want = message(R.check_recent, bad, 8)
    assert want == f"recent must be from 0 to 1024, got {bad}"
    assert refused(lambda: ia.KVCache(1, 8, 32, recent=bad)) == want
    assert refused(lambda: ia.Int8KVCache(1, 8, 32, recent=bad)) == want
    if bad >= 0:                                            # (a negative int is no field value)
        got = refused(lambda: load(state(), recent=bad))
        assert got == message(R.check_recent, bad, 8, R.STATE) == "state " + want


@pytest.mark.parametrize("v_bits", [8, 4])
@pytest.mark.parametrize("recent", [0, 16, 31])
def test_k4_needs_a_recent_window_of_a_group(recent, v_bits):
    want = message(R.check_recent, recent, 4)
    core = "recent must be at least 32 with k_bits=4"
    assert want.startswith(core) and want.endswith(f"got {recent}")
    assert refused(lambda: ia.KVCache(1, 8, 32, k_bits=4, v_bits=v_bits, recent=recent)) == want
    got = refused(lambda: load(state(4, v_bits, recent=32), recent=recent))
    assert got == message(R.check_recent, recent, 4, R.STATE) == f"state {core}, got {recent}"
    ia.KVCache(1, 8, 32, k_bits=8, v_bits=v_bits, recent=recent)     # K at 8 bits: any window
    ia.KVCache(1, 8, 32, k_bits=4, v_bits=v_bits, recent=32)


@pytest.mark.parametrize("kv_format", [f for f, o in ia.FORMATS.items() if o["recent"] < 32])
def test_k4_needs_a_recent_window_of_a_group_hf(hf, kv_format):
    recent = ia.FORMATS[kv_format]["recent"]
    got = refused(lambda: hf(kv_format, k_bits=4))
    assert got == message(R.check_recent, recent, 4, R.named_format(kv_format))
    assert got == (f"k_bits=4 needs a format with a recent window of at least 32 tokens; "
                   f"kv_format={kv_format!r} has recent={recent}")
    # the same format's options given to the constructor: the same rule, the constructor's words
    options = {**ia.FORMATS[kv_format], "center": False}
    assert refused(lambda: ia.KVCache(1, 8, 32, k_bits=4, **options)) == message(
        R.check_recent, recent, 4)
    hf(kv_format, k_bits=8, v_bits=4)


# -- rotation_seed: 0 .. 2**64 - 1 ----------------------------------------------------------------

@pytest.mark.parametrize("bad", [-1, 2 ** 64])
def test_rotation_seed(bad):
    want = message(R.check_seed, bad)
    assert want == f"rotation_seed must be from 0 to 2**64 - 1, got {bad}"
    assert refused(lambda: ia.KVCache(1, 8, 32, rotation_seed=bad)) == want
    assert refused(lambda: ia.Int8KVCache(1, 8, 32, rotation_seed=bad)) == want
    ia.KVCache(1, 8, 32, rotation_seed=2 ** 64 - 1)


def test_rotation_seed_in_a_state():
    # the loader checks the seed by the constructor's rule (with rotate or without: the cache
    # keeps it either way)
    assert not R.seed_in_range(-1)
    for rotate in (True, False):
        got = refused(lambda: load(state(), rotation_seed=np.int64(-1), rotate=rotate,
                                   rotation_block=np.int64(32 if rotate else 0)))
        assert got == message(R.check_seed, -1, R.STATE)
        assert got == "state rotation_seed must be from 0 to 2**64 - 1, got -1"
    assert R.rotation_block(48) == 16 and state()["rotation_block"] == R.rotation_block(32)


# -- center: needs keep_first, and both sides at 8 bits; its default ----------------------------

def test_center_needs_keep_first():
    want = message(R.check_center, False, True, 8, 8)
    assert want.startswith("center=True needs keep_first=True")
    assert refused(lambda: ia.KVCache(1, 8, 32, keep_first=False, center=True)) == want
    assert refused(lambda: ia.Int8KVCache(1, 8, 32, keep_first=False, center=True)) == want
    got = refused(lambda: load(state(center=True), keep_first=False))
    assert got == message(R.check_center, False, True, 8, 8, R.STATE)
    assert got == "state has center without keep_first, which int8attn never writes"


@pytest.mark.parametrize("k_bits, v_bits", WIDTHS_4)
def test_center_needs_8_bits(k_bits, v_bits):
    want = message(R.check_center, True, True, k_bits, v_bits)
    assert want.startswith("center=True needs k_bits=8 and v_bits=8")
    assert refused(lambda: ia.KVCache(1, 8, 32, k_bits=k_bits, v_bits=v_bits, center=True)) == want
    got = refused(lambda: load(state(k_bits, v_bits, recent=32), center=True))
    assert got == message(R.check_center, True, True, k_bits, v_bits, R.STATE)
    assert got == "state has center with a side at 4 bits, which int8attn never writes"


@pytest.mark.parametrize("k_bits, v_bits", [(8, 8), *WIDTHS_4])
@pytest.mark.parametrize("keep_first", [True, False])
def test_the_default_of_center(k_bits, v_bits, keep_first):
    c = ia.KVCache(1, 8, 32, k_bits=k_bits, v_bits=v_bits, keep_first=keep_first)
    assert c.center == R.default_center(keep_first, k_bits, v_bits)
    assert c.center == (keep_first and (k_bits, v_bits) == (8, 8))


@pytest.mark.parametrize("k_bits, v_bits", [(8, 8), *WIDTHS_4])
@pytest.mark.parametrize("kv_format", list(ia.FORMATS))
def test_hf_takes_what_the_constructor_takes(hf, kv_format, k_bits, v_bits):
    """Int8Cache accepts a format at some widths exactly when the constructor accepts the options
    it makes of them (the format's, with its offsets off with a 4-bit side), with one message."""
    options = hf.ih._format_options(kv_format, k_bits, v_bits)
    assert options["center"] == (ia.FORMATS[kv_format]["center"] and (k_bits, v_bits) == (8, 8))
    try:
        made = ia.KVCache(1, 8, 32, k_bits=k_bits, v_bits=v_bits, **options)
    except ValueError as e:
        assert refused(lambda: hf(kv_format, k_bits, v_bits)) == message(
            R.check_recent, options["recent"], k_bits, R.named_format(kv_format))
        assert str(e) == message(R.check_recent, options["recent"], k_bits)
        return
    layer_cache = hf(kv_format, k_bits, v_bits, head_dim=32).layers[0].caches[0]
    names = ("k_bits", "v_bits", "rotate", "rotation_seed", "keep_first", "center", "recent")
    assert [getattr(layer_cache, a) for a in names] == [getattr(made, a) for a in names]


# -- evict: whole K groups at 4 bits ------------------------------------------------------------

@pytest.mark.parametrize("k_bits", [8, 4])
def test_evict_whole_groups(k_bits):
    c = ia.KVCache(1, 100, 32, k_bits=k_bits)
    c.append(np.ones((100, 1, 32)), np.ones((100, 1, 32)))
    assert R.evict_step(k_bits) == (32 if k_bits == 4 else 1)
    if k_bits == 4:
        assert refused(lambda: c.evict(5)) == message(R.check_evict, 5, 100, 4)
        assert len(c) == 100
    else:
        R.check_evict(5, 100, 8)
    R.check_evict(100, 100, k_bits)                    # all of them: at any length
    c.evict(R.evict_step(k_bits))
    c.evict(2 * R.evict_step(k_bits))
    assert len(c) == 100 - 3 * R.evict_step(k_bits)


@pytest.mark.parametrize("k_bits, v_bits", [(8, 8), *WIDTHS_4])
def test_hf_sliding_layers_evict_whole_groups(hf, k_bits, v_bits):
    layer = hf.ih.Int8Layer(1000, 24, "default", k_bits, v_bits)
    layer.slack, layer.rollback = 40, 8
    assert layer.evict_step == R.evict_step(k_bits)
    assert layer.capacity == 24 - 1 + 40 + R.evict_step(k_bits) - 1
    import torch
    layer.lazy_initialization(torch.zeros(1, 1, 1, 32), torch.zeros(1, 1, 1, 32))
    rng = np.random.default_rng(1)
    appended = 0
    for _ in range(20):
        k = rng.standard_normal((1, 10, 1, 32)).astype(np.float32)
        layer._make_room(10)
        layer.caches[0].append(k[0], k[0])
        appended += 10
        c = layer.caches[0]
        assert len(c) <= layer.capacity and (appended - len(c)) % R.evict_step(k_bits) == 0
    assert len(layer.caches[0]) < appended                 # it did evict


# -- the ring: min(2 * recent, max_seq) slots ----------------------------------------------------

@pytest.mark.parametrize("recent, cap", [(32, 40), (32, 100), (64, 8), (1, 1)])
def test_ring_slots(recent, cap):
    ring = R.ring_slots(recent, cap)
    assert ring == min(2 * recent, cap)
    without = ia.KVCache(2, cap, 32, recent=0).nbytes
    assert ia.KVCache(2, cap, 32, recent=recent).nbytes - without == 2 * 2 * ring * (2 * 32 + 4)


@pytest.mark.parametrize("recent, n", [(32, 37), (16, 37), (16, 20)])
def test_a_state_holds_at_most_the_ring(recent, n):
    s = state(n=n, recent=recent)
    most = min(n, R.ring_slots(recent, 40))
    assert len(s["k_recent"]) <= most
    more = np.zeros((most + 1, 2, 32), np.float32)
    got = refused(lambda: load(s, k_recent=more, v_recent=more))
    assert got == (f"state k_recent holds {most + 1} positions; a cache of length {n} with "
                   f"recent={recent} and max_seq=40 holds at most {most}")


# -- resolve: the constructor's options are the rules' ---------------------------------------------

def test_resolve_is_the_constructor():
    given = {"k_bits": 4, "v_bits": 8, "rotate": True, "keep_first": True, "center": None,
             "recent": 32, "rotation_seed": 7}
    f = R.resolve(given.__getitem__, 64)
    assert f == R.Format(4, 8, True, 7, True, False, 32)
    o = _args.constructor((2, 16, 64), {k: v for k, v in given.items()}, True)
    assert tuple(o[3:]) == tuple(f)
    with pytest.raises(ValueError, match="recent must be at least 32") as e:
        R.resolve({**given, "recent": 16}.__getitem__, 64)
    assert str(e.value) == refused(lambda: ia.KVCache(2, 16, 64, **{**given, "recent": 16}))
