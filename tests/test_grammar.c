/* test_grammar.c - GBNF grammars (src/grammar/grammar.h): parsing, matching,
 * masks against a brute-force check of every token, hostile grammars.
 *
 * A small SentencePiece vocabulary is written in memory (byte tokens, so any
 * text can be spelled, and tokens that split characters or cross grammar
 * terminals), so the tests stand alone; the golden llama-bpe vocabulary
 * (128k tokens, ../shared/golden/tokenizer) adds a real-size check and is
 * skipped without it.  RACIMO_GRAMMAR_BENCH=1 makes grammar_mask_bench print
 * mask timings on that vocabulary (no timing is asserted).
 */
#include "test.h"

#include <time.h>

#include "base/err.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

/* ---- a test vocabulary ---------------------------------------------------------- */

typedef struct {
    uint8_t *buf;
    gguf_file *f;
    tokenizer *t;
    grammar_vocab *gv;
} vocab;

/* <unk> <s> </s>, byte tokens <0x00>..<0xFF> (ids 3..258), then these: */
static const char *const EXTRA[] = {
    "a", "b", "ab", "{", "}", "\"", "{\"", "\":", "\xE2\x96\x81", "\xE2\x96\x81\"", "true",
    "false", "null", ",", "[", "]", "\xC3\xA9", "\xF0\x9F\x98\x80", "x\"y", "<tool_call>",
    "0", "1", "12", "\"}", "\",\"", "\\", "\\n", "abc", "aaa", "\xC3\xA9t\xC3\xA9",
};
enum { V_BYTE0 = 3, V_EXTRA = 259, V_TOOL = V_EXTRA + 19, V_N = V_EXTRA + 30 };

static void open_vocab(vocab *v)
{
    static char bytes[256][8];
    const char *tokens[V_N];
    int32_t types[V_N];
    float scores[V_N];
    tokens[0] = "<unk>"; types[0] = 2;
    tokens[1] = "<s>"; types[1] = 3;
    tokens[2] = "</s>"; types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tokens[V_BYTE0 + b] = bytes[b];
        types[V_BYTE0 + b] = 6;
    }
    for (int i = 0; i < V_N - V_EXTRA; i++) {
        tokens[V_EXTRA + i] = EXTRA[i];
        types[V_EXTRA + i] = V_EXTRA + i == V_TOOL ? 3 : 1;
    }
    for (int i = 0; i < V_N; i++) scores[i] = -(float)i;
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, V_N));
    CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, V_N));
    CHECK_OK(gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, V_N));
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, NULL, NULL, &v->buf, &size));
    gguf_writer_free(w);
    CHECK_OK(gguf_parse(v->buf, size, "vocab.gguf", &v->f));
    CHECK_OK(tok_load(v->f, &v->t));
    CHECK_OK(grammar_vocab_new(v->t, &v->gv));
    CHECK_INT(grammar_vocab_n(v->gv), ==, V_N);
}

/* The golden llama-bpe vocabulary (Llama 3, 128256 tokens); false if absent. */
static bool open_golden(vocab *v)
{
    const char *g = test_golden_dir();
    if (!g) return false;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-llama-bpe.gguf", g);
    memset(v, 0, sizeof *v);
    if (gguf_open(path, &v->f)) return false;
    CHECK_OK(tok_load(v->f, &v->t));
    CHECK_OK(grammar_vocab_new(v->t, &v->gv));
    return true;
}

static void close_vocab(vocab *v)
{
    grammar_vocab_free(v->gv);
    tok_free(v->t);
    gguf_close(v->f);
    rc_free(v->buf);
}

static int32_t tok_id(const vocab *v, const char *piece)
{
    for (int i = 0; i < V_N - V_EXTRA; i++)
        if (!strcmp(EXTRA[i], piece)) return V_EXTRA + i;
    FAIL("no token \"%s\"", piece);
}

static grammar *compile(const char *text)
{
    grammar *g;
    int rc = grammar_compile(text, strlen(text), &g);
    if (rc) FAIL("grammar_compile(%s): %s", text, rc_errmsg());
    return g;
}

/* ---- parsing ---------------------------------------------------------------------- */

