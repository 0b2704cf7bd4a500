"""int8attn: decode attention directly over an int8 KV cache.

K and V are stored per token and kv head as int8 codes with one float32 absmax scale (half the
bytes of an fp16 cache; ``KVCache`` also keeps either side at 4 bits); decode computes exact
integer q.k dots, an f32 softmax and an integer V sum over the weights in 7-bit planes, with
SIMD kernels chosen for this CPU at import.

>>> import numpy as np, int8attn as ia
>>> cache = ia.Int8KVCache(n_kv_heads=8, max_seq=4096, head_dim=128)
>>> cache.append(np.ones((8, 128)), np.ones((8, 128)))
>>> cache.decode(np.ones((32, 128))).shape
(32, 128)
"""

try:
    from ._cache import get_num_threads, isa, set_num_threads, supported_isas
except ModuleNotFoundError as e:         # the sources without the compiled front end
    if e.name != f"{__name__}._cache":
        raise
    raise ImportError(
        f"int8attn's compiled module is missing from {__path__[0]}: this is the source tree, not "
        "an installed package. Install it first (pip install . from the repository root, or "
        "pip install -e . to edit it in place), and run from outside src/.") from None
from . import reference
from ._format import FORMATS
from ._kvcache import Int8KVCache, KVCache, decode_batch, prefill_batch
from ._paged import PagedKVCache

__version__ = "0.1.0"

__all__ = [
    "Int8KVCache", "KVCache", "decode_batch", "prefill_batch", "PagedKVCache", "FORMATS", "isa",
    "supported_isas", "set_num_threads", "get_num_threads", "reference", "__version__",
]
