/* planes/scalar.h: a chunk's softmax and its weights in integer planes and a top row (the V pass's
 * first half). The rule every tier equals bit for bit (the scalar forms, in the contract's order)
 * and the scalar tier's entries. Baseline C, no ISA attributes; common.h includes every op's
 * scalar.h in dependency order. */
#ifndef I8A_PLANES_SCALAR_H
#define I8A_PLANES_SCALAR_H

/* The V pass in integers. A chunk's weights w[s] = p[s] * v_scale[s] (>= 0, finite): the
 * largest is kept exact (the top row, added in float after the integer sums), the others become
 * P planes of 7-bit unsigned integers (P = 2 with V at 8 bits, 3 with V at 4 bits: below), each
 * 127 times finer than the one before, and the sum over the chunk's positions is then an exact
 * integer dot per plane and dimension:
 *   top = the largest w[s], at = the first position holding it (0 when every w is 0: no top row,
 *   w_top = 0); w_top = top, and w[at] counts as 0 in the planes;
 *   top2 = the largest of the others; 0: every plane is 0 (scales 0);
 *   lift = 2^100 if top2 < 2^-100, else 1; every w[s] and top2 are first multiplied by lift
 *   (exact: w * 2^100 < 1 loses no bit, subnormal w included);
 *   sc[0] = top2 / 127, sc[k] = sc[k-1] / 127;  inv[0] = 127 / top2, inv[k] = inv[k-1] * 127;
 *   the planes but the last: b_k = clamp(floor(r * inv[k]), 0, 127), r = fma(-b_k, sc[k], r)
 *   (r = w first); the last: b = clamp(rint(r * inv[P-1]), 0, 127);
 *   S_k[i] = sum_s b_k[s] * v[s][i], in int32 (exact: |S| <= 256 * 127 * 127 < 2^23, so float(S)
 *   is exact too, and any order of the sum gives the same S);
 *   o[i] = float(S_0[i]) * sc[0], then o[i] = fma(float(S_k[i]), sc[k], o[i]) for k = 1 .. P-1;
 *   then (V at 4 bits: + the minima's sum, v4/scalar.h) o[i] = fma(w_top, float(v[at][i]),
 *   o[i]) (i8a_vtop_with, v4/scalar.h).
 * sum_k b_k * sc[k] is w to within top2 / (2 * 127^P) (two planes: about top2 / 32258; three:
 * top2 / 4.1e6), the top row exact. V at 4 bits keeps three: its codes 0 .. 15 are all >= 0, and
 * the minima's sum takes back most of sum_s w_s code_s, so a weight's error counts against a
 * far smaller output (two planes left 4/4 at 1.3e-3 against its own history, gaussian data).
 * Three planes of every weight (within top / 4.1e6) were the rule before issue 31; two planes of
 * every weight (within top / 32258) had lost the mass of the many small weights beside an
 * attention sink (they rounded to the same few steps: Gemma 3's attention at 2575 tokens came
 * out 1.4e-3 off). With the sink kept exact the small weights take their steps from the next
 * largest, and on Gemma 3's activations (examples/plane_study.py, 234 layer x position looks)
 * the error stayed where three planes left it (max 2.85e-4 against 2.87e-4; two planes alone
 * 7.0e-4): all of it from q's planes. The third plane was a third of the V pass's dot
 * products. 7 bits a plane, not 8: SDOT multiplies signed bytes, and vpmaddubsw adds two
 * products in int16 (2 * 127 * 127 = 32258 fits, 2 * 255 * 127 does not). With top2 (after
 * the lift) in [2^-100, 2^64 * 127], sc[1] is a normal float and inv[1] finite; the planes'
 * scales are stored divided by lift (exact unless they fall below 2^-126, where a scale keeps
 * its absolute error under 2^-150), so V rows near the quantizer's smallest absmax (2^-100)
 * keep their relative accuracy. */
#define I8A_WPLANES 3            /* the most: a head's slot holds this many planes */
#define I8A_WPLANES8 2           /* V at 8 bits */
#define I8A_WPLANES4 3           /* V at 4 bits */

#define I8A_WEIGHT_LIFT_BELOW 0x1p-100f

#define I8A_WEIGHT_LIFT 0x1p100f

/* Where head j of nq keeps its planes in an attend's scratch (dispatch.h: 2 * nq * I8A_CHUNK
 * floats): in the second half, the 4 * I8A_CHUNK bytes of its K dots, which its logits have
 * consumed by then: plane 0, 1 [I8A_PLANE_BYTES each], then the planes' scales (floats), then
 * the top row: w_top (a float) and at (its plane byte, uint32). A plane's byte v_lead + s is row
 * s's weight (the slot of the row in the V tiles); the bytes before v_lead and after the last
 * row, up to a multiple of 16, are 0. */
#define I8A_PLANE_BYTES 320
#define I8A_TOP_AT (I8A_WPLANES * (I8A_PLANE_BYTES + sizeof(float)))
_Static_assert(I8A_TOP_AT + 2 * sizeof(float) + sizeof(float) <= 4 * I8A_CHUNK,
               "a head's planes, their scales, the top row and attend4's vmin sum fit the bytes "
               "of its K dots");

