/* match.c - one sequence's position in a grammar, and the token masks.
 *
 * State: a set of parse stacks plus the bytes of a character not finished
 * yet (tokens often end inside a UTF-8 sequence; the bytes seen so far narrow
 * the character to a range of code points, which the stacks' terminals must
 * meet).  A stack is a chain of frames: frame (pos, parent) means "match the
 * element at pos, then go on with parent"; frame 0 is the empty stack (the
 * grammar is complete).  Frames are interned per match, so one id names one
 * stack, sets are deduplicated by id, and whatever is computed for a stack
 * is memoized on its frame:
 *   next    the stack after its top terminal matched (before expansion),
 *   exp     its expansion: rule references at the top replaced by every
 *           alternative until a terminal or the empty stack is on top,
 *   mask    the tokens that may follow it (a cache slot of n_vocab bits).
 * A return position is pushed only when the reference is not the last
 * element of its alternative, so right recursion (x*, x+) keeps stacks flat
 * and the same few frames recur token after token, which is what makes the
 * mask cache hit inside strings and lists.
 *
 * Masks: the vocabulary trie (vocab.c) is walked depth first with the set of
 * states at each depth; a byte no state accepts skips the node's subtree,
 * and a token is allowed when its node is reached with a non-empty set.
 * Masks are computed per stack and cached, and a match's mask is the union
 * over its stacks (acceptance is "some stack accepts").
 *
 * Bounds: a step keeps at most GRAMMAR_MAX_STACKS stacks and a match at most
 * MAX_FRAMES frames; beyond them the call fails with RC_ELIMIT and a message
 * instead of eating memory or time (a grammar can be exponentially
 * ambiguous).
 */
#include "grammar/grammar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"

#define UNSET        UINT32_MAX
#define MAX_FRAMES   (1u << 21)
#define MAX_POOL     (1u << 24)      /* expansion list entries of all frames */
#define CACHE_BYTES  ((size_t)4 << 20)
#define MAX_SLOTS    256

typedef struct {
    uint32_t pos, parent;
    uint32_t next;               /* UNSET until computed */
    uint32_t exp_off, exp_n;     /* exp_n UNSET until computed */
    uint32_t stamp, vis;
    int32_t  slot;               /* mask cache slot or -1 */
} frame;

/* The bytes of an unfinished character: value so far, continuation bytes
 * still expected (0: none pending), total length, for the overlong check. */
typedef struct {
    uint32_t val;
    uint8_t need, len;
} partial;

