/* match.c - one sequence's position in a grammar, and the token masks.
 *
 * Stacks.  A stack is a chain of frames: frame (pos, parent) means "match the
 * element at pos, then go on with parent"; frame 0 is the empty stack (the
 * grammar is complete).  Frames are interned per match, so one id names one
 * stack, and what is computed for a stack is memoized on its frame: `next`
 * (the stack after its top terminal matched) and `exp` (its expansion: rule
 * references at the top replaced by each alternative until a terminal or
 * the empty stack is on top).  A return position is pushed only when the
 * reference is not the last element of its alternative, so right recursion
 * (x*, x+) keeps stacks flat and the same few frames recur.
 *
 * Sets.  The state of a match is a set of stacks plus the bytes of a
 * character not finished yet (tokens often end inside a UTF-8 sequence; the
 * bytes seen so far narrow the character to a range of code points, which
 * the stacks' terminals must meet).  Sets are interned too, and each gets a
 * transition table by byte filled on demand: a lazily built DFA.  Inside a
 * JSON string the set after a character is the set before it, so walking a
 * token is a table lookup per byte once the table is warm.
 *
 * Masks.  The vocabulary trie (vocab.c) is walked depth first, one set per
 * depth; a byte leading to the empty set skips the node's subtree, and a
 * token is allowed when its node is reached.  A mask is cached per set (the
 * sets a generation visits recur: inside strings, between list items), so
 * the full walk is paid once per set, and grammar_match_allows answers from
 * the cached mask or by walking only that token's bytes.
 *
 * Bounds: a step keeps at most GRAMMAR_MAX_STACKS stacks, a match at most
 * MAX_FRAMES frames and MAX_SETS sets; beyond them the call fails with
 * RC_ELIMIT and a message instead of eating memory or time (a grammar can be
 * exponentially ambiguous).  Transition tables and masks are caches with
 * fixed budgets, dropped and rebuilt when full.
 */
#include "grammar/grammar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"

#define UNSET        UINT32_MAX
#define DEAD         (UINT32_MAX - 1)  /* the empty set: nothing matches */
#define VAL_ANY      UINT32_MAX        /* partial.val: any character of the prefix will do */
#define MAX_FRAMES   (1u << 21)
#define MAX_POOL     (1u << 24)        /* expansion list entries of all frames */
#define MAX_SETS     (1u << 18)
#define MAX_ITEMS    (1u << 24)        /* frame ids in all sets */
#define MAX_TABLES   1024              /* transition tables kept (1 KiB each) */
#define MAX_CTABLES  8192              /* those of sets inside a character (256 B each) */
#define CACHE_BYTES  ((size_t)4 << 20) /* masks kept, at most MAX_SLOTS */
#define MAX_SLOTS    256

typedef struct {
    uint32_t pos, parent;
    uint32_t next;               /* UNSET until computed */
    uint32_t exp_off, exp_n;     /* exp_n UNSET until computed */
    uint32_t stamp, vis;
} frame;

/* The bytes of an unfinished character: value so far, continuation bytes
 * still expected (0: none pending), total length, for the overlong check. */
typedef struct {
    uint32_t val;
    uint8_t need, len;
} partial;

/* A set of stacks (sorted frame ids) with the decoder state: one state of
 * the automaton a match runs. */
typedef struct {
    uint32_t off, n;             /* items[off .. off+n) */
    partial part;
    uint32_t hash;
    int32_t table;               /* transition table (256 set ids) or -1 */
    int32_t slot;                /* mask cache slot or -1 */
} fset;

struct grammar_match {
    const grammar *g;
    const grammar_vocab *v;
    frame *fr;      size_t n_fr, cap_fr;
    uint32_t *hash; size_t hash_cap;             /* (pos, parent) -> frame id + 1 */
    uint32_t *pool; size_t n_pool, cap_pool;     /* expansion lists */
    fset *sets;     size_t n_sets, cap_sets;
    uint32_t *items; size_t n_items, cap_items;
    uint32_t *shash; size_t shash_cap;           /* set contents -> set id + 1 */
    uint32_t *tables; size_t n_tables;           /* MAX_TABLES x 256, made on first use */
    uint32_t *ctables; size_t n_ctables;         /* MAX_CTABLES x 64, likewise */
    uint32_t start, cur;                         /* sets */
    bool ended;                                  /* an end-of-generation token was accepted */
    uint32_t epoch;
    uint32_t *scr;  size_t cap_scr;              /* one step's output */
    uint32_t *work; size_t cap_work;             /* expansion work list */
    uint64_t *slots; uint32_t *slot_owner; size_t n_slots, next_slot, words;
    uint64_t *bits;                              /* the mask being applied */
    uint32_t *d_set;                             /* trie walk: the set at each depth */
};

