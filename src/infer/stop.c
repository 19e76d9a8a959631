/* stop.c - stop-string matching over streamed text.
 *
 * Invariant between calls: buf[hold_at, hold_at + n_held) is the held tail,
 * the longest suffix of everything pushed that is a proper prefix of some
 * stop string (so shorter than the longest stop), and it contains no
 * complete stop string.  Bytes before it were released.  A push moves the
 * held tail to the front, appends the new text, looks for the stop that
 * completes first, and otherwise holds the new longest such suffix.
 */
#include "stop.h"
#include "base/err.h"
#include "base/mem.h"

#include <string.h>

struct stop_matcher {
    int     n;            /* non-empty stop strings */
    char  **str;          /* [n] copies */
    size_t *len;          /* [n] */
    int    *index;        /* [n] position in the caller's array */
    char   *buf;          /* held tail + the latest text */
    size_t  cap, hold_at, n_held;
    int     matched;      /* caller's index of the completed stop, or -1 */
};

int stop_new(const char *const *stops, int n, stop_matcher **out)
{
    stop_matcher *m;
    int rc = RC_ENOMEM;

    *out = NULL;
    if (n < 0 || (n > 0 && !stops))
        return rc_fail(RC_EINVAL, "stop: %d strings without an array", n);
    if (n > STOP_MAX_STRINGS)
        return rc_fail(RC_ELIMIT, "stop: %d strings, at most %d", n, STOP_MAX_STRINGS);
    for (int i = 0; i < n; i++) {
        if (!stops[i])
            return rc_fail(RC_EINVAL, "stop: string %d is NULL", i);
        if (strlen(stops[i]) > STOP_MAX_BYTES)
            return rc_fail(RC_ELIMIT, "stop: string %d is %zu bytes, at most %d",
                           i, strlen(stops[i]), STOP_MAX_BYTES);
    }
    m = rc_calloc(1, sizeof *m);
    if (!m)
        goto fail;
    m->matched = -1;
    if (n > 0) {
        m->str = rc_calloc((size_t)n, sizeof(char *));
        m->len = rc_calloc((size_t)n, sizeof(size_t));
        m->index = rc_calloc((size_t)n, sizeof(int));
        if (!m->str || !m->len || !m->index)
            goto fail;
    }
    for (int i = 0; i < n; i++) {
        if (!stops[i][0])
            continue;
        if (!(m->str[m->n] = rc_strdup(stops[i])))
            goto fail;
        m->len[m->n] = strlen(stops[i]);
        m->index[m->n] = i;
        m->n++;
    }
    *out = m;
    return 0;

fail:
    stop_free(m);
    return rc_fail(rc, "stop: out of memory");
}

void stop_free(stop_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++)
        rc_free(m->str[i]);
    rc_free(m->str);
    rc_free(m->len);
    rc_free(m->index);
    rc_free(m->buf);
    rc_free(m);
}

/* Offset of the first occurrence of pat[0, n) in s[0, len), or -1. */
static long find(const char *s, size_t len, const char *pat, size_t n)
{
    const char *p = s, *end = s + len;
    while ((size_t)(end - p) >= n) {
        p = memchr(p, (unsigned char)pat[0], (size_t)(end - p) - n + 1);
        if (!p)
            return -1;
        if (memcmp(p, pat, n) == 0)
            return (long)(p - s);
        p++;
    }
    return -1;
}

/* Length of the longest suffix of s[0, len) that is a proper prefix of a
 * stop string. */
static size_t held_suffix(const stop_matcher *m, const char *s, size_t len)
{
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t k = m->len[i] - 1;
        if (k > len)
            k = len;
        for (; k > best; k--)
            if (memcmp(s + len - k, m->str[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

int stop_push(stop_matcher *m, const char *text, size_t len,
              const char **emit, size_t *emit_len)
{
    size_t total;

    *emit = m->buf;
    *emit_len = 0;
    if (m->matched >= 0)
        return 1;
    if (rc_add_size(m->n_held, len, &total))
        return rc_fail(RC_ELIMIT, "stop: text of %zu bytes too long", len);
    if (total > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < total)
            if (rc_mul_size(cap, 2, &cap))
                return rc_fail(RC_ELIMIT, "stop: text of %zu bytes too long", len);
        char *nb = rc_realloc(m->buf, cap);
        if (!nb)
            return rc_fail(RC_ENOMEM, "stop: out of memory for %zu bytes", cap);
        m->buf = nb;
        m->cap = cap;
    }
    if (m->n_held)
        memmove(m->buf, m->buf + m->hold_at, m->n_held);
    if (len)
        memcpy(m->buf + m->n_held, text, len);
    *emit = m->buf;

    /* The stop that completes first; the held tail had none, so any
     * occurrence ends in the new text. */
    size_t best_end = (size_t)-1, best_start = 0;
    int best = -1;
    for (int i = 0; i < m->n; i++) {
        long at = find(m->buf, total, m->str[i], m->len[i]);
        if (at < 0)
            continue;
        size_t end = (size_t)at + m->len[i];
        if (end < best_end || (end == best_end && (size_t)at < best_start)) {
            best_end = end;
            best_start = (size_t)at;
            best = i;
        }
    }
    if (best >= 0) {
        m->matched = m->index[best];
        m->n_held = 0;
        *emit_len = best_start;
        return 1;
    }

    m->n_held = held_suffix(m, m->buf, total);
    m->hold_at = total - m->n_held;
    *emit_len = m->hold_at;
    return 0;
}

void stop_flush(stop_matcher *m, const char **emit, size_t *emit_len)
{
    *emit = m->buf ? m->buf + m->hold_at : m->buf;
    *emit_len = m->matched >= 0 ? 0 : m->n_held;
    m->n_held = 0;
}

int stop_matched(const stop_matcher *m) { return m->matched; }

void stop_reset(stop_matcher *m)
{
    m->n_held = 0;
    m->hold_at = 0;
    m->matched = -1;
}
