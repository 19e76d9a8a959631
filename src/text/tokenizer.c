/* tokenizer.c - loading a GGUF vocabulary, special tokens, the text -> id
 * hash, encoding (special-token splitting, then tok_bpe.c / tok_spm.c),
 * pieces and the streaming detokenizer.
 *
 * Divisions: helpers (hash, growable arrays) - loading - special tokens and
 * end-of-generation - the special-token splitter - tok_encode - pieces and
 * decoding - streaming.
 *
 * Everything read from the file is checked: array types and lengths, ids
 * against the vocabulary, merge sides against the tokens.  The special-token
 * splitter follows llama.cpp's tokenizer_st_partition: special tokens are
 * taken longest first, each cutting every raw fragment at all of its
 * occurrences, so a longer token wins over a shorter one wherever they
 * overlap.  To keep that cheap on long texts, one pass over the text first
 * finds which special tokens occur at all; only those are searched (each
 * such token costs one pass over the fragment list, so a text made of many
 * different special tokens costs tokens x fragments).
 */
#include "text/tok_internal.h"
#include "text/utf8.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <math.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MODEL       "tokenizer.ggml.model"
#define KEY_PRE         "tokenizer.ggml.pre"
#define KEY_TOKENS      "tokenizer.ggml.tokens"
#define KEY_TYPES       "tokenizer.ggml.token_type"
#define KEY_SCORES      "tokenizer.ggml.scores"
#define KEY_ADD_BOS     "tokenizer.ggml.add_bos_token"
#define KEY_ADD_EOS     "tokenizer.ggml.add_eos_token"
#define KEY_ADD_PREFIX  "tokenizer.ggml.add_space_prefix"

#define MAX_VOCAB      (1u << 24)
#define MAX_TOKEN_LEN  (1u << 20)

/* ---- helpers ---- */

