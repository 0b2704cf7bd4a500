/* attend/amx.h: attend[k][v]: one chunk of a query group, the passes above in the contract's
 * order; the amx tier's, bit for bit attend/scalar.h's rule. The tile passes serve a group of
 * two query rows or more with d a multiple of 64 (a K or V row read by several query rows: a
 * GQA group, a prefill's block of rows); anything else, and the 4-bit sides' passes, are the
 * avx512_vnni tier's. Included only by ../amx.h, inside the tier's target region: its pragma
 * applies to every function here. */
#ifndef I8A_ATTEND_AMX_H
#define I8A_ATTEND_AMX_H

#ifndef I8A_AMX_H
#error "attend/amx.h is included by ../amx.h only"
#endif

/* Whether the tile passes serve this group. */
I8A_INLINE int i8a_tiles_serve_amx(const i8a_query *q)
{
    return q->nq >= 2 && q->d % 64 == 0;
}

/* attend's body with the tile passes for the sides at 8 bits (k4, v4: a side at 4 bits, by the
 * avx512_vnni tier's passes), in i8a_attend4_body_avx512_vnni's order (its weights between the
 * passes); the tiles are released before the top rows are added. */
I8A_INLINE void i8a_attend_body_amx(const i8a_query *q, const i8a_span *kv, float *scratch,
                                    const i8a_state *out, const int k4, const int v4)
{
    const size_t d = q->d, nq = q->nq;
    uint8_t *extra = (uint8_t *)(scratch + 2 * nq * I8A_CHUNK);
    int32_t *dh = (int32_t *)(scratch + nq * I8A_CHUNK), *dl = (int32_t *)scratch;
    size_t cfg = 0;                             /* the tiles' rows, once configured */
    if (!k4)
        i8a_kdots_amx(q, kv, dh, dl, &cfg);
    else                                        /* every head's logits, into p and out->m */
        i8a_k4_logits_tiled_avx512_vnni(q, kv, scratch, extra,
                                        q->two_planes ? I8A_K4_QPLANES : 1, out->m);
    i8a_weights_avx512_vnni(q, kv, scratch, out, k4, v4, k4);
    if (v4)
        i8a_v4pass_avx512_vnni(scratch, nq, kv, d, out->o);
    else
        i8a_vpass_tiles_amx(scratch, nq, kv, d, out->o, &cfg);
    if (cfg)
        I8A_TILE_RELEASE();
    i8a_vtop_with(i8a_vtop_row_avx512_vnni, scratch, nq, kv, d, v4, out->o);
}

static void i8a_attend_amx(const i8a_query *q, const i8a_span *kv, float *scratch,
                           const i8a_state *out)
{
    if (i8a_tiles_serve_amx(q))
        i8a_attend_body_amx(q, kv, scratch, out, 0, 0);
    else
        i8a_attend_avx512_vnni(q, kv, scratch, out);
}

static void i8a_attend_k8v4_amx(const i8a_query *q, const i8a_span *kv, float *scratch,
                                const i8a_state *out)
{
    if (i8a_tiles_serve_amx(q))
        i8a_attend_body_amx(q, kv, scratch, out, 0, 1);
    else
        i8a_attend_k8v4_avx512_vnni(q, kv, scratch, out);
}

static void i8a_attend_k4v8_amx(const i8a_query *q, const i8a_span *kv, float *scratch,
                                const i8a_state *out)
{
    if (i8a_tiles_serve_amx(q))
        i8a_attend_body_amx(q, kv, scratch, out, 1, 0);
    else
        i8a_attend_k4v8_avx512_vnni(q, kv, scratch, out);
}

/* Both sides at 4 bits: no tile pass (the avx512_vnni tier's attend). */
static void i8a_attend_k4v4_amx(const i8a_query *q, const i8a_span *kv, float *scratch,
                                const i8a_state *out)
{
    i8a_attend_k4v4_avx512_vnni(q, kv, scratch, out);
}

#endif
