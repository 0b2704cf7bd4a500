# The paged pool's compiled part: ``_Paged``, the base of ``PagedKVCache`` (_paged.py). Included
# by _cache.pyx: one extension module, so that the engine's tier, thread count and thread pool
# exist once in the process.

# The element types a pool takes rows in (_engine.h), by the numpy dtype that carries them: a
# bfloat16 row arrives as its 16-bit patterns (numpy has no bfloat16).
_ROWS = {"float32": I8A_F32, "bfloat16": I8A_BF16, "float16": I8A_F16}
_CARRIER = {I8A_F32: np.dtype(np.float32), I8A_BF16: np.dtype(np.uint16),
            I8A_F16: np.dtype(np.float16)}


cdef bint _rows_are(a, int kind):
    """Whether a is an aligned C-contiguous array of element type kind's carrier."""
    return (kind in _CARRIER and a.dtype == _CARRIER[kind] and a.flags.c_contiguous
            and a.flags.aligned)


def _narrow(x, y, int kind):
    """y = x (float32, C-contiguous) in kind's type (bfloat16 or float16, y its carrier, the same
    size): nearest, ties to even (i8a_narrow)."""
    if not (kind in (I8A_BF16, I8A_F16) and x.dtype == np.float32 and x.flags.c_contiguous
            and _rows_are(y, kind) and x.size == y.size):
        raise ValueError("_narrow: x and y do not fit")
    cdef const float *xp = <const float *>_ptr(x)
    cdef uint16_t *yp = <uint16_t *>_ptr(y)
    cdef size_t n = x.size
    with nogil:
        i8a_narrow(xp, n, kind, yp)


def _paged_block_bytes(size_t n_kv_heads, size_t head_dim, size_t block_size):
    """Bytes a block of a pool (i8a_paged_block_bytes), 0 when they do not fit a size_t."""
    return i8a_paged_block_bytes(n_kv_heads, head_dim, block_size)


