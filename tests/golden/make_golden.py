"""Write the golden cache files of tests/test_golden.py with the int8attn on PYTHONPATH.

Run it with an old tree's package on the path (tests/golden/README.md names the commit of each
file and the command that wrote it):

    PYTHONPATH=OLD_TREE/src python tests/golden/make_golden.py NAME [NAME ...]

For each NAME (a key of GOLDEN) it builds the cache from seeded data, writes NAME.npz with that
version's own ``cache.save`` and, beside it, NAME.expect.npz: the inputs (q, q3), what the same
version gives for them (``dequantize()``, ``decode(q)``, ``decode(q3)``) and where it came from
(commit, tier, numpy). It refuses to write a file whose ``format_version`` is not the one NAME
stands for, so a NAME cannot be written by the wrong commit.

It uses only API every version 1-4 has (Int8KVCache, append, decode with the default options and
T > 1, dequantize, save, isa, set_num_threads) and KVCache where k_bits is not 8/8.
"""

import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (format_version the file must have, head_dim, seed, KVCache bits or None for the
# version's Int8KVCache with its default options)
GOLDEN = {
    "v1_rotated": (1, 64, 101, None),
    "v2_centered": (2, 64, 102, None),
    "v3_default": (3, 64, 103, None),
    "v3_f32window": (3, 32, 104, None),
    "v4_default": (4, 64, 105, None),
    "v4_k4v4": (4, 64, 106, (4, 4)),
    "v4_k8v4": (4, 32, 107, (8, 4)),
}
N_KV_HEADS = 2
H = 4                                 # query heads (2 per kv head)
SPLITS = (157, 97, 47)                # the appends: 301 tokens, past one 256-token chunk
LENGTH = sum(SPLITS)
T = 3                                 # the multi-token decode's queries


def data(seed, head_dim):
    """(k, v, q, q3) float32 from the seed: K, V [LENGTH, N_KV_HEADS, head_dim] standard normal,
    K plus 3 times a fixed per-channel direction (so centering has an offset to take out);
    q [H, head_dim], q3 [T, H, head_dim]. PCG64's float64 standard_normal is stable across numpy
    versions, so the test regenerates these from the seed."""
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal((N_KV_HEADS, head_dim))
    k = (rng.standard_normal((LENGTH, N_KV_HEADS, head_dim)) + 3.0 * direction).astype(np.float32)
    v = rng.standard_normal((LENGTH, N_KV_HEADS, head_dim)).astype(np.float32)
    q = rng.standard_normal((H, head_dim)).astype(np.float32)
    q3 = rng.standard_normal((T, H, head_dim)).astype(np.float32)
    return k, v, q, q3


def _commit(ia):
    """The commit of the int8attn tree in use, and whether its src/ is clean."""
    src = os.path.dirname(os.path.abspath(ia.__file__))
    head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", src, "status", "--porcelain", "--", "."],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head, bool(dirty)


def write(name, out_dir=HERE):
    import int8attn as ia

    version, d, seed, bits = GOLDEN[name]
    k, v, q, q3 = data(seed, d)
    if bits is None:
        cache = ia.Int8KVCache(N_KV_HEADS, LENGTH, d)       # the version's default options
    else:
        if not hasattr(ia, "KVCache"):
            raise SystemExit(f"{name}: this int8attn has no KVCache (k_bits={bits[0]}, "
                             f"v_bits={bits[1]} need file format 4)")
        cache = ia.KVCache(N_KV_HEADS, LENGTH, d, k_bits=bits[0], v_bits=bits[1])
    start = 0
    for n in SPLITS:
        cache.append(k[start:start + n], v[start:start + n])
        start += n
    assert len(cache) == LENGTH

    path = os.path.join(out_dir, f"{name}.npz")
    cache.save(path)
    with np.load(path) as z:
        written = int(z["format_version"])
    if written != version:
        os.remove(path)
        raise SystemExit(f"{name}: this int8attn writes format_version {written}, not {version}")

    ia.set_num_threads(1)
    dk, dv = cache.dequantize()
    out = cache.decode(q)
    out3 = cache.decode(q3)
    commit, dirty = _commit(ia)
    options = {key: getattr(cache, key)
               for key in ("rotate", "rotation_seed", "keep_first", "center", "recent", "k_bits",
                           "v_bits") if hasattr(cache, key)}
    np.savez_compressed(os.path.join(out_dir, f"{name}.expect.npz"),
             q=q, q3=q3, k=dk, v=dv, out=out, out3=out3,
             commit=np.str_(commit + ("+dirty" if dirty else "")), tier=np.str_(ia.isa()),
             numpy=np.str_(np.__version__), options=np.str_(repr(options)))
    print(f"{name}: format_version {written}, commit {commit[:10]}{' (dirty)' if dirty else ''}, "
          f"tier {ia.isa()}, {options}")


if __name__ == "__main__":
    names = sys.argv[1:]
    unknown = [n for n in names if n not in GOLDEN]
    if not names or unknown:
        raise SystemExit(f"usage: make_golden.py NAME [NAME ...], NAME one of {', '.join(GOLDEN)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    for n in names:
        write(n)
