/* fuzz_pipe_start.c - libFuzzer target for a sequence's start as it rides
 * in a peer's BATCH (src/cluster/pipe_codec.c, docs/cluster-protocol.md §9):
 * the input's first byte says whether the start carries its generated
 * tokens (ENC_STARTS_GENERATED, bit 0) and a grammar (ENC_STARTS_GRAMMAR,
 * bit 1), the rest is the start.  A read that
 * succeeds must stay inside the input, with counts in their bounds, and
 * writing what it read must give the bytes read back, byte for byte.
 * Seeds: fuzz/corpus/pipe_start. */
#include "cluster/pipeline_internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool generated = data[0] & 1;
    uint32_t flags = (generated ? ENC_STARTS_GENERATED : 0) | (data[0] & 2 ? ENC_STARTS_GRAMMAR : 0);
    rbuf r = { .p = data + 1, .len = size - 1 };
    wire_start ws;
    pl__get_start(&r, &ws, flags);
    if (r.bad)
        return 0;
    const exec_start *s = &ws.s;
    const uint8_t *end = data + size;
    if (r.off > r.len || s->sp.n_bias < 0 || s->sp.n_bias > MAX_BIAS_WIRE ||
        s->n_prompt < 0 || (s->n_prompt && (const uint8_t *)s->prompt + (size_t)s->n_prompt * 4 > end) ||
        (generated && (s->n_generated < 0 ||
                       (s->n_generated && (const uint8_t *)s->generated + (size_t)s->n_generated * 4 > end))) ||
        (s->sp.n_bias && ws.bias + (size_t)s->sp.n_bias * 8 > end) ||
        s->grammar_len < 0 || s->grammar_len > MAX_GRAMMAR_WIRE ||
        (s->grammar && (const uint8_t *)s->grammar + s->grammar_len > end) ||
        s->n_triggers < 0 || s->n_triggers > EXEC_MAX_TRIGGERS)
        abort();
    for (int i = 0; i < s->n_triggers; i++)
        if ((const uint8_t *)s->triggers[i] + strlen(s->triggers[i]) >= end)
            abort();
    /* as the stage does: the bias pairs into arrays, then the start again */
    int32_t *ids = malloc((size_t)s->sp.n_bias * 4 + 4);
    float *vals = malloc((size_t)s->sp.n_bias * 4 + 4);
    if (!ids || !vals)
        abort();
    for (int b = 0; b < s->sp.n_bias; b++) {
        memcpy(&ids[b], ws.bias + (size_t)b * 8, 4);
        memcpy(&vals[b], ws.bias + (size_t)b * 8 + 4, 4);
    }
    exec_start again = *s;
    again.sp.bias_ids = ids;
    again.sp.bias_values = vals;
    wbuf w = { 0 };
    pl__put_start(&w, &again, flags);
    if (w.oom || w.len != r.off || memcmp(w.p, data + 1, r.off))
        abort();
    rc_free(w.p);
    free(ids);
    free(vals);
    return 0;
}
