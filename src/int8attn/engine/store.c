/* The cache's buffers: which a format has and their sizes (i8a_store_layout), binding them to a
 * cache, V codes into and out of their tiles, 4-bit V rows and K values, dequantize, the rows
 * moving down (evict's part), the rotation signs, and the aligned allocation every buffer comes
 * from. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L      /* posix_memalign */
#endif
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* a * b, or SIZE_MAX with *over set when it does not fit */
static size_t mul(size_t a, size_t b, int *over)
{
    if (b && a > SIZE_MAX / b) {
        *over = 1;
        return SIZE_MAX;
    }
    return a * b;
}

/* buf = a buffer of ndim dimensions (shape s) of `type`, or none (bytes 0) when !present. */
static void describe(i8a_buffer *buf, const char *name, int present, char type, int zeroed,
                     size_t ndim, const size_t *s, int *over)
{
    static const struct { char type; size_t item; } items[] = {
        {'b', 1}, {'B', 1}, {'H', 2}, {'f', 4},
    };
    memset(buf, 0, sizeof *buf);
    buf->name = name;
    buf->type = type;
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        if (items[i].type == type)
            buf->item = items[i].item;
    buf->ndim = ndim;
    buf->zeroed = zeroed;
    size_t bytes = buf->item;
    for (size_t i = 0; i < ndim; i++) {
        buf->shape[i] = s[i];
        bytes = mul(bytes, s[i], over);
    }
    buf->bytes = present ? bytes : 0;
}

/* The ring's slots: the last R positions and R more (what truncate can take back), never more
 * than the cache holds. */
static size_t ring_of(const i8a_format *f)
{
    return 2 * f->recent < f->max_seq ? 2 * f->recent : f->max_seq;
}

int i8a_store_layout(const i8a_format *f, i8a_buffer buf[I8A_BUFFERS], size_t *total)
{
    const size_t hkv = f->n_kv_heads, cap = f->max_seq, d = f->head_dim;
    const size_t groups = i8a_k4_groups(cap), tiles = i8a_v_tiles(0, cap);
    const size_t ring = ring_of(f);
    const int k8 = f->k_bits == 8, v8 = f->v_bits == 8, r = f->recent > 0;
    int over = 0;
    /* K at 8 bits: codes by row; at 4 bits: nibble rows and their wide channels' fifth bits,
     * and per group of 32 positions the channels' minima and steps (halves) and their powers of
     * two (zeros: never coded) */
    describe(buf + I8A_BUF_K_CODES, "k_codes", k8, 'b', 0, 3, (size_t[]){hkv, cap, d}, &over);
    describe(buf + I8A_BUF_K_SCALE, "k_scale", k8, 'f', 0, 2, (size_t[]){hkv, cap}, &over);
    describe(buf + I8A_BUF_K4, "k4", !k8, 'B', 1, 3, (size_t[]){hkv, cap, d / 2}, &over);
    describe(buf + I8A_BUF_K4_WIDE, "k4_wide", !k8, 'B', 1, 3,
             (size_t[]){hkv, cap, I8A_K4_WIDE_BYTES(d)}, &over);
    describe(buf + I8A_BUF_K4_MIN, "k4_min", !k8, 'H', 1, 3, (size_t[]){hkv, groups, d}, &over);
    describe(buf + I8A_BUF_K4_STEP, "k4_step", !k8, 'H', 1, 3, (size_t[]){hkv, groups, d}, &over);
    describe(buf + I8A_BUF_K4_MIN_SCALE, "k4_min_scale", !k8, 'f', 1, 2, (size_t[]){hkv, groups},
             &over);
    describe(buf + I8A_BUF_K4_STEP_SCALE, "k4_step_scale", !k8, 'f', 1, 2,
             (size_t[]){hkv, groups}, &over);
    /* V in tiles of I8A_V_TILE positions (at 4 bits 2 d bytes a tile), a scale (or step) per
     * row, at 4 bits a minimum per row */
    describe(buf + I8A_BUF_V_CODES, "v_codes", v8, 'b', 0, 4, (size_t[]){hkv, tiles, d, I8A_V_TILE},
             &over);
    describe(buf + I8A_BUF_V_SCALE, "v_scale", 1, 'f', 0, 2, (size_t[]){hkv, cap}, &over);
    describe(buf + I8A_BUF_V4, "v4", !v8, 'B', 1, 3, (size_t[]){hkv, tiles, 2 * d}, &over);
    describe(buf + I8A_BUF_V4_MIN, "v4_min", !v8, 'f', 0, 2, (size_t[]){hkv, cap}, &over);
    /* position 0 and the offsets as floats; the ring of the recent window as halves */
    describe(buf + I8A_BUF_K_FIRST, "k_first", f->keep_first, 'f', 1, 2, (size_t[]){hkv, d}, &over);
    describe(buf + I8A_BUF_V_FIRST, "v_first", f->keep_first, 'f', 1, 2, (size_t[]){hkv, d}, &over);
    describe(buf + I8A_BUF_K_OFFSET, "k_offset", f->center, 'f', 1, 2, (size_t[]){hkv, d}, &over);
    describe(buf + I8A_BUF_V_OFFSET, "v_offset", f->center, 'f', 1, 2, (size_t[]){hkv, d}, &over);
    describe(buf + I8A_BUF_K_RECENT, "k_recent", r, 'H', 0, 3, (size_t[]){hkv, ring, d}, &over);
    describe(buf + I8A_BUF_V_RECENT, "v_recent", r, 'H', 0, 3, (size_t[]){hkv, ring, d}, &over);
    describe(buf + I8A_BUF_K_RSCALE, "k_rscale", r, 'f', 0, 2, (size_t[]){hkv, ring}, &over);
    describe(buf + I8A_BUF_V_RSCALE, "v_rscale", r, 'f', 0, 2, (size_t[]){hkv, ring}, &over);
    size_t sum = 0;
    for (size_t i = 0; i < I8A_BUFFERS; i++) {
        over |= buf[i].bytes > SIZE_MAX - sum;
        sum = over ? SIZE_MAX : sum + buf[i].bytes;
    }
    *total = sum;
    return over ? -1 : 0;
}

