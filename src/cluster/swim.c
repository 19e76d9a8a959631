/* swim.c - SWIM membership with Lifeguard, as an I/O-free state machine
 * (the contract is in swim.h; the protocol in docs/cluster-protocol.md).
 *
 * Layout: the member table (a pointer array, shuffled for the probe round,
 * and an open-addressing index by id); the broadcast queue (at most one
 * pending update per member, kept in lists by how often it was sent, so the
 * least-sent go first); packet encoding; applying alive/suspect/dead
 * updates; the handlers of each packet type; the timers of swim_tick.
 *
 * Invariant: every member in the table is also in `idx`; a member has at
 * most one queued broadcast, always about its latest known state, so a
 * newer update replaces an older one instead of racing it.
 */
#include "cluster/swim.h"

#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"

#include <math.h>
#include <string.h>

#define PROTO_VERSION 1
#define HDR_BYTES     49
#define MAX_LEVELS    64            /* transmit counts tracked; limit is lower */
#define MAX_RELAYS    64            /* indirect probes run for others at once */
#define MAX_CONFIRM   8
#define MAX_PP_ENTRIES 65536        /* members accepted in one push-pull */
#define HEAL_PERIODS  4             /* periods of frequent push-pull after a heal */

enum { P_PING = 1, P_PING_REQ, P_ACK, P_NACK, P_GOSSIP, P_PUSHPULL, P_PUSHPULL_REPLY };
enum { U_ALIVE = 1, U_SUSPECT, U_DEAD, U_LEFT };

typedef struct member {
    uint8_t id[SWIM_ID_BYTES];
    uint32_t inc;
    uint8_t state;
    uint8_t meta_len;
    uint8_t meta[SWIM_META_MAX];
    uint64_t since_ms;              /* last state change */
    bool announced;                 /* its JOIN was reported (swim_join's members: not yet) */
    /* suspicion (state SUSPECT) */
    uint64_t susp_start_ms;
    int n_conf;                     /* distinct confirmers besides the first */
    uint8_t conf[MAX_CONFIRM][SWIM_ID_BYTES];
    uint8_t susp_from[SWIM_ID_BYTES];
    int susp_pos;                   /* in s->susp, -1 if none */
    /* the queued broadcast about this member */
    bool b_on;
    uint8_t b_kind;
    uint8_t b_from[SWIM_ID_BYTES];
    int b_tx;
    struct member *b_prev, *b_next;
} member;

typedef struct {
    uint32_t my_seq, origin_seq;
    uint8_t origin[SWIM_ID_BYTES];
    uint64_t deadline_ms;
    bool used;
} relay;

struct swim {
    swim_config cfg;
    swim_io io;
    rng_state rng;
    member **m;                     /* all members, self included */
    size_t n, cap;
    member **idx;                   /* open addressing, idx_cap a power of two */
    size_t idx_cap;
    member *self;
    size_t n_state[4];
    member **susp;                  /* members in SUSPECT */
    size_t n_susp, susp_cap;
    member *lv_head[MAX_LEVELS], *lv_tail[MAX_LEVELS];
    size_t n_bcast;
    /* the probe in progress */
    size_t probe_pos;
    bool round_started;
    bool probing, acked, indirect_sent;
    uint8_t probe_id[SWIM_ID_BYTES];
    uint32_t probe_seq;
    uint64_t probe_timeout_at, probe_end_at;
    int nacks_expected, nacks;
    uint32_t seq;
    int awareness;
    relay relays[MAX_RELAYS];
    uint64_t next_probe, next_gossip, next_pp, next_dead_probe, next_reap;
    uint64_t heal_until, next_heal_pp;    /* heal mode: see maybe_heal */
    bool left;
    swim_stats st;
    uint8_t buf[SWIM_PACKET_MAX];
};

/* ---- helpers ---------------------------------------------------------- */

static uint64_t rnd(swim *s) { return rng_next(&s->rng); }

static size_t rnd_below(swim *s, size_t n) { return n ? (size_t)(rnd(s) % n) : 0; }

/* integers are big endian, as in the rest of the protocol */
static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t id_hash(const uint8_t *id)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < SWIM_ID_BYTES; i++) h = (h ^ id[i]) * 1099511628211ull;
    return h;
}

void swim_config_default(swim_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->period_ms = 500;
    cfg->probe_timeout_ms = 200;
    cfg->indirect_k = 3;
    cfg->retransmit_mult = 4;
    cfg->suspicion_mult = 1.5;
    cfg->suspicion_max_mult = 4;
    cfg->awareness_max = 8;
    cfg->gossip_ms = 200;
    cfg->gossip_nodes = 3;
    cfg->pushpull_ms = 30000;
    cfg->reap_ms = 60000;
    cfg->dead_probe_ms = 125;
    cfg->packet_max = SWIM_PACKET_MAX;
}

/* ---- the member table -------------------------------------------------- */

static member *find(const swim *s, const uint8_t *id)
{
    size_t mask = s->idx_cap - 1;
    for (size_t i = id_hash(id) & mask;; i = (i + 1) & mask) {
        member *m = s->idx[i];
        if (!m) return NULL;
        if (!memcmp(m->id, id, SWIM_ID_BYTES)) return m;
    }
}

