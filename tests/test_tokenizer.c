/* test_tokenizer.c - the tokenizers (src/text/tokenizer.h).
 *
 * Golden: ../shared/golden/tokenizer holds llama.cpp's test-tokenizer-0 data
 * (FORMAT.md there): for each vocab the 46 texts of .inp must encode, with
 * add_special and parse_special off, to the ids of .out, and decode back to
 * the same bytes.  Every case is checked and every failure printed before
 * the test fails.
 *
 * Unit: tiny vocabularies written in memory with the GGUF writer - a
 * byte-level BPE one (all 256 byte characters, a few merges, control and
 * user-defined tokens) and a SentencePiece one with byte fallback - encoded
 * and decoded by hand; the streaming decoder fed characters split across
 * byte tokens; malformed metadata, one defect at a time; allocation
 * failures.
 */
#include "test.h"
#include "base/err.h"
#include "base/mem.h"
#include "model/gguf.h"
#include "text/tok_internal.h"   /* tok__pretok_split: the words themselves */
#include "text/tokenizer.h"

#include <stdbool.h>

int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static void check_no_leaks(void)
{
    if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check())
        FAIL("memory leaked: see the LeakSanitizer report above");
}

/* ---- helpers ---- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* Text with control characters and non-ASCII bytes escaped, for messages. */
static const char *esc(const char *s, size_t n)
{
    static char out[4][512];
    static int which;
    char *o = out[which++ & 3];
    size_t k = 0;
    for (size_t i = 0; i < n && k < sizeof out[0] - 8; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') k += (size_t)sprintf(o + k, "\\n");
        else if (c == '\t') k += (size_t)sprintf(o + k, "\\t");
        else if (c < 0x20 || c == 0x7f) k += (size_t)sprintf(o + k, "\\x%02x", c);
        else o[k++] = (char)c;
    }
    o[k] = 0;
    return o;
}

static const char *ids_str(const int32_t *ids, size_t n)
{
    static char out[2][2048];
    static int which;
    char *o = out[which++ & 1];
    size_t k = 0;
    o[0] = 0;
    for (size_t i = 0; i < n && k < sizeof out[0] - 16; i++)
        k += (size_t)sprintf(o + k, " %d", ids[i]);
    return o;
}

/* Encodes `s` and compares with the expected ids (terminated by -2). */
#define END (-2)
static void check_enc(const tokenizer *t, const char *s, bool add_special, bool parse_special,
                      const int32_t *want)
{
    int32_t *ids;
    size_t n, n_want = 0;
    while (want[n_want] != END)
        n_want++;
    CHECK_OK(tok_encode(t, s, strlen(s), add_special, parse_special, &ids, &n));
    if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0)
        FAIL("encode \"%s\" (special %d/%d): got%s, want%s", esc(s, strlen(s)), add_special,
             parse_special, ids_str(ids, n), ids_str(want, n_want));
    rc_free(ids);
}
#define ENC(t, s, add, parse, ...) check_enc(t, s, add, parse, (const int32_t[]){ __VA_ARGS__, END })

static void check_dec(const tokenizer *t, const int32_t *ids, size_t n, bool special,
                      const char *want)
{
    char *s;
    size_t len;
    CHECK_OK(tok_decode(t, ids, n, special, &s, &len));
    CHECK_INT(len, ==, strlen(s));
    if (strcmp(s, want))
        FAIL("decode%s: got \"%s\", want \"%s\"", ids_str(ids, n), esc(s, len),
             esc(want, strlen(want)));
    rc_free(s);
}

/* Round trip: decode(encode(s)) == s. */
static void check_round_trip(const tokenizer *t, const char *s)
{
    int32_t *ids;
    size_t n;
    CHECK_OK(tok_encode(t, s, strlen(s), false, false, &ids, &n));
    check_dec(t, ids, n, false, s);
    rc_free(ids);
}

/* ---- golden ---- */

static const char SEP[] = "\n__ggml_vocab_test__\n";

static void run_golden(const char *name)
{
    const char *g = test_golden_dir();
    if (!g)
        SKIP("golden data not found (../shared/golden or $RACIMO_GOLDEN)");
    char path[1200], inp_path[1300], out_path[1300];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-%s.gguf", g, name);
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    size_t inp_len, out_len;
    char *inp = read_file(inp_path, &inp_len), *outs = read_file(out_path, &out_len);
    if (!inp || !outs)
        SKIP("no %s or its .inp/.out", path);

    gguf_file *f;
    tokenizer *t;
    CHECK_OK(gguf_open(path, &f));
    CHECK_OK(tok_load(f, &t));

    int n_cases = 0, n_pass = 0, n_rt = 0;
    size_t ip = 0, op = 0;
    while (ip < inp_len) {
        const char *sep = memmem(inp + ip, inp_len - ip, SEP, sizeof SEP - 1);
        if (!sep)
            FAIL("%s: text %d has no separator after it", inp_path, n_cases);
        const char *text = inp + ip;
        size_t tlen = (size_t)(sep - text);
        ip = (size_t)(sep - inp) + sizeof SEP - 1;

        /* The expected ids: one line, numbers separated by spaces. */
        if (op >= out_len)
            FAIL("%s: fewer lines than texts", out_path);
        char *eol = memchr(outs + op, '\n', out_len - op);
        size_t llen = eol ? (size_t)(eol - (outs + op)) : out_len - op;
        int32_t want[4096];
        size_t n_want = 0;
        char *p = outs + op, *end = outs + op + llen;
        while (p < end) {
            while (p < end && *p == ' ')
                p++;
            if (p >= end)
                break;
            char *q;
            long v = strtol(p, &q, 10);
            if (q == p || n_want >= 4096)
                FAIL("%s: bad line %d", out_path, n_cases + 1);
            want[n_want++] = (int32_t)v;
            p = q;
        }
        op += llen + 1;

        int32_t *ids;
        size_t n;
        CHECK_OK(tok_encode(t, text, tlen, false, false, &ids, &n));
        if (n == n_want && memcmp(ids, want, n * sizeof *ids) == 0)
            n_pass++;
        else
            fprintf(stderr, "  %s case %d \"%s\":\n    got %s\n    want%s\n", name, n_cases,
                    esc(text, tlen), ids_str(ids, n), ids_str(want, n_want));

        char *back;
        size_t blen;
        CHECK_OK(tok_decode(t, ids, n, false, &back, &blen));
        if (blen == tlen && memcmp(back, text, tlen) == 0)
            n_rt++;
        else
            fprintf(stderr, "  %s case %d round trip: \"%s\" -> \"%s\"\n", name, n_cases,
                    esc(text, tlen), esc(back, blen));
        rc_free(back);
        rc_free(ids);
        n_cases++;
    }
    fprintf(stderr, "  %s (pre %s): %d/%d cases pass, %d/%d round-trip\n", name,
            tok_pre_name(t), n_pass, n_cases, n_rt, n_cases);
    CHECK_INT(n_cases, ==, 46);
    CHECK_INT(n_pass, ==, n_cases);
    CHECK_INT(n_rt, ==, n_cases);
    tok_free(t);
    gguf_close(f);
    free(inp);
    free(outs);
    check_no_leaks();
}

