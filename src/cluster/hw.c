/* hw.c - what a node publishes about its machine: cores, SIMD level,
 * memory, and two measured speeds from a short self-benchmark (memory
 * read bandwidth as generation streams the weights, and a Q8_0 matrix
 * product the way generation runs it), cached in <state_dir>/bench.json under the CPU model, thread
 * count and memory size so it runs once per machine.
 */
#include "cluster/cluster_internal.h"

#include "base/cpu.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "tensor/matmul.h"
#include "tensor/membw.h"
#include "tensor/pool.h"
#include "tensor/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10))
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            break;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(out, cap, "%s", v);
        out[strcspn(out, "\n")] = 0;
        break;
    }
    fclose(f);
}

void cl__hw_probe(cl_hw *h)
{
    memset(h, 0, sizeof *h);
    h->cores = os_n_physical_cores();
    h->threads = os_n_cpus();
    const char *simd = "scalar";
    if (cpu_has(CPU_AVX512F))
        simd = "avx512";
    else if (cpu_has(CPU_AVX2))
        simd = "avx2";
    else if (cpu_has(CPU_DOTPROD))
        simd = "neon+dotprod";
    else if (cpu_has(CPU_NEON))
        simd = "neon";
    snprintf(h->simd, sizeof h->simd, "%s", simd);
    cpu_model(h->cpu, sizeof h->cpu);
    h->mem_total = os_total_memory_bytes();
    h->mem_free = os_available_memory_bytes();
}

bool cl__hw_mem(cl_hw *h)
{
    /* available memory moves by a few MiB all the time; each move spread
     * to every node (STATE on the links, the digest through SWIM) was most
     * of an idle cluster's traffic.  A move under 1/64 of the total (at
     * least 32 MiB) keeps the figure published: placement keeps a reserve
     * far larger than that */
    uint64_t now = os_available_memory_bytes(), step = h->mem_total / 64;
    if (step < (32ull << 20))
        step = 32ull << 20;
    if ((now > h->mem_free ? now - h->mem_free : h->mem_free - now) < step)
        return false;
    h->mem_free = now;
    return true;
}

json_t *cl__hw_json(const cl_hw *h)
{
    json_t *o = json_pack("{s:i, s:i, s:s, s:s, s:I, s:I}", "cores", h->cores, "threads",
                          h->threads, "simd", h->simd, "cpu", h->cpu, "mem_total",
                          (json_int_t)h->mem_total, "mem_free", (json_int_t)h->mem_free);
    if (!o)
        return NULL;
    /* bytes/s and GFLOP/s; null until the benchmark has run */
    json_object_set_new(o, "mem_bandwidth", h->mem_bw > 0 ? json_integer((json_int_t)h->mem_bw)
                                                          : json_null());
    json_object_set_new(o, "matmul_gflops", h->gflops > 0 ? json_real(h->gflops) : json_null());
    /* what placement may use here: --max-memory caps it below what is free */
    uint64_t offer = h->mem_max && h->mem_max < h->mem_free ? h->mem_max : h->mem_free;
    json_object_set_new(o, "mem_offer", json_integer((json_int_t)offer));
    return o;
}

json_t *cluster_local_hardware(const char *state_dir, uint64_t max_memory, bool bench)
{
    char dir[512];
    cl_hw h;
    cl__hw_probe(&h);
    h.mem_max = max_memory;
    if (cluster_state_dir(state_dir, dir, sizeof dir) == 0 && !cl__bench_cached(dir, &h) && bench)
        cl__bench_run(dir, &h);
    return cl__hw_json(&h);
}

static void bench_path(const char *state_dir, char *out, size_t cap)
{
    snprintf(out, cap, "%s/bench.json", state_dir);
}

int cl__bench_cached(const char *state_dir, cl_hw *h)
{
    char path[600];
    bench_path(state_dir, path, sizeof path);
    json_t *j = json_load_file(path, 0, NULL);
    int found = 0;
    const char *cpu = json_string_value(json_object_get(j, "cpu"));
    json_t *bw = json_object_get(j, "mem_bandwidth"), *gf = json_object_get(j, "matmul_gflops");
    /* files written before the read measure held a triad's figure */
    const char *how = json_string_value(json_object_get(j, "mem_bandwidth_measure"));
    if (cpu && !strcmp(cpu, h->cpu) && how && !strcmp(how, "read") &&
        json_integer_value(json_object_get(j, "threads")) == h->threads &&
        (uint64_t)json_integer_value(json_object_get(j, "mem_total")) == h->mem_total &&
        json_is_number(bw) && json_is_number(gf)) {
        h->mem_bw = json_number_value(bw);
        h->gflops = json_number_value(gf);
        found = 1;
    }
    json_decref(j);
    return found;
}