void i8a_store_bind(i8a_cache *c, const i8a_format *f, void *const mem[I8A_BUFFERS],
                    const float *sign)
{
    memset(c, 0, sizeof *c);
    c->n_kv_heads = f->n_kv_heads, c->max_seq = f->max_seq, c->head_dim = f->head_dim;
    c->k_bits = f->k_bits, c->v_bits = f->v_bits;
    c->recent = f->recent;
    c->ring = ring_of(f);
    c->v_sign = sign;
    c->k_sign = f->k_bits == 8 ? sign : NULL;
    c->k_codes = mem[I8A_BUF_K_CODES], c->k_scale = mem[I8A_BUF_K_SCALE];
    c->k4 = mem[I8A_BUF_K4], c->k4_wide = mem[I8A_BUF_K4_WIDE];
    c->k4_min = mem[I8A_BUF_K4_MIN], c->k4_step = mem[I8A_BUF_K4_STEP];
    c->k4_min_scale = mem[I8A_BUF_K4_MIN_SCALE], c->k4_step_scale = mem[I8A_BUF_K4_STEP_SCALE];
    c->v_codes = mem[I8A_BUF_V_CODES], c->v_scale = mem[I8A_BUF_V_SCALE];
    c->v4 = mem[I8A_BUF_V4], c->v4_min = mem[I8A_BUF_V4_MIN];
    c->k_first = mem[I8A_BUF_K_FIRST], c->v_first = mem[I8A_BUF_V_FIRST];
    c->k_offset = mem[I8A_BUF_K_OFFSET], c->v_offset = mem[I8A_BUF_V_OFFSET];
    c->k_recent = mem[I8A_BUF_K_RECENT], c->v_recent = mem[I8A_BUF_V_RECENT];
    c->k_rscale = mem[I8A_BUF_K_RSCALE], c->v_rscale = mem[I8A_BUF_V_RSCALE];
}

