/* planes/scalar.h: a chunk's softmax and its weights in three integer planes (the V pass's first
 * half). The rule every tier equals bit for bit (the scalar forms, in the contract's order) and
 * the scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's scalar.h
 * in dependency order. */
#ifndef I8A_PLANES_SCALAR_H
#define I8A_PLANES_SCALAR_H

/* The V pass in integers. A chunk's weights w[s] = p[s] * v_scale[s] (>= 0, finite) become
 * three planes of 7-bit unsigned integers, each plane 127 times finer than the one before, and
 * the sum over the chunk's positions is then an exact integer dot per plane and dimension:
 *   top = the largest w[s]; 0: every plane is 0 (scales 0: o = 0);
 *   lift = 2^100 if top < 2^-100, else 1; every w[s] and top are first multiplied by lift
 *   (exact: w * 2^100 < 1 loses no bit, subnormal w included);
 *   sc[0] = top / 127, sc[k] = sc[k-1] / 127;  inv[0] = 127 / top, inv[k] = inv[k-1] * 127;
 *   b0 = min(floor(w * inv[0]), 127);           r = fma(-b0, sc[0], w);
 *   b1 = clamp(floor(r * inv[1]), 0, 127);      r = fma(-b1, sc[1], r);
 *   b2 = clamp(rint(r * inv[2]), 0, 127);
 *   S_k[i] = sum_s b_k[s] * v[s][i], in int32 (exact: |S| <= 256 * 127 * 127 < 2^23, so float(S)
 *   is exact too, and any order of the sum gives the same S);
 *   o[i] = fma(float(S_2[i]), sc[2], fma(float(S_1[i]), sc[1], float(S_0[i]) * sc[0])).
 * sum_k b_k * sc[k] is w to within top / (2 * 127^3) (about top / 4.1e6): the floors leave
 * residuals below their plane's step, which the last plane rounds. Two planes (within top /
 * 32258) were not enough: with one token far above the rest of its chunk (an attention sink)
 * the many small weights round to the same few steps, and Gemma 3's attention at 2575 tokens
 * came out 1.4e-3 off. 7 bits a plane, not 8: SDOT multiplies signed bytes, and vpmaddubsw adds
 * two products in int16 (2 * 127 * 127 = 32258 fits, 2 * 255 * 127 does not). With top (after
 * the lift) in [2^-100, 2^64 * 127], sc[2] is a normal float (2^-100 / 127^3 > 2^-121) and
 * inv[2] finite; the planes' scales are stored divided by lift (exact unless they fall below
 * 2^-126, where a scale keeps its absolute error under 2^-150), so V rows near the quantizer's
 * smallest absmax (2^-100) keep their relative accuracy. */
#define I8A_WPLANES 3

#define I8A_WEIGHT_LIFT_BELOW 0x1p-100f

#define I8A_WEIGHT_LIFT 0x1p100f

/* Where head j of nq keeps its planes in an attend's scratch (dispatch.h: 2 * nq * I8A_CHUNK
 * floats): in the second half, the 4 * I8A_CHUNK bytes of its K dots, which its logits have
 * consumed by then: plane 0, 1, 2 [I8A_PLANE_BYTES each], then the planes' scales (floats). A
 * plane's byte v_lead + s is row s's weight (the slot of the row in the V tiles); the bytes
 * before v_lead and after the last row, up to a multiple of 16, are 0. */
#define I8A_PLANE_BYTES 320
_Static_assert(I8A_WPLANES * (I8A_PLANE_BYTES + sizeof(float)) + sizeof(float) <= 4 * I8A_CHUNK,
               "a head's planes, their scales and attend4's vmin sum fit the bytes of its K dots");

static inline uint8_t *i8a_planes_at(float *scratch, size_t nq, size_t j)
{
    return (uint8_t *)(scratch + (nq + j) * I8A_CHUNK);
}

/* The scales of a chunk's planes in the lifted weights' terms (the rule above); all 0 when it
 * has none, which makes every plane byte 0 by the same steps. Returns lift. */
static inline float i8a_weight_scales(float top, float sc[I8A_WPLANES], float inv[I8A_WPLANES])
{
    if (!(top > 0.0f)) {
        for (int k = 0; k < I8A_WPLANES; k++)
            sc[k] = inv[k] = 0.0f;
        return 1.0f;
    }
    const float lift = top < I8A_WEIGHT_LIFT_BELOW ? I8A_WEIGHT_LIFT : 1.0f;
    top *= lift;
    sc[0] = top / 127.0f;
    inv[0] = 127.0f / top;
    for (int k = 1; k < I8A_WPLANES; k++) {
        sc[k] = sc[k - 1] / 127.0f;
        inv[k] = inv[k - 1] * 127.0f;
    }
    return lift;
}

/* x clamped to [0, 127] (x not NaN). */
static inline float i8a_clamp127(float x)
{
    x = x > 0.0f ? x : 0.0f;
    return x < 127.0f ? x : 127.0f;
}

/* The plane bytes of one weight (the rule above). */
static inline void i8a_weight_one(float w, const float sc[I8A_WPLANES],
                                  const float inv[I8A_WPLANES], uint8_t b[I8A_WPLANES])
{
    float r = w;
    for (int k = 0; k < I8A_WPLANES - 1; k++) {
        const float x = i8a_clamp127(floorf(r * inv[k]));
        r = fmaf(-x, sc[k], r);
        b[k] = (uint8_t)x;
    }
    b[I8A_WPLANES - 1] = (uint8_t)i8a_clamp127(rintf(r * inv[I8A_WPLANES - 1]));
}

/* The zeros of a head's planes around rows [lead, lead + n) (the layout above); the scales
 * sc / lift (the weights' own terms). */
static inline void i8a_planes_frame(uint8_t *slot, size_t lead, size_t n,
                                    const float sc[I8A_WPLANES], float lift)
{
    float out[I8A_WPLANES];
    for (int k = 0; k < I8A_WPLANES; k++)
        out[k] = sc[k] / lift;
    const size_t end = i8a_round16(lead + n);
    for (int k = 0; k < I8A_WPLANES; k++) {
        uint8_t *plane = slot + k * I8A_PLANE_BYTES;
        memset(plane, 0, lead);
        memset(plane + lead + n, 0, end - lead - n);
    }
    memcpy(slot + I8A_WPLANES * I8A_PLANE_BYTES, out, I8A_WPLANES * sizeof(float));
}

/* A head's planes from its weights w [n] (the scalar form; the SIMD tiers write the same
 * bytes). */
static inline void i8a_planes_scalar(const float *w, size_t n, size_t lead, uint8_t *slot)
{
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    float top = 0.0f;
    for (size_t s = 0; s < n; s++)
        top = w[s] > top ? w[s] : top;
    const float lift = i8a_weight_scales(top, sc, inv);
    for (size_t s = 0; s < n; s++) {
        uint8_t b[I8A_WPLANES];
        i8a_weight_one(w[s] * lift, sc, inv, b);
        for (int k = 0; k < I8A_WPLANES; k++)
            slot[k * I8A_PLANE_BYTES + lead + s] = b[k];
    }
    i8a_planes_frame(slot, lead, n, sc, lift);
}

#endif