TEST_T(tok_golden_llama_spm, 120) { run_golden("llama-spm"); }
TEST_T(tok_golden_llama_bpe, 120) { run_golden("llama-bpe"); }
TEST_T(tok_golden_qwen2, 120) { run_golden("qwen2"); }
TEST_T(tok_golden_deepseek_coder, 120) { run_golden("deepseek-coder"); }

/* Special-token parsing and BOS on a real vocabulary. */
TEST_T(tok_golden_llama_bpe_special, 120)
{
    const char *g = test_golden_dir();
    if (!g)
        SKIP("golden data not found");
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-llama-bpe.gguf", g);
    gguf_file *f;
    if (gguf_open(path, &f))
        SKIP("no %s", path);
    tokenizer *t;
    CHECK_OK(tok_load(f, &t));
    CHECK_INT(tok_bos(t), ==, 128000);
    CHECK_INT(tok_eos(t), ==, 128001);
    CHECK(tok_add_bos(t));
    CHECK_INT(tok_find_token(t, "<|eot_id|>"), ==, 128009);
    CHECK_INT(tok_eot(t), ==, 128009);
    CHECK(tok_is_eog(t, 128009));
    CHECK(tok_is_eog(t, 128001));
    CHECK(!tok_is_eog(t, 9906));
    ENC(t, "Hello world", true, false, 128000, 9906, 1917);
    ENC(t, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", true, true,
        128000, 128006, 882, 128007, 271, 13347, 128009);
    /* Unparsed, the control text is ordinary text. */
    int32_t *ids;
    size_t n;
    CHECK_OK(tok_encode(t, "<|eot_id|>", 10, false, false, &ids, &n));
    CHECK_INT(n, >, 1);
    for (size_t i = 0; i < n; i++)
        CHECK_INT(ids[i], <, 128000);
    rc_free(ids);
    char buf[64];
    CHECK_INT(tok_piece(t, 128009, true, buf, sizeof buf), ==, 10);
    CHECK(memcmp(buf, "<|eot_id|>", 10) == 0);
    CHECK_INT(tok_piece(t, 128009, false, buf, sizeof buf), ==, 0);
    tok_free(t);
    gguf_close(f);
    check_no_leaks();
}

/* Qwen's chat tokens and end-of-generation set. */
TEST_T(tok_golden_qwen2_special, 120)
{
    const char *g = test_golden_dir();
    if (!g)
        SKIP("golden data not found");
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-qwen2.gguf", g);
    gguf_file *f;
    if (gguf_open(path, &f))
        SKIP("no %s", path);
    tokenizer *t;
    CHECK_OK(tok_load(f, &t));
    CHECK_STR(tok_pre_name(t), "qwen2");
    CHECK(!tok_add_bos(t));
    CHECK_INT(tok_eos(t), ==, 151643);
    CHECK_INT(tok_eot(t), ==, 151645);            /* <|im_end|>, found by its text */
    CHECK(tok_is_eog(t, 151643));
    CHECK(tok_is_eog(t, 151645));
    CHECK(!tok_is_eog(t, 151644));
    ENC(t, "<|im_start|>user\nHi<|im_end|>", true, true, 151644, 872, 198, 13048, 151645);
    int32_t ids[] = { 151644, 872, 198, 13048, 151645 };
    check_dec(t, ids, 5, true, "<|im_start|>user\nHi<|im_end|>");
    check_dec(t, ids, 5, false, "user\nHi");
    tok_free(t);
    gguf_close(f);
    check_no_leaks();
}

/* 1 MB of mixed text through each golden vocabulary: no timing assertion,
 * but a quadratic merge loop or a linear-scan lookup would hit the
 * timeout.  Each chunk also round-trips. */
TEST_T(tok_golden_large_text, 120)
{
    const char *g = test_golden_dir();
    if (!g)
        SKIP("golden data not found");
    static const char *const names[] = { "llama-spm", "llama-bpe", "qwen2", "deepseek-coder" };
    static const char chunk[] =
        "The quick brown fox jumps over the lazy dog 1234567890. ¿Qué tal? Ñandú €5 "
        "日本語のテキスト 한국어 Привет мир 😀🎉 \t\n  int main(void) { return 0; }\n"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "                                                   \n\n\n";
    size_t cl = sizeof chunk - 1, total = 1 << 20;
    char *text = malloc(total + 1);
    size_t len = 0;
    while (len + cl <= total) {
        memcpy(text + len, chunk, cl);
        len += cl;
    }
    /* and one very long word (no spaces) */
    memset(text + len, 'z', total - len);
    len = total;
    text[len] = 0;
    for (size_t k = 0; k < 4; k++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-%s.gguf", g, names[k]);
        gguf_file *f;
        if (gguf_open(path, &f))
            SKIP("no %s", path);
        tokenizer *t;
        CHECK_OK(tok_load(f, &t));
        int32_t *ids;
        size_t n;
        CHECK_OK(tok_encode(t, text, len, false, false, &ids, &n));
        CHECK_INT(n, >, len / 16);
        char *back;
        size_t blen;
        CHECK_OK(tok_decode(t, ids, n, false, &back, &blen));
        CHECK_INT(blen, ==, len);
        CHECK(memcmp(back, text, len) == 0);
        rc_free(back);
        rc_free(ids);
        tok_free(t);
        gguf_close(f);
    }
    free(text);
    check_no_leaks();
}

/* ---- tiny in-memory vocabularies ---- */

