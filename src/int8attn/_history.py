"""What a cache holds, read back: its codes and scales as views, its float rows, the history as
floats, and its file (``state_dict``, ``save``, ``load``). ``History`` is a part of ``KVCache``
(``_kvcache``), over the compiled store's reads (``_cache._Store``: ``_view``, ``_copy``,
``_export``, ``_import``, ``_dequantize``); ``_state`` checks and builds the states."""

from . import _cache
from . import _state


class History:
    """``KVCache``'s reads of what it holds and its file (a base of ``KVCache``, not a cache)."""

    __slots__ = ()

    def _eight(self, name, bits):
        """The int8 views exist only for a side at 8 bits."""
        if bits != 8:
            raise AttributeError(f"{name}: this cache stores {name[0].upper()} at {bits} bits, "
                                 f"without int8 codes (state_dict() holds its codes)")

    # -- the stored history ---------------------------------------------------------------

    @property
    def k_i8(self):
        """Read-only view of the stored K codes, [Hkv, len, D] int8 (no copy); K at 8 bits."""
        self._eight("k_i8", self.k_bits)
        return self._view("k_codes")

    @property
    def v_i8(self):
        """The stored V codes, [Hkv, len, D] int8: a read-only copy (the cache keeps V in
        tiles of 4 positions, so that its integer dots sum 4 positions per lane; this gathers
        them back into rows); V at 8 bits."""
        self._eight("v_i8", self.v_bits)
        self._enter()
        try:
            return _cache._readonly(self._export(("v_i8",))["v_i8"])
        finally:
            self._leave()

    @property
    def k_scale(self):
        """Read-only view of the K scales, [Hkv, len] float32 (no copy); K at 8 bits."""
        self._eight("k_scale", self.k_bits)
        return self._view("k_scale")

    @property
    def v_scale(self):
        """Read-only view of the V scales, [Hkv, len] float32 (no copy); V at 8 bits."""
        self._eight("v_scale", self.v_bits)
        return self._view("v_scale")

    @property
    def k_first(self):
        """Position 0 of K as appended, [Hkv, D] float32 (a copy), when the cache keeps it and
        holds a token; else None."""
        return self._copy("k_first") if self.keep_first and len(self) else None

    @property
    def v_first(self):
        """Position 0 of V as appended, like ``k_first``."""
        return self._copy("v_first") if self.keep_first and len(self) else None

    @property
    def k_offset(self):
        """The K offset per kv head, [Hkv, D] float32 (a copy) in the stored space (rotated when
        the cache rotates), when the cache centers and its offsets are set (see ``center``); else None."""
        return self._copy("k_offset") if self.center and self._offsets_set else None

    @property
    def v_offset(self):
        """The V offset per kv head, like ``k_offset``."""
        return self._copy("v_offset") if self.center and self._offsets_set else None

    def dequantize(self):
        """The history decode attends over, as floats: ``(k, v)``, each [len, Hkv, D] float32:
        code * scale (plus the offset when centered), rotated back when the cache rotates; with
        keep_first, position 0 is its float row."""
        self._enter()
        try:
            return self._dequantize()
        finally:
            self._leave()

    # -- save and load --------------------------------------------------------------------

    def state_dict(self):
        """The cache as a dict of numpy arrays (copies), the content of ``save``'s file:

        ``format`` ("int8attn.Int8KVCache"), ``format_version`` (4), ``n_kv_heads``,
        ``max_seq``, ``head_dim``, ``length`` (ints); ``k_bits``, ``v_bits`` (8 or 4);
        ``rotate`` (bool), ``rotation_seed`` and ``rotation_block`` (ints); ``keep_first``,
        ``center`` (bools); a side at 8 bits: ``k_i8`` / ``v_i8`` [Hkv, length, D] int8
        (rotated codes when the side rotates) and ``k_scale`` / ``v_scale`` [Hkv, length]
        float32; K at 4 bits: ``k_codes`` [Hkv, length, D] uint8 (0 .. 15) and
        ``k_group_min``, ``k_group_step`` [Hkv, ceil(length / 32), D] float32; V at 4 bits:
        ``v_codes``, ``v_min`` [Hkv, length] and ``v_scale`` (its steps); ``k_first``,
        ``v_first``, ``k_offset``, ``v_offset`` [Hkv, D] float32 (zeros where the cache has
        none); ``offsets_set`` (bool); ``recent`` (int); ``k_recent``, ``v_recent`` [n, Hkv, D]
        float32, the floats held for the last n positions (n = 0 without a recent window).
        Files of versions 1-3 load as docs/architecture.md ("The file format") says.
        """
        self._enter()
        try:
            rows = self._export(_state.fields(self.k_bits, self.v_bits))
            return _state.state_of(self.n_kv_heads, self.max_seq, self.head_dim, self.k_bits,
                                   self.v_bits, self.rotate, self.rotation_seed, self.keep_first,
                                   self.center, self.recent, len(self), self._offsets_set, rows)
        finally:
            self._leave()

    @classmethod
    def from_state_dict(cls, state, max_seq=None):
        """A cache holding exactly what ``state`` (from ``state_dict``) holds: its
        ``state_dict()`` equals ``state`` field by field, bit for bit (a state of an older
        format_version: upgraded as docs/architecture.md, "The file format", says). ``max_seq``
        defaults to the saved capacity and must be at least the saved length.

        Every field the state's format_version writes is required (nothing defaults), and each
        is taken as it is: integers of any integer dtype, every other field of its own type,
        dtype and shape, nothing converted. Raises ValueError naming the field that is missing
        (``state lacks rotate, which format_version 4 writes``), mis-typed, mis-shaped, out of
        range, not what a cache writes (window or K group rows that are not halves times a
        power of two, naming the first; float rows that are not zeros where the cache holds
        none) or impossible; a refused state creates no cache."""
        s = _state.check(state, max_seq)
        general = "k_bits" in cls.__signature__.parameters
        try:
            cache = cls(s.n_kv_heads, s.max_seq, s.head_dim,
                        **_state.options(s, general, cls.__name__))
        except (MemoryError, ValueError) as e:
            raise _state.allocation_error(s, max_seq, e) from None
        cache._enter()
        try:
            cache._import(s.length, s.arrays, s.offsets_set, s.round_window)
        finally:
            cache._leave()
        return cache

    def save(self, path):
        """Write the cache to ``path`` (a path, or a binary file object open for writing) as an
        uncompressed ``.npz`` (numpy can read it: ``numpy.load(path)`` gives the arrays of
        ``state_dict``; zip CRCs guard every array)."""
        _state.save(self.state_dict(), path)

    @classmethod
    def load(cls, path, max_seq=None):
        """A cache from a file written by ``save`` (a path, or a binary file object open for
        reading), as ``from_state_dict`` loads its arrays: exactly, or refused with ValueError
        naming the field. A file that cannot be opened raises OSError (a missing file,
        FileNotFoundError); one that is truncated, corrupted or foreign raises ValueError (naming
        the array numpy could not read, when it got that far)."""
        return cls.from_state_dict(_state.read(path), max_seq)


