/* pipeline_internal.h - the structures shared by the files of the
 * pipeline (pipeline.h is its public face).
 *
 *   pipeline.c      the object: creation and shutdown, finding a stage,
 *                   routing the cluster's messages to the two sides and
 *                   sending (pl__send_to), nodes going down, status
 *   pipe_codec.c    floats on the f16 wire, sequence starts (the byte
 *                   buffers are inline below)
 *   pipe_shard.c    tensor-parallel shards' exchange of parts: the sums
 *                   inside the forward pass, the logits after it
 *   pipe_channel.c  binding the data channels between shards
 *   pipe_stage.c    the stage side: set-up, a worker thread per stage,
 *                   batches
 *   pipe_head.c     the head side: setting up the stages, the executor
 *                   the engine drives, results
 *   pipe_hostile.c  tests only: a member injecting batches
 *
 * Cross-file functions are named pl__*.  Message layouts are in
 * docs/cluster-protocol.md, section 9.
 *
 * Ordering: a group's batch goes head -> stage 0 -> ... -> last -> head on
 * links that each keep order, and the head sends a group's next batch only
 * after its result came back, so sequence starts (cache truncation, new
 * samplers) that ride in a batch reach every stage before that group's
 * next rows.  Messages to this node itself skip the network but take the
 * same path through the handler.
 *
 * Threads: the handler runs on the cluster thread (or the sender's, for
 * messages to self) and only queues; stage work runs on each stage's
 * worker; the head's executor runs on the engine thread.  `mu` guards the
 * lists, the queues and the head's results.
 */
#ifndef RC_PIPELINE_INTERNAL_H
#define RC_PIPELINE_INTERNAL_H

#include "base/mem.h"
#include "cluster/channel.h"
#include "cluster/pipeline.h"
#include "cluster/weights.h"
#include "cluster/wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    PIPE_SETUP  = 0x40,   /* head -> stage: JSON set-up */
    PIPE_READY  = 0x41,   /* stage -> head: JSON, loaded or failed */
    PIPE_BATCH  = 0x42,   /* head -> first stage, stage -> next: rows (+ hidden) */
    PIPE_RESULT = 0x43,   /* last stage (or a failing stage) -> head */
    PIPE_STOP   = 0x44,   /* head -> stage: u32 instance */
    PIPE_PARTIAL = 0x45,  /* shard -> shard: a part of a sum, or of the logits */
    PIPE_BIND   = 0x46,   /* shard -> shard: opens a data channel, or says there is none */
};
#define BIND_LEN (WIRE_ID_BYTES + 4 * 4)
enum { BIND_CHANNEL = 0, BIND_NONE = 1 };
#define CHANNEL_DIAL_MS 5000
enum { PART_SUM = 0, PART_LOGITS = 1, PART_CANDS = 2 };
#define CANDS_DENSE 0xffffffffu   /* a PART_CANDS row sent whole */
#define CANDS_MAX 1024            /* top_k above this: the row is sent whole */
#define PARTIAL_HDR (WIRE_ID_BYTES + 4 * 4 + 8)
#define PARTIAL_WAIT_MS 60000     /* a shard's peer this late is taken as lost */
enum { ENC_NONE = 0, ENC_F16 = 1, ENC_F32 = 2 };
/* In a BATCH's encoding word, over the encoding (protocol 1.3): its starts
 * carry the tokens a rebuilt request had generated.  Set only when one
 * does, so batches of nodes of 1.2 and older still read; such a node
 * refuses a flagged batch (an unknown encoding) rather than misread it. */
#define ENC_STARTS_GENERATED 0x100u
/* Likewise (protocol 2.2): the starts carry grammars (exec.h); set only
 * when one has one, so that a 2.1 node refuses such a batch. */
