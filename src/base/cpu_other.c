/* cpu_other.c - cpu.h's probe for architectures without a probe of their
 * own: no SIMD features, so the reference kernels run. */
#if !defined(__x86_64__) && !defined(__i386__) && !defined(__aarch64__)

#include "cpu.h"

void cpu__probe(int has[CPU_FEATURE_COUNT]) { (void)has; }

#endif
