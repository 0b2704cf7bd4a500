# Private hooks, included by _cache.pyx: the benchmarks' plan, bandwidth probe and profile; the
# tests' kernel entry points and the pool's open entries.

def _plan(_Store cache, size_t h, size_t t=1, size_t window=0, size_t sinks=0):
    """The plan a decode of t positions of h query heads would run now (i8a_plan_decode) as a
    dict of i8a_plan's fields (_engine.h), "runs" as ((begin, count), (begin, count)); window
    (0: none) and sinks as decode takes them."""
    cdef i8a_options opt = _no_options()
    opt.window, opt.sinks = min(window, cache._c.max_seq), min(sinks, cache._c.max_seq)
    cache._enter()
    try:
        if not (1 <= t <= cache._c.length and h and h % cache._c.n_kv_heads == 0
                and opt.sinks <= (opt.window if opt.window else 0)):
            raise ValueError("_plan: t, h, window or sinks do not fit this cache")
        p = i8a_plan_decode(&cache._c, t, h, &opt, i8a_load_size(&_threads))
    finally:
        cache._leave()
    cdef dict plan = p                        # (a dict of the struct's fields)
    plan["runs"] = ((p.runs.begin[0], p.runs.count[0]), (p.runs.begin[1], p.runs.count[1]))
    return plan


def _stream_read(_Store cache, threads=None):
    """The benchmarks' bandwidth probe: every byte a decode reads, split over threads like a
    decode (default: a decode of H = Hkv's), by the best tier's widest loads. A checksum."""
    cdef const i8a_probe *best = &i8a_probes[_COMPILED.index(_SUPPORTED[0])]
    cdef i8a_options opt = _no_options()
    cdef size_t n
    cdef uint64_t x
    cache._enter()
    try:
        n = (i8a_plan_decode(&cache._c, 1, cache._c.n_kv_heads, &opt,
                             i8a_load_size(&_threads)).threads
             if threads is None else _args.int_from(threads, "threads", 1))
        with nogil:
            x = i8a_stream_read(best, &cache._c, n)
    finally:
        cache._leave()
    return x


# the engine's profile parts (_engine.h, I8A_PROF_*), in their order
_PROFILE_PARTS = ("write", "attend", "setup", "pool", "prepare", "coded", "window", "finish")
if len(_PROFILE_PARTS) != I8A_PROF_PARTS:
    raise ImportError("_cache: the profile's parts do not match the engine's")


def _profile(bint on):
    """Switch the engine's profile counters on (zeroed) or off (kept); see _profile_read."""
    i8a_profile(on)


def _profile_read():
    """The engine's profile: {part: (seconds, count)} summed over threads since _profile(True)
    (_engine.h, I8A_PROF_*; pool's count is the threads its jobs were split for)."""
    cdef uint64_t ns[I8A_PROF_PARTS]
    cdef uint64_t count[I8A_PROF_PARTS]
    i8a_profile_read(ns, count)
    return {name: (ns[i] * 1e-9, count[i]) for i, name in enumerate(_PROFILE_PARTS)}


def _quantize_rows(x):
    """Quantize each row of x [n, d] float32 with the active tier: (codes int8, scales float32)."""
    xa = _args.c_aligned(np.asarray(x, dtype=np.float32).reshape(len(x), -1))
    cdef size_t n = xa.shape[0], d = xa.shape[1], r
    codes, scales = np.zeros((n, d), np.int8), np.zeros(n, np.float32)
    for r in range(n):
        if i8a_load_tier(&_kt).quantize_row(<float *>_ptr(xa) + r * d, d,
                                            <int8_t *>_ptr(codes) + r * d,
                                            <float *>_ptr(scales) + r) != 0:
            raise ValueError(f"row {r} holds NaN or Inf")
    return codes, scales


