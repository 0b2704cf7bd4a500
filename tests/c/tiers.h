/* The tiers the C checks run, best first, NULL-terminated: the build's table (i8a_tiers) and,
 * built with -DI8A_TILE_MODEL on x86-64, "amx_model": the amx tier's passes compiled against the
 * C model of the tile instructions (tile_model.h), which runs wherever avx512_vnni does.
 * I8A_CHECK_TIERS=a,b in the environment keeps those tiers and the scalar one (the reference):
 * an emulated CPU then runs the tier it adds, not again the ones an earlier CPU ran. */
#ifndef I8A_CHECK_TIERS_H
#define I8A_CHECK_TIERS_H

#include <stdlib.h>
#include <string.h>

#include "_simd/dispatch.h"

#if defined(I8A_TILE_MODEL) && (defined(__x86_64__) || defined(_M_X64))
#include "tile_model.h"
#include "_simd/amx.h"

static const i8a_kernels i8a_amx_model = {
    .name = "amx_model",
    .requires = I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI,
    .quantize_row = i8a_quantize_row_avx512_vnni,
    .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_amx, [I8A_FMT4] = i8a_attend_k8v4_amx},
               [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_amx, [I8A_FMT4] = i8a_attend_k4v4_amx}},
    .merge = i8a_merge_avx512_vnni,
    .rotate = i8a_rotate_avx512_vnni,
    .attend_float = i8a_attend_float_avx512_vnni,
    .half_row = i8a_half_row_avx512_vnni,
};
#define I8A_CHECK_MODEL (&i8a_amx_model)
#endif

/* Whether I8A_CHECK_TIERS (a comma-separated list; unset: every tier) names tier `name`. */
static int check_tier_named(const char *name)
{
    const char *only = getenv("I8A_CHECK_TIERS");
    if (!only || !strcmp(name, "scalar"))
        return 1;
    const size_t len = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += len)
        if ((p == only || p[-1] == ',') && (p[len] == ',' || p[len] == '\0'))
            return 1;
    return 0;
}

static const i8a_kernels *const *checked_tiers(void)
{
    static const i8a_kernels *list[16];
    size_t n = 0;
#ifdef I8A_CHECK_MODEL
    if (check_tier_named(I8A_CHECK_MODEL->name))
        list[n++] = I8A_CHECK_MODEL;
    (void)i8a_stream_avx512_vnni;       /* in the headers the model includes; not a table entry */
#endif
    for (const i8a_kernels *t = i8a_tiers; t->name && n < 15; t++)
        if (check_tier_named(t->name))
            list[n++] = t;
    list[n] = NULL;
    return list;
}

#endif
