"""Tier names and what the environment asks for (the tier, the thread count)."""

from ._format import MAX_THREADS

# every tier of every architecture, best first within each; a build compiles its own
# architecture's and scalar
TIER_ARCH = {"amx": "x86-64", "avx512_vnni": "x86-64", "avx2": "x86-64", "neon_i8mm": "aarch64",
             "neon_dotprod": "aarch64", "neon": "aarch64", "scalar": "any CPU"}
KNOWN_TIERS = tuple(TIER_ARCH)
ENV_VARS = ("INT8ATTN_ISA", "CA_CPU_ISA")     # the second: the name the seed kernel read


def requested(environ, compiled, supported):
    """The tier the environment asks for (INT8ATTN_ISA, else CA_CPU_ISA), or None for the best;
    ValueError naming the variable when this CPU cannot run it."""
    for var in ENV_VARS:
        value = environ.get(var, "").strip().lower()
        if not value or value == "auto":
            continue
        if value in supported:
            return value
        if value in compiled:
            what = "is not a tier this CPU can run"
        elif value in TIER_ARCH:
            what = (f"is a tier of {TIER_ARCH[value]} CPUs, not compiled into this build (it "
                    f"has {', '.join(compiled)})")
        else:
            what = f"is not a known tier (known: {', '.join(KNOWN_TIERS)})"
        raise ValueError(f"{var}={value!r} {what}; supported on this CPU: {', '.join(supported)}")
    return None


def threads_from_env(environ, cpus):
    """INT8ATTN_NUM_THREADS, else the CPUs this process may run on (at most MAX_THREADS)."""
    value = environ.get("INT8ATTN_NUM_THREADS", "").strip()
    if not value:
        return min(cpus, MAX_THREADS)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"INT8ATTN_NUM_THREADS must be an integer from 1 to {MAX_THREADS}, "
                         f"got {value!r}")
    return n