typedef struct {
    uint8_t    *buf;
    gguf_file  *f;
    tokenizer  *t;
} vocab;

/* GPT-2's byte-to-unicode alphabet, written independently of tok_bpe.c. */
static void gpt2_char(int b, char out[4])
{
    int cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
        cp = b;
    } else {
        int k = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* BPE vocab: ids 0..255 are the byte characters (id = byte), then: */
enum {
    B_AB = 256, B_BC, B_ABC, B_GA, B_EOT, B_USER, B_ENDTEXT, B_USER_LONG, B_HELLO, B_GHELLO,
    B_N
};
static const char *const BPE_EXTRA[] = {
    "ab", "bc", "abc", "\xC4\xA0\x61", "<|eot|>", "<U>", "<|endoftext|>", "<U>yy",
    "hello", "\xC4\xA0hello",
};
static const int32_t BPE_EXTRA_TYPE[] = { 1, 1, 1, 1, 3, 4, 3, 4, 1, 1 };
/* Ranks: "b c" before "a b", so "abc" is a + bc, not ab + c. */
static const char *const BPE_MERGES[] = {
    "b c", "a b", "\xC4\xA0 a", "h e", "l l", "he ll", "hell o",
    "\xC4\xA0 hello",
};
/* hello's intermediate tokens */
static const char *const BPE_MORE[] = { "he", "ll", "hell", "hello" };

/* Builds the BPE writer; `skip` names a key to leave out (or NULL). */
static gguf_writer *bpe_writer(const char *skip, const char *pre)
{
    static char bytes[256][4];
    const char *tokens[B_N + 4];
    int32_t types[B_N + 4];
    for (int b = 0; b < 256; b++) {
        gpt2_char(b, bytes[b]);
        tokens[b] = bytes[b];
        types[b] = 1;
    }
    for (int i = 0; i < B_N - 256; i++) {
        tokens[256 + i] = BPE_EXTRA[i];
        types[256 + i] = BPE_EXTRA_TYPE[i];
    }
    /* "hello" needs its intermediate tokens; they come last (ids B_N..) */
    for (int i = 0; i < 3; i++) {
        tokens[B_N + i] = BPE_MORE[i];
        types[B_N + i] = 1;
    }
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    if (!skip || strcmp(skip, "tokenizer.ggml.model"))
        CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    if (pre)
        CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre));
    if (!skip || strcmp(skip, "tokenizer.ggml.tokens"))
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, B_N + 3));
    if (!skip || strcmp(skip, "tokenizer.ggml.token_type"))
        CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, B_N + 3));
    if (!skip || strcmp(skip, "tokenizer.ggml.merges"))
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", BPE_MERGES,
                                         sizeof BPE_MERGES / sizeof BPE_MERGES[0]));
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", B_ENDTEXT));
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", B_ENDTEXT));
    return w;
}

/* SPM vocab: <unk>, <s>, </s>, the 256 byte tokens (id = 3 + byte), then: */
enum { S_SP = 259, S_A, S_B, S_SPA, S_AB, S_SPAB, S_C, S_USER, S_N };
static gguf_writer *spm_writer(const char *skip)
{
    static char bytes[256][8];
    const char *tokens[S_N];
    int32_t types[S_N];
    float scores[S_N];
    tokens[0] = "<unk>"; types[0] = 2;
    tokens[1] = "<s>"; types[1] = 3;
    tokens[2] = "</s>"; types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tokens[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    static const char *const extra[] = {
        "\xE2\x96\x81", "a", "b", "\xE2\x96\x81\x61", "ab", "\xE2\x96\x81\x61\x62", "c", "[U]",
    };
    static const float extra_score[] = { -4, -5, -6, -3, -2, -1, -7, 0 };
    for (int i = 0; i < S_N - S_SP; i++) {
        tokens[S_SP + i] = extra[i];
        types[S_SP + i] = i == S_USER - S_SP ? 4 : 1;
        scores[S_SP + i] = extra_score[i];
    }
    for (int i = 0; i < S_SP; i++)
        scores[i] = 0;
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.pre", "default"));
    CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, S_N));
    if (!skip || strcmp(skip, "tokenizer.ggml.token_type"))
        CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, S_N));
    if (!skip || strcmp(skip, "tokenizer.ggml.scores"))
        CHECK_OK(gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, S_N));
    return w;
}

/* Writes, parses and loads; returns tok_load's code (vocab usable on 0). */
static int open_vocab(gguf_writer *w, vocab *v)
{
    size_t size;
    memset(v, 0, sizeof *v);
    CHECK_OK(gguf_writer_write_mem(w, NULL, NULL, &v->buf, &size));
    gguf_writer_free(w);
    CHECK_OK(gguf_parse(v->buf, size, "vocab.gguf", &v->f));
    return tok_load(v->f, &v->t);
}

static void close_vocab(vocab *v)
{
    tok_free(v->t);
    gguf_close(v->f);
    rc_free(v->buf);
}

