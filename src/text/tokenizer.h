/* tokenizer.h - text <-> token ids for GGUF vocabularies, as llama.cpp does it.
 *
 * Two vocabulary kinds (tokenizer.ggml.model):
 *   "gpt2"   byte-level BPE (Llama 3, Qwen2/2.5/3, DeepSeek, GPT-2...): the
 *            text is split into words by the pre-tokenizer regexes chosen by
 *            tokenizer.ggml.pre, each word's bytes are mapped to GPT-2's
 *            byte-to-unicode alphabet, and the merges of tokenizer.ggml.merges
 *            are applied lowest rank first.
 *   "llama"  SentencePiece BPE (Llama 1/2, Mistral v0.1): a space is put in
 *            front of the text (tokenizer.ggml.add_space_prefix, default
 *            true), spaces become U+2581 "▁", adjacent pieces are merged
 *            highest score first (tokenizer.ggml.scores), and characters no
 *            piece covers fall back to <0xNN> byte tokens.
 * Results equal llama.cpp's llama_tokenize / llama_token_to_piece (checked
 * against its test-tokenizer-0 data in tests/test_tokenizer.c).
 *
 * Special tokens: control (token_type 3) and unknown (2) tokens are matched
 * in the text only when parse_special is true; user-defined tokens (4) are
 * always split out of the text first, as in llama.cpp and HF tokenizers.
 * Longer special tokens are matched before shorter ones.
 *
 * Pre-tokenizers: tokenizer.ggml.pre names known to llama.cpp for the
 * supported regex families (llama3, qwen2, qwen35, deepseek-llm,
 * deepseek-coder, deepseek-v3, gpt-2, starcoder, falcon, tekken, gpt-4o,
 * chatglm, bloom/poro, default and their aliases).  A missing or unknown
 * name does not fail the load (llama.cpp refuses unknown names): it falls
 * back to llama.cpp's "default" regexes with a warning in the log, since a
 * slightly different split is more useful than no model at all.
 *
 * Invalid UTF-8 in the input: for BPE vocabularies each byte that does not
 * belong to a well-formed character is tokenized as U+FFFD (llama.cpp does
 * the same, except that it lets overlong forms and surrogates through); SPM
 * vocabularies tokenize the bytes as they are (byte fallback).
 *
 * Thread safety: a loaded tokenizer is read-only; every function below may
 * be called from several threads at once on the same tokenizer (tok_stream
 * state belongs to its caller).
 */
#ifndef RC_TOKENIZER_H
#define RC_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct tokenizer tokenizer;

/* Loads the vocabulary from `f`'s tokenizer.ggml.* metadata.
 *
 * Token strings are not copied: they point into f's mapping, so `f` must stay
 * open for as long as the tokenizer is used (close it after tok_free).
 * Everything else (ids, scores, types, merge table, hash maps, compiled
 * regexes) is owned by the tokenizer.
 *
 * Keys read: tokenizer.ggml.model (required: "gpt2" or "llama"),
 * .tokens (required, string array), .token_type, .scores, .merges (required
 * for gpt2), .pre, .bos_token_id, .eos_token_id, .eot_token_id,
 * .eom_token_id, .unknown_token_id, .fim_{pad,rep,sep}_token_id,
 * .add_bos_token, .add_eos_token, .add_space_prefix (.pre and .merges only
 * for gpt2, .scores only matter for llama).
 *
 * Returns 0 and sets *out, or (with *out = NULL and a detail naming the key):
 *   RC_EFORMAT      a key has the wrong type, an array is shorter than the
 *                   vocabulary, a merge is not "left right" or names a token
 *                   (or a merged token) that is not in the vocabulary,
 *   RC_ENOTFOUND    a required key is missing,
 *   RC_EUNSUPPORTED another tokenizer.ggml.model (bert, t5, rwkv...),
 *   RC_ELIMIT       more than 2^24 tokens or a token longer than 1 MiB,
 *   RC_ENOMEM.
 * Special token ids (bos, eos...) outside the vocabulary are ignored with a
 * warning, as llama.cpp does. */
int tok_load(const gguf_file *f, tokenizer **out);

/* Frees everything tok_load allocated; accepts NULL. */
void tok_free(tokenizer *t);

/* Number of tokens in the vocabulary (ids are 0 .. n-1). */
int tok_n_vocab(const tokenizer *t);

/* True for SentencePiece ("llama") vocabularies, false for byte-level BPE. */
bool tok_is_spm(const tokenizer *t);

/* The pre-tokenizer in use ("llama3", "qwen2", "default"...; "spm" for
 * SentencePiece vocabularies).  Static string. */
const char *tok_pre_name(const tokenizer *t);

/* Encodes text[0..len) (any bytes; need not be NUL-terminated).
 *   add_special    prepend BOS when tok_add_bos() and append EOS when the
 *                  metadata says add_eos_token,
 *   parse_special  match control-token texts such as "<|eot_id|>" in the
 *                  text and emit their ids (user-defined tokens always are).
 * On success *ids is an array allocated with rc_malloc (free it with
 * rc_free; never NULL, even for zero tokens) and *n_ids its length.
 * Errors: RC_ELIMIT for a text longer than TOK_MAX_TEXT, RC_ENOMEM; *ids is
 * NULL and *n_ids 0 then.  Thread safe.  Working memory is proportional
 * to the longest word (SPM: the longest text between special tokens), up
 * to about 40 bytes per input byte; callers serving requests should cap
 * text sizes well below TOK_MAX_TEXT. */