void i8a_tile_rows(const int8_t *rows, size_t n, size_t d, size_t lead, int8_t *tiles)
{
    if (lead == 0 && n == I8A_V_TILE) {         /* a whole tile: its 4 bytes a dim together */
        for (size_t i = 0; i < d; i++)
            for (size_t p = 0; p < I8A_V_TILE; p++)
                tiles[i * I8A_V_TILE + p] = rows[p * d + i];
        return;
    }
    for (size_t p = 0; p < n; p++) {
        int8_t *t = tiles + (lead + p) / I8A_V_TILE * I8A_V_TILE * d + (lead + p) % I8A_V_TILE;
        for (size_t i = 0; i < d; i++)
            t[i * I8A_V_TILE] = rows[p * d + i];
    }
}

const float *i8a_row_at(const row_source *src, size_t pos, size_t g, float *tmp)
{
    const i8a_cache *c = src->c;
    const size_t d = c->head_dim;
    if (pos < src->x_from) {
        widen_row(c, src->ring, src->ring_scale, g, slot_of(c, pos), tmp);
        return tmp;
    }
    const float *x = src->x + ((pos - src->x_from) * c->n_kv_heads + g) * d;
    if (!c->recent || pos == 0 || pos > c->recent)
        return x;
    uint16_t h[I8A_MAX_HEAD_DIM];
    widen(h, src->kt->half_row(x, d, h), d, tmp);
    return tmp;
}

void i8a_v_put(const i8a_cache *c, size_t g, size_t pos, const int8_t *codes)
{
    i8a_tile_rows(codes, 1, c->head_dim, pos % I8A_V_TILE, v_tile(c, g, pos));
}

void i8a_v_get(const i8a_cache *c, size_t g, size_t pos, int8_t *codes)
{
    const int8_t *t = v_tile(c, g, pos) + pos % I8A_V_TILE;
    for (size_t i = 0; i < c->head_dim; i++)
        codes[i] = t[i * I8A_V_TILE];
}

size_t i8a_k4_groups(size_t cap)
{
    return (cap + I8A_K4_GROUP - 1) / I8A_K4_GROUP;
}

void i8a_v4_put(const i8a_cache *c, size_t g, size_t pos, const uint8_t *codes)
{
    uint8_t *t = v4_tile(c, g, pos);
    for (size_t i = 0; i < c->head_dim; i++)
        nib_set(t + i / I8A_NIB_BLOCK * 64 + i % 16 * I8A_V_TILE + pos % I8A_V_TILE, i, codes[i]);
}

void i8a_v4_get(const i8a_cache *c, size_t g, size_t pos, uint8_t *codes)
{
    const uint8_t *t = v4_tile(c, g, pos);
    for (size_t i = 0; i < c->head_dim; i++)
        codes[i] = (uint8_t)i8a_nib_tile(t, i, pos % I8A_V_TILE);
}

void i8a_v4_store(const i8a_cache *c, size_t g, size_t pos, const float *y)
{
    const size_t d = c->head_dim, row = g * c->max_seq + pos;
    float lo = y[0], hi = y[0];
    for (size_t i = 1; i < d; i++) {
        lo = y[i] < lo ? y[i] : lo;
        hi = y[i] > hi ? y[i] : hi;
    }
    const float range = hi - lo;
    const int some = range >= I8A_ABSMAX_MIN;
    const float inv = some ? 15.0f / range : 0.0f;
    uint8_t codes[I8A_MAX_HEAD_DIM];
    for (size_t i = 0; i < d; i++) {
        float r = rintf((y[i] - lo) * inv);
        r = r > 15.0f ? 15.0f : r;
        codes[i] = (uint8_t)(r > 0.0f ? r : 0.0f);
    }
    c->v4_min[row] = lo;
    c->v_scale[row] = some ? range / 15.0f : 0.0f;
    i8a_v4_put(c, g, pos, codes);
}

void i8a_k4_value(const i8a_cache *c, size_t g, size_t pos, float *y)
{
    const size_t d = c->head_dim, at = g * i8a_k4_groups(c->max_seq) + pos / I8A_K4_GROUP;
    const uint16_t *hm = c->k4_min + at * d, *hs = c->k4_step + at * d;
    const float sm = c->k4_min_scale[at], ss = c->k4_step_scale[at];
    const uint8_t *row = k4_row_codes(c, g, pos), *wide = k4_row_wide(c, g, pos);
    int16_t rank[I8A_MAX_HEAD_DIM];
    i8a_k4_wide_ranks(hs, d, rank);
    for (size_t i = 0; i < d; i++)
        y[i] = i8a_half_value(hm[i]) * sm
               + (i8a_half_value(hs[i]) * ss) * (float)i8a_k4_code(row, wide, rank, i);
}

