"""A property-based state machine over the whole public surface: random shapes, dtypes, strides,
options and values (float32's edges included: up to the format's 2**64, denormals, NaN, Inf,
outliers) through append / decode / truncate / evict / reset / save / load.

It asserts, after every step:
- an invalid call raises ValueError or TypeError and leaves the cache exactly as it was;
- a valid append stores what a twin cache fed the same rows as contiguous float32 stores;
- a valid decode is finite, within the kernel's documented error of float64 attention over the
  cache's own ``dequantize()`` (1e-3 at ordinary logits, see ``decode_tolerance``), and the same
  bits on every tier this CPU has and for every thread count; in a run whose K rows all carry a
  large common offset (``OffsetRows``), a decode at ordinary logits is within the contract
  itself;
- a saved and loaded cache holds (its state_dict(), bit for bit) and decodes exactly like the
  one saved;
- a cache emptied by evict (which sometimes forgets everything) holds and decodes from then on
  exactly what a fresh cache fed the same later calls does;
- a prefill of T rows (up to several times the recent window) gives the bits of T single
  append-then-decode steps, and a decode past the ring's reach is refused.

And a state of a random cache with one field removed or perturbed (its dtype, shape, a bit, a
value out of range or of another type, window or group rows that are not halves) either loads
exactly (the loaded cache's state_dict() is the state, bit for bit) or is refused with a
ValueError naming a field, leaving no cache behind (test_a_perturbed_state_...).

The regular run has a fixed budget (INT8ATTN_FUZZ_EXAMPLES machines, derandomized, so a CI
failure replays); before a release run many more with fresh seeds:

    INT8ATTN_FUZZ_EXAMPLES=2000 INT8ATTN_FUZZ_RANDOM=1 python -m pytest tests/test_fuzz.py
"""

import math
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, event, given, settings                             # noqa: E402
from hypothesis import strategies as st                                         # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule)

import int8attn as ia                                                           # noqa: E402
from int8attn import _rules                                                     # noqa: E402
from conftest import (CONTRACT, EMULATED, assert_loads_exactly, assert_same_state,  # noqa: E402
                      assert_same_states, assert_tiers_agree, attention_over_history, each_tier,
                      live_caches, rel_err, snapshot)

EXAMPLES = int(os.environ.get("INT8ATTN_FUZZ_EXAMPLES", "15" if EMULATED else "100"))
TOP = 2.0 ** 64                                  # the format's range: _format.VALUE_MAX
# magnitudes of the rows: denormal to the format's limit
MAGNITUDES = [1e-41, 1e-30, 1e-3, 1.0, 30.0, 1e6, 1e12, 2.0 ** 60, TOP]
DTYPES = [np.float32, np.float64, np.float16, np.int32]
LAYOUTS = ["contiguous", "fortran", "reversed", "misaligned"]


def canonical(x):
    """What the cache reads from x: its values as contiguous float32 (out-of-range -> inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(np.asarray(x).astype(np.float32))


def in_range(x32):
    return bool(np.all(np.abs(x32) <= TOP))


def laid_out(x, layout):
    """x (any dtype) with the given memory layout, the same values."""
    if layout == "fortran":
        return np.asfortranarray(x)
    if layout == "reversed":                     # negative strides
        return np.ascontiguousarray(x[::-1])[::-1]
    if layout == "misaligned" and x.dtype.itemsize > 1:
        raw = np.zeros(x.nbytes + 1, np.uint8)
        m = np.frombuffer(raw.data, dtype=x.dtype, count=x.size, offset=1).reshape(x.shape)
        m[...] = x
        return m
    return x


def draw_values(data, shape, label, *, bad=False, ordinary=None):
    """Random values of a shape as a caller hands them over (some dtype, some layout), and their
    float32 values as the cache reads them. bad=True puts one NaN, Inf or out-of-range value in.
    ordinary(rng, shape): the values, in place of the drawn magnitude, offset, outliers and
    denormals (a machine with a large K offset: OffsetRows)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label=f"{label} seed"))
    if ordinary is not None:
        x = ordinary(rng, shape)
    else:
        mag = data.draw(st.sampled_from(MAGNITUDES), label=f"{label} magnitude")
        x = rng.standard_normal(shape) * mag
        if x.size and data.draw(st.booleans(), label=f"{label} common offset"):
            x = x + rng.standard_normal(shape[-1]) * mag * 3
        if x.size and data.draw(st.booleans(), label=f"{label} outlier"):
            x.flat[rng.integers(x.size)] = rng.choice([-1.0, 1.0]) * mag * 1e6
        if x.size and data.draw(st.booleans(), label=f"{label} denormals"):
            x[rng.random(shape) < 0.2] = 3e-42
    x = np.clip(x, -TOP, TOP)
    dtype = data.draw(st.sampled_from(DTYPES), label=f"{label} dtype")
    if dtype is np.float16:
        x = np.clip(x, -60000.0, 60000.0)
    if dtype is np.int32:
        x = np.clip(x, -2 ** 31, 2 ** 31 - 1)
    if bad and x.size:
        dtype = np.float64 if dtype is np.int32 else dtype
        x.flat[rng.integers(x.size)] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -3e19, 1e300]), label=f"{label} bad value")
    with np.errstate(over="ignore", invalid="ignore"):
        given = x.astype(dtype)
    given = laid_out(given, data.draw(st.sampled_from(LAYOUTS), label=f"{label} layout"))
    return given, canonical(given)