#define ENC_STARTS_GRAMMAR 0x200u
#define ENC_STARTS_FLAGS (ENC_STARTS_GENERATED | ENC_STARTS_GRAMMAR)
#define MAX_GRAMMAR_WIRE (1 << 20)   /* GRAMMAR_MAX_TEXT */
#define BATCH_HDR (WIRE_ID_BYTES + 5 * 4)
#define MAX_BIAS_WIRE 1000000
/* The revision of how shards cut a model (model_shard_plan): 2 since
 * protocol 1.3 (experts whole per shard, heads uncut where the attention
 * output's blocks forbid it); a 1.2 head sends none (0) and cut MoE
 * experts by units, so its shards would not add up with ours. */
#define SHARD_CUT 2

/* What a set-up may ask of a node (docs/cluster-protocol.md section 9):
 * the bounds of `racimo serve`'s --parallel, --ctx-size and --batch. */
#define SETUP_MAX_SEQ 256
#define SETUP_MAX_CTX (1 << 22)
#define SETUP_MAX_BATCH (1 << 16)
/* Stage instances this node runs at once, per head and in all: each has a
 * thread and a KV cache, so a member cannot pile them up. */
#define STAGES_PER_HEAD 32
#define STAGES_MAX 128
/* Messages waiting for a stage's worker, per queue (the batches, which
 * only the node before may send; the parts from each peer shard).  An
 * honest head keeps at most one batch per group in flight (16 groups at
 * most) and a shard is at most two parts ahead of another, so only a flood
 * fills them (before these bounds a flood grew the queue without end).
 * Past the bytes bound a message is refused unless the queue is empty: one
 * message always fits. */
#define QUEUE_MAX_MSGS 64
#define QUEUE_MAX_BYTES ((size_t)1 << 30)

typedef struct msg {
    struct msg *next;
    size_t len;
    uint8_t data[];
} msg;

typedef struct stage_inst {
    struct stage_inst *next;
    pipeline *p;
    char head[33];
    uint8_t head_raw[WIRE_ID_BYTES];
    uint32_t inst;
    int index, n_stages;
    char model_name[256];
    char next_node[33];
    char prev_node[33];       /* who sends our batches: the previous stage, or the head
                                 (stage 0, every shard) */
    uint64_t mem_need;        /* bytes the set-up asked of this node (KV cache, buffers) */
    int first, last, n_ctx, n_seq, n_batch, n_threads, n_embd_want;
    bool wire_f32;
    int kv_type;              /* KV cache elements the head asked for (its "cache") */
    int cut;                  /* SHARD_CUT of the head's set-up (tensor parallel) */
    uint8_t root[DIGEST_BYTES]; /* the model's content digest the head sent (digests.h) */
    bool have_root;
    model *m;
    stage *st;
    sample_set *ss;
    embed_pool *ep;           /* an embedding model's last stage: instead of ss */
    float *pooled;            /* [n_seq][n_embd] its vectors of a batch */
    float *in, *out;
    uint8_t *wbuf;
    size_t wcap;
    msg *q_head, *q_tail;
    int q_n;                  /* messages and bytes in q (QUEUE_MAX_*) */
    size_t q_bytes;
    bool stop, done;
    pthread_cond_t cv;
    pthread_t thread;
    uint64_t batches;
    uint64_t last_progress_ns;
    /* tensor-parallel shards (n_ranks > 1) */
    int rank, n_ranks;
    char peers[PIPELINE_MAX_STAGES][33];
    msg *pq_head[PIPELINE_MAX_STAGES], *pq_tail[PIPELINE_MAX_STAGES];
    int pq_n[PIPELINE_MAX_STAGES];
    size_t pq_bytes[PIPELINE_MAX_STAGES];
    uint64_t n_parts;         /* partials sent so far (each shard counts the same) */
    uint64_t wait_ns;         /* time spent waiting for the others' parts */
    uint64_t forward_ns;      /* time in forward passes (waits included) */
    uint64_t run_ns;          /* time running batch messages (forward, sampling, sends) */
    bool peer_down;
    char peer_why[256];
    float *parts;             /* [n_ranks][n_batch][n_embd] the others' parts */
    uint8_t *pbuf;
    size_t plen, pcap;
    /* parts to and from shard q travel on chan[q] (channel.h) when set;
     * through the cluster link when chan_none[q] (or q runs on this node) */
    cluster_chan *chan[PIPELINE_MAX_STAGES];
    bool chan_none[PIPELINE_MAX_STAGES];
    /* shards 1..: copies of shard 0's samplers; a slot sampled in the last
     * batch takes its token from its next row */
    bool *unseen;             /* [n_seq] */
    float *raw;               /* [shard's n_vocab] logits before bias and penalties */
    sampler_cand *heap;       /* [CANDS_MAX] */
    int32_t *best;            /* [CANDS_MAX] */
} stage_inst;

