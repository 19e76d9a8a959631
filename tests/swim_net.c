/* swim_net.c - the simulated network of swim_net.h.
 *
 * Packets in flight sit in a binary heap ordered by delivery time (then by
 * send order, so equal times stay FIFO).  A node's id carries its index in
 * its first four bytes, which is how a destination id finds its node.
 */
#include "swim_net.h"

#include "base/rng.h"

#include <stdlib.h>
#include <string.h>

#define STEP_MS 5

typedef struct {
    uint64_t at, order;
    int to, from;
    bool stream;
    size_t len;
    uint8_t *data;
} pkt;

typedef struct node {
    struct simnet *net;
    int index;
    uint8_t id[SWIM_ID_BYTES];
    swim *s;
    int group;
    uint64_t next_tick;
} node;

struct simnet {
    swim_config cfg;
    simnet_cfg ncfg;
    rng_state rng;
    uint64_t now, order;
    node *nodes;
    int n;
    pkt *heap;
    size_t n_heap, cap_heap;
    bool partitioned;
    int block_a, block_b;           /* one cut path (-1: none) */
    simnet_stats st;
};

static uint64_t rnd(simnet *net) { return rng_next(&net->rng); }

static bool pkt_before(const pkt *a, const pkt *b)
{
    return a->at < b->at || (a->at == b->at && a->order < b->order);
}

static void heap_push(simnet *net, pkt p)
{
    if (net->n_heap == net->cap_heap) {
        net->cap_heap = net->cap_heap ? 2 * net->cap_heap : 1024;
        net->heap = realloc(net->heap, net->cap_heap * sizeof *net->heap);
        if (!net->heap) abort();       /* a test tool: no memory, no result */
    }
    size_t i = net->n_heap++;
    while (i > 0 && pkt_before(&p, &net->heap[(i - 1) / 2])) {
        net->heap[i] = net->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    net->heap[i] = p;
}

static pkt heap_pop(simnet *net)
{
    pkt top = net->heap[0], last = net->heap[--net->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= net->n_heap) break;
        if (c + 1 < net->n_heap && pkt_before(&net->heap[c + 1], &net->heap[c])) c++;
        if (!pkt_before(&net->heap[c], &last)) break;
        net->heap[i] = net->heap[c];
        i = c;
    }
    if (net->n_heap) net->heap[i] = last;
    return top;
}

static int index_of(const simnet *net, const uint8_t *id)
{
    uint32_t i = (uint32_t)id[0] | (uint32_t)id[1] << 8 | (uint32_t)id[2] << 16 | (uint32_t)id[3] << 24;
    if (i >= (uint32_t)net->n || memcmp(net->nodes[i].id, id, SWIM_ID_BYTES)) return -1;
    return (int)i;
}

static void on_send(void *ctx, const uint8_t *to, const uint8_t *buf, size_t len, bool reliable)
{
    node *from = ctx;
    simnet *net = from->net;
    net->st.packets++;
    net->st.bytes += len;
    int t = index_of(net, to);
    if (t < 0) return;
    if (!reliable && net->ncfg.loss > 0 && rng_uniform(&net->rng) < net->ncfg.loss)
        return;
    uint32_t span = net->ncfg.delay_max_ms - net->ncfg.delay_min_ms + 1;
    pkt p = { .at = net->now + net->ncfg.delay_min_ms + rnd(net) % span, .order = net->order++,
              .to = t, .from = from->index, .stream = reliable, .len = len };
    if (p.at <= net->now) p.at = net->now + 1;
    p.data = malloc(len);
    if (!p.data) abort();
    memcpy(p.data, buf, len);
    heap_push(net, p);
}

static void on_event(void *ctx, const swim_event *ev)
{
    node *self = ctx;
    simnet *net = self->net;
    if (ev->type == SWIM_EV_SUSPECT) net->st.suspects++;
    if (ev->type == SWIM_EV_DEAD) {
        int i = index_of(net, ev->id);
        if (i >= 0 && net->nodes[i].s) net->st.false_dead++;
    }
}

simnet *simnet_new(int n, const swim_config *cfg, const simnet_cfg *ncfg, uint64_t seed)
{
    simnet *net = calloc(1, sizeof *net);
    if (!net) return NULL;
    net->cfg = *cfg;
    net->ncfg = *ncfg;
    if (net->ncfg.delay_max_ms < net->ncfg.delay_min_ms) net->ncfg.delay_max_ms = net->ncfg.delay_min_ms;
    rng_seed(&net->rng, seed);
    net->n = n;
    net->now = 1000;
    net->block_a = net->block_b = -1;
    net->nodes = calloc((size_t)n, sizeof *net->nodes);
    if (!net->nodes) { free(net); return NULL; }
    for (int i = 0; i < n; i++) {
        node *d = &net->nodes[i];
        d->net = net;
        d->index = i;
        d->id[0] = (uint8_t)i; d->id[1] = (uint8_t)(i >> 8);
        d->id[2] = (uint8_t)(i >> 16); d->id[3] = (uint8_t)(i >> 24);
        for (int b = 4; b < SWIM_ID_BYTES; b++) d->id[b] = (uint8_t)rnd(net);
    }
    return net;
}