#define TOK_MAX_TEXT ((size_t)1 << 26)
int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t **ids, size_t *n_ids);

/* The bytes token `id` stands for, written to buf (not NUL-terminated; the
 * bytes need not be valid UTF-8 on their own, e.g. one byte of an emoji):
 * byte-level BPE text decoded from the GPT-2 alphabet (characters outside it
 * are kept as they are; llama.cpp writes "[UNK_BYTE_...]" there), SPM text
 * with "▁" turned into spaces, <0xNN> byte tokens as that byte.  Control and unknown
 * tokens give their text when `special` is true and nothing otherwise;
 * user-defined tokens always give their text; unused tokens give nothing.
 * Returns the piece's length n; like snprintf, when n > cap only the first
 * cap bytes are written (buf may be NULL when cap is 0), so a caller can
 * size its buffer and call again.  RC_ERANGE for an id outside the
 * vocabulary. */
int tok_piece(const tokenizer *t, int32_t id, bool special, char *buf, size_t cap);

/* The longest piece any token gives (a bound for tok_piece buffers). */
size_t tok_max_piece(const tokenizer *t);

/* The raw vocabulary string of token `id` (not NUL-terminated, in the
 * vocabulary's own alphabet, e.g. "Ġthe"), for chat templates' bos_token and
 * friends.  NULL (and *len 0) for an id outside the vocabulary. */
const char *tok_token_text(const tokenizer *t, int32_t id, size_t *len);

/* Id of the token whose vocabulary string is exactly `text` (NUL-terminated,
 * compared byte for byte, e.g. "<|eot_id|>"), or -1. */
int32_t tok_find_token(const tokenizer *t, const char *text);

/* Special token ids, -1 when the vocabulary has none.  Without metadata, SPM
 * vocabularies default to BOS 1, EOS 2, UNK 0 (as llama.cpp); BPE ones have
 * no default (llama.cpp's 11 is a GPT-2/Falcon leftover).  tok_eot is
 * tokenizer.ggml.eot_token_id or, when absent, the first of <|eot_id|>,
 * <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|end_of_text|>, <EOT>,
 * _<EOT>, [EOT], <｜end▁of▁sentence｜>, <end_of_utterance> found in the
 * vocabulary; tok_eom likewise with <|eom_id|>. */
int32_t tok_bos(const tokenizer *t);
int32_t tok_eos(const tokenizer *t);
int32_t tok_eot(const tokenizer *t);
int32_t tok_eom(const tokenizer *t);

/* End of generation: eos, eot, eom, and every token llama.cpp treats as such
 * by its text (<|eot_id|>, <|eom_id|>, <|im_end|>, <|endoftext|>,
 * <end_of_turn>, <|end_of_text|>, <｜end▁of▁sentence｜>, FIM pad/repo/sep
 * tokens...).  False for ids outside the vocabulary. */
bool tok_is_eog(const tokenizer *t, int32_t id);

/* True for control tokens (rendered by tok_piece only with special). */
bool tok_is_control(const tokenizer *t, int32_t id);

/* Whether tok_encode(add_special) prepends BOS: tokenizer.ggml.add_bos_token,
 * by default true for SPM and for the llama3/tekken/chameleon
 * pre-tokenizers, false for other BPE vocabularies; always false when the
 * vocabulary has no BOS id. */
bool tok_add_bos(const tokenizer *t);
bool tok_add_eos(const tokenizer *t);

/* Detokenizes a whole sequence into a rc_malloc'd NUL-terminated string
 * (*out, length *out_len; free with rc_free): the concatenated pieces, and
 * for vocabularies that add a space prefix (SPM) one leading space of the
 * first piece removed unless the sequence starts with BOS (as
 * llama_detokenize).  Invalid UTF-8 is kept as is.  RC_ERANGE for an id
 * outside the vocabulary, RC_ENOMEM. */
int tok_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, bool special,
               char **out, size_t *out_len);

/* Streaming detokenizer: turns a token at a time into text that is always
 * valid UTF-8, holding back the start of a character whose bytes continue
 * in the next token. */
typedef struct {
    char pending[8];   /* held-back bytes: a proper prefix of one character */
    int  n_pending;
} tok_stream;

/* A size for tok_stream_push/flush's `out` that is always large enough. */
#define TOK_STREAM_OUT_MAX(t) (4 * (tok_max_piece(t) + 8))

void tok_stream_init(tok_stream *s);

/* Appends token `id`'s piece (see tok_piece) to the held-back bytes and
 * writes to out every complete character; bytes that cannot start or
 * continue a character are written as U+FFFD.  Returns the bytes written
 * (0 is common: an empty piece, or only part of a character so far).
 * Errors leave *s unchanged: RC_ERANGE for an id outside the vocabulary or
 * `cap` too small (TOK_STREAM_OUT_MAX(t) always suffices). */
int tok_stream_push(const tokenizer *t, tok_stream *s, int32_t id, bool special,
                    char *out, size_t cap);

/* Ends the stream: writes U+FFFD for held-back bytes (an unfinished
 * character), resets *s and returns the bytes written (0 or 3); RC_ERANGE
 * (state kept) if cap < 3 while bytes are pending. */
int tok_stream_flush(tok_stream *s, char *out, size_t cap);

#endif