TEST(grammar_parse_constructs)
{
    static const char *const ok[] = {
        "root ::= \"a\"",
        "root ::= \"a\" \"b\"\n",
        "root ::= \"\\n\\r\\t\\\\\\\"\\[\\]\\x41\\u00e9\\U0001F600\"",
        "root ::= [a-z0-9_] [^\"\\\\] [\\x00-\\x1F] [ぁ-ゟ] [-a] [a-]",
        "root ::= ( \"a\" | \"b\" )* \"c\"+ \"d\"? \"e\"{2} \"f\"{2,} \"g\"{1,3} \"h\"{0,2}",
        "root ::= . .*",
        "# comment\nroot ::= item # trailing\n\nitem ::= \"x\" | \"y\"  # more\n",
        "root ::= (\n  \"a\"\n  | \"b\" # inside a group\n)\n",
        "root ::= \"a\" |\n  \"b\"",
        "root ::= | \"a\"",
        "root ::= r-1 r_2\nr-1 ::= \"1\"\nr_2 ::= \"2\"",
        "root ::= ws ( \"[\" ws ( [0-9]+ ( \",\" ws [0-9]+ )* )? \"]\" ) ws\nws ::= [ \\t\\n]*",
        "root ::= \"a\"{ 1 , 2 }",
        "root ::= []",
        "root ::= [^]",
        "root ::= \"\"",
        "\r\nroot ::= \"a\"\r\nb ::= \"b\"\r\n",
        "root ::= x\nx ::= \"(\" x \")\" | \"\"",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) grammar_free(compile(ok[i]));
}

