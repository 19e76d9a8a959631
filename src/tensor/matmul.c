/* matmul.c - the batched matrix product on top of the per-type dot table.
 *
 * Fast mode, in two steps:
 *   1. the activation rows are converted to the weight type's vec_dot_type
 *      and, when its tile kernel reads a layout of its own, prepared in that
 *      layout (rows taken from a shared counter by whichever thread is free);
 *   2. the output rows are cut into panels of consecutive weight rows, and
 *      threads take panels from a shared counter (work stealing: a thread
 *      slowed down by other work on the machine simply takes fewer).  A
 *      panel is computed by the type's tile kernel (vec_dot_tile) against
 *      every activation row, so the panel's weights are read from memory
 *      once and reused from cache; types without a tile kernel loop over
 *      vec_dot the same way.
 * One activation row (generation) skips the shared conversion: every
 * thread converts the row into its own stack buffer, which costs less than
 * the extra round of the thread pool it saves.
 *
 * Panel sizes: a panel's weights should stay in the core's L2 cache while
 * the activation rows stream past, and there should be several panels per
 * thread so the counter can even out the load.  Neither choice changes any
 * result: each output is one tile-kernel or vec_dot call on its two rows,
 * whatever the panel, the thread or the number of threads.
 *
 * Scratch layout (fast mode): n_rows rows in vec_dot_type, then, for the
 * tile kernels with a layout of their own, n_rows prepared rows.
 */
#include "matmul.h"
#include "types.h"

#include <stdatomic.h>
#include <string.h>

enum {
    PANEL_CACHE_BYTES = 256 * 1024,   /* weight bytes of a prompt panel */
    PANELS_PER_THREAD = 4,            /* at least, when the matrix allows */
    LOCAL_ROW_BYTES = 32 * 1024,      /* stack buffers of the one-row path */
    LOCAL_PREP_BYTES = 40 * 1024,
    CONVERT_CHUNK = 4                 /* activation rows per counter step */
};

/* Whether the products use the tile kernel on prepared rows. */
static int uses_prepared(const tensor_traits *tt)
{
    return tt->vec_dot_tile && tt->tile_x_prep && tt->tile_x_block_bytes;
}

size_t matmul_scratch_bytes(const tensor *W, int n_rows, int mode)
{
    tensor_kernels_init();       /* the layout depends on the kernels */
    if (mode == MATMUL_EXACT)
        return 0;
    const tensor_traits *tt = tensor_type_traits(W->type);
    if (tt->vec_dot_type == TT_F32)
        return 0;
    size_t row = tensor_row_bytes(tt->vec_dot_type, W->ne[0]);
    if (uses_prepared(tt))
        row += tensor_tile_x_bytes(tt, W->ne[0]);
    return row * (size_t)n_rows;
}

typedef struct {
    const tensor *W;
    const float *X;
    int ldx, n_rows;
    float *Y;
    int ldy, mode;
    const tensor_traits *tt;
    const tensor_traits *qt;     /* traits of the activation type, or NULL */
    uint8_t *xq;                 /* converted activations, or NULL */
    size_t xq_row_bytes;
    uint8_t *xp;                 /* prepared for the tile kernel, or NULL */
    size_t xp_row_bytes;
    long panel_rows, n_panels;
    atomic_long next_row;        /* conversion counter */
    atomic_long next_panel;      /* product counter */
} mm_task;

static void convert_task(void *arg, int ith, int nth)
{
    mm_task *t = arg;
    (void)ith; (void)nth;
    for (;;) {
        long r0 = atomic_fetch_add_explicit(&t->next_row, CONVERT_CHUNK, memory_order_relaxed);
        if (r0 >= t->n_rows)
            break;
        long r1 = r0 + CONVERT_CHUNK < t->n_rows ? r0 + CONVERT_CHUNK : t->n_rows;
        for (long r = r0; r < r1; r++) {
            uint8_t *q = t->xq + r * t->xq_row_bytes;
            t->qt->from_float(t->X + r * t->ldx, q, t->W->ne[0]);
            if (t->xp)
                t->tt->tile_x_prep(q, t->xp + r * t->xp_row_bytes, t->W->ne[0]);
        }
    }
}