uint64_t tok__hash(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (len * 0xC2B2AE3D27D4EB4FULL);
    while (len >= 8) {
        uint64_t k;
        memcpy(&k, p, 8);
        k *= 0x87C37B91114253D5ULL;
        k = (k << 31) | (k >> 33);
        h = (h ^ k) * 0x4CF5AD432745937FULL;
        h = (h << 27) | (h >> 37);
        p += 8;
        len -= 8;
    }
    uint64_t k = 0;
    for (size_t i = 0; i < len; i++)
        k |= (uint64_t)p[i] << (8 * i);
    h ^= k * 0x87C37B91114253D5ULL;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

int32_t tok__lookup(const tokenizer *t, const char *text, size_t len)
{
    if (len > t->max_token_len)
        return -1;
    for (uint32_t i = (uint32_t)tok__hash(text, len) & t->idx_mask;; i = (i + 1) & t->idx_mask) {
        uint32_t v = t->idx[i];
        if (v == 0)
            return -1;
        const tok__token *k = &t->tok[v - 1];
        if (k->len == len && memcmp(k->text, text, len) == 0)
            return (int32_t)(v - 1);
    }
}

int tok__reserve(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < n)
        c = c > SIZE_MAX / 2 ? n : c * 2;
    size_t bytes;
    if (rc_mul_size(c, size, &bytes))
        return RC_ENOMEM;
    void *q = rc_realloc(*p, bytes);
    if (!q)
        return RC_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

int tok__ids_push(tok__ids *a, int32_t id)
{
    if (a->n == a->cap && tok__reserve((void **)&a->v, &a->cap, a->n + 1, sizeof(int32_t)))
        return RC_ENOMEM;
    a->v[a->n++] = id;
    return 0;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t s = 16;
    while (s < n)
        s *= 2;
    return s;
}

/* ---- loading ---- */

void tok_free(tokenizer *t)
{
    if (!t)
        return;
    tok__pretok_free(t);
    rc_free(t->tok);
    rc_free(t->owned);
    rc_free(t->idx);
    rc_free(t->merge);
    rc_free(t->spm_pairs);
    rc_free(t->special);
    rc_free(t->special_idx);
    rc_free(t->special_lens);
    rc_free(t);
}

/* Reads the string array of tokens, their scores and types. */
static int load_tokens(tokenizer *t, const gguf_file *f)
{
    const gguf_value *tv = gguf_get(f, KEY_TOKENS);
    if (!tv)
        return rc_fail(RC_ENOTFOUND, "%s is missing", KEY_TOKENS);
    if (tv->type != GGUF_ARRAY || tv->v.arr.elem_type != GGUF_STRING || !tv->v.arr.items)
        return rc_fail(RC_EFORMAT, "%s is not an array of strings", KEY_TOKENS);
    uint64_t n = tv->v.arr.n;
    if (n == 0)
        return rc_fail(RC_EFORMAT, "%s is empty", KEY_TOKENS);
    if (n > MAX_VOCAB)
        return rc_fail(RC_ELIMIT, "%s has %llu tokens, more than the limit %u", KEY_TOKENS,
                       (unsigned long long)n, MAX_VOCAB);

    const gguf_value *sv = gguf_get(f, KEY_SCORES), *yv = gguf_get(f, KEY_TYPES);
    if (sv && (sv->type != GGUF_ARRAY || sv->v.arr.n < n || !sv->v.arr.raw))
        return rc_fail(RC_EFORMAT, "%s must be an array of at least %llu numbers", KEY_SCORES,
                       (unsigned long long)n);
    if (yv && (yv->type != GGUF_ARRAY || yv->v.arr.n < n || !yv->v.arr.raw))
        return rc_fail(RC_EFORMAT, "%s must be an array of at least %llu integers", KEY_TYPES,
                       (unsigned long long)n);

    t->n_vocab = (int32_t)n;
    t->tok = rc_calloc(n, sizeof *t->tok);
    if (!t->tok)
        return rc_fail(RC_ENOMEM, "%s: out of memory", KEY_TOKENS);

    size_t n_empty = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = tv->v.arr.items[i].v.s;
        if (s.len == 0)
            n_empty++;
        else if (s.len > MAX_TOKEN_LEN)
            return rc_fail(RC_ELIMIT, "%s[%llu] is %llu bytes long, more than the limit %u",
                           KEY_TOKENS, (unsigned long long)i, (unsigned long long)s.len,
                           MAX_TOKEN_LEN);
    }
    /* Empty strings become "[EMPTY_<id>]" as in llama.cpp. */
    char *owned = NULL;
    if (n_empty) {
        owned = t->owned = rc_mallocarray(n_empty, 24);
        if (!owned)
            return rc_fail(RC_ENOMEM, "%s: out of memory", KEY_TOKENS);
        rc_log(LOG_WARN, "tokenizer: %zu empty token string(s) in %s", n_empty, KEY_TOKENS);
    }

    for (uint64_t i = 0; i < n; i++) {
        tok__token *k = &t->tok[i];
        gguf_str s = tv->v.arr.items[i].v.s;
        if (s.len == 0) {
            int w = snprintf(owned, 24, "[EMPTY_%llu]", (unsigned long long)i);
            k->text = owned;
            k->len = (uint32_t)w;
            owned += 24;
        } else {
            k->text = s.ptr;
            k->len = (uint32_t)s.len;
        }
        if (k->len > t->max_token_len)
            t->max_token_len = k->len;

        if (sv) {
            double d;
            if (gguf_arr_f64(sv, i, &d))
                return rc_fail(RC_EFORMAT, "%s[%llu]: %s", KEY_SCORES, (unsigned long long)i,
                               rc_errmsg());
            k->score = isnan(d) ? -FLT_MAX : d > FLT_MAX ? FLT_MAX : d < -FLT_MAX ? -FLT_MAX
                                                                                 : (float)d;
        }
        int64_t type = 1;
        if (yv && gguf_arr_i64(yv, i, &type))
            return rc_fail(RC_EFORMAT, "%s[%llu]: %s", KEY_TYPES, (unsigned long long)i,
                           rc_errmsg());
        switch (type) {
        case 1: k->attr = TOK_ATTR_NORMAL; break;
        case 2: k->attr = TOK_ATTR_UNKNOWN; break;
        case 3: k->attr = TOK_ATTR_CONTROL; break;
        case 4: k->attr = TOK_ATTR_USER; break;
        case 5: k->attr = TOK_ATTR_UNUSED; break;
        case 6: k->attr = TOK_ATTR_BYTE; break;
        default: k->attr = TOK_ATTR_UNDEFINED; break;
        }
    }

    /* text -> id; a repeated text maps to its last id, as in llama.cpp. */
    uint32_t size = pow2_at_least(2 * n);
    t->idx = rc_calloc(size, sizeof *t->idx);
    if (!t->idx)
        return rc_fail(RC_ENOMEM, "%s: out of memory", KEY_TOKENS);
    t->idx_mask = size - 1;
    for (uint64_t i = 0; i < n; i++) {
        const tok__token *k = &t->tok[i];
        uint32_t j = (uint32_t)tok__hash(k->text, k->len) & t->idx_mask;
        for (;; j = (j + 1) & t->idx_mask) {
            uint32_t v = t->idx[j];
            if (v == 0)
                break;
            const tok__token *o = &t->tok[v - 1];
            if (o->len == k->len && memcmp(o->text, k->text, k->len) == 0)
                break;
        }
        t->idx[j] = (uint32_t)i + 1;
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xNN>" text, or -1. */
static int byte_token_value(const tok__token *k)
{
    if (k->len != 6 || memcmp(k->text, "<0x", 3) != 0 || k->text[5] != '>')
        return -1;
    int hi = hexval(k->text[3]), lo = hexval(k->text[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Byte tokens: a BYTE-typed token must read "<0xNN>" (else it is treated as
 * normal text); SPM vocabularies without token types get their "<0xNN>"
 * tokens marked BYTE, so they decode as bytes. */
static void init_byte_tokens(tokenizer *t, bool have_types)
{
    for (int32_t i = 0; i < t->n_vocab; i++) {
        tok__token *k = &t->tok[i];
        int b = byte_token_value(k);
        bool guess = !have_types && t->kind == TOK_KIND_SPM && (k->attr & TOK_ATTR_NORMAL);
        if (b >= 0 && (k->attr & TOK_ATTR_BYTE || guess)) {
            k->attr = TOK_ATTR_BYTE;
            k->byte = (uint8_t)b;
        } else if (k->attr & TOK_ATTR_BYTE) {
            k->attr = TOK_ATTR_NORMAL;
        }
    }
}

/* SPM byte fallback: the "<0xNN>" token, else the one-byte token. */
static void spm_init_bytes(tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        char name[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
        char one = (char)b;
        int32_t id = tok__lookup(t, name, 6);
        t->byte_tok[b] = id >= 0 ? id : tok__lookup(t, &one, 1);
    }
}

/* An optional id key: absent keeps *id; a value outside the vocabulary is
 * ignored with a warning (as llama.cpp); a non-integer is an error. */
static int read_id(tokenizer *t, const gguf_file *f, const char *key, int32_t *id)
{
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v);
    if (rc == RC_ENOTFOUND)
        return 0;
    if (rc == RC_EFORMAT)
        return rc_fail(RC_EFORMAT, "%s must be an integer token id", key);
    if (rc == RC_ERANGE || (rc == 0 && v >= (uint32_t)t->n_vocab)) {
        rc_log(LOG_WARN, "tokenizer: %s is outside the vocabulary of %d tokens; ignored",
               key, t->n_vocab);
        return 0;
    }
    if (rc)
        return rc;
    *id = (int32_t)v;
    return 0;
}

static int read_bool(const gguf_file *f, const char *key, bool *out)
{
    int rc = gguf_get_bool(f, key, out);
    if (rc == RC_ENOTFOUND)
        return 0;
    if (rc)
        return rc_fail(RC_EFORMAT, "%s must be a bool", key);
    return 0;
}

/* ---- special tokens and end of generation ---- */

/* Text-detected tokens, in llama.cpp's lists (first match wins for eot). */
static const char *const EOT_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of"
    "\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "<end_of_utterance>",
};
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[",
};
/* FIM pad / repo / file-separator tokens also end generation. */
static const char *const FIM_EOG_TEXTS[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int32_t find_text(const tokenizer *t, const char *s)
{
    return tok__lookup(t, s, strlen(s));
}

/* Marks an end-of-generation token; like llama.cpp, a text-detected one that
 * is not typed as control becomes control. */
static void mark_eog(tokenizer *t, int32_t id, bool make_control)
{
    if (id < 0)
        return;
    t->tok[id].attr |= TOK_ATTR_EOG;
    if (make_control && !(t->tok[id].attr & TOK_ATTR_CONTROL)) {
        rc_log(LOG_DEBUG, "tokenizer: token %d '%.*s' looks like a control token; treated as one",
               id, (int)t->tok[id].len, t->tok[id].text);
        t->tok[id].attr |= TOK_ATTR_CONTROL;
    }
}

static int find_eog(tokenizer *t, const gguf_file *f)
{
    /* gpt-oss / solar-open: with <|return|> and <|call|> (or <|calls|> and
     * <|flush|>), <|end|> ends a message, not the generation: it is plain
     * user-defined text there.  Gemma 4: with <|tool_response>, </s> is
     * ordinary text. */
    int32_t end = find_text(t, "<|end|>"), s_end = find_text(t, "</s>");
    bool harmony = (find_text(t, "<|return|>") >= 0 && find_text(t, "<|call|>") >= 0) ||
                   (find_text(t, "<|calls|>") >= 0 && find_text(t, "<|flush|>") >= 0);
    bool gemma4 = find_text(t, "<|tool_response>") >= 0;
    int32_t skip1 = harmony ? end : -1, skip2 = gemma4 ? s_end : -1;

    if (t->eot < 0)
        for (size_t i = 0; i < N_OF(EOT_TEXTS) && t->eot < 0; i++) {
            int32_t id = find_text(t, EOT_TEXTS[i]);
            if (id != skip1)
                t->eot = id;
        }
    if (t->eom < 0)
        t->eom = find_text(t, "<|eom_id|>");
    mark_eog(t, t->eot, true);
    mark_eog(t, t->eom, true);

    /* FIM pad / repo / sep: the metadata's id or the first text of each kind
     * found (llama.cpp keeps one id per kind). */
    static const char *const fim_keys[] = {
        "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
        "tokenizer.ggml.fim_sep_token_id",
    };
    static const size_t kind_end[] = { 5, 10, 11 };
    for (size_t i = 0, k = 0; k < N_OF(kind_end); k++) {
        int32_t id = -1;
        int rc = read_id(t, f, fim_keys[k], &id);
        if (rc)
            return rc;
        for (; i < kind_end[k]; i++)
            if (id < 0)
                id = find_text(t, FIM_EOG_TEXTS[i]);
        mark_eog(t, id, true);
    }
    for (size_t i = 0; i < N_OF(EOG_TEXTS); i++) {
        int32_t id = find_text(t, EOG_TEXTS[i]);
        if (id >= 0 && id != skip1 && id != skip2)
            mark_eog(t, id, true);
    }
    if (skip1 >= 0 && skip1 != t->eos && skip1 != t->eot)
        t->tok[skip1].attr = TOK_ATTR_USER;
    if (skip2 >= 0 && skip2 != t->eos)
        t->tok[skip2].attr = TOK_ATTR_NORMAL;
    mark_eog(t, t->eos, false);

    /* gpt-oss: these structure tokens are always rendered (llama.cpp). */
    static const char *const shown[] = { "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>" };
    for (size_t i = 0; i < N_OF(shown); i++) {
        int32_t id = find_text(t, shown[i]);
        if (id >= 0)
            t->tok[id].attr = TOK_ATTR_USER;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_len_desc(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x > y ? -1 : x < y;
}

/* Index into t->special (+1) of the first special token with this text. */
static uint32_t special_find(const tokenizer *t, const char *text, size_t len)
{
    for (uint32_t i = (uint32_t)tok__hash(text, len) & t->special_idx_mask;;
         i = (i + 1) & t->special_idx_mask) {
        uint32_t v = t->special_idx[i];
        if (v == 0)
            return 0;
        const tok__token *k = &t->tok[t->special[v - 1]];
        if (k->len == len && memcmp(k->text, text, len) == 0)
            return v;
    }
}

static int build_specials(tokenizer *t)
{
    uint32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tok[i].attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN))
            n++;
    if (n == 0)
        return 0;
    uint32_t size = pow2_at_least(2 * (uint64_t)n);
    t->special = rc_mallocarray(n, sizeof *t->special);
    t->special_lens = rc_mallocarray(n, sizeof *t->special_lens);
    t->special_idx = rc_calloc(size, sizeof *t->special_idx);
    if (!t->special || !t->special_lens || !t->special_idx)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    t->special_idx_mask = size - 1;
    /* Longest first, then lower id: sort (inverted length, id) keys. */
    uint64_t *key = rc_mallocarray(n, sizeof *key);
    if (!key)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tok[i].attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN))
            key[t->n_special++] = ((uint64_t)(UINT32_MAX - t->tok[i].len) << 32) | (uint32_t)i;
    qsort(key, n, sizeof *key, cmp_u64);
    for (uint32_t s = 0; s < n; s++)
        t->special[s] = (int32_t)(uint32_t)key[s];
    rc_free(key);

    for (uint32_t s = 0; s < n; s++) {
        const tok__token *k = &t->tok[t->special[s]];
        t->special_first[(uint8_t)k->text[0] >> 3] |= (uint8_t)(1u << ((uint8_t)k->text[0] & 7));
        if (!special_find(t, k->text, k->len)) {
            uint32_t j = (uint32_t)tok__hash(k->text, k->len) & t->special_idx_mask;
            while (t->special_idx[j])
                j = (j + 1) & t->special_idx_mask;
            t->special_idx[j] = s + 1;
        }
        bool seen = false;
        for (uint32_t l = 0; l < t->n_special_lens && !seen; l++)
            seen = t->special_lens[l] == k->len;
        if (!seen)
            t->special_lens[t->n_special_lens++] = k->len;
    }
    qsort(t->special_lens, t->n_special_lens, sizeof *t->special_lens, cmp_len_desc);
    return 0;
}

int tok_load(const gguf_file *f, tokenizer **out)
{
    *out = NULL;
    if (!f)
        return rc_fail(RC_EINVAL, "tok_load: no file");
    gguf_str model;
    int rc = gguf_get_str(f, KEY_MODEL, &model);
    if (rc == RC_ENOTFOUND)
        return rc_fail(RC_ENOTFOUND, "%s is missing", KEY_MODEL);
    if (rc)
        return rc_fail(RC_EFORMAT, "%s must be a string", KEY_MODEL);
    int kind;
    if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0)
        kind = TOK_KIND_SPM;
    else if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0)
        kind = TOK_KIND_BPE;
    else
        return rc_fail(RC_EUNSUPPORTED, "%s '%.*s' is not supported (only gpt2 and llama)",
                       KEY_MODEL, (int)(model.len > 64 ? 64 : model.len), model.ptr);

    gguf_str pre = { NULL, 0 };
    rc = gguf_get_str(f, KEY_PRE, &pre);
    if (rc && rc != RC_ENOTFOUND)
        return rc_fail(RC_EFORMAT, "%s must be a string", KEY_PRE);

    tokenizer *t = rc_calloc(1, sizeof *t);
    if (!t)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    t->kind = kind;
    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    if ((rc = load_tokens(t, f)))
        goto fail;

    if (kind == TOK_KIND_SPM) {
        t->pre_name = "spm";
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
        spm_init_bytes(t);
        if ((rc = tok__spm_init(t)))
            goto fail;
    } else {
        int flags = tok__pretok_init(t, pre.ptr, pre.len);
        if (flags < 0) {
            rc = flags;
            goto fail;
        }
        t->ignore_merges = flags & TOK_PRE_IGNORE_MERGES;
        t->add_bos = flags & TOK_PRE_ADD_BOS;
        if ((rc = tok__bpe_load(t, f)))
            goto fail;
        tok__bpe_init_bytes(t);
    }
    init_byte_tokens(t, gguf_get(f, KEY_TYPES) != NULL);
    /* Defaults beyond a small vocabulary are dropped, as in llama.cpp. */
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->eos >= t->n_vocab) t->eos = -1;
    if (t->unk >= t->n_vocab) t->unk = -1;

    if ((rc = read_id(t, f, "tokenizer.ggml.bos_token_id", &t->bos)) ||
        (rc = read_id(t, f, "tokenizer.ggml.eos_token_id", &t->eos)) ||
        (rc = read_id(t, f, "tokenizer.ggml.eot_token_id", &t->eot)) ||
        (rc = read_id(t, f, "tokenizer.ggml.eom_token_id", &t->eom)) ||
        (rc = read_id(t, f, "tokenizer.ggml.unknown_token_id", &t->unk)) ||
        (rc = read_bool(f, KEY_ADD_BOS, &t->add_bos)) ||
        (rc = read_bool(f, KEY_ADD_EOS, &t->add_eos)) ||
        (rc = read_bool(f, KEY_ADD_PREFIX, &t->add_space_prefix)))
        goto fail;

    if ((rc = find_eog(t, f)) || (rc = build_specials(t)))
        goto fail;
    *out = t;
    return 0;
