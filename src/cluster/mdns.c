/* mdns.c - DNS message writer and parser for mDNS / DNS-SD (mdns.h).
 *
 * The parser treats every byte as hostile: every length is checked against
 * what remains, compression pointers must point strictly backwards (so no
 * loop is possible) and are followed at most MAX_JUMPS times, names stay
 * within 255 wire bytes.  The writer never compresses names (RFC 1035
 * allows it; packets stay far below the MTU without it).
 */
#include "cluster/mdns.h"

#include "base/err.h"

#include <stdio.h>
#include <string.h>

#define MAX_JUMPS 32

/* ---- names ---- */

/* Appends one wire label as presentation text; -1 when out of room. */
static int label_text(const uint8_t *l, size_t n, char *out, size_t cap, size_t *pos)
{
    for (size_t i = 0; i < n; i++) {
        char tmp[5];
        uint8_t c = l[i];
        size_t k;
        if (c == '.' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            k = 2;
        } else if (c < 0x21 && c != ' ') {
            snprintf(tmp, sizeof tmp, "\\%03u", c);
            k = 4;
        } else if (c == 0x7f) {
            memcpy(tmp, "\\127", 4);
            k = 4;
        } else {
            tmp[0] = (char)c;
            k = 1;
        }
        if (*pos + k + 1 > cap)
            return -1;
        memcpy(out + *pos, tmp, k);
        *pos += k;
    }
    out[*pos] = 0;
    return 0;
}

void mdns_label_escape(const char *label, char *out, size_t cap)
{
    size_t pos = 0;
    if (cap)
        out[0] = 0;
    if (label_text((const uint8_t *)label, strlen(label), out, cap, &pos) < 0 && cap)
        out[0] = 0;
}

/* Reads a (possibly compressed) name at *off; advances *off past it in the
 * record (not past pointed-to bytes). */
static int read_name(const uint8_t *p, size_t n, size_t *off, char *out)
{
    size_t at = *off, pos = 0, wire = 0, limit = at;
    int jumps = 0;
    bool jumped = false;
    out[0] = 0;
    for (;;) {
        if (at >= n)
            return -1;
        uint8_t len = p[at];
        if (len == 0) {
            if (!jumped)
                *off = at + 1;
            return 0;
        }
        if ((len & 0xc0) == 0xc0) {
            if (at + 1 >= n || ++jumps > MAX_JUMPS)
                return -1;
            size_t to = (size_t)(len & 0x3f) << 8 | p[at + 1];
            if (!jumped)
                *off = at + 2;
            if (to >= limit)      /* strictly backwards: no loops */
                return -1;
            jumped = true;
            limit = to;
            at = to;
            continue;
        }
        if (len & 0xc0)
            return -1;            /* 0x40 / 0x80 label types are obsolete */
        if (at + 1 + len > n || (wire += (size_t)len + 1) > 254)
            return -1;
        if (pos) {
            if (pos + 2 > MDNS_NAME_MAX)
                return -1;
            out[pos++] = '.';
            out[pos] = 0;
        }
        if (label_text(p + at + 1, len, out, MDNS_NAME_MAX, &pos) < 0)
            return -1;
        at += 1 + (size_t)len;
        if (!jumped)
            limit = at;
    }
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

bool mdns_name_eq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (lower((unsigned char)*a) != lower((unsigned char)*b))
            return false;
    /* a trailing root dot is optional */
    if (*a == '.' && !a[1])
        a++;
    if (*b == '.' && !b[1])
        b++;
    return !*a && !*b;
}