static void idx_put(member **idx, size_t cap, member *m)
{
    size_t mask = cap - 1, i = id_hash(m->id) & mask;
    while (idx[i]) i = (i + 1) & mask;
    idx[i] = m;
}

static int idx_rebuild(swim *s, size_t cap)
{
    member **idx = rc_calloc(cap, sizeof *idx);
    if (!idx) return RC_ENOMEM;
    for (size_t i = 0; i < s->n; i++) idx_put(idx, cap, s->m[i]);
    rc_free(s->idx);
    s->idx = idx;
    s->idx_cap = cap;
    return 0;
}

static member *add_member(swim *s, const uint8_t *id)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        member **m = rc_realloc(s->m, cap * sizeof *m);
        if (!m) return NULL;
        s->m = m;
        s->cap = cap;
    }
    if (2 * (s->n + 1) > s->idx_cap && idx_rebuild(s, s->idx_cap * 2) != 0) return NULL;
    member *m = rc_calloc(1, sizeof *m);
    if (!m) return NULL;
    memcpy(m->id, id, SWIM_ID_BYTES);
    m->susp_pos = -1;
    /* a new member goes to a random place of the probe round, so that it is
     * probed within one round wherever the round stands (SWIM's shuffled
     * round-robin, extended to joins) */
    size_t at = s->n ? rnd_below(s, s->n + 1) : 0;
    s->m[s->n] = s->m[at];
    s->m[at] = m;
    s->n++;
    idx_put(s->idx, s->idx_cap, m);
    return m;
}

static size_t log10_ceil(size_t n)
{
    size_t r = 0;
    for (size_t v = 1; v < n; v *= 10) r++;
    return r ? r : 1;
}

/* ---- the broadcast queue ----------------------------------------------- */

static void lv_unlink(swim *s, member *m)
{
    int l = m->b_tx < MAX_LEVELS ? m->b_tx : MAX_LEVELS - 1;
    if (m->b_prev) m->b_prev->b_next = m->b_next; else s->lv_head[l] = m->b_next;
    if (m->b_next) m->b_next->b_prev = m->b_prev; else s->lv_tail[l] = m->b_prev;
    m->b_prev = m->b_next = NULL;
}

static void lv_append(swim *s, member *m)
{
    int l = m->b_tx < MAX_LEVELS ? m->b_tx : MAX_LEVELS - 1;
    m->b_prev = s->lv_tail[l];
    m->b_next = NULL;
    if (s->lv_tail[l]) s->lv_tail[l]->b_next = m; else s->lv_head[l] = m;
    s->lv_tail[l] = m;
}

static void bcast_drop(swim *s, member *m)
{
    if (!m->b_on) return;
    lv_unlink(s, m);
    m->b_on = false;
    s->n_bcast--;
}

static void bcast(swim *s, member *m, int kind, const uint8_t *from)
{
    bcast_drop(s, m);
    m->b_on = true;
    m->b_kind = (uint8_t)kind;
    m->b_tx = 0;
    if (from) memcpy(m->b_from, from, SWIM_ID_BYTES);
    lv_append(s, m);
    s->n_bcast++;
}

static size_t update_bytes(const member *m)
{
    return 1 + SWIM_ID_BYTES + 4 + (m->b_kind == U_ALIVE ? 1u + m->meta_len : SWIM_ID_BYTES);
}

static size_t put_update(uint8_t *p, const member *m, int kind, const uint8_t *from)
{
    size_t o = 0;
    p[o++] = (uint8_t)kind;
    memcpy(p + o, m->id, SWIM_ID_BYTES); o += SWIM_ID_BYTES;
    put32(p + o, m->inc); o += 4;
    if (kind == U_ALIVE) {
        p[o++] = m->meta_len;
        memcpy(p + o, m->meta, m->meta_len); o += m->meta_len;
    } else {
        memcpy(p + o, from, SWIM_ID_BYTES); o += SWIM_ID_BYTES;
    }
    return o;
}

/* Fills the rest of a packet with the least-sent broadcasts; returns the
 * bytes used and sets *n_out.  A broadcast sent `limit` times is dropped. */
static size_t fill_updates(swim *s, uint8_t *p, size_t room, int *n_out)
{
    size_t used = 0;
    int n = 0;
    /* at least 2 x retransmit_mult times: with 4 sends each, in a cluster
     * of a few nodes one of them missed a join about once in ten starts of
     * 6 nodes and heard of it only at the next push-pull (15-45 s) */
    size_t lg = log10_ceil(s->n + 1);
    int limit = s->cfg.retransmit_mult * (int)(lg < 2 ? 2 : lg);
    if (limit >= MAX_LEVELS) limit = MAX_LEVELS - 1;
    member *picked[64];
    int n_picked = 0, misses = 0;
    for (int l = 0; l < limit && n_picked < 64; l++) {
        for (member *m = s->lv_head[l]; m && n_picked < 64; m = m->b_next) {
            size_t b = update_bytes(m);
            if (used + b > room) {
                /* a smaller one may fit, but do not scan a long queue for it */
                if (++misses > 8) goto done;
                continue;
            }
            used += put_update(p + used, m, m->b_kind, m->b_from);
            picked[n_picked++] = m;
            n++;
        }
    }
done:
    for (int i = 0; i < n_picked; i++) {
        member *m = picked[i];
        lv_unlink(s, m);
        m->b_tx++;
        if (m->b_tx >= limit) { m->b_on = false; s->n_bcast--; }
        else lv_append(s, m);
    }
    *n_out = n;
    return used;
}

