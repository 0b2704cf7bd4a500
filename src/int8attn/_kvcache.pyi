"""Type stub of the caches (int8attn._kvcache)."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

class KVCache:
    k_bits: int
    v_bits: int
    rotate: bool
    rotation_seed: int
    keep_first: bool
    center: bool
    recent: int
    def __init__(
        self, n_kv_heads: int, max_seq: int, head_dim: int, *, k_bits: int = 8, v_bits: int = 8,
        rotate: bool = True, rotation_seed: int = 0, keep_first: bool = True,
        center: bool | None = None, recent: int = 64,
    ) -> None: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def max_seq(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def k_i8(self) -> npt.NDArray[np.int8]: ...
    @property
    def v_i8(self) -> npt.NDArray[np.int8]: ...
    @property
    def k_scale(self) -> npt.NDArray[np.float32]: ...
    @property
    def v_scale(self) -> npt.NDArray[np.float32]: ...
    @property
    def k_first(self) -> npt.NDArray[np.float32] | None: ...
    @property
    def v_first(self) -> npt.NDArray[np.float32] | None: ...
    @property
    def k_offset(self) -> npt.NDArray[np.float32] | None: ...
    @property
    def v_offset(self) -> npt.NDArray[np.float32] | None: ...
    def dequantize(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
    def reset(self) -> None: ...
    def truncate(self, n: int) -> None: ...
    def evict(self, n: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    @classmethod
    def from_state_dict(cls, state: dict[str, Any], max_seq: int | None = None) -> "KVCache": ...
    def save(self, path: Any) -> None: ...  # a path or a binary file object
    @classmethod
    def load(cls, path: Any, max_seq: int | None = None) -> "KVCache": ...
    def append(self, k: npt.ArrayLike | Any, v: npt.ArrayLike | Any) -> None: ...
    def decode(
        self,
        q: npt.ArrayLike | Any,
        *,
        scale: float | None = None,
        q_bits: int = 16,
        out: npt.NDArray[np.float32] | Any | None = None,
        window: int | None = None,
        sinks: int = 0,
        softcap: float | None = None,
    ) -> npt.NDArray[np.float32] | Any: ...
    def prefill(
        self,
        k: npt.ArrayLike | Any,
        v: npt.ArrayLike | Any,
        q: npt.ArrayLike | Any,
        *,
        scale: float | None = None,
        q_bits: int = 16,
        out: npt.NDArray[np.float32] | Any | None = None,
        window: int | None = None,
        sinks: int = 0,
        softcap: float | None = None,
    ) -> npt.NDArray[np.float32] | Any: ...

class Int8KVCache(KVCache):
    def __init__(
        self, n_kv_heads: int, max_seq: int, head_dim: int, *, rotate: bool = True,
        rotation_seed: int = 0, keep_first: bool = True, center: bool | None = None,
        recent: int = 64,
    ) -> None: ...

def decode_batch(
    caches: Sequence[KVCache],
    q: npt.ArrayLike | Any,
    *,
    scale: float | None = None,
    q_bits: int = 16,
    out: npt.NDArray[np.float32] | Any | None = None,
    window: int | None = None,
    sinks: int = 0,
    softcap: float | None = None,
) -> npt.NDArray[np.float32] | Any: ...

def prefill_batch(
    caches: Sequence[KVCache],
    k: npt.ArrayLike | Any,
    v: npt.ArrayLike | Any,
    q: npt.ArrayLike | Any,
    *,
    scale: float | None = None,
    q_bits: int = 16,
    out: npt.NDArray[np.float32] | Any | None = None,
    window: int | None = None,
    sinks: int = 0,
    softcap: float | None = None,
) -> npt.NDArray[np.float32] | Any: ...