def _attend(q_hi, q_lo, c_hi, c_lo, k, k_scale, v, v_scale, bias, softcap=0.0, two_planes=True,
            lead=0):
    """The active tier's attend (what decode runs per chunk) on one chunk: q_hi, q_lo [nq, d]
    int8, c_hi, c_lo, bias [nq] float32, k, v [n, d] int8 (1 <= n <= 256), k_scale, v_scale [n]
    float32; V goes into tiles from slot `lead` (0 .. 3) of the first, the other slots holding
    -127. Returns the chunk's state: (m [nq], l [nq], o [nq, d]) float32."""
    a = [np.ascontiguousarray(x, t) for x, t in ((q_hi, np.int8), (q_lo, np.int8), (k, np.int8),
         (v, np.int8), (c_hi, np.float32), (c_lo, np.float32), (bias, np.float32),
         (k_scale, np.float32), (v_scale, np.float32))]
    nq, d = a[0].shape if a[0].ndim == 2 else (0, 0)
    n = len(a[2])
    if not ([x.shape for x in a] == [(nq, d)] * 2 + [(n, d)] * 2 + [(nq,)] * 3 + [(n,)] * 2
            and d % 16 == 0 and 16 <= d <= I8A_MAX_HEAD_DIM and 1 <= n <= I8A_CHUNK
            and nq >= 1 and 0 <= lead < F.V_TILE):
        raise ValueError("_attend: shapes do not fit one chunk (see its docstring)")
    tiles = np.full((-(-(lead + n) // F.V_TILE), d, F.V_TILE), -127, np.int8)  # unread: -127
    i8a_tile_rows(<int8_t *>_ptr(a[3]), n, d, lead, <int8_t *>_ptr(tiles))
    m, l, o = np.empty(nq, np.float32), np.empty(nq, np.float32), np.empty((nq, d), np.float32)
    raw = np.empty(2 * nq * I8A_CHUNK * 4 + 64, np.uint8)   # the attend scratch, 64-byte aligned
    cdef float *scratch = <float *>(<char *>_ptr(raw) + <size_t>((-raw.ctypes.data) % 64))
    cdef i8a_query q
    memset(&q, 0, sizeof(q))
    q.d, q.nq, q.two_planes, q.softcap = d, nq, 1 if two_planes else 0, softcap
    q.q_hi, q.q_lo, q.c_hi = <int8_t *>_ptr(a[0]), <int8_t *>_ptr(a[1]), <float *>_ptr(a[4])
    q.c_lo, q.bias = <float *>_ptr(a[5]), <float *>_ptr(a[6])
    q.inv_softcap = 1.0 / softcap if softcap > 0 else 0.0
    cdef i8a_span span
    memset(&span, 0, sizeof(span))
    span.k, span.v, span.n, span.v_lead = <int8_t *>_ptr(a[2]), <int8_t *>_ptr(tiles), n, lead
    span.blocks = span.next_blocks = i8a_one_block
    span.block_shift = I8A_ONE_BLOCK_SHIFT
    span.ks, span.vs = <float *>_ptr(a[7]), <float *>_ptr(a[8])
    cdef i8a_state st
    st.m, st.l, st.o = <float *>_ptr(m), <float *>_ptr(l), <float *>_ptr(o)
    i8a_load_tier(&_kt).attend[I8A_FMT8][I8A_FMT8](&q, &span, scratch, &st)
    return m, l, o


def _rotate(x, sign, inverse=False):
    """The active tier's rotation of each row of x [n, d] float32 into a new array (the
    out-of-place path; decode's inverse runs in place)."""
    xa = _args.c_aligned(np.asarray(x, dtype=np.float32))
    sa = _args.c_aligned(np.asarray(sign, dtype=np.float32))
    if xa.ndim != 2 or sa.shape != (xa.shape[1],) or xa.shape[1] % 16 or xa.shape[1] > I8A_MAX_HEAD_DIM:
        raise ValueError("x [n, d] and sign [d] need the same d, a multiple of 16 up to 1024")
    out = np.empty(xa.shape, np.float32)
    cdef size_t n = xa.shape[0], d = xa.shape[1], r
    for r in range(n):
        i8a_load_tier(&_kt).rotate(<float *>_ptr(xa) + r * d, d, <float *>_ptr(sa),
                                   1 if inverse else 0, <float *>_ptr(out) + r * d)
    return out


def _rotation_signs(d, seed):
    """The engine's rotation signs [d] float32 for seed (the reference draws them independently)."""
    out = np.empty((1, _args.int_from(d, "d", 1)), np.float32)
    i8a_rotation_signs(_args.as_int(seed, "seed"), out.shape[1], <float *>_ptr(out))
    return out[0]


def _open_entries(_Paged pool):
    """{block: (first, top)} of the open entries (a test hook; the busy flag held)."""
    pool._held()
    cdef const i8a_open_entry *e
    got = {}
    if pool._open is None:
        return got
    e = <const i8a_open_entry *>_ptr(pool._open[5])
    for i in range(pool._p.open_cap):
        if e[i].block >= 0:
            got[e[i].block] = (e[i].first, e[i].top)
    return got


def _first_held(_Paged pool):
    """The blocks that keep a sequence's position 0 apart (a test hook; the flag held)."""
    pool._held()
    return set() if pool._open is None else set(np.flatnonzero(pool._open[8]).tolist())