def decode_tolerance(cache, q32, scale, q_bits):
    """The kernel's error bound against float64 attention over dequantize(), per output value.

    q is quantized to int8 planes in the rotated space: the residual of two planes is at most
    max|q_rot| / (127 * 508) (one plane: / 254), with max|q_rot| <= |q|_2, so each logit is off
    by at most delta = scale * |q|_2 * max_t |y_t|_1 / 64516 (y_t: the stored row, codes times
    scale), plus float32 rounding of the logit's pieces. Weights that are exact softmax weights
    of logits each within delta differ by a factor within exp(+-2 delta), so the output (a mean
    of V rows) moves by at most expm1(2 delta) times twice max|v| (and never more than twice
    max|v|: it stays a mean of the rows); the float32 sums add 1e-4 of max|v|. At ordinary
    logits (|q.k| * scale up to a few tens) this is the 1e-3 contract."""
    qn = np.linalg.norm(q32.astype(np.float64).reshape(-1, q32.shape[-1]), axis=-1).max()
    kd, vd = cache.dequantize()
    if getattr(cache, "k_bits", 8) == 8:
        y = np.abs(cache.k_i8.astype(np.float64)) * cache.k_scale[..., None].astype(np.float64)
        per = 64516.0 if q_bits == 16 else 254.0
    else:
        # K at 4 bits (unrotated): q * step per channel in planes within max|q * step| / (2 *
        # 127 * 254^2) (one plane: / 254), against codes up to 15 in each of D channels, and
        # 15 * step <= 2 max|k| of the channel: the logit within |q|_2 * y1 * 2 D / (2 * 127 *
        # 254^2) (one plane: * D / 254)
        y = np.abs(kd.astype(np.float64))
        per = (127.0 * 254.0 ** 2 if q_bits == 16 else 254.0) / q32.shape[-1]
    y1 = float(y.sum(axis=-1).max()) if y.size else 0.0
    off = cache.k_offset
    bias = float(np.linalg.norm(off.astype(np.float64), axis=-1).max()) if off is not None else 0.0
    delta = scale * qn * (y1 / per + (y1 + bias) * 2.0 ** -20)
    vmax = float(np.abs(vd).max()) if vd.size else 0.0
    return (min(math.expm1(min(2.2 * delta, 1.0)), 1.0) + 1e-4) * 2 * vmax + 1e-37