struct grammar_match {
    const grammar *g;
    const grammar_vocab *v;
    frame *fr;      size_t n_fr, cap_fr;
    uint32_t *hash; size_t hash_cap;            /* (pos, parent) -> frame id + 1 */
    uint32_t *pool; size_t n_pool, cap_pool;     /* expansion lists */
    uint32_t *cur;  size_t n_cur, cap_cur;       /* the current set */
    partial part;
    bool ended;                                  /* an end-of-generation token was accepted */
    uint32_t epoch;
    uint32_t *scr;  size_t cap_scr;              /* sets of a walk, by depth */
    uint32_t *work; size_t cap_work;             /* expansion work list */
    uint64_t *slots; uint32_t *slot_owner; size_t n_slots, next_slot, words;
    uint64_t *bits;                              /* a mask being built */
    uint32_t *d_off, *d_n; partial *d_part;      /* per trie depth */
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
    m->fr[id] = (frame){ pos, parent, UNSET, 0, UNSET, 0, 0, -1 };
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

/* The set in[0..n) after byte b, appended to m->scr at *out_off (count in
 * *out_n); *p is the decoder state before (updated).  `in` may point into
 * m->scr, so it is given as an offset there when in_scr. */
static int step_set(grammar_match *m, const uint32_t *in_ext, size_t in_off, size_t n_in,
                    partial *p, uint8_t b, size_t out_off, size_t *out_n)
{
    uint32_t cp = 0;
    int st = utf8_step(p, b, &cp);
    *out_n = 0;
    if (st < 0) return 0;
    const grammar *g = m->g;
    uint32_t ep = next_epoch(m);
    size_t n = 0;
    int rc;
    if (st == 0) {
        uint32_t sh = 6u * p->need, lo = p->val << sh, hi = lo | ((1u << sh) - 1);
        if ((rc = grow((void **)&m->scr, &m->cap_scr, out_off + n_in, sizeof *m->scr))) return rc;
        const uint32_t *in = in_ext ? in_ext : m->scr + in_off;
        for (size_t i = 0; i < n_in; i++) {
            uint32_t f = in[i];
            if (f && grammar__term_meets(g, &g->els[m->fr[f].pos], lo, hi))
                m->scr[out_off + n++] = f;
        }
        *out_n = n;
        return 0;
    }
    for (size_t i = 0; i < n_in; i++) {
        uint32_t f = in_ext ? in_ext[i] : m->scr[in_off + i];
        if (!f || !grammar__term_has(g, &g->els[m->fr[f].pos], cp)) continue;
        uint32_t nx;
        if ((rc = frame_next(m, f, &nx)) || (rc = frame_expand(m, nx))) return rc;
        uint32_t eo = m->fr[nx].exp_off, en = m->fr[nx].exp_n;
        if ((rc = grow((void **)&m->scr, &m->cap_scr, out_off + n + en, sizeof *m->scr)))
            return rc;
        for (uint32_t k = 0; k < en; k++) {
            uint32_t s = m->pool[eo + k];
            if (m->fr[s].stamp == ep) continue;
            m->fr[s].stamp = ep;
            m->scr[out_off + n++] = s;
        }
        if (n > GRAMMAR_MAX_STACKS)
            return rc_fail(RC_ELIMIT, "grammar too ambiguous: more than GRAMMAR_MAX_STACKS "
                           "(%u) parse stacks at once", GRAMMAR_MAX_STACKS);
    }
    *out_n = n;
    return 0;
}

/* Walks bytes s[0..len) from the current set; the resulting set (empty when
 * the bytes do not match) is left at m->scr[0 .. *n) and *p is the decoder
 * state after them.  Each step writes its output after its input, which is
 * then moved to the front. */
static int walk(grammar_match *m, const uint8_t *s, size_t len, partial *p, size_t *n)
{
    *p = m->part;
    int rc;
    if (len == 0) {
        if ((rc = grow((void **)&m->scr, &m->cap_scr, m->n_cur, sizeof *m->scr))) return rc;
        memcpy(m->scr, m->cur, m->n_cur * sizeof *m->scr);
        *n = m->n_cur;
        return 0;
    }
    size_t n_out;
    if ((rc = step_set(m, m->cur, 0, m->n_cur, p, s[0], 0, &n_out))) return rc;
    for (size_t i = 1; i < len && n_out; i++) {
        size_t n_in = n_out;
        if ((rc = step_set(m, NULL, 0, n_in, p, s[i], n_in, &n_out))) return rc;
        memmove(m->scr, m->scr + n_in, n_out * sizeof *m->scr);
    }
    *n = n_out;
    return 0;
}

/* ---- life cycle ------------------------------------------------------------------ */

static bool is_eog(const grammar_vocab *v, int32_t t)
{
    return (v->eog[t >> 6] >> (t & 63)) & 1;
}

/* Sets the current set to the expansion of root. */
static int match_start(grammar_match *m)
{
    m->n_fr = 1;                       /* frame 0: the empty stack */
    m->fr[0] = (frame){ 0, 0, UNSET, 0, UNSET, 0, 0, -1 };
    memset(m->hash, 0, m->hash_cap * sizeof *m->hash);
    m->n_pool = 0;
    m->part = (partial){ 0, 0, 0 };
    m->ended = false;
    for (size_t i = 0; i < m->n_slots; i++) m->slot_owner[i] = UNSET;
    m->next_slot = 0;
    const grammar *g = m->g;
    const grammar__rule *r = &g->rules[g->root];
    m->n_cur = 0;
    for (uint32_t a = 0; a < r->n_alts; a++) {
        uint32_t at = g->alts[r->alt_off + a], s = 0;
        int rc;
        if (g->els[at].type != GE_END && (rc = intern(m, at, 0, &s))) return rc;
        if ((rc = frame_expand(m, s))) return rc;
        uint32_t eo = m->fr[s].exp_off, en = m->fr[s].exp_n;
        if ((rc = grow((void **)&m->cur, &m->cap_cur, m->n_cur + en, sizeof *m->cur))) return rc;
        for (uint32_t k = 0; k < en; k++) {
            uint32_t x = m->pool[eo + k];
            if (m->fr[x].stamp == UINT32_MAX) continue;   /* already in the set */
            m->fr[x].stamp = UINT32_MAX;
            m->cur[m->n_cur++] = x;
        }
        if (m->n_cur > GRAMMAR_MAX_STACKS)
            return rc_fail(RC_ELIMIT, "grammar too ambiguous: more than GRAMMAR_MAX_STACKS "
                           "(%u) parse stacks at the start", GRAMMAR_MAX_STACKS);
    }
    for (size_t i = 0; i < m->n_cur; i++) m->fr[m->cur[i]].stamp = 0;
    return 0;
}

void grammar_match_free(grammar_match *m)
{
    if (!m) return;
    rc_free(m->fr);
    rc_free(m->hash);
    rc_free(m->pool);
    rc_free(m->cur);
    rc_free(m->scr);
    rc_free(m->work);
    rc_free(m->slots);
    rc_free(m->slot_owner);
    rc_free(m->bits);
    rc_free(m->d_off);
    rc_free(m->d_n);
    rc_free(m->d_part);
    rc_free(m);
}

int grammar_match_new(const grammar *g, const grammar_vocab *v, grammar_match **out)
{
    *out = NULL;
    if (!g || !v) return rc_fail(RC_EINVAL, "grammar match: no grammar or vocabulary");
    grammar_match *m = rc_calloc(1, sizeof *m);
    if (!m) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    m->g = g;
    m->v = v;
    m->words = ((size_t)v->n_vocab + 63) / 64;
    size_t slot_bytes = m->words ? m->words * 8 : 8;
    m->n_slots = CACHE_BYTES / slot_bytes;
    if (m->n_slots > MAX_SLOTS) m->n_slots = MAX_SLOTS;
    if (m->n_slots < 4) m->n_slots = 4;
    m->cap_fr = 1024;
    m->hash_cap = 4096;
    m->fr = rc_mallocarray(m->cap_fr, sizeof *m->fr);
    m->hash = rc_calloc(m->hash_cap, sizeof *m->hash);
    m->bits = rc_calloc(m->words ? m->words : 1, sizeof *m->bits);
    m->slot_owner = rc_mallocarray(m->n_slots, sizeof *m->slot_owner);
    m->d_off = rc_mallocarray((size_t)v->max_depth + 1, sizeof *m->d_off);
    m->d_n = rc_mallocarray((size_t)v->max_depth + 1, sizeof *m->d_n);
    m->d_part = rc_mallocarray((size_t)v->max_depth + 1, sizeof *m->d_part);
    if (!m->fr || !m->hash || !m->bits || !m->slot_owner || !m->d_off ||
        !m->d_n || !m->d_part) {
        grammar_match_free(m);
        return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    }
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
    /* The start set was computed once already; doing it again cannot hit a
     * new limit, and memory only shrinks, so this cannot fail. */
    if (match_start(m)) m->n_cur = 0;
}

int grammar_match_clone(const grammar_match *m, grammar_match **out)
{
    *out = NULL;
    grammar_match *c;
    int rc = grammar_match_new(m->g, m->v, &c);
    if (rc) return rc;
    /* Copy the interned frames wholesale (ids stay valid); the cache is not
     * copied (it is rebuilt on demand). */
    if ((rc = grow((void **)&c->fr, &c->cap_fr, m->n_fr, sizeof *c->fr)) ||
        (rc = grow((void **)&c->pool, &c->cap_pool, m->n_pool, sizeof *c->pool)) ||
        (rc = grow((void **)&c->cur, &c->cap_cur, m->n_cur ? m->n_cur : 1, sizeof *c->cur)))
        goto fail;
    uint32_t *h = rc_mallocarray(m->hash_cap, sizeof *h);
    if (!h) { rc = rc_fail(RC_ENOMEM, "grammar match: out of memory"); goto fail; }
    memcpy(h, m->hash, m->hash_cap * sizeof *h);
    rc_free(c->hash);
    c->hash = h;
    c->hash_cap = m->hash_cap;
    memcpy(c->fr, m->fr, m->n_fr * sizeof *c->fr);
    c->n_fr = m->n_fr;
    for (size_t i = 0; i < c->n_fr; i++) c->fr[i].slot = -1;
    if (m->n_pool) memcpy(c->pool, m->pool, m->n_pool * sizeof *c->pool);
    c->n_pool = m->n_pool;
    if (m->n_cur) memcpy(c->cur, m->cur, m->n_cur * sizeof *c->cur);
    c->n_cur = m->n_cur;
    c->part = m->part;
    c->ended = m->ended;
    c->epoch = m->epoch;
    *out = c;
    return 0;
fail:
    grammar_match_free(c);
    return rc;
}

/* ---- queries and steps ----------------------------------------------------------- */

bool grammar_match_can_end(const grammar_match *m)
{
    if (m->ended) return true;
    if (m->part.need) return false;
    for (size_t i = 0; i < m->n_cur; i++)
        if (m->cur[i] == 0) return true;
    return false;
}

bool grammar_match_must_end(const grammar_match *m)
{
    return m->ended || (m->part.need == 0 && m->n_cur == 1 && m->cur[0] == 0) ||
           m->n_cur == 0;
}

static int commit(grammar_match *m, size_t n, partial p)
{
    int rc = grow((void **)&m->cur, &m->cap_cur, n, sizeof *m->cur);
    if (rc) return rc;
    memcpy(m->cur, m->scr, n * sizeof *m->cur);
    m->n_cur = n;
    m->part = p;
    return 0;
}

int grammar_match_accept_text(grammar_match *m, const char *s, size_t n)
{
    if (m->ended)
        return rc_fail(RC_EINVAL, "grammar: text after the end of generation");
    size_t cnt;
    partial p;
    int rc = walk(m, (const uint8_t *)s, n, &p, &cnt);
    if (rc) return rc;
    if (!cnt) return rc_fail(RC_EINVAL, "grammar: the text does not match the grammar here");
    return commit(m, cnt, p);
}

int grammar_match_accept(grammar_match *m, int32_t token)
{
    const grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_vocab)
        return rc_fail(RC_EINVAL, "grammar: token %d outside the vocabulary", (int)token);
    if (m->ended)
        return rc_fail(RC_EINVAL, "grammar: token %d after the end of generation", (int)token);
    if (is_eog(v, token)) {
        if (!grammar_match_can_end(m))
            return rc_fail(RC_EINVAL, "grammar: end of generation before the grammar is "
                           "complete");
        m->ended = true;
        return 0;
    }
    uint32_t o = v->piece_off[token], len = v->piece_off[token + 1] - o;
    if (!len) return rc_fail(RC_EINVAL, "grammar: token %d has no text", (int)token);
    size_t cnt;
    partial p;
    int rc = walk(m, v->bytes + o, len, &p, &cnt);
    if (rc) return rc;
    if (!cnt) return rc_fail(RC_EINVAL, "grammar: token %d does not match the grammar here",
                             (int)token);
    return commit(m, cnt, p);
}

