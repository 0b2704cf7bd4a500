/* window/scalar.h: the recent window's attention over rows of halves (attend_float): dots4, exps,
 * vsum. The rule every tier equals bit for bit (the scalar forms, in the contract's order) and
 * the scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h
 * in dependency order. */
#ifndef I8A_WINDOW_SCALAR_H
#define I8A_WINDOW_SCALAR_H

/* The query rows a tier's window loops take at once: each widened row of halves serves that many
 * heads of the group (the body cuts a group into blocks of at most this many). */
#define I8A_WIN_HEADS 4

/* block(K, args...) with K = nh (1 .. I8A_WIN_HEADS) a constant in each copy, so that a tier's
 * loops over the heads of a block unroll into registers. */
#define I8A_WIN_BY_HEADS(nh, block, ...)                                                        \
    do {                                                                                        \
        switch (nh) {                                                                           \
        case 1: block(1, __VA_ARGS__); break;                                                   \
        case 2: block(2, __VA_ARGS__); break;                                                   \
        case 3: block(3, __VA_ARGS__); break;                                                   \
        default: block(4, __VA_ARGS__); break;                                                  \
        }                                                                                       \
    } while (0)

/* A tier's three loops of the recent window, in the order every tier keeps (multiply, then
 * add: no fma). i8a_dots4_fn: dot[h * 4 + b] = q[h] . k[b] for nh <= I8A_WIN_HEADS query rows
 * q [nh][d] and 4 rows of halves: per (h, b) 16 lane sums (element i to lane i mod 16, each
 * lane in index order), folded by i8a_reduce_lanes. i8a_exps_fn: x[j] = exp(x[j] - m) for j <
 * n, the operations of i8a_exp_scalar. i8a_vsum_fn: o[h][i] = the sum over j < n of w[h * n +
 * j] * v[j][i], in position order for every (h, i), for nh <= I8A_WIN_HEADS rows of weights.
 * d a multiple of 16. How a tier shares a widened row between the heads is its own: every
 * (h, b) and (h, i) keeps its order, so the bits are those of one head at a time. */
typedef void (*i8a_dots4_fn)(const float *q, size_t nh, const uint16_t *const *k, size_t d,
                             float *dot);

typedef void (*i8a_exps_fn)(float *x, size_t n, float m);

typedef void (*i8a_vsum_fn)(const float *w, size_t nh, const uint16_t *const *v, size_t n,
                            size_t d, float *o);

/* The scalar forms of the two (the scalar tier's, and the order the others vectorize). */
/* q . h for one row of halves h [d] in the dot16 order (dots4's, one row). */
static inline float i8a_dot16_halves(const float *q, const uint16_t *h, size_t d)
{
    float lane[I8A_SUM_LANES] = {0.0f};
    for (size_t i = 0; i < d; i += I8A_SUM_LANES)
        for (size_t t = 0; t < I8A_SUM_LANES; t++)
            lane[t] = lane[t] + q[i + t] * i8a_half_value(h[i + t]);
    return i8a_reduce_lanes(lane);
}

static inline void i8a_dots4_scalar(const float *q, size_t nh, const uint16_t *const *k,
                                    size_t d, float *dot)
{
    for (size_t h = 0; h < nh; h++)
        for (size_t b = 0; b < 4; b++)
            dot[h * 4 + b] = i8a_dot16_halves(q + h * d, k[b], d);
}

static inline void i8a_exps_scalar(float *x, size_t n, float m)
{
    for (size_t j = 0; j < n; j++)
        x[j] = i8a_exp_scalar(x[j] - m);
}

static inline void i8a_vsum_scalar(const float *w, size_t nh, const uint16_t *const *v, size_t n,
                                   size_t d, float *o)
{
    for (size_t h = 0; h < nh; h++)
        for (size_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (size_t j = 0; j < n; j++)
                acc = acc + w[h * n + j] * i8a_half_value(v[j][i]);
            o[h * d + i] = acc;
        }
}

/* The largest of x[0 .. n), n >= 1, none NaN: eight running maxima side by side (a max is
 * exact, so any order gives the same value; one chain of n dependent compares was a tenth of
 * the window's time). */
