"""The cache format's facts on the Python side, stated once: the named option presets, the value
limits, and the file format's name and versions.

The limits are the C engine's (``_engine.h``, ``_simd/dispatch.h``); ``_cache`` checks at import
that the compiled values equal these, so the two cannot drift apart.
"""

# The formats by name: Int8KVCache(..., **FORMATS[name]). Each of the first four adds one step
# to the previous; "recent" is "keep_first" with the recent window, and "default" centers it
# too. "centered" was the default before the recent window (0.3).
_NO = {"rotate": False, "keep_first": False, "center": False, "recent": 0}
FORMATS = {
    "plain": _NO,                                                       # per-row absmax int8
    "rotated": {**_NO, "rotate": True},                                 # + Hadamard rotation
    "keep_first": {**_NO, "rotate": True, "keep_first": True},          # + position 0 as floats
    "centered": {**_NO, "rotate": True, "keep_first": True, "center": True},  # + offsets
    "recent": {**_NO, "rotate": True, "keep_first": True, "recent": 64},      # keep_first + window
    "default": {"rotate": True, "keep_first": True, "center": True, "recent": 64},  # + offsets
}
DEFAULT = FORMATS["default"]

MAX_HEAD_DIM = 1024                # head_dim: a multiple of 16, at most this
CHUNK = 256                        # tokens per softmax chunk (the contract's order)
BLOCK_SIZES = (16, 32, 64, 128, 256)   # a paged pool's positions per block (powers of two)
V_TILE = 4                         # positions per tile of V's codes (the integer V dots)
BITS = (8, 4)                      # k_bits, v_bits of a KVCache
K4_GROUP = 32                      # positions per K group at 4 bits (per-channel ranges)
NIB_BLOCK = 32                     # elements per block of 4-bit codes (16 bytes: i | i + 16)
OFFSET_MIN_ROWS = 16               # rows past position 0 an append needs to set the offsets
RECENT_MAX = 1024                  # the largest recent window
VALUE_MAX = 2.0 ** 64              # |k|, |v|, |q| the format takes
QSCALE_MAX = 2.0 ** 40             # scale * max|q| of a query row
OFFSET_MAX = VALUE_MAX * 32        # an offset in the stored space (rotated): at most 2**69
SCALE_MAX = VALUE_MAX * 64 / 127   # the largest stored scale: stored rows stay within 2**70
STEP4_MAX = VALUE_MAX * 128 / 15   # the largest step at 4 bits (a range of rows within 2**70)
SOFTCAP_RANGE = (2.0 ** -126, 2.0 ** 126)   # so that 1 / softcap is a normal float32
MAX_THREADS = 256

FILE_FORMAT = "int8attn.Int8KVCache"
FILE_VERSION = 4                   # written; 1 (before keep_first and center), 2 (before the
                                   # recent window) and 3 (before k_bits and v_bits) are read too
