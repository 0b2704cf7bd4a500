/* window/scalar.h: the recent window's attention over rows of halves (attend_float): dots4, exps,
 * vsum. The rule every tier equals bit for bit (the scalar forms, in the contract's order) and
 * the scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h
 * in dependency order. */
#ifndef I8A_WINDOW_SCALAR_H
#define I8A_WINDOW_SCALAR_H

/* A tier's three loops of the recent window, in the order every tier keeps (multiply, then
 * add: no fma). i8a_dots4_fn: dot[b] = q . k[b] for 4 rows of halves: 16 lane sums (element i
 * to lane i mod 16, each lane in index order), folded by i8a_reduce_lanes. i8a_exps_fn: x[j]
 * = exp(x[j] - m) for j < n, the operations of i8a_exp_scalar. i8a_vsum_fn: o[i] = the sum over
 * j < n of w[j] * v[j][i], in position order for every i. d a multiple of 16. */
typedef void (*i8a_dots4_fn)(const float *q, const uint16_t *const *k, size_t d, float *dot);

typedef void (*i8a_exps_fn)(float *x, size_t n, float m);

typedef void (*i8a_vsum_fn)(const float *w, const uint16_t *const *v, size_t n, size_t d,
                            float *o);

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

static inline void i8a_dots4_scalar(const float *q, const uint16_t *const *k, size_t d,
                                    float *dot)
{
    for (size_t b = 0; b < 4; b++)
        dot[b] = i8a_dot16_halves(q, k[b], d);
}

static inline void i8a_exps_scalar(float *x, size_t n, float m)
{
    for (size_t j = 0; j < n; j++)
        x[j] = i8a_exp_scalar(x[j] - m);
}

static inline void i8a_vsum_scalar(const float *w, const uint16_t *const *v, size_t n, size_t d,
                                   float *o)
{
    for (size_t i = 0; i < d; i++) {
        float acc = 0.0f;
        for (size_t j = 0; j < n; j++)
            acc = acc + w[j] * i8a_half_value(v[j][i]);
        o[i] = acc;
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

/* The recent window's state of one query row (i8a_attend_float_fn), the same source in every
 * tier around the tier's three loops: logit = (q . h[j]) * k_scale[j] (dots4; the last n % 4
 * rows go through it with their first row repeated, the extra dots unused), soft-capped when
 * on; m = their max; w = exp(logit - m) by the contract's polynomial (exps); l = the sum of w
 * in position order; o = vsum of the weights w * v_scale[j]. */
I8A_INLINE void i8a_attend_float_body(const float *q, const i8a_float_rows *w, size_t d,
                                      float cap, float *logit, float *m_out, float *l_out,
                                      float *o, i8a_dots4_fn dots4, i8a_exps_fn exps,
                                      i8a_vsum_fn vsum)
{
    const size_t n = w->n;
    for (size_t j = 0; j < n; j += 4) {
        const uint16_t *rows[4];
        float dot[4];
        for (size_t b = 0; b < 4; b++)
            rows[b] = w->k[j + b < n ? j + b : j];
        dots4(q, rows, d, dot);
        for (size_t b = 0; b < 4 && j + b < n; b++)
            logit[j + b] = dot[b] * w->k_scale[j + b];
    }
    if (cap > 0.0f)
        for (size_t j = 0; j < n; j++)
            logit[j] = i8a_softcap(logit[j], cap, 1.0f / cap);
    const float m = i8a_max_of(logit, n);
    exps(logit, n, m);                                      /* now the weights */
    float l = 0.0f;
    for (size_t j = 0; j < n; j++)
        l = l + logit[j];
    for (size_t j = 0; j < n; j++)
        logit[j] = logit[j] * w->v_scale[j];                /* the weights of the halves */
    vsum(logit, w->v, n, d, o);
    *m_out = m;
    *l_out = l;
}

static inline void i8a_attend_float_scalar(const float *q, const i8a_float_rows *w, size_t d,
                                    float cap, float *logit, float *m, float *l, float *o)
{
    i8a_attend_float_body(q, w, d, cap, logit, m, l, o, i8a_dots4_scalar, i8a_exps_scalar,
                          i8a_vsum_scalar);
}

#endif
