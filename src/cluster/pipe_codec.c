/* pipe_codec.c - what both sides of a pipeline write and read alike:
 * hidden states and sums on the f16 wire, and a sequence's start (its
 * cache to keep, its sampler, its prompt) as it rides in a batch.  The
 * byte buffers are in pipeline_internal.h.
 */
#include "pipeline_internal.h"
#include "tensor/fp16.h"
#include "tensor/types.h"

#include <string.h>

/* Floats to and from the f16 wire (the F16C conversion where the CPU has
 * it; both round to nearest even). */
void pl__to_f16(const float *x, uint8_t *d, size_t n)
{
    tensor_type_traits(TT_F16)->from_float(x, d, (int64_t)n);
}
void pl__from_f16(const uint8_t *d, float *x, size_t n)
{
    /* the message need not be 2-aligned */
    if (((uintptr_t)d & 1) == 0) {
        tensor_type_traits(TT_F16)->to_float(d, x, (int64_t)n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, d + i * 2, 2);
        x[i] = fp16_to_fp32(v);
    }
}

void pl__put_start(wbuf *w, const exec_start *s, uint32_t flags)
{
    wb_i32(w, s->seq);
    wb_i32(w, s->keep);
    wb_i32(w, s->n_logprobs);
    wb_f32(w, s->sp.temperature);
    wb_i32(w, s->sp.top_k);
    wb_f32(w, s->sp.top_p);
    wb_f32(w, s->sp.min_p);
    wb_f32(w, s->sp.repeat_penalty);
    wb_i32(w, s->sp.repeat_last_n);
    wb_f32(w, s->sp.presence_penalty);
    wb_f32(w, s->sp.frequency_penalty);
    wb_put(w, &s->sp.seed, 8);
    wb_i32(w, s->sp.n_bias);
    for (int i = 0; i < s->sp.n_bias; i++) {
        wb_i32(w, s->sp.bias_ids[i]);
        wb_f32(w, s->sp.bias_values[i]);
    }
    wb_i32(w, s->n_prompt);
    wb_put(w, s->prompt, (size_t)s->n_prompt * 4);
    if (flags & ENC_STARTS_GENERATED) {
        wb_i32(w, s->n_generated);
        wb_put(w, s->generated, (size_t)s->n_generated * 4);
    }
    if (flags & ENC_STARTS_GRAMMAR) {
        wb_i32(w, s->grammar ? s->grammar_len : 0);
        if (s->grammar)
            wb_put(w, s->grammar, (size_t)s->grammar_len);
        wb_i32(w, s->n_triggers);
        for (int i = 0; i < s->n_triggers; i++) {
            size_t n = strlen(s->triggers[i]);
            wb_i32(w, (int32_t)n);
            wb_put(w, s->triggers[i], n + 1);   /* with its NUL: read in place */
        }
    }
}

/* A start's grammar: its text and triggers stay in the message (each
 * trigger checked to end in its NUL and hold no other). */
static void get_grammar(rbuf *r, wire_start *ws)
{
    exec_start *s = &ws->s;
    int32_t n = rb_i32(r);
    if (n < 0 || n > MAX_GRAMMAR_WIRE) {
        r->bad = true;
        return;
    }
    s->grammar_len = n;
    s->grammar = n ? (const char *)rb_get(r, (size_t)n) : NULL;
    int32_t nt = rb_i32(r);
    if (nt < 0 || nt > EXEC_MAX_TRIGGERS) {
        r->bad = true;
        return;
    }
    for (int i = 0; i < nt && !r->bad; i++) {
        int32_t tl = rb_i32(r);
        if (tl <= 0 || tl > EXEC_MAX_TRIGGER_LEN) {
            r->bad = true;
            return;
        }
        const char *t = (const char *)rb_get(r, (size_t)tl + 1);
        if (!r->bad && (t[tl] != 0 || memchr(t, 0, (size_t)tl)))
            r->bad = true;
        ws->trig[i] = t;
    }
    s->n_triggers = nt;
    s->triggers = ws->trig;
}

void pl__get_start(rbuf *r, wire_start *ws, uint32_t flags)
{
    exec_start *s = &ws->s;
    memset(ws, 0, sizeof *ws);
    s->seq = rb_i32(r);
    s->keep = rb_i32(r);
    s->n_logprobs = rb_i32(r);
    sampler_params_default(&s->sp);
    s->sp.temperature = rb_f32(r);
    s->sp.top_k = rb_i32(r);
    s->sp.top_p = rb_f32(r);
    s->sp.min_p = rb_f32(r);
    s->sp.repeat_penalty = rb_f32(r);
    s->sp.repeat_last_n = rb_i32(r);
    s->sp.presence_penalty = rb_f32(r);
    s->sp.frequency_penalty = rb_f32(r);
    s->sp.seed = rb_u64(r);
    int32_t nb = rb_i32(r);
    if (nb < 0 || nb > MAX_BIAS_WIRE) {
        r->bad = true;
        return;
    }
    s->sp.n_bias = nb;
    ws->bias = rb_get(r, (size_t)nb * 8);
    int32_t np = rb_i32(r);
    if (np < 0 || np > (1 << 24)) {
        r->bad = true;
        return;
    }
    s->n_prompt = np;
    s->prompt = rb_get(r, (size_t)np * 4);   /* may be unaligned: copied before use */
    if (flags & ENC_STARTS_GENERATED) {
        int32_t ng = rb_i32(r);
        if (ng < 0 || ng > (1 << 24)) {
            r->bad = true;
            return;
        }
        s->n_generated = ng;
        s->generated = rb_get(r, (size_t)ng * 4);
    }
    if (flags & ENC_STARTS_GRAMMAR)
        get_grammar(r, ws);
}
