/* v4/scalar.h: V at 4 bits: the planes' sums over tiles of nibbles, and V's minima. The rule
 * every tier equals bit for bit (the scalar forms, in the contract's order) and the scalar tier's
 * entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h in dependency
 * order. */
#ifndef I8A_V4_SCALAR_H
#define I8A_V4_SCALAR_H

/* Dimension i of slot r of a V tile at 4 bits. */
static inline int32_t i8a_nib_tile(const uint8_t *tile, size_t i, size_t r)
{
    const uint8_t b = tile[i / I8A_NIB_BLOCK * 64 + i % 16 * I8A_V_TILE + r];
    return i % I8A_NIB_BLOCK < 16 ? b & 15 : b >> 4;
}

/* Where attend4 keeps head j's sum of p * vmin (V at 4 bits): after its planes' top row. */
static inline float *i8a_vmin_sum_at(float *scratch, size_t nq, size_t j)
{
    return (float *)(i8a_planes_at(scratch, nq, j) + I8A_TOP_AT + 2 * sizeof(float));
}

/* The integer V pass at 4 bits of heads [0, nq): the planes' sums over the span's tiles of
 * codes, then o = i8a_v_out(S) + sum_s p_s vmin_s (the head's vmin sum, in the 16-lane order of
 * the softmax sum); the top row is added after (i8a_vtop_with). */
static inline void i8a_vpass4_scalar(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                     float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        const float vmin = *i8a_vmin_sum_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t i = 0; i < d; i++) {
            int32_t S[I8A_WPLANES4] = {0};
            for (size_t t = 0; t < tiles; t++) {
                const uint8_t *tile = kv->v4 + t * 2 * d;
                for (size_t r = 0; r < I8A_V_TILE; r++)
                    for (int k = 0; k < I8A_WPLANES4; k++)
                        S[k] += (int32_t)slot[k * I8A_PLANE_BYTES + t * I8A_V_TILE + r]
                                * i8a_nib_tile(tile, i, r);
            }
            o[j * d + i] = i8a_v_out(S, sc, I8A_WPLANES4) + vmin;
        }
    }
}

/* A tier's loop of the top row (planes/scalar.h): o [d] += w_top times V's codes of the row in
 * slot r of tile t, o[i] = fma(w_top, float(v[at][i]), o[i]) (8 bits: i8a_vtile; 4 bits:
 * i8a_nib_tile). */
typedef void (*i8a_vtop_row_fn)(float w_top, size_t t, size_t r, const i8a_span *kv, size_t d,
                                int v4, float *o);

/* The scalar form of the loop (the scalar tier's, and the order the others vectorize). */
static inline void i8a_vtop_row_scalar(float w_top, size_t t, size_t r, const i8a_span *kv,
                                       size_t d, int v4, float *o)
{
    if (v4) {
        const uint8_t *tile = kv->v4 + t * 2 * d;
        for (size_t i = 0; i < d; i++)
            o[i] = fmaf(w_top, (float)i8a_nib_tile(tile, i, r), o[i]);
    } else {
        const int8_t *x = i8a_vtile(kv, t, d) + r;
        for (size_t i = 0; i < d; i++)
            o[i] = fmaf(w_top, (float)x[I8A_V_TILE * i], o[i]);
    }
}

/* Heads [0, nq) of an attend (their o [nq][d]) after the V pass: each head's top row added by
 * the tier's loop, the same source in every tier (inlined inside the tier's target region, so
 * the scalar form's fmaf is the FMA instruction there). */
I8A_INLINE void i8a_vtop_with(i8a_vtop_row_fn row, float *scratch, size_t nq, const i8a_span *kv,
                              size_t d, int v4, float *o)
{
    for (size_t j = 0; j < nq; j++) {
        uint32_t byte;
        const float w_top = i8a_planes_top(i8a_planes_at(scratch, nq, j), &byte);
        if (w_top > 0.0f)
            row(w_top, byte / I8A_V_TILE, byte % I8A_V_TILE, kv, d, v4, o + j * d);
    }
}

#endif