/* Weight rows [o0, o1) against all activation rows `x` (stride xs). */
static void product_panel(const mm_task *t, long o0, long o1, const void *x, size_t xs)
{
    const tensor *W = t->W;
    const int64_t n = W->ne[0];
    const uint8_t *w = (const uint8_t *)W->data + (size_t)o0 * W->row_bytes;
    if (t->mode == MATMUL_EXACT) {
        for (long o = o0; o < o1; o++, w += W->row_bytes)
            for (int r = 0; r < t->n_rows; r++)
                t->Y[(size_t)r * t->ldy + o] = t->tt->dot_f32(w, t->X + (size_t)r * t->ldx, n);
    } else if (t->tt->vec_dot_tile) {
        t->tt->vec_dot_tile(n, w, W->row_bytes, (int)(o1 - o0), x, xs, t->n_rows,
                            t->Y + o0, (size_t)t->ldy);
    } else {
        for (long o = o0; o < o1; o++, w += W->row_bytes)
            for (int r = 0; r < t->n_rows; r++)
                t->Y[(size_t)r * t->ldy + o] =
                    t->tt->vec_dot(w, (const uint8_t *)x + (size_t)r * xs, n);
    }
}

static void product_panels(mm_task *t, const void *x, size_t xs)
{
    const long n_out = t->W->ne[1];
    for (;;) {
        long p = atomic_fetch_add_explicit(&t->next_panel, 1, memory_order_relaxed);
        if (p >= t->n_panels)
            break;
        long o0 = p * t->panel_rows;
        long o1 = o0 + t->panel_rows < n_out ? o0 + t->panel_rows : n_out;
        product_panel(t, o0, o1, x, xs);
    }
}

static void product_task(void *arg, int ith, int nth)
{
    mm_task *t = arg;
    (void)ith; (void)nth;
    if (t->mode == MATMUL_EXACT || !t->xq)
        product_panels(t, t->X, (size_t)t->ldx * sizeof(float));
    else if (t->xp)
        product_panels(t, t->xp, t->xp_row_bytes);
    else
        product_panels(t, t->xq, t->xq_row_bytes);
}

/* One activation row: each thread converts (and prepares) it for itself,
 * then computes. */
static void row_task(void *arg, int ith, int nth)
{
    mm_task *t = arg;
    _Alignas(64) uint8_t local[LOCAL_ROW_BYTES];
    _Alignas(64) uint8_t prepared[LOCAL_PREP_BYTES];
    (void)ith; (void)nth;
    t->qt->from_float(t->X, local, t->W->ne[0]);
    if (t->xp_row_bytes) {
        t->tt->tile_x_prep(local, prepared, t->W->ne[0]);
        product_panels(t, prepared, t->xp_row_bytes);
    } else {
        product_panels(t, local, t->xq_row_bytes);
    }
}

/* Rows per panel: a multiple of 8 (the tile kernels pack 8 weight rows
 * together), at most 64 and within PANEL_CACHE_BYTES for prompts, and small
 * enough for PANELS_PER_THREAD panels per thread when the matrix has the
 * rows. */
static long panel_rows(long n_out, size_t row_bytes, int n_rows, int nth)
{
    long rows = 64;
    if (n_rows > 1) {
        long fit = (long)(PANEL_CACHE_BYTES / (row_bytes ? row_bytes : 1));
        if (rows > fit)
            rows = fit;
    } else {
        rows = n_out;
    }
    long balance = n_out / ((long)nth * PANELS_PER_THREAD);
    if (rows > balance)
        rows = balance;
    rows &= ~7L;
    return rows < 8 ? 8 : rows;
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
    tensor_kernels_init();
    t.tt = tensor_type_traits(W->type);
    atomic_init(&t.next_row, 0);
    atomic_init(&t.next_panel, 0);
    const int nth = pool_n_threads(pool);
    t.panel_rows = panel_rows((long)W->ne[1], W->row_bytes, n_rows, nth);
    t.n_panels = ((long)W->ne[1] + t.panel_rows - 1) / t.panel_rows;
    if (mode == MATMUL_FAST && t.tt->vec_dot_type != TT_F32) {
        t.qt = tensor_type_traits(t.tt->vec_dot_type);
        t.xq_row_bytes = tensor_row_bytes(t.tt->vec_dot_type, W->ne[0]);
        if (uses_prepared(t.tt))
            t.xp_row_bytes = tensor_tile_x_bytes(t.tt, W->ne[0]);
        if (n_rows == 1 && t.xq_row_bytes <= LOCAL_ROW_BYTES &&
            t.xp_row_bytes <= LOCAL_PREP_BYTES) {
            pool_run(pool, row_task, &t);
            return;
        }
        t.xq = scratch;
        if (t.xp_row_bytes)
            t.xp = t.xq + t.xq_row_bytes * (size_t)n_rows;
        pool_run(pool, convert_task, &t);
    }
    pool_run(pool, product_task, &t);
}