/* GFLOP/s of a 1024 x 1024 Q8_0 matrix times 8 rows, best of a few runs. */
static double bench_matmul(thread_pool *pool)
{
    tensor_kernels_init();
    const int n_in = 1024, n_out = 1024, rows = 8;
    size_t row_bytes = tensor_row_bytes(TT_Q8_0, n_in);
    const tensor_traits *tr = tensor_type_traits(TT_Q8_0);
    if (!row_bytes || !tr || !tr->from_float)
        return 0;
    uint8_t *w = rc_malloc_aligned(64, row_bytes * (size_t)n_out);
    float *x = rc_malloc_aligned(64, sizeof(float) * (size_t)n_in * rows);
    float *y = rc_malloc_aligned(64, sizeof(float) * (size_t)n_out * rows);
    float *tmp = rc_malloc(sizeof(float) * (size_t)n_in);
    tensor W = { .type = TT_Q8_0, .n_dims = 2, .ne = { n_in, n_out, 1, 1 }, .row_bytes = row_bytes,
                 .name = "bench" };
    size_t sb = matmul_scratch_bytes(&W, rows, MATMUL_FAST);
    void *scratch = rc_malloc_aligned(64, sb ? sb : 64);
    double best = 0;
    if (w && x && y && tmp && scratch) {
        uint32_t s = 12345;
        for (int o = 0; o < n_out; o++) {
            for (int i = 0; i < n_in; i++) {
                s = s * 1664525u + 1013904223u;
                tmp[i] = (float)((int)(s >> 9) % 2001 - 1000) * 1e-3f;
            }
            tr->from_float(tmp, w + (size_t)o * row_bytes, n_in);
        }
        for (int i = 0; i < n_in * rows; i++)
            x[i] = (float)(i % 17) * 0.01f;
        W.data = w;
        for (int rep = 0; rep < 5; rep++) {
            uint64_t t0 = os_now_ns();
            for (int k = 0; k < 8; k++)
                matmul(pool, &W, x, n_in, rows, y, n_out, MATMUL_FAST, scratch);
            double dt = (double)(os_now_ns() - t0) * 1e-9;
            double g = dt > 0 ? 2.0 * n_in * n_out * rows * 8 / dt * 1e-9 : 0;
            if (g > best)
                best = g;
        }
    }
    rc_free_aligned(w);
    rc_free_aligned(x);
    rc_free_aligned(y);
    rc_free_aligned(scratch);
    rc_free(tmp);
    return best;
}

void cl__bench_run(const char *state_dir, cl_hw *h)
{
    uint64_t t0 = os_now_ns();
    thread_pool *pool = pool_new(h->cores > 0 ? h->cores : 1);
    /* 128 MiB: well past the last-level cache of machines we meet, short
     * enough to stay well under a second; read only, as generation reads
     * the weights (tensor/membw.h) */
    double bw = pool ? membw_read(pool, (size_t)128 << 20, 4) : 0;
    double gf = pool ? bench_matmul(pool) : 0;
    pool_free(pool);
    h->mem_bw = bw;
    h->gflops = gf;
    rc_log(LOG_INFO, "cluster: self-benchmark: memory %.1f GB/s, Q8_0 matmul %.1f GFLOP/s (%.2f s)",
           bw * 1e-9, gf, (double)(os_now_ns() - t0) * 1e-9);
    json_t *j = json_pack("{s:s, s:i, s:i, s:I, s:f, s:s, s:f}", "cpu", h->cpu, "cores", h->cores,
                          "threads", h->threads, "mem_total", (json_int_t)h->mem_total,
                          "mem_bandwidth", bw, "mem_bandwidth_measure", "read",
                          "matmul_gflops", gf);
    char path[600], tmp[640];
    bench_path(state_dir, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (j && bw > 0 && gf > 0 && json_dump_file(j, tmp, JSON_INDENT(1)) == 0)
        rename(tmp, path);
    json_decref(j);
}
