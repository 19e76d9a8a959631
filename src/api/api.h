/* api.h - the HTTP API server: OpenAI (/v1/...) and Ollama (/api/...)
 * endpoints, health, cluster state and metrics, over the models of a
 * registry (registry.h).
 *
 * One libevent event loop (evhttp) on the thread that calls api_server_run
 * handles every connection; each loaded model has its own engine thread
 * (continuous batching).  Engine callbacks never block on a client: they
 * append to a per-request mailbox under a mutex and wake the event loop,
 * which writes to the sockets.  A client that goes away cancels its
 * sequence at once.  Listens on 127.0.0.1 unless told otherwise.
 */
#ifndef RC_API_H
#define RC_API_H

#include <stdbool.h>
#include <stddef.h>

struct cluster;

typedef struct {
    const char *host;                 /* default "127.0.0.1" */
    int port;                         /* default 8080; 0 = any free port */
    const char *const *model_paths;   /* -m: loaded at start */
    int n_model_paths;
    const char *models_dir;           /* NULL: $RACIMO_MODELS_DIR or ~/.racimo/models */
    const char *ro_dirs;              /* NULL: $RACIMO_MODELS_READ_ONLY_DIRS */
    const char *template_file;        /* NULL, or a chat template for every model */
    int parallel;                     /* sequences per model (default 4) */
    int ctx_size;                     /* tokens per sequence (default 4096) */
    int batch;                        /* rows per forward pass (default 512) */
    int threads;                      /* per model (default: physical cores) */
    int queue;                        /* waiting requests per model beyond the
                                         sequences (default 64); more get 429 */
    const char *const *api_keys;      /* none: no authentication; requests other nodes
                                         forward here need one of these keys too */
    int n_api_keys;
    const char *tls_cert;             /* with tls_key: HTTPS with this PEM certificate chain */
    const char *tls_key;              /* and this PEM private key; NULL: plain HTTP */
    const char *const *cors_origins;  /* none: no CORS headers; "*" any */
    int n_cors_origins;
    size_t max_body_bytes;            /* default 8 MiB */
    int timeout_s;                    /* idle read/write timeout (default 30) */
    bool log_content;                 /* prompts and answers in the access log */
    const char *access_log;           /* NULL: none; "-": standard output */
    bool handle_signals;              /* SIGINT/SIGTERM stop the loop */
    struct cluster *cluster;          /* NULL: standalone; else GET /v1/cluster answers its
                                         view and the models served are published to it
                                         (cluster/cluster.h); must outlive the server */
    struct pipeline *pipeline;        /* with a cluster: models too big for this node run
                                         as a pipeline across nodes (cluster/pipeline.h) */
    int min_nodes;                    /* split every model over at least this many nodes
                                         (benchmarks, tests); 0 = as placement decides */
    bool wire_f32;                    /* pipeline hidden states as f32 (default f16) */
    bool split_tensor;                /* models split across nodes by tensor parallelism
                                         (every node a part of every layer) instead of
                                         layer ranges */
    bool split_auto;                  /* whichever of the two placement expects faster */
    int cache_type;                   /* KV cache elements of its instances and their stages
                                         (tensor/kv_types.h; default KV_TYPE_DEFAULT) */
    int idle_unload_s;                /* stop a model idle this long (0: never) */
    struct weights *weights;          /* with a cluster: a model only other nodes have is
                                         pulled (its head, then what this node runs) */
    struct api_forward *forward;      /* with a cluster: requests for a model another node
                                         serves go there (api_forward_new) */
    /* the cost of a token (power.c, README "What a token costs") */
    double watts;                     /* --watts: this node's power; 0: measured (RAPL) */
    double price_kwh;                 /* --price-kwh; < 0: not set */
    double hw_price, hw_years;        /* --hw-price over --hw-years (0: no amortisation) */
    double cloud_price;               /* --cloud-price per million tokens; < 0: not set */
    const char *powercap_root;        /* NULL: /sys/class/powercap (tests give another) */
    struct api_copies *copies;        /* with a cluster: whole copies of a model on every
                                         node (api_copies_new) */
    bool test_forward_no_key;         /* tests only (racimo-hooks): requests this node
                                         forwards carry no API key proof, as from a member
                                         that drops the client's key */
} api_config;

void api_config_default(api_config *c);

typedef struct api_server api_server;

/* Binds the socket, scans the models and starts loading the -m ones.
 * Returns 0, or a negative code with rc_errmsg() (address in use, a -m
 * file missing, the access log not writable...).  The config's strings and
 * arrays must outlive the server. */
int  api_server_new(const api_config *cfg, api_server **out);

/* The port actually bound (useful with port 0). */
int  api_server_port(const api_server *s);

/* Runs the event loop until api_server_stop (or a signal, with
 * handle_signals).  Returns 0 or a negative code. */
int  api_server_run(api_server *s);

/* Makes api_server_run return soon; thread safe. */
void api_server_stop(api_server *s);

/* Stops the engines (requests in flight are cancelled), closes every
 * connection and frees everything.  Call after api_server_run returned (or
 * without running it).  Accepts NULL. */
void api_server_free(api_server *s);

/* Requests forwarded between the nodes of a cluster (forward.c,
 * docs/cluster-protocol.md §12): a node asked for a model that another node
 * serves, and that it would not run alone, relays the request there and
 * the answer back.  Made before cluster_start (it takes the message types
 * 0x58-0x5f) and given to the server as api_config.forward; freed after
 * cluster_free, since the cluster thread calls into it until then.  One
 * server at a time uses it. */
typedef struct api_forward api_forward;
int  api_forward_new(struct cluster *c, api_forward **out);
void api_forward_free(api_forward *f);          /* accepts NULL */

/* Whole copies of a model on every node (copy.c, POST /v1/models/copy,
 * `racimo pull --everywhere`; message type 0x60).  Made before
 * cluster_start, given to the server as api_config.copies, freed after
 * cluster_free (it joins the copies still running). */
typedef struct api_copies api_copies;
struct weights;
int  api_copies_new(struct cluster *c, struct weights *w, const char *models_dir,
                    api_copies **out);
void api_copies_free(api_copies *a);            /* accepts NULL */

/* Parses an --api-key-file: one key per line, blank lines and lines
 * starting with '#' ignored.  Appends rc_malloc'd strings to *keys (an
 * rc_realloc'd array of *n).  RC_EIO when unreadable. */
int api_read_key_file(const char *path, char ***keys, int *n);

#endif