fail:
    tok_free(t);
    return rc;
}

/* ---- small accessors ---- */

int tok_n_vocab(const tokenizer *t) { return t->n_vocab; }
bool tok_is_spm(const tokenizer *t) { return t->kind == TOK_KIND_SPM; }
const char *tok_pre_name(const tokenizer *t) { return t->pre_name; }
int32_t tok_bos(const tokenizer *t) { return t->bos; }
int32_t tok_eos(const tokenizer *t) { return t->eos; }
int32_t tok_eot(const tokenizer *t) { return t->eot; }
int32_t tok_eom(const tokenizer *t) { return t->eom; }
bool tok_add_bos(const tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool tok_add_eos(const tokenizer *t) { return t->add_eos && t->eos >= 0; }
size_t tok_max_piece(const tokenizer *t) { return t->max_token_len; }

bool tok_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->tok[id].attr & TOK_ATTR_EOG);
}

bool tok_is_control(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->tok[id].attr & TOK_ATTR_CONTROL);
}

int32_t tok_find_token(const tokenizer *t, const char *text)
{
    return text ? tok__lookup(t, text, strlen(text)) : -1;
}

const char *tok_token_text(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->tok[id].len;
    return t->tok[id].text;
}

/* ---- the special-token splitter ---- */

typedef struct {
    size_t  off, len;
    int32_t id;          /* >= 0: a special token; -1: raw text */
} frag;

