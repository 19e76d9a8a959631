/* tok_spm.c - SentencePiece BPE, as llama.cpp's llm_tokenizer_spm.
 *
 * The text (with "▁" for every space, and one more in front when asked) is
 * cut into characters; then, again and again, the adjacent pair whose
 * concatenation is a vocabulary piece with the highest score is merged
 * (ties: the leftmost).  A final symbol that is not a piece - a character
 * the vocabulary lacks - is emitted as its bytes' <0xNN> tokens.
 *
 * Characters are cut by their lead byte alone (llama.cpp's unicode_len_utf8),
 * without validating, so invalid UTF-8 reaches the byte fallback unchanged.
 * Candidate pairs sit in a binary heap, so the whole text takes
 * O(n log n); the symbols of a pair are always contiguous in the buffer, so
 * a pair is looked up in the vocabulary hash without copying.  The text is
 * first cut where two neighbouring characters never occur side by side in
 * any token (a set built at load): no merge can cross such a point, so each
 * chunk is merged on its own with a small, cache-friendly heap, and the
 * result is the same as llama.cpp's one pass over the whole text.
 */
#include "text/merge_heap.h"
#include "text/tok_internal.h"
#include "text/utf8.h"
#include "base/err.h"
#include "base/mem.h"

#include <string.h>

/* ---- which characters can ever merge ---- */

/* A pair of characters (1..4 bytes each, lengths implied by the lead
 * bytes) as one key; clipped characters may collide, which only keeps a
 * boundary that could have been cut. */
static uint64_t pair_key(const char *a, size_t a_len, const char *b, size_t b_len)
{
    uint32_t x = 0, y = 0;
    for (size_t i = 0; i < a_len && i < 4; i++)
        x |= (uint32_t)(uint8_t)a[i] << (8 * i);
    for (size_t i = 0; i < b_len && i < 4; i++)
        y |= (uint32_t)(uint8_t)b[i] << (8 * i);
    return (uint64_t)x << 32 | y;
}

static uint32_t key_slot(const tokenizer *t, uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k & t->spm_pairs_mask;
}

static void pair_insert(tokenizer *t, uint64_t k)
{
    if (k == 0) {
        t->spm_pair_zero = true;
        return;
    }
    uint32_t i = key_slot(t, k);
    while (t->spm_pairs[i] && t->spm_pairs[i] != k)
        i = (i + 1) & t->spm_pairs_mask;
    t->spm_pairs[i] = k;
}

bool tok__spm_pair_possible(const tokenizer *t, const char *a, size_t a_len,
                            const char *b, size_t b_len)
{
    uint64_t k = pair_key(a, a_len, b, b_len);
    if (k == 0)
        return t->spm_pair_zero;
    for (uint32_t i = key_slot(t, k);; i = (i + 1) & t->spm_pairs_mask) {
        if (t->spm_pairs[i] == k)
            return true;
        if (t->spm_pairs[i] == 0)
            return false;
    }
}

/* Token texts are cut into characters by the same lead-byte rule as the
 * text, from the token's start; a merge that forms a token joins symbols
 * whose boundary is one of the token's own character boundaries. */
int tok__spm_init(tokenizer *t)
{
    uint64_t n_pairs = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n_pairs += t->tok[i].len;      /* a bound on the pairs inside */
    uint64_t size = 16;
    while (size < 2 * n_pairs)
        size *= 2;
    t->spm_pairs = rc_calloc((size_t)size, sizeof *t->spm_pairs);
    if (!t->spm_pairs)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    t->spm_pairs_mask = (uint32_t)(size - 1);
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->tok[i].text;
        size_t len = t->tok[i].len, off = 0, prev = 0, prev_len = 0;
        while (off < len) {
            size_t cl = utf8_lead_len((uint8_t)s[off]);
            if (cl > len - off)
                cl = len - off;
            if (off > 0)
                pair_insert(t, pair_key(s + prev, prev_len, s + off, cl));
            prev = off;
            prev_len = cl;
            off += cl;
        }
    }
    return 0;
}

/* ---- merging ---- */

typedef struct {
    uint32_t start, n;    /* n = 0 once merged into its left neighbour */
    int32_t  prev, next;
} spm_sym;