TEST(tok_bpe_tiny)
{
    vocab v;
    CHECK_OK(open_vocab(bpe_writer(NULL, "gpt-2"), &v));
    const tokenizer *t = v.t;
    CHECK(!tok_is_spm(t));
    CHECK_STR(tok_pre_name(t), "gpt-2");
    CHECK_INT(tok_n_vocab(t), ==, B_N + 3);
    CHECK(!tok_add_bos(t));   /* gpt-2 default */

    ENC(t, "abc", false, false, 'a', B_BC);             /* rank order, not left to right */
    ENC(t, "abd", false, false, B_AB, 'd');
    ENC(t, " abc", false, false, B_GA, B_BC);
    ENC(t, "hello hello", false, false, B_HELLO, B_GHELLO);
    ENC(t, "a\n", false, false, 'a', 0x0A);             /* byte id == byte here */
    /* gpt-2: "'s" apart, digits apart from letters, a space run keeps its
     * last space for the next word */
    ENC(t, "a's 12x   b", false, false, 'a', '\'', 's', 0x20, '1', '2', 'x', 0x20, 0x20, 0x20, 'b');

    /* Special tokens: control ones only when parsed, user-defined always. */
    ENC(t, "a<|eot|>b", false, true, 'a', B_EOT, 'b');
    ENC(t, "a<|eot|>b", false, false, 'a', '<', '|', 'e', 'o', 't', '|', '>', 'b');
    ENC(t, "x<U>y", false, false, 'x', B_USER, 'y');
    ENC(t, "z<U>yy<U>y", false, false, 'z', B_USER_LONG, B_USER, 'y');   /* longest first */
    ENC(t, "<|eot|><|eot|>", false, true, B_EOT, B_EOT);

    /* Invalid UTF-8 is tokenized as U+FFFD (EF BF BD). */
    ENC(t, "\xFF", false, false, 0xEF, 0xBF, 0xBD);
    ENC(t, "a\xC3", false, false, 'a', 0xEF, 0xBF, 0xBD);

    /* add_special: this vocab has no add_bos_token, add_eos_token = false */
    ENC(t, "ab", true, false, B_AB);
    ENC(t, "", true, false, END);
    ENC(t, "", false, false, END);

    /* Special ids and end of generation */
    CHECK_INT(tok_bos(t), ==, B_ENDTEXT);
    CHECK_INT(tok_eos(t), ==, B_ENDTEXT);
    CHECK_INT(tok_eot(t), ==, B_ENDTEXT);   /* found by its text */
    CHECK_INT(tok_eom(t), ==, -1);
    CHECK(tok_is_eog(t, B_ENDTEXT));
    CHECK(!tok_is_eog(t, B_EOT));
    CHECK(!tok_is_eog(t, -1));
    CHECK(!tok_is_eog(t, B_N + 100));
    CHECK(tok_is_control(t, B_EOT));
    CHECK(!tok_is_control(t, B_USER));
    CHECK_INT(tok_find_token(t, "<|eot|>"), ==, B_EOT);
    CHECK_INT(tok_find_token(t, "nope"), ==, -1);
    size_t len;
    CHECK(tok_token_text(t, B_GA, &len) != NULL && len == 3);
    CHECK(tok_token_text(t, -5, &len) == NULL && len == 0);

    /* Pieces */
    char buf[32];
    CHECK_INT(tok_piece(t, B_GA, false, buf, sizeof buf), ==, 2);
    CHECK(memcmp(buf, " a", 2) == 0);
    CHECK_INT(tok_piece(t, 0x0A, false, buf, sizeof buf), ==, 1);
    CHECK(buf[0] == '\n');
    CHECK_INT(tok_piece(t, B_EOT, false, buf, sizeof buf), ==, 0);
    CHECK_INT(tok_piece(t, B_EOT, true, buf, sizeof buf), ==, 7);
    CHECK_INT(tok_piece(t, B_USER, false, buf, sizeof buf), ==, 3);
    CHECK_INT(tok_piece(t, B_GHELLO, false, NULL, 0), ==, 6);   /* size query */
    memset(buf, 'x', sizeof buf);
    CHECK_INT(tok_piece(t, B_GHELLO, false, buf, 3), ==, 6);    /* truncated */
    CHECK(memcmp(buf, " hex", 4) == 0);
    CHECK_INT(tok_piece(t, B_N + 3, false, buf, sizeof buf), ==, RC_ERANGE);
    CHECK_INT(tok_piece(t, -1, false, buf, sizeof buf), ==, RC_ERANGE);

    check_round_trip(t, "hello hello abc\n\n  x's \xC3\xB1 \xE2\x82\xAC \xF0\x9F\x98\x80");
    const int32_t seq[] = { B_ENDTEXT, B_GA, B_EOT };
    check_dec(t, seq, 3, false, " a");
    check_dec(t, seq, 3, true, "<|endoftext|> a<|eot|>");
    close_vocab(&v);
    check_no_leaks();
}

TEST(tok_bpe_pre_variants)
{
    /* llama3: digits in threes, add_bos default, whole-word lookup */
    vocab v;
    CHECK_OK(open_vocab(bpe_writer(NULL, "llama-bpe"), &v));
    CHECK_STR(tok_pre_name(v.t), "llama3");
    CHECK(tok_add_bos(v.t));
    ENC(v.t, "12345", false, false, '1', '2', '3', '4', '5');
    ENC(v.t, "ab", true, false, B_ENDTEXT, B_AB);
    /* "\s*[\r\n]+" keeps spaces before a newline with it */
    ENC(v.t, "a  \n b", false, false, 'a', 0x20, 0x20, 0x0A, 0x20, 'b');
    close_vocab(&v);

    /* An unknown pre-tokenizer loads with the default one (and a warning). */
    CHECK_OK(open_vocab(bpe_writer(NULL, "no-such-pre"), &v));
    CHECK_STR(tok_pre_name(v.t), "default");
    ENC(v.t, "abc", false, false, 'a', B_BC);
    close_vocab(&v);
    CHECK_OK(open_vocab(bpe_writer(NULL, NULL), &v));
    CHECK_STR(tok_pre_name(v.t), "default");
    close_vocab(&v);

    /* add_bos_token overrides the default */
    gguf_writer *w = bpe_writer(NULL, "llama3");
    CHECK_OK(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false));
    CHECK_OK(gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true));
    CHECK_OK(open_vocab(w, &v));
    CHECK(!tok_add_bos(v.t));
    CHECK(tok_add_eos(v.t));
    ENC(v.t, "ab", true, false, B_AB, B_ENDTEXT);
    close_vocab(&v);

    static const char *const pres[] = {
        "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "deepseek-v3", "starcoder",
        "falcon", "tekken", "gpt-4o", "kimi-k2", "bloom", "viking", "chatglm-bpe", "dbrx",
        "default",
    };
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        CHECK_OK(open_vocab(bpe_writer(NULL, pres[i]), &v));
        check_round_trip(v.t, "Hello, World! 123 4567 \xE4\xB8\xAD\xE6\x96\x87 \xE3\x80\x80x "
                              "\xCE\xB1\xCE\xB2 \t\n\n  end  ");
        close_vocab(&v);
    }
    check_no_leaks();
}

/* Kimi K2's words.  Each case lists the words of one text (the text is their
 * concatenation) as llama.cpp at commit 34af94cd split it: its
 * unicode_regex_split with the kimi-k2 pre-tokenizer's pattern, which runs
 * llama.cpp's own splitter.  They pin that splitter's quirks: Han is its
 * block list (々 〆 〇 ⺀ and U+30000 are letters, numbers or symbols like any
 * other, unassigned U+FA6E is Han, unassigned U+2A6E0 is not), letters are not
 * split by case, marks are not letters (a combining accent ends a word and
 * leads the next one), digits go in threes, and a whitespace run without a
 * newline is cut before its last character when more text follows. */
