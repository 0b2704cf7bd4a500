/* vpass/amx.h: the integer V pass at 8 bits by TDPBUSD: the planes' sums over V tiles, then o;
 * the amx tier's, bit for bit vpass/scalar.h's rule. Included only by ../amx.h, inside the
 * tier's target region: its pragma applies to every function here. */
#ifndef I8A_VPASS_AMX_H
#define I8A_VPASS_AMX_H

#ifndef I8A_AMX_H
#error "vpass/amx.h is included by ../amx.h only"
#endif

/* Steps of 64 positions (16 tiles) a chunk's V pass takes at most: ceil((3 + I8A_CHUNK) / 64). */
#define I8A_AMX_VSTEPS 5
_Static_assert(I8A_AMX_VSTEPS * 64 <= I8A_PLANE_BYTES, "a step's weights lie in a head's planes");

/* The V pass of every head: per 16 dims, the 64 bytes of those dims of each of the chunk's V
 * tiles (a tile holds each dimension's 4 positions in 4 bytes: TDPBUSD's B rows, 16 tiles a
 * step of 64 positions) staged on the stack, zeros past the last tile; then per block of up to
 * 16 heads and per step one TDPBUSD per plane, A the heads' plane bytes of the step's positions
 * (unsigned; the bytes past the chunk's last row zeroed first), C the planes' sums of the 16
 * dims; o from them as every tier makes it (S_0 * sc_0, then one fused step per plane). The
 * staging prefetches the next span's V, each block of dims its share. */
I8A_INLINE void i8a_vpass_tiles_amx(float *scratch, size_t nq, const i8a_span *kv, size_t d,
                                    float *o, size_t *cfg)
{
    const size_t tiles = i8a_v_tiles(kv->v_lead, kv->n), steps = (tiles + 15) / 16;
    const size_t used = (kv->v_lead + kv->n + 15) & ~(size_t)15;   /* planes' defined bytes */
    for (size_t j = 0; j < nq; j++)
        for (int k = 0; k < I8A_WPLANES8; k++)
            memset(i8a_planes_at(scratch, nq, j) + k * I8A_PLANE_BYTES + used, 0, 64 * steps - used);
    const int8_t *tile[I8A_CHUNK / I8A_V_TILE + 2];
    i8a_vtile_addresses(kv, d, tile);
    _Alignas(64) int8_t stage[I8A_AMX_VSTEPS * 16 * 64];
    _Alignas(64) int32_t sums[I8A_WPLANES8][I8A_AMX_ROWS][16];
    const size_t nblk = d / 16;
    for (size_t i = 0, b = 0; i < d; i += 16, b++) {
        size_t lo, hi;
        i8a_vprefetch_share(kv->next_n, b, nblk, &lo, &hi);
        for (size_t t = 0; t < 16 * steps; t++) {
            if (t < tiles && I8A_V_TILE * t >= lo && I8A_V_TILE * t < hi)
                i8a_prefetch_rows(i8a_next_vrow(kv, I8A_V_TILE * t, d), I8A_V_TILE * d);
            _mm512_store_si512((void *)(stage + 64 * t),
                               t < tiles ? _mm512_loadu_si512((const void *)(tile[t] + I8A_V_TILE * i))
                                         : _mm512_setzero_si512());
        }
        for (size_t j0 = 0; j0 < nq; j0 += I8A_AMX_ROWS) {
            const size_t m = nq - j0 < I8A_AMX_ROWS ? nq - j0 : I8A_AMX_ROWS;
            const uint8_t *w = i8a_planes_at(scratch, nq, j0);
            i8a_tile_rows_amx(m, cfg);
            I8A_TILE_ZERO(I8A_TC0);
            I8A_TILE_ZERO(I8A_TC1);
            for (size_t st = 0; st < steps; st++) {    /* head rows 4 I8A_CHUNK bytes apart */
                I8A_TILE_LOAD(I8A_TB, stage + 1024 * st, 64);
                I8A_TILE_LOAD(I8A_TA0, w + 64 * st, 4 * I8A_CHUNK);
                I8A_TILE_DPBUSD(I8A_TC0, I8A_TA0, I8A_TB);
                I8A_TILE_LOAD(I8A_TA1, w + I8A_PLANE_BYTES + 64 * st, 4 * I8A_CHUNK);
                I8A_TILE_DPBUSD(I8A_TC1, I8A_TA1, I8A_TB);
            }
            I8A_TILE_STORE(I8A_TC0, sums[0], 64);
            I8A_TILE_STORE(I8A_TC1, sums[1], 64);
            for (size_t r = 0; r < m; r++) {
                float sc[I8A_WPLANES];
                i8a_planes_scales(i8a_planes_at(scratch, nq, j0 + r), sc);
                __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)sums[0][r])),
                                         _mm512_set1_ps(sc[0]));
                y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)sums[1][r])),
                                    _mm512_set1_ps(sc[1]), y);
                _mm512_storeu_ps(o + (j0 + r) * d + i, y);
            }
        }
    }
}

#endif