static void add_pair(const tokenizer *t, const char *text, const spm_sym *sym, tok__heap *h,
                     int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    uint32_t size = sym[l].n + sym[r].n;
    if (size > t->max_token_len)
        return;
    int32_t id = tok__lookup(t, text + sym[l].start, size);
    if (id >= 0)
        tok__heap_push(h, (tok__pair){ .score = t->tok[id].score, .left = l, .right = r,
                                       .size = size });
}

/* Merges the symbols first..last (linked only among themselves). */
static int merge_chunk(const tokenizer *t, tok__scratch *s, const char *b, int32_t first,
                       int32_t last)
{
    spm_sym *sym = s->sym;
    tok__heap h = { s->heap, 0 };
    if (tok__heap_reserve(s, &h, (size_t)(last - first + 1)))
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    for (int32_t i = first + 1; i <= last; i++)
        add_pair(t, b, sym, &h, i - 1, i);

    while (h.n) {
        if (tok__heap_reserve(s, &h, h.n + 2))   /* the two pairs this round may add */
            return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
        tok__pair p = tok__heap_pop(&h);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue;   /* stale: one side merged since (lengths only grow) */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        add_pair(t, b, sym, &h, l->prev, p.left);
        add_pair(t, b, sym, &h, p.left, l->next);
    }
    return 0;
}

/* A final symbol: its token, or its bytes' fallback tokens. */
static int emit(const tokenizer *t, const char *b, const spm_sym *y, tok__ids *out)
{
    int32_t id = tok__lookup(t, b + y->start, y->n);
    if (id >= 0)
        return tok__ids_push(out, id);
    for (uint32_t k = 0; k < y->n; k++) {
        int32_t bid = t->byte_tok[(uint8_t)b[y->start + k]];
        if (bid < 0)
            bid = t->unk;   /* no byte token: <unk> if there is one */
        if (bid >= 0 && tok__ids_push(out, bid))
            return RC_ENOMEM;
    }
    return 0;
}

int tok__spm_encode(const tokenizer *t, tok__scratch *s, const char *text, size_t len,
                    bool prefix_space, tok__ids *out)
{
    static const char SPACE[] = "\xE2\x96\x81";   /* U+2581 */
    if (tok__reserve((void **)&s->buf, &s->buf_cap, 3 * (len + 1), 1))
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    char *b = s->buf;
    size_t n = 0;
    if (prefix_space) {
        memcpy(b, SPACE, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(b + n, SPACE, 3);
            n += 3;
        } else {
            b[n++] = text[i];
        }
    }
    if (n == 0)
        return 0;

    /* At most n symbols; the heap starts with at most n-1 pairs and grows
     * as merges add pairs (each pop may add two). */
    if (tok__reserve(&s->sym, &s->sym_cap, n, sizeof(spm_sym)) ||
        tok__reserve(&s->heap, &s->heap_cap, 64, sizeof(tok__pair)))
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    spm_sym *sym = s->sym;
    int32_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        size_t cl = utf8_lead_len((uint8_t)b[off]);
        if (cl > n - off)
            cl = n - off;
        sym[n_sym] = (spm_sym){ (uint32_t)off, (uint32_t)cl, n_sym - 1, n_sym + 1 };
        n_sym++;
        off += cl;
    }
    sym[n_sym - 1].next = -1;

    /* Chunks end where no token holds the two characters side by side:
     * nothing can merge across such a boundary, so merging each chunk on
     * its own gives the same symbols with a small heap. */
    for (int32_t first = 0; first < n_sym;) {
        int32_t last = first;
        while (last + 1 < n_sym &&
               tok__spm_pair_possible(t, b + sym[last].start, sym[last].n,
                                      b + sym[last + 1].start, sym[last + 1].n))
            last++;
        sym[first].prev = -1;
        sym[last].next = -1;
        int rc = merge_chunk(t, s, b, first, last);
        if (rc)
            return rc;
        for (int32_t i = first; i >= 0; i = sym[i].next)
            if (emit(t, b, &sym[i], out))
                return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
        first = last + 1;
    }
    return 0;
}
