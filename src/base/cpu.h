/* cpu.h - which SIMD instruction sets this CPU (and its operating system)
 * can run.
 *
 * The tensor kernels are chosen once at start-up from these answers
 * (tensor_kernels_init).  Each architecture's probe lives in its own file,
 * compiled everywhere but empty elsewhere: cpu_x86.c (cpuid, and xgetbv
 * for the OS saving the wide registers), cpu_arm64.c (getauxval on Linux,
 * sysctlbyname on macOS) and cpu_other.c (no features) for the rest;
 * cpu_common.c runs the probe once and answers from its result.
 */
#ifndef RC_CPU_H
#define RC_CPU_H

enum cpu_feature {
    CPU_AVX2 = 0,      /* x86-64 with OS support for the 256-bit registers */
    CPU_FMA,
    CPU_F16C,
    CPU_AVX_VNNI,      /* 256-bit VPDPBUSD (VEX encoded) */
    CPU_AVX512F,       /* and the OS saves the 512-bit state */
    CPU_AVX512BW,
    CPU_AVX512VL,
    CPU_AVX512VNNI,
    CPU_NEON,          /* arm64 Advanced SIMD (always there on arm64) */
    CPU_DOTPROD,       /* arm64 SDOT/UDOT */
    CPU_FEATURE_COUNT
};

/* 1 if the CPU has the feature and the OS lets programs use it, else 0
 * (also for unknown numbers).  The probe runs once, on first use; thread
 * safe. */
int cpu_has(int feature);

/* "avx2", "dotprod"... for messages; "?" for unknown numbers. */
const char *cpu_feature_name(int feature);

/* Internal: the architecture's probe (cpu_x86.c, cpu_arm64.c or
 * cpu_other.c), called once by cpu_common.c, sets has[f] = 1 for each feature f it finds. */
void cpu__probe(int has[CPU_FEATURE_COUNT]);

#endif