bool grammar_match_allows(grammar_match *m, int32_t token)
{
    const grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_vocab || m->ended) return false;
    if (is_eog(v, token)) return grammar_match_can_end(m);
    uint32_t o = v->piece_off[token], len = v->piece_off[token + 1] - o;
    if (!len) return false;
    if (m->part.need == 0 && m->slots) {   /* every stack's mask cached: one bit each */
        bool all = true;
        for (size_t i = 0; i < m->n_cur && all; i++) {
            if (m->cur[i] == 0) continue;
            int32_t sl = m->fr[m->cur[i]].slot;
            if (sl < 0) { all = false; break; }
            if ((m->slots[(size_t)sl * m->words + ((uint32_t)token >> 6)] >> (token & 63)) & 1)
                return true;
        }
        if (all) return false;
    }
    size_t cnt;
    partial p;
    return walk(m, v->bytes + o, len, &p, &cnt) == 0 && cnt > 0;
}

/* ---- masks ----------------------------------------------------------------------- */

/* ORs into bits every token the set in[0..n) (decoder state p0) accepts:
 * a depth-first walk of the trie in preorder, with the surviving set of
 * each depth kept in m->scr at d_off[d]. */
static int trie_walk(grammar_match *m, const uint32_t *in, size_t n, partial p0, uint64_t *bits)
{
    const grammar_vocab *v = m->v;
    int rc = grow((void **)&m->scr, &m->cap_scr, n, sizeof *m->scr);
    if (rc) return rc;
    memcpy(m->scr, in, n * sizeof *m->scr);
    m->d_off[0] = 0;
    m->d_n[0] = (uint32_t)n;
    m->d_part[0] = p0;
    const grammar__node *nodes = v->nodes;
    size_t i = 1;
    while (i < v->n_nodes) {
        const grammar__node *nd = &nodes[i];
        uint32_t d = nd->depth;
        partial p = m->d_part[d - 1];
        size_t out_off = (size_t)m->d_off[d - 1] + m->d_n[d - 1], n_out;
        if ((rc = step_set(m, NULL, m->d_off[d - 1], m->d_n[d - 1], &p, nd->byte, out_off,
                           &n_out)))
            return rc;
        if (!n_out) { i = nd->skip; continue; }
        for (uint32_t k = 0; k < nd->n_tok; k++) {
            uint32_t t = (uint32_t)v->tok_ids[nd->tok_off + k];
            bits[t >> 6] |= 1ull << (t & 63);
        }
        m->d_off[d] = (uint32_t)out_off;
        m->d_n[d] = (uint32_t)n_out;
        m->d_part[d] = p;
        i++;
    }
    return 0;
}

