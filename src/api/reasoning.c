/* reasoning.c - the splitter and template facts of reasoning.h.
 *
 * The splitter is a small state machine over `held`, the bytes not decided
 * yet; each push appends the new text to them and decides as much as it can:
 *   START   nothing decided: whitespace and a prefix of "<think>" are held;
 *           "<think>" opens the block (LEAD), anything else makes the whole
 *           answer content (CONTENT)
 *   LEAD    in the block, before its first non-space byte (dropped spaces)
 *   IN      in the block: reasoning is released up to trailing whitespace
 *           and a possible start of "</think>", which are held
 *   AFTER   after "</think>", before the content's first non-space byte
 *   CONTENT everything is content, nothing is held
 */
#include "reasoning.h"

#include <string.h>

enum { ST_CONTENT, ST_START, ST_LEAD, ST_IN, ST_AFTER };

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static size_t skip_spaces(const char *t, size_t len, size_t i)
{
    while (i < len && is_space(t[i]))
        i++;
    return i;
}

static size_t trim_spaces(const char *t, size_t len)
{
    while (len > 0 && is_space(t[len - 1]))
        len--;
    return len;
}

/* Length of the longest suffix of t[0..len) that is a proper prefix of lit. */
static size_t partial_tail(const char *t, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    for (size_t k = n - 1; k > 0; k--)
        if (len >= k && !memcmp(t + len - k, lit, k))
            return k;
    return 0;
}

void reasoning_init(reasoning_split *r, int mode)
{
    memset(r, 0, sizeof *r);
    r->state = mode == REASONING_AUTO ? ST_START : mode == REASONING_OPEN ? ST_LEAD : ST_CONTENT;
}

void reasoning_free(reasoning_split *r)
{
    sb_free(&r->held);
}

/* Drops the first n held bytes. */
static void consume(reasoning_split *r, size_t n)
{
    memmove(r->held.p, r->held.p + n, r->held.len - n);
    r->held.len -= n;
}

void reasoning_push(reasoning_split *r, const char *text, size_t len, strbuf *reasoning,
                    strbuf *content)
{
    if (r->state == ST_CONTENT) {
        sb_append(content, text, len);
        return;
    }
    sb_append(&r->held, text, len);
    if (sb_failed(&r->held)) {
        /* out of memory: what was held is lost, the rest goes out as is */
        r->state = ST_CONTENT;
        sb_append(content, text, len);
        return;
    }
    for (;;) {
        const char *h = r->held.p;
        size_t n = r->held.len, i;
        switch (r->state) {
        case ST_START:
            i = skip_spaces(h, n, 0);
            if (n - i < sizeof REASONING_OPEN_TAG - 1 &&
                !memcmp(h + i, REASONING_OPEN_TAG, n - i))
                return;                              /* may still become the tag */
            if (n - i >= sizeof REASONING_OPEN_TAG - 1 &&
                !memcmp(h + i, REASONING_OPEN_TAG, sizeof REASONING_OPEN_TAG - 1)) {
                consume(r, i + sizeof REASONING_OPEN_TAG - 1);
                r->state = ST_LEAD;
                continue;
            }
            r->state = ST_CONTENT;
            sb_append(content, h, n);
            r->held.len = 0;
            return;
        case ST_LEAD:
        case ST_AFTER:
            i = skip_spaces(h, n, 0);
            consume(r, i);
            if (!r->held.len)
                return;
            if (r->state == ST_AFTER) {
                r->state = ST_CONTENT;
                sb_append(content, r->held.p, r->held.len);
                r->held.len = 0;
                return;
            }
            r->state = ST_IN;
            continue;
        case ST_IN: {
            const char *close = memmem(h, n, REASONING_CLOSE_TAG, sizeof REASONING_CLOSE_TAG - 1);
            if (close) {
                size_t at = (size_t)(close - h);
                sb_append(reasoning, h, trim_spaces(h, at));
                consume(r, at + sizeof REASONING_CLOSE_TAG - 1);
                r->state = ST_AFTER;
                continue;
            }
            size_t keep_from = trim_spaces(h, n - partial_tail(h, n, REASONING_CLOSE_TAG));
            sb_append(reasoning, h, keep_from);
            consume(r, keep_from);
            return;
        }
        default:
            return;
        }
    }
}

void reasoning_finish(reasoning_split *r, strbuf *reasoning, strbuf *content)
{
    if (r->state == ST_START)
        sb_append(content, r->held.p, r->held.len);
    else if (r->state == ST_IN)
        sb_append(reasoning, r->held.p, trim_spaces(r->held.p, r->held.len));
    r->held.len = 0;
    r->state = ST_CONTENT;
}

bool reasoning_prompt_open(const char *prompt, size_t len)
{
    len = trim_spaces(prompt, len);
    size_t n = sizeof REASONING_OPEN_TAG - 1;
    return len >= n && !memcmp(prompt + len - n, REASONING_OPEN_TAG, n);
}

bool reasoning_template_thinks(const char *src)
{
    return src && strstr(src, REASONING_CLOSE_TAG);
}

static bool ident_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Whether `name` occurs in src as a whole identifier (so "thinking" is not
 * found inside "enable_thinking"). */
static bool mentions(const char *src, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = src; (p = strstr(p, name)); p += n)
        if ((p == src || !ident_char(p[-1])) && !ident_char(p[n]))
            return true;
    return false;
}

unsigned reasoning_template_switches(const char *src)
{
    if (!src)
        return 0;
    return (mentions(src, "enable_thinking") ? REASONING_VAR_ENABLE_THINKING : 0) |
           (mentions(src, "thinking") ? REASONING_VAR_THINKING : 0);
}

int reasoning_set_switches(unsigned switches, bool on, json_t **vars)
{
    if (!switches)
        return 0;
    if (!*vars && !(*vars = json_object()))
        return -1;
    if ((switches & REASONING_VAR_ENABLE_THINKING) &&
        json_object_set_new(*vars, "enable_thinking", json_boolean(on)))
        return -1;
    if ((switches & REASONING_VAR_THINKING) &&
        json_object_set_new(*vars, "thinking", json_boolean(on)))
        return -1;
    return 0;
}
