/* A C model of the AMX tile instructions the amx tier uses, from their documented semantics
 * (Intel's SDM, "Intel AMX": LDTILECFG palette 1, TILELOADD, TILESTORED, TILEZERO, TDPBSSD,
 * TDPBUSD, TILERELEASE), so that the C checks run the tier's passes (_simd/amx.h, compiled with
 * these macros in place of the intrinsics) on CPUs without AMX and check their tiling against
 * the scalar tier. Each tile is 16 rows of 64 bytes per thread, as the hardware's are; every
 * shape rule an instruction has (a row count or width beyond the configuration, A's width
 * against B's rows, C's against B's, unconfigured tiles) aborts the check with its reason. */
#ifndef I8A_TILE_MODEL_H
#define I8A_TILE_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define I8A_TILE_OPS 1

typedef struct {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t data[8][16][64];
} i8a_tile_state;

static _Thread_local i8a_tile_state i8a_tiles;

static void i8a_tile_fail(const char *what)
{
    fprintf(stderr, "tile model: %s\n", what);
    abort();
}

static void i8a_tile_config(const void *cfg)
{
    const uint8_t *c = (const uint8_t *)cfg;
    if (c[0] != 1)
        i8a_tile_fail("palette other than 1");
    memset(&i8a_tiles, 0, sizeof i8a_tiles);    /* LDTILECFG zeroes every tile */
    for (int t = 0; t < 8; t++) {
        i8a_tiles.colsb[t] = (uint16_t)(c[16 + 2 * t] | c[17 + 2 * t] << 8);
        i8a_tiles.rows[t] = c[48 + t];
        if (i8a_tiles.rows[t] > 16 || i8a_tiles.colsb[t] > 64)
            i8a_tile_fail("a tile beyond 16 rows of 64 bytes");
    }
    i8a_tiles.configured = 1;
}

static void i8a_tile_check(int t)
{
    if (!i8a_tiles.configured || !i8a_tiles.rows[t] || !i8a_tiles.colsb[t])
        i8a_tile_fail("a tile used before it is configured");
}

static void i8a_tile_load(int t, const void *p, size_t stride)
{
    i8a_tile_check(t);
    memset(i8a_tiles.data[t], 0, sizeof i8a_tiles.data[t]);
    for (int r = 0; r < i8a_tiles.rows[t]; r++)
        memcpy(i8a_tiles.data[t][r], (const uint8_t *)p + r * stride, i8a_tiles.colsb[t]);
}

static void i8a_tile_store(int t, void *p, size_t stride)
{
    i8a_tile_check(t);
    for (int r = 0; r < i8a_tiles.rows[t]; r++)
        memcpy((uint8_t *)p + r * stride, i8a_tiles.data[t][r], i8a_tiles.colsb[t]);
}

static void i8a_tile_zero(int t)
{
    i8a_tile_check(t);
    memset(i8a_tiles.data[t], 0, sizeof i8a_tiles.data[t]);
}

/* TDPBSSD (a_signed) / TDPBUSD: C[m][n] += sum over k < A.colsb / 4 and i < 4 of
 * A[m][4 k + i] * B[k][4 n + i], the bytes signed or unsigned as the instruction says, in int32. */
static void i8a_tile_dp(int c, int a, int b, int a_signed)
{
    i8a_tile_check(c), i8a_tile_check(a), i8a_tile_check(b);
    const i8a_tile_state *s = &i8a_tiles;
    if (s->rows[c] != s->rows[a] || s->colsb[c] != s->colsb[b] || s->colsb[a] != 4 * s->rows[b]
        || s->colsb[c] % 4 || s->colsb[a] % 4)
        i8a_tile_fail("TDPB*D: shapes that do not fit");
    for (int m = 0; m < s->rows[c]; m++)
        for (int n = 0; n < s->colsb[c] / 4; n++) {
            int32_t acc;
            memcpy(&acc, s->data[c][m] + 4 * n, 4);
            for (int k = 0; k < s->colsb[a] / 4; k++)
                for (int i = 0; i < 4; i++) {
                    const uint8_t x = s->data[a][m][4 * k + i];
                    const int32_t av = a_signed ? (int32_t)(int8_t)x : (int32_t)x;
                    acc += av * (int32_t)(int8_t)s->data[b][k][4 * n + i];
                }
            memcpy(i8a_tiles.data[c][m] + 4 * n, &acc, 4);
        }
}

static void i8a_tile_release(void)
{
    memset(&i8a_tiles, 0, sizeof i8a_tiles);
}

#define I8A_TILE_CONFIG(cfg) i8a_tile_config(cfg)
#define I8A_TILE_LOAD(t, p, stride) i8a_tile_load(t, p, stride)
#define I8A_TILE_STORE(t, p, stride) i8a_tile_store(t, p, stride)
#define I8A_TILE_ZERO(t) i8a_tile_zero(t)
#define I8A_TILE_DPBSSD(c, a, b) i8a_tile_dp(c, a, b, 1)
#define I8A_TILE_DPBUSD(c, a, b) i8a_tile_dp(c, a, b, 0)
#define I8A_TILE_RELEASE() i8a_tile_release()

#endif
