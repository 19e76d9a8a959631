/* schema_util.c - see schema_util.h. */
#include "schema_util.h"
#include "test.h"
#include "model_util.h"
#include "base/err.h"
#include "base/mem.h"
#include "model/gguf.h"
#include "tensor/types.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

static gguf_file *file;   /* kept with tok for the walk's pieces (static: still reachable) */
static tokenizer *tok;
static grammar_vocab *vocab;

const grammar_vocab *test_schema_vocab(void)
{
    if (vocab)
        return vocab;
    CHECK_OK(gguf_open(test_make_model("tiny", TT_Q8_0, NULL), &file));
    CHECK_OK(tok_load(file, &tok));
    CHECK_OK(grammar_vocab_new(tok, &vocab));
    return vocab;
}

grammar *test_schema_compile(const char *gbnf)
{
    grammar *g;
    if (grammar_compile(gbnf, strlen(gbnf), &g))
        FAIL("the grammar does not compile: %s\n%s", rc_errmsg(), gbnf);
    return g;
}

bool test_schema_matches(const grammar *g, const char *doc)
{
    grammar_match *m;
    CHECK_OK(grammar_match_new(g, test_schema_vocab(), &m));
    bool ok = grammar_match_accept_text(m, doc, strlen(doc)) == 0 && grammar_match_can_end(m);
    grammar_match_free(m);
    return ok;
}

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Whether token id's piece is whole UTF-8 characters: the walk keeps to
 * those, so that what it checks is the grammar and not the engine's
 * handling of characters split over tokens (the engine's own tests). */
static bool whole_chars(int32_t id)
{
    char piece[256];
    int n = tok_piece(tok, id, true, piece, sizeof piece);
    size_t i = 0, len;
    while (n > 0 && i < (size_t)n) {
        if (utf8_check((const uint8_t *)piece + i, (size_t)n - i, &len) != UTF8_VALID)
            return false;
        i += len;
    }
    return n > 0;
}

/* Characters of the tool-call markers that the tiny vocabulary has no
 * whole token for (DeepSeek's): the walk writes them as text. */
static const char *const WIDE[] = { "\xef\xbd\x9c", "\xe2\x96\x81" };

static void append(char **out, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n + 1);
        *out = rc_realloc(*out, *cap);
        CHECK(*out);
    }
    memcpy(*out + *len, s, n);
    *len += n;
}

char *test_schema_walk(const grammar *g, uint64_t seed, int max_tokens)
{
    const grammar_vocab *v = test_schema_vocab();
    int n_vocab = grammar_vocab_n(v);
    float *logits = rc_calloc((size_t)n_vocab, sizeof *logits);
    int32_t *allowed = rc_calloc((size_t)n_vocab, sizeof *allowed);
    size_t cap = 4096, len = 0;
    char *out = rc_malloc(cap);
    grammar_match *m;
    CHECK(logits && allowed && out);
    CHECK_OK(grammar_match_new(g, v, &m));
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    bool done = false;
    for (int step = 0; step < max_tokens && !done; step++) {
        if (grammar_match_must_end(m) || (grammar_match_can_end(m) && next_rand(&s) % 4 == 0)) {
            done = true;
            break;
        }
        for (int i = 0; i < n_vocab; i++)
            logits[i] = 0;
        CHECK_OK(grammar_match_apply(m, logits));
        int n = 0;
        for (int i = 0; i < n_vocab; i++)
            if (logits[i] == 0 && !tok_is_eog(tok, i) && whole_chars(i))
                allowed[n++] = i;
        const char *text = NULL;
        for (size_t k = 0; n == 0 && !text && k < sizeof WIDE / sizeof WIDE[0]; k++) {
            grammar_match *c;
            CHECK_OK(grammar_match_clone(m, &c));
            if (grammar_match_accept_text(c, WIDE[k], strlen(WIDE[k])) == 0)
                text = WIDE[k];
            grammar_match_free(c);
        }
        if (text) {
            CHECK_OK(grammar_match_accept_text(m, text, strlen(text)));
            append(&out, &len, &cap, text, strlen(text));
            continue;
        }
        if (n == 0) {
            out[len] = '\0';
            if (!grammar_match_can_end(m))
                FAIL("no token may follow \"%s\" and the grammar cannot end there", out);
            done = true;
            break;
        }
        int32_t t = allowed[next_rand(&s) % (uint64_t)n];
        char piece[256];
        int pl = tok_piece(tok, t, true, piece, sizeof piece);
        CHECK(pl >= 0);
        CHECK_OK(grammar_match_accept(m, t));
        append(&out, &len, &cap, piece, (size_t)pl);
    }
    out[len] = '\0';
    grammar_match_free(m);
    rc_free(logits);
    rc_free(allowed);
    if (!done) {
        rc_free(out);
        return NULL;
    }
    return out;
}