class OffsetRows:
    """A machine run whose K rows all carry one large common offset, as real K channels do: each
    K row is standard normal plus c times u (u a random unit direction, fixed for the run, c 300
    or 1000), V rows standard normal, q rows standard normal times 1 or 3, sometimes made
    orthogonal to u. The logits are then ordinary (the offset's part is the same for every
    position), so a decode at q_bits=16 and the default scale is held to the contract itself
    (within 1e-3 of the largest output per head: decode_beside_the_offset), where
    decode_tolerance, which counts the offset into every row's size, is far looser. (With q as
    given for the float rows and q_hat for the codes, the two kinds of logits differed by
    (q_hat - q) . c u: errors of 2e-3 to 6e-3.)"""

    def __init__(self, data, d):
        self.c = data.draw(st.sampled_from([300.0, 1000.0]), label="K offset")
        seed = data.draw(st.integers(0, 2 ** 32 - 1), label="K offset direction")
        u = np.random.default_rng(seed).standard_normal(d)
        self.u = u / np.linalg.norm(u)

    def k(self, rng, shape):
        return rng.standard_normal(shape) + self.c * self.u

    @staticmethod
    def v(rng, shape):
        return rng.standard_normal(shape)

    def q(self, data):
        """q's values: times 1 or 3, orthogonal to u or not."""
        mag = data.draw(st.sampled_from([1.0, 3.0]), label="q magnitude")
        orth = data.draw(st.booleans(), label="q orthogonal to the K offset")

        def values(rng, shape):
            x = rng.standard_normal(shape) * mag
            return x - (x @ self.u)[..., None] * self.u if orth else x
        return values


