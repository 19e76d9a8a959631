/* matmul.c - the batched matrix product on top of the per-type dot table.
 *
 * Layout: first the activation rows are converted (fast mode), split by row
 * across threads; then output rows are split in contiguous chunks across
 * threads, and each thread walks its weight rows once, reusing each weight
 * row for every activation row while it is in cache.
 */
#include "matmul.h"
#include "types.h"

#include <string.h>

size_t matmul_scratch_bytes(const tensor *W, int n_rows, int mode)
{
    if (mode == MATMUL_EXACT)
        return 0;
    const tensor_traits *tt = tensor_type_traits(W->type);
    if (tt->vec_dot_type == TT_F32)
        return 0;
    return tensor_row_bytes(tt->vec_dot_type, W->ne[0]) * (size_t)n_rows;
}

typedef struct {
    const tensor *W;
    const float *X;
    int ldx, n_rows;
    float *Y;
    int ldy, mode;
    const tensor_traits *tt;
    const tensor_traits *qt;     /* traits of the activation type */
    uint8_t *xq;                 /* converted activations, or NULL */
    size_t xq_row_bytes;
} mm_task;

static void convert_task(void *arg, int ith, int nth)
{
    mm_task *t = arg;
    long r0, r1;
    pool_split(t->n_rows, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++)
        t->qt->from_float(t->X + r * t->ldx, t->xq + r * t->xq_row_bytes, t->W->ne[0]);
}

static void product_task(void *arg, int ith, int nth)
{
    mm_task *t = arg;
    const tensor *W = t->W;
    long o0, o1;
    pool_split(W->ne[1], ith, nth, &o0, &o1);
    const int64_t n = W->ne[0];
    for (long o = o0; o < o1; o++) {
        const void *w = (const uint8_t *)W->data + (size_t)o * W->row_bytes;
        if (t->mode == MATMUL_EXACT) {
            for (int r = 0; r < t->n_rows; r++)
                t->Y[(size_t)r * t->ldy + o] = t->tt->dot_f32(w, t->X + (size_t)r * t->ldx, n);
        } else if (!t->xq) {
            for (int r = 0; r < t->n_rows; r++)
                t->Y[(size_t)r * t->ldy + o] = t->tt->vec_dot(w, t->X + (size_t)r * t->ldx, n);
        } else {
            for (int r = 0; r < t->n_rows; r++)
                t->Y[(size_t)r * t->ldy + o] =
                    t->tt->vec_dot(w, t->xq + (size_t)r * t->xq_row_bytes, n);
        }
    }
}

void matmul(thread_pool *pool, const tensor *W, const float *X, int ldx, int n_rows,
            float *Y, int ldy, int mode, void *scratch)
{
    mm_task t;
    memset(&t, 0, sizeof t);
    t.W = W;
    t.X = X;
    t.ldx = ldx;
    t.n_rows = n_rows;
    t.Y = Y;
    t.ldy = ldy;
    t.mode = mode;
    t.tt = tensor_type_traits(W->type);
    if (mode == MATMUL_FAST && t.tt->vec_dot_type != TT_F32) {
        t.qt = tensor_type_traits(t.tt->vec_dot_type);
        t.xq = scratch;
        t.xq_row_bytes = tensor_row_bytes(t.tt->vec_dot_type, W->ne[0]);
        pool_run(pool, convert_task, &t);
    }
    pool_run(pool, product_task, &t);
}
