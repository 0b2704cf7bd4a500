# A serving engine's torch tensors, read in one compiled call each (_write_tensors,
# _attend_tensors: PagedKVCache.write and attend as int8attn.vllm calls them between a model's
# layers, where each Python operation costs microseconds of cold caches). Included by
# _cache.pyx.

# Set at the first call that meets torch (not imported here): (torch.Tensor, {its float32 /
# bfloat16 / float16: their _ROWS}, torch.int64).
_TORCH = None


cdef struct _Rows:
    char *data                  # row 0
    int kind                    # _ROWS
    size_t n                    # rows
    size_t stride               # bytes from a row to the next
    size_t nbytes               # bytes a row's elements take


cdef object _torch_types(x):
    """_TORCH when x is a torch.Tensor (set at the first one), else None."""
    global _TORCH
    got = _TORCH
    if got is None:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(x, torch.Tensor):
            return None
        got = _TORCH = (torch.Tensor, {torch.float32: I8A_F32, torch.bfloat16: I8A_BF16,
                                       torch.float16: I8A_F16}, torch.int64)
    return got if type(x) is got[0] else None


cdef bint _tensor_rows(x, size_t h, size_t d, _Rows *r) except -1:
    """Whether x is a plain CPU torch.Tensor [N, h, d] (h 0: any H >= 1) of a row type (_ROWS)
    that needs no grad, each of its N rows' H * d elements contiguous (strides (s, d, 1)) at
    their alignment; *r its rows."""
    tt = _torch_types(x)
    if tt is None or not x.is_cpu or x.requires_grad:
        return False
    kind = tt[1].get(x.dtype)
    shape = x.shape
    if kind is None or len(shape) != 3 or shape[2] != d or shape[1] < 1 or (h and shape[1] != h):
        return False
    st = x.stride()
    cdef size_t item = 4 if kind == I8A_F32 else 2, n = shape[0], hh = shape[1]
    cdef size_t at = x.data_ptr()
    if st[2] != 1 or (hh > 1 and st[1] != d) or (n > 1 and st[0] < hh * d) or at % item:
        return False
    r.data, r.kind, r.n = <char *>at, kind, n
    r.stride, r.nbytes = (st[0] if n > 1 else hh * d) * item, hh * d * item
    return True


cdef const char *_packed(const _Rows *r, char *scratch) noexcept nogil:
    """r's rows one after the other: r's own memory when they are, else copied into scratch
    (r.n * r.nbytes bytes)."""
    if r.stride == r.nbytes:
        return r.data
    cdef size_t i
    for i in range(r.n):
        memcpy(scratch + i * r.nbytes, r.data + i * r.stride, r.nbytes)
    return scratch


_local = threading.local()


cdef char *_scratch(size_t nbytes) except NULL:
    """nbytes at a 64-byte boundary, the calling thread's and kept for its next call (a serving
    engine's step would otherwise fault fresh pages in), valid until its next _scratch."""
    buf = getattr(_local, "buf", None)
    if buf is None or <size_t>buf.nbytes < nbytes + 64:
        buf = np.empty(max(nbytes + 64, 0 if buf is None else 2 * <size_t>buf.nbytes), np.uint8)
        _local.buf, _local.at = buf, (<size_t>_ptr(buf) + 63) & ~(<size_t>63)
    return <char *><size_t>_local.at


def _scratch_rows(shape):
    """A float32 array of this shape over the calling thread's scratch (_scratch)."""
    n = int(np.prod(shape))
    cdef size_t at = <size_t>_scratch(4 * n)
    return _local.buf[at - <size_t>_ptr(_local.buf):][:4 * n].view(np.float32).reshape(shape)


