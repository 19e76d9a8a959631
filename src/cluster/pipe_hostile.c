/* pipe_hostile.c - tests only: a member that injects stage batches into
 * the other nodes' instances (racimo-hooks sets it up, through
 * node_config.test_inject_batches, for the namespace tests; the release
 * binary never does).
 *
 * Every 100 ms it sends every other node up, for every node as the head
 * and instance numbers 1-8 (heads number their instances from 1), a
 * well-formed one-row batch of group 0: what a member that guesses the
 * numbers would send.  The stage nodes must refuse them all (the batches
 * of an instance come only from the node before in its plan) and keep
 * answering their head's requests unchanged.
 */
#include "pipeline_internal.h"
#include "base/log.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define INJECT_INSTS 8

static bool inject_closed(pipeline *p)
{
    pthread_mutex_lock(&p->mu);
    bool closed = p->closed;
    pthread_mutex_unlock(&p->mu);
    return closed;
}

static void *inject_main(void *arg)
{
    pipeline *p = arg;
    uint8_t b[BATCH_HDR + 13];
    uint32_t rows[3] = { 1, 0, 0 };             /* token 1 at position 0 of slot 0 */
    memcpy(b + BATCH_HDR, rows, sizeof rows);
    b[BATCH_HDR + 12] = 1;                      /* sample it */
    uint64_t sent = 0;
    while (!inject_closed(p)) {
        json_t *snap = cluster_snapshot(p->c), *to, *head;
        size_t i, k;
        json_array_foreach(json_object_get(snap, "nodes"), i, to) {
            const char *tid = json_string_value(json_object_get(to, "id"));
            const char *st = json_string_value(json_object_get(to, "state"));
            if (!tid || !st || strcmp(st, "up") || !strcmp(tid, p->self))
                continue;
            json_array_foreach(json_object_get(snap, "nodes"), k, head) {
                const char *hid = json_string_value(json_object_get(head, "id"));
                if (!hid || !strcmp(hid, p->self) || wire_unhex(hid, b, WIRE_ID_BYTES))
                    continue;
                for (uint32_t inst = 1; inst <= INJECT_INSTS; inst++) {
                    uint32_t h[5] = { inst, 0, ENC_NONE, 0, 1 };
                    memcpy(b + WIRE_ID_BYTES, h, sizeof h);
                    sent += cluster_send(p->c, tid, PIPE_BATCH, b, sizeof b) == 0;
                }
            }
        }
        json_decref(snap);
        struct timespec ts = { 0, 100000000L };
        nanosleep(&ts, NULL);
    }
    rc_log(LOG_INFO, "pipeline: tests: injected %llu batches into other nodes' instances",
           (unsigned long long)sent);
    return NULL;
}

int pipeline_test_inject(pipeline *p)
{
    if (p->inject_started)
        return 0;
    if (pthread_create(&p->inject, NULL, inject_main, p))
        return -1;
    p->inject_started = true;
    rc_log(LOG_WARN, "pipeline: tests: this node injects batches into the other nodes' "
           "instances");
    return 0;
}