/* ---- parsing ---- */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int mdns_parse(const uint8_t *p, size_t n, mdns_packet *out)
{
    out->n_qs = out->n_rrs = 0;
    if (n < 12)
        return rc_fail(RC_EFORMAT, "mDNS packet of %zu bytes is shorter than a header", n);
    out->id = get16(p);
    out->flags = get16(p + 2);
    out->response = out->flags & 0x8000;
    int qd = get16(p + 4), counts[3] = { get16(p + 6), get16(p + 8), get16(p + 10) };
    size_t off = 12;
    char scratch[MDNS_NAME_MAX];
    for (int i = 0; i < qd; i++) {
        mdns_question *q = out->n_qs < MDNS_MAX_QS ? &out->qs[out->n_qs] : NULL;
        if (read_name(p, n, &off, q ? q->name : scratch) < 0 || off + 4 > n)
            return rc_fail(RC_EFORMAT, "mDNS question %d is malformed", i);
        if (q) {
            q->type = get16(p + off);
            q->klass = get16(p + off + 2);
            out->n_qs++;
        }
        off += 4;
    }
    for (int sec = 0; sec < 3; sec++) {
        for (int i = 0; i < counts[sec]; i++) {
            mdns_rr tmp, *r = out->n_rrs < MDNS_MAX_RRS ? &out->rrs[out->n_rrs] : &tmp;
            if (read_name(p, n, &off, r->name) < 0 || off + 10 > n)
                return rc_fail(RC_EFORMAT, "mDNS record %d is malformed", i);
            r->type = get16(p + off);
            r->klass = get16(p + off + 2);
            r->ttl = get32(p + off + 4);
            uint16_t rdlen = get16(p + off + 8);
            off += 10;
            if (off + rdlen > n)
                return rc_fail(RC_EFORMAT, "mDNS record data overruns the packet");
            r->section = sec;
            r->rdata = p + off;
            r->n_rdata = rdlen;
            r->target[0] = 0;
            r->port = r->priority = r->weight = 0;
            memset(r->addr, 0, 4);
            size_t end = off + rdlen, at = off;
            int bad = 0;
            switch (r->type) {
            case MDNS_PTR:
                bad = read_name(p, end, &at, r->target) < 0 || at != end;
                break;
            case MDNS_SRV:
                if (rdlen < 7) {
                    bad = 1;
                    break;
                }
                r->priority = get16(p + off);
                r->weight = get16(p + off + 2);
                r->port = get16(p + off + 4);
                at = off + 6;
                bad = read_name(p, end, &at, r->target) < 0 || at != end;
                break;
            case MDNS_A:
                bad = rdlen != 4;
                if (!bad)
                    memcpy(r->addr, p + off, 4);
                break;
            case MDNS_TXT: {
                size_t t = off;
                while (t < end)
                    t += 1 + (size_t)p[t];
                bad = t != end;
                break;
            }
            default:
                break;
            }
            /* a name inside rdata may point before the record: read_name was
             * given the record's end as the packet's end, and pointers only
             * go backwards, so it stays within the packet */
            if (bad)
                return rc_fail(RC_EFORMAT, "mDNS record of type %u has malformed data",
                               (unsigned)r->type);
            off = end;
            if (r != &tmp)
                out->n_rrs++;
        }
    }
    return 0;
}

int mdns_txt_get(const uint8_t *rd, size_t n, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (size_t t = 0; t < n;) {
        size_t l = rd[t];
        if (t + 1 + l > n)
            return 0;
        const uint8_t *s = rd + t + 1;
        if (l > kl && s[kl] == '=') {
            bool eq = true;
            for (size_t i = 0; i < kl && eq; i++)
                eq = lower(s[i]) == lower((unsigned char)key[i]);
            if (eq) {
                size_t vl = l - kl - 1;
                if (vl + 1 > cap || memchr(s + kl + 1, 0, vl))
                    return 0;
                memcpy(out, s + kl + 1, vl);
                out[vl] = 0;
                return 1;
            }
        }
        t += 1 + l;
    }
    return 0;
}

/* ---- writing ---- */

static void put(mdns_writer *w, const void *b, size_t n)
{
    if (w->failed || w->len + n > w->cap) {
        w->failed = true;
        return;
    }
    memcpy(w->buf + w->len, b, n);
    w->len += n;
}
static void put16(mdns_writer *w, uint16_t v)
{
    uint8_t b[2] = { (uint8_t)(v >> 8), (uint8_t)v };
    put(w, b, 2);
}
static void put32(mdns_writer *w, uint32_t v)
{
    put16(w, (uint16_t)(v >> 16));
    put16(w, (uint16_t)v);
}