def _write_tensors(_Paged pool, slots, k, v):
    """pool.write() of a serving engine's tensors in one compiled call: slots a CPU torch int64
    [N] (contiguous), k and v [N, Hkv, D] of one row type (_tensor_rows). True when
    written; False, the pool unchanged, when the arguments are anything else, the pool is
    busy or a row is refused (write's general path then takes them, and raises)."""
    cdef _Rows kr, vr
    cdef size_t hkv = pool._p.n_kv_heads, d = pool._p.head_dim, n, i, bad = 0
    cdef uint64_t limit = <uint64_t>pool._p.blocks * pool._p.block_rows
    if not (_tensor_rows(k, hkv, d, &kr) and _tensor_rows(v, hkv, d, &vr)
            and kr.kind == vr.kind and kr.n == vr.n):
        return False
    tt = _TORCH
    n = kr.n
    if not (type(slots) is tt[0] and slots.dtype is tt[2] and slots.is_cpu
            and slots.shape == (n,) and (n < 2 or slots.stride(0) == 1)):
        return False
    if n == 0 or not i8a_try_acquire(&pool._busy):
        return False
    cdef int rc = 1
    cdef const char *kp
    cdef const char *vp
    cdef int64_t *sp
    cdef char *scratch
    try:
        # the slots copied before they are checked (the engine reads what was checked)
        scratch = _scratch(8 * n + 2 * n * kr.nbytes + 64)
        sp = <int64_t *>scratch
        memcpy(sp, <const void *><size_t>slots.data_ptr(), 8 * n)
        for i in range(n):
            if sp[i] >= 0 and <uint64_t>sp[i] >= limit:
                return False
        with nogil:
            kp = _packed(&kr, scratch + 8 * n)
            vp = _packed(&vr, scratch + 8 * n + n * kr.nbytes)
            rc = i8a_paged_write(i8a_load_tier(&_kt), &pool._p, sp, n, kp, vp, kr.kind,
                                 i8a_load_size(&_threads), &bad)
        return rc == 0
    finally:
        i8a_release(&pool._busy)


def _attend_tensors(_Paged pool, q, starts, lens, table, scale, window, softcap, out):
    """pool.attend() of a serving engine's call in one compiled call: q a CPU torch tensor [Nq,
    H, D] (_tensor_rows), out one of its shape, C-contiguous, of any row type; starts,
    lens, table int32 numpy arrays, C-contiguous (int8attn.vllm's metadata); scale a
    float (None: D ** -0.5), window None or an int, softcap None or a float, no sinks, q
    as it is (q_bits 16). True when out holds the attention; False, out and the pool
    untouched, when the arguments are anything else (attend's general path checks them:
    _args.decode_options), the pool is busy or a q row is refused. A batch that does not
    fit the pool raises ValueError as attend does."""
    cdef _Rows qr, orr
    cdef size_t d = pool._p.head_dim, hkv = pool._p.n_kv_heads, h, nq, ns = 0, bad = 0
    cdef double sc, cap = 0.0
    cdef size_t win = 0
    if not (_tensor_rows(q, 0, d, &qr) and _tensor_rows(out, 0, d, &orr)
            and out.shape == q.shape and orr.stride == orr.nbytes):
        return False
    h, nq = q.shape[1], qr.n
    if h % hkv or not all(type(a) is np.ndarray and a.dtype == np.int32
                          and a.flags.c_contiguous for a in (starts, lens, table)) \
            or starts.ndim != 1 or lens.ndim != 1 or table.ndim != 2:
        return False
    if scale is None:
        sc = 1.0 / sqrt(<double>d)
    elif type(scale) is float and 0.0 < scale <= FLT_MAX and <float>scale > 0:
        sc = scale
    else:
        return False
    if window is not None:
        if not (type(window) is int and 1 <= window <= (1 << 62)):
            return False
        win = window
    if softcap is not None:
        if not (type(softcap) is float
                and F.SOFTCAP_RANGE[0] <= softcap <= F.SOFTCAP_RANGE[1]):
            return False
        cap = softcap
    if not i8a_try_acquire(&pool._busy):
        return False
    cdef i8a_paged_seq few[16]              # a batch of up to 16: no allocation
    cdef i8a_paged_seq *sp = few
    cdef i8a_options opt
    cdef int rc = 0
    cdef const char *qp
    cdef float *rows
    cdef char *scratch
    try:
        keep = pool._batch(starts, lens, table, nq, few, &sp, &ns)
        if ns == 0:
            return True
        scratch = _scratch(nq * qr.nbytes + nq * h * d * 4 + 64)
        rows = (<float *>orr.data if orr.kind == I8A_F32
                else <float *>(scratch + ((nq * qr.nbytes + 63) & ~(<size_t>63))))
        opt.scale, opt.q_bits, opt.window, opt.sinks, opt.softcap = sc, 16, win, 0, cap
        with nogil:
            qp = _packed(&qr, scratch)
            rc = i8a_paged_attend(i8a_load_tier(&_kt), &pool._p, sp, ns, qp, qr.kind, h,
                                  &opt, i8a_load_size(&_threads), rows, &bad)
            if rc == 0 and orr.kind != I8A_F32:
                i8a_narrow(rows, nq * h * d, orr.kind, <uint16_t *>orr.data)
        if rc == 3:
            raise MemoryError("attend could not allocate its workspace")
        return rc == 0
    finally:
        i8a_release(&pool._busy)
