/* kdots/scalar.h: K at 8 bits: the exact int8 dots of the q planes with K rows, and the logits.
 * The rule every tier equals bit for bit (the scalar forms, in the contract's order) and the
 * scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h in
 * dependency order. */
#ifndef I8A_KDOTS_SCALAR_H
#define I8A_KDOTS_SCALAR_H

/* The logit of one token, both q precisions:
 *   q_bits=16: fma(float(dot_lo), c_lo, float(dot_hi) * c_hi) * k_scale
 *   q_bits=8:  (float(dot_hi) * c_hi) * k_scale
 * The dots are exact (|dot| < 2^24, so the conversions are exact too). */
static inline float i8a_logit(int32_t dh, int32_t dl, float c_hi, float c_lo, int two, float ks)
{
    float hi = (float)dh * c_hi;
    return (two ? fmaf((float)dl, c_lo, hi) : hi) * ks;
}

/* i8a_logit plus the query row's bias (a separate add), then the soft cap when it is on
 * (cap > 0): the scalar form every tier uses for the rows its vectors do not cover. */
static inline float i8a_logit_capped(int32_t dh, int32_t dl, float c_hi, float c_lo, int two,
                                     float ks, float bias, float cap, float inv_cap)
{
    const float lg = i8a_logit(dh, dl, c_hi, c_lo, two, ks) + bias;
    return cap > 0.0f ? i8a_softcap(lg, cap, inv_cap) : lg;
}

/* The logits of query head j against the span's K rows at 8 bits (i8a_attend_scalar's): p [n];
 * returns their max. */
static inline float i8a_logits8_scalar(const i8a_query *q, const i8a_span *kv, size_t j, float *p)
{
    const size_t d = q->d;
    const int8_t *qh = q->q_hi + j * d, *ql = q->q_lo + j * d;
    float m = 0.0f;
    for (size_t s = 0; s < kv->n; s++) {
        const int8_t *kr = i8a_krow(kv, s, d);
        int32_t dh = 0, dl = 0;
        for (size_t i = 0; i < d; i++) {
            dh += (int32_t)qh[i] * kr[i];
            dl += q->two_planes ? (int32_t)ql[i] * kr[i] : 0;
        }
        p[s] = i8a_logit_capped(dh, dl, q->c_hi[j], q->c_lo[j], q->two_planes, kv->ks[s],
                                q->bias[j], q->softcap, q->inv_softcap);
        m = (s == 0 || p[s] > m) ? p[s] : m;
    }
    return m;
}

#endif
