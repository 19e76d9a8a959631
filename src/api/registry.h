/* registry.h - the models a server can serve, loaded on first use.
 *
 * Models are GGUF files found in the models folder (RACIMO_MODELS_DIR,
 * default ~/.racimo/models), in read-only folders
 * (RACIMO_MODELS_READ_ONLY_DIRS, colon-separated; only ever read), or given
 * by path (-m).  A model's name is its file name without ".gguf"; a request
 * may add Ollama's ":latest" tag.  When two files have the same name the
 * first wins: paths given by -m, then the models folder, then the read-only
 * folders in order.
 *
 * Life of a model: AVAILABLE (a file) -> LOADING (a loader thread maps it,
 * loads the tokenizer and template, binds the weights, builds an engine) ->
 * READY (an engine thread runs engine_step while there is work and sleeps
 * otherwise) or FAILED (the error is kept; the next request retries).  The
 * registry calls `on_change` from the loader thread after each load ends,
 * so the server can start the requests that waited.
 *
 * Thread safety: the model list and states are guarded by the registry's
 * mutex; registry_* functions may be called from any thread.  A READY
 * model's fields (tokenizer, template, engine) are read-only until
 * registry_free.
 */
#ifndef RC_API_REGISTRY_H
#define RC_API_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "cost.h"
#include "infer/engine.h"
#include "infer/lm.h"
#include "model/model.h"
#include "text/tokenizer.h"

enum model_state { MODEL_AVAILABLE, MODEL_LOADING, MODEL_READY, MODEL_FAILED };

/* How one instance is to be placed, asked with POST /v1/instances (the
 * dashboard's start form); zeros: as the node was configured. */
enum { PLACE_SPLIT_CONFIG, PLACE_SPLIT_LAYERS, PLACE_SPLIT_TENSOR, PLACE_SPLIT_AUTO };
#define PLACE_WISH_NODES 16
typedef struct {
    int min_nodes;             /* at least this many nodes (0: --min-nodes) */
    int split;                 /* PLACE_SPLIT_* */
    int n_nodes;               /* > 0: only these nodes (ids or names), those up; also when
                                  the instance is placed again after losing one */
    char nodes[PLACE_WISH_NODES][65];
} place_wish;

typedef struct api_model {
    char *name;                /* file name without .gguf */
    char *path;
    uint64_t size_bytes;
    time_t mtime;
    bool read_only;            /* found in a read-only folder */
    bool deleted;              /* its file was deleted (registry_delete): not listed nor
                                  found until the file is back (registry mutex) */
    bool preload;              /* given with -m: loads at start */
    struct api_registry *reg;
    int state;                 /* enum model_state (registry mutex) */
    char error[512];           /* why the last load failed */
    uint64_t t_loaded_ns;      /* when it became READY */
    double load_s;             /* seconds the load took */
    /* READY: */
    lm lm;                     /* weights, tokenizer, chat template */
    int tool_format;           /* enum tool_format of the template */
    int32_t tool_marker;       /* Mistral [TOOL_CALLS] token id, or -1 */
    unsigned tool_turns;       /* TOOL_TURN_* shape of past tool-call turns the template wants */
    bool thinks;               /* the template's model writes <think> blocks */
    unsigned think_switches;   /* REASONING_VAR_* bits: the template's thinking switches */
    /* control tokens whose text the parsers need (engine text_tokens):
     * <think> and </think> first (n_think_tokens), then the tool format's
     * markers */
    int32_t text_tokens[8];
    int n_think_tokens, n_text_tokens;
    engine *eng;
    engine_params ep;
    json_t *plan;              /* where it runs (placement), when in a cluster */
    cost_rate rate;            /* token counters once a second (power.c, event loop) */
    place_wish wish;           /* set before a load starts (event-loop thread), read by
                                  its loader and by rebuilds after a lost node */
    bool replacing;            /* a broken pipeline is being placed again */
    bool remote;               /* known from another node: pulled on load (path names
                                  the node; local_path is the copy) */
    char local_path[1200];     /* loader thread only */
    uint64_t t_used_ns;        /* last request submitted (or when loaded) */
    /* the engine thread */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool work, stop;
    pthread_t loader;
    bool loader_started;
    /* it was placed across nodes and lost one it could not do without:
     * placed again by itself when nodes come up (registry_retry_lost) */
    bool lost;
    char lost_why[200];        /* the fault, for the errors until it is placed again */
    uint64_t lost_came_up;     /* cluster_came_up() at the last retry */
    uint64_t retry_until_ns, retry_next_ns;
} api_model;