typedef struct {
    frag  *v;
    size_t n, cap;
} frag_list;

static int frag_push(frag_list *l, size_t off, size_t len, int32_t id)
{
    if (l->n == l->cap && tok__reserve((void **)&l->v, &l->cap, l->n + 1, sizeof(frag)))
        return RC_ENOMEM;
    l->v[l->n++] = (frag){ off, len, id };
    return 0;
}

static bool special_eligible(const tokenizer *t, int32_t id, bool parse_special)
{
    return parse_special || !(t->tok[id].attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN));
}

/* Cuts text into raw and special fragments (see the file comment). */
static int partition(const tokenizer *t, const char *text, size_t len, bool parse_special,
                     frag_list *out)
{
    out->n = 0;
    if (len == 0)
        return 0;
    if (frag_push(out, 0, len, -1))
        return RC_ENOMEM;
    if (t->n_special == 0)
        return 0;

    /* Which special tokens occur anywhere in the text? */
    uint8_t *found = NULL;
    size_t n_found = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)text[i];
        if (!(t->special_first[c >> 3] & (1u << (c & 7))))
            continue;
        for (uint32_t l = 0; l < t->n_special_lens; l++) {
            uint32_t sl = t->special_lens[l];
            if (sl > len - i)
                continue;
            uint32_t v = special_find(t, text + i, sl);
            if (!v)
                continue;
            if (!found && !(found = rc_calloc(t->n_special, 1)))
                return RC_ENOMEM;
            n_found += !found[v - 1];
            found[v - 1] = 1;
        }
    }
    if (!n_found) {
        rc_free(found);
        return 0;
    }

    frag_list next = { 0 };
    int rc = 0;
    for (uint32_t s = 0; s < t->n_special && !rc; s++) {
        int32_t id = t->special[s];
        const tok__token *k = &t->tok[id];
        /* Tokens sharing a text share the first one's found flag. */
        if (!found[special_find(t, k->text, k->len) - 1] || !special_eligible(t, id, parse_special))
            continue;
        next.n = 0;
        for (size_t f = 0; f < out->n && !rc; f++) {
            frag fr = out->v[f];
            if (fr.id >= 0) {
                rc = frag_push(&next, fr.off, fr.len, fr.id);
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            while (!rc && pos < end) {
                const char *m = memmem(text + pos, end - pos, k->text, k->len);
                if (!m) {
                    rc = frag_push(&next, pos, end - pos, -1);
                    break;
                }
                size_t at = (size_t)(m - text);
                if (at > pos)
                    rc = frag_push(&next, pos, at - pos, -1);
                if (!rc)
                    rc = frag_push(&next, at, k->len, id);
                pos = at + k->len;
            }
        }
        frag_list tmp = *out;
        *out = next;
        next = tmp;
    }
    rc_free(next.v);
    rc_free(found);
    return rc;
}