void *i8a_alloc_aligned(size_t bytes)
{
    bytes = bytes ? bytes : 1;
#ifdef _WIN32
    return _aligned_malloc(bytes, 64);
#else
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
#endif
}

void i8a_free_aligned(void *p)
{
#ifdef _WIN32
    _aligned_free(p);
#else
    free(p);
#endif
}

void i8a_rotation_signs(uint64_t seed, size_t d, float *sign)
{
    uint64_t state = seed;
    for (size_t i = 0; i < d; i++) {
        state += 0x9E3779B97F4A7C15u;                       /* splitmix64 */
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
        z ^= z >> 31;
        sign[i] = z >> 63 ? -1.0f : 1.0f;
    }
}

/* Coded position pos of kv head g as floats into yk, yv: code * scale, plus the offset when
 * `off`, rotated back. */
static void dequantize_row(const i8a_kernels *kt, const i8a_cache *c, size_t g, size_t pos,
                           int off, float *yk, float *yv)
{
    const size_t d = c->head_dim, row = g * c->max_seq + pos;
    if (c->k_bits == 8) {
        const int8_t *codes = k_row(c, g, pos);
        const float ks = *k_scale_of(c, g, pos);
        for (size_t i = 0; i < d; i++)
            yk[i] = (float)codes[i] * ks;
    } else {
        i8a_k4_value(c, g, pos, yk);
    }
    if (c->v_bits == 8) {
        int8_t vc[I8A_MAX_HEAD_DIM];
        i8a_v_get(c, g, pos, vc);
        const float vs = *v_scale_of(c, g, pos);
        for (size_t i = 0; i < d; i++)
            yv[i] = (float)vc[i] * vs;
    } else {
        uint8_t vc[I8A_MAX_HEAD_DIM];
        i8a_v4_get(c, g, pos, vc);
        for (size_t i = 0; i < d; i++)
            yv[i] = c->v4_min[row] + c->v_scale[row] * (float)vc[i];
    }
    if (off)
        for (size_t i = 0; i < d; i++) {
            yk[i] = yk[i] + c->k_offset[g * d + i];
            yv[i] = yv[i] + c->v_offset[g * d + i];
        }
    if (c->k_sign)
        kt->rotate(yk, d, c->k_sign, 1, yk);
    if (c->v_sign)
        kt->rotate(yv, d, c->v_sign, 1, yv);
}

void i8a_dequantize(const i8a_kernels *kt, const i8a_cache *c, float *k, float *v)
{
    const size_t d = c->head_dim, hkv = c->n_kv_heads, fw = window_start(c);
    const int off = has_offsets(c);
    for (size_t pos = 0; pos < c->length; pos++) {
        if (pos >= fw) {                /* the window: its halves, scaled */
            for (size_t g = 0; g < hkv; g++) {
                widen_row(c, c->k_recent, c->k_rscale, g, slot_of(c, pos), k + (pos * hkv + g) * d);
                widen_row(c, c->v_recent, c->v_rscale, g, slot_of(c, pos), v + (pos * hkv + g) * d);
            }
            continue;
        }
        for (size_t g = 0; g < hkv; g++) {
            const size_t at = (pos * hkv + g) * d;
            if (c->k_first && pos == 0) {
                memcpy(k + at, c->k_first + g * d, d * sizeof(float));
                memcpy(v + at, c->v_first + g * d, d * sizeof(float));
            } else {
                dequantize_row(kt, c, g, pos, off && pos >= 1, k + at, v + at);
            }
        }
    }
}

