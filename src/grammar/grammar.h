/* grammar.h - GBNF grammars that constrain which tokens may come next.
 *
 * Layer: above text/ (tokenizer), below infer/ (the sampler masks logits with
 * it).  Three objects:
 *   grammar        a compiled GBNF text, immutable, shared by any number of
 *                  threads and sequences,
 *   grammar_vocab  one model's vocabulary as byte strings in a trie, built
 *                  once per loaded model, immutable and shareable,
 *   grammar_match  one sequence's position in one grammar (mutable, owned by
 *                  one thread at a time).
 *
 * Format: llama.cpp's GBNF (grammars/README.md there):
 *   rule ::= alternatives       one rule per definition; the start rule is `root`
 *   "text"                      a literal, escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH
 *   [a-z0-9_] [^"\\]            a character class with ranges; ^ negates it
 *   .                           any one character (code point)
 *   ( ... )                     grouping; newlines are allowed inside groups
 *   a | b                       alternation
 *   x* x+ x? x{m} x{m,} x{m,n}  repetition
 *   # ...                       comment to the end of the line
 * Matching is over Unicode code points of UTF-8 text; a token may end in the
 * middle of a character (bytes of a partial sequence are tracked).
 *
 * Errors use err.h's codes with rc_errmsg() naming what was wrong; nothing
 * here aborts on hostile input.
 */
#ifndef RC_GRAMMAR_H
#define RC_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Bounds a grammar must stay within (each named in its error message).  They
 * keep a hostile grammar from eating memory or time; real grammars (JSON,
 * tool calls, schemas of a few hundred properties) are far below them. */
#define GRAMMAR_MAX_TEXT      (1u << 20)   /* bytes of GBNF text */
#define GRAMMAR_MAX_RULES     65536        /* rules, incl. those made for groups and repetitions */
#define GRAMMAR_MAX_ALTS      4096         /* alternatives of one rule */
#define GRAMMAR_MAX_NESTING   64           /* depth of ( ) groups */
#define GRAMMAR_MAX_REPEAT    10000        /* m and n of {m,n} */
#define GRAMMAR_MAX_ELEMENTS  (1u << 20)   /* compiled size: elements of all rules after expanding {m,n} */
#define GRAMMAR_MAX_STACKS    4096         /* live parse stacks of a match (ambiguity bound) */

/* A compiled GBNF grammar (llama.cpp's grammar format: `name ::= ...` rules, "strings" with
 * escapes, [a-z] / [^"\\] classes, ( ) grouping, | alternation, * + ? {m} {m,} {m,n}
 * repetition, . any character, # comments; the start rule is `root`).  Immutable once made:
 * several threads may share one. */
typedef struct grammar grammar;

/* Compiles gbnf[0..len) (need not be NUL-terminated).  Returns 0 and sets *out,
 * or (with *out = NULL) RC_EINVAL with rc_errmsg() naming line, column and what
 * is wrong (syntax, undefined rule, no `root`, left recursion, unterminated
 * string, a limit above exceeded...), RC_ENOMEM.  Bounded: limits on rules,
 * nesting and size are checked, so a hostile grammar is refused rather than
 * eating memory or time. */
int  grammar_compile(const char *gbnf, size_t len, grammar **out);
/* Accepts NULL. */
void grammar_free(grammar *g);

/* One model's vocabulary as byte strings, precomputed once (a trie) so that masks
 * cost far less than a scan of the vocabulary.  Control/special tokens match the bytes of
 * their text (so "<tool_call>" in a grammar matches Qwen's single <tool_call> token);
 * end-of-generation tokens (tok_is_eog) are allowed exactly when the grammar can end;
 * tokens with an empty piece are never allowed.  The tokenizer is only read
 * during the call.  Immutable: share it between sequences and threads.
 * Returns 0, RC_ENOMEM or RC_EINVAL (t NULL). */
typedef struct grammar_vocab grammar_vocab;
int  grammar_vocab_new(const tokenizer *t, grammar_vocab **out);
/* Accepts NULL. */
void grammar_vocab_free(grammar_vocab *v);
/* Number of token ids (the length of the logits grammar_match_apply masks). */
int  grammar_vocab_n(const grammar_vocab *v);

/* One sequence's place in a grammar.  Keeps pointers to g and v: both must
 * outlive it.  Not thread safe (one sequence, one thread at a time). */
typedef struct grammar_match grammar_match;
/* A match at the start of `root`.  RC_ENOMEM. */
int  grammar_match_new(const grammar *g, const grammar_vocab *v, grammar_match **out);
/* Accepts NULL. */
void grammar_match_free(grammar_match *m);
/* An independent copy at the same position (n > 1 choices, tensor-parallel
 * replicas).  RC_ENOMEM. */
int  grammar_match_clone(const grammar_match *m, grammar_match **out);
/* Back to the start of `root`. */
void grammar_match_reset(grammar_match *m);

/* Whether `token` may come next (cheap: walks only that token's bytes; the
 * sampler tries the unconstrained choice first and masks only when this says
 * no).  False for ids outside the vocabulary. */
bool grammar_match_allows(grammar_match *m, int32_t token);
/* Sets logits of every token not allowed next to -INFINITY (n_vocab floats,
 * n_vocab = grammar_vocab_n).  Returns 0, or RC_ELIMIT if the grammar is so
 * ambiguous here that the walk would exceed its bounds (logits then
 * unchanged, message in rc_errmsg). */
int  grammar_match_apply(grammar_match *m, float *logits);
/* Advances past a token: 0, RC_EINVAL if the token is not allowed here (the
 * match is unchanged), RC_ELIMIT if the grammar is too ambiguous (more than
 * GRAMMAR_MAX_STACKS live stacks; the match is unchanged).  An end-of-generation
 * token is accepted when the grammar can end and leaves the match ended: from
 * then on only end-of-generation tokens are allowed. */
int  grammar_match_accept(grammar_match *m, int32_t token);
/* Advances past text (for prompts / lazy starts); UTF-8 may stop in the middle
 * of a character.  Same returns as grammar_match_accept; on failure the match
 * is unchanged. */
int  grammar_match_accept_text(grammar_match *m, const char *s, size_t n);
/* The grammar is complete here (an end-of-generation token may come), and nothing more can
 * follow (the engine stops the sequence). */
bool grammar_match_can_end(const grammar_match *m);
bool grammar_match_must_end(const grammar_match *m);

#endif
