/* cpu_common.c - the portable half of cpu.h: runs the architecture's probe once
 * and answers from its result. */
#include "cpu.h"

#include <pthread.h>

static int features[CPU_FEATURE_COUNT];
static pthread_once_t probed = PTHREAD_ONCE_INIT;

static void probe_once(void) { cpu__probe(features); }

int cpu_has(int feature)
{
    if (feature < 0 || feature >= CPU_FEATURE_COUNT)
        return 0;
    pthread_once(&probed, probe_once);
    return features[feature];
}

const char *cpu_feature_name(int feature)
{
    static const char *const names[CPU_FEATURE_COUNT] = {
        [CPU_AVX2] = "avx2", [CPU_FMA] = "fma", [CPU_F16C] = "f16c",
        [CPU_AVX_VNNI] = "avxvnni", [CPU_AVX512F] = "avx512f",
        [CPU_AVX512BW] = "avx512bw", [CPU_AVX512VL] = "avx512vl",
        [CPU_AVX512VNNI] = "avx512vnni", [CPU_NEON] = "neon", [CPU_DOTPROD] = "dotprod",
    };
    if (feature < 0 || feature >= CPU_FEATURE_COUNT)
        return "?";
    return names[feature];
}
