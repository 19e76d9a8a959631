/* node_digest.c - encoding and decoding of the node digest (format in
 * node_digest.h).  Decoding treats every byte as hostile: each length is
 * checked against what remains before it is used. */
#include "cluster/node_digest.h"

#include "base/err.h"

#include <string.h>

#define FORMAT     1
#define FIXED_BYTES 20

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)(v >> 16)); put16(p + 2, (uint16_t)v); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) << 16 | get16(p + 2); }

int node_digest_encode(const node_digest *d, uint8_t *out, size_t cap)
{
    if (d->n_models < 0 || d->n_models > NODE_DIGEST_MODELS)
        return rc_fail(RC_ELIMIT, "node digest: %d models (max %d)", d->n_models, NODE_DIGEST_MODELS);
    size_t need = FIXED_BYTES;
    for (int i = 0; i < d->n_models; i++) {
        size_t nl = strlen(d->models[i].name);
        if (nl == 0 || nl > NODE_DIGEST_NAME_MAX)
            return rc_fail(RC_EINVAL, "node digest: model name of %zu bytes (1-%d)", nl, NODE_DIGEST_NAME_MAX);
        need += 1 + nl + 4;
    }
    if (need > cap)
        return rc_fail(RC_ELIMIT, "node digest: %zu bytes, room for %zu", need, cap);
    out[0] = FORMAT;
    out[1] = (uint8_t)d->n_models;
    memcpy(out + 2, d->ipv4, 4);
    put16(out + 6, d->cluster_port);
    put16(out + 8, d->http_port);
    put16(out + 10, d->cores);
    put32(out + 12, d->mem_total_mib);
    put32(out + 16, d->mem_free_mib);
    size_t o = FIXED_BYTES;
    for (int i = 0; i < d->n_models; i++) {
        const node_digest_model *m = &d->models[i];
        size_t nl = strlen(m->name);
        out[o++] = (uint8_t)nl;
        memcpy(out + o, m->name, nl);
        o += nl;
        put16(out + o, m->slots);
        put16(out + o + 2, m->free);
        o += 4;
    }
    return (int)o;
}

int node_digest_decode(const uint8_t *buf, size_t len, node_digest *d)
{
    memset(d, 0, sizeof *d);
    if (len < FIXED_BYTES)
        return rc_fail(RC_EFORMAT, "node digest: %zu bytes, shorter than its %d fixed bytes", len, FIXED_BYTES);
    if (buf[0] != FORMAT)
        return rc_fail(RC_EFORMAT, "node digest: format %u (this node reads %d)", buf[0], FORMAT);
    if (buf[1] > NODE_DIGEST_MODELS)
        return rc_fail(RC_EFORMAT, "node digest: %u models (max %d)", buf[1], NODE_DIGEST_MODELS);
    memcpy(d->ipv4, buf + 2, 4);
    d->cluster_port = get16(buf + 6);
    d->http_port = get16(buf + 8);
    d->cores = get16(buf + 10);
    d->mem_total_mib = get32(buf + 12);
    d->mem_free_mib = get32(buf + 16);
    size_t o = FIXED_BYTES;
    for (int i = 0; i < buf[1]; i++) {
        if (o >= len) return rc_fail(RC_EFORMAT, "node digest: model %d missing", i);
        size_t nl = buf[o++];
        if (nl == 0 || nl > NODE_DIGEST_NAME_MAX)
            return rc_fail(RC_EFORMAT, "node digest: model %d: name of %zu bytes", i, nl);
        if (len - o < nl + 4) return rc_fail(RC_EFORMAT, "node digest: model %d truncated", i);
        node_digest_model *m = &d->models[i];
        memcpy(m->name, buf + o, nl);
        m->name[nl] = 0;
        if (memchr(m->name, 0, nl))
            return rc_fail(RC_EFORMAT, "node digest: model %d: NUL in its name", i);
        o += nl;
        m->slots = get16(buf + o);
        m->free = get16(buf + o + 2);
        /* a peer's free count is never more than its slots */
        if (m->free > m->slots) m->free = m->slots;
        o += 4;
        d->n_models = i + 1;
    }
    return 0;
}

int node_digest_free(const node_digest *d, const char *model)
{
    for (int i = 0; i < d->n_models; i++)
        if (!strcmp(d->models[i].name, model)) return d->models[i].free;
    return -1;
}
