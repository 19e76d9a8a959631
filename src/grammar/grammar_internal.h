/* grammar_internal.h - the compiled forms shared by the files of src/grammar.
 *
 * A compiled grammar is a flat array of elements.  Each rule has one or more
 * alternatives; an alternative is a run of elements ended by GE_END.  A
 * position in the grammar is an element index.  Terminals match one code
 * point: GE_CHAR one value, GE_CLASS a sorted list of disjoint ranges (negated
 * classes are stored as their complement, so matching never looks at a flag).
 * Groups and repetitions were turned into synthesized rules by the parser,
 * so the matcher only sees terminals, rule references and ends.
 */
#ifndef RC_GRAMMAR_INTERNAL_H
#define RC_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar/grammar.h"

enum { GE_END = 0, GE_CHAR = 1, GE_CLASS = 2, GE_REF = 3 };

typedef struct {
    uint32_t type;   /* GE_* */
    uint32_t arg;    /* GE_CHAR: code point; GE_CLASS: class index; GE_REF: rule id */
} grammar__el;

typedef struct {
    uint32_t lo, hi;           /* inclusive */
} grammar__range;

typedef struct {
    uint32_t off, n;           /* ranges[off .. off+n), sorted, disjoint, not adjacent */
    uint64_t ascii[2];         /* membership of code points 0..127, for the common case */
} grammar__class;

typedef struct {
    uint32_t alt_off, n_alts;  /* alts[alt_off ..]: element index where each alternative starts */
} grammar__rule;

struct grammar {
    grammar__el    *els;    size_t n_els;
    grammar__range *ranges; size_t n_ranges;
    grammar__class *classes; size_t n_classes;
    grammar__rule  *rules;  size_t n_rules;
    uint32_t       *alts;   size_t n_alts;
    uint32_t        root;   /* rule id of `root` */
};

/* Index of the first range of class k whose end is >= c (k->n if none). */
static inline uint32_t grammar__class_find(const grammar *g, const grammar__class *k, uint32_t c)
{
    const grammar__range *r = g->ranges + k->off;
    uint32_t lo = 0, hi = k->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (r[mid].hi < c) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* Whether terminal `e` matches code point c. */
static inline bool grammar__term_has(const grammar *g, const grammar__el *e, uint32_t c)
{
    if (e->type == GE_CHAR)
        return e->arg == c;
    const grammar__class *k = &g->classes[e->arg];
    if (c < 128)
        return (k->ascii[c >> 6] >> (c & 63)) & 1;
    uint32_t i = grammar__class_find(g, k, c);
    return i < k->n && g->ranges[k->off + i].lo <= c;
}

/* Whether terminal `e` matches some code point in [lo, hi] (a character whose
 * first UTF-8 bytes are known). */
static inline bool grammar__term_meets(const grammar *g, const grammar__el *e, uint32_t lo,
                                       uint32_t hi)
{
    if (e->type == GE_CHAR)
        return e->arg >= lo && e->arg <= hi;
    const grammar__class *k = &g->classes[e->arg];
    uint32_t i = grammar__class_find(g, k, lo);
    return i < k->n && g->ranges[k->off + i].lo <= hi;
}

/* Whether terminal `e` matches every code point in [lo, hi]. */
static inline bool grammar__term_covers(const grammar *g, const grammar__el *e, uint32_t lo,
                                        uint32_t hi)
{
    if (e->type == GE_CHAR)
        return e->arg == lo && lo == hi;
    const grammar__class *k = &g->classes[e->arg];
    uint32_t i = grammar__class_find(g, k, lo);
    return i < k->n && g->ranges[k->off + i].lo <= lo && g->ranges[k->off + i].hi >= hi;
}

/* The vocabulary trie, in preorder: node i's subtree is [i, skip[i]); node 0
 * is the root (no byte).  Tokens whose piece is the path to node i are
 * tok_ids[tok_off[i] .. tok_off[i] + n_tok[i]). */
typedef struct {
    uint32_t skip;
    uint32_t depth;
    uint32_t tok_off;
    uint32_t n_tok;
    uint8_t  byte;
} grammar__node;

struct grammar_vocab {
    int32_t        n_vocab;
    grammar__node *nodes;   size_t n_nodes;
    int32_t       *tok_ids;            /* ids sorted by piece */
    uint8_t       *bytes;              /* all pieces */
    uint32_t      *piece_off;          /* n_vocab + 1: token t's piece is bytes[piece_off[t] .. piece_off[t+1]) */
    uint64_t      *eog;                /* bitset of end-of-generation tokens (not in the trie) */
    uint32_t       max_depth;
};

#endif
