/* membw.c - read bandwidth as generation sees it (membw.h): each thread
 * streams its slice of one buffer, once, reading only. */
#include "membw.h"

#include <stdatomic.h>
#include <string.h>

#include "base/mem.h"
#include "base/os.h"

enum { WORD = 8, LINE_WORDS = 8 };

typedef struct {
    const uint8_t *buf;
    uint8_t *fill;               /* first touch: write this buffer instead */
    size_t bytes;
    atomic_uint_least64_t sum;   /* the shares' XORs, XORed together */
} read_task;

static uint64_t word_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The buffer's last word when partial: its bytes, then zero bytes. */
static uint64_t tail_word(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, p, n);
    return v;
}

static void read_share(void *arg, int ith, int nth)
{
    read_task *t = arg;
    const long words = (long)((t->bytes + WORD - 1) / WORD);
    long w0, w1;
    pool_split(words, ith, nth, &w0, &w1);
    if (t->fill) {
        if (w1 > w0)
            memset(t->fill + (size_t)w0 * WORD, 0x5a,
                   ((size_t)w1 * WORD < t->bytes ? (size_t)w1 * WORD : t->bytes) - (size_t)w0 * WORD);
        return;
    }
    const uint8_t *p = t->buf;
    /* eight independent accumulators over whole 64-byte lines, named so
     * they live in registers: the loop issues loads as fast as the core
     * takes them, with no chain through one register or through memory */
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    long w = w0;
    const size_t whole = t->bytes / WORD;
    const long lim = w1 < (long)whole ? w1 : (long)whole;
    for (; w + LINE_WORDS <= lim; w += LINE_WORDS) {
        const uint8_t *q = p + (size_t)w * WORD;
        a0 ^= word_at(q);
        a1 ^= word_at(q + 8);
        a2 ^= word_at(q + 16);
        a3 ^= word_at(q + 24);
        a4 ^= word_at(q + 32);
        a5 ^= word_at(q + 40);
        a6 ^= word_at(q + 48);
        a7 ^= word_at(q + 56);
    }
    for (; w < lim; w++)
        a0 ^= word_at(p + (size_t)w * WORD);
    if (w < w1)   /* the buffer's last, partial word */
        a0 ^= tail_word(p + (size_t)w * WORD, t->bytes - (size_t)w * WORD);
    const uint64_t s = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
    atomic_fetch_xor_explicit(&t->sum, s, memory_order_relaxed);
}

uint64_t membw_read_pass(thread_pool *pool, const void *buf, size_t bytes)
{
    read_task t;
    memset(&t, 0, sizeof t);
    t.buf = buf;
    t.bytes = bytes;
    atomic_init(&t.sum, 0);
    pool_run(pool, read_share, &t);
    return (uint64_t)atomic_load(&t.sum);
}

double membw_read(thread_pool *pool, size_t bytes, int reps)
{
    uint8_t *buf = rc_malloc_aligned(64, bytes);
    if (!buf)
        return 0.0;
    os_mem_hugepages(buf, bytes);
    read_task t;
    memset(&t, 0, sizeof t);
    t.fill = buf;
    t.bytes = bytes;
    atomic_init(&t.sum, 0);
    pool_run(pool, read_share, &t);   /* page faults happen here, untimed */
    double best = 0.0;
    volatile uint64_t sink = 0;       /* the reads must not be optimised away */
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = os_now_ns();
        sink ^= membw_read_pass(pool, buf, bytes);
        double sec = (double)(os_now_ns() - t0) * 1e-9;
        if (sec > 0 && (double)bytes / sec > best)
            best = (double)bytes / sec;
    }
    (void)sink;
    rc_free_aligned(buf);
    return best;
}