/* ---- frames ----------------------------------------------------------------- */

static uint64_t fr_hash(uint32_t pos, uint32_t parent)
{
    uint64_t h = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = rc_realloc(*p, c * elem);
    if (!q) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    *p = q;
    *cap = c;
    return 0;
}

static int hash_insert(grammar_match *m, uint32_t id)
{
    size_t mask = m->hash_cap - 1, j = fr_hash(m->fr[id].pos, m->fr[id].parent) & mask;
    while (m->hash[j]) j = (j + 1) & mask;
    m->hash[j] = id + 1;
    return 0;
}

/* The id of frame (pos, parent), made on first use. */
static int intern(grammar_match *m, uint32_t pos, uint32_t parent, uint32_t *out)
{
    size_t mask = m->hash_cap - 1, j = fr_hash(pos, parent) & mask;
    for (uint32_t h; (h = m->hash[j]); j = (j + 1) & mask) {
        if (m->fr[h - 1].pos == pos && m->fr[h - 1].parent == parent) {
            *out = h - 1;
            return 0;
        }
    }
    if (m->n_fr >= MAX_FRAMES)
        return rc_fail(RC_ELIMIT, "grammar match: more than %u parse states (the grammar "
                       "nests or branches too much for this output)", MAX_FRAMES);
    int rc = grow((void **)&m->fr, &m->cap_fr, m->n_fr + 1, sizeof *m->fr);
    if (rc) return rc;
    uint32_t id = (uint32_t)m->n_fr++;
    m->fr[id] = (frame){ pos, parent, UNSET, 0, UNSET, 0, 0 };
    if ((m->n_fr + 1) * 2 > m->hash_cap) {
        size_t cap = m->hash_cap * 2;
        uint32_t *h = rc_calloc(cap, sizeof *h);
        if (!h) { m->n_fr--; return rc_fail(RC_ENOMEM, "grammar match: out of memory"); }
        rc_free(m->hash);
        m->hash = h;
        m->hash_cap = cap;
        for (uint32_t i = 1; i < m->n_fr; i++) hash_insert(m, i);
    } else {
        m->hash[j] = id + 1;
    }
    *out = id;
    return 0;
}

/* A fresh stamp for deduplicating a set; on wrap-around every frame's
 * stamps are cleared so an old stamp cannot look current. */
static uint32_t next_epoch(grammar_match *m)
{
    if (++m->epoch == UINT32_MAX) {
        for (size_t i = 0; i < m->n_fr; i++) m->fr[i].stamp = m->fr[i].vis = 0;
        m->epoch = 1;
    }
    return m->epoch;
}

/* The raw stack after the top terminal of f matched. */
static int frame_next(grammar_match *m, uint32_t f, uint32_t *out)
{
    if (m->fr[f].next != UNSET) { *out = m->fr[f].next; return 0; }
    uint32_t pos = m->fr[f].pos + 1, parent = m->fr[f].parent, nx = parent;
    if (m->g->els[pos].type != GE_END) {
        int rc = intern(m, pos, parent, &nx);
        if (rc) return rc;
    }
    m->fr[f].next = nx;
    *out = nx;
    return 0;
}

