/* schema_util.h - helpers for tests of grammars made from schemas and tools:
 * a byte-level vocabulary, whole-document matching, and random sentences. */
#ifndef RC_TEST_SCHEMA_UTIL_H
#define RC_TEST_SCHEMA_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar/grammar.h"

/* The tiny synthetic model's vocabulary (byte-level: any text can be
 * matched); made once per test process.  Fails the test on error. */
const grammar_vocab *test_schema_vocab(void);

/* Compiles gbnf; fails the test (printing the grammar) when it does not. */
grammar *test_schema_compile(const char *gbnf);

/* Whether the whole of doc is a complete sentence of g. */
bool test_schema_matches(const grammar *g, const char *doc);

/* A random sentence of g, as a random-weight model under the grammar writes
 * one: each token drawn uniformly among those the grammar allows whose text
 * is whole characters (DeepSeek's marker characters, which the tiny
 * vocabulary splits, as text), ending (when it can) with probability 1/4 per
 * token, at most max_tokens tokens.
 * Returns rc_malloc'd text, or NULL if it did not end within max_tokens. */
char *test_schema_walk(const grammar *g, uint64_t seed, int max_tokens);

#endif
