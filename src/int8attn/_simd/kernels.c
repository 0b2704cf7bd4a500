/* The tier table: every tier compiled for this architecture, best first. Compiled at the
 * baseline; each ISA header switches its own target on for its functions only. */
#include "dispatch.h"
#include "scalar.h"

#if defined(__x86_64__) || defined(_M_X64)
#include "avx2.h"
#define I8A_HAVE_AVX2 1
/* AMX's intrinsics: GCC 11 on, clang 12 on */
#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11)                                \
    || (defined(__clang__) && __clang_major__ >= 12)
#include "amx.h"
#define I8A_HAVE_AMX 1
#else
#include "avx512_vnni.h"
#endif
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define I8A_HAVE_NEON 1
/* clang before 17 declares vdotq_s32 only when the whole file targets dotprod (Apple's clang
 * does: every Apple arm64 core has it); there the neon tier serves dotprod cores too. */
#if !defined(__clang__) || defined(__ARM_FEATURE_DOTPROD) || __clang_major__ >= 17
#define I8A_HAVE_NEON_DOTPROD 1
/* SMMLA's intrinsics: GCC 10 on; clang as for SDOT's, per function from 17 on */
#if (!defined(__clang__) && __GNUC__ >= 10) || defined(__ARM_FEATURE_MATMUL_INT8)                 \
    || (defined(__clang__) && __clang_major__ >= 17)
#include "neon_i8mm.h"
#define I8A_HAVE_NEON_I8MM 1
#else
#include "neon_dotprod.h"
#endif
#else
#include "neon.h"
#endif
#endif

/* attend[k][v]: K's format k, V's format v (dispatch.h). */
const i8a_kernels i8a_tiers[] = {
#ifdef I8A_HAVE_AMX
    {
        .name = "amx",
        .requires = I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI | I8A_CPU_AMX,
        .quantize_row = i8a_quantize_row_avx512_vnni,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_amx,
                                 [I8A_FMT4] = i8a_attend_k8v4_amx},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_amx,
                                 [I8A_FMT4] = i8a_attend_k4v4_amx}},
        .merge = i8a_merge_avx512_vnni,
        .rotate = i8a_rotate_avx512_vnni,
        .attend_float = i8a_attend_float_avx512_vnni,
        .half_row = i8a_half_row_avx512_vnni,
    },
#endif
#ifdef I8A_HAVE_AVX2
    {
        .name = "avx512_vnni",
        .requires = I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI,
        .quantize_row = i8a_quantize_row_avx512_vnni,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_avx512_vnni,
                                 [I8A_FMT4] = i8a_attend_k8v4_avx512_vnni},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_avx512_vnni,
                                 [I8A_FMT4] = i8a_attend_k4v4_avx512_vnni}},
        .merge = i8a_merge_avx512_vnni,
        .rotate = i8a_rotate_avx512_vnni,
        .attend_float = i8a_attend_float_avx512_vnni,
        .half_row = i8a_half_row_avx512_vnni,
    },
    {
        .name = "avx2",
        .requires = I8A_CPU_AVX2,
        .quantize_row = i8a_quantize_row_avx2,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_avx2,
                                 [I8A_FMT4] = i8a_attend_k8v4_avx2},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_avx2,
                                 [I8A_FMT4] = i8a_attend_k4v4_avx2}},
        .merge = i8a_merge_avx2,
        .rotate = i8a_rotate_avx2,
        .attend_float = i8a_attend_float_avx2,
        .half_row = i8a_half_row_avx2,
    },
#endif
#ifdef I8A_HAVE_NEON_I8MM
    {
        .name = "neon_i8mm",
        .requires = I8A_CPU_NEON | I8A_CPU_DOTPROD | I8A_CPU_I8MM,
        .quantize_row = i8a_quantize_row_neon,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_neon_i8mm,
                                 [I8A_FMT4] = i8a_attend_k8v4_neon_i8mm},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_neon_i8mm,
                                 [I8A_FMT4] = i8a_attend_k4v4_neon_i8mm}},
        .merge = i8a_merge_neon,
        .rotate = i8a_rotate_neon,
        .attend_float = i8a_attend_float_neon,
        .half_row = i8a_half_row_neon,
    },
#endif
#ifdef I8A_HAVE_NEON_DOTPROD
    {
        .name = "neon_dotprod",
        .requires = I8A_CPU_NEON | I8A_CPU_DOTPROD,
        .quantize_row = i8a_quantize_row_neon,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_neon_dotprod,
                                 [I8A_FMT4] = i8a_attend_k8v4_neon_dotprod},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_neon_dotprod,
                                 [I8A_FMT4] = i8a_attend_k4v4_neon_dotprod}},
        .merge = i8a_merge_neon,
        .rotate = i8a_rotate_neon,
        .attend_float = i8a_attend_float_neon,
        .half_row = i8a_half_row_neon,
    },
#endif
#ifdef I8A_HAVE_NEON
    {
        .name = "neon",
        .requires = I8A_CPU_NEON,
        .quantize_row = i8a_quantize_row_neon,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_neon,
                                 [I8A_FMT4] = i8a_attend_k8v4_neon},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_neon,
                                 [I8A_FMT4] = i8a_attend_k4v4_neon}},
        .merge = i8a_merge_neon,
        .rotate = i8a_rotate_neon,
        .attend_float = i8a_attend_float_neon,
        .half_row = i8a_half_row_neon,
    },
#endif
    {
        .name = "scalar",
        .requires = 0,
        .quantize_row = i8a_quantize_row_scalar,
        .attend = {[I8A_FMT8] = {[I8A_FMT8] = i8a_attend_scalar,
                                 [I8A_FMT4] = i8a_attend_k8v4_scalar},
                   [I8A_FMT4] = {[I8A_FMT8] = i8a_attend_k4v8_scalar,
                                 [I8A_FMT4] = i8a_attend_k4v4_scalar}},
        .merge = i8a_merge_scalar,
        .rotate = i8a_rotate_scalar,
        .attend_float = i8a_attend_float_scalar,
        .half_row = i8a_half_row_scalar,
    },
    {.name = NULL},
};

const i8a_probe i8a_probes[] = {
#ifdef I8A_HAVE_AMX
    {"amx", I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI | I8A_CPU_AMX, i8a_stream_avx512_vnni},
#endif
#ifdef I8A_HAVE_AVX2
    {"avx512_vnni", I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI, i8a_stream_avx512_vnni},
    {"avx2", I8A_CPU_AVX2, i8a_stream_avx2},
#endif
#ifdef I8A_HAVE_NEON_I8MM
    {"neon_i8mm", I8A_CPU_NEON | I8A_CPU_DOTPROD | I8A_CPU_I8MM, i8a_stream_neon},
#endif
#ifdef I8A_HAVE_NEON_DOTPROD
    {"neon_dotprod", I8A_CPU_NEON | I8A_CPU_DOTPROD, i8a_stream_neon},
#endif
#ifdef I8A_HAVE_NEON
    {"neon", I8A_CPU_NEON, i8a_stream_neon},
#endif
    {"scalar", 0, i8a_stream_scalar},
    {NULL, 0, NULL},
};
