/* cli_util.h - helpers for tests that run the racimo binary. */
#ifndef RC_TEST_CLI_UTIL_H
#define RC_TEST_CLI_UTIL_H

#include <stddef.h>

/* $RACIMO_BIN; skips the test when it is not set. */
const char *test_bin(void);

/* Runs a shell command; returns its exit status with stdout+stderr in out. */
int test_run(const char *cmd, char *out, size_t cap);

#endif