/* ---- encoding ---- */

int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t **ids, size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_MAX_TEXT)
        return rc_fail(RC_ELIMIT, "tokenizer: text of %zu bytes exceeds the limit of %zu",
                       len, TOK_MAX_TEXT);
    if (!text && len)
        return rc_fail(RC_EINVAL, "tok_encode: NULL text");

    tok__ids out = { 0 };
    tok__scratch s = { 0 };
    frag_list frags = { 0 };
    int rc = 0;
    size_t guess = len / 3 + 8;   /* grows as needed */
    if (tok__reserve((void **)&out.v, &out.cap, guess < 65536 ? guess : 65536, sizeof(int32_t)) ||
        partition(t, text, len, parse_special, &frags)) {
        rc = rc_fail(RC_ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (add_special && tok_add_bos(t) && (rc = tok__ids_push(&out, t->bos)))
        goto done;

    bool prev_special = true;   /* SPM: a space prefix at the start... */
    for (size_t i = 0; i < frags.n && !rc; i++) {
        const frag *fr = &frags.v[i];
        if (fr->id >= 0) {
            rc = tok__ids_push(&out, fr->id);
            prev_special = true;   /* ...and after every special token */
        } else if (t->kind == TOK_KIND_SPM) {
            rc = tok__spm_encode(t, &s, text + fr->off, fr->len,
                                 t->add_space_prefix && prev_special, &out);
            prev_special = false;
        } else {
            rc = tok__bpe_encode(t, &s, text + fr->off, fr->len, &out);
        }
    }
    if (!rc && add_special && tok_add_eos(t))
        rc = tok__ids_push(&out, t->eos);

done:
    tok__scratch_free(&s);
    rc_free(frags.v);
    if (rc) {
        rc_free(out.v);
        return rc == RC_ENOMEM ? rc_fail(RC_ENOMEM, "tokenizer: out of memory") : rc;
    }
    *ids = out.v;
    *n_ids = out.n;
    return 0;
}

/* ---- pieces and decoding ---- */

static size_t copy_out(const char *src, size_t n, char *buf, size_t cap)
{
    if (cap)
        memcpy(buf, src, n < cap ? n : cap);
    return n;
}

/* SPM text with every "▁" turned into a space. */
static size_t spm_unescape(const char *text, size_t len, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
            if (o < cap)
                buf[o] = ' ';
            o++;
            i += 3;
        } else {
            if (o < cap)
                buf[o] = text[i];
            o++;
            i++;
        }
    }
    return o;
}

