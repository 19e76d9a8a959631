/* cpu_x86.c - cpu.h's probe for x86 (empty on other architectures).
 *
 * cpuid says what the CPU implements; xgetbv (XCR0) says which register
 * states the OS saves on a context switch.  A feature counts only when both
 * agree: AVX needs the SSE and AVX (YMM) states, AVX-512 also the opmask
 * and both halves of the ZMM state. */
#if defined(__x86_64__) || defined(__i386__)

#include "cpu.h"

#include <cpuid.h>
#include <stddef.h>
#include <stdint.h>

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    /* xgetbv by its bytes: older assemblers lack the mnemonic */
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

void cpu__probe(int has[CPU_FEATURE_COUNT])
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    const int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return;
    const uint64_t xcr0 = read_xcr0();
    if ((xcr0 & 0x6) != 0x6)             /* XMM and YMM state */
        return;
    const int zmm_os = (xcr0 & 0xe0) == 0xe0;   /* opmask, ZMM_Hi256, Hi16_ZMM */

    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx2 = (b >> 5) & 1;
    has[CPU_FMA] = fma;
    has[CPU_F16C] = f16c;
    has[CPU_AVX2] = avx2;
    if (zmm_os) {
        has[CPU_AVX512F] = (b >> 16) & 1;
        has[CPU_AVX512BW] = has[CPU_AVX512F] && ((b >> 30) & 1);
        has[CPU_AVX512VL] = has[CPU_AVX512F] && ((b >> 31) & 1);
        has[CPU_AVX512VNNI] = has[CPU_AVX512F] && ((c >> 11) & 1);
    }
    __cpuid_count(7, 1, a, b, c, d);
    has[CPU_AVX_VNNI] = avx2 && ((a >> 4) & 1);
}

#endif
