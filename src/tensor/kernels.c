/* kernels.c - the active table of tensor functions, the one tensor_type_traits
 * returns, and the choice of kernels at start-up.
 *
 * Until tensor_kernels_init runs, the active table is the reference table
 * itself, so every caller works without initialisation.  tensor_kernels_init
 * copies the reference entries into a table of its own, lets the
 * instruction-set files (quant_avx2.c, quant_avx512.c, quant_neon.c) replace the function
 * pointers they have faster versions of, as the CPU probe allows, and only
 * then publishes the table.  RACIMO_KERNELS=ref skips the patching.
 */
#include "tensor/types.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "tensor/attend.h"
#include "tensor/kernels_isa.h"

typedef void (*attend_fn)(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                          const void *k, size_t k_stride, const void *v, size_t v_stride,
                          int n_pos, float *scores, float *out);
typedef void (*swiglu_fn)(float *a, const float *b, size_t n);
typedef double (*sum_exp_fn)(const float *x, size_t n, float shift);

static tensor_traits table[TT_COUNT];
static _Atomic(attend_fn) attend = tensor_attend_ref;
static _Atomic(swiglu_fn) swiglu = tensor_swiglu_ref;
static _Atomic(sum_exp_fn) sum_exp = tensor_sum_exp_ref;
static _Atomic(const tensor_traits *) active;  /* NULL: use the reference table */
static const char *kernels_name = "ref";
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (int t = 0; t < TT_COUNT; t++)
        table[t] = *tensor_type_traits_ref(t);
    /* RACIMO_KERNELS: "ref" keeps the reference code; "avx2" leaves out
     * the AVX-VNNI and AVX-512 kernels (to measure what an AVX2-only CPU
     * gets); "avx2+vnni" leaves out only the AVX-512 ones; "avx512" installs
     * every AVX-512 kernel, also those no faster than their AVX-VNNI twins
     * (to test them on CPUs with both). */
    const char *env = getenv("RACIMO_KERNELS");
    const int want_ref = env && !strcmp(env, "ref");
    const int no_ext = env && !strcmp(env, "avx2");
    const int no_512 = no_ext || (env && !strcmp(env, "avx2+vnni"));
    if (env && *env && !want_ref && !no_512 && strcmp(env, "avx512"))
        rc_log(LOG_WARN, "RACIMO_KERNELS=%s: known values are \"ref\", \"avx2\", "
               "\"avx2+vnni\" and \"avx512\"; choosing by CPU", env);
    if (!want_ref) {
#if defined(__x86_64__)
        if (cpu_has(CPU_AVX2) && cpu_has(CPU_FMA) && cpu_has(CPU_F16C)) {
            const int vnni = !no_ext && cpu_has(CPU_AVX_VNNI);
            tensor__kernels_avx2(table, vnni);
            atomic_store_explicit(&attend, tensor__attend_avx2, memory_order_relaxed);
            atomic_store_explicit(&swiglu, tensor__swiglu_avx2, memory_order_relaxed);
            atomic_store_explicit(&sum_exp, tensor__sum_exp_avx2, memory_order_relaxed);
            kernels_name = vnni ? "avx2+vnni" : "avx2";
            if (!no_512 && cpu_has(CPU_AVX512F) && cpu_has(CPU_AVX512BW) &&
                cpu_has(CPU_AVX512VL) && cpu_has(CPU_AVX512VNNI)) {
                tensor__kernels_avx512(table, !vnni || (env && !strcmp(env, "avx512")));
                kernels_name = vnni ? "avx2+vnni+avx512" : "avx2+avx512";
            } else if (env && !strcmp(env, "avx512")) {
                rc_log(LOG_WARN, "RACIMO_KERNELS=avx512: this CPU lacks AVX-512 F, BW, VL "
                       "or VNNI; using %s", kernels_name);
            }
        } else if (env && !strcmp(env, "avx512")) {
            rc_log(LOG_WARN, "RACIMO_KERNELS=avx512: this CPU lacks AVX2; using the reference");
        }
#elif defined(__aarch64__)
        if (cpu_has(CPU_NEON)) {
            tensor__kernels_neon(table, cpu_has(CPU_DOTPROD));
            kernels_name = cpu_has(CPU_DOTPROD) ? "neon+dotprod" : "neon";
        }
#endif
    }
    atomic_store_explicit(&active, table, memory_order_release);
}

void tensor_kernels_init(void)
{
    pthread_once(&init_once, init);
}

const tensor_traits *tensor_type_traits(int type)
{
    if (type < 0 || type >= TT_COUNT)
        return NULL;
    const tensor_traits *a = atomic_load_explicit(&active, memory_order_acquire);
    return a ? &a[type] : tensor_type_traits_ref(type);
}

size_t tensor_tile_x_bytes(const tensor_traits *t, int64_t n)
{
    const size_t row = tensor_row_bytes(t->vec_dot_type, n);
    if (!t->tile_x_block_bytes || !row)
        return row;
    const int64_t bs = tensor_type_traits_ref(t->vec_dot_type)->block_size;
    return (size_t)(n / bs) * t->tile_x_block_bytes;
}

void tensor_attend(const float *q, int n_q, int D, int Dv, float scale, int kv_type,
                   const void *k, size_t k_stride, const void *v, size_t v_stride,
                   int n_pos, float *scores, float *out)
{
    tensor_kernels_init();
    atomic_load_explicit(&attend, memory_order_relaxed)(q, n_q, D, Dv, scale, kv_type, k, k_stride,
                                                        v, v_stride, n_pos, scores, out);
}

void tensor_swiglu(float *a, const float *b, size_t n)
{
    tensor_kernels_init();
    atomic_load_explicit(&swiglu, memory_order_relaxed)(a, b, n);
}

double tensor_sum_exp(const float *x, size_t n, float shift)
{
    tensor_kernels_init();
    return atomic_load_explicit(&sum_exp, memory_order_relaxed)(x, n, shift);
}

const char *tensor_kernels_name(void)
{
    return atomic_load_explicit(&active, memory_order_acquire) ? kernels_name : "ref";
}
