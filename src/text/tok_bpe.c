/* tok_bpe.c - byte-level BPE (GPT-2 style), as llama.cpp's llm_tokenizer_bpe.
 *
 * A word from the pre-tokenizer is written in GPT-2's byte-to-unicode
 * alphabet (printable bytes stand for themselves, the others - space
 * included - for U+0100 and up, so a space is "Ġ"), one symbol per byte.
 * Then the adjacent pair with the lowest merge rank is merged, again and
 * again, until no listed pair is left.
 *
 * Cost: candidate pairs sit in a binary heap ordered by (rank, position), so
 * a word of n bytes takes O(n log n) however long it is; a candidate made
 * stale by an earlier merge is recognised by its length and dropped when
 * popped.  Symbols carry their token id, so a pair is looked up in a hash
 * table keyed by the two ids, never by comparing strings.  tok_load checks
 * that both sides of every merge and their concatenation are tokens, which
 * makes this id-keyed lookup give exactly llama.cpp's string-keyed results.
 */
#include "text/merge_heap.h"
#include "text/tok_internal.h"
#include "text/utf8.h"
#include "base/err.h"
#include "base/mem.h"

#include <pthread.h>
#include <string.h>

/* ---- the GPT-2 byte alphabet ---- */

static uint8_t  g_enc[256][2];       /* UTF-8 of each byte's character */
static uint8_t  g_enc_len[256];
static int16_t  g_dec[324];          /* code point -> byte, -1 if none */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_alphabet(void)
{
    int extra = 0;
    for (int cp = 0; cp < 324; cp++)
        g_dec[cp] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
                         (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + extra++;
        char u[4];
        size_t n = utf8_encode((uint32_t)cp, u);
        memcpy(g_enc[b], u, n);
        g_enc_len[b] = (uint8_t)n;
        g_dec[cp] = (int16_t)b;
    }
}

void tok__bpe_init_bytes(tokenizer *t)
{
    pthread_once(&g_once, init_alphabet);
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = tok__lookup(t, (const char *)g_enc[b], g_enc_len[b]);
}

size_t tok__bpe_decode(const char *text, size_t len, char *buf, size_t cap)
{
    pthread_once(&g_once, init_alphabet);
    const uint8_t *u = (const uint8_t *)text;
    size_t i = 0, o = 0;
    while (i < len) {
        size_t n;
        if (utf8_check(u + i, len - i, &n) == UTF8_VALID) {
            uint32_t cp = utf8_decode_valid(u + i, n);
            if (cp < 324 && g_dec[cp] >= 0) {
                if (o < cap)
                    buf[o] = (char)g_dec[cp];
                o++;
                i += n;
                continue;
            }
        } else {
            n = 1;
        }
        /* Not a GPT-2 byte character: keep the bytes as they are. */
        for (size_t k = 0; k < n; k++, o++)
            if (o < cap)
                buf[o] = text[i + k];
        i += n;
    }
    return o;
}

/* ---- the merge table ---- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline uint32_t pair_slot(const tokenizer *t, int32_t l, int32_t r)
{
    return (uint32_t)mix64(((uint64_t)(uint32_t)l << 32) | (uint32_t)r) & t->merge_mask;
}

static const tok__merge *find_merge(const tokenizer *t, int32_t l, int32_t r)
{
    for (uint32_t i = pair_slot(t, l, r);; i = (i + 1) & t->merge_mask) {
        const tok__merge *m = &t->merge[i];
        if (m->left < 0)
            return NULL;
        if (m->left == l && m->right == r)
            return m;
    }
}

#define KEY_MERGES "tokenizer.ggml.merges"
#define MAX_MERGES (1u << 25)

int tok__bpe_load(tokenizer *t, const gguf_file *f)
{
    const gguf_value *v = gguf_get(f, KEY_MERGES);
    if (!v)
        return rc_fail(RC_ENOTFOUND, "%s is missing (required for gpt2 vocabularies)", KEY_MERGES);
    if (v->type != GGUF_ARRAY || v->v.arr.elem_type != GGUF_STRING ||
        (v->v.arr.n && !v->v.arr.items))
        return rc_fail(RC_EFORMAT, "%s is not an array of strings", KEY_MERGES);
    uint64_t n = v->v.arr.n;
    if (n > MAX_MERGES)
        return rc_fail(RC_ELIMIT, "%s has %llu entries, more than the limit %u", KEY_MERGES,
                       (unsigned long long)n, MAX_MERGES);
    uint32_t size = 16;
    while (size < 2 * n)
        size *= 2;
    t->merge = rc_mallocarray(size, sizeof *t->merge);
    char *cat = rc_malloc((size_t)t->max_token_len * 2 + 1);
    if (!t->merge || !cat) {
        rc_free(cat);
        return rc_fail(RC_ENOMEM, "%s: out of memory", KEY_MERGES);
    }
    for (uint32_t i = 0; i < size; i++)
        t->merge[i].left = -1;
    t->merge_mask = size - 1;

    int rc = 0;
    for (uint64_t i = 0; i < n; i++) {
        const gguf_str s = v->v.arr.items[i].v.s;
        /* "left right": split at the first space after the first byte, so a
         * left side may itself be a space (as llama.cpp splits). */
        const char *sp = s.len >= 3 ? memchr(s.ptr + 1, ' ', s.len - 2) : NULL;
        if (!sp) {
            rc = rc_fail(RC_EFORMAT, "%s[%llu] \"%.*s\" is not \"left right\"", KEY_MERGES,
                         (unsigned long long)i, (int)(s.len > 64 ? 64 : s.len), s.ptr);
            break;
        }
        size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
        int32_t l = tok__lookup(t, s.ptr, ll);
        int32_t r = tok__lookup(t, sp + 1, rl);
        int32_t m = -1;
        if (l >= 0 && r >= 0) {
            memcpy(cat, s.ptr, ll);   /* both are tokens, so each fits */
            memcpy(cat + ll, sp + 1, rl);
            m = tok__lookup(t, cat, ll + rl);
        }
        if (m < 0) {
            rc = rc_fail(RC_EFORMAT, "%s[%llu] \"%.*s\": %s is not in the vocabulary",
                         KEY_MERGES, (unsigned long long)i, (int)(s.len > 64 ? 64 : s.len),
                         s.ptr, l < 0 ? "the left side" : r < 0 ? "the right side"
                                                            : "the merged token");
            break;
        }
        uint32_t k = pair_slot(t, l, r);
        while (t->merge[k].left >= 0 && !(t->merge[k].left == l && t->merge[k].right == r))
            k = (k + 1) & t->merge_mask;
        if (t->merge[k].left < 0)   /* a repeated pair keeps its first rank */
            t->merge[k] = (tok__merge){ l, r, m, (int32_t)i };
    }
    rc_free(cat);
    return rc;
}

