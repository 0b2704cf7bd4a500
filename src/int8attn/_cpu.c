/* The CPU shim: which tiers this CPU and OS can run. Called once at import.
 *   x86-64: cpuid for AVX2, FMA and F16C (the recent window's halves), plus xgetbv: the OS
 *   must save YMM state (XCR0 bits 1, 2); for AVX-512 also F, BW, VL and VNNI, and opmask and
 *   ZMM state (XCR0 bits 5, 6, 7); for AMX also AMX-TILE and AMX-INT8, the tiles' state (XCR0
 *   bits 17, 18) and, on Linux, the process's permission to use it, asked for here
 *   (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): refused, no AMX tier).
 *   Linux aarch64: getauxval(AT_HWCAP), AT_HWCAP2 (i8mm); the HWCAP bits are defined here.
 *   macOS arm64: sysctlbyname("hw.optional.arm.FEAT_DotProd"), "hw.optional.arm.FEAT_I8MM".
 * Anything else reports no features: the scalar tier. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE                     /* syscall() */
#endif
#include "_simd/dispatch.h"

static int amx_status;                  /* i8a_amx_status(): set once, at import */

int i8a_amx_status(void)
{
    return amx_status;
}

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

/* The kernel's permission to use the tiles' data (Linux 5.16 on): asked once, for the process. */
static int i8a_amx_permitted(void)
{
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#elif defined(__x86_64__) || defined(_M_X64)
static int i8a_amx_permitted(void)
{
    return 0;                           /* no way to ask: no tier that needs it */
}
#endif

#if defined(__x86_64__) || defined(_M_X64)
/* Tier bits from cpuid leaf 7 (ebx, ecx, edx) once AVX, FMA, F16C and YMM state are there. */
static unsigned i8a_x86_features(unsigned ebx, unsigned ecx, unsigned edx,
                                 unsigned long long xcr0)
{
    unsigned f = ((ebx >> 5) & 1) ? I8A_CPU_AVX2 : 0;
    const int avx512 = ((ebx >> 16) & 1) && ((ebx >> 30) & 1) && ((ebx >> 31) & 1); /* F BW VL */
    const int vnni = (ecx >> 11) & 1;
    if (f && avx512 && vnni && (xcr0 & 0xe6) == 0xe6)
        f |= I8A_CPU_AVX512_VNNI;
    const int amx = ((edx >> 24) & 1) && ((edx >> 25) & 1);          /* AMX-TILE, AMX-INT8 */
    if ((f & I8A_CPU_AVX512_VNNI) && amx && (xcr0 & 0x60000) == 0x60000) {
        amx_status = i8a_amx_permitted() ? 2 : 1;
        if (amx_status == 2)
            f |= I8A_CPU_AMX;
    }
    return f;
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

static unsigned long long i8a_xgetbv0(void)
{
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

unsigned i8a_cpu_features(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    const int f16c = (c >> 29) & 1;
    if (!(osxsave && avx && fma && f16c))
        return 0;
    const unsigned long long xcr0 = i8a_xgetbv0();
    if ((xcr0 & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return i8a_x86_features(b, c, d, xcr0);
}

#elif defined(_M_X64)
#include <immintrin.h>
#include <intrin.h>

unsigned i8a_cpu_features(void)
{
    int r[4];
    __cpuid(r, 1);
    const int osxsave = (r[2] >> 27) & 1, avx = (r[2] >> 28) & 1, fma = (r[2] >> 12) & 1;
    const int f16c = (r[2] >> 29) & 1;
    if (!(osxsave && avx && fma && f16c))
        return 0;
    const unsigned long long xcr0 = _xgetbv(0);
    if ((xcr0 & 0x6) != 0x6)
        return 0;
    __cpuidex(r, 7, 0);
    return i8a_x86_features((unsigned)r[1], (unsigned)r[2], (unsigned)r[3], xcr0);
}

#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

#define I8A_HWCAP_ASIMD (1UL << 1)
#define I8A_HWCAP_ASIMDDP (1UL << 20)
#define I8A_HWCAP2_I8MM (1UL << 13)

unsigned i8a_cpu_features(void)
{
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    unsigned f = (hw & I8A_HWCAP_ASIMD) ? I8A_CPU_NEON : 0;
    if (f && (hw & I8A_HWCAP_ASIMDDP))
        f |= I8A_CPU_DOTPROD;
    if ((f & I8A_CPU_DOTPROD) && (hw2 & I8A_HWCAP2_I8MM))
        f |= I8A_CPU_I8MM;
    return f;
}

#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>

unsigned i8a_cpu_features(void)
{
    int v = 0;
    size_t len = sizeof v;
    unsigned f = I8A_CPU_NEON;
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v)
        f |= I8A_CPU_DOTPROD;
    v = 0;
    len = sizeof v;
    if ((f & I8A_CPU_DOTPROD) && sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &len, NULL, 0) == 0
        && v)
        f |= I8A_CPU_I8MM;
    return f;
}

#elif defined(__aarch64__) || defined(_M_ARM64)

unsigned i8a_cpu_features(void)
{
    return I8A_CPU_NEON; /* Advanced SIMD is part of every aarch64 core */
}

#else

unsigned i8a_cpu_features(void)
{
    return 0;
}

#endif
