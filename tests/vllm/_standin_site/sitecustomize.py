"""On PYTHONPATH of a vLLM server the tests start: gives int8attn the numpy stand-in of its
PagedKVCache in every process of the server while the package has none."""
import os
import sys

import int8attn as ia

if not hasattr(ia, "PagedKVCache"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _paged_standin import PagedKVCache
    ia.PagedKVCache = PagedKVCache