TEST(grammar_parse_errors)
{
    static const struct { const char *text, *msg; } bad[] = {
        { "", "no 'root' rule" },
        { "item ::= \"a\"", "no 'root' rule" },
        { "root ::= \"a", "line 1 column 10: unterminated string" },
        { "root ::= [a-z", "line 1 column 10: unterminated character class" },
        { "root ::= [z-a]", "range end before its start" },
        { "root ::= \"\\q\"", "unknown escape" },
        { "root ::= \"\\x4\"", "needs 2 hex digits" },
        { "root ::= \"\\U00110000\"", "beyond U+10FFFF" },
        { "root ::= \"\xC3\"", "invalid UTF-8" },
        { "root ::= item", "line 1 column 10: undefined rule 'item'" },
        { "root ::= \"a\"\nroot ::= \"b\"", "line 2 column 1: rule 'root' defined twice" },
        { "root = \"a\"", "expected '::='" },
        { "::= \"a\"", "expected a rule name" },
        { "root ::= (\"a\"", "expected ')'" },
        { "root ::= \"a\")", "expected the end of the line" },
        { "root ::= * \"a\"", "nothing before it to repeat" },
        { "root ::= \"a\"{2,1}", "maximum below minimum" },
        { "root ::= \"a\"{x}", "expected a number" },
        { "root ::= \"a\"{1", "expected '}'" },
        { "root ::= \"a\"{10001}", "GRAMMAR_MAX_REPEAT" },
        { "root ::= root \"a\" | \"b\"", "left recursion: rule 'root'" },
        { "root ::= a\na ::= b \"x\"\nb ::= c\nc ::= \"\" a", "left recursion" },
        { "root ::= (\"a\"?)*", "match nothing" },
        { "root ::= e\ne ::= [0-9]? e \"+\"", "left recursion" },
        { "root ::= \"a\" \n \"b\"", "line 2 column 2: expected a rule name" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        grammar *g = (grammar *)1;
        rc_errclear();
        int rc = grammar_compile(bad[i].text, strlen(bad[i].text), &g);
        if (rc != RC_EINVAL || g)
            FAIL("\"%s\": returned %d, expected a refusal", bad[i].text, rc);
        if (!strstr(rc_errmsg(), bad[i].msg))
            FAIL("\"%s\": message \"%s\" lacks \"%s\"", bad[i].text, rc_errmsg(), bad[i].msg);
    }
}

/* Limits: each named in its message, each reached quickly. */
TEST(grammar_parse_limits)
{
    size_t cap = 200000, n = 0;
    char *s = malloc(cap);
    CHECK(s);
    grammar *g;
    /* alternatives */
    n = (size_t)snprintf(s, cap, "root ::= \"0\"");
    for (int i = 0; i < GRAMMAR_MAX_ALTS + 1; i++) n += (size_t)snprintf(s + n, cap - n, " | \"%d\"", i);
    CHECK_INT(grammar_compile(s, n, &g), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_ALTS"));
    /* nesting */
    n = (size_t)snprintf(s, cap, "root ::= ");
    for (int i = 0; i < GRAMMAR_MAX_NESTING + 1; i++) s[n++] = '(';
    s[n++] = '"'; s[n++] = 'a'; s[n++] = '"';
    for (int i = 0; i < GRAMMAR_MAX_NESTING + 1; i++) s[n++] = ')';
    CHECK_INT(grammar_compile(s, n, &g), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_NESTING"));
    /* nesting at the limit is fine */
    n = (size_t)snprintf(s, cap, "root ::= ");
    for (int i = 0; i < GRAMMAR_MAX_NESTING; i++) s[n++] = '(';
    s[n++] = '"'; s[n++] = 'a'; s[n++] = '"';
    for (int i = 0; i < GRAMMAR_MAX_NESTING; i++) s[n++] = ')';
    CHECK_OK(grammar_compile(s, n, &g));
    grammar_free(g);
    /* rules made by bounded repetitions */
    n = (size_t)snprintf(s, cap, "root ::= \"a\"{0,9000} \"b\"{0,9000} \"c\"{0,9000} "
                         "\"d\"{0,9000} \"e\"{0,9000} \"f\"{0,9000} \"g\"{0,9000} \"h\"{0,9000}");
    CHECK_INT(grammar_compile(s, n, &g), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_RULES"));
    /* compiled size: a long literal repeated */
    n = (size_t)snprintf(s, cap, "root ::= \"");
    for (int i = 0; i < 1000; i++) s[n++] = 'x';
    n += (size_t)snprintf(s + n, cap - n, "\"{2000}");
    CHECK_INT(grammar_compile(s, n, &g), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_ELEMENTS"));
    /* text size */
    char *big = calloc(GRAMMAR_MAX_TEXT + 1, 1);
    CHECK(big);
    CHECK_INT(grammar_compile(big, GRAMMAR_MAX_TEXT + 1, &g), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_TEXT"));
    free(big);
    free(s);
}

/* ---- matching --------------------------------------------------------------------- */

/* 1: the whole text matches (accepted, then can end); 0: accepted but
 * incomplete; -1: refused at some point. */
static int match_text(const vocab *v, const grammar *g, const char *text, size_t len)
{
    grammar_match *m;
    CHECK_OK(grammar_match_new(g, v->gv, &m));
    int r = grammar_match_accept_text(m, text, len) ? -1 : grammar_match_can_end(m) ? 1 : 0;
    grammar_match_free(m);
    return r;
}

TEST(grammar_match_strings)
{
    vocab v;
    open_vocab(&v);
    static const struct { const char *grammar, *text; int want; } cases[] = {
        { "root ::= \"ab\"", "ab", 1 },
        { "root ::= \"ab\"", "a", 0 },
        { "root ::= \"ab\"", "abc", -1 },
        { "root ::= \"ab\"", "b", -1 },
        { "root ::= [a-c]+", "abcabc", 1 },
        { "root ::= [a-c]+", "", 0 },
        { "root ::= [a-c]+", "abd", -1 },
        { "root ::= [^a-c]*", "xyz\xC3\xA9", 1 },
        { "root ::= [^a-c]*", "xa", -1 },
        { "root ::= \"a\"{2,3}", "a", 0 },
        { "root ::= \"a\"{2,3}", "aa", 1 },
        { "root ::= \"a\"{2,3}", "aaa", 1 },
        { "root ::= \"a\"{2,3}", "aaaa", -1 },
        { "root ::= \"a\"{2}", "aa", 1 },
        { "root ::= \"a\"{2,}", "aaaaaaa", 1 },
        { "root ::= \"a\"{0,2} \"b\"", "b", 1 },
        { "root ::= \"a\"{0,2} \"b\"", "aab", 1 },
        { "root ::= \"a\"{0,2} \"b\"", "aaab", -1 },
        { "root ::= (\"ab\" | \"a\" \"c\")? \"d\"", "acd", 1 },
        { "root ::= (\"ab\" | \"a\" \"c\")? \"d\"", "d", 1 },
        { "root ::= (\"ab\" | \"a\" \"c\")? \"d\"", "ad", -1 },
        { "root ::= . \"x\"", "\xF0\x9F\x98\x80x", 1 },
        { "root ::= . \"x\"", "\xF0\x9F\x98", 0 },
        { "root ::= [\\u00e0-\\u00ff]", "\xC3\xA9", 1 },
        { "root ::= [\\u00e0-\\u00ff]", "\xC3\x80", -1 },     /* U+00C0: below the range */
        { "root ::= [\\u00e0-\\u00ff]", "\xC4", -1 },         /* U+0100..: beyond it, known early */
        { "root ::= .", "\xC0\x80", -1 },                     /* overlong */
        { "root ::= .", "\xED\xA0\x80", -1 },                 /* surrogate */
        { "root ::= .", "\x80", -1 },                         /* stray continuation */
        { "root ::= [a-z\\u00e9]", "\xC3", 0 },              /* may become U+00E9 */
        { "root ::= [a-z\\u00e9]", "\xE0", -1 },             /* E0 starts U+0800.., not 'a' */
        { "root ::= [a-z\\u00e9]", "\xF0", -1 },
        { "root ::= x\nx ::= \"(\" x \")\" | \"\"", "((()))", 1 },
        { "root ::= x\nx ::= \"(\" x \")\" | \"\"", "(()", 0 },
        { "root ::= x\nx ::= \"(\" x \")\" | \"\"", "())", -1 },
        { "root ::= \"<tool_call>\" [a-z]+", "<tool_call>ab", 1 },
        { "root ::= | \"a\"", "", 1 },
        { "root ::= []", "a", -1 },
        { "root ::= [^]", "\xC3\xA9", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        grammar *g = compile(cases[i].grammar);
        int r = match_text(&v, g, cases[i].text, strlen(cases[i].text));
        if (r != cases[i].want)
            FAIL("%s on \"%s\": %d, expected %d", cases[i].grammar, cases[i].text, r,
                 cases[i].want);
        grammar_free(g);
    }
    close_vocab(&v);
}

/* Characters split across tokens (and across accept_text calls) match like
 * whole ones; the match refuses a wrong continuation and stays unchanged. */
TEST(grammar_match_split_utf8)
{
    vocab v;
    open_vocab(&v);
    grammar *g = compile("root ::= \"\xC3\xA9\" [\\U0001F600-\\U0001F64F] \"!\"");
    grammar_match *m;
    CHECK_OK(grammar_match_new(g, v.gv, &m));
    CHECK(grammar_match_allows(m, V_BYTE0 + 0xC3));
    CHECK(!grammar_match_allows(m, V_BYTE0 + 0xA9));
    CHECK(!grammar_match_allows(m, V_BYTE0 + 0xC4));
    CHECK(grammar_match_allows(m, tok_id(&v, "\xC3\xA9")));
    CHECK_OK(grammar_match_accept(m, V_BYTE0 + 0xC3));
    CHECK(!grammar_match_can_end(m));
    CHECK_INT(grammar_match_accept(m, V_BYTE0 + 0xA8), ==, RC_EINVAL);   /* è */
    CHECK_OK(grammar_match_accept(m, V_BYTE0 + 0xA9));
    CHECK(!grammar_match_allows(m, tok_id(&v, "\xC3\xA9")));
    CHECK(grammar_match_allows(m, tok_id(&v, "\xF0\x9F\x98\x80")));
    CHECK_OK(grammar_match_accept_text(m, "\xF0\x9F", 2));
    /* U+1F6xx would fit the prefix too; U+1F4xx does not */
    CHECK_INT(grammar_match_accept_text(m, "\x90", 1), ==, RC_EINVAL);
    CHECK_OK(grammar_match_accept_text(m, "\x98", 1));
    float logits[V_N];
    for (int i = 0; i < V_N; i++) logits[i] = 0;
    CHECK_OK(grammar_match_apply(m, logits));
    for (int i = 0; i < V_N; i++) {
        bool want = i >= V_BYTE0 + 0x80 && i <= V_BYTE0 + 0xBF;   /* U+1F600..U+1F63F */
        if ((logits[i] == 0) != want) FAIL("token %d: logit %g", i, logits[i]);
    }
    CHECK_OK(grammar_match_accept(m, V_BYTE0 + 0x80));
    CHECK(!grammar_match_can_end(m));
    CHECK(!grammar_match_allows(m, 2));                 /* </s> before the end */
    CHECK_OK(grammar_match_accept(m, V_BYTE0 + '!'));
    CHECK(grammar_match_can_end(m));
    CHECK(grammar_match_must_end(m));
    CHECK(grammar_match_allows(m, 2));
    CHECK_OK(grammar_match_accept(m, 2));
    CHECK(!grammar_match_allows(m, V_BYTE0 + '!'));
    CHECK_INT(grammar_match_accept(m, V_BYTE0 + '!'), ==, RC_EINVAL);
    grammar_match_reset(m);
    CHECK(!grammar_match_can_end(m));
    CHECK_OK(grammar_match_accept_text(m, "\xC3\xA9\xF0\x9F\x98\x81!", 7));
    CHECK(grammar_match_must_end(m));
    grammar_match_free(m);
    grammar_free(g);
    close_vocab(&v);
}

/* ---- masks against brute force ------------------------------------------------------- */

/* The mask of m equals, for every token, whether a fresh copy of m (no
 * cache) can accept it. */
static void check_mask(const grammar_vocab *gv, grammar_match *m, const char *where)
{
    int n = grammar_vocab_n(gv);
    float *logits = malloc((size_t)n * sizeof *logits);
    CHECK(logits);
    for (int i = 0; i < n; i++) logits[i] = 1.0f;
    CHECK_OK(grammar_match_apply(m, logits));
    grammar_match *c;
    CHECK_OK(grammar_match_clone(m, &c));
    for (int i = 0; i < n; i++) {
        /* c has no cached masks: allows() walks the token's bytes */
        bool brute = grammar_match_allows(c, i);
        if (i % 53 == 0) {
            grammar_match *t;
            CHECK_OK(grammar_match_clone(c, &t));
            if ((grammar_match_accept(t, i) == 0) != brute)
                FAIL("%s: token %d: accept and allows disagree", where, i);
            grammar_match_free(t);
        }
        bool masked = logits[i] == 1.0f;
        if (!masked && logits[i] != -INFINITY) FAIL("%s: token %d: logit %g", where, i, logits[i]);
        if (brute != masked) FAIL("%s: token %d: mask %d, brute force %d", where, i, masked, brute);
        if (grammar_match_allows(m, i) != brute)
            FAIL("%s: token %d: allows %d, brute force %d", where, i, !brute, brute);
    }
    grammar_match_free(c);
    free(logits);
}

#define JSON_GBNF \
    "root   ::= object\n" \
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n" \
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n" \
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n" \
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n" \
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n" \
    "ws     ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"

TEST(grammar_mask_small_vocab)
{
    vocab v;
    open_vocab(&v);
    static const char *const grammars[] = {
        JSON_GBNF,
        "root ::= \"<tool_call>\" \"{\" [a-z]* \"}\"",
        "root ::= [^\"]* \"\\\"\"",
        "root ::= (\"a\" | \"ab\" | \"abc\")+ \"!\"",
        "root ::= \"\xC3\xA9t\xC3\xA9\" | \"\xF0\x9F\x98\x80\"",
    };
    static const char *const texts[] = {
        "{\"ab\": [true, 12, \"x\xC3\xA9\\n\"], \"b\":{}}",
        "<tool_call>{abc}",
        "ab x\xC3\xA9\"",
        "ababcaaab!",
        "\xC3\xA9t\xC3\xA9",
    };
    for (size_t k = 0; k < sizeof grammars / sizeof grammars[0]; k++) {
        grammar *g = compile(grammars[k]);
        grammar_match *m;
        CHECK_OK(grammar_match_new(g, v.gv, &m));
        /* byte by byte: every position, including the middle of characters */
        const char *s = texts[k];
        for (size_t i = 0; ; i++) {
            char where[96];
            snprintf(where, sizeof where, "grammar %zu after %zu bytes", k, i);
            check_mask(v.gv, m, where);
            if (!s[i]) break;
            CHECK_OK(grammar_match_accept_text(m, s + i, 1));
        }
        CHECK(grammar_match_can_end(m));
        grammar_match_free(m);
        grammar_free(g);
    }
    /* a control token matches its text, and end of generation waits for the end */
    grammar *g = compile("root ::= \"<tool_call>\" \"a\"");
    grammar_match *m;
    CHECK_OK(grammar_match_new(g, v.gv, &m));
    CHECK(grammar_match_allows(m, V_TOOL));
    CHECK(!grammar_match_allows(m, 2));
    CHECK_OK(grammar_match_accept(m, V_TOOL));
    CHECK_OK(grammar_match_accept(m, tok_id(&v, "a")));
    CHECK(grammar_match_allows(m, 2));
    grammar_match_free(m);
    grammar_free(g);
    close_vocab(&v);
}

/* The 128k Llama 3 vocabulary: masks at every token boundary of a JSON text
 * equal the brute force over all tokens. */
TEST_T(grammar_mask_golden, 600)
{
    vocab v;
    if (!open_golden(&v)) SKIP("golden vocabulary ggml-vocab-llama-bpe.gguf not found");
    grammar *g = compile(JSON_GBNF);
    grammar_match *m;
    CHECK_OK(grammar_match_new(g, v.gv, &m));
    const char *text = "{\"name\": \"Caf\xC3\xA9 \\\"\xF0\x9F\x98\x80\\\"\", \"n\": [1, -2.5e3],\n"
                       "  \"ok\": true}";
    int32_t *ids;
    size_t n_ids;
    CHECK_OK(tok_encode(v.t, text, strlen(text), false, false, &ids, &n_ids));
    for (size_t i = 0; i <= n_ids; i++) {
        char where[64];
        snprintf(where, sizeof where, "after %zu tokens", i);
        if (i % 3 == 0 || i == n_ids) check_mask(v.gv, m, where);
        if (i < n_ids) CHECK_OK(grammar_match_accept(m, ids[i]));
    }
    CHECK(grammar_match_can_end(m));
    CHECK(grammar_match_allows(m, tok_eos(v.t)));
    rc_free(ids);
    grammar_match_free(m);
    grammar_free(g);
    close_vocab(&v);
}

/* ---- hostile grammars at match time ------------------------------------------------------ */

TEST(grammar_ambiguity_bounded)
{
    vocab v;
    open_vocab(&v);
    /* exponentially many parses of a^n: the stack set stays deduplicated */
    grammar *g = compile("root ::= (\"a\" | \"a\" \"a\" | x)*\nx ::= \"a\" | \"aa\"");
    CHECK_INT(match_text(&v, g, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 48), ==, 1);
    grammar_free(g);
    /* non-tail recursion that cannot be told apart: one stack more per byte,
     * refused with a message once past GRAMMAR_MAX_STACKS */
    g = compile("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x | \"\"");
    grammar_match *m;
    CHECK_OK(grammar_match_new(g, v.gv, &m));
    int rc = 0;
    size_t i;
    for (i = 0; i < 3 * GRAMMAR_MAX_STACKS && !rc; i++) rc = grammar_match_accept_text(m, "a", 1);
    CHECK_INT(rc, ==, RC_ELIMIT);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_STACKS"));
    float logits[V_N];
    rc = grammar_match_apply(m, logits);               /* bounded either way */
    CHECK(rc == 0 || rc == RC_ELIMIT);
    grammar_match_free(m);
    grammar_free(g);
    /* a huge alternation at the start: all stacks live, within the bound */
    size_t cap = 100000, n;
    char *s = malloc(cap);
    CHECK(s);
    n = (size_t)snprintf(s, cap, "root ::= \"x0\"");
    for (int k = 1; k < GRAMMAR_MAX_ALTS; k++) n += (size_t)snprintf(s + n, cap - n, " | \"x%d\"", k);
    CHECK_OK(grammar_compile(s, n, &g));
    CHECK_INT(match_text(&v, g, "x4095", 5), ==, 1);
    CHECK_INT(match_text(&v, g, "x4096", 5), ==, -1);
    CHECK_OK(grammar_match_new(g, v.gv, &m));
    check_mask(v.gv, m, "huge alternation");
    grammar_match_free(m);
    grammar_free(g);
    /* alternations of alternations multiply past the bound (references
     * that are not last keep their return positions apart): refused */
    n = (size_t)snprintf(s, cap, "root ::= y \"1\" | y \"2\"\n"
                         "y ::= z \"a\" | z \"b\" | z \"c\"\nz ::= \"a0\"");
    for (int k = 1; k < 2000; k++) n += (size_t)snprintf(s + n, cap - n, " | \"a%d\"", k);
    CHECK_OK(grammar_compile(s, n, &g));
    CHECK_INT(grammar_match_new(g, v.gv, &m), ==, RC_ELIMIT);
    CHECK(strstr(rc_errmsg(), "GRAMMAR_MAX_STACKS"));
    grammar_free(g);
    free(s);
    close_vocab(&v);
}

/* ---- benchmark (opt-in) --------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Mask times on the 128k vocabulary at a few JSON positions: the first mask
 * at a position (computed by walking the trie) and the next ones (cached),
 * and allows() of one token.  Prints; asserts only that masks are sane. */
TEST_T(grammar_mask_bench, 600)
{
    if (!getenv("RACIMO_GRAMMAR_BENCH")) SKIP("set RACIMO_GRAMMAR_BENCH=1 to run");
    vocab v;
    if (!open_golden(&v)) SKIP("golden vocabulary ggml-vocab-llama-bpe.gguf not found");
    int n = grammar_vocab_n(v.gv);
    double t0 = now_s();
    grammar_vocab *gv2;
    CHECK_OK(grammar_vocab_new(v.t, &gv2));
    fprintf(stderr, "  vocab %d tokens: trie of %s built in %.1f ms\n", n, "pieces",
            (now_s() - t0) * 1e3);
    grammar_vocab_free(gv2);
    grammar *g = compile(JSON_GBNF);
    static const struct { const char *name, *prefix; } pos[] = {
        { "start", "" },
        { "after '{'", "{" },
        { "inside a key string", "{\"na" },
        { "after ':'", "{\"name\":" },
        { "inside a value string", "{\"name\": \"Caf" },
        { "inside a number", "{\"n\": 12" },
        { "after ','", "{\"a\": [1," },
        { "nested 4 deep in a string", "{\"a\": [{\"b\": [\"x" },
    };
    float *logits = malloc((size_t)n * sizeof *logits);
    CHECK(logits);
    for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++) {
        grammar_match *m;
        CHECK_OK(grammar_match_new(g, v.gv, &m));
        CHECK_OK(grammar_match_accept_text(m, pos[k].prefix, strlen(pos[k].prefix)));
        for (int i = 0; i < n; i++) logits[i] = 0;
        double a = now_s();
        CHECK_OK(grammar_match_apply(m, logits));
        double first = now_s() - a;
        int allowed = 0;
        for (int i = 0; i < n; i++) allowed += logits[i] == 0;
        const int reps = 50;
        a = now_s();
        for (int r = 0; r < reps; r++) CHECK_OK(grammar_match_apply(m, logits));
        double cached = (now_s() - a) / reps;
        grammar_match *c;
        CHECK_OK(grammar_match_clone(m, &c));
        a = now_s();
        int hits = 0;
        for (int i = 0; i < n; i += 1) hits += grammar_match_allows(c, i);
        double allows = (now_s() - a) / n;
        CHECK_INT(hits, ==, allowed);
        fprintf(stderr, "  %-28s %6d allowed  first mask %7.2f ms  cached %6.3f ms  "
                "allows() %5.0f ns/token (uncached)\n", pos[k].name, allowed, first * 1e3,
                cached * 1e3, allows * 1e9);
        grammar_match_free(c);
        grammar_match_free(m);
    }
    /* A whole answer, token by token, as a sampler would: a mask at every
     * token (worst case), and allows() of the chosen token first. */
    const char *doc = "{\"name\": \"Caf\xC3\xA9 de la Esquina\", \"stars\": 4.5, \"open\": true,\n"
                      " \"tags\": [\"coffee\", \"breakfast\", \"wifi\"], \"address\": {\"street\": "
                      "\"Calle Mayor 12\", \"city\": \"Madrid\", \"zip\": \"28013\"},\n"
                      " \"reviews\": [{\"user\": \"ana\", \"text\": \"Great \\\"cortado\\\", slow wifi.\"}]}";
    int32_t *ids;
    size_t n_ids;
    CHECK_OK(tok_encode(v.t, doc, strlen(doc), false, false, &ids, &n_ids));
    for (int pass = 0; pass < 2; pass++) {
        grammar_match *m;
        CHECK_OK(grammar_match_new(g, v.gv, &m));
        double a = now_s();
        for (size_t i = 0; i < n_ids; i++) {
            if (pass == 0) {
                memset(logits, 0, (size_t)n * sizeof *logits);   /* as fresh logits would be */
                CHECK_OK(grammar_match_apply(m, logits));
                if (logits[ids[i]] == -INFINITY) {
                    char pc[64];
                    int pn = tok_piece(v.t, ids[i], true, pc, sizeof pc);
                    FAIL("token %zu (%d, \"%.*s\") masked", i, ids[i], pn, pc);
                }
            } else {
                CHECK(grammar_match_allows(m, ids[i]));
            }
            CHECK_OK(grammar_match_accept(m, ids[i]));
        }
        double t = now_s() - a;
        CHECK(grammar_match_can_end(m));
        fprintf(stderr, "  a %zu-token JSON answer, %s: %.3f ms per token (%.1f ms in all)\n",
                n_ids, pass == 0 ? "mask at every token" : "allows() + accept only",
                t * 1e3 / (double)n_ids, t * 1e3);
        grammar_match_free(m);
    }
    rc_free(ids);
    free(logits);
    grammar_free(g);
    close_vocab(&v);
}

/* A clone goes its own way; reset goes back to the start and keeps working. */
TEST(grammar_match_clone_reset)
{
    vocab v;
    open_vocab(&v);
    grammar *g = compile("root ::= \"a\" (\"b\" | \"c\") \"d\"");
    grammar_match *m, *c;
    CHECK_OK(grammar_match_new(g, v.gv, &m));
    CHECK_OK(grammar_match_accept_text(m, "a", 1));
    CHECK_OK(grammar_match_clone(m, &c));
    CHECK_OK(grammar_match_accept_text(m, "b", 1));
    CHECK(!grammar_match_allows(m, V_BYTE0 + 'c'));
    CHECK(grammar_match_allows(c, V_BYTE0 + 'c'));
    CHECK_OK(grammar_match_accept_text(c, "cd", 2));
    CHECK(grammar_match_must_end(c));
    CHECK(!grammar_match_can_end(m));
    grammar_match_free(m);                               /* the clone owns its state */
    CHECK_OK(grammar_match_accept(c, 2));
    grammar_match_reset(c);
    CHECK(!grammar_match_can_end(c));
    CHECK(grammar_match_allows(c, V_BYTE0 + 'a'));
    CHECK(!grammar_match_allows(c, V_BYTE0 + 'b'));
    CHECK_OK(grammar_match_accept_text(c, "abd", 3));
    CHECK(grammar_match_must_end(c));
    grammar_match_free(c);
    grammar_free(g);
    close_vocab(&v);
}

/* Every allocation of compile, vocabulary, match and mask may fail: the
 * call reports RC_ENOMEM and frees what it made (checked for leaks by
 * make test-san). */
TEST(grammar_alloc_failures)
{
    vocab v;
    open_vocab(&v);
    float logits[V_N];
    bool done = false;
    for (long n = 0; !done && n < 100000; n++) {
        grammar *g = NULL;
        grammar_vocab *gv = NULL;
        grammar_match *m = NULL, *c = NULL;
        rc_mem_fail_after(n);
        int rc = grammar_compile(JSON_GBNF, strlen(JSON_GBNF), &g);
        if (!rc) rc = grammar_vocab_new(v.t, &gv);
        if (!rc) rc = grammar_match_new(g, gv, &m);
        if (!rc) rc = grammar_match_accept_text(m, "{\"a\xC3\xA9", 5);
        if (!rc) rc = grammar_match_apply(m, logits);
        if (!rc) rc = grammar_match_clone(m, &c);
        if (!rc) rc = grammar_match_accept_text(c, "\": [1, 2]}", 10);
        rc_mem_fail_after(-1);
        if (rc && rc != RC_ENOMEM) FAIL("after %ld allocations: %d %s", n, rc, rc_errmsg());
        done = rc == 0;
        grammar_match_free(c);
        grammar_match_free(m);
        grammar_vocab_free(gv);
        grammar_free(g);
    }
    CHECK(done);
    close_vocab(&v);
}