int tok_piece(const tokenizer *t, int32_t id, bool special, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab)
        return rc_fail(RC_ERANGE, "token id %d is outside the vocabulary of %d tokens",
                       id, t->n_vocab);
    const tok__token *k = &t->tok[id];
    size_t n;
    if (k->attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))
        n = special ? copy_out(k->text, k->len, buf, cap) : 0;
    else if (k->attr & TOK_ATTR_USER)
        n = copy_out(k->text, k->len, buf, cap);
    else if (k->attr & TOK_ATTR_NORMAL)
        n = t->kind == TOK_KIND_SPM ? spm_unescape(k->text, k->len, buf, cap)
                                    : tok__bpe_decode(k->text, k->len, buf, cap);
    else if (k->attr & TOK_ATTR_BYTE)
        n = copy_out((const char *)&k->byte, 1, buf, cap);
    else
        n = 0;   /* unused and undefined tokens */
    return (int)n;
}

int tok_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, bool special,
               char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        int n = tok_piece(t, ids[i], special, NULL, 0);
        if (n < 0)
            return n;
        total += (size_t)n;
    }
    char *s = rc_malloc(total + 1);
    if (!s)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t n = (size_t)tok_piece(t, ids[i], special, s + o, total - o);
        /* llama_detokenize: drop the space the encoder put in front. */
        if (i == 0 && t->add_space_prefix && n > 0 && s[o] == ' ') {
            memmove(s + o, s + o + 1, n - 1);
            n--;
            total--;
        }
        o += n;
    }
    s[o] = 0;
    *out = s;
    *out_len = o;
    return 0;
}

