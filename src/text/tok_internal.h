/* tok_internal.h - what tokenizer.c, tok_bpe.c, tok_spm.c and tok_pretok.c
 * share.  Not a public header: the rest of racimo includes tokenizer.h.
 *
 * Layout of a loaded tokenizer: `tok` holds one entry per id (text pointing
 * into the GGUF mapping); `idx` is an open-addressing hash table from text to
 * id; BPE merges live in their own table keyed by the (left id, right id)
 * pair; `special` lists the tokens the special-token splitter looks for,
 * longest first.  Everything is built by tok_load and read-only afterwards.
 */
#ifndef RC_TOK_INTERNAL_H
#define RC_TOK_INTERNAL_H

#include "text/tokenizer.h"

/* Token attributes (llama.cpp's llama_token_attr subset).  GGUF token_type
 * values map as: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER, 5 UNUSED, 6 BYTE,
 * anything else UNDEFINED. */
enum {
    TOK_ATTR_UNDEFINED = 1 << 0,
    TOK_ATTR_NORMAL    = 1 << 1,
    TOK_ATTR_UNKNOWN   = 1 << 2,
    TOK_ATTR_CONTROL   = 1 << 3,
    TOK_ATTR_USER      = 1 << 4,
    TOK_ATTR_UNUSED    = 1 << 5,
    TOK_ATTR_BYTE      = 1 << 6,
    TOK_ATTR_EOG       = 1 << 7,   /* ends generation (ours, not a GGUF type) */
};

enum { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

typedef struct {
    const char *text;     /* not NUL-terminated */
    uint32_t    len;
    float       score;
    uint16_t    attr;
    uint8_t     byte;     /* the byte of a TOK_ATTR_BYTE token */
} tok__token;

typedef struct {
    int32_t left, right;  /* token ids; left < 0 marks an empty slot */
    int32_t merged;       /* id of left+right */
    int32_t rank;         /* position in tokenizer.ggml.merges */
} tok__merge;

typedef struct tok__regex tok__regex;   /* tok_pretok.c */

struct tokenizer {
    int          kind;              /* TOK_KIND_* */
    int32_t      n_vocab;
    tok__token  *tok;               /* (n_vocab) */
    char        *owned;             /* texts made up for empty tokens */
    uint32_t    *idx;               /* text -> id+1 (0 = empty), size idx_mask+1 */
    uint32_t     idx_mask;
    uint32_t     max_token_len;

    tok__merge  *merge;             /* BPE: size merge_mask+1 */
    uint32_t     merge_mask;

    int32_t     *special;           /* ids, longest text first, then lower id */
    uint32_t     n_special;
    uint32_t    *special_idx;       /* special text -> index into special + 1 */
    uint32_t     special_idx_mask;
    uint32_t    *special_lens;      /* distinct lengths, descending */
    uint32_t     n_special_lens;
    uint8_t      special_first[32]; /* bitset of first bytes */

    const char  *pre_name;          /* static */
    tok__regex  *re;                /* BPE pre-tokenizer, n_re compiled regexes */
    int          n_re;
    bool         ignore_merges;     /* a word that is a token is not merged */

    int32_t      bos, eos, eot, eom, unk;
    bool         add_bos, add_eos, add_space_prefix;
    uint64_t    *spm_pairs;         /* SPM: set of adjacent character pairs
                                       inside tokens (0 = empty slot) */
    uint32_t     spm_pairs_mask;
    bool         spm_pair_zero;     /* the pair whose key is 0 is present */
    int32_t      byte_tok[256];     /* SPM: byte fallback id per byte, or -1;
                                       BPE: id of the byte's GPT-2 character */
};

/* ---- tokenizer.c ---- */

uint64_t tok__hash(const void *data, size_t len);

/* Id of the token with exactly this text, or -1. */
int32_t tok__lookup(const tokenizer *t, const char *text, size_t len);

/* A growable id array. */
typedef struct {
    int32_t *v;
    size_t   n, cap;
} tok__ids;

int tok__ids_push(tok__ids *a, int32_t id);

/* Scratch buffers one tok_encode call reuses for every word. */
typedef struct {
    char     *buf;   size_t buf_cap;    /* sanitised or escaped text */
    char     *word;  size_t word_cap;   /* one byte-encoded word */
    struct tok__span *sp[2]; size_t sp_cap[2];
    void     *sym;   size_t sym_cap;    /* merge symbols */
    void     *heap;  size_t heap_cap;   /* merge candidates */
    void     *md;                       /* pcre2 match data */
    void     *mctx;                     /* pcre2 match context */
    void     *jit_stack;
} tok__scratch;

/* Grows *p (element size `size`) to hold at least n elements. */
int tok__reserve(void **p, size_t *cap, size_t n, size_t size);

/* ---- tok_bpe.c ---- */

/* Builds the merge table from tokenizer.ggml.merges. */
int tok__bpe_load(tokenizer *t, const gguf_file *f);

/* Fills byte_tok with the ids of the 256 GPT-2 byte characters. */
void tok__bpe_init_bytes(tokenizer *t);

/* Encodes one raw-text fragment (no special tokens inside). */
int tok__bpe_encode(const tokenizer *t, tok__scratch *s, const char *text, size_t len,
                    tok__ids *out);

/* Decodes a token's GPT-2-alphabet text into bytes; same return contract as
 * tok_piece. */
size_t tok__bpe_decode(const char *text, size_t len, char *buf, size_t cap);

/* ---- tok_spm.c ---- */

/* Builds t->spm_pairs from the token texts. */
int tok__spm_init(tokenizer *t);

/* Whether some token holds character a (a_len bytes) directly followed by
 * character b; false means no merge can join them. */
bool tok__spm_pair_possible(const tokenizer *t, const char *a, size_t a_len,
                            const char *b, size_t b_len);

/* Encodes one raw-text fragment; `prefix_space` adds the leading space. */
int tok__spm_encode(const tokenizer *t, tok__scratch *s, const char *text, size_t len,
                    bool prefix_space, tok__ids *out);

/* ---- tok_pretok.c ---- */

typedef struct tok__span {
    uint32_t off, len;
} tok__span;

/* Flags a pre-tokenizer definition sets on the vocabulary. */
enum {
    TOK_PRE_IGNORE_MERGES = 1 << 0,   /* whole-word lookup before merging */
    TOK_PRE_ADD_BOS       = 1 << 1,   /* default add_bos true */
};

/* Compiles the regexes for tokenizer.ggml.pre = name[0..len) (name NULL when
 * absent) into t->re / t->n_re and sets t->pre_name; returns the TOK_PRE_*
 * flags (>= 0) or an error. */
int tok__pretok_init(tokenizer *t, const char *name, size_t len);
void tok__pretok_free(tokenizer *t);

/* Splits valid UTF-8 text[0..len) into words; *out (in s->sp) holds *n
 * spans covering the text in order.  Errors: RC_ENOMEM. */
int tok__pretok_split(const tokenizer *t, tok__scratch *s, const char *text, size_t len,
                      tok__span **out, size_t *n);

void tok__scratch_free(tok__scratch *s);

#endif