#define SPLIT(...) ((const char *const[]){ __VA_ARGS__, NULL })
static const char *const *const KIMI_SPLITS[] = {
    SPLIT("Hello", " World"),
    SPLIT("Hello", ",", " World", "!", " How's", " it", " going", "?"),
    SPLIT("I'm", " here", ",", " you're", " there", ",", " they'LL", " come", ",", " we'VE",
          " won"),
    SPLIT("she'D", " go", ";", " IT'S", ";", " DON'T"),
    SPLIT("'s", " '", "re", " '", "ve", " '", "m", " '", "ll", " '", "d", " '", "t"),
    SPLIT("x's", "y", " x're", " x", "'l", " x", "'"),
    SPLIT("don't", "'ve"),
    SPLIT("''", "s"),
    SPLIT("camelCase", " HTTPServer", " iPhone", " XMLHttpRequest"),
    SPLIT("UPPER", " lower", " Title", " MiXeD"),
    SPLIT("ǅungla", " ǈ", " ǲ"),
    SPLIT("ΑΒΓ", " αβγ", " Ωmega", " ΣΊΣΥΦΟΣ"),
    SPLIT("Привет", ",", " Мир", "!", " ЁЖИК", " ёжик"),
    SPLIT("Ünïcödé", " naïve", " façade", " jalapeño"),
    SPLIT("e", "\xCC\x81te", "\xCC\x81", " cafe", "\xCC\x81s"),
    SPLIT("\xCC\x81\xCC\x81", "abc"),
    SPLIT("a", "\xCC\x80\xCC\x81", "b"),
    SPLIT("नमस", "\xE0\xA5\x8Dत", "\xE0\xA5\x87", " द", "\xE0\xA5\x81न", "\xE0\xA4\xBFय",
          "\xE0\xA4\xBE"),
    SPLIT("สว", "\xE0\xB8\xB1สด", "\xE0\xB8\xB5"),
    SPLIT("中文字符测试"),
    SPLIT("我爱北京天安门", "。"),
    SPLIT("Hello", "世界"),
    SPLIT("世界", "Hello"),
    SPLIT("世界", " Hello", "!"),
    SPLIT("中文", "English", "混合", "text", "测试"),
    SPLIT("日本語", "のテキストです", "。カタカナとひらがな"),
    SPLIT("東京", "タワーTokyo"),
    SPLIT("한국어", " 텍스트입니다", ".", " 안녕하세요", "!"),
    SPLIT("漢字", "한글かなABC", "123"),
    SPLIT("々〆", "〇", "〻"),
    SPLIT("⺀a", " ⼀", "中"),
    SPLIT("㐀䶿", "䷀"),
    SPLIT("豈\xEF\xA9\xAE丽"),
    SPLIT("𠀀𪛖", "\xF0\xAA\x9B\xA0", "𪜀"),
    SPLIT("𰀀", "\xF0\xAF\xA8\x9F", "\xF0\xAF\xA8\xA0"),
    SPLIT("!", "中", " ", "中", "'s", " a", "中", "b"),
    SPLIT("x", "中", "'ll"),
    SPLIT("0"),
    SPLIT("12"),
    SPLIT("123"),
    SPLIT("123", "4"),
    SPLIT("123", "45"),
    SPLIT("123", "456", "789", "0"),
    SPLIT("3", ".", "141", "59", " ", "1", ",", "234", ",", "567", ".", "89"),
    SPLIT("v", "1", ".", "2", ".", "3", "-beta", "4", " x", "1", "y", "22", "z", "333", "w", "444",
          "4"),
    SPLIT("٠١٢", "٣٤", " ", "१२३", "४", " ", "１２３", "４", " ", "①②③", "④", " ", "½¼", " ", "Ⅻⅻ"),
    SPLIT("abc", "123", "def"),
    SPLIT(" ", "123"),
    SPLIT(" ", " ", "123"),
    SPLIT("-", "123", " +", "1", " (", "555", ")", " ", "123", "-", "456", "7"),
    SPLIT("!!!"),
    SPLIT("...\n\n\n", "x"),
    SPLIT("!\n", "!\n"),
    SPLIT(" !!\n\n"),
    SPLIT(" ", " !!"),
    SPLIT(" ~~~", " a", "~b"),
    SPLIT("@#$%^&*()_+-=[]{}|;:,./<>?"),
    SPLIT("«guillemets", "»", " „", "Anführungs", "“", " —", "em", "–en"),
    SPLIT("、。「」『』！？"),
    SPLIT("¿Qué", " tal", "?", " ¡", "Hola", "!"),
    SPLIT(" "),
    SPLIT("   "),
    SPLIT("\t\t"),
    SPLIT("\n\n"),
    SPLIT("\r\n\r\n"),
    SPLIT(" \n", " "),
    SPLIT("a", " \n", " b"),
    SPLIT("a", "  \n", " ", " b"),
    SPLIT("a", "\r\n", "b"),
    SPLIT("a", "\r", "b"),
    SPLIT("trailing", "   "),
    SPLIT("trailing", "\t"),
    SPLIT("  ", " leading"),
    SPLIT("\tleading"),
    SPLIT("a", "\xC2\xA0" "b", " ", "\xC2\xA0" "c"),
    SPLIT("a", "\xE3\x80\x80" "b", "\xE3\x80\x80", "\xE3\x80\x80", "中文"),
    SPLIT("a", "\xE2\x80\x83", "\xE2\x80\x83" "b"),
    SPLIT("a", "\xC2\x85" "b"),
    SPLIT("a", "\xE2\x80\xA8" "b"),
    SPLIT("a", "\xE2\x80\x8B" "b", " a", "\xEF\xBB\xBF" "b"),
    SPLIT("x", "\x0Bx", "\x0Cx"),
    SPLIT("😀😀😀"),
    SPLIT("Hello", " 😀", " World"),
    SPLIT("👨\xE2\x80\x8D👩\xE2\x80\x8D👧", " family"),
    SPLIT("🇪🇸🇫🇷"),
    SPLIT("👍🏽", "ok"),
    SPLIT("a", "😀b"),
    SPLIT("❤\xEF\xB8\x8F✓"),
    SPLIT("€", "100", " $", "5", " x", "²", "+y", "³", " ∑∫"),
    SPLIT("def", " f", "(x", "):\n", "   ", " return", " x", "*", "2", "\n"),
    SPLIT("if", " (", "a", " &&", " b", ")", " {", " return", ";", " }\n", "\tx", "++;\n"),
    SPLIT("{\"", "key", "\":", " [", "1", ",", " ", "2", ",", " ", "3", "]}"),
    SPLIT("http", "://", "example", ".com", "/path", "?q", "=", "1", "&r", "=", "2"),
    SPLIT("Kimi", " K", "2", " ", "是一个强大的模型", "。It", " has", " ", "1", "T", " params", "!"),
    SPLIT("x", "\x01y", "\x7F\xEE\x80\x80"),
};