void i8a_move_down(const i8a_kernels *kt, i8a_cache *c, size_t n)
{
    I8A_EXPECT(n >= 1 && n < c->length && (c->k_bits == 8 || n % I8A_K4_GROUP == 0));
    const size_t d = c->head_dim, hkv = c->n_kv_heads, cap = c->max_seq, keep = c->length - n;
    if (c->k_first) {               /* position n, as decode read it, becomes the float row */
        if (n >= window_start(c)) {
            for (size_t g = 0; g < hkv; g++) {
                widen_row(c, c->k_recent, c->k_rscale, g, slot_of(c, n), c->k_first + g * d);
                widen_row(c, c->v_recent, c->v_rscale, g, slot_of(c, n), c->v_first + g * d);
            }
        } else {
            /* clamped to the format's range, which first rows keep (as load checks): rounding
             * in the rotated space can take a value at the edge of the range past it */
            for (size_t g = 0; g < hkv; g++) {
                float *yk = c->k_first + g * d, *yv = c->v_first + g * d;
                dequantize_row(kt, c, g, n, has_offsets(c), yk, yv);
                for (size_t i = 0; i < d; i++) {
                    yk[i] = fminf(fmaxf(yk[i], -I8A_VALUE_MAX), I8A_VALUE_MAX);
                    yv[i] = fminf(fmaxf(yv[i], -I8A_VALUE_MAX), I8A_VALUE_MAX);
                }
            }
        }
    }
    const size_t groups = i8a_k4_groups(cap), gone = n / I8A_K4_GROUP;
    const size_t kept_groups = i8a_k4_groups(keep);
    for (size_t g = 0; g < hkv; g++) {
        if (c->k_bits == 8) {
            memmove(c->k_codes + g * cap * d, c->k_codes + (g * cap + n) * d, keep * d);
            memmove(c->k_scale + g * cap, c->k_scale + g * cap + n, keep * sizeof(float));
        } else {                    /* whole groups: their codes, halves and scales */
            memmove(k4_row_codes(c, g, 0), k4_row_codes(c, g, n), keep * (d / 2));
            memmove(k4_row_wide(c, g, 0), k4_row_wide(c, g, n), keep * I8A_K4_WIDE_BYTES(d));
            memmove(c->k4_min + g * groups * d, c->k4_min + (g * groups + gone) * d,
                    kept_groups * d * sizeof(uint16_t));
            memmove(c->k4_step + g * groups * d, c->k4_step + (g * groups + gone) * d,
                    kept_groups * d * sizeof(uint16_t));
            memmove(c->k4_min_scale + g * groups, c->k4_min_scale + g * groups + gone,
                    kept_groups * sizeof(float));
            memmove(c->k4_step_scale + g * groups, c->k4_step_scale + g * groups + gone,
                    kept_groups * sizeof(float));
        }
        if (c->v_bits == 8 && n % I8A_V_TILE == 0) {
            memmove(v_tile(c, g, 0), v_tile(c, g, n), i8a_v_tiles(0, keep) * I8A_V_TILE * d);
        } else if (c->v_bits == 4 && n % I8A_V_TILE == 0) {
            memmove(v4_tile(c, g, 0), v4_tile(c, g, n), i8a_v_tiles(0, keep) * 2 * d);
        } else {                    /* position by position, upwards: p + n is read before p + n
                                     * is written (every position's bytes are its own) */
            for (size_t p = 0; p < keep; p++) {
                if (c->v_bits == 8) {
                    int8_t vc[I8A_MAX_HEAD_DIM];
                    i8a_v_get(c, g, p + n, vc);
                    i8a_v_put(c, g, p, vc);
                } else {
                    uint8_t vc[I8A_MAX_HEAD_DIM];
                    i8a_v4_get(c, g, p + n, vc);
                    i8a_v4_put(c, g, p, vc);
                }
            }
        }
        memmove(c->v_scale + g * cap, c->v_scale + g * cap + n, keep * sizeof(float));
        if (c->v_bits == 4)
            memmove(c->v4_min + g * cap, c->v4_min + g * cap + n, keep * sizeof(float));
    }
    if (c->ring)                    /* slot (p + n + shift) % ring now holds position p */
        c->ring_shift = (c->ring_shift + n) % c->ring;
    c->held_from = c->held_from > n ? c->held_from - n : 0;
    c->length = keep;
}
