/* merge_heap.h - the candidate pairs of the two merging tokenizers
 * (tok_bpe.c, tok_spm.c) in one binary heap.  Internal to src/text.
 *
 * Both merge the best adjacent pair again and again, ties to the leftmost;
 * they differ only in what "best" is: BPE the lowest merge rank, SPM the
 * highest piece score.  A pair carries both (the other one 0), so one order
 * serves both: rank first, then score, then position.  Static inline: the
 * heap sits in each tokenizer's innermost loop.
 */
#ifndef RC_MERGE_HEAP_H
#define RC_MERGE_HEAP_H

#include "text/tok_internal.h"
#include "base/err.h"

typedef struct {
    int32_t  rank;        /* BPE: merge rank, lower first (SPM: 0) */
    float    score;       /* SPM: the piece's score, higher first (BPE: 0) */
    int32_t  left, right; /* symbols */
    uint32_t size;        /* left.n + right.n when queued */
    int32_t  merged;      /* BPE: id of the merged token (SPM: unused) */
} tok__pair;

typedef struct {
    tok__pair *v;         /* s->heap of the scratch it lives in */
    size_t n;
} tok__heap;

static inline bool tok__pair_before(const tok__pair *a, const tok__pair *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

/* Room for n pairs in all (RC_ENOMEM when there is none). */
static inline int tok__heap_reserve(tok__scratch *s, tok__heap *h, size_t n)
{
    if (n <= s->heap_cap)
        return 0;
    if (tok__reserve(&s->heap, &s->heap_cap, n, sizeof(tok__pair)))
        return RC_ENOMEM;
    h->v = s->heap;
    return 0;
}

/* Adds p; the caller has made room (tok__heap_reserve). */
static inline void tok__heap_push(tok__heap *h, tok__pair p)
{
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!tok__pair_before(&p, &h->v[parent]))
            break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = p;
}

/* Removes and returns the best pair; the heap is not empty. */
static inline tok__pair tok__heap_pop(tok__heap *h)
{
    tok__pair top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && tok__pair_before(&h->v[c + 1], &h->v[c]))
            c++;
        if (!tok__pair_before(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

#endif