void simnet_free(simnet *net)
{
    if (!net) return;
    for (int i = 0; i < net->n; i++) swim_free(net->nodes[i].s);
    for (size_t i = 0; i < net->n_heap; i++) free(net->heap[i].data);
    free(net->heap);
    free(net->nodes);
    free(net);
}

uint64_t simnet_now(const simnet *net) { return net->now; }
int simnet_size(const simnet *net) { return net->n; }
swim *simnet_node(simnet *net, int i) { return net->nodes[i].s; }
const uint8_t *simnet_id(const simnet *net, int i) { return net->nodes[i].id; }

int simnet_start(simnet *net, int i, int via)
{
    node *d = &net->nodes[i];
    if (d->s) return 0;
    swim_io io = { on_send, on_event, d };
    /* metadata of a realistic size: what node_digest carries for one model */
    uint8_t meta[48];
    memset(meta, 'm', sizeof meta);
    d->s = swim_new(&net->cfg, &io, d->id, meta, sizeof meta, rnd(net), net->now);
    if (!d->s) return -1;
    d->next_tick = net->now;
    if (via >= 0 && via != i) return swim_join(d->s, net->nodes[via].id, net->now);
    return 0;
}

void simnet_crash(simnet *net, int i)
{
    swim_free(net->nodes[i].s);
    net->nodes[i].s = NULL;
}

void simnet_leave(simnet *net, int i)
{
    if (!net->nodes[i].s) return;
    swim_leave(net->nodes[i].s, net->now);
    /* give the leave its packets, then stop */
    simnet_run(net, 2 * STEP_MS);
    simnet_crash(net, i);
}

void simnet_set_group(simnet *net, int i, int g) { net->nodes[i].group = g; }
void simnet_partition(simnet *net, bool on) { net->partitioned = on; }
void simnet_set_loss(simnet *net, double loss) { net->ncfg.loss = loss; }

void simnet_block(simnet *net, int i, int j, bool blocked)
{
    net->block_a = blocked ? i : -1;
    net->block_b = blocked ? j : -1;
}

static bool cut(const simnet *net, int a, int b)
{
    if (net->partitioned && net->nodes[a].group != net->nodes[b].group) return true;
    return (a == net->block_a && b == net->block_b) || (a == net->block_b && b == net->block_a);
}

static void step(simnet *net)
{
    uint64_t until = net->now + STEP_MS;
    while (net->n_heap && net->heap[0].at <= until) {
        pkt p = heap_pop(net);
        node *to = &net->nodes[p.to];
        if (to->s && !cut(net, p.to, p.from)) {
            net->now = p.at > net->now ? p.at : net->now;
            swim_recv(to->s, p.data, p.len, net->now);
            to->next_tick = net->now;    /* as the live host: a tick after each packet */
        }
        free(p.data);
    }
    net->now = until;
    for (int i = 0; i < net->n; i++) {
        node *d = &net->nodes[i];
        if (d->s && d->next_tick <= net->now) d->next_tick = swim_tick(d->s, net->now);
    }
}

void simnet_run(simnet *net, uint64_t ms)
{
    uint64_t end = net->now + ms;
    while (net->now < end) step(net);
}

long simnet_run_until(simnet *net, bool (*cond)(simnet *, void *), void *arg,
                      uint64_t every_ms, uint64_t limit_ms)
{
    uint64_t t0 = net->now;
    if (every_ms < STEP_MS) every_ms = STEP_MS;
    while (net->now - t0 <= limit_ms) {
        if (cond(net, arg)) return (long)(net->now - t0);
        simnet_run(net, every_ms);
    }
    return -1;
}

bool simnet_all_see(simnet *net, int i, int st)
{
    for (int j = 0; j < net->n; j++) {
        if (j == i || !net->nodes[j].s) continue;
        if (swim_state_of(net->nodes[j].s, net->nodes[i].id) != st) return false;
    }
    return true;
}

bool simnet_converged(simnet *net)
{
    size_t up = 0;
    for (int i = 0; i < net->n; i++) up += net->nodes[i].s != NULL;
    for (int i = 0; i < net->n; i++) {
        if (!net->nodes[i].s) continue;
        size_t c[4];
        swim_counts(net->nodes[i].s, c);
        if (c[SWIM_ALIVE] != up || c[SWIM_SUSPECT] != 0) return false;
    }
    /* counts can agree by accident (one node alive that is down, another
     * down that is up): check a node's view member by member */
    for (int i = 0; i < net->n; i++)
        if (net->nodes[i].s && !simnet_all_see(net, i, SWIM_ALIVE)) return false;
    return true;
}

void simnet_get_stats(const simnet *net, simnet_stats *out) { *out = net->st; }

bool simnet_cond_converged(simnet *net, void *arg) { (void)arg; return simnet_converged(net); }

bool simnet_cond_all_see(simnet *net, void *arg)
{
    const simnet_see *a = arg;
    return simnet_all_see(net, a->node, a->state);
}
