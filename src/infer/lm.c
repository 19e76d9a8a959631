/* lm.c - loading a model with its tokenizer and chat template. */
#include "lm.h"
#include "base/err.h"
#include "base/mem.h"
#include "model/repack.h"
#include "text/chat_template.h"

#include <string.h>

/* Used only when a model carries no template (llama.cpp falls back to
 * ChatML too). */
static const char chatml_template[] =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

static char *token_text(const tokenizer *t, int32_t id)
{
    size_t len = 0;
    const char *s = id >= 0 ? tok_token_text(t, id, &len) : NULL;
    return s ? rc_strndup(s, len) : rc_strdup("");
}

int lm_open(lm *l, const char *path, bool weights, const char *template_override)
{
    int rc;
    memset(l, 0, sizeof *l);
    /* Without weights only the head of the file is mapped (a pipeline's
     * head node may not have room for the rest). */
    if ((rc = weights ? gguf_open(path, &l->file) : gguf_open_meta(path, &l->file)))
        return rc;
    if ((rc = tok_load(l->file, &l->tok))) {
        rc_wrap(rc, "%s: ", path);
        goto fail;
    }
    gguf_str s;
    if (template_override) {
        l->template_src = rc_strdup(template_override);
    } else if (gguf_get_str(l->file, "tokenizer.chat_template", &s) == 0) {
        l->template_src = rc_strndup(s.ptr, s.len);
    } else {
        l->template_src = rc_strdup(chatml_template);
        l->template_fallback = true;
    }
    l->bos_text = token_text(l->tok, tok_bos(l->tok));
    l->eos_text = token_text(l->tok, tok_eos(l->tok));
    if (!l->template_src || !l->bos_text || !l->eos_text) {
        rc = rc_fail(RC_ENOMEM, "out of memory loading %s", path);
        goto fail;
    }
    if (weights) {
        gguf_file *f = l->file;
        l->file = NULL;
        if ((rc = model_load_file(f, 0, -1, &l->m)))   /* takes f, also on failure */
            goto fail;
        l->file = f;
    }
    return 0;
fail:
    lm_close(l);
    return rc;
}

void lm_close(lm *l)
{
    tok_free(l->tok);            /* before the file its strings point into */
    if (l->m)
        model_free(l->m);
    else
        gguf_close(l->file);
    rc_free(l->template_src);
    rc_free(l->bos_text);
    rc_free(l->eos_text);
    memset(l, 0, sizeof *l);
}

void lm_prefault(const lm *l, void (*progress)(void *ctx, double done), void *ctx)
{
    if (!l->file || !l->m)
        return;
    model_prefault(l->m, progress, ctx);
    if (progress)
        progress(ctx, 1.0);
}

int lm_render(const lm *l, const json_t *messages, const json_t *tools,
              bool add_generation_prompt, const json_t *vars, char **out)
{
    return chat_template_render(l->template_src, messages, tools, add_generation_prompt,
                                l->bos_text, l->eos_text, vars, out);
}

int lm_tokenize(const lm *l, const char *text, bool special, int32_t **ids, size_t *n)
{
    size_t bl = strlen(l->bos_text);
    bool has_bos = special && bl > 0 && !strncmp(text, l->bos_text, bl);
    return tok_encode(l->tok, text, strlen(text), !has_bos, special, ids, n);
}
