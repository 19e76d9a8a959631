/* test_membw.c - the read measure behind `racimo bench`'s generation roof
 * reads every byte of its buffer once whatever the thread split (the bytes
 * per token it is divided by: test_model.c, model_decode_bytes). */
#include "test.h"

#include <string.h>

#include "base/rng.h"
#include "tensor/membw.h"
#include "tensor/pool.h"

/* The checksum membw_read_pass promises, computed plainly. */
static uint64_t xor_words(const uint8_t *p, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i < 8 ? n - i : 8);
        s ^= w;
    }
    return s;
}

TEST(membw_read_pass_reads_each_byte_once)
{
    rng_state r;
    rng_seed(&r, 4242);
    enum { MAX = 70001 };
    uint8_t *buf = malloc(MAX);
    for (int i = 0; i < MAX; i++)
        buf[i] = (uint8_t)rng_next(&r);
    static const size_t sizes[] = { 0, 1, 7, 8, 9, 63, 64, 65, 130, 4096 + 3, 65536, MAX };
    static const int threads[] = { 1, 2, 3, 5 };
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        thread_pool *pool = pool_new(threads[t]);
        CHECK(pool != NULL);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            /* odd start too: the pass must not assume alignment */
            for (size_t off = 0; off < 2; off++) {
                size_t n = sizes[k] - (sizes[k] && off ? 1 : 0);
                uint64_t got = membw_read_pass(pool, buf + off, n);
                uint64_t want = xor_words(buf + off, n);
                if (got != want)
                    FAIL("%d threads, %zu bytes at offset %zu: %016llx, want %016llx", threads[t],
                         n, off, (unsigned long long)got, (unsigned long long)want);
            }
        }
        pool_free(pool);
    }
    free(buf);
}

TEST(membw_read_measures)
{
    thread_pool *pool = pool_new(2);
    /* small and quick: only that a rate comes out, not how fast */
    double bw = membw_read(pool, (size_t)4 << 20, 2);
    CHECK(bw > 0);
    pool_free(pool);
}
