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
#include "repack.h"
#include "types.h"

#include <stdatomic.h>
#include <string.h>

enum {
    PANEL_CACHE_BYTES = 256 * 1024,   /* weight bytes of a prompt panel */
    PANELS_PER_THREAD = 4,            /* at least, when the matrix allows */
    /* One row (generation): the panels are all the work, and the last one
     * taken decides when the product ends; with 4 per thread on 2 threads
     * a thread could wait up to one panel, 1/8 of the product (the output
     * of a 128k vocabulary in panels of ~35 MB, Q8_0).  Panels of one row
     * stay tens of KiB or more, streams long enough to prefetch. */
    PANELS_PER_THREAD_ONE_ROW = 16,
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
    /* Several matrices at once (matmul_batched): matrix j is W's slice j,
     * against X + j * x_step into Y + j * y_step; panels count per matrix. */
    int n_mats;
    size_t x_step, y_step;
    long panels_per_mat;
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
    const long all = (long)t->n_rows * t->n_mats;
    (void)ith; (void)nth;
    for (;;) {
        long r0 = atomic_fetch_add_explicit(&t->next_row, CONVERT_CHUNK, memory_order_relaxed);
        if (r0 >= all)
            break;
        long r1 = r0 + CONVERT_CHUNK < all ? r0 + CONVERT_CHUNK : all;
        for (long r = r0; r < r1; r++) {
            uint8_t *q = t->xq + r * t->xq_row_bytes;
            const float *x = t->X + (size_t)(r / t->n_rows) * t->x_step +
                             (size_t)(r % t->n_rows) * t->ldx;
            t->qt->from_float(x, q, t->W->ne[0]);
            if (t->xp)
                t->tt->tile_x_prep(q, t->xp + r * t->xp_row_bytes, t->W->ne[0]);
        }
    }
}

/* Weight rows [o0, o1) of matrix j against all its activation rows `x`
 * (stride xs). */
static void product_panel(const mm_task *t, int j, long o0, long o1, const void *x, size_t xs)
{
    const tensor *W = t->W;
    const int64_t n = W->ne[0];
    const uint8_t *w = (const uint8_t *)W->data + ((size_t)j * (size_t)W->ne[1] + (size_t)o0) * W->row_bytes;
    const float *X = t->X + (size_t)j * t->x_step;
    float *Y = t->Y + (size_t)j * t->y_step;
    if (t->mode == MATMUL_EXACT && tensor_r8_file_type(W->type) >= 0) {
        /* each row unpacked back to its file bytes: the same results as
         * the weights that were never repacked */
        _Alignas(64) uint8_t row[Q4_0_R8_MAX_ROW_BYTES];
        const dot_f32_fn dot = tensor_type_traits(tensor_r8_file_type(W->type))->dot_f32;
        for (long o = o0; o < o1; o++) {
            const uint8_t *group = w + (size_t)((o - o0) & ~7L) * W->row_bytes;
            tensor_r8_unpack_row(W->type, group, (int)(o & 7), row, n);
            for (int r = 0; r < t->n_rows; r++)
                Y[(size_t)r * t->ldy + o] = dot(row, X + (size_t)r * t->ldx, n);
        }
    } else if (t->mode == MATMUL_EXACT) {
        for (long o = o0; o < o1; o++, w += W->row_bytes)
            for (int r = 0; r < t->n_rows; r++)
                Y[(size_t)r * t->ldy + o] = t->tt->dot_f32(w, X + (size_t)r * t->ldx, n);
    } else if (t->tt->vec_dot_tile) {
        t->tt->vec_dot_tile(n, w, W->row_bytes, (int)(o1 - o0), x, xs, t->n_rows,
                            Y + o0, (size_t)t->ldy);
    } else {
        for (long o = o0; o < o1; o++, w += W->row_bytes)
            for (int r = 0; r < t->n_rows; r++)
                Y[(size_t)r * t->ldy + o] = t->tt->vec_dot(w, (const uint8_t *)x + (size_t)r * xs, n);
    }
}

