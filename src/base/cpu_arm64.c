/* cpu_arm64.c - cpu.h's probe for arm64 (empty on other architectures).
 *
 * Advanced SIMD is part of the arm64 base architecture.  The dot-product
 * instructions (ARMv8.2 FEAT_DotProd) are optional: Linux reports them in
 * the auxiliary vector (HWCAP_ASIMDDP), macOS through sysctl. */
#if defined(__aarch64__)

#include "cpu.h"

#if defined(__APPLE__)
#include <stddef.h>
#include <sys/sysctl.h>
#elif defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#endif

static int has_dotprod(void)
{
#if defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0)
        return v != 0;
    return 0;
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return 0;
#endif
}

void cpu__probe(int has[CPU_FEATURE_COUNT])
{
    has[CPU_NEON] = 1;
    has[CPU_DOTPROD] = has_dotprod();
}

#endif