/* The cache slot holding stack f's mask, computed on first use. */
static int frame_mask(grammar_match *m, uint32_t f, const uint64_t **out)
{
    int32_t sl = m->fr[f].slot;
    if (!m->slots) {    /* made on first use: clones and matches that only ask allows() skip it */
        m->slots = rc_mallocarray(m->n_slots * (m->words ? m->words : 1), sizeof *m->slots);
        if (!m->slots) return rc_fail(RC_ENOMEM, "grammar match: out of memory");
    }
    if (sl < 0) {
        sl = (int32_t)m->next_slot;
        m->next_slot = (m->next_slot + 1) % m->n_slots;
        if (m->slot_owner[sl] != UNSET) m->fr[m->slot_owner[sl]].slot = -1;
        m->slot_owner[sl] = UNSET;
        uint64_t *bits = m->slots + (size_t)sl * m->words;
        memset(bits, 0, m->words * sizeof *bits);
        int rc = trie_walk(m, &f, 1, (partial){ 0, 0, 0 }, bits);
        if (rc) return rc;
        m->slot_owner[sl] = f;
        m->fr[f].slot = sl;
    }
    *out = m->slots + (size_t)sl * m->words;
    return 0;
}

int grammar_match_apply(grammar_match *m, float *logits)
{
    const grammar_vocab *v = m->v;
    uint64_t *bits = m->bits;
    memset(bits, 0, m->words * sizeof *bits);
    int rc = 0;
    if (!m->ended) {
        if (m->part.need) {
            /* in the middle of a character: no cache (rare) */
            rc = trie_walk(m, m->cur, m->n_cur, m->part, bits);
        } else {
            for (size_t i = 0; i < m->n_cur && !rc; i++) {
                if (m->cur[i] == 0) continue;
                const uint64_t *fb = NULL;
                if (!(rc = frame_mask(m, m->cur[i], &fb)))
                    for (size_t w = 0; w < m->words; w++) bits[w] |= fb[w];
            }
        }
    }
    if (rc) return rc;
    if (grammar_match_can_end(m))
        for (size_t w = 0; w < m->words; w++) bits[w] |= v->eog[w];
    for (int32_t t = 0; t < v->n_vocab; t++)
        if (!((bits[t >> 6] >> (t & 63)) & 1)) logits[t] = -INFINITY;
    return 0;
}