/* The words of text[0..len) joined by '|', escaped, for messages. */
static const char *words_str(const char *text, const tok__span *sp, size_t n)
{
    char buf[512];
    size_t k = 0;
    for (size_t i = 0; i < n && k + sp[i].len + 2 < sizeof buf; i++) {
        if (i)
            buf[k++] = '|';
        memcpy(buf + k, text + sp[i].off, sp[i].len);
        k += sp[i].len;
    }
    return esc(buf, k);
}

TEST(tok_pretok_kimi_k2)
{
    vocab v;
    CHECK_OK(open_vocab(bpe_writer(NULL, "kimi-k2"), &v));
    CHECK_STR(tok_pre_name(v.t), "kimi-k2");
    CHECK(!tok_add_bos(v.t));
    tok__scratch s = { 0 };
    size_t n_cases = sizeof KIMI_SPLITS / sizeof KIMI_SPLITS[0], n_bad = 0;
    for (size_t c = 0; c < n_cases; c++) {
        char text[256];
        tok__span want[64];
        size_t len = 0, n_want = 0;
        for (const char *const *w = KIMI_SPLITS[c]; *w; w++) {
            size_t l = strlen(*w);
            CHECK(len + l <= sizeof text && n_want < sizeof want / sizeof want[0]);
            memcpy(text + len, *w, l);
            want[n_want++] = (tok__span){ (uint32_t)len, (uint32_t)l };
            len += l;
        }
        tok__span *got;
        size_t n_got;
        CHECK_OK(tok__pretok_split(v.t, &s, text, len, &got, &n_got));
        bool same = n_got == n_want;
        for (size_t i = 0; same && i < n_got; i++)
            same = got[i].off == want[i].off && got[i].len == want[i].len;
        if (!same) {
            fprintf(stderr, "  case %zu: got %s\n           want %s\n", c,
                    words_str(text, got, n_got), words_str(text, want, n_want));
            n_bad++;
        }
    }
    tok__scratch_free(&s);
    if (n_bad)
        FAIL("%zu of %zu kimi-k2 splits differ from llama.cpp's", n_bad, n_cases);
    /* Words still go through the merges. */
    ENC(v.t, "hello hello", false, false, B_HELLO, B_GHELLO);
    check_round_trip(v.t, "Kimi K2 \xE6\x98\xAF\xE4\xB8\x80 camelCase it's 12345 \t\n\n  end  ");
    close_vocab(&v);
    check_no_leaks();
}

TEST(tok_spm_tiny)
{
    vocab v;
    CHECK_OK(open_vocab(spm_writer(NULL), &v));
    const tokenizer *t = v.t;
    CHECK(tok_is_spm(t));
    CHECK(tok_add_bos(t));
    CHECK_INT(tok_bos(t), ==, 1);
    CHECK_INT(tok_eos(t), ==, 2);
    CHECK(tok_is_eog(t, 2));

    ENC(t, "ab", false, false, S_SPAB);                 /* ab (-2), then ▁ab (-1) */
    ENC(t, "ab", true, false, 1, S_SPAB);
    ENC(t, "ab c", false, false, S_SPAB, S_SP, S_C);
    ENC(t, "a", false, false, S_SPA);
    ENC(t, " ", false, false, S_SP, S_SP);
    ENC(t, "", false, false, END);
    ENC(t, "", true, false, 1);
    /* byte fallback: ñ = C3 B1, € = E2 82 AC */
    ENC(t, "\xC3\xB1", false, false, S_SP, 3 + 0xC3, 3 + 0xB1);
    ENC(t, "a\xE2\x82\xAC", false, false, S_SPA, 3 + 0xE2, 3 + 0x82, 3 + 0xAC);
    /* a lead byte takes the next bytes along (llama.cpp cuts by lead byte) */
    ENC(t, "\xFF" "a", false, false, S_SP, 3 + 0xFF, 3 + (int)'a');
    /* special tokens: parsed, then the next fragment gets a space prefix too */
    ENC(t, "a</s>b", false, true, S_SPA, 2, S_SP, S_B);
    ENC(t, "a[U]b", false, false, S_SPA, S_USER, S_SP, S_B);

    const int32_t ab[] = { S_SPAB };
    check_dec(t, ab, 1, false, "ab");
    const int32_t bos_ab[] = { 1, S_SPAB };
    check_dec(t, bos_ab, 2, false, " ab");
    check_dec(t, bos_ab, 2, true, "<s> ab");
    check_round_trip(t, "ab c \xC3\xB1\xE2\x82\xAC\xF0\x9F\x98\x80 \n\t x");
    check_round_trip(t, "  leading spaces");
    close_vocab(&v);

    /* Without token types the <0xNN> tokens are still byte tokens. */
    CHECK_OK(open_vocab(spm_writer("tokenizer.ggml.token_type"), &v));
    char buf[8];
    CHECK_INT(tok_piece(v.t, 3 + 0x0A, false, buf, sizeof buf), ==, 1);
    CHECK(buf[0] == '\n');
    ENC(v.t, "\n", false, false, S_SP, 3 + 0x0A);
    close_vocab(&v);

    /* Without scores every merge ties: leftmost first. */
    CHECK_OK(open_vocab(spm_writer("tokenizer.ggml.scores"), &v));
    ENC(v.t, "ab", false, false, S_SPAB);
    close_vocab(&v);
    check_no_leaks();
}

/* One 1 MiB word: no timing assertion, but a merge loop quadratic in the
 * word length would hit the timeout. */