/* ---- sending ----------------------------------------------------------- */

static size_t put_header(swim *s, uint8_t *p, int type, const uint8_t *to, uint32_t seq,
                         const uint8_t *target)
{
    member *r = find(s, to);
    p[0] = PROTO_VERSION;
    p[1] = (uint8_t)type;
    memcpy(p + 2, s->self->id, SWIM_ID_BYTES);
    put32(p + 18, s->self->inc);
    put32(p + 22, seq);
    if (target) memcpy(p + 26, target, SWIM_ID_BYTES); else memset(p + 26, 0, SWIM_ID_BYTES);
    /* the sender's view of the receiver: a suspected node refutes at once */
    p[42] = r ? r->state : 0xff;
    put32(p + 43, r ? r->inc : 0);
    p[47] = p[48] = 0;
    return HDR_BYTES;
}

static void send_pkt(swim *s, int type, const uint8_t *to, uint32_t seq, const uint8_t *target)
{
    size_t o = put_header(s, s->buf, type, to, seq, target);
    int n = 0;
    o += fill_updates(s, s->buf + o, s->cfg.packet_max - o, &n);
    s->buf[47] = (uint8_t)(n >> 8);
    s->buf[48] = (uint8_t)n;
    s->st.sent++;
    s->st.bytes_sent += o;
    s->io.send(s->io.ctx, to, s->buf, o, false);
}

static void send_pushpull(swim *s, const uint8_t *to, int type)
{
    size_t per = 1 + SWIM_ID_BYTES + 4 + 1 + SWIM_META_MAX, len;
    if (rc_mul_size(per, s->n, &len) || rc_add_size(len, HDR_BYTES + 4, &len)) return;
    uint8_t *p = rc_malloc(len);
    if (!p) return;
    size_t o = put_header(s, p, type, to, 0, NULL);
    put32(p + o, (uint32_t)s->n); o += 4;
    for (size_t i = 0; i < s->n; i++) {
        member *m = s->m[i];
        p[o++] = m->state;
        memcpy(p + o, m->id, SWIM_ID_BYTES); o += SWIM_ID_BYTES;
        put32(p + o, m->inc); o += 4;
        p[o++] = m->meta_len;
        memcpy(p + o, m->meta, m->meta_len); o += m->meta_len;
    }
    s->st.sent++;
    s->st.bytes_sent += o;
    s->st.pushpulls++;
    s->io.send(s->io.ctx, to, p, o, true);
    rc_free(p);
}

static void emit(swim *s, int type, const member *m)
{
    swim_event ev = { type, m->id, m->inc, m->meta, m->meta_len };
    if (s->io.event) s->io.event(s->io.ctx, &ev);
}

/* ---- state changes ----------------------------------------------------- */

static void set_state(swim *s, member *m, int state, uint64_t now)
{
    if (m->state == SWIM_SUSPECT && state != SWIM_SUSPECT && m->susp_pos >= 0) {
        size_t at = (size_t)m->susp_pos;
        s->susp[at] = s->susp[--s->n_susp];
        s->susp[at]->susp_pos = (int)at;
        m->susp_pos = -1;
    }
    s->n_state[m->state]--;
    m->state = (uint8_t)state;
    s->n_state[state]++;
    m->since_ms = now;
}

static void health(swim *s, int delta)
{
    s->awareness += delta;
    if (s->awareness < 0) s->awareness = 0;
    if (s->awareness > s->cfg.awareness_max - 1) s->awareness = s->cfg.awareness_max - 1;
}

static void heal_mode(swim *s, uint64_t now)
{
    s->heal_until = now + (uint64_t)HEAL_PERIODS * s->cfg.period_ms;
}

/* `dead`: the claim was death, not suspicion - this node was cut off from
 * the others long enough to be declared dead: a partition is healing. */
static void refute(swim *s, uint32_t inc, bool dead, uint64_t now)
{
    if (s->left) return;
    if (inc >= s->self->inc) s->self->inc = inc + 1;
    s->st.refutes++;
    health(s, 1);
    bcast(s, s->self, U_ALIVE, NULL);
    if (dead) heal_mode(s, now);
}

static void maybe_heal(swim *s, member *m, uint64_t now);