/* Memoizes in f the canonical stacks f expands to (terminal on top, or 0). */
static int frame_expand(grammar_match *m, uint32_t f)
{
    if (m->fr[f].exp_n != UNSET) return 0;
    const grammar *g = m->g;
    uint32_t ep = next_epoch(m);
    size_t n_work = 0, start = m->n_pool, steps = 0;
    int rc = grow((void **)&m->work, &m->cap_work, 1, sizeof *m->work);
    if (rc) return rc;
    m->work[n_work++] = f;
    while (n_work) {
        uint32_t w = m->work[--n_work];
        if (m->fr[w].vis == ep) continue;
        m->fr[w].vis = ep;
        if (++steps > (size_t)GRAMMAR_MAX_STACKS * 16)
            return rc_fail(RC_ELIMIT, "grammar too ambiguous: expanding one position visits "
                           "more than %u states", GRAMMAR_MAX_STACKS * 16);
        const grammar__el *e = w ? &g->els[m->fr[w].pos] : NULL;
        if (!e || e->type == GE_CHAR || e->type == GE_CLASS) {
            if (m->n_pool - start >= GRAMMAR_MAX_STACKS)
                return rc_fail(RC_ELIMIT, "grammar too ambiguous: more than "
                               "GRAMMAR_MAX_STACKS (%u) parse stacks at one position",
                               GRAMMAR_MAX_STACKS);
            if (m->n_pool >= MAX_POOL)
                return rc_fail(RC_ELIMIT, "grammar match: more than %u stored parse states",
                               MAX_POOL);
            if ((rc = grow((void **)&m->pool, &m->cap_pool, m->n_pool + 1, sizeof *m->pool)))
                return rc;
            m->pool[m->n_pool++] = w;
            continue;
        }
        /* A reference: continue with each alternative, then where w goes on. */
        uint32_t pos = m->fr[w].pos, cont = m->fr[w].parent;
        if (g->els[pos + 1].type != GE_END && (rc = intern(m, pos + 1, cont, &cont)))
            return rc;
        const grammar__rule *r = &g->rules[e->arg];
        if ((rc = grow((void **)&m->work, &m->cap_work, n_work + r->n_alts, sizeof *m->work)))
            return rc;
        for (uint32_t a = r->n_alts; a-- > 0;) {
            uint32_t at = g->alts[r->alt_off + a], s = cont;
            if (g->els[at].type != GE_END && (rc = intern(m, at, cont, &s))) return rc;
            m->work[n_work++] = s;
        }
    }
    m->fr[f].exp_off = (uint32_t)start;
    m->fr[f].exp_n = (uint32_t)(m->n_pool - start);
    return 0;
}

/* ---- stepping a set by one byte ------------------------------------------------ */

/* Advances the UTF-8 decoder by byte b: 1 and *cp when a character is
 * complete, 0 when more bytes are needed, -1 when b cannot come here. */
