"""The dispatch shim: tier names, the environment override, and clear errors, never a crash."""

import os
import platform
import shlex
import subprocess
import sys

import pytest

import int8attn as ia
from int8attn import _cache, _tiers

ALL_TIERS = {"scalar", "neon", "neon_dotprod", "neon_i8mm", "avx2", "avx512_vnni", "amx"}
assert set(_tiers.KNOWN_TIERS) == ALL_TIERS


def run_python(code, **env):
    """A child interpreter with env. Under user-mode emulation without binfmt (the x86 qemu
    lanes), INT8ATTN_TEST_LAUNCHER names the emulator so the child sees the same CPU."""
    full = {k: v for k, v in os.environ.items() if k not in ("INT8ATTN_ISA", "CA_CPU_ISA")}
    full.update(env)
    launcher = shlex.split(os.environ.get("INT8ATTN_TEST_LAUNCHER", ""))
    return subprocess.run(launcher + [sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=600)


def test_tier_names():
    supported = ia.supported_isas()
    assert supported[-1] == "scalar"
    assert set(supported) <= ALL_TIERS
    assert ia.isa() in supported
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        assert set(_cache._COMPILED) == {"amx", "avx512_vnni", "avx2", "scalar"}
    elif machine in ("aarch64", "arm64"):
        assert set(_cache._COMPILED) == {"neon_i8mm", "neon_dotprod", "neon", "scalar"}
        assert "neon" in supported                # every aarch64 core has Advanced SIMD


def test_default_is_the_best_supported_tier():
    r = run_python("import int8attn as ia; print(ia.isa(), ','.join(ia.supported_isas()))")
    assert r.returncode == 0, r.stderr
    best, supported = r.stdout.split()
    assert best == supported.split(",")[0]


@pytest.mark.parametrize("var", ["INT8ATTN_ISA", "CA_CPU_ISA"])
def test_environment_demotes_to_each_supported_tier(var):
    for name in ia.supported_isas():
        r = run_python("import int8attn as ia; print(ia.isa())", **{var: name.upper()})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == name
    r = run_python("import int8attn as ia; print(ia.isa())", **{var: "auto"})
    assert r.stdout.strip() == ia.supported_isas()[0]


def test_int8attn_isa_wins_over_ca_cpu_isa():
    r = run_python("import int8attn as ia; print(ia.isa())", INT8ATTN_ISA="scalar",
                   CA_CPU_ISA=ia.supported_isas()[0])
    assert r.stdout.strip() == "scalar"


def test_unsupported_tier_is_a_clear_error_not_a_crash():
    missing = sorted(ALL_TIERS - set(ia.supported_isas()))
    for name in missing + ["avx512", "sse2", "bogus"]:
        r = run_python("import int8attn", INT8ATTN_ISA=name)
        assert r.returncode == 1, (name, r.returncode, r.stderr)   # a Python error, no signal
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("ValueError: INT8ATTN_ISA=")
        assert "supported on this CPU: " + ", ".join(ia.supported_isas()) in last
        if name in ALL_TIERS and name not in _cache._COMPILED:   # another architecture's
            assert f"is a tier of {_tiers.TIER_ARCH[name]} CPUs, not compiled into this" in last


def test_private_switch_rejects_unsupported():
    with pytest.raises(ValueError, match="not supported on this CPU"):
        _cache._set_isa("bogus")
