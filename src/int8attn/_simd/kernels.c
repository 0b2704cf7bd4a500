/* The tier table: every tier compiled for this architecture, best first. Compiled at the
 * baseline; each ISA header switches its own target on for its functions only. */
#include "dispatch.h"
#include "scalar.h"

#if defined(__x86_64__) || defined(_M_X64)
#include "avx2.h"
#include "avx512_vnni.h"
#define I8A_HAVE_AVX2 1
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define I8A_HAVE_NEON 1
/* clang before 17 declares vdotq_s32 only when the whole file targets dotprod (Apple's clang
 * does: every Apple arm64 core has it); there the neon tier serves dotprod cores too. */
#if !defined(__clang__) || defined(__ARM_FEATURE_DOTPROD) || __clang_major__ >= 17
#include "neon_dotprod.h"
#define I8A_HAVE_NEON_DOTPROD 1
#else
#include "neon.h"
#endif
#endif

const i8a_kernels i8a_tiers[] = {
#ifdef I8A_HAVE_AVX2
    {"avx512_vnni", I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI, i8a_quantize_row_avx512_vnni,
     i8a_attend_avx512_vnni, i8a_attend4_avx512_vnni, i8a_merge_avx512_vnni, i8a_rotate_avx512_vnni,
     i8a_attend_float_avx512_vnni, i8a_half_row_avx512_vnni},
    {"avx2", I8A_CPU_AVX2, i8a_quantize_row_avx2, i8a_attend_avx2, i8a_attend4_avx2, i8a_merge_avx2,
     i8a_rotate_avx2, i8a_attend_float_avx2, i8a_half_row_avx2},
#endif
#ifdef I8A_HAVE_NEON_DOTPROD
    {"neon_dotprod", I8A_CPU_NEON | I8A_CPU_DOTPROD, i8a_quantize_row_neon,
     i8a_attend_neon_dotprod, i8a_attend4_neon_dotprod, i8a_merge_neon, i8a_rotate_neon, i8a_attend_float_neon,
     i8a_half_row_neon},
#endif
#ifdef I8A_HAVE_NEON
    {"neon", I8A_CPU_NEON, i8a_quantize_row_neon, i8a_attend_neon, i8a_attend4_neon, i8a_merge_neon,
     i8a_rotate_neon, i8a_attend_float_neon, i8a_half_row_neon},
#endif
    {"scalar", 0, i8a_quantize_row_scalar, i8a_attend_scalar, i8a_attend4_scalar, i8a_merge_scalar,
     i8a_rotate_scalar, i8a_attend_float_scalar, i8a_half_row_scalar},
    {NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};

const i8a_probe i8a_probes[] = {
#ifdef I8A_HAVE_AVX2
    {"avx512_vnni", I8A_CPU_AVX2 | I8A_CPU_AVX512_VNNI, i8a_stream_avx512_vnni},
    {"avx2", I8A_CPU_AVX2, i8a_stream_avx2},
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