static inline float i8a_max_of(const float *x, size_t n)
{
    float part[8];
    for (size_t b = 0; b < 8; b++)
        part[b] = x[0];
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (size_t b = 0; b < 8; b++)
            part[b] = x[j + b] > part[b] ? x[j + b] : part[b];
    for (; j < n; j++)
        part[0] = x[j] > part[0] ? x[j] : part[0];
    for (size_t b = 1; b < 8; b++)
        part[0] = part[b] > part[0] ? part[b] : part[0];
    return part[0];
}

/* The recent window's states of nq query rows (i8a_attend_float_fn), the same source in every
 * tier around the tier's three loops, I8A_WIN_HEADS rows at a time. Row h sees the first n_h
 * rows (w->seen[h], or all w->n); a block of rows reads the first `most` rows, its largest
 * n_h. Per row: logit = (q . h[j]) * k_scale[j] (dots4 over the block's rows; the last most % 4
 * go through it with their first row repeated, the extra dots unused), soft-capped when on; m
 * = the max of its n_h logits; w = exp(logit - m) by the contract's polynomial (exps); l = the
 * sum of w in position order; o = vsum of the weights w * v_scale[j], the block's rows past
 * n_h weighing 0 (a product 0 * h, h a finite half, adds nothing to a sum begun at +0: the
 * row's bits are those of the row alone over its n_h rows). logit: I8A_WIN_HEADS * w->n floats
 * of scratch, a block's rows at a stride of `most`. */
I8A_INLINE void i8a_attend_float_body(const float *q, size_t nq, const i8a_float_rows *w,
                                      size_t d, float cap, float *logit, const i8a_state *out,
                                      i8a_dots4_fn dots4, i8a_exps_fn exps, i8a_vsum_fn vsum)
{
    for (size_t h0 = 0; h0 < nq; h0 += I8A_WIN_HEADS) {
        const size_t nh = nq - h0 < I8A_WIN_HEADS ? nq - h0 : I8A_WIN_HEADS;
        size_t most = w->seen ? 0 : w->n;                   /* 1 <= seen[h] <= n */
        for (size_t h = 0; w->seen && h < nh; h++)
            most = w->seen[h0 + h] > most ? w->seen[h0 + h] : most;
        for (size_t j = 0; j < most; j += 4) {
            const uint16_t *rows[4];
            float dot[I8A_WIN_HEADS * 4];
            for (size_t b = 0; b < 4; b++)
                rows[b] = w->k[j + b < most ? j + b : j];
            dots4(q + h0 * d, nh, rows, d, dot);
            for (size_t h = 0; h < nh; h++)
                for (size_t b = 0; b < 4 && j + b < most; b++)
                    logit[h * most + j + b] = dot[h * 4 + b] * w->k_scale[j + b];
        }
        for (size_t h = 0; h < nh; h++) {
            const size_t n = w->seen ? w->seen[h0 + h] : most;
            float *x = logit + h * most;
            if (cap > 0.0f)
                for (size_t j = 0; j < n; j++)
                    x[j] = i8a_softcap(x[j], cap, 1.0f / cap);
            const float m = i8a_max_of(x, n);
            exps(x, n, m);                                  /* now the weights */
            float l = 0.0f;
            for (size_t j = 0; j < n; j++)
                l = l + x[j];
            for (size_t j = 0; j < n; j++)
                x[j] = x[j] * w->v_scale[j];                /* the weights of the halves */
            for (size_t j = n; j < most; j++)
                x[j] = 0.0f;                                /* rows past the row's own */
            out->m[h0 + h] = m;
            out->l[h0 + h] = l;
        }
        vsum(logit, nh, w->v, most, d, out->o + h0 * d);
    }
}

static inline void i8a_attend_float_scalar(const float *q, size_t nq, const i8a_float_rows *w,
                                           size_t d, float cap, float *logit,
                                           const i8a_state *out)
{
    i8a_attend_float_body(q, nq, w, d, cap, logit, out, i8a_dots4_scalar, i8a_exps_scalar,
                          i8a_vsum_scalar);
}

#endif
