/* kdots/amx.h: K at 8 bits: the exact int8 dots of the q planes with K rows by TDPBSSD, and the
 * tile configuration both passes use; the amx tier's, bit for bit kdots/scalar.h's rule.
 * Included only by ../amx.h, inside the tier's target region: its pragma applies to every
 * function here. */
#ifndef I8A_KDOTS_AMX_H
#define I8A_KDOTS_AMX_H

#ifndef I8A_AMX_H
#error "kdots/amx.h is included by ../amx.h only"
#endif

/* Query heads a block of tiles serves: a tile's rows. */
#define I8A_AMX_ROWS 16

/* Palette 1's configuration of the five tiles for blocks of m query rows (1 .. 16): A and C m
 * rows of 64 bytes, B 16 rows of 64 bytes (TDPBSSD's shapes: C rows = A rows, A's 64 bytes are
 * B's 16 rows of 4, B's 64 bytes C's 16 int32). Loading it zeroes every tile. */
I8A_INLINE void i8a_tile_config_amx(size_t m)
{
    _Alignas(64) uint8_t cfg[64] = {0};
    cfg[0] = 1;                                 /* palette 1 */
    for (int t = I8A_TC0; t <= I8A_TB; t++) {
        cfg[16 + 2 * t] = 64;                   /* colsb[t], little-endian 16 bits */
        cfg[48 + t] = (uint8_t)(t == I8A_TB ? 16 : m);   /* rows[t] */
    }
    I8A_TILE_CONFIG(cfg);
}

/* The tiles configured for m rows (*now: the rows they are configured for, 0 before the first). */
I8A_INLINE void i8a_tile_rows_amx(size_t m, size_t *now)
{
    if (*now != m) {
        i8a_tile_config_amx(m);
        *now = m;
    }
}

/* Exact dots of every query head's planes with rows [0, n), d a multiple of 64: 16 rows at a time
 * transposed once into the avx512_vnni tiled pass's layout (quad c of row r in 32-bit lane r of
 * row c: TDPBSSD's B, the codes signed as stored), then per block of up to 16 heads and per 64
 * dims one TDPBSSD per plane, the heads' plane rows as A; C holds the block's dots with the 16
 * rows, stored in place: dh[j * I8A_CHUNK + s], dl[...], up to the next multiple of 16 past n
 * (rows past n repeat row n - 1; those values unused). */
I8A_INLINE void i8a_kdots_tiles_amx(const i8a_query *q, const i8a_span *kv, int32_t *dh,
                                    int32_t *dl, const int one_run, size_t *cfg)
{
    const size_t d = q->d, n = kv->n, nq = q->nq;
    const int two = q->two_planes;
    const int8_t *rows[I8A_CHUNK];
    if (!one_run)
        i8a_krows(kv, d, rows);
    _Alignas(64) uint8_t kt[I8A_KTILE_ROWS * I8A_MAX_HEAD_DIM];
    for (size_t s = 0; s < n; s += I8A_KTILE_ROWS) {
        if (s < kv->next_n)                     /* the next chunk's K, 16 rows per tile */
            i8a_prefetch_rows(i8a_next_krow_of(kv, s, d, one_run),
                              (kv->next_n - s < I8A_KTILE_ROWS ? kv->next_n - s : I8A_KTILE_ROWS) * d);
        i8a_ktiles_avx512_vnni(kv, rows, s, d, one_run, 0, kt);
        for (size_t j0 = 0; j0 < nq; j0 += I8A_AMX_ROWS) {
            i8a_tile_rows_amx(nq - j0 < I8A_AMX_ROWS ? nq - j0 : I8A_AMX_ROWS, cfg);
            I8A_TILE_ZERO(I8A_TC0);
            I8A_TILE_ZERO(I8A_TC1);
            for (size_t i = 0; i < d; i += 64) {
                I8A_TILE_LOAD(I8A_TB, kt + 16 * i, 64);
                I8A_TILE_LOAD(I8A_TA0, q->q_hi + j0 * d + i, d);
                I8A_TILE_DPBSSD(I8A_TC0, I8A_TA0, I8A_TB);
                if (two) {
                    I8A_TILE_LOAD(I8A_TA1, q->q_lo + j0 * d + i, d);
                    I8A_TILE_DPBSSD(I8A_TC1, I8A_TA1, I8A_TB);
                }
            }
            I8A_TILE_STORE(I8A_TC0, dh + j0 * I8A_CHUNK + s, I8A_CHUNK * sizeof(int32_t));
            if (two)
                I8A_TILE_STORE(I8A_TC1, dl + j0 * I8A_CHUNK + s, I8A_CHUNK * sizeof(int32_t));
        }
    }
}

/* The amx tier's K pass, the span's layout a constant (one run: a contiguous cache). */
I8A_INLINE void i8a_kdots_amx(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl,
                              size_t *cfg)
{
    if (i8a_one_run(kv))
        i8a_kdots_tiles_amx(q, kv, dh, dl, 1, cfg);
    else
        i8a_kdots_tiles_amx(q, kv, dh, dl, 0, cfg);
}

#endif