static void apply_alive(swim *s, const uint8_t *id, uint32_t inc, const uint8_t *meta,
                        size_t meta_len, uint64_t now)
{
    if (!memcmp(id, s->self->id, SWIM_ID_BYTES)) {
        /* someone holds a newer incarnation of us (a previous run): outdo it */
        if (inc > s->self->inc) refute(s, inc, false, now);
        return;
    }
    member *m = find(s, id);
    /* a member swim_join added was never announced: the first word from
     * or about it, though of the same incarnation, is news to spread.
     * (Both ends of a live link join each other: the end that was joined
     * to took the joiner's push-pull for old news, and the rest of the
     * cluster heard of the joiner only at the next push-pull, 30 s or more
     * later - hidden while every node's metadata changed every few
     * seconds.) */
    bool is_new = !m || !m->announced;
    /* and a member known without metadata (a placeholder that travelled in
     * a push-pull) takes it from the first news that has it: else the host
     * never learnt where the member is, and nothing newer came while the
     * member's metadata stayed the same */
    bool fills = m && !m->meta_len && meta_len && inc == m->inc;
    if (!m) {
        if (!(m = add_member(s, id))) return;
        m->state = SWIM_ALIVE;
        s->n_state[SWIM_ALIVE]++;
        m->since_ms = now;
    } else if (inc <= m->inc && !is_new && !fills) {
        return;
    }
    m->announced = true;
    int was = m->state;
    bool meta_changed = m->meta_len != meta_len || memcmp(m->meta, meta, meta_len);
    m->inc = inc;
    m->meta_len = (uint8_t)meta_len;
    memcpy(m->meta, meta, meta_len);
    if (was != SWIM_ALIVE) set_state(s, m, SWIM_ALIVE, now);
    bcast(s, m, U_ALIVE, NULL);
    if (was == SWIM_DEAD) maybe_heal(s, m, now);
    if (is_new) emit(s, SWIM_EV_JOIN, m);
    else if (was != SWIM_ALIVE) emit(s, SWIM_EV_ALIVE, m);
    else if (meta_changed) emit(s, SWIM_EV_UPDATE, m);
}

static bool confirmed_by(const member *m, const uint8_t *from)
{
    if (!memcmp(m->susp_from, from, SWIM_ID_BYTES)) return true;
    for (int i = 0; i < m->n_conf; i++)
        if (!memcmp(m->conf[i], from, SWIM_ID_BYTES)) return true;
    return false;
}

static void apply_suspect(swim *s, const uint8_t *id, uint32_t inc, const uint8_t *from,
                          uint64_t now)
{
    if (!memcmp(id, s->self->id, SWIM_ID_BYTES)) {
        if (inc >= s->self->inc) refute(s, inc, false, now);
        return;
    }
    member *m = find(s, id);
    if (!m || inc < m->inc || m->state == SWIM_DEAD || m->state == SWIM_LEFT) return;
    if (m->state == SWIM_SUSPECT && inc == m->inc) {
        /* an independent confirmation shortens the timeout (Lifeguard); it is
         * spread again so that others count it too */
        if (m->n_conf < MAX_CONFIRM && !confirmed_by(m, from)) {
            memcpy(m->conf[m->n_conf++], from, SWIM_ID_BYTES);
            bcast(s, m, U_SUSPECT, from);
        }
        return;
    }
    m->inc = inc;
    if (m->state == SWIM_SUSPECT) set_state(s, m, SWIM_ALIVE, now);  /* a newer suspicion restarts */
    set_state(s, m, SWIM_SUSPECT, now);
    m->susp_start_ms = now;
    m->n_conf = 0;
    memcpy(m->susp_from, from, SWIM_ID_BYTES);
    if (s->n_susp == s->susp_cap) {
        size_t cap = s->susp_cap ? 2 * s->susp_cap : 16;
        member **a = rc_realloc(s->susp, cap * sizeof *a);
        if (!a) { set_state(s, m, SWIM_ALIVE, now); return; }
        s->susp = a;
        s->susp_cap = cap;
    }
    m->susp_pos = (int)s->n_susp;
    s->susp[s->n_susp++] = m;
    bcast(s, m, U_SUSPECT, from);
    emit(s, SWIM_EV_SUSPECT, m);
}

static void apply_dead(swim *s, const uint8_t *id, uint32_t inc, const uint8_t *from,
                       bool left, uint64_t now)
{
    if (!memcmp(id, s->self->id, SWIM_ID_BYTES)) {
        if (!s->left && inc >= s->self->inc) refute(s, inc, true, now);
        return;
    }
    member *m = find(s, id);
    if (!m || inc < m->inc || m->state == SWIM_DEAD || m->state == SWIM_LEFT) return;
    m->inc = inc;
    set_state(s, m, left ? SWIM_LEFT : SWIM_DEAD, now);
    bcast(s, m, left ? U_LEFT : U_DEAD, from);
    emit(s, left ? SWIM_EV_LEFT : SWIM_EV_DEAD, m);
}

/* Lifeguard: the timeout runs from max down to min as confirmations come,
 * logarithmically, reaching min at the expected number of confirmations. */
static uint64_t susp_timeout(const swim *s, const member *m)
{
    double n = (double)(s->n > 1 ? s->n : 1);
    double mn = s->cfg.suspicion_mult * fmax(1.0, log10(n)) * s->cfg.period_ms;
    double mx = s->cfg.suspicion_max_mult * mn;
    int k = 3;                                    /* confirmations expected */
    if ((size_t)k > s->n - 2 || s->n < 2) k = s->n > 2 ? (int)s->n - 2 : 0;
    if (k <= 0) return (uint64_t)mn;
    double t = mx - (mx - mn) * log((double)m->n_conf + 1) / log((double)k + 1);
    return (uint64_t)fmax(mn, t);
}

/* ---- receiving --------------------------------------------------------- */

typedef struct {
    int type;
    const uint8_t *from, *target;
    uint32_t from_inc, seq, you_inc;
    int you_state;
    int n_up;
} hdr;

