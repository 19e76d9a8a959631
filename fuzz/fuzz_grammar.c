/* fuzz_grammar.c - libFuzzer target for the GBNF compiler and matcher.
 *
 * Input: grammar text, a NUL byte, then operations on a match over a small
 * vocabulary (byte tokens and a few longer ones): accept a token, accept a
 * byte of text, ask allows() (checked against accepting on a copy), apply a
 * mask (checked: the sampled-first token it keeps must be allowed), clone,
 * reset.  Errors are fine; crashes, sanitizer reports, leaks, hangs and a
 * mask that disagrees with allows() are not.  Seeds: fuzz/corpus/grammar. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_BYTE = 256, FIRST_BYTE = 3 };
static const char *const MORE[] = { "{\"", "\":", "\xC3\xA9", "\xF0\x9F\x98", "ab", "abc", "\"}",
                                    "<tool_call>", "true", " [", "\\u" };
#define N_MORE (sizeof MORE / sizeof MORE[0])
#define N_TOK (FIRST_BYTE + N_BYTE + N_MORE)

static grammar_vocab *vocab(void)
{
    static grammar_vocab *gv;
    static uint8_t *buf;
    static gguf_file *f;
    static tokenizer *t;
    if (gv) return gv;
    static char names[N_BYTE][8];
    const char *tokens[N_TOK];
    int32_t types[N_TOK];
    float scores[N_TOK];
    tokens[0] = "<unk>"; tokens[1] = "<s>"; tokens[2] = "</s>";
    types[0] = 2; types[1] = types[2] = 3;
    for (int b = 0; b < N_BYTE; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        tokens[FIRST_BYTE + b] = names[b];
        types[FIRST_BYTE + b] = 6;
    }
    for (size_t i = 0; i < N_MORE; i++) {
        tokens[FIRST_BYTE + N_BYTE + i] = MORE[i];
        types[FIRST_BYTE + N_BYTE + i] = strcmp(MORE[i], "<tool_call>") ? 1 : 3;
    }
    for (size_t i = 0; i < N_TOK; i++) scores[i] = -(float)i;
    gguf_writer *w = gguf_writer_new();
    size_t n;
    if (!w || gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") ||
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_TOK) ||
        gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, N_TOK) ||
        gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, N_TOK) ||
        gguf_writer_write_mem(w, NULL, NULL, &buf, &n) || gguf_parse(buf, n, "vocab", &f) ||
        tok_load(f, &t) || grammar_vocab_new(t, &gv))
        __builtin_trap();
    gguf_writer_free(w);
    return gv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    grammar_vocab *gv = vocab();
    const uint8_t *sep = memchr(data, 0, size);
    size_t glen = sep ? (size_t)(sep - data) : size;
    const uint8_t *ops = sep ? sep + 1 : data + size;
    size_t n_ops = sep ? size - glen - 1 : 0;
    grammar *g;
    if (grammar_compile((const char *)data, glen, &g)) return 0;
    grammar_match *m;
    if (grammar_match_new(g, gv, &m)) {
        grammar_free(g);
        return 0;
    }
    static float logits[N_TOK];
    for (size_t i = 0; i + 1 < n_ops; i += 2) {
        int32_t tok = (int32_t)(ops[i + 1] % N_TOK);
        switch (ops[i] % 6) {
        case 0: grammar_match_accept(m, tok); break;
        case 1: grammar_match_accept_text(m, (const char *)&ops[i + 1], 1); break;
        case 2: {
            grammar_match *c;
            if (grammar_match_clone(m, &c)) break;
            bool allowed = grammar_match_allows(m, tok);
            int rc = grammar_match_accept(c, tok);
            if (rc == 0 && !allowed) __builtin_trap();
            if (rc == RC_EINVAL && allowed) __builtin_trap();
            grammar_match_free(c);
            break;
        }
        case 3:
            for (size_t k = 0; k < N_TOK; k++) logits[k] = 0;
            if (grammar_match_apply(m, logits) == 0) {
                for (size_t k = 0; k < N_TOK; k++)
                    if ((logits[k] == 0) != grammar_match_allows(m, (int32_t)k)) __builtin_trap();
            }
            break;
        case 4: {
            grammar_match *c;
            if (grammar_match_clone(m, &c) == 0) {
                grammar_match_free(m);
                m = c;
            }
            break;
        }
        default:
            if (ops[i + 1] == 0) grammar_match_reset(m);
            else (void)grammar_match_can_end(m), (void)grammar_match_must_end(m);
        }
    }
    grammar_match_free(m);
    grammar_free(g);
    return 0;
}
