/* repack.c - the held Q4_0, Q4_K, Q6_K and Q8_0 matrices into the
 * interleaved TT_Q4_0_R8 / TT_Q4_K_R8 / TT_Q6_K_R8 / TT_Q8_0_R8 layouts
 * (tensor/repack.h, tensor/q4k_r8.h, tensor/q6k_r8.h, tensor/q8_0_r8.h),
 * once at load, so the matrix products
 * of generation and batched decode read each group of 8 rows as one
 * stream.
 *
 * Runs after the shard cuts, on the views the model ends up with, so the
 * rows of a shard need not start on a multiple of 8 in the file: only the
 * held rows per 2-D slice must be a multiple of 8.  A mapped tensor is
 * copied into memory the model owns and its mapped pages leave the
 * resident set (the file and its mapping are untouched: pages read again
 * come back from the file, which the digests and weight serving read); a
 * tensor the model already owns (a shard's column cut) is rearranged in
 * place, a group at a time.  The token embedding is read by rows (one per
 * token) and stays as in the file; when it doubles as the output, the
 * output gets a repacked copy of its own and the embedding keeps reading
 * the file's rows (a few pages per token come back into the resident set),
 * so the largest matrix of many models is streamed repacked too.
 */
#include "model/repack.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"
#include "model/shard.h"
#include "tensor/q4k_r8.h"
#include "tensor/q6k_r8.h"
#include "tensor/q8_0_r8.h"
#include "tensor/repack.h"
#include "tensor/types.h"

/* The layout a tensor of this type is repacked into, or -1. */
static int packed_type(int type)
{
    if (type == TT_Q4_0 && tensor_q4_0_r8_available())
        return TT_Q4_0_R8;
    if (type == TT_Q4_K && tensor_q4_k_r8_available())
        return TT_Q4_K_R8;
    if (type == TT_Q8_0 && tensor_q8_0_r8_available())
        return TT_Q8_0_R8;
    if (type == TT_Q6_K && tensor_q6_k_r8_available())
        return TT_Q6_K_R8;
    return -1;
}

static void pack(int type, const void *src, void *dst, int64_t ne0, int64_t n_rows)
{
    if (type == TT_Q4_K)
        tensor_q4_k_r8_pack(src, dst, ne0, n_rows);
    else if (type == TT_Q8_0)
        tensor_q8_0_r8_pack(src, dst, ne0, n_rows);
    else if (type == TT_Q6_K)
        tensor_q6_k_r8_pack(src, dst, ne0, n_rows);
    else
        tensor_q4_0_r8_pack(src, dst, ne0, n_rows);
}

static bool owned(const model *m, const void *p)
{
    for (int i = 0; i < m->n_owned; i++)
        if (m->owned[i] == p)
            return true;
    return false;
}

/* Whether the tensor can and should be repacked.  The embedding table
 * itself never is; an output that shares its bytes is when they are the
 * file's (it then gets a copy, below), not when the model owns them (a
 * copy there would double them). */
static bool eligible(const model *m, const tensor *t)
{
    return t->data && packed_type(t->type) >= 0 && t != &m->tok_embd &&
           (t->data != m->tok_embd.data || !owned(m, t->data)) &&
           t->n_dims >= 2 && t->ne[1] % Q4_0_R8_ROWS == 0 &&
           t->row_bytes <= Q4_0_R8_MAX_ROW_BYTES;
}

static int repack(model *m, tensor *t, uint8_t *group)
{
    const int64_t rows = t->ne[1] * (t->ne[2] > 1 ? t->ne[2] : 1);
    const size_t gbytes = Q4_0_R8_ROWS * t->row_bytes;
    if (owned(m, t->data)) {
        uint8_t *p = (uint8_t *)(uintptr_t)t->data;   /* the model's own copy */
        for (int64_t r = 0; r < rows; r += Q4_0_R8_ROWS, p += gbytes) {
            pack(t->type, p, group, t->ne[0], Q4_0_R8_ROWS);
            memcpy(p, group, gbytes);
        }
    } else {
        uint8_t *copy = model_own(m, (size_t)rows * t->row_bytes, t->name);
        if (!copy)
            return RC_ENOMEM;
        /* a slice at a time, each slice's file pages let go once packed:
         * memory peaks at the copies plus one slice, not plus the largest
         * matrix (an output of 128k rows is a few hundred MiB) */
        const int64_t slice = Q4_0_R8_ROWS * 1024;
        for (int64_t r = 0; r < rows; r += slice) {
            const int64_t n = rows - r < slice ? rows - r : slice;
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * t->row_bytes;
            pack(t->type, src, copy + (size_t)r * t->row_bytes, t->ne[0], n);
            os_mem_drop(src, (size_t)n * t->row_bytes);
        }
        os_mem_drop(t->data, (size_t)rows * t->row_bytes);   /* the pages slices shared */
        t->data = copy;
    }
    t->type = packed_type(t->type);
    m->repacked_bytes += (uint64_t)rows * t->row_bytes;
    m->n_repacked++;
    return 0;
}

bool model_repack_wanted(void)
{
    const char *env = getenv("RACIMO_REPACK");
    if (env && !strcmp(env, "0"))
        return false;
    if (env && *env && strcmp(env, "1"))
        rc_log(LOG_WARN, "RACIMO_REPACK=%s: known values are \"0\" (off) and \"1\"; repacking", env);
    return tensor_q4_0_r8_available() || tensor_q4_k_r8_available() ||
           tensor_q8_0_r8_available() || tensor_q6_k_r8_available();
}

/* Whether the model computes with a repacked copy of gguf tensor g (and
 * so never reads its file bytes, or only a few rows: a tied embedding). */
static bool repacked_in_file(const model *m, const gguf_tensor *g)
{
    if (m->output.type >= TT_GGUF_COUNT && m->output.name && !strcmp(m->output.name, g->name))
        return true;
    for (int l = 0; l < m->last - m->first; l++) {
        const tensor *t = (const tensor *)&m->layers[l];
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(tensor); i++)
            if (t[i].type >= TT_GGUF_COUNT && t[i].name && !strcmp(t[i].name, g->name))
                return true;
    }
    return false;
}

void model_prefault(const model *m, void (*progress)(void *ctx, double done), void *ctx)
{
    const gguf_file *f = m->file;
    if (!f)
        return;
    uint64_t total = 0, done = 0, next = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        total += f->tensors[i].size_bytes;
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *g = &f->tensors[i];
        if (g->data && !repacked_in_file(m, g))
            for (uint64_t off = 0; off < g->size_bytes; off += 4096)
                sink ^= ((const uint8_t *)g->data)[off];
        done += g->size_bytes;
        if (progress && done >= next) {
            progress(ctx, total ? (double)done / (double)total : 1.0);
            next += total / 50 + 1;
        }
    }
    (void)sink;
}

int model_repack(model *m)
{
    if (!model_repack_wanted())
        return 0;
    uint8_t *group = rc_malloc_aligned(64, Q4_0_R8_ROWS * Q4_0_R8_MAX_ROW_BYTES);
    if (!group)
        return rc_fail(RC_ENOMEM, "out of memory repacking the weights");
    int rc = 0;
    for (int l = 0; l < m->last - m->first && !rc; l++) {
        tensor *t = (tensor *)&m->layers[l];
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(tensor) && !rc; i++)
            if (eligible(m, &t[i]))
                rc = repack(m, &t[i], group);
    }
    if (!rc && eligible(m, &m->output))
        rc = repack(m, &m->output, group);
    rc_free_aligned(group);
    return rc;
}
