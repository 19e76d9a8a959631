/* kernel_time.c - times one matrix product, the weights as in the file
 * against the same weights repacked by 8 rows, in thread CPU time: on a
 * machine shared with other work a thread's CPU time counts only what it
 * ran, not the time it waited for a core (memory contention still counts).
 *
 *   racimo-kernel-time [-r REPS] [-t THREADS] TYPE NE0 ROWS K[,K...]
 *
 * TYPE is any weight type; for those without a repacked layout (all but
 * Q4_0, Q4_K, Q6_K and Q8_0: IQ4_NL, IQ4_XS, MXFP4...) the R8 columns
 * print "-" and only the file layout runs.  The matrix has ROWS rows of NE0
 * elements (quantised from normal values by the reference quantiser, 64
 * distinct rows repeated); each K is a number of activation rows.  Each
 * repetition runs matmul (the path a forward pass takes: activations
 * converted, panels, the tile kernels) once per layout, alternating, and
 * the minimum of REPS (default 7) is printed with the bytes read per
 * second and, for K > 1, the speed-up per activation row over K = 1.
 * With -t 2 or more the time is wall time (a thread's CPU time would miss
 * the others', and the process's would count their spinning): measure
 * those on a quiet machine.
 *
 * A standalone tool linking libracimo, built by `make build/rel/racimo-kernel-time`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "tensor/matmul.h"
#include "tensor/pool.h"
#include "tensor/q4k_r8.h"
#include "tensor/q6k_r8.h"
#include "tensor/q8_0_r8.h"
#include "tensor/repack.h"
#include "tensor/types.h"

static double cpu_seconds(int threads)
{
    struct timespec ts;
    clock_gettime(threads > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int packed_type(int type)
{
    switch (type) {
    case TT_Q4_0: return tensor_q4_0_r8_available() ? TT_Q4_0_R8 : -1;
    case TT_Q4_K: return tensor_q4_k_r8_available() ? TT_Q4_K_R8 : -1;
    case TT_Q6_K: return tensor_q6_k_r8_available() ? TT_Q6_K_R8 : -1;
    case TT_Q8_0: return tensor_q8_0_r8_available() ? TT_Q8_0_R8 : -1;
    default: return -1;
    }
}

static void pack(int type, const void *src, void *dst, int64_t ne0, int64_t rows)
{
    if (type == TT_Q4_0) tensor_q4_0_r8_pack(src, dst, ne0, rows);
    if (type == TT_Q4_K) tensor_q4_k_r8_pack(src, dst, ne0, rows);
    if (type == TT_Q6_K) tensor_q6_k_r8_pack(src, dst, ne0, rows);
    if (type == TT_Q8_0) tensor_q8_0_r8_pack(src, dst, ne0, rows);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    int reps = 7, threads = 1, a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "-r"))
            reps = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-t"))
            threads = atoi(argv[a + 1]);
    }
    if (argc - a != 4 || reps < 1 || threads < 1) {
        fprintf(stderr, "usage: %s [-r REPS] [-t THREADS] TYPE NE0 ROWS K[,K...]\n", argv[0]);
        return 2;
    }
    tensor_kernels_init();   /* the probe first: ptype and the name printed depend on it */
    const int type = tensor_type_from_name(argv[a]);
    const int64_t ne0 = atoll(argv[a + 1]), rows = atoll(argv[a + 2]);
    const int ptype = type >= 0 ? packed_type(type) : -1;
    const size_t rb = type >= 0 ? tensor_row_bytes(type, ne0) : 0;
    if (type < 0 || !rb || rows < 8 || rows % 8) {
        fprintf(stderr, "%s: not a type, or NE0/ROWS do not fit it (ROWS a multiple of 8)\n",
                argv[a]);
        return 2;
    }
    rng_state r;
    rng_seed(&r, 42);
    uint8_t *w = xmalloc(rb * (size_t)rows), *g = xmalloc(rb * (size_t)rows);
    float *f = xmalloc(sizeof(float) * (size_t)ne0);
    for (int64_t i = 0; i < rows; i++) {
        if (i < 64) {
            for (int64_t k = 0; k < ne0; k++)
                f[k] = (float)rng_normal(&r);
            tensor_type_traits_ref(type)->from_float(f, w + (size_t)i * rb, ne0);
        } else {
            memcpy(w + (size_t)i * rb, w + (size_t)(i % 64) * rb, rb);
        }
    }
    if (ptype >= 0)
        pack(type, w, g, ne0, rows);
    tensor W = { .data = w, .type = type, .n_dims = 2, .ne = { ne0, rows, 1, 1 }, .row_bytes = rb,
                 .name = "w" };
    tensor G = W;
    G.data = g;
    G.type = ptype >= 0 ? ptype : type;
    thread_pool *pool = pool_new(threads);
    printf("%s %lld x %lld (%.1f MiB), kernels %s, %d thread(s), min of %d, %s time\n",
           argv[a], (long long)rows, (long long)ne0, (double)(rb * (size_t)rows) / 1048576.0,
           tensor_kernels_name(), threads, reps, threads > 1 ? "wall" : "thread CPU");
    printf("%4s %12s %12s %10s %10s %8s\n", "K", "file ms", "R8 ms", "file GB/s", "R8 GB/s", "R8 gain");
    double base[2] = { 0, 0 };
    for (char *ks = argv[a + 3]; *ks;) {
        const int K = (int)strtol(ks, &ks, 10);
        if (*ks == ',')
            ks++;
        if (K < 1)
            break;
        float *x = xmalloc(sizeof(float) * (size_t)(ne0 * K)), *y = xmalloc(sizeof(float) * (size_t)(rows * K));
        for (int64_t i = 0; i < ne0 * K; i++)
            x[i] = (float)rng_normal(&r);
        const size_t sw = matmul_scratch_bytes(&W, K, MATMUL_FAST), sg = matmul_scratch_bytes(&G, K, MATMUL_FAST);
        void *scratch = xmalloc(sw > sg ? sw : sg);
        double best[2] = { 1e30, 1e30 };
        for (int rep = 0; rep < reps; rep++)
            for (int v = 0; v < (ptype >= 0 ? 2 : 1); v++) {
                const double t0 = cpu_seconds(threads);
                matmul(pool, v ? &G : &W, x, (int)ne0, K, y, (int)rows, MATMUL_FAST, scratch);
                const double t = cpu_seconds(threads) - t0;
                if (t < best[v])
                    best[v] = t;
            }
        if (K == 1) {
            base[0] = best[0];
            base[1] = best[1];
        }
        const double bytes = (double)rb * (double)rows;
        if (ptype < 0) {
            printf("%4d %12.3f %12s %10.2f %10s %8s", K, 1e3 * best[0], "-", bytes / best[0] / 1e9,
                   "-", "-");
            if (K > 1)
                printf("   per-row gain over K=1: file %.2fx", K * base[0] / best[0]);
        } else {
            printf("%4d %12.3f %12.3f %10.2f %10.2f %7.2fx", K, 1e3 * best[0], 1e3 * best[1],
                   bytes / best[0] / 1e9, bytes / best[1] / 1e9, best[0] / best[1]);
        }
        if (ptype >= 0 && K > 1 && base[1] > 0)
            printf("   per-row gain over K=1: file %.2fx, R8 %.2fx", K * base[0] / best[0],
                   K * base[1] / best[1]);
        printf("\n");
        free(x);
        free(y);
        free(scratch);
    }
    pool_free(pool);
    free(w);
    free(g);
    free(f);
    return 0;
}