TEST_T(tok_long_word, 60)
{
    size_t len = 1 << 20;
    char *text = malloc(len + 1);
    for (size_t i = 0; i < len; i += 2)
        memcpy(text + i, "ab", 2);
    text[len] = 0;
    vocab v;
    int32_t *ids;
    size_t n;
    CHECK_OK(open_vocab(bpe_writer(NULL, "gpt-2"), &v));
    CHECK_OK(tok_encode(v.t, text, len, false, false, &ids, &n));
    CHECK_INT(n, ==, len / 2);
    for (size_t i = 0; i < n; i++)
        CHECK_INT(ids[i], ==, B_AB);
    rc_free(ids);
    close_vocab(&v);

    CHECK_OK(open_vocab(spm_writer(NULL), &v));
    CHECK_OK(tok_encode(v.t, text, len, false, false, &ids, &n));
    CHECK_INT(n, ==, len / 2);
    CHECK_INT(ids[0], ==, S_SPAB);
    CHECK_INT(ids[n - 1], ==, S_AB);
    rc_free(ids);
    close_vocab(&v);
    free(text);
    check_no_leaks();
}

/* Feeds ids one by one and checks every output is whole characters. */
static void stream_check(const tokenizer *t, const int32_t *ids, size_t n, const char *want)
{
    tok_stream s;
    tok_stream_init(&s);
    char out[256], all[1024];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int k = tok_stream_push(t, &s, ids[i], false, out, sizeof out);
        CHECK_INT(k, >=, 0);
        /* each chunk is valid UTF-8 on its own */
        for (int j = 0; j < k;) {
            unsigned char c = (unsigned char)out[j];
            int cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            CHECK(c < 0x80 || c >= 0xC2);
            CHECK_INT(j + cl, <=, k);
            for (int q = 1; q < cl; q++)
                CHECK(((unsigned char)out[j + q] & 0xC0) == 0x80);
            j += cl;
        }
        memcpy(all + total, out, (size_t)k);
        total += (size_t)k;
    }
    int k = tok_stream_flush(&s, out, sizeof out);
    CHECK_INT(k, >=, 0);
    memcpy(all + total, out, (size_t)k);
    total += (size_t)k;
    all[total] = 0;
    if (strcmp(all, want))
        FAIL("stream%s: got \"%s\", want \"%s\"", ids_str(ids, n), esc(all, total),
             esc(want, strlen(want)));
}
#define STREAM(t, want, ...) do {                                           \
        const int32_t ids_[] = { __VA_ARGS__ };                             \
        stream_check(t, ids_, sizeof ids_ / sizeof ids_[0], want);          \
    } while (0)

TEST(tok_stream_utf8)
{
    vocab v;
    CHECK_OK(open_vocab(spm_writer(NULL), &v));
    const tokenizer *t = v.t;
    char out[64];
    tok_stream s;

    /* ñ split over two byte tokens: nothing, then the whole character */
    tok_stream_init(&s);
    CHECK_INT(tok_stream_push(t, &s, S_SP, false, out, sizeof out), ==, 1);
    CHECK_INT(tok_stream_push(t, &s, 3 + 0xC3, false, out, sizeof out), ==, 0);
    CHECK_INT(s.n_pending, ==, 1);
    CHECK_INT(tok_stream_push(t, &s, 3 + 0xB1, false, out, sizeof out), ==, 2);
    CHECK(memcmp(out, "\xC3\xB1", 2) == 0);
    CHECK_INT(tok_stream_flush(&s, out, sizeof out), ==, 0);

    STREAM(t, " \xE2\x82\xAC", S_SP, 3 + 0xE2, 3 + 0x82, 3 + 0xAC);           /* € */
    STREAM(t, "\xF0\x9F\x98\x80" "a", 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, S_A); /* 😀 */
    STREAM(t, "\xEF\xBF\xBD", 3 + 0xFF);                                         /* invalid */
    STREAM(t, "\xEF\xBF\xBD" "a", 3 + 0xC3, S_A);                                /* cut short */
    STREAM(t, "\xEF\xBF\xBD", 3 + 0xE2, 3 + 0x82);                               /* unfinished */
    STREAM(t, "\xEF\xBF\xBD\xEF\xBF\xBD", 3 + 0xC0, 3 + 0x80);                   /* overlong */
    STREAM(t, "\xEF\xBF\xBD\xEF\xBF\xBD" "b", 3 + 0xED, 3 + 0xA0, S_B);         /* surrogate */
    STREAM(t, " ab", S_SPAB, 1, 2);               /* control tokens render nothing */

    /* errors leave the state alone */
    tok_stream_init(&s);
    CHECK_INT(tok_stream_push(t, &s, 3 + 0xF0, false, out, sizeof out), ==, 0);
    CHECK_INT(tok_stream_push(t, &s, S_N + 5, false, out, sizeof out), ==, RC_ERANGE);
    CHECK_INT(tok_stream_push(t, &s, S_SPAB, false, out, 2), ==, RC_ERANGE);
    CHECK_INT(s.n_pending, ==, 1);
    CHECK_INT(tok_stream_flush(&s, out, 2), ==, RC_ERANGE);
    CHECK_INT(tok_stream_flush(&s, out, sizeof out), ==, 3);
    CHECK_INT(s.n_pending, ==, 0);
    CHECK_INT(TOK_STREAM_OUT_MAX(t), >=, 4 * (6 + 8));
    close_vocab(&v);

    /* Byte-level BPE: an emoji cut over byte-character tokens. */
    CHECK_OK(open_vocab(bpe_writer(NULL, "gpt-2"), &v));
    STREAM(v.t, "\xF0\x9F\x98\x80 a", 0xF0, 0x9F, 0x98, 0x80, B_GA);
    close_vocab(&v);
    check_no_leaks();
}

/* One malformed-metadata case: build, change one thing, expect a code and a
 * message naming the key. */
typedef void (*mutate_fn)(gguf_writer *w);

static void expect_fail(gguf_writer *w, int code, const char *in_msg)
{
    vocab v;
    int rc = open_vocab(w, &v);
    if (rc != code)
        FAIL("expected %d, got %d (%s)", code, rc, rc ? rc_errmsg() : "success");
    CHECK(v.t == NULL);
    if (!strstr(rc_errmsg(), in_msg))
        FAIL("message \"%s\" does not mention \"%s\"", rc_errmsg(), in_msg);
    close_vocab(&v);
}