/* ---- merging one word ---- */

typedef struct {
    int32_t  id;          /* token id of the symbol's text, -1 if none */
    uint32_t start, n;    /* bytes in the encoded word; n = 0 once merged away */
    int32_t  prev, next;
} bpe_sym;

static void add_pair(const tokenizer *t, const bpe_sym *sym, tok__heap *h, int32_t l, int32_t r)
{
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0)
        return;
    const tok__merge *m = find_merge(t, sym[l].id, sym[r].id);
    if (m)
        tok__heap_push(h, (tok__pair){ .rank = m->rank, .left = l, .right = r,
                                       .size = sym[l].n + sym[r].n, .merged = m->merged });
}

/* Encodes one word, given as raw bytes. */
static int encode_word(const tokenizer *t, tok__scratch *s, const char *w, size_t n,
                       tok__ids *out)
{
    /* The word in the GPT-2 alphabet. */
    if (tok__reserve((void **)&s->word, &s->word_cap, 2 * n + 1, 1))
        return RC_ENOMEM;
    char *enc = s->word;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)w[i];
        memcpy(enc + m, g_enc[b], g_enc_len[b]);
        m += g_enc_len[b];
    }
    if (t->ignore_merges) {
        int32_t id = tok__lookup(t, enc, m);
        if (id >= 0)
            return tok__ids_push(out, id);
    }
    if (n == 1 && t->byte_tok[(uint8_t)w[0]] >= 0)
        return tok__ids_push(out, t->byte_tok[(uint8_t)w[0]]);

    /* n symbols; the heap starts with at most n-1 pairs and grows as the
     * merges add pairs (each pop may add two). */
    tok__heap h = { s->heap, 0 };
    if (tok__reserve(&s->sym, &s->sym_cap, n, sizeof(bpe_sym)) || tok__heap_reserve(s, &h, n))
        return RC_ENOMEM;
    bpe_sym *sym = s->sym;
    uint32_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)w[i];
        sym[i] = (bpe_sym){ t->byte_tok[b], pos, g_enc_len[b], (int32_t)i - 1,
                            i + 1 < n ? (int32_t)i + 1 : -1 };
        pos += g_enc_len[b];
    }
    for (size_t i = 1; i < n; i++)
        add_pair(t, sym, &h, (int32_t)i - 1, (int32_t)i);

    while (h.n) {
        if (tok__heap_reserve(s, &h, h.n + 2))   /* the two pairs this round may add */
            return RC_ENOMEM;
        tok__pair p = tok__heap_pop(&h);
        bpe_sym *l = &sym[p.left], *r = &sym[p.right];
        /* Lengths only grow, so an unchanged sum means neither side has
         * merged with anything since the pair was queued. */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue;
        l->n += r->n;
        l->id = p.merged;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        add_pair(t, sym, &h, l->prev, p.left);
        add_pair(t, sym, &h, p.left, l->next);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) {
            if (tok__ids_push(out, sym[i].id))
                return RC_ENOMEM;
            continue;
        }
        /* A character the vocabulary lacks: llama.cpp tries each byte of
         * its text as a one-byte token and drops the ones that are not. */
        for (uint32_t k = 0; k < sym[i].n; k++) {
            int32_t id = tok__lookup(t, enc + sym[i].start + k, 1);
            if (id >= 0 && tok__ids_push(out, id))
                return RC_ENOMEM;
        }
    }
    return 0;
}

int tok__bpe_encode(const tokenizer *t, tok__scratch *s, const char *text, size_t len,
                    tok__ids *out)
{
    if (tok__reserve((void **)&s->buf, &s->buf_cap, 3 * len + 1, 1))
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    size_t n = utf8_sanitize(text, len, s->buf);
    tok__span *sp;
    size_t n_sp;
    int rc = tok__pretok_split(t, s, s->buf, n, &sp, &n_sp);
    if (rc)
        return rc;
    for (size_t i = 0; i < n_sp; i++) {
        if (sp[i].len == 0)
            continue;
        if (encode_word(t, s, s->buf + sp[i].off, sp[i].len, out))
            return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    }
    return 0;
}