/* ---- streaming ---- */

void tok_stream_init(tok_stream *s)
{
    memset(s, 0, sizeof *s);
}

/* Writes the bytes of buf[0..m) (m <= cap) back into buf as valid UTF-8,
 * each invalid maximal subpart as U+FFFD, except an unfinished character
 * at the very end, which goes to s->pending.  Returns the bytes written or
 * RC_ERANGE (s untouched) when the replacements do not fit. */
static int emit_valid(tok_stream *s, char *buf, size_t m, size_t cap)
{
    const uint8_t *u = (const uint8_t *)buf;
    size_t i = 0, grow = 0, keep = m, clen;
    bool bad = false;
    while (i < m) {
        int c = utf8_check(u + i, m - i, &clen);
        if (c == UTF8_INCOMPLETE) {
            keep = i;
            break;
        }
        if (c == UTF8_INVALID) {
            bad = true;
            grow += 3 - clen;   /* clen is 1..3 */
        }
        i += clen;
    }
    char tail[8];
    size_t n_tail = m - keep;   /* at most 3 */
    memcpy(tail, buf + keep, n_tail);
    size_t n_out = keep;
    if (bad) {
        /* The replacements only grow the text: move it to the top of buf
         * and rewrite from the bottom; the writer never passes the reader
         * when cap >= the output plus the input. */
        size_t need = keep + grow;
        if (need + keep > cap)
            return rc_fail(RC_ERANGE, "tok_stream: output buffer of %zu bytes is too small", cap);
        char *src = buf + cap - keep;
        memmove(src, buf, keep);
        size_t o = 0;
        for (size_t r = 0; r < keep;) {
            int c = utf8_check((const uint8_t *)src + r, keep - r, &clen);
            if (c == UTF8_VALID) {
                memmove(buf + o, src + r, clen);
                o += clen;
            } else {
                memcpy(buf + o, UTF8_REPLACEMENT, 3);
                o += 3;
            }
            r += clen;
        }
        n_out = o;
    }
    memcpy(s->pending, tail, n_tail);
    s->n_pending = (int)n_tail;
    return (int)n_out;
}

int tok_stream_push(const tokenizer *t, tok_stream *s, int32_t id, bool special,
                    char *out, size_t cap)
{
    int n = tok_piece(t, id, special, NULL, 0);
    if (n < 0)
        return n;
    size_t np = (size_t)s->n_pending, m = np + (size_t)n;
    if (m > cap)
        return rc_fail(RC_ERANGE, "tok_stream: output buffer of %zu bytes is too small", cap);
    memcpy(out, s->pending, np);
    tok_piece(t, id, special, out + np, cap - np);
    return emit_valid(s, out, m, cap);
}

int tok_stream_flush(tok_stream *s, char *out, size_t cap)
{
    if (s->n_pending == 0)
        return 0;
    if (cap < 3)
        return rc_fail(RC_ERANGE, "tok_stream: output buffer of %zu bytes is too small", cap);
    memcpy(out, UTF8_REPLACEMENT, 3);
    tok_stream_init(s);
    return 3;
}