typedef struct {
    bool sent, ready;
    int status;               /* 0 or a negative code */
    char error[256];
    int n;
    exec_sampled *rows;       /* [n_seq] */
    float *vecs;              /* [n_seq][n_embd] an embedding model's rows' vectors */
} head_group;

typedef struct head_exec {
    engine_exec x;
    struct head_exec *next;
    pipeline *p;
    uint32_t inst;
    pipeline_spec spec;
    char digest[DIGEST_HEX];  /* the model's content digest (hex) its stages pull against;
                                 "" when this node knows none */
    int n_ready;
    bool stage_ok[PIPELINE_MAX_STAGES];
    char stage_err[256];
    bool broken, woken;
    char broken_why[256];
    head_group *groups;
    pthread_cond_t cv;
    uint8_t *buf;
    size_t cap;
    uint64_t batches;
} head_exec;

struct pipeline {
    struct cluster *c;
    bool closed;              /* stopping: messages are dropped */
    weights *w;               /* pulls a stage's weights it lacks (may be NULL) */
    int n_threads;            /* for stages this node runs (0: its cores) */
    char self[33];
    pthread_mutex_t mu;
    stage_inst *stages;
    head_exec *execs;
    uint32_t next_inst;
    _Atomic uint64_t bytes_out, msgs_out;
    struct pend_chan *pend;   /* channels (or their refusals) for shards not set up yet */
    pthread_t inject;         /* tests only: pipe_hostile.c */
    bool inject_started;
    pthread_mutex_t log_mu;   /* the refusals' rate limit */
    struct refusal {
        char from[33];
        int type;
        uint64_t t_ns;
        unsigned quiet;       /* refusals not logged since */
    } refused[16];
};

/* A PIPE_BIND that came before the set-up of the shard it is for. */
typedef struct pend_chan {
    struct pend_chan *next;
    char from[33], head[33];
    uint32_t inst;
    int from_rank, to_rank;
    cluster_chan *ch;         /* NULL: the sender has no channel for this pair */
    uint64_t t_ns;
} pend_chan;

/* The bytes of a message: a write buffer that grows and remembers running
 * out of memory, so a message is checked once when it is complete, and a
 * reader that turns any overrun into `bad`, checked once after the fields.
 * Integers go in the host's byte order, little-endian on the machines
 * racimo builds for (docs/cluster-protocol.md). */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} wbuf;

/* n more bytes at the end, to be written by the caller; NULL on OOM */
static inline uint8_t *wb_grow(wbuf *w, size_t n)
{
    size_t at = w->len;
    if (!w->oom && w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *np = rc_realloc(w->p, cap);
        if (!np) {
            w->oom = true;
            return NULL;
        }
        w->p = np;
        w->cap = cap;
    }
    if (w->oom)
        return NULL;
    w->len += n;
    return w->p + at;
}

static inline void wb_put(wbuf *w, const void *d, size_t n)
{
    uint8_t *p = n ? wb_grow(w, n) : NULL;
    if (p)
        memcpy(p, d, n);
}

static inline void wb_u32(wbuf *w, uint32_t v) { wb_put(w, &v, 4); }
static inline void wb_i32(wbuf *w, int32_t v) { wb_put(w, &v, 4); }
static inline void wb_f32(wbuf *w, float v) { wb_put(w, &v, 4); }

