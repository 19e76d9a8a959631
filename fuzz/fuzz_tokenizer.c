/* fuzz_tokenizer.c - libFuzzer target for the tokenizers.
 *
 * The first input byte picks the vocabulary (a small byte-level BPE one
 * under one of several pre-tokenizers, or a small SentencePiece one with
 * byte fallback) and the flags; the rest is the text.  Each run:
 *   - encodes the text (parse_special on or off) and checks every id is in
 *     the vocabulary;
 *   - decodes it and checks the round trip: byte-level BPE gives back the
 *     text with invalid UTF-8 replaced by U+FFFD (special tokens rendered),
 *     SPM gives back the bytes when no special token or literal U+2581 got in
 *     the way;
 *   - streams the ids through tok_stream and checks every chunk is valid
 *     UTF-8;
 *   - reads the text again as arbitrary ids (in range or not) for tok_piece
 *     and the stream.
 * The vocabularies are built once with the GGUF writer and kept.  Seeds:
 * fuzz/corpus/tokenizer.
 */
#include "base/err.h"
#include "base/mem.h"
#include "model/gguf.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- the vocabularies ---- */

static void gpt2_char(int b, char out[4])
{
    int cp = b, k = 0;
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!printable) {
        for (int c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
                k++;
        cp = 256 + k;
    }
    memset(out, 0, 4);
    utf8_encode((uint32_t)cp, out);
}

static const char *const BPE_EXTRA[] = {
    "ab", "bc", "abc", "\xC4\xA0\x61", "he", "ll", "hell", "hello", "\xC4\xA0hello",
    "\xC4\xA0\xC4\xA0", "\xC4\x8A\xC4\x8A", "12", "123",
    "<|eot|>", "<|endoftext|>", "<U>", "<U>yy", "<|im_end|>",
};
static const int32_t BPE_EXTRA_TYPE[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 4, 4, 3 };
static const char *const BPE_MERGES[] = {
    "b c", "a b", "ab c", "\xC4\xA0 a", "h e", "l l", "he ll", "hell o", "\xC4\xA0 hello",
    "\xC4\xA0 \xC4\xA0", "\xC4\x8A \xC4\x8A", "1 2", "12 3",
};
#define N_EXTRA (sizeof BPE_EXTRA / sizeof BPE_EXTRA[0])

static const char *const PRES[] = {
    "llama3", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "deepseek-v3", "gpt-2",
    "starcoder", "falcon", "tekken", "gpt-4o", "bloom", "viking", "default", "chatglm-bpe",
};
#define N_PRES (sizeof PRES / sizeof PRES[0])

typedef struct {
    uint8_t   *buf;
    gguf_file *f;
    tokenizer *t;
} vocab;

static tokenizer *finish(gguf_writer *w, vocab *v)
{
    size_t size;
    if (!w || gguf_writer_write_mem(w, NULL, NULL, &v->buf, &size) ||
        gguf_parse(v->buf, size, "fuzz.gguf", &v->f) || tok_load(v->f, &v->t)) {
        fprintf(stderr, "fuzz_tokenizer: building the vocabulary failed: %s\n", rc_errmsg());
        abort();
    }
    gguf_writer_free(w);
    return v->t;
}

static tokenizer *bpe_vocab(unsigned pre)
{
    static vocab cache[N_PRES];
    if (cache[pre].t)
        return cache[pre].t;
    static char bytes[256][4];
    const char *tokens[256 + N_EXTRA];
    int32_t types[256 + N_EXTRA];
    for (int b = 0; b < 256; b++) {
        gpt2_char(b, bytes[b]);
        tokens[b] = bytes[b];
        types[b] = 1;
    }
    for (size_t i = 0; i < N_EXTRA; i++) {
        tokens[256 + i] = BPE_EXTRA[i];
        types[256 + i] = BPE_EXTRA_TYPE[i];
    }
    gguf_writer *w = gguf_writer_new();
    if (!w || gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") ||
        gguf_writer_set_str(w, "tokenizer.ggml.pre", PRES[pre]) ||
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 256 + N_EXTRA) ||
        gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 256 + N_EXTRA) ||
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", BPE_MERGES,
                                sizeof BPE_MERGES / sizeof BPE_MERGES[0]) ||
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 256 + 14) ||
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256 + 14))
        abort();
    return finish(w, &cache[pre]);
}

/* SPM: <unk> <s> </s>, 256 byte tokens, then pieces with scores. */
static const char *const SPM_EXTRA[] = {
    "\xE2\x96\x81", "a", "b", "\xE2\x96\x81\x61", "ab", "\xE2\x96\x81\x61\x62", "c",
    "\xE2\x96\x81\xE2\x96\x81", "\xC3\xB1", "\xE2\x96\x81\xC3\xB1", "[U]", "<|x|>",
};
static const float SPM_SCORE[] = { -4, -5, -6, -3, -2, -1, -7, -3.5f, -8, -2.5f, 0, 0 };
static const int32_t SPM_TYPE[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 3 };
#define N_SPM (3 + 256 + sizeof SPM_EXTRA / sizeof SPM_EXTRA[0])

