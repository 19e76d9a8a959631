/* test_base.c - the base layer: error details, allocation failure hook,
 * overflow helpers, the random generator. */
#include "test.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"

TEST(base_err_detail)
{
    rc_errclear();
    CHECK_INT(rc_fail(RC_EFORMAT, "file %s at %d", "x.gguf", 12), ==, RC_EFORMAT);
    CHECK_STR(rc_errmsg(), "file x.gguf at 12");
    rc_wrap(RC_EFORMAT, "loading: ");
    CHECK_STR(rc_errmsg(), "loading: file x.gguf at 12");
    CHECK_STR(rc_strerror(RC_ENOMEM), "out of memory");
    CHECK_STR(rc_strerror(-999), "unknown error");
}

TEST(base_mem_fail_after)
{
    void *a, *b;
    rc_mem_fail_after(1);
    a = rc_malloc(10);
    b = rc_malloc(10);
    CHECK(a != NULL);
    CHECK(b == NULL);
    rc_mem_fail_after(-1);
    b = rc_malloc(10);
    CHECK(b != NULL);
    rc_free(a);
    rc_free(b);
    CHECK(rc_calloc(SIZE_MAX / 2, 4) == NULL);   /* overflow, not a huge alloc */
}

TEST(base_rng_deterministic)
{
    rng_state a, b;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    double sum = 0, sq = 0;
    for (int i = 0; i < 100000; i++) {
        CHECK(rng_next(&a) == rng_next(&b));
        float x = rng_normal(&a);
        rng_normal(&b);
        sum += x;
        sq += (double)x * x;
    }
    CHECK_NEAR(sum / 100000, 0.0, 0.02);
    CHECK_NEAR(sq / 100000, 1.0, 0.02);
}
