/* model_util.h - helpers for tests that need a model file: write a
 * synthetic model into the test's scratch directory and load it. */
#ifndef RC_TEST_MODEL_UTIL_H
#define RC_TEST_MODEL_UTIL_H

#include "model/model.h"
#include "infer/stage.h"
#include "model/synth.h"

/* Writes preset `preset` with weight type `type` (or mix "Q4_K_M" when mix
 * is non-NULL) to <tmpdir>/<preset>-<type>.gguf; returns the path (static
 * buffer).  Fails the test on error. */
const char *test_make_model(const char *preset, int type, const char *mix);

/* Writes a synthetic model of parameters `p` to <tmpdir>/<name>.gguf;
 * returns the path (static buffer).  Fails the test on error. */
const char *test_write_model(const synth_params *p, const char *name);

/* Loads layers [first, last) and builds a stage; fails the test on error. */
void test_open_stage(const char *path, int first, int last, int precision, int n_ctx,
                     int n_seq, int n_batch, int n_threads, model **m, stage **s);

/* Runs tokens at positions 0..n-1 of sequence `seq` in chunks of `chunk`
 * rows through a whole-model stage, writing n rows of logits. */
void test_run_tokens(stage *s, const int32_t *tokens, int n, int seq, int start_pos,
                     int chunk, float *logits);

/* Index of the largest of x[0..n) (the first on ties). */
int test_argmax(const float *x, int n);

#endif
