/* hub.h - fetching GGUF models from Hugging Face (or a mirror of its API).
 *
 * A layer on src/base only (libcurl for HTTP, libsodium for sha256): the
 * CLI (`racimo pull`) and the API (POST /api/pull, /v1/models/pull) call it.
 * Nothing here runs unless a pull is asked for: racimo is offline-first.
 *
 * A pull resolves a name through GET {endpoint}/api/models/ORG/REPO/tree/main
 * (each file's path, size and LFS sha256), picks the files, checks the free
 * space, then downloads each from {endpoint}/ORG/REPO/resolve/main/FILE
 * (redirects followed, to a CDN usually) into a `.part` file of the staging
 * folder (MODELS_DIR/.partial, hidden from the model scans, on the same file
 * system so that the final rename is atomic).  An interrupted transfer
 * resumes with a Range request; a finished one is checked against the
 * listed sha256 and renamed into the models folder, so the folder only ever
 * holds complete, verified files.
 */
#ifndef RC_HUB_H
#define RC_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HUB_MAX_FILES 64      /* parts of one model */
#define HUB_PATH_MAX 512

/* A name as the user typed it, split: hf.co/ORG/REPO:QUANT,
 * huggingface.co/ORG/REPO:QUANT, https://huggingface.co/ORG/REPO or ORG/REPO. */
typedef struct {
    char repo[256];           /* ORG/REPO */
    char quant[64];           /* "" when no :QUANT was given */
} hub_ref;

/* One file of the repository to fetch. */
typedef struct {
    char path[HUB_PATH_MAX];  /* in the repository (may hold '/') */
    char name[HUB_PATH_MAX];  /* its base name: the file name in the models folder */
    uint64_t size;
    char sha256[65];          /* lower-case hex; "" when the listing had none (not LFS) */
} hub_file;

/* What a pull fetches: one file, or every part of a split GGUF in order. */
typedef struct {
    char repo[256];           /* ORG/REPO */
    /* the model's file name: the file's, or for a split model its parts'
     * without -0000N-of-0000M (the joined file's name, see join) */
    char set_name[HUB_PATH_MAX];
    hub_file files[HUB_MAX_FILES];
    int n_files;
    uint64_t total_bytes;
} hub_plan;

/* A progress report: about `file` (index of n_files), with the bytes done of
 * it and of the whole plan.  `phase` is "downloading", "verifying",
 * "joining" (the parts of a split model into one file) or "done" (the file,
 * or the part, is verified and in place). */
typedef struct {
    const char *phase;
    const hub_file *file;
    int index, n_files;
    uint64_t file_done, file_total;
    uint64_t done, total;
    double bytes_per_s;       /* over the last few seconds; 0 when unknown */
} hub_progress;

typedef struct {
    const char *endpoint;     /* NULL: $HF_ENDPOINT, else https://huggingface.co */
    const char *token;        /* NULL: $HF_TOKEN; sent as Authorization: Bearer */
    const char *models_dir;   /* where finished files go (made when missing) */
    /* called from the pulling thread, at most ~4 times a second while bytes
     * flow and once at each phase change; may be NULL */
    void (*progress)(void *arg, const hub_progress *p);
    void *arg;
    /* nonzero stops the pull at the next chunk (SIGINT, a client that went
     * away): the .part stays for a later resume; may be NULL */
    const volatile int *cancel;
    int retries;              /* resumed attempts after a cut transfer (default 4
                               * when negative) */
    int stall_s;              /* a transfer slower than 1 byte/s this long is cut
                               * (default 60 when 0) */
    /* Joins the verified parts of a split model (paths in order) into one
     * file `out` (gguf_join: the caller brings the model layer); the parts
     * are then deleted.  NULL (what racimo does): the parts go into the
     * models folder as they are, once all are verified, the first last. */
    int (*join)(const char *const *parts, int n, const char *out);
} hub_config;

/* Fills *cfg with the defaults above (all NULL, retries -1). */
void hub_config_default(hub_config *cfg);

/* Splits a model name; RC_EINVAL with a sentence for names that are not a
 * Hugging Face repository. */
int hub_parse_ref(const char *name, hub_ref *out);

/* Chooses the files of a tree listing (the JSON array the tree API answers)
 * for `ref`'s quantisation tag, or the file `file` when not NULL (all the
 * parts of its split set when it is one).  Tags match case-insensitively as
 * a whole word of the base name (Q4_K does not match Q4_K_M); with no tag,
 * Q4_K_M when present, else the repository's only GGUF model.  mmproj
 * (vision projector) files are never picked by tag.  RC_ENOTFOUND or
 * RC_EINVAL naming the available tags when the choice fails. */
int hub_pick(const char *tree_json, const hub_ref *ref, const char *file, hub_plan *out);

/* Resolves `name` (and `file`, may be NULL) against the endpoint into *out:
 * the tree request and hub_pick.  A repository that needs a token gives
 * RC_EINVAL with a sentence saying so; network failures RC_EIO. */
int hub_resolve(const hub_config *cfg, const char *name, const char *file, hub_plan *out);

/* Downloads every file of the plan into cfg->models_dir (files already
 * there with the listed size are skipped).  Returns 0 when every file is in
 * the models folder, verified.  On failure nothing partial is in the models
 * folder; the .part of a cut or cancelled transfer is kept in the staging
 * folder for the next pull to resume, one that failed its sha256 or hit a
 * full disk is deleted.  Errors: RC_EIO (network, disk; the detail says
 * which, and "no space left" for a full disk), RC_EFORMAT (sha256 or size
 * mismatch), RC_ESTATE (cancelled), RC_ELIMIT (not enough free space). */
int hub_download(const hub_config *cfg, const hub_plan *plan);

/* The model name a pulled plan is served under: its set_name for a split
 * model (joined or not: the registry names a set so), else its file's
 * name, without ".gguf". */

void hub_model_name(const hub_config *cfg, const hub_plan *plan, char *out, size_t cap);

#endif