TEST(tok_malformed_metadata)
{
    gguf_writer *w;

    expect_fail(bpe_writer("tokenizer.ggml.model", "gpt-2"), RC_ENOTFOUND, "tokenizer.ggml.model");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "bert"));
    expect_fail(w, RC_EUNSUPPORTED, "bert");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.model", 3));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.model");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.pre", 3));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.pre");

    expect_fail(bpe_writer("tokenizer.ggml.tokens", "gpt-2"), RC_ENOTFOUND, "tokenizer.ggml.tokens");
    w = bpe_writer(NULL, "gpt-2");
    const int32_t nums[3] = { 1, 2, 3 };
    CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.tokens", nums, 3));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.tokens");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", NULL, 0));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.tokens");

    /* token types: too few, not integers */
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", nums, 3));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.token_type");
    w = bpe_writer(NULL, "gpt-2");
    {
        const char *strs[B_N + 3];
        for (int i = 0; i < B_N + 3; i++)
            strs[i] = "1";
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.token_type", strs, B_N + 3));
    }
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.token_type");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.token_type", 1));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.token_type");

    /* scores: too few, strings */
    w = spm_writer(NULL);
    const float f3[3] = { 0, 0, 0 };
    CHECK_OK(gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", f3, 3));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.scores");
    w = spm_writer(NULL);
    {
        const char *strs[S_N];
        for (int i = 0; i < S_N; i++)
            strs[i] = "x";
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.scores", strs, S_N));
    }
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.scores");

    /* merges: missing, wrong type, no space, unknown sides, unknown result */
    expect_fail(bpe_writer("tokenizer.ggml.merges", "gpt-2"), RC_ENOTFOUND, "tokenizer.ggml.merges");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.merges", nums, 3));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.merges");
    static const char *const bad_merges[][2] = {
        { "ab", "is not \"left right\"" },
        { "a", "is not \"left right\"" },
        { "", "is not \"left right\"" },
        { "q\xC3\xA9 b", "the left side" },
        { "a zzz", "the right side" },
        { "c a", "the merged token" },
    };
    for (size_t i = 0; i < sizeof bad_merges / sizeof bad_merges[0]; i++) {
        w = bpe_writer(NULL, "gpt-2");
        const char *m[3] = { "a b", bad_merges[i][0], "b c" };
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", m, 3));
        expect_fail(w, RC_EFORMAT, bad_merges[i][1]);
        CHECK(strstr(rc_errmsg(), "tokenizer.ggml.merges[1]"));
    }

    /* special ids: wrong type fails; out of range is ignored */
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.bos_token_id", "1"));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.bos_token_id");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.add_bos_token", 1));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.add_bos_token");
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_f32(w, "tokenizer.ggml.eot_token_id", 1.5f));
    expect_fail(w, RC_EFORMAT, "tokenizer.ggml.eot_token_id");

    vocab v;
    w = bpe_writer(NULL, "gpt-2");
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1u << 30));
    CHECK_OK(gguf_writer_set_i32(w, "tokenizer.ggml.eos_token_id", -1));
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", B_EOT));
    CHECK_OK(open_vocab(w, &v));
    CHECK_INT(tok_bos(v.t), ==, -1);
    CHECK_INT(tok_eos(v.t), ==, -1);
    CHECK_INT(tok_eot(v.t), ==, B_EOT);
    CHECK(tok_is_eog(v.t, B_EOT));
    CHECK(tok_is_eog(v.t, B_ENDTEXT));   /* by its text */
    close_vocab(&v);

    /* A token type outside 1..6 and an empty token string load fine. */
    w = bpe_writer(NULL, "gpt-2");
    {
        static char bytes[256][4];
        const char *tokens[B_N + 3];
        int32_t types[B_N + 3];
        for (int b = 0; b < 256; b++) {
            gpt2_char(b, bytes[b]);
            tokens[b] = bytes[b];
            types[b] = 1;
        }
        for (int i = 256; i < B_N + 3; i++) {
            tokens[i] = i < B_N ? BPE_EXTRA[i - 256] : BPE_MORE[i - B_N];
            types[i] = 1;
        }
        tokens[B_USER] = "";
        types[B_EOT] = 99;
        CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, B_N + 3));
        CHECK_OK(gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, B_N + 3));
    }
    CHECK_OK(open_vocab(w, &v));
    CHECK_INT(tok_find_token(v.t, "[EMPTY_261]"), ==, B_USER);
    char buf[16];
    CHECK_INT(tok_piece(v.t, B_EOT, true, buf, sizeof buf), ==, 0);   /* undefined type */
    ENC(v.t, "ab", false, true, B_AB);
    close_vocab(&v);
    check_no_leaks();
}

TEST_T(tok_alloc_failures, 120)
{
    static const char text[] = "a<|eot|>b hello hello abc \xC3\xB1 <U>yy 123";
    for (int kind = 0; kind < 2; kind++) {
        long n;
        for (n = 0; n < 100000; n++) {
            gguf_writer *w = kind ? spm_writer(NULL) : bpe_writer(NULL, "llama3");
            size_t size;
            uint8_t *buf;
            gguf_file *f;
            CHECK_OK(gguf_writer_write_mem(w, NULL, NULL, &buf, &size));
            gguf_writer_free(w);
            CHECK_OK(gguf_parse(buf, size, "vocab.gguf", &f));
            tokenizer *t = NULL;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            rc_mem_fail_after(n);
            int rc = tok_load(f, &t);
            if (rc == 0)
                rc = tok_encode(t, text, sizeof text - 1, true, true, &ids, &n_ids);
            rc_mem_fail_after(-1);
            if (rc == 0)
                CHECK_INT(n_ids, >, 5);
            else if (rc != RC_ENOMEM)
                FAIL("kind %d fail after %ld: got %d (%s)", kind, n, rc, rc_errmsg());
            else
                CHECK(ids == NULL);
            rc_free(ids);
            tok_free(t);
            gguf_close(f);
            rc_free(buf);
            if (rc == 0)
                break;
        }
        CHECK_INT(n, >=, 8);
        CHECK_INT(n, <, 100000);
    }
    check_no_leaks();
}