typedef struct {
    const uint8_t *p;
    size_t len, off;
    bool bad;
} rbuf;

static inline const void *rb_get(rbuf *r, size_t n)
{
    if (r->bad || n > r->len - r->off) {
        r->bad = true;
        return NULL;
    }
    const void *d = r->p + r->off;
    r->off += n;
    return d;
}
static inline uint32_t rb_u32(rbuf *r) { uint32_t v = 0; const void *d = rb_get(r, 4); if (d) memcpy(&v, d, 4); return v; }
static inline int32_t rb_i32(rbuf *r) { int32_t v = 0; const void *d = rb_get(r, 4); if (d) memcpy(&v, d, 4); return v; }
static inline float rb_f32(rbuf *r) { float v = 0; const void *d = rb_get(r, 4); if (d) memcpy(&v, d, 4); return v; }
static inline uint64_t rb_u64(rbuf *r) { uint64_t v = 0; const void *d = rb_get(r, 8); if (d) memcpy(&v, d, 8); return v; }

/* pipeline.c */
stage_inst *pl__find_stage_locked(pipeline *p, const char *head, uint32_t inst);
/* Logs a message of `type` from node `from` that this node refuses, with
 * the sender's name and why (printf-style), at most once a second per
 * sender and type (the line counts those not logged).  Without mu. */
void pl__refuse(pipeline *p, const char *from, int type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Queues a copy of a message (len bytes at data) on a stage's queue unless
 * it is full (mu held): false, m untouched, when refused. */
bool pl__enqueue_locked(stage_inst *si, msg **head, msg **tail, int *n, size_t *bytes, msg *m,
                        const uint8_t *data, size_t len);
/* Sends a message to node `to`; one to this node itself goes straight
 * through the handler on the caller's thread, which therefore must
 * not hold mu. */
int pl__send_to(pipeline *p, const char *to, int type, const void *d, size_t n);

/* A start read in place: the bias pairs, prompt, grammar and triggers stay
 * in the message (s.triggers points at trig: use the struct where it is). */
typedef struct {
    exec_start s;
    const uint8_t *bias;      /* n_bias (i32, f32) pairs */
    const char *trig[EXEC_MAX_TRIGGERS];
} wire_start;

/* pipe_codec.c */
void pl__to_f16(const float *x, uint8_t *d, size_t n);
void pl__from_f16(const uint8_t *d, float *x, size_t n);
/* flags: ENC_STARTS_* (what the batch's starts carry) */
void pl__put_start(wbuf *w, const exec_start *s, uint32_t flags);
void pl__get_start(rbuf *r, wire_start *ws, uint32_t flags);

/* pipe_shard.c */
int pl__shard_reduce(void *ud, float *x, int n_rows, int width);
int pl__shard_gather(stage_inst *si, int n_rows, const int32_t *rs, const int8_t *rw,
                     int n_batch_rows);

/* pipe_channel.c */
int pl__shard_link(stage_inst *si);
void pl__pend_adopt_locked(pipeline *p, stage_inst *si);
int pl__on_channel(void *ud, const char *from, int type, const uint8_t *data, size_t len,
                   cluster_chan *ch);
void pl__on_bind(pipeline *p, const char *from, const uint8_t *data, size_t len);

/* pipe_stage.c */
void pl__reap_locked(pipeline *p);
void pl__on_setup(pipeline *p, const char *from, const uint8_t *data, size_t len);
void pl__on_batch(pipeline *p, const char *from, const uint8_t *data, size_t len);
void pl__on_stop(pipeline *p, const char *from, const uint8_t *data, size_t len);
void pl__on_partial(pipeline *p, const char *from, const uint8_t *data, size_t len);

/* pipe_head.c */
int pl__stage_of(const head_exec *h, const char *node);
void pl__on_ready(pipeline *p, const char *from, const uint8_t *data, size_t len);
void pl__on_result(pipeline *p, const char *from, const uint8_t *data, size_t len);

#endif