static inline uint8_t *i8a_planes_at(float *scratch, size_t nq, size_t j)
{
    return (uint8_t *)(scratch + (nq + j) * I8A_CHUNK);
}

/* The scales of a chunk's planes in the lifted weights' terms (the rule above); all 0 when it
 * has none, which makes every plane byte 0 by the same steps. Returns lift. */
static inline float i8a_weight_scales(float top, int np, float sc[I8A_WPLANES],
                                      float inv[I8A_WPLANES])
{
    if (!(top > 0.0f)) {
        for (int k = 0; k < np; k++)
            sc[k] = inv[k] = 0.0f;
        return 1.0f;
    }
    const float lift = top < I8A_WEIGHT_LIFT_BELOW ? I8A_WEIGHT_LIFT : 1.0f;
    top *= lift;
    sc[0] = top / 127.0f;
    inv[0] = 127.0f / top;
    for (int k = 1; k < np; k++) {
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
static inline void i8a_weight_one(float w, int np, const float sc[I8A_WPLANES],
                                  const float inv[I8A_WPLANES], uint8_t b[I8A_WPLANES])
{
    float r = w;
    for (int k = 0; k < np - 1; k++) {
        const float x = i8a_clamp127(floorf(r * inv[k]));
        r = fmaf(-x, sc[k], r);
        b[k] = (uint8_t)x;
    }
    b[np - 1] = (uint8_t)i8a_clamp127(rintf(r * inv[np - 1]));
}

/* The first position of w [n] holding top, from position `from` on (n when none). */
static inline size_t i8a_first_of(const float *w, size_t from, size_t n, float top)
{
    size_t s = from;
    while (s < n && w[s] != top)
        s++;
    return s;
}

/* The top row of weights w [n] whose largest is top (the rule above), the first position
 * holding it found at or after `from` (a tier's vector search may skip ahead: nothing before
 * `from` holds top): at = that position, whose weight becomes 0 in w; w_top = top. Nothing
 * when top is 0 (w_top 0, at 0). */
static inline void i8a_take_top(float *w, size_t from, size_t n, float top, float *w_top,
                                uint32_t *at)
{
    *w_top = 0.0f;
    *at = 0;
    if (!(top > 0.0f))
        return;
    const size_t s = i8a_first_of(w, from, n, top);
    if (s < n) {
        w[s] = 0.0f;
        *w_top = top;
        *at = (uint32_t)s;
    }
}

/* The zeros of a head's np planes around rows [lead, lead + n) (the layout above); the scales
 * sc / lift (the weights' own terms; 0 for the planes past np); the top row (w_top, and at
 * counted from row 0: its plane byte is lead + at). */
static inline void i8a_planes_frame(uint8_t *slot, size_t lead, size_t n, int np,
                                    const float sc[I8A_WPLANES], float lift, float w_top,
                                    uint32_t at)
{
    float out[I8A_WPLANES] = {0.0f};
    for (int k = 0; k < np; k++)
        out[k] = sc[k] / lift;
    const size_t end = i8a_round16(lead + n);
    for (int k = 0; k < np; k++) {
        uint8_t *plane = slot + k * I8A_PLANE_BYTES;
        memset(plane, 0, lead);
        memset(plane + lead + n, 0, end - lead - n);
    }
    memcpy(slot + I8A_WPLANES * I8A_PLANE_BYTES, out, I8A_WPLANES * sizeof(float));
    const uint32_t byte = (uint32_t)lead + at;
    memcpy(slot + I8A_TOP_AT, &w_top, sizeof w_top);
    memcpy(slot + I8A_TOP_AT + sizeof w_top, &byte, sizeof byte);
}

/* The top row of head j's planes: its weight and its plane byte (the slot of its row in the V
 * tiles). */
static inline float i8a_planes_top(const uint8_t *slot, uint32_t *byte)
{
    float w_top;
    memcpy(&w_top, slot + I8A_TOP_AT, sizeof w_top);
    memcpy(byte, slot + I8A_TOP_AT + sizeof w_top, sizeof *byte);
    return w_top;
}

/* A head's np planes from its weights w [n] (the scalar form; the SIMD tiers write the same
 * bytes); w's top weight is set to 0 on the way. */
static inline void i8a_planes_scalar(float *w, size_t n, size_t lead, uint8_t *slot, int np)
{
    float sc[I8A_WPLANES], inv[I8A_WPLANES];
    float top = 0.0f, w_top;
    uint32_t at;
    for (size_t s = 0; s < n; s++)
        top = w[s] > top ? w[s] : top;
    i8a_take_top(w, 0, n, top, &w_top, &at);
    top = 0.0f;
    for (size_t s = 0; s < n; s++)
        top = w[s] > top ? w[s] : top;
    const float lift = i8a_weight_scales(top, np, sc, inv);
    for (size_t s = 0; s < n; s++) {
        uint8_t b[I8A_WPLANES];
        i8a_weight_one(w[s] * lift, np, sc, inv, b);
        for (int k = 0; k < np; k++)
            slot[k * I8A_PLANE_BYTES + lead + s] = b[k];
    }
    i8a_planes_frame(slot, lead, n, np, sc, lift, w_top, at);
}

#endif