static int parse_updates(swim *s, const uint8_t *p, size_t len, int n, uint64_t now)
{
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (len - o < 1 + SWIM_ID_BYTES + 4) return -1;
        int kind = p[o];
        const uint8_t *id = p + o + 1;
        uint32_t inc = get32(p + o + 1 + SWIM_ID_BYTES);
        o += 1 + SWIM_ID_BYTES + 4;
        if (kind == U_ALIVE) {
            if (len - o < 1 || p[o] > SWIM_META_MAX || len - o - 1 < p[o]) return -1;
            size_t ml = p[o];
            apply_alive(s, id, inc, p + o + 1, ml, now);
            o += 1 + ml;
        } else if (kind >= U_SUSPECT && kind <= U_LEFT) {
            if (len - o < SWIM_ID_BYTES) return -1;
            const uint8_t *from = p + o;
            o += SWIM_ID_BYTES;
            if (kind == U_SUSPECT) apply_suspect(s, id, inc, from, now);
            else apply_dead(s, id, inc, from, kind == U_LEFT, now);
        } else {
            return -1;
        }
    }
    return o == len ? 0 : -1;
}

/* A member we thought dead answers: a partition has likely healed.  Gossip
 * alone would carry the other side's members (each with a new incarnation)
 * a few dozen per packet; full exchanges with it and then with random
 * members for a few periods spread them like an epidemic of whole states. */
static void maybe_heal(swim *s, member *m, uint64_t now)
{
    bool calm = now >= s->heal_until;
    heal_mode(s, now);
    if (calm) {
        send_pushpull(s, m->id, P_PUSHPULL);
        s->next_heal_pp = now + s->cfg.period_ms / 4;
    }
}

static relay *relay_find(swim *s, uint32_t seq)
{
    for (int i = 0; i < MAX_RELAYS; i++)
        if (s->relays[i].used && s->relays[i].my_seq == seq) return &s->relays[i];
    return NULL;
}

static void merge_state(swim *s, const uint8_t *p, size_t len, const uint8_t *sender,
                        uint64_t now)
{
    if (len < 4) return;
    uint32_t n = get32(p);
    size_t o = 4;
    if (n > MAX_PP_ENTRIES) return;
    for (uint32_t i = 0; i < n; i++) {
        if (len - o < 1 + SWIM_ID_BYTES + 4 + 1) return;
        int st = p[o];
        const uint8_t *id = p + o + 1;
        uint32_t inc = get32(p + o + 1 + SWIM_ID_BYTES);
        size_t ml = p[o + 1 + SWIM_ID_BYTES + 4];
        o += 1 + SWIM_ID_BYTES + 4 + 1;
        if (ml > SWIM_META_MAX || len - o < ml) return;
        const uint8_t *meta = p + o;
        o += ml;
        switch (st) {
        case SWIM_ALIVE: apply_alive(s, id, inc, meta, ml, now); break;
        /* second-hand death is only a suspicion here: the sender may be on
         * the other side of a partition that has just healed */
        case SWIM_SUSPECT:
        case SWIM_DEAD:
            if (!memcmp(id, s->self->id, SWIM_ID_BYTES)) {
                if (inc >= s->self->inc) refute(s, inc, st == SWIM_DEAD, now);
                break;
            }
            apply_suspect(s, id, inc, sender, now);
            break;
        case SWIM_LEFT: apply_dead(s, id, inc, sender, true, now); break;
        default: return;
        }
    }
}

int swim_recv(swim *s, const uint8_t *buf, size_t len, uint64_t now)
{
    if (len < HDR_BYTES || buf[0] != PROTO_VERSION || buf[1] < P_PING || buf[1] > P_PUSHPULL_REPLY) {
        s->st.bad++;
        return rc_fail(RC_EFORMAT, "membership packet: %zu bytes, not a version %d packet",
                       len, PROTO_VERSION);
    }
    hdr h = {
        .type = buf[1], .from = buf + 2, .from_inc = get32(buf + 18), .seq = get32(buf + 22),
        .target = buf + 26, .you_state = buf[42], .you_inc = get32(buf + 43),
        .n_up = buf[47] << 8 | buf[48],
    };
    if (!memcmp(h.from, s->self->id, SWIM_ID_BYTES)) {
        s->st.bad++;
        return rc_fail(RC_EFORMAT, "membership packet claims to come from this node");
    }
    s->st.received++;
    if (s->left) return 0;
    if ((h.you_state == SWIM_SUSPECT || h.you_state == SWIM_DEAD) && h.you_inc >= s->self->inc)
        refute(s, h.you_inc, h.you_state == SWIM_DEAD, now);
    if (h.type == P_PUSHPULL || h.type == P_PUSHPULL_REPLY) {
        merge_state(s, buf + HDR_BYTES, len - HDR_BYTES, h.from, now);
        if (h.type == P_PUSHPULL) send_pushpull(s, h.from, P_PUSHPULL_REPLY);
        return 0;
    }
    if (parse_updates(s, buf + HDR_BYTES, len - HDR_BYTES, h.n_up, now) != 0) {
        s->st.bad++;
        return rc_fail(RC_EFORMAT, "membership packet: malformed updates");
    }
    member *sender = find(s, h.from);
    if (!sender) {
        /* a node that knows us but we do not know it: exchange state */
        if (h.type == P_PING || h.type == P_PING_REQ) send_pushpull(s, h.from, P_PUSHPULL);
        return 0;
    }
    switch (h.type) {
    case P_PING:
        if (!memcmp(h.target, s->self->id, SWIM_ID_BYTES))
            send_pkt(s, P_ACK, h.from, h.seq, s->self->id);
        break;
    case P_PING_REQ: {
        if (!find(s, h.target) || !memcmp(h.target, s->self->id, SWIM_ID_BYTES)) break;
        relay *r = NULL;
        for (int i = 0; i < MAX_RELAYS && !r; i++)
            if (!s->relays[i].used || s->relays[i].deadline_ms <= now) r = &s->relays[i];
        if (!r) break;
        r->used = true;
        r->my_seq = ++s->seq;
        r->origin_seq = h.seq;
        memcpy(r->origin, h.from, SWIM_ID_BYTES);
        r->deadline_ms = now + (uint64_t)s->cfg.probe_timeout_ms * (s->awareness + 1);
        send_pkt(s, P_PING, h.target, r->my_seq, h.target);
        break;
    }
    case P_ACK:
        if (s->probing && h.seq == s->probe_seq) {
            s->acked = true;
        } else {
            relay *r = relay_find(s, h.seq);
            if (r) {
                send_pkt(s, P_ACK, r->origin, r->origin_seq, h.target);
                r->used = false;
            }
        }
        break;
    case P_NACK:
        if (s->probing && h.seq == s->probe_seq) s->nacks++;
        break;
    default:
        break;
    }
    return 0;
}

