/* node_digest.h - the compact record of a node that SWIM spreads with its
 * membership (swim.h's metadata): where to reach it, its resources, and the
 * models it serves with their free sequence slots - what placement and
 * request routing need, in at most SWIM_META_MAX bytes.
 *
 * Its version is the SWIM incarnation that carries it: a node that changes
 * its digest takes a new incarnation, so a newer digest always replaces an
 * older one everywhere.  Free-slot counts change with every request; a node
 * republishes them at most once a probe period (the counts a router reads
 * are that much old, and a forwarded request that finds no slot is queued
 * at the replica as today).
 *
 * Layout (big endian), format 1:
 *   u8 format (1), u8 n_models,
 *   u8 ipv4[4], u16 cluster_port, u16 http_port,
 *   u16 cores, u32 mem_total_mib, u32 mem_free_mib,
 *   n_models x { u8 name_len (1..63), name, u16 slots, u16 free }
 * A reader ignores bytes after the last model (a later format may append).
 */
#ifndef RC_NODE_DIGEST_H
#define RC_NODE_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define NODE_DIGEST_MODELS   8
#define NODE_DIGEST_NAME_MAX 63

typedef struct {
    char name[NODE_DIGEST_NAME_MAX + 1];
    uint16_t slots, free;
} node_digest_model;

typedef struct {
    uint8_t ipv4[4];
    uint16_t cluster_port, http_port;
    uint16_t cores;
    uint32_t mem_total_mib, mem_free_mib;
    int n_models;
    node_digest_model models[NODE_DIGEST_MODELS];
} node_digest;

/* Encodes d into out (cap bytes); returns the bytes written, or RC_ELIMIT
 * when it does not fit (too many models or names too long for cap) and
 * RC_EINVAL for a name that is empty or over NODE_DIGEST_NAME_MAX. */
int node_digest_encode(const node_digest *d, uint8_t *out, size_t cap);

/* Decodes a digest received from the network (hostile); 0 or RC_EFORMAT
 * with a detail naming what is wrong. */
int node_digest_decode(const uint8_t *buf, size_t len, node_digest *d);

/* The free slots the node offers for `model`, or -1 if it does not serve it. */
int node_digest_free(const node_digest *d, const char *model);

#endif