/* x: the converted activations of matrix 0, matrix j's n_rows rows further
 * on for each j; or X itself (f32 activations), matrix j's at x_step. */
static void product_panels(mm_task *t, const void *x, size_t xs)
{
    const long n_out = t->W->ne[1];
    for (;;) {
        long p = atomic_fetch_add_explicit(&t->next_panel, 1, memory_order_relaxed);
        if (p >= t->n_panels)
            break;
        int j = (int)(p / t->panels_per_mat);
        long o0 = (p % t->panels_per_mat) * t->panel_rows;
        long o1 = o0 + t->panel_rows < n_out ? o0 + t->panel_rows : n_out;
        const void *xj = x == (const void *)t->X
                             ? (const void *)(t->X + (size_t)j * t->x_step)
                             : (const void *)((const uint8_t *)x + (size_t)j * (size_t)t->n_rows * xs);
        product_panel(t, j, o0, o1, xj, xs);
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
 * together, and an R8 panel must start on a group of 8), at most 64 and
 * within PANEL_CACHE_BYTES for prompts, and small enough for
 * PANELS_PER_THREAD (one row on several threads: PANELS_PER_THREAD_ONE_ROW)
 * panels per thread when the matrix has the rows. */
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
    long balance = n_out / ((long)nth * (n_rows > 1 || nth == 1 ? PANELS_PER_THREAD
                                                                 : PANELS_PER_THREAD_ONE_ROW));
    if (rows > balance)
        rows = balance;
    rows &= ~7L;
    return rows < 8 ? 8 : rows;
}

static void run(thread_pool *pool, mm_task *t, void *scratch)
{
    const tensor *W = t->W;
    tensor_kernels_init();
    t->tt = tensor_type_traits(W->type);
    atomic_init(&t->next_row, 0);
    atomic_init(&t->next_panel, 0);
    const int nth = pool_n_threads(pool);
    /* panels sized as for one matrix of all the matrices' rows */
    t->panel_rows = panel_rows((long)W->ne[1] * t->n_mats, W->row_bytes, t->n_rows, nth);
    if (t->panel_rows > W->ne[1])
        t->panel_rows = ((long)W->ne[1] + 7) & ~7L;
    t->panels_per_mat = ((long)W->ne[1] + t->panel_rows - 1) / t->panel_rows;
    t->n_panels = t->panels_per_mat * t->n_mats;
    if (t->mode == MATMUL_FAST && t->tt->vec_dot_type != TT_F32) {
        t->qt = tensor_type_traits(t->tt->vec_dot_type);
        t->xq_row_bytes = tensor_row_bytes(t->tt->vec_dot_type, W->ne[0]);
        if (uses_prepared(t->tt))
            t->xp_row_bytes = tensor_tile_x_bytes(t->tt, W->ne[0]);
        if (t->n_rows == 1 && t->n_mats == 1 && t->xq_row_bytes <= LOCAL_ROW_BYTES &&
            t->xp_row_bytes <= LOCAL_PREP_BYTES) {
            pool_run(pool, row_task, t);
            return;
        }
        t->xq = scratch;
        if (t->xp_row_bytes)
            t->xp = t->xq + t->xq_row_bytes * (size_t)t->n_rows * (size_t)t->n_mats;
        pool_run(pool, convert_task, t);
    }
    pool_run(pool, product_task, t);
}

void matmul_batched(thread_pool *pool, const tensor *W, int n_mats, const float *X, int ldx,
                    size_t x_step, int n_rows, float *Y, int ldy, size_t y_step, int mode,
                    void *scratch)
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
    t.n_mats = n_mats;
    t.x_step = x_step;
    t.y_step = y_step;
    run(pool, &t, scratch);
}

void matmul(thread_pool *pool, const tensor *W, const float *X, int ldx, int n_rows,
            float *Y, int ldy, int mode, void *scratch)
{
    matmul_batched(pool, W, 1, X, ldx, 0, n_rows, Y, ldy, 0, mode, scratch);
}