/* ---- timers ------------------------------------------------------------ */

static bool probeable(const member *m)
{
    return m->state == SWIM_ALIVE || m->state == SWIM_SUSPECT;
}

static member *random_live(swim *s, const uint8_t *not1, const uint8_t *not2)
{
    if (s->n_state[SWIM_ALIVE] + s->n_state[SWIM_SUSPECT] <= 1) return NULL;
    for (int tries = 0; tries < 32; tries++) {
        member *m = s->m[rnd_below(s, s->n)];
        if (m == s->self || !probeable(m)) continue;
        if ((not1 && !memcmp(m->id, not1, SWIM_ID_BYTES)) ||
            (not2 && !memcmp(m->id, not2, SWIM_ID_BYTES)))
            continue;
        return m;
    }
    return NULL;
}

static void shuffle(swim *s)
{
    for (size_t i = s->n; i > 1; i--) {
        size_t j = rnd_below(s, i);
        member *t = s->m[i - 1]; s->m[i - 1] = s->m[j]; s->m[j] = t;
    }
}

static void probe_end(swim *s, uint64_t now)
{
    s->probing = false;
    if (s->acked) { health(s, -1); return; }
    /* Lifeguard: nacks prove the helpers were reachable; missing ones hint
     * that this node is the slow one */
    if (s->nacks_expected > 0) health(s, s->nacks_expected - s->nacks);
    else health(s, 1);
    member *m = find(s, s->probe_id);
    if (m && m->state == SWIM_ALIVE) {
        s->st.suspects_raised++;
        apply_suspect(s, m->id, m->inc, s->self->id, now);
    } else if (m && m->state == SWIM_SUSPECT) {
        apply_suspect(s, m->id, m->inc, s->self->id, now);
    }
}

static void probe_start(swim *s, uint64_t now)
{
    member *t = NULL;
    if (!s->round_started && s->n > 1) {
        /* nodes started together would walk their rounds in step, so that
         * near a round's end few of them have a given member still ahead:
         * the first round starts at a random place */
        s->round_started = true;
        s->probe_pos = rnd_below(s, s->n);
    }
    for (size_t tries = 0; tries < s->n && !t; tries++) {
        if (s->probe_pos >= s->n) { shuffle(s); s->probe_pos = 0; }
        member *m = s->m[s->probe_pos++];
        if (m != s->self && probeable(m)) t = m;
    }
    if (!t) return;
    memcpy(s->probe_id, t->id, SWIM_ID_BYTES);
    s->probing = true;
    s->acked = false;
    s->indirect_sent = false;
    s->nacks = s->nacks_expected = 0;
    s->probe_seq = ++s->seq;
    s->probe_timeout_at = now + (uint64_t)s->cfg.probe_timeout_ms * (s->awareness + 1);
    s->probe_end_at = now + (uint64_t)s->cfg.period_ms * (s->awareness + 1);
    send_pkt(s, P_PING, t->id, s->probe_seq, t->id);
}

static void probe_indirect(swim *s)
{
    s->indirect_sent = true;
    uint8_t used[8][SWIM_ID_BYTES];
    int k = s->cfg.indirect_k < 8 ? s->cfg.indirect_k : 8, n = 0;
    for (int tries = 0; tries < 4 * k && n < k; tries++) {
        member *m = random_live(s, s->probe_id, NULL);
        if (!m) break;
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= !memcmp(used[i], m->id, SWIM_ID_BYTES);
        if (dup) continue;
        memcpy(used[n++], m->id, SWIM_ID_BYTES);
        send_pkt(s, P_PING_REQ, m->id, s->probe_seq, s->probe_id);
    }
    s->nacks_expected = n;
    /* the direct ping may be lost, not the member: try it once more */
    send_pkt(s, P_PING, s->probe_id, s->probe_seq, s->probe_id);
}