cdef class _Paged:
    """The compiled part of a PagedKVCache: the pool's memory (its own or the caller's numpy
    array, referenced here), the engine's i8a_paged over it, the busy flag, and one engine call
    per method on arguments _args has checked (the flag held)."""

    cdef i8a_paged _p
    cdef object _mem                          # uint8 [num_blocks, block_bytes], 64-byte aligned
    cdef object _sign                         # [1, D] float32 +-1 of the rotation
    cdef object _open                         # the open blocks' arrays (None without them)
    cdef int _busy
    cdef readonly object rotation_seed

    def __cinit__(self, *args, **kwargs):
        o = _args.paged_constructor(args, kwargs)
        bb = i8a_paged_block_bytes(o.n_kv_heads, o.head_dim, o.block_size)
        mem = _args.paged_buffer(o.buffer, o.num_blocks, bb)
        self._sign = np.empty((1, o.head_dim), np.float32)
        i8a_rotation_signs(o.rotation_seed, o.head_dim, <float *>_ptr(self._sign))
        self._mem = mem
        i8a_paged_init(&self._p, <uint8_t *>_ptr(mem), o.num_blocks, o.n_kv_heads, o.head_dim,
                       o.block_size, <float *>_ptr(self._sign))
        self._open = None
        if o.open_blocks:
            rows = (o.open_blocks, o.n_kv_heads, o.block_size)
            # zeros: pages of entries never opened are never touched (an engine sizes for its
            # most sequences and uses what it runs)
            k, v = (_args.aligned_zeros(rows + (o.head_dim,), np.uint16) for _ in range(2))
            ks, vs = (_args.aligned_zeros(rows, np.float32) for _ in range(2))
            of = np.empty(o.num_blocks, np.int32)
            entries = np.empty(o.open_blocks * sizeof(i8a_open_entry), np.uint8)
            # position 0 of the sequences whose first block a block is (touched for those only)
            fk, fv = (_args.aligned_zeros((o.num_blocks, o.n_kv_heads, o.head_dim), np.float32)
                      for _ in range(2))
            held = np.zeros(o.num_blocks, np.uint8)
            self._open = (k, v, ks, vs, of, entries, fk, fv, held)
            i8a_paged_open(&self._p, o.open_blocks, <uint16_t *>_ptr(k), <uint16_t *>_ptr(v),
                           <float *>_ptr(ks), <float *>_ptr(vs), <int32_t *>_ptr(of),
                           <i8a_open_entry *>_ptr(entries), <float *>_ptr(fk),
                           <float *>_ptr(fv), <uint8_t *>_ptr(held))
        self.rotation_seed = o.rotation_seed
        self._busy = 0

    def __dealloc__(self):
        i8a_paged_free_work(&self._p)

    @property
    def n_kv_heads(self):
        """Key/value heads (Hkv)."""
        return self._p.n_kv_heads

    @property
    def head_dim(self):
        """Head dimension D."""
        return self._p.head_dim

    @property
    def block_size(self):
        """Positions a block holds."""
        return self._p.block_rows

    @property
    def num_blocks(self):
        """Blocks in the pool."""
        return self._p.blocks

    @property
    def block_bytes(self):
        """Bytes a block: n_kv_heads * block_size * (2 * head_dim + 8)."""
        return self._p.block_bytes

    @property
    def open_blocks(self):
        """Entries for blocks not yet full whose rows the pool also keeps as halves (0: none)."""
        return self._p.open_cap

    @property
    def open_nbytes(self):
        """Bytes beside the blocks with open blocks, at most: the entries, open_blocks *
        n_kv_heads * block_size * (4 * head_dim + 8), and position 0 of the sequences, room for
        one a block, num_blocks * (8 * n_kv_heads * head_dim + 1) (zeros whose pages are touched
        as entries and first blocks are used)."""
        if not self._p.open_cap:
            return 0
        return (self._p.open_cap * i8a_paged_open_bytes(self._p.n_kv_heads, self._p.head_dim,
                                                        self._p.block_rows)
                + self._p.blocks * (self._p.n_kv_heads * 8 * self._p.head_dim + 1))

    @property
    def buffer(self):
        """The pool's memory, uint8 [num_blocks, block_bytes] (the array given as buffer=, or
        the pool's own). Its bytes are the engine's layout: read and written through the pool's
        methods only."""
        return self._mem

    def _enter(self):
        if self._mem is None:
            raise RuntimeError(f"this {type(self).__name__} was never initialized")
        if not i8a_try_acquire(&self._busy):
            raise RuntimeError(f"this {type(self).__name__} is in use by another thread")

    def _leave(self):
        i8a_release(&self._busy)

    cdef _held(self):
        if not i8a_is_taken(&self._busy):
            raise RuntimeError("the pool's busy flag must be held (_enter) for this call")

    def _write(self, slots, ka, va, int kind):
        """Rows ka, va [N, Hkv, D] (aligned C-contiguous, of the element type `kind`: _ROWS)
        into slots [N] int64 (checked: each negative or below num_blocks * block_size). Returns
        0, or the engine's 1 / 2 and the bad row (i * Hkv + head) with nothing written."""
        self._held()
        cdef size_t n = slots.shape[0], bad = 0
        if not (ka.shape == va.shape == (n, self._p.n_kv_heads, self._p.head_dim)
                and _rows_are(ka, kind) and _rows_are(va, kind)
                and slots.dtype == np.int64 and slots.ndim == 1 and slots.flags.c_contiguous
                and (n == 0 or int(slots.max()) < <long long>(self._p.blocks * self._p.block_rows))):
            raise ValueError("_write: slots, k or v do not fit the pool (see write)")
        if n == 0:
            return 0, 0
        cdef const int64_t *sp = <const int64_t *>_ptr(slots)
        cdef const void *kp = _ptr(ka)
        cdef const void *vp = _ptr(va)
        cdef int rc
        with nogil:
            rc = i8a_paged_write(i8a_load_tier(&_kt), &self._p, sp, n, kp, vp, kind,
                                 i8a_load_size(&_threads), &bad)
        return rc, bad

    cdef object _batch(self, starts, lens, table, size_t nq, i8a_paged_seq *few,
                       i8a_paged_seq **sp, size_t *ns):
        """The sequences of attend()'s batch with queries, checked as they are read (ValueError
        naming the first entry that does not fit): starts [B + 1], lens [B], table [B,
        max_blocks] int32 C-contiguous, nq the rows of q. *sp is `few` (16 entries) or an
        array the returned object keeps alive with the table's view (hold it for the call)."""
        cdef const int32_t[::1] smv = starts
        cdef const int32_t[::1] lmv = lens
        cdef const int32_t[:, ::1] tmv = table
        cdef size_t nb = lmv.shape[0], width = tmv.shape[1]
        cdef size_t rows = self._p.block_rows, blocks = self._p.blocks, b, j, need
        cdef int64_t t
        if <size_t>smv.shape[0] != nb + 1:
            raise ValueError(f"query_start must have B + 1 = {nb + 1} entries (seq_lens has "
                             f"B={nb}), got {smv.shape[0]}")
        if <size_t>tmv.shape[0] != nb:
            raise ValueError(f"block_table must have B={nb} rows (seq_lens has B), got "
                             f"{tmv.shape[0]}")
        if smv[0] != 0 or <size_t>smv[nb] != nq:
            raise ValueError(f"query_start must start at 0 and end at Nq={nq} (the rows of q); "
                             f"got {smv[0]} .. {smv[nb]}")
        seqs = None
        sp[0] = few
        if nb > 16:
            seqs = np.empty(nb * sizeof(i8a_paged_seq), np.uint8)
            sp[0] = <i8a_paged_seq *>_ptr(seqs)
        ns[0] = 0
        for b in range(nb):
            t = <int64_t>smv[b + 1] - smv[b]
            if t < 0:
                raise ValueError(f"query_start must never decrease; query_start[{b + 1}] = "
                                 f"{smv[b + 1]} < query_start[{b}] = {smv[b]}")
            if lmv[b] < t:
                raise ValueError(f"seq_lens[{b}] is {lmv[b]}, fewer than the request's {t} "
                                 f"queries (query_start[{b + 1}] - query_start[{b}]): its "
                                 f"queries are its last positions")
            if t == 0:
                continue
            need = (<size_t>lmv[b] + rows - 1) // rows
            if need > width:
                raise ValueError(f"seq_lens[{b}] = {lmv[b]} needs {need} blocks of {rows}, but "
                                 f"block_table has {width} columns")
            for j in range(need):
                if tmv[b, j] < 0 or <size_t>tmv[b, j] >= blocks:
                    raise ValueError(f"block_table[{b}, {j}] is {tmv[b, j]}, not a block of the "
                                     f"pool (0 .. {blocks - 1})")
            sp[0][ns[0]].blocks = &tmv[b, 0]
            sp[0][ns[0]].length = lmv[b]
            sp[0][ns[0]].t = t
            ns[0] += 1
        return tmv, seqs

    def _attend(self, qa, int kind, out, starts, lens, table, float scale, int q_bits,
                size_t window, size_t sinks, float softcap):
        """One i8a_paged_attend of the batch attend() describes: qa, out [Nq, H, D] float32
        (aligned, C-contiguous, H a multiple of Hkv), starts [B + 1], lens [B] and table [B,
        max_blocks] int32, C-contiguous; the options checked (_args.decode_options). The
        batch is checked here, under the busy flag, as it is read (ValueError naming the first
        entry that does not fit); the sequences without queries are left out. Returns 0, or the
        engine's status and its bad row."""
        self._held()
        # typed views: the shapes below are C reads (a call costs microseconds of Python
        # attribute lookups otherwise); q's elements are `kind`'s (_ROWS)
        if not (qa.ndim == 3 and _rows_are(qa, kind)):
            raise ValueError("_attend: q does not fit the pool (see attend)")
        cdef float[:, :, ::1] omv = out
        cdef size_t nq = qa.shape[0], h = qa.shape[1]
        if not (<size_t>qa.shape[2] == self._p.head_dim and h >= 1
                and h % self._p.n_kv_heads == 0 and <size_t>omv.shape[0] == nq
                and <size_t>omv.shape[1] == h and <size_t>omv.shape[2] == self._p.head_dim
                and scale > 0 and q_bits in (8, 16) and (sinks == 0 or sinks <= window)):
            raise ValueError("_attend: q, out or the options do not fit the pool (see attend)")
        cdef const void *qp = _ptr(qa)
        cdef i8a_paged_seq few[16]              # a batch of up to 16: no allocation
        cdef i8a_paged_seq *sp = few
        cdef size_t ns = 0, bad = 0
        keep = self._batch(starts, lens, table, nq, few, &sp, &ns)
        if ns == 0:
            return 0, 0
        cdef i8a_options opt
        opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = (scale, q_bits, window,
                                                                     sinks, softcap)
        cdef int rc
        with nogil:
            rc = i8a_paged_attend(i8a_load_tier(&_kt), &self._p, sp, ns, qp, kind, h, &opt,
                                  i8a_load_size(&_threads), &omv[0, 0, 0], &bad)
        return rc, bad

    def _dequantize(self, blocks, size_t length):
        """k, v [length, Hkv, D] float32 of the sequence whose blocks (int32, C-contiguous,
        checked) hold it."""
        self._held()
        cdef size_t need = (length + self._p.block_rows - 1) // self._p.block_rows
        if not (blocks.dtype == np.int32 and blocks.ndim == 1 and <size_t>blocks.shape[0] >= need
                and (need == 0 or (0 <= int(blocks[:need].min())
                                   and int(blocks[:need].max()) < <long long>self._p.blocks))):
            raise ValueError("_dequantize: the blocks do not fit the pool")
        k = np.zeros((length, self._p.n_kv_heads, self._p.head_dim), np.float32)
        v = np.zeros_like(k)
        if length == 0:
            return k, v
        cdef const int32_t[::1] bmv = blocks
        cdef float *kp = <float *>_ptr(k)
        cdef float *vp = <float *>_ptr(v)
        with nogil:
            i8a_paged_dequantize(i8a_load_tier(&_kt), &self._p, &bmv[0], length, kp, vp)
        return k, v