class CacheMachine(RuleBasedStateMachine):
    """One cache (and its twin fed canonical float32 rows) through random calls."""

    def new_caches(self, data):
        """The cache and its twin (self.hkv, self.d and self.cap set)."""
        self.hkv = data.draw(st.integers(1, 3), label="n_kv_heads")
        self.d = data.draw(st.sampled_from([16, 32, 48, 80, 128]), label="head_dim")
        self.cap = data.draw(st.integers(1, 600), label="max_seq")
        # the presets, another rotation, and a short window without rotation or centering
        fmt = data.draw(st.sampled_from([*ia.FORMATS.values(), {"rotation_seed": 2 ** 64 - 1},
                                         {**ia.FORMATS["recent"], "rotate": False, "recent": 16}]),
                        label="format")
        self.new_cache = lambda: ia.Int8KVCache(self.hkv, self.cap, self.d, **fmt)
        return self.new_cache(), self.new_cache()

    @initialize(data=st.data())
    def make(self, data):
        self.cache, self.twin = self.new_caches(data)
        self.fresh = None               # after an evict of everything: a new cache, same calls
        # one run in four: every K row with a large common offset (OffsetRows), a prefill long
        # enough for some of it to be read from the codes (past a recent window of 64), and a
        # decode held to the contract right after it
        self.offset = OffsetRows(data, self.d) if data.draw(
            st.integers(0, 3), label="K offset?") == 0 else None
        self.length = 0
        least = min(self.cap, 80) if self.offset else 0
        t = data.draw(st.integers(least, min(self.cap, 300)), label="prefill")
        k, k32 = self.draw_kv(data, (t, self.hkv, self.d), "k", "prefill k")
        v, v32 = self.draw_kv(data, (t, self.hkv, self.d), "v", "prefill v")
        self.cache.append(k, v)
        self.twin.append(k32, v32)
        self.length = t
        if self.offset:
            self.decode_beside_the_offset(data)

    def draw_kv(self, data, shape, side, label, *, bad=False):
        """K or V rows (side "k" or "v"), the run's OffsetRows when it has them."""
        ordinary = None
        if self.offset is not None:
            ordinary = self.offset.k if side == "k" else self.offset.v
        return draw_values(data, shape, label, bad=bad, ordinary=ordinary)

    @invariant()
    def length_is_tracked(self):
        if hasattr(self, "cache"):
            assert len(self.cache) == self.length <= self.cap

    @invariant()
    def an_emptied_cache_is_a_fresh_one(self):
        """Since evict forgot everything, the cache holds what the fresh cache fed the same calls
        holds: every array of its state, bit for bit (no offsets of the history forgotten, no
        stale 4-bit K codes or group ranges)."""
        if getattr(self, "fresh", None) is None:
            return
        assert_same_states(self.cache, self.fresh, skip=("max_seq",))

    def on_all(self, call):
        """call(c) for the cache, its twin and the fresh cache when there is one."""
        for c in (self.cache, self.twin, self.fresh):
            if c is not None:
                call(c)

    def expect_refused(self, call, what):
        event(f"{what} refused")
        before = snapshot(self.cache)
        with pytest.raises((ValueError, TypeError)):
            call()
        assert_same_state(self.cache, before)

    def bad(self, data, choices):
        """None for a valid call (7 in 8), else which part of it to make invalid."""
        return data.draw(st.sampled_from(choices), label="invalid") if data.draw(
            st.integers(0, 7), label="invalid?") == 0 else None

    @rule(data=st.data())
    def append(self, data):
        room = self.cap - self.length
        bad = self.bad(data, ["k", "v", "shape", "capacity"])
        if bad == "capacity":
            t = room + data.draw(st.integers(1, 3), label="T past max_seq")
        else:
            t = data.draw(st.integers(0, min(room, 300)), label="T")
        one = t == 1 and data.draw(st.booleans(), label="as [Hkv, D]")
        shape = (self.hkv, self.d) if one else (t, self.hkv, self.d)
        k, k32 = self.draw_kv(data, shape, "k", "k", bad=bad == "k")
        v, v32 = self.draw_kv(data, shape, "v", "v", bad=bad == "v")
        if bad == "shape":
            v = v[..., :-1]
        if bad is not None and (bad not in ("k", "v") or t):
            self.expect_refused(lambda: self.cache.append(k, v), "append")
            return
        event("append stored")
        self.cache.append(k, v)
        self.twin.append(k32, v32)
        if self.fresh is not None:
            self.fresh.append(k32, v32)
        self.length += t
        assert_same_state(self.cache, snapshot(self.twin))

    @rule(data=st.data())
    def decode(self, data):
        if self.length == 0:
            self.expect_refused(lambda: self.cache.decode(np.ones((self.hkv, self.d), np.float32)),
                                "decode")
            return
        bad = self.bad(data, ["q", "scale", "q*scale", "softcap", "q_bits", "window", "T"])
        most = _rules.decode_queries_max(self.cache.recent, self.cap, self.length)
        if data.draw(st.booleans(), label="long T?"):   # up to several times the window
            t = data.draw(st.integers(1, min(self.length, 3 * self.cache.recent + 3)), label="T")
        else:
            t = data.draw(st.integers(1, min(self.length, 4)), label="T")
        if bad == "T":
            t = self.length + 1
        elif t > most:                      # its first queries' windows have left the ring
            bad = "T past the ring"
        h = self.hkv * data.draw(st.integers(1, 3), label="group")
        shape = (h, self.d) if t == 1 and data.draw(st.booleans(), label="as [H, D]") else (t, h, self.d)
        q, q32 = draw_values(data, shape, "q", bad=bad == "q",
                             ordinary=self.offset.q(data) if self.offset else None)
        qmax = float(np.abs(q32).max()) if bad != "q" else 1.0
        kw = {"q_bits": data.draw(st.sampled_from([16, 16, 8]), label="q_bits")}
        scale = data.draw(st.sampled_from([None, 1e-30, 0.05, 1.0, 2.0 ** 40]), label="scale")
        s = 1.0 / math.sqrt(self.d) if scale is None else scale
        if qmax and s * qmax > 2.0 ** 40:                   # keep the call valid ...
            s = 2.0 ** 40 / qmax * (1 - 1e-6)           # (the scale is rounded to float32)
            scale = s
        if bad == "scale":                                  # ... unless it is to be refused
            scale = data.draw(st.sampled_from([0.0, -1.0, float("nan"), 1e39, "x"]), label="bad scale")
        if bad == "q*scale" and qmax:
            scale = 2.0 ** 41 / qmax
        if scale is not None:
            kw["scale"] = scale
        if data.draw(st.booleans(), label="window?"):
            kw["window"] = data.draw(st.integers(1, self.length + 300), label="window")
            kw["sinks"] = data.draw(st.integers(0, min(kw["window"], 8)), label="sinks")
        if bad == "window":
            kw.update(window=data.draw(st.sampled_from([0, -3, 2 ** 64]), label="bad window"))
        if data.draw(st.booleans(), label="softcap?"):
            kw["softcap"] = data.draw(st.sampled_from([0.5, 30.0, 1e5, 1e30]), label="softcap")
        if bad == "softcap":
            kw["softcap"] = data.draw(st.sampled_from([0.0, -1.0, 1e-39, float("inf")]), label="bad softcap")
        if bad == "q_bits":
            kw["q_bits"] = data.draw(st.sampled_from([4, 8.0, True, 32]), label="bad q_bits")
        if bad is not None and (bad != "q*scale" or qmax):
            self.expect_refused(lambda: self.cache.decode(q, **kw), "decode")
            return
        out, ref = self.check_decode(data, q, q32, kw, s)
        if self.offset and kw["q_bits"] == 16 and s <= 0.25 and "softcap" not in kw:
            self.check_contract(out, ref)                   # ordinary logits

    def check_decode(self, data, q, q32, kw, s):
        """Decode q (valid) with the options kw (s: the scale it uses) on every tier, each with
        its own thread count: the same bits on all, finite, within decode_tolerance of float64
        attention over each query's own history. Returns (out, that reference)."""
        def decoded():                          # on each tier, with its own thread count
            ia.set_num_threads(data.draw(st.integers(1, 3), label="threads"))
            return np.asarray(self.cache.decode(q, **kw))

        before = ia.get_num_threads()
        try:
            outs = each_tier(decoded)
        finally:
            ia.set_num_threads(before)
        assert_tiers_agree(outs)
        out = outs["scalar"]
        if self.fresh is not None:
            np.testing.assert_array_equal(np.asarray(self.fresh.decode(q, **kw)).view(np.int32),
                                          out.view(np.int32))
        assert out.shape == q32.shape and np.all(np.isfinite(out))
        kd, vd = self.cache.dequantize()
        assert np.all(np.isfinite(kd)) and np.all(np.isfinite(vd))
        opts = {k: kw[k] for k in ("window", "sinks", "softcap") if k in kw}
        ref = attention_over_history(self.cache, q32, scale=s, **opts)   # each query's own view
        tol = decode_tolerance(self.cache, q32, s, kw.get("q_bits", 16))
        err = float(np.abs(out.astype(np.float64) - ref).max())
        assert err <= tol, f"error {err:.3g} above the bound {tol:.3g}"
        ordinary = tol <= 2.1e-3 * float(np.abs(vd).max()) + 1e-37
        event("decode checked" + (" at ordinary logits (the 1e-3 regime)" if ordinary else ""))
        return out, ref

    @precondition(lambda self: self.offset is not None and self.length > 0)
    @rule(data=st.data())
    def decode_beside_the_offset(self, data):
        """A run with a large K offset (OffsetRows): a decode at q_bits=16 and the default scale,
        its logits ordinary, is held to the contract itself (as decode's own draws are when
        they are ordinary: q_bits=16, a scale up to 1/4, no soft cap)."""
        t = data.draw(st.integers(1, min(self.length, 4)), label="T")
        h = self.hkv * data.draw(st.integers(1, 3), label="group")
        q, q32 = draw_values(data, (t, h, self.d), "q", ordinary=self.offset.q(data))
        kw = {}
        if data.draw(st.booleans(), label="window?"):
            kw["window"] = data.draw(st.integers(1, self.length + 300), label="window")
            kw["sinks"] = data.draw(st.integers(0, min(kw["window"], 8)), label="sinks")
        self.check_contract(*self.check_decode(data, q, q32, kw, 1.0 / math.sqrt(self.d)))

    def check_contract(self, out, ref):
        """A decode of a run with a large K offset, at ordinary logits: within the contract."""
        got = rel_err(out.reshape(-1, self.d), ref.reshape(-1, self.d))
        assert got <= CONTRACT, f"error {got:.3g} beside a K offset of {self.offset.c:g}"
        event("decode checked at the contract beside a large K offset")

    @rule(data=st.data())
    def prefill(self, data):
        """append + decode of T rows' queries in one call, T up to several times the recent
        window: the bits of T single append-then-decode steps on a copy (without a window, with
        the offsets still to be set from the first append past position 0: of one append and one
        decode), and the twin's state after the append."""
        room = self.cap - self.length
        bad = self.bad(data, ["k", "v", "q", "capacity", "T"])
        if room == 0 and bad is None:
            bad = "capacity"
        t = data.draw(st.integers(1, max(1, min(room, 3 * self.cache.recent + 40))), label="T")
        if bad == "capacity":
            t = room + data.draw(st.integers(1, 3), label="T past max_seq")
        h = self.hkv * data.draw(st.integers(1, 3), label="group")
        k, k32 = self.draw_kv(data, (t, self.hkv, self.d), "k", "k", bad=bad == "k")
        v, v32 = self.draw_kv(data, (t, self.hkv, self.d), "v", "v", bad=bad == "v")
        q, q32 = draw_values(data, (t + (bad == "T"), h, self.d), "q", bad=bad == "q")
        kw = {}
        if data.draw(st.booleans(), label="window?"):
            kw["window"] = data.draw(st.integers(1, self.length + t + 10), label="window")
            kw["sinks"] = data.draw(st.integers(0, min(kw["window"], 4)), label="sinks")
        qmax = float(np.abs(q32).max()) if q32.size else 0.0
        if bad != "q" and qmax * (1.0 / math.sqrt(self.d)) > 2.0 ** 40:
            kw["scale"] = 2.0 ** 40 / qmax * (1 - 1e-6)
        if bad is not None:
            self.expect_refused(lambda: self.cache.prefill(k, v, q, **kw), "prefill")
            return
        copy = type(self.cache).from_state_dict(self.cache.state_dict(), max_seq=self.cap)
        by_split = self.cache.center and not self.cache.recent and self.cache.k_offset is None
        got = np.asarray(self.cache.prefill(k, v, q, **kw))
        if by_split:
            copy.append(k, v)
            want = np.asarray(copy.decode(q, **kw))
        else:
            want = []
            for i in range(t):
                copy.append(k[i], v[i])
                want.append(np.asarray(copy.decode(q[i], **kw)))
            want = np.stack(want)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
        assert_same_state(self.cache, snapshot(copy))
        self.twin.append(k32, v32)
        if self.fresh is not None:          # (since an evict of everything: the same outputs)
            np.testing.assert_array_equal(np.asarray(self.fresh.prefill(k, v, q, **kw)), got)
        self.length += t
        assert_same_state(self.cache, snapshot(self.twin))
        event("prefill checked" + (" past the ring" if t > self.cache.recent + 1 else ""))

    @rule(data=st.data())
    def truncate(self, data):
        n = data.draw(st.integers(0, self.length), label="n")
        if self.bad(data, ["n"]):
            n = data.draw(st.sampled_from([-1, self.length + 1, 2 ** 64]), label="bad n")
        if not 0 <= n <= self.length:
            self.expect_refused(lambda: self.cache.truncate(n), "truncate")
            return
        self.on_all(lambda c: c.truncate(n))
        self.length = n

    @rule(data=st.data())
    def evict(self, data):
        step = 32 if getattr(self.cache, "k_bits", 8) == 4 else 1      # K's groups stay whole
        n = step * data.draw(st.integers(0, self.length // step), label="n")
        if self.bad(data, ["n"]):
            n = data.draw(st.sampled_from([-1, self.length + 1, 2 ** 64, 31]), label="bad n")
        if not (0 <= n <= self.length and (n % step == 0 or n == self.length)):
            self.expect_refused(lambda: self.cache.evict(n), "evict")
            return
        self.on_all(lambda c: c.evict(n))
        self.length -= n
        assert_same_state(self.cache, snapshot(self.twin))

    @precondition(lambda self: self.length > 0)
    @rule()
    def evict_everything(self):
        """evict(len(cache)), at any length (whole K groups or not): from now on the cache must
        be a fresh one fed the same calls."""
        event("evicted everything" + (" with offsets" if self.cache.k_offset is not None else ""))
        self.on_all(lambda c: c.evict(self.length))
        self.length = 0
        assert_same_state(self.cache, snapshot(self.twin))
        if self.fresh is None:
            self.fresh = self.new_cache()

    @rule()
    def reset(self):
        self.on_all(lambda c: c.reset())
        self.length = 0

    @rule(data=st.data())
    def save_and_load(self, data):
        import io
        f = io.BytesIO()
        saved = self.cache.state_dict()
        self.cache.save(f)
        f.seek(0)
        grow = data.draw(st.integers(0, 20), label="extra capacity")
        kind = type(self.cache)
        loaded = kind.load(f, max_seq=self.cap + grow if grow else None)
        assert_same_state(loaded, snapshot(self.cache))
        assert_loads_exactly(dict(saved, max_seq=loaded.max_seq), loaded)     # bit for bit
        if self.length:
            q = np.random.default_rng(self.length).standard_normal((self.hkv, self.d)).astype(np.float32)
            np.testing.assert_array_equal(loaded.decode(q), self.cache.decode(q))
        self.cache, self.cap = loaded, loaded.max_seq
        twin = kind.from_state_dict(self.twin.state_dict(), max_seq=self.cap)
        self.twin = twin
        if self.fresh is not None:              # (the same capacity, for the appends to come)
            self.fresh = kind.from_state_dict(self.fresh.state_dict(), max_seq=self.cap)


class KV4Machine(CacheMachine):
    """The same calls on a KVCache with a side at 4 bits (4/4, 8/4 or 4/8; head dims of whole
    nibble blocks, K at 4 bits with a window of at least one group)."""

    def new_caches(self, data):
        self.hkv = data.draw(st.integers(1, 3), label="n_kv_heads")
        self.d = data.draw(st.sampled_from([32, 64, 96, 128]), label="head_dim")
        self.cap = data.draw(st.integers(1, 600), label="max_seq")
        kb, vb = data.draw(st.sampled_from([(4, 4), (8, 4), (4, 8)]), label="k_bits, v_bits")
        fmt = {"k_bits": kb, "v_bits": vb, "rotate": data.draw(st.booleans(), label="rotate"),
               "keep_first": data.draw(st.booleans(), label="keep_first"),
               "recent": data.draw(st.sampled_from([32, 64, 100] if kb == 4 else [0, 16, 64]),
                                   label="recent")}
        self.new_cache = lambda: ia.KVCache(self.hkv, self.cap, self.d, **fmt)
        return self.new_cache(), self.new_cache()


for _machine in (CacheMachine, KV4Machine):
    _machine.TestCase.settings = settings(
        max_examples=EXAMPLES, stateful_step_count=12, deadline=None,
        derandomize=not os.environ.get("INT8ATTN_FUZZ_RANDOM"), database=None,
        suppress_health_check=list(HealthCheck))
test_cache_machine = CacheMachine.TestCase
test_kv4_machine = KV4Machine.TestCase


# -- a state with one field removed or perturbed ---------------------------------------------

def perturbed(data, state):
    """state with one field removed or changed, the field's name and how."""
    key = data.draw(st.sampled_from(sorted(state)), label="field")
    a = np.asarray(state[key])
    ways = ["remove", "type"]
    if a.ndim == 0:
        ways += ["value", "dtype"]
    else:
        ways += ["dtype", "shape"] + (["bit flip", "value"] if a.size else [])
        ways += ["not halves"] if a.size and a.dtype == np.float32 else []
        ways += ["byte order"] if a.dtype.itemsize > 1 else []
    how = data.draw(st.sampled_from(ways), label="how")
    out = dict(state)
    if how == "remove":
        del out[key]
        return out, key, how
    if how == "type":
        new = data.draw(st.sampled_from(["text", "list", "float", "none", "bytes"]), label="type")
        out[key] = {"text": str(a.tolist())[:20], "list": [a.tolist()], "float": 1.5,
                    "none": None, "bytes": b"\x01"}[new]
        return out, key, how
    if how == "dtype":
        kinds = [np.bool_, np.int8, np.uint8, np.int32, np.uint64, np.float16, np.float64]
        dtype = data.draw(st.sampled_from([k for k in kinds if k != a.dtype]), label="dtype")
        with np.errstate(all="ignore"):
            out[key] = a.astype(dtype) if a.dtype.kind != "U" else np.asarray(1, dtype)
        return out, key, how
    if how == "byte order":
        out[key] = a.astype(a.dtype.newbyteorder())
        return out, key, how
    if how == "shape":
        axis = data.draw(st.integers(0, a.ndim - 1), label="axis")
        if a.shape[axis] and not data.draw(st.booleans(), label="grow"):
            out[key] = np.delete(a, -1, axis)
        else:
            extra = list(a.shape)
            extra[axis] = 1
            out[key] = np.concatenate([a, np.zeros(extra, a.dtype)], axis)
        return out, key, how
    if a.ndim == 0:                              # a value: an int or a bool
        if a.dtype.kind == "b":
            out[key] = np.bool_(not a)
        elif a.dtype.kind in "iu":
            v = int(a)
            new = data.draw(st.sampled_from([v + 1, v - 1, 0, -1, 2 ** 63 - 1, 2 ** 64 - 1]),
                            label="value")
            out[key] = np.uint64(new) if new >= 2 ** 63 else np.int64(new)
        else:
            out[key] = np.asarray("int8attn.KVCache")
        return out, key, how
    b = a.copy()
    flat = b.reshape(-1)
    i = data.draw(st.integers(0, flat.size - 1), label="element")
    if how == "bit flip":
        bits = flat.view(f"u{b.dtype.itemsize}")
        bits[i] ^= bits.dtype.type(1) << bits.dtype.type(
            data.draw(st.integers(0, 8 * b.dtype.itemsize - 1), label="bit"))
    elif how == "not halves":
        flat[i] = np.nextafter(flat[i], np.float32(np.inf))
    elif b.dtype.kind == "f":
        flat[i] = data.draw(st.sampled_from([np.nan, np.inf, -0.0, 0.0, 1e38, -1e-45, 3.0]),
                            label="value")
    else:
        info = np.iinfo(b.dtype)
        flat[i] = data.draw(st.sampled_from([info.min, info.max, 16, 0]), label="value")
    out[key] = b
    return out, key, how


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          phases=[p for p in Phase if p is not Phase.explain],
          derandomize=not os.environ.get("INT8ATTN_FUZZ_RANDOM"),
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_perturbed_state_loads_exactly_or_is_refused(data):
    import io
    hkv = data.draw(st.integers(1, 3), label="n_kv_heads")
    d = data.draw(st.sampled_from([32, 64, 96]), label="head_dim")
    cap = data.draw(st.integers(1, 300), label="max_seq")
    widths = data.draw(st.sampled_from([(8, 8), (4, 4), (8, 4), (4, 8)]), label="k_bits, v_bits")
    if widths == (8, 8):
        fmt = dict(data.draw(st.sampled_from(list(ia.FORMATS.values())), label="format"))
    else:
        fmt = {"keep_first": data.draw(st.booleans(), label="keep_first"),
               "rotate": data.draw(st.booleans(), label="rotate"),
               "recent": data.draw(st.sampled_from([32, 64] if widths[0] == 4 else [0, 16]),
                                   label="recent")}
    cache = ia.KVCache(hkv, cap, d, k_bits=widths[0], v_bits=widths[1], **fmt)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    n = data.draw(st.integers(0, cap), label="length")
    if n:
        cache.append(rng.standard_normal((n, hkv, d)) + 2, rng.standard_normal((n, hkv, d)))
    back = data.draw(st.integers(0, n), label="truncate to")     # fewer window rows, offsets
    cache.truncate(back)
    state, key, how = perturbed(data, cache.state_dict())
    event(f"{how} {key}")
    f = None
    if data.draw(st.booleans(), label="through a file"):
        f = io.BytesIO()
        np.savez(f, **state)
        f.seek(0)
    before = live_caches()
    try:
        loaded, msg = ia.KVCache.load(f) if f else ia.KVCache.from_state_dict(state), None
    except ValueError as e:
        loaded, msg = None, str(e)
    if msg is not None:
        event("refused")
        if how == "remove":
            assert msg in (f"state lacks {key}, which format_version 4 writes",
                           f"state lacks {key}: not an int8attn cache"), msg
        elif np.ndim(cache.state_dict()[key]) or how == "type":
            assert key in msg, msg                       # the array or the value itself
        else:                                            # a setting: it or what it sizes
            assert any(k in msg for k in state), msg
        assert live_caches() == before                   # (the exception is gone by now)
        return
    event("loaded")
    assert how != "remove"                               # every field of version 4 is required
    assert_loads_exactly(state, loaded)