static tokenizer *spm_vocab(void)
{
    static vocab v;
    if (v.t)
        return v.t;
    static char bytes[256][8];
    const char *tokens[N_SPM];
    int32_t types[N_SPM];
    float scores[N_SPM];
    tokens[0] = "<unk>"; tokens[1] = "<s>"; tokens[2] = "</s>";
    types[0] = 2; types[1] = 3; types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tokens[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    for (size_t i = 0; i < N_SPM; i++)
        scores[i] = 0;
    for (size_t i = 0; i < sizeof SPM_EXTRA / sizeof SPM_EXTRA[0]; i++) {
        tokens[259 + i] = SPM_EXTRA[i];
        types[259 + i] = SPM_TYPE[i];
        scores[259 + i] = SPM_SCORE[i];
    }
    gguf_writer *w = gguf_writer_new();
    if (!w || gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") ||
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_SPM) ||
        gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, N_SPM) ||
        gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, N_SPM))
        abort();
    return finish(w, &v);
}

/* ---- checks ---- */

static void check_valid_utf8(const char *s, int n)
{
    for (int i = 0; i < n;) {
        size_t len;
        if (utf8_check((const uint8_t *)s + i, (size_t)(n - i), &len) != UTF8_VALID)
            abort();
        i += (int)len;
    }
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len;
        if (utf8_check((const uint8_t *)s + i, n - i, &len) != UTF8_VALID)
            return false;
        i += len;
    }
    return true;
}

/* Streams ids through tok_stream; every chunk must be whole characters. */
static void stream_ids(const tokenizer *t, const int32_t *ids, size_t n, bool special)
{
    size_t cap = TOK_STREAM_OUT_MAX(t);
    char *out = malloc(cap);
    tok_stream s;
    tok_stream_init(&s);
    for (size_t i = 0; i < n; i++) {
        int k = tok_stream_push(t, &s, ids[i], special, out, cap);
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) {
            if (k != RC_ERANGE)
                abort();
            continue;
        }
        if (k < 0 || s.n_pending < 0 || s.n_pending > 3)
            abort();
        check_valid_utf8(out, k);
    }
    int k = tok_stream_flush(&s, out, cap);
    if (k < 0 || s.n_pending != 0)
        abort();
    check_valid_utf8(out, k);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    bool spm = mode & 1, parse_special = mode & 2, add_special = mode & 4;
    const tokenizer *t = spm ? spm_vocab() : bpe_vocab((unsigned)(mode >> 3) % N_PRES);
    int32_t n_vocab = tok_n_vocab(t);

    int32_t *ids;
    size_t n;
    if (tok_encode(t, text, len, add_special, parse_special, &ids, &n))
        abort();
    bool has_special = false;   /* SPM: <unk> <s> </s> [U] <|x|> */
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab)
            abort();
        if (spm && (ids[i] < 3 || ids[i] >= 259 + 10))
            has_special = true;
    }

    char *back;
    size_t blen;
    if (tok_decode(t, ids, n, true, &back, &blen) || back[blen] != 0)
        abort();
    if (!add_special) {
        if (!spm) {
            char *want = malloc(3 * len + 1);
            size_t wl = utf8_sanitize(text, len, want);
            if (wl != blen || memcmp(want, back, wl) != 0)
                abort();
            free(want);
        } else if (!has_special && !memmem(text, len, "\xE2\x96\x81", 3) && valid_utf8(text, len)) {
            /* (invalid UTF-8 may swallow the bytes of a "▁" made from a
             * space, in llama.cpp too, so only valid text round-trips) */
            if (blen != len || memcmp(text, back, len) != 0)
                abort();
        }
    }
    rc_free(back);
    stream_ids(t, ids, n, mode & 8);
    rc_free(ids);

    /* The text as arbitrary ids, some outside the vocabulary. */
    size_t m = len / 2;
    int32_t *raw = malloc((m + 1) * sizeof *raw);
    for (size_t i = 0; i < m; i++) {
        int v = (uint8_t)text[2 * i] | (uint8_t)text[2 * i + 1] << 8;
        raw[i] = (int32_t)(v % (n_vocab + 8)) - 4;
        char buf[64];
        int k = tok_piece(t, raw[i], mode & 16, buf, sizeof buf);
        if ((raw[i] < 0 || raw[i] >= n_vocab) != (k == RC_ERANGE) || (k >= 0 && (size_t)k > tok_max_piece(t)))
            abort();
    }
    stream_ids(t, raw, m, mode & 16);
    free(raw);
    return 0;
}
