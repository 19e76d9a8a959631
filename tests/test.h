/* test.h - the test registry and assertion macros.
 *
 * TEST(name) { ... } defines a test and registers it at load time; the runner
 * (runner.c) runs each test in its own process with a timeout, so a crash or
 * a hang fails that test only.  Assertions print both values and file:line,
 * then fail the test.  SKIP("why") ends a test as skipped (e.g. golden data
 * absent), which the closing line counts apart.
 */
#ifndef RC_TEST_H
#define RC_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, int timeout_s);

#define TEST_SKIP_CODE 77

#define TEST_T(name, timeout)                                               \
    static void test_##name(void);                                          \
    __attribute__((constructor)) static void test_reg_##name(void)          \
    { test_register(#name, test_##name, (timeout)); }                       \
    static void test_##name(void)
#define TEST(name) TEST_T(name, 60)

#define FAIL(...) do {                                                      \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                   \
        fprintf(stderr, __VA_ARGS__);                                       \
        fputc('\n', stderr);                                                \
        exit(1);                                                            \
    } while (0)

#define SKIP(...) do {                                                      \
        fprintf(stderr, "  skipped: ");                                     \
        fprintf(stderr, __VA_ARGS__);                                       \
        fputc('\n', stderr);                                                \
        exit(TEST_SKIP_CODE);                                               \
    } while (0)

#define CHECK(cond) do { if (!(cond)) FAIL("check failed: %s", #cond); } while (0)

#define CHECK_INT(a, op, b) do {                                            \
        long long va_ = (long long)(a), vb_ = (long long)(b);               \
        if (!(va_ op vb_))                                                  \
            FAIL("%s %s %s: %lld vs %lld", #a, #op, #b, va_, vb_);          \
    } while (0)

#define CHECK_NEAR(a, b, tol) do {                                          \
        double va_ = (double)(a), vb_ = (double)(b), t_ = (double)(tol);    \
        if (!(fabs(va_ - vb_) <= t_))                                       \
            FAIL("%s ~ %s: %.9g vs %.9g (|diff| %.3g > %.3g)",              \
                 #a, #b, va_, vb_, fabs(va_ - vb_), t_);                    \
    } while (0)

#define CHECK_STR(a, b) do {                                                \
        const char *sa_ = (a), *sb_ = (b);                                  \
        if (!sa_ || !sb_ || strcmp(sa_, sb_))                               \
            FAIL("%s == %s: \"%s\" vs \"%s\"", #a, #b,                      \
                 sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");               \
    } while (0)

/* A call that must succeed (return 0); prints the error detail if not. */
#define CHECK_OK(call) do {                                                 \
        int rc_ = (call);                                                   \
        if (rc_ != 0)                                                       \
            FAIL("%s returned %d: %s", #call, rc_, rc_errmsg());            \
    } while (0)

/* A path for scratch files, unique to this test process. */
const char *test_tmpdir(void);

/* ../shared/golden relative to the repository, or $RACIMO_GOLDEN; NULL (and
 * the caller skips) when absent. */
const char *test_golden_dir(void);

#endif