static void gossip(swim *s)
{
    if (!s->n_bcast) return;
    for (int i = 0; i < s->cfg.gossip_nodes && s->n_bcast; i++) {
        member *m = random_live(s, NULL, NULL);
        if (!m) return;
        send_pkt(s, P_GOSSIP, m->id, 0, NULL);
    }
}

static void dead_probe(swim *s)
{
    if (!s->n_state[SWIM_DEAD]) return;
    for (int tries = 0; tries < 32; tries++) {
        member *m = s->m[rnd_below(s, s->n)];
        if (m->state != SWIM_DEAD) continue;
        send_pkt(s, P_PING, m->id, ++s->seq, m->id);
        return;
    }
}

static void reap(swim *s, uint64_t now)
{
    bool removed = false;
    for (size_t i = 0; i < s->n;) {
        member *m = s->m[i];
        if ((m->state == SWIM_DEAD || m->state == SWIM_LEFT) && now - m->since_ms >= s->cfg.reap_ms) {
            emit(s, SWIM_EV_REAPED, m);
            bcast_drop(s, m);
            s->n_state[m->state]--;
            s->m[i] = s->m[--s->n];
            if (s->probe_pos > s->n) s->probe_pos = s->n;
            rc_free(m);
            removed = true;
        } else {
            i++;
        }
    }
    if (removed) {
        memset(s->idx, 0, s->idx_cap * sizeof *s->idx);
        for (size_t i = 0; i < s->n; i++) idx_put(s->idx, s->idx_cap, s->m[i]);
    }
}

static uint64_t pushpull_interval(const swim *s)
{
    /* a full exchange costs O(N) bytes: at N > 32 it is made rarer, so the
     * bytes per node per second grow only as N / log N */
    uint64_t iv = s->cfg.pushpull_ms;
    if (s->n > 32) iv *= (uint64_t)ceil(log2((double)s->n) - log2(32.0)) + 1;
    return iv;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

uint64_t swim_tick(swim *s, uint64_t now)
{
    if (s->left) return now + s->cfg.period_ms;
    if (s->probing && !s->acked && !s->indirect_sent && now >= s->probe_timeout_at)
        probe_indirect(s);
    if (s->probing && now >= s->probe_end_at) probe_end(s, now);
    if (now >= s->next_probe) {
        probe_start(s, now);
        s->next_probe = now + (uint64_t)s->cfg.period_ms * (s->awareness + 1);
    }
    for (int i = 0; i < MAX_RELAYS; i++) {
        relay *r = &s->relays[i];
        if (r->used && now >= r->deadline_ms) {
            r->used = false;
            if (find(s, r->origin)) send_pkt(s, P_NACK, r->origin, r->origin_seq, NULL);
        }
    }
    for (size_t i = 0; i < s->n_susp;) {
        member *m = s->susp[i];
        if (now - m->susp_start_ms >= susp_timeout(s, m))
            apply_dead(s, m->id, m->inc, s->self->id, false, now);   /* removes it from susp */
        else
            i++;
    }
    if (now >= s->next_gossip) {
        gossip(s);
        s->next_gossip = now + s->cfg.gossip_ms;
    }
    if (now >= s->next_pp) {
        member *m = random_live(s, NULL, NULL);
        if (m) send_pushpull(s, m->id, P_PUSHPULL);
        s->next_pp = now + pushpull_interval(s) / 2 + rnd_below(s, pushpull_interval(s));
    }
    if (now < s->heal_until && now >= s->next_heal_pp) {
        member *m = random_live(s, NULL, NULL);
        if (m) send_pushpull(s, m->id, P_PUSHPULL);
        s->next_heal_pp = now + s->cfg.period_ms / 4;
    }
    if (now >= s->next_dead_probe) {
        dead_probe(s);
        s->next_dead_probe = now + s->cfg.dead_probe_ms;
    }
    if (now >= s->next_reap) {
        if (s->n_state[SWIM_DEAD] || s->n_state[SWIM_LEFT]) reap(s, now);
        s->next_reap = now + s->cfg.period_ms;
    }
    /* a timer is due only when it has work: gossip with updates queued,
     * dead probes with dead members.  An idle member otherwise woke its
     * host 5 + 8 times a second for nothing; updates queued later (a packet,
     * swim_suspect, swim_set_meta) go out at the host's next swim_tick, which
     * it calls after each of those (swim.h) */
    uint64_t next = s->next_probe;
    if (s->n_bcast) next = min_u64(next, s->next_gossip);
    if (s->n_state[SWIM_DEAD]) next = min_u64(next, s->next_dead_probe);
    if (now < s->heal_until) next = min_u64(next, s->next_heal_pp);
    /* the probe timeout matters only while no ack came and no indirect
     * probe went out: once acked, a time already past would wake the host
     * at once, again and again, until the period ends */
    if (s->probing)
        next = min_u64(next, !s->acked && !s->indirect_sent ? s->probe_timeout_at : s->probe_end_at);
    for (int i = 0; i < MAX_RELAYS; i++)
        if (s->relays[i].used) next = min_u64(next, s->relays[i].deadline_ms);
    for (size_t i = 0; i < s->n_susp; i++)
        next = min_u64(next, s->susp[i]->susp_start_ms + susp_timeout(s, s->susp[i]));
    return min_u64(next, s->next_pp);
}

/* ---- life cycle and queries -------------------------------------------- */

swim *swim_new(const swim_config *cfg, const swim_io *io, const uint8_t *self_id,
               const uint8_t *meta, size_t meta_len, uint64_t seed, uint64_t now)
{
    if (meta_len > SWIM_META_MAX) { rc_fail(RC_ELIMIT, "node metadata: %zu bytes (max %d)", meta_len, SWIM_META_MAX); return NULL; }
    swim *s = rc_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (s->cfg.packet_max > SWIM_PACKET_MAX || s->cfg.packet_max < 256) s->cfg.packet_max = SWIM_PACKET_MAX;
    if (s->cfg.awareness_max < 1) s->cfg.awareness_max = 1;
    s->io = *io;
    rng_seed(&s->rng, seed ^ id_hash(self_id));
    s->idx_cap = 128;
    if (!(s->idx = rc_calloc(s->idx_cap, sizeof *s->idx))) goto fail;
    if (!(s->self = add_member(s, self_id))) goto fail;
    s->self->state = SWIM_ALIVE;
    s->n_state[SWIM_ALIVE] = 1;
    s->self->meta_len = (uint8_t)meta_len;
    if (meta_len) memcpy(s->self->meta, meta, meta_len);
    s->next_probe = now + rnd_below(s, s->cfg.period_ms);    /* nodes out of step */
    s->next_gossip = now + rnd_below(s, s->cfg.gossip_ms);
    s->next_pp = now + s->cfg.pushpull_ms / 2 + rnd_below(s, s->cfg.pushpull_ms);
    s->next_dead_probe = now + s->cfg.dead_probe_ms;
    s->next_reap = now + s->cfg.period_ms;
    return s;
fail:
    swim_free(s);
    return NULL;
}

void swim_free(swim *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) rc_free(s->m[i]);
    rc_free(s->m);
    rc_free(s->idx);
    rc_free(s->susp);
    rc_free(s);
}

