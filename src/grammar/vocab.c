/* vocab.c - a model's vocabulary as a byte trie for grammar masks.
 *
 * Every token's piece (tok_piece with special texts, so control tokens match
 * their text) is stored once; the pieces, sorted, make a trie laid out in
 * preorder, so a walk that rejects a prefix skips the whole subtree with one
 * jump (node.skip) and a walk that accepts it moves to the next node.
 * End-of-generation tokens stay out of the trie: they are allowed exactly
 * when the grammar can end.  Tokens with an empty piece are never allowed.
 */
#include "grammar/grammar_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"

typedef struct {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
} piece_ref;

static int piece_cmp(const void *a, const void *b)
{
    const piece_ref *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void grammar_vocab_free(grammar_vocab *v)
{
    if (!v) return;
    rc_free(v->nodes);
    rc_free(v->tok_ids);
    rc_free(v->bytes);
    rc_free(v->piece_off);
    rc_free(v->eog);
    rc_free(v);
}

int grammar_vocab_n(const grammar_vocab *v)
{
    return v ? v->n_vocab : 0;
}

int grammar_vocab_new(const tokenizer *t, grammar_vocab **out)
{
    *out = NULL;
    if (!t) return rc_fail(RC_EINVAL, "grammar vocabulary: no tokenizer");
    int32_t n = tok_n_vocab(t);
    grammar_vocab *v = rc_calloc(1, sizeof *v);
    piece_ref *refs = NULL;
    uint32_t *open = NULL;
    int rc = 0;
    if (!v) return rc_fail(RC_ENOMEM, "grammar vocabulary: out of memory");
    v->n_vocab = n;
    v->piece_off = rc_calloc((size_t)n + 1, sizeof *v->piece_off);
    v->eog = rc_calloc(((size_t)n + 63) / 64, sizeof *v->eog);
    if (!v->piece_off || !v->eog) goto nomem;

    /* Pass 1: sizes.  Pieces are bounded by the tokenizer (1 MiB each), the
     * total by 32-bit offsets. */
    uint64_t total = 0;
    uint32_t max_len = 0;
    for (int32_t id = 0; id < n; id++) {
        int len = 0;
        if (tok_is_eog(t, id)) v->eog[id >> 6] |= 1ull << (id & 63);
        else len = tok_piece(t, id, true, NULL, 0);
        if (len < 0) { rc = rc_fail(len, "grammar vocabulary: token %d: %s", id, rc_errmsg()); goto fail; }
        total += (uint64_t)len;
        if (total > UINT32_MAX - 1) { rc = rc_fail(RC_ELIMIT, "grammar vocabulary: pieces above 4 GiB"); goto fail; }
        v->piece_off[id + 1] = (uint32_t)total;
        if ((uint32_t)len > max_len) max_len = (uint32_t)len;
    }
    v->bytes = rc_malloc(total ? total : 1);
    v->nodes = rc_mallocarray(total + 1, sizeof *v->nodes);
    refs = rc_mallocarray(n ? (size_t)n : 1, sizeof *refs);
    open = rc_mallocarray((size_t)max_len + 1, sizeof *open);
    if (!v->bytes || !v->nodes || !refs || !open) goto nomem;
    size_t n_refs = 0;
    for (int32_t id = 0; id < n; id++) {
        uint32_t off = v->piece_off[id], len = v->piece_off[id + 1] - off;
        if (!len) continue;
        tok_piece(t, id, true, (char *)v->bytes + off, len);
        refs[n_refs++] = (piece_ref){ v->bytes + off, len, id };
    }
    qsort(refs, n_refs, sizeof *refs, piece_cmp);
    v->tok_ids = rc_mallocarray(n_refs ? n_refs : 1, sizeof *v->tok_ids);
    if (!v->tok_ids) goto nomem;

    /* Pass 2: the trie.  open[d] is the node at depth d on the current path;
     * moving to the next sorted piece closes the nodes below the common
     * prefix (their subtree ends here) and opens one node per new byte. */
    v->nodes[0] = (grammar__node){ 0, 0, 0, 0, 0 };
    v->n_nodes = 1;
    open[0] = 0;
    uint32_t depth = 0;
    const piece_ref *prev = NULL;
    for (size_t k = 0; k < n_refs; k++) {
        const piece_ref *r = &refs[k];
        v->tok_ids[k] = r->id;
        uint32_t lcp = 0;
        if (prev) {
            uint32_t m = prev->len < r->len ? prev->len : r->len;
            while (lcp < m && prev->p[lcp] == r->p[lcp]) lcp++;
        }
        if (prev && lcp == r->len && lcp == prev->len) {   /* same piece as the last token */
            v->nodes[open[depth]].n_tok++;
            prev = r;
            continue;
        }
        for (; depth > lcp; depth--) v->nodes[open[depth]].skip = (uint32_t)v->n_nodes;
        for (; depth < r->len; depth++) {
            uint32_t i = (uint32_t)v->n_nodes++;
            v->nodes[i] = (grammar__node){ 0, depth + 1, 0, 0, r->p[depth] };
            open[depth + 1] = i;
        }
        v->nodes[open[depth]].tok_off = (uint32_t)k;
        v->nodes[open[depth]].n_tok = 1;
        prev = r;
    }
    for (; depth > 0; depth--) v->nodes[open[depth]].skip = (uint32_t)v->n_nodes;
    v->nodes[0].skip = (uint32_t)v->n_nodes;
    v->max_depth = max_len;
    rc_free(refs);
    rc_free(open);
    *out = v;
    return 0;
nomem:
    rc = rc_fail(RC_ENOMEM, "grammar vocabulary: out of memory");
fail:
    rc_free(refs);
    rc_free(open);
    grammar_vocab_free(v);
    return rc;
}