typedef struct {
    const char *const *paths;  /* -m files, loaded at start */
    int n_paths;
    const char *models_dir;    /* NULL: $RACIMO_MODELS_DIR or ~/.racimo/models */
    const char *ro_dirs;       /* NULL: $RACIMO_MODELS_READ_ONLY_DIRS */
    const char *template_file; /* NULL, or a chat template for every model */
    engine_params engine;      /* per model; n_ctx is capped by the model's */
    struct cluster *cluster;   /* NULL: every model runs here */
    struct pipeline *pipeline; /* with cluster: for models placed across nodes */
    int min_nodes;             /* placement option: at least this many stages */
    bool wire_f32;             /* pipeline hidden states as f32 */
    bool split_tensor;         /* placement option: tensor-parallel shards */
    bool split_auto;           /* placement option: layers or shards, the faster */
    struct weights *weights;   /* with cluster: pulls models other nodes have */
} registry_config;

typedef struct api_registry api_registry;

/* Scans the folders and files.  A -m path that cannot be read fails here
 * (RC_EIO with the path); a missing folder is not an error. */
int  registry_new(const registry_config *cfg, void (*on_change)(void *), void *arg,
                  api_registry **out);
/* Stops engine threads (pending requests end GEN_CANCELLED through their
 * callbacks), waits for loaders, frees everything.  Accepts NULL. */
void registry_free(api_registry *r);

/* Looks the folders over again for new or removed files (models in use
 * stay), and adds entries for the models other nodes of the cluster list
 * (pulled or forwarded to when used).  Thread safe. */
void registry_rescan(api_registry *r);

/* The model called `name` (also "name:latest"), rescanning once when it is
 * not known; NULL if there is none.  The pointer stays valid until
 * registry_free. */
api_model *registry_find(api_registry *r, const char *name);

/* The folder models are written to (pulls): --models-dir,
 * $RACIMO_MODELS_DIR or ~/.racimo/models; NULL when there is none. */
const char *registry_models_dir(const api_registry *r);

/* The configuration the registry was made with. */
const registry_config *registry_get_config(const api_registry *r);

/* Starts loading a model that is AVAILABLE or FAILED; returns its state
 * afterwards (LOADING or READY). */
int registry_load(api_registry *r, api_model *m);

/* Starts loading every -m model (at server start). */
void registry_load_initial(api_registry *r);

int  registry_state(api_registry *r, api_model *m, char *error, size_t cap);
bool registry_any_loading(api_registry *r);

/* A snapshot of the list for listing endpoints: *n models, the array is
 * rc_malloc'd (free with rc_free), the models themselves stay valid. */
api_model **registry_list(api_registry *r, int *n);

/* Stops a READY model with nothing running or queued: its engine (or
 * pipeline, whose stages end) is freed and it is AVAILABLE again.  0, or
 * RC_ESTATE with a detail (not loaded, or busy). */
int registry_unload(api_registry *r, api_model *m);

/* Deletes the file of a model of the models folder (DELETE /api/delete):
 * refused (RC_ESTATE, a sentence why) for a model loaded or loading, one in
 * a read-only folder or given with -m, or one only another node has
 * (RC_ENOTFOUND).  The entry stays (pointers stay valid) but is neither
 * listed nor found until a file of that name is back.  Thread safe. */
int registry_delete(api_registry *r, api_model *m);

/* Unloads READY models idle (no request) for idle_s seconds or more;
 * idle_s <= 0 does nothing.  Call it periodically. */
void registry_unload_idle(api_registry *r, int idle_s);

/* Models whose instance lost a node and could not be placed again are
 * tried again, for a while, after a node comes up (a join, a return):
 * without a request, so that the next one finds them ready.  Called
 * often (the server's tick); cheap when nothing moved. */
void registry_retry_lost(api_registry *r);

/* Submits to a READY model's engine and wakes its thread; engine_submit's
 * return. */
int registry_submit(api_model *m, gen_request *g);

/* Wakes a model's engine thread (after setting a request's cancel flag). */
void registry_wake(api_model *m);

/* Renders chat messages (and tools, and the extra template variables
 * `vars`, an object or NULL) with the model's template and tokenizes the
 * prompt (special tokens parsed; BOS added unless the template wrote it).
 * Returns 0 with *ids (rc_malloc'd) / *n, and the rendered text in *text
 * when text is not NULL (rc_malloc'd), or a negative code with rc_errmsg()
 * saying why (template errors). */
int registry_chat_prompt(const api_model *m, const json_t *messages, const json_t *tools,
                         const json_t *vars, int32_t **ids, int *n, char **text);

/* Tokenizes raw text: special tokens parsed only when `special`; BOS added
 * as the vocabulary asks, unless the text starts with it. */
int registry_text_prompt(const api_model *m, const char *text, bool special, int32_t **ids,
                         int *n);

#endif