int swim_join(swim *s, const uint8_t *id, uint64_t now)
{
    if (!memcmp(id, s->self->id, SWIM_ID_BYTES)) return rc_fail(RC_EINVAL, "joining this node itself");
    /* a node that knows nobody yet also spreads its own alive news, to the
     * members it learns from the first reply: what the member joined to
     * broadcasts may be used up before later joiners are in its table */
    if (s->n_state[SWIM_ALIVE] + s->n_state[SWIM_SUSPECT] <= 1) bcast(s, s->self, U_ALIVE, NULL);
    if (!find(s, id)) {
        member *m = add_member(s, id);
        if (!m) return RC_ENOMEM;
        m->state = SWIM_ALIVE;
        s->n_state[SWIM_ALIVE]++;
        m->since_ms = now;
    }
    send_pushpull(s, id, P_PUSHPULL);
    return 0;
}

void swim_suspect(swim *s, const uint8_t *id, uint64_t now)
{
    member *m = find(s, id);
    if (!m || m == s->self || (m->state != SWIM_ALIVE && m->state != SWIM_SUSPECT)) return;
    if (m->state == SWIM_ALIVE) s->st.suspects_raised++;
    apply_suspect(s, m->id, m->inc, s->self->id, now);
}

int swim_set_meta(swim *s, const uint8_t *meta, size_t meta_len, uint64_t now)
{
    if (meta_len > SWIM_META_MAX)
        return rc_fail(RC_ELIMIT, "node metadata: %zu bytes (max %d)", meta_len, SWIM_META_MAX);
    s->self->meta_len = (uint8_t)meta_len;
    memcpy(s->self->meta, meta, meta_len);
    s->self->inc++;
    bcast(s, s->self, U_ALIVE, NULL);
    return 0;
}

void swim_leave(swim *s, uint64_t now)
{
    if (s->left) return;
    bcast(s, s->self, U_LEFT, s->self->id);
    /* say it to a few members at once: the leaving node stops afterwards */
    for (int i = 0; i < s->cfg.gossip_nodes; i++) {
        member *m = random_live(s, NULL, NULL);
        if (m) send_pkt(s, P_GOSSIP, m->id, 0, NULL);
    }
    s->left = true;
}

size_t swim_n_members(const swim *s) { return s->n; }

int swim_member_at(const swim *s, size_t i, swim_member_view *out)
{
    if (i >= s->n) return RC_ERANGE;
    const member *m = s->m[i];
    out->id = m->id;
    out->state = m->state;
    out->incarnation = m->inc;
    out->meta = m->meta;
    out->meta_len = m->meta_len;
    return 0;
}

int swim_state_of(const swim *s, const uint8_t *id)
{
    const member *m = find(s, id);
    return m ? m->state : -1;
}

void swim_counts(const swim *s, size_t counts[4])
{
    for (int i = 0; i < 4; i++) counts[i] = s->n_state[i];
}

void swim_get_stats(const swim *s, swim_stats *out)
{
    *out = s->st;
    out->awareness = s->awareness;
    out->incarnation = s->self->inc;
}