static int utf8_step(partial *p, uint8_t b, uint32_t *cp)
{
    if (p->need == 0) {
        if (b < 0x80) { *cp = b; return 1; }
        if (b >= 0xC2 && b <= 0xDF) *p = (partial){ b & 0x1Fu, 1, 2 };
        else if (b >= 0xE0 && b <= 0xEF) *p = (partial){ b & 0x0Fu, 2, 3 };
        else if (b >= 0xF0 && b <= 0xF4) *p = (partial){ b & 0x07u, 3, 4 };
        else return -1;
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    if (p->val == VAL_ANY) {            /* see step_frames: need is 1 here */
        *cp = VAL_ANY;
        *p = (partial){ 0, 0, 0 };
        return 1;
    }
    p->val = p->val << 6 | (b & 0x3Fu);
    if (--p->need) {
        /* reject overlong 3/4-byte forms, surrogates and > U+10FFFF as early as
         * their second byte shows them */
        if (p->len == 3 && p->need == 1 && (p->val < 0x20 || (p->val >= 0x360 && p->val < 0x380)))
            return -1;
        if (p->len == 4 && p->need == 2 && (p->val < 0x10 || p->val > 0x10F)) return -1;
        return 0;
    }
    *cp = p->val;
    *p = (partial){ 0, 0, 0 };
    return 1;
}

/* The frames of in[0..n_in) after byte b, written to m->scr[0 .. *out_n)
 * (deduplicated, unsorted); *p is the decoder state before (updated). */
static int step_frames(grammar_match *m, const uint32_t *in, size_t n_in, partial *p, uint8_t b,
                       size_t *out_n)
{
    uint32_t cp = 0;
    int st = utf8_step(p, b, &cp);
    *out_n = 0;
    if (st < 0) return 0;
    const grammar *g = m->g;
    size_t n = 0;
    int rc;
    if (st == 0) {
        uint32_t sh = 6u * p->need, lo = p->val << sh, hi = lo | ((1u << sh) - 1);
        /* a lead byte alone says only the length: its characters start at
         * U+0080, U+0800 or U+10000 (E0's are not U+0000..U+0FFF) */
        uint32_t first = p->len == 2 ? 0x80u : p->len == 3 ? 0x800u : 0x10000u;
        if (lo < first)
            lo = first;
        if ((rc = grow((void **)&m->scr, &m->cap_scr, n_in, sizeof *m->scr))) return rc;
        bool covers = p->need == 1;
        for (size_t i = 0; i < n_in; i++) {
            uint32_t f = in[i];
            if (!f) continue;
            const grammar__el *e = &g->els[m->fr[f].pos];
            if (!grammar__term_meets(g, e, lo, hi)) continue;
            m->scr[n++] = f;
            covers = covers && grammar__term_covers(g, e, lo, hi);
        }
        /* One byte to go and every stack takes any character it can end in
         * (inside a string, say): which character it is no longer matters,
         * so all such prefixes share one set instead of one each. */
        if (covers && n) p->val = VAL_ANY;
        *out_n = n;
        return 0;
    }
    uint32_t ep = next_epoch(m);
    for (size_t i = 0; i < n_in; i++) {
        uint32_t f = in[i];
        if (!f || (cp != VAL_ANY && !grammar__term_has(g, &g->els[m->fr[f].pos], cp))) continue;
        uint32_t nx;
        if ((rc = frame_next(m, f, &nx)) || (rc = frame_expand(m, nx))) return rc;
        uint32_t eo = m->fr[nx].exp_off, en = m->fr[nx].exp_n;
        if ((rc = grow((void **)&m->scr, &m->cap_scr, n + en, sizeof *m->scr))) return rc;
        for (uint32_t k = 0; k < en; k++) {
            uint32_t s = m->pool[eo + k];
            if (m->fr[s].stamp == ep) continue;
            m->fr[s].stamp = ep;
            m->scr[n++] = s;
        }
        if (n > GRAMMAR_MAX_STACKS)
            return rc_fail(RC_ELIMIT, "grammar too ambiguous: more than GRAMMAR_MAX_STACKS "
                           "(%u) parse stacks at once", GRAMMAR_MAX_STACKS);
    }
    *out_n = n;
    return 0;
}

/* ---- sets: the states of a lazily built automaton --------------------------------- */

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t set_hash(const uint32_t *v, size_t n, partial p)
{
    uint64_t h = 1469598103934665603ull ^ p.val ^ ((uint64_t)p.need << 40 | (uint64_t)p.len << 48);
    for (size_t i = 0; i < n; i++) h = (h ^ v[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

/* The id of the set v[0..n) (sorted here) with decoder state p. */
static int set_intern(grammar_match *m, uint32_t *v, size_t n, partial p, uint32_t *out)
{
    if (n < 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
                uint32_t t = v[j]; v[j] = v[j - 1]; v[j - 1] = t;
            }
    } else {
        qsort(v, n, sizeof *v, u32_cmp);
    }
    uint64_t h = set_hash(v, n, p);
    size_t mask = m->shash_cap - 1, j = h & mask;
    for (uint32_t e; (e = m->shash[j]); j = (j + 1) & mask) {
        const fset *s = &m->sets[e - 1];
        if (s->hash == (uint32_t)h && s->n == n && s->part.val == p.val &&
            s->part.need == p.need && s->part.len == p.len &&
            !memcmp(m->items + s->off, v, n * sizeof *v)) {
            *out = e - 1;
            return 0;
        }
    }
    if (m->n_sets >= MAX_SETS || m->n_items + n > MAX_ITEMS)
        return rc_fail(RC_ELIMIT, "grammar match: more than %u sets of parse states (the "
                       "grammar branches too much for this output)", MAX_SETS);
    int rc;
    if ((rc = grow((void **)&m->sets, &m->cap_sets, m->n_sets + 1, sizeof *m->sets)) ||
        (rc = grow((void **)&m->items, &m->cap_items, m->n_items + n, sizeof *m->items)))
        return rc;
    if ((m->n_sets + 1) * 2 > m->shash_cap) {
        size_t cap = m->shash_cap * 2;
        uint32_t *t = rc_calloc(cap, sizeof *t);
        if (!t) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
        for (size_t i = 0; i < m->n_sets; i++) {
            size_t k = m->sets[i].hash & (cap - 1);
            while (t[k]) k = (k + 1) & (cap - 1);
            t[k] = (uint32_t)i + 1;
        }
        rc_free(m->shash);
        m->shash = t;
        m->shash_cap = cap;
        mask = cap - 1;
        for (j = h & mask; m->shash[j]; j = (j + 1) & mask) {}
    }
    uint32_t id = (uint32_t)m->n_sets++;
    if (n) memcpy(m->items + m->n_items, v, n * sizeof *v);
    m->sets[id] = (fset){ (uint32_t)m->n_items, (uint32_t)n, p, (uint32_t)h, -1, -1 };
    m->n_items += n;
    m->shash[j] = id + 1;
    *out = id;
    return 0;
}

/* The transition entry of set s for byte b, or NULL when s has no table.
 * Sets in the middle of a character only take continuation bytes, so their
 * tables have 64 entries (0x80..0xBF); the others have 256. */
static inline uint32_t *set_entry(grammar_match *m, const fset *x, uint8_t b)
{
    if (x->table < 0) return NULL;
    if (!x->part.need) return m->tables + (size_t)x->table * 256 + b;
    return m->ctables + (size_t)x->table * 64 + (b & 0x3F);
}

/* The set after byte b from set s (DEAD when nothing matches), through s's
 * transition table; tables are made on demand and, past MAX_TABLES, all
 * dropped and rebuilt (they are only a cache). */
static int set_step(grammar_match *m, uint32_t s, uint8_t b, uint32_t *out)
{
    const fset *x = &m->sets[s];
    if (x->part.need && (b & 0xC0) != 0x80) { *out = DEAD; return 0; }
    uint32_t *e = set_entry(m, x, b);
    if (e && *e != UNSET) { *out = *e; return 0; }
    partial p = x->part;
    size_t n;
    /* step_frames reads the items while writing m->scr; the items move only
     * in set_intern, after the step */
    int rc = step_frames(m, m->items + x->off, x->n, &p, b, &n);
    if (rc) return rc;
    uint32_t r = DEAD;
    if (n && (rc = set_intern(m, m->scr, n, p, &r))) return rc;
    fset *y = &m->sets[s];        /* set_intern may have moved the sets */
    if (y->table < 0) {
        bool cont = y->part.need != 0;
        size_t *nt = cont ? &m->n_ctables : &m->n_tables;
        size_t max = cont ? MAX_CTABLES : MAX_TABLES, width = cont ? 64 : 256;
        uint32_t **tab = cont ? &m->ctables : &m->tables;
        if (*nt == max) {
            for (size_t i = 0; i < m->n_sets; i++)
                if ((m->sets[i].part.need != 0) == cont) m->sets[i].table = -1;
            *nt = 0;
        }
        if (!*tab) {
            *tab = rc_mallocarray(max * width, sizeof **tab);
            if (!*tab) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
        }
        y->table = (int32_t)(*nt)++;
        memset(*tab + (size_t)y->table * width, 0xFF, width * sizeof **tab);
    }
    *set_entry(m, y, b) = r;
    *out = r;
    return 0;
}

/* The set after bytes s[0..len) from the current set (DEAD if they do not match). */
static int walk(grammar_match *m, const uint8_t *s, size_t len, uint32_t *out)
{
    uint32_t cur = m->cur;
    for (size_t i = 0; i < len && cur != DEAD; i++) {
        int rc = set_step(m, cur, s[i], &cur);
        if (rc) return rc;
    }
    *out = cur;
    return 0;
}

/* ---- life cycle ------------------------------------------------------------------ */

static bool is_eog(const grammar_vocab *v, int32_t t)
{
    return (v->eog[t >> 6] >> (t & 63)) & 1;
}

/* The set where root starts. */
static int match_start(grammar_match *m)
{
    m->n_fr = 1;                       /* frame 0: the empty stack */
    m->fr[0] = (frame){ 0, 0, UNSET, 0, UNSET, 0, 0 };
    const grammar *g = m->g;
    const grammar__rule *r = &g->rules[g->root];
    size_t n = 0;
    int rc;
    for (uint32_t a = 0; a < r->n_alts; a++) {
        uint32_t at = g->alts[r->alt_off + a], s = 0;
        if (g->els[at].type != GE_END && (rc = intern(m, at, 0, &s))) return rc;
        if ((rc = frame_expand(m, s))) return rc;
        uint32_t eo = m->fr[s].exp_off, en = m->fr[s].exp_n;
        if ((rc = grow((void **)&m->scr, &m->cap_scr, n + en, sizeof *m->scr))) return rc;
        for (uint32_t k = 0; k < en; k++) {
            uint32_t x = m->pool[eo + k];
            if (m->fr[x].stamp == UINT32_MAX) continue;   /* already in the set */
            m->fr[x].stamp = UINT32_MAX;
            m->scr[n++] = x;
        }
        if (n > GRAMMAR_MAX_STACKS)
            return rc_fail(RC_ELIMIT, "grammar too ambiguous: more than GRAMMAR_MAX_STACKS "
                           "(%u) parse stacks at the start", GRAMMAR_MAX_STACKS);
    }
    for (size_t i = 0; i < n; i++) m->fr[m->scr[i]].stamp = 0;
    if ((rc = set_intern(m, m->scr, n, (partial){ 0, 0, 0 }, &m->start))) return rc;
    m->cur = m->start;
    return 0;
}

void grammar_match_free(grammar_match *m)
{
    if (!m) return;
    rc_free(m->fr);
    rc_free(m->hash);
    rc_free(m->pool);
    rc_free(m->sets);
    rc_free(m->items);
    rc_free(m->shash);
    rc_free(m->tables);
    rc_free(m->ctables);
    rc_free(m->scr);
    rc_free(m->work);
    rc_free(m->slots);
    rc_free(m->slot_owner);
    rc_free(m->bits);
    rc_free(m->d_set);
    rc_free(m);
}

static grammar_match *match_alloc(const grammar *g, const grammar_vocab *v)
{
    grammar_match *m = rc_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    m->v = v;
    m->words = ((size_t)v->n_vocab + 63) / 64;
    m->n_slots = CACHE_BYTES / (m->words ? m->words * 8 : 8);
    if (m->n_slots > MAX_SLOTS) m->n_slots = MAX_SLOTS;
    if (m->n_slots < 4) m->n_slots = 4;
    m->cap_fr = 1024;
    m->hash_cap = 4096;
    m->shash_cap = 1024;
    m->fr = rc_mallocarray(m->cap_fr, sizeof *m->fr);
    m->hash = rc_calloc(m->hash_cap, sizeof *m->hash);
    m->shash = rc_calloc(m->shash_cap, sizeof *m->shash);
    m->bits = rc_calloc(m->words ? m->words : 1, sizeof *m->bits);
    m->slot_owner = rc_mallocarray(m->n_slots, sizeof *m->slot_owner);
    m->d_set = rc_mallocarray((size_t)v->max_depth + 1, sizeof *m->d_set);
    if (!m->fr || !m->hash || !m->shash || !m->bits || !m->slot_owner || !m->d_set) {
        grammar_match_free(m);
        return NULL;
    }
    for (size_t i = 0; i < m->n_slots; i++) m->slot_owner[i] = UNSET;
    return m;
}

int grammar_match_new(const grammar *g, const grammar_vocab *v, grammar_match **out)
{
    *out = NULL;
    if (!g || !v) return rc_fail(RC_EINVAL, "grammar match: no grammar or vocabulary");
    grammar_match *m = match_alloc(g, v);
    if (!m) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    int rc = match_start(m);
    if (rc) {
        grammar_match_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void grammar_match_reset(grammar_match *m)
{
    /* frames, sets and caches stay: they describe the grammar, not the text */
    m->cur = m->start;
    m->ended = false;
}

/* dst[0..n) = src[0..n) into a fresh allocation (n may be 0). */
static int dup_array(void **dst, size_t *cap, const void *src, size_t n, size_t elem)
{
    size_t c = n ? n : 1;
    void *p = rc_mallocarray(c, elem);
    if (!p) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    if (n) memcpy(p, src, n * elem);
    rc_free(*dst);
    *dst = p;
    if (cap) *cap = c;
    return 0;
}

int grammar_match_clone(const grammar_match *m, grammar_match **out)
{
    *out = NULL;
    grammar_match *c = match_alloc(m->g, m->v);
    if (!c) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    /* Frames and sets are copied wholesale (ids stay valid); the transition
     * tables and masks are caches and are rebuilt on demand. */
    int rc;
    if ((rc = dup_array((void **)&c->fr, &c->cap_fr, m->fr, m->n_fr, sizeof *c->fr)) ||
        (rc = dup_array((void **)&c->hash, NULL, m->hash, m->hash_cap, sizeof *c->hash)) ||
        (rc = dup_array((void **)&c->pool, &c->cap_pool, m->pool, m->n_pool, sizeof *c->pool)) ||
        (rc = dup_array((void **)&c->sets, &c->cap_sets, m->sets, m->n_sets, sizeof *c->sets)) ||
        (rc = dup_array((void **)&c->items, &c->cap_items, m->items, m->n_items,
                        sizeof *c->items)) ||
        (rc = dup_array((void **)&c->shash, NULL, m->shash, m->shash_cap, sizeof *c->shash))) {
        grammar_match_free(c);
        return rc;
    }
    c->n_fr = m->n_fr;
    c->hash_cap = m->hash_cap;
    c->n_pool = m->n_pool;
    c->n_sets = m->n_sets;
    c->n_items = m->n_items;
    c->shash_cap = m->shash_cap;
    for (size_t i = 0; i < c->n_sets; i++) c->sets[i].table = c->sets[i].slot = -1;
    c->start = m->start;
    c->cur = m->cur;
    c->ended = m->ended;
    c->epoch = m->epoch;
    *out = c;
    return 0;
}

/* ---- queries and steps ----------------------------------------------------------- */

/* Frame ids are sorted in a set, so the empty stack (0) comes first. */
static bool set_has_end(const grammar_match *m, uint32_t s)
{
    const fset *x = &m->sets[s];
    return x->part.need == 0 && x->n && m->items[x->off] == 0;
}

bool grammar_match_can_end(const grammar_match *m)
{
    return m->ended || set_has_end(m, m->cur);
}

bool grammar_match_must_end(const grammar_match *m)
{
    return m->ended || (set_has_end(m, m->cur) && m->sets[m->cur].n == 1);
}

int grammar_match_accept_text(grammar_match *m, const char *s, size_t n)
{
    if (m->ended)
        return rc_fail(RC_EINVAL, "grammar: text after the end of generation");
    uint32_t r;
    int rc = walk(m, (const uint8_t *)s, n, &r);
    if (rc) return rc;
    if (r == DEAD) return rc_fail(RC_EINVAL, "grammar: the text does not match the grammar here");
    m->cur = r;
    return 0;
}

int grammar_match_accept(grammar_match *m, int32_t token)
{
    const grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_vocab)
        return rc_fail(RC_EINVAL, "grammar: token %d outside the vocabulary", (int)token);
    if (m->ended && !is_eog(v, token))
        return rc_fail(RC_EINVAL, "grammar: token %d after the end of generation", (int)token);
    if (is_eog(v, token)) {
        if (!grammar_match_can_end(m))
            return rc_fail(RC_EINVAL, "grammar: end of generation before the grammar is "
                           "complete");
        m->ended = true;
        return 0;
    }
    uint32_t o = v->piece_off[token], len = v->piece_off[token + 1] - o, r;
    if (!len) return rc_fail(RC_EINVAL, "grammar: token %d has no text", (int)token);
    int rc = walk(m, v->bytes + o, len, &r);
    if (rc) return rc;
    if (r == DEAD)
        return rc_fail(RC_EINVAL, "grammar: token %d does not match the grammar here", (int)token);
    m->cur = r;
    return 0;
}

bool grammar_match_allows(grammar_match *m, int32_t token)
{
    const grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_vocab) return false;
    if (is_eog(v, token)) return grammar_match_can_end(m);
    if (m->ended) return false;
    uint32_t o = v->piece_off[token], len = v->piece_off[token + 1] - o, r;
    if (!len) return false;
    int32_t sl = m->sets[m->cur].slot;
    if (sl >= 0)
        return (m->slots[(size_t)sl * m->words + ((uint32_t)token >> 6)] >> (token & 63)) & 1;
    return walk(m, v->bytes + o, len, &r) == 0 && r != DEAD;
}

/* ---- masks ----------------------------------------------------------------------- */

/* Sets in bits every token set s accepts: a depth-first walk of the trie in
 * preorder, with the set reached at each depth in d_set. */
static int trie_walk(grammar_match *m, uint32_t s, uint64_t *bits)
{
    const grammar_vocab *v = m->v;
    const grammar__node *nodes = v->nodes;
    const int32_t *tok_ids = v->tok_ids;
    uint32_t *d_set = m->d_set;
    /* kept in locals: the stores to bits could alias them otherwise; set_step
     * may move sets and tables, so they are loaded again after it */
    const fset *sets = m->sets;
    const uint32_t *tables = m->tables;
    size_t n_nodes = v->n_nodes, i = 1;
    d_set[0] = s;
    while (i < n_nodes) {
        const grammar__node *nd = &nodes[i];
        const fset *x = &sets[d_set[nd->depth - 1]];
        uint32_t to;
        if (x->table >= 0 && !x->part.need &&
            (to = tables[(size_t)x->table * 256 + nd->byte]) != UNSET) {
            /* the common case, inline */
        } else {
            int rc = set_step(m, d_set[nd->depth - 1], nd->byte, &to);
            if (rc) return rc;
            sets = m->sets;
            tables = m->tables;
        }
        if (to == DEAD) { i = nd->skip; continue; }
        for (uint32_t k = 0; k < nd->n_tok; k++) {
            uint32_t tok = (uint32_t)tok_ids[nd->tok_off + k];
            bits[tok >> 6] |= 1ull << (tok & 63);
        }
        d_set[nd->depth] = to;
        i++;
    }
    return 0;
}

/* The cache slot holding set s's mask, computed on first use. */
static int set_mask(grammar_match *m, uint32_t s, const uint64_t **out)
{
    if (!m->slots) {    /* made on first use: clones and matches that only ask allows() skip it */
        m->slots = rc_mallocarray(m->n_slots * (m->words ? m->words : 1), sizeof *m->slots);
        if (!m->slots) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    }
    int32_t sl = m->sets[s].slot;
    if (sl < 0) {
        sl = (int32_t)m->next_slot;
        m->next_slot = (m->next_slot + 1) % m->n_slots;
        if (m->slot_owner[sl] != UNSET) m->sets[m->slot_owner[sl]].slot = -1;
        m->slot_owner[sl] = UNSET;
        uint64_t *bits = m->slots + (size_t)sl * m->words;
        memset(bits, 0, m->words * sizeof *bits);
        int rc = trie_walk(m, s, bits);
        if (rc) return rc;
        m->slot_owner[sl] = s;
        m->sets[s].slot = sl;
    }
    *out = m->slots + (size_t)sl * m->words;
    return 0;
}

int grammar_match_apply(grammar_match *m, float *logits)
{
    const grammar_vocab *v = m->v;
    uint64_t *bits = m->bits;
    if (m->ended) {
        memset(bits, 0, m->words * sizeof *bits);
    } else {
        const uint64_t *sb = NULL;
        int rc = set_mask(m, m->cur, &sb);
        if (rc) return rc;
        memcpy(bits, sb, m->words * sizeof *bits);
    }
    if (grammar_match_can_end(m))
        for (size_t w = 0; w < m->words; w++) bits[w] |= v->eog[w];
    for (size_t w = 0; w < m->words; w++) {
        uint64_t off = ~bits[w];
        if (w == m->words - 1 && v->n_vocab % 64) off &= (1ull << (v->n_vocab % 64)) - 1;
        while (off) {
            logits[w * 64 + (size_t)__builtin_ctzll(off)] = -INFINITY;
            off &= off - 1;
        }
    }
    return 0;
}
