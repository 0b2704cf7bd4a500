/* vpass/scalar.h: the integer V pass at 8 bits: the planes' sums over V tiles, then o. The rule
 * every tier equals bit for bit (the scalar forms, in the contract's order) and the scalar tier's
 * entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h in dependency
 * order. */
#ifndef I8A_VPASS_SCALAR_H
#define I8A_VPASS_SCALAR_H

/* The scales of head j's planes. */
static inline void i8a_planes_scales(const uint8_t *slot, float sc[I8A_WPLANES])
{
    memcpy(sc, slot + I8A_WPLANES * I8A_PLANE_BYTES, I8A_WPLANES * sizeof(float));
}

/* One output value from its integer sums, before the top row (planes/scalar.h's rule). */
static inline float i8a_v_out(const int32_t *S, const float sc[I8A_WPLANES], int np)
{
    float o = (float)S[0] * sc[0];
    for (int k = 1; k < np; k++)
        o = fmaf((float)S[k], sc[k], o);
    return o;
}

/* The V tiles a span reads: ceil((v_lead + n) / 4). */
static inline size_t i8a_v_tiles(size_t lead, size_t n)
{
    return (lead + n + I8A_V_TILE - 1) / I8A_V_TILE;
}

/* The integer V pass (planes/scalar.h) of heads [0, nq) at 8 bits: the planes' sums over the span's
 * tiles, then o. The scalar tier's (and the order the others vectorize). */
static inline void i8a_vpass8_scalar(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                     float *o)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n);
    for (size_t j = 0; j < nq; j++) {
        const uint8_t *slot = i8a_planes_at(scratch, nq, j);
        float sc[I8A_WPLANES];
        i8a_planes_scales(slot, sc);
        for (size_t i = 0; i < d; i++) {
            int32_t S[I8A_WPLANES8] = {0};
            for (size_t t = 0; t < tiles; t++) {
                const int8_t *x = i8a_vtile(kv, t, d) + i * I8A_V_TILE;
                for (size_t r = 0; r < I8A_V_TILE; r++)
                    for (int k = 0; k < I8A_WPLANES8; k++)
                        S[k] += (int32_t)slot[k * I8A_PLANE_BYTES + t * I8A_V_TILE + r] * x[r];
            }
            o[j * d + i] = i8a_v_out(S, sc, I8A_WPLANES8);
        }
    }
}

#endif