/* Presentation form to wire form. */
static void put_name(mdns_writer *w, const char *name)
{
    uint8_t label[63];
    size_t total = 0;
    const char *s = name;
    while (*s) {
        size_t n = 0;
        while (*s && *s != '.') {
            int c = (unsigned char)*s++;
            if (c == '\\' && s[0] >= '0' && s[0] <= '9' && s[1] >= '0' && s[1] <= '9' &&
                s[2] >= '0' && s[2] <= '9') {
                c = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
                s += 3;
                if (c > 255) {
                    w->failed = true;
                    return;
                }
            } else if (c == '\\' && *s) {
                c = (unsigned char)*s++;
            }
            if (n == sizeof label) {
                w->failed = true;
                return;
            }
            label[n++] = (uint8_t)c;
        }
        if (*s == '.')
            s++;
        if (n == 0 || (total += n + 1) > 254) {
            w->failed = true;
            return;
        }
        uint8_t l = (uint8_t)n;
        put(w, &l, 1);
        put(w, label, n);
    }
    put(w, "", 1);
}

void mdns_w_init(mdns_writer *w, uint8_t *buf, size_t cap, uint16_t id, uint16_t flags)
{
    memset(w, 0, sizeof *w);
    w->buf = buf;
    w->cap = cap;
    w->section = -1;
    put16(w, id);
    put16(w, flags);
    put(w, "\0\0\0\0\0\0\0\0", 8);
}

void mdns_w_question(mdns_writer *w, const char *name, uint16_t type, uint16_t klass)
{
    if (w->section != -1)
        w->failed = true;
    put_name(w, name);
    put16(w, type);
    put16(w, klass);
    w->counts[0]++;
}

/* Starts a record; returns the offset of its rdata length field. */
static size_t rr_begin(mdns_writer *w, int sec, const char *name, uint16_t type,
                       uint16_t klass, uint32_t ttl)
{
    if (sec < w->section || sec < 0 || sec > 2)
        w->failed = true;
    w->section = sec;
    w->counts[1 + sec]++;
    put_name(w, name);
    put16(w, type);
    put16(w, klass);
    put32(w, ttl);
    size_t at = w->len;
    put16(w, 0);
    return at;
}

static void rr_end(mdns_writer *w, size_t at)
{
    if (w->failed)
        return;
    size_t n = w->len - at - 2;
    if (n > 0xffff) {
        w->failed = true;
        return;
    }
    w->buf[at] = (uint8_t)(n >> 8);
    w->buf[at + 1] = (uint8_t)n;
}

void mdns_w_ptr(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
                const char *target)
{
    size_t at = rr_begin(w, sec, name, MDNS_PTR, klass, ttl);
    put_name(w, target);
    rr_end(w, at);
}

void mdns_w_srv(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
                uint16_t port, const char *target)
{
    size_t at = rr_begin(w, sec, name, MDNS_SRV, klass, ttl);
    put16(w, 0);
    put16(w, 0);
    put16(w, port);
    put_name(w, target);
    rr_end(w, at);
}

void mdns_w_txt(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
                const char *const *strs, int n)
{
    size_t at = rr_begin(w, sec, name, MDNS_TXT, klass, ttl);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(strs[i]);
        if (l > 255) {
            w->failed = true;
            return;
        }
        uint8_t b = (uint8_t)l;
        put(w, &b, 1);
        put(w, strs[i], l);
    }
    if (n == 0)
        put(w, "", 1);    /* RFC 6763 §6.1: an empty TXT holds one empty string */
    rr_end(w, at);
}

void mdns_w_a(mdns_writer *w, int sec, const char *name, uint16_t klass, uint32_t ttl,
              const uint8_t addr[4])
{
    size_t at = rr_begin(w, sec, name, MDNS_A, klass, ttl);
    put(w, addr, 4);
    rr_end(w, at);
}

long mdns_w_finish(mdns_writer *w)
{
    if (w->failed)
        return rc_fail(RC_ELIMIT, "mDNS packet does not fit in %zu bytes or has a bad name", w->cap);
    for (int i = 0; i < 4; i++) {
        w->buf[4 + 2 * i] = (uint8_t)(w->counts[i] >> 8);
        w->buf[5 + 2 * i] = (uint8_t)w->counts[i];
    }
    return (long)w->len;
}
