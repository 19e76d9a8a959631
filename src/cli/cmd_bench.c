/* cmd_bench.c - `racimo bench`: prompt-processing and generation speed of a
 * model on this machine, with the memory-bandwidth roof for generation.
 *
 * Method (as llama-bench): pp = one batch of P random tokens from an empty
 * cache (after --depth tokens of context, if given); tg = N single-token
 * steps from the same starting point.  Each repetition starts over; the
 * figures are median, min and max over repetitions.  The roof is the read
 * bandwidth of the same threads (tensor/membw.h: each streams its slice of
 * a 512 MiB buffer, read only, as generation streams the weights) divided
 * by the bytes a generated token reads: the weights and the cache.
 *
 * --batch-decode K1,K2,...: for each K, K sequences (each with --depth
 * tokens of context, at least 1) generate N tokens together, one batch of K
 * rows per step, as a serving engine's continuous batching does; the figure
 * is the aggregate rate, K * N tokens over the time of the N steps. */
#include "cli.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/os.h"
#include "base/rng.h"
#include "infer/shard_group.h"
#include "infer/stage.h"
#include "model/repack.h"
#include "tensor/membw.h"
#include "tensor/kv_types.h"
#include "tensor/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: racimo bench -m MODEL [-p 512] [-n 128] [-t N] [--reps 5] [-d DEPTH]\n"
        "                    [--batch-decode K[,K...]] [--shards N] [--json]\n"
        "\n"
        "  -p N          prompt tokens per prompt-processing run (0 skips)\n"
        "  -n N          tokens per generation run (0 skips)\n"
        "  -d, --depth N tokens already in the context before each run (default 0)\n"
        "  -t N          threads (default: physical cores)\n"
        "  -b N          prompt batch size (default: min(max(p, depth), 512))\n"
        "  --reps N      repetitions (default 5)\n"
        "  --batch-decode K[,K...]\n"
        "                also generate -n tokens with K sequences decoding together\n"
        "                (one K-row batch per step, 1 <= K <= 256), for each K listed;\n"
        "                reports aggregate tokens/s\n"
        "  --shards N    also generate with the model cut in N tensor-parallel shards\n"
        "                in this process, each with -t threads, summing through memory\n"
        "                (what N nodes would do over a link without latency): tg and\n"
        "                each --batch-decode K again\n"
        "  --exact       f32 activations (slow reference path)\n"
        "  --cache-type T  KV cache elements: f16 (default, as llama.cpp; f32 with\n"
        "                --exact), f32 (twice the memory and the bytes attention\n"
        "                reads) or q8_0 (a little over half of f16)\n"
        "  --json        one JSON object on stdout instead of the table\n");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct { double median, min, max; } spread;

static spread summarize(double *v, int n)
{
    spread s = { 0, 0, 0 };
    if (n <= 0)
        return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.min = v[0];
    s.max = v[n - 1];
    s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return s;
}

/* Feeds `n` tokens of sequence `seq` starting at `pos` in batches of
 * `batch`. */
static int feed(stage *s, int seq, const int32_t *tok, int n, int pos, int batch, int32_t *posbuf,
                int32_t *seqbuf, int8_t *want, float *logits)
{
    for (int start = 0; start < n; start += batch) {
        int len = n - start < batch ? n - start : batch;
        for (int i = 0; i < len; i++) {
            posbuf[i] = pos + start + i;
            seqbuf[i] = seq;
            want[i] = i == len - 1;        /* logits of the last row only */
        }
        stage_batch b = { .n_rows = len, .token = tok + start, .pos = posbuf, .seq = seqbuf,
                          .logits = want };
        if (stage_forward(s, &b, NULL, logits, NULL))
            return -1;
    }
    return 0;
}

/* The measure runs in a child process: its 512 MiB buffer would otherwise
 * count in this process's peak resident memory, which bench reports. */
enum { BW_BUFFER_MIB = 512 };
#define BW_BUFFER_BYTES ((size_t)BW_BUFFER_MIB << 20)

static double measure_bandwidth(int threads)
{
    int fds[2];
    double bw = 0.0;
    if (pipe(fds) != 0)
        return 0.0;
    pid_t pid = fork();
    if (pid == 0) {
        thread_pool *pool = pool_new(threads);
        double v = pool ? membw_read(pool, BW_BUFFER_BYTES, 5) : 0.0;
        pool_free(pool);
        ssize_t w = write(fds[1], &v, sizeof v);
        _exit(w == (ssize_t)sizeof v ? 0 : 1);
    }
    close(fds[1]);
    if (pid > 0) {
        if (read(fds[0], &bw, sizeof bw) != (ssize_t)sizeof bw)
            bw = 0.0;
        waitpid(pid, NULL, 0);
    }
    close(fds[0]);
    return bw;
}

enum { MAX_BATCH_DECODE = 256, MAX_BATCH_DECODE_LIST = 16 };

/* "4" or "1,2,4,8" into ks[]; the count, or -1 with a message. */
static int parse_batch_list(const char *s, long *ks)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        char item[24];
        size_t len = strcspn(p, ",");
        if (n == MAX_BATCH_DECODE_LIST || len == 0 || len >= sizeof item) {
            fprintf(stderr, "racimo: bench: --batch-decode takes 1 to %d comma-separated "
                    "counts, got '%s'\n", MAX_BATCH_DECODE_LIST, s);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (cli_parse_int(item, 1, MAX_BATCH_DECODE, &ks[n])) {
            fprintf(stderr, "racimo: bench: --batch-decode: '%s' is not a count of sequences "
                    "from 1 to %d\n", item, MAX_BATCH_DECODE);
            return -1;
        }
        n++;
        if (!p[len])
            return n;
        p += len + 1;
    }
}

/* K sequences, each after `depth` tokens of its own, generate n tokens
 * together: n batches of K rows (one per sequence, all wanting logits).
 * The aggregate rate, K * n over the seconds of the n steps, or a negative
 * value on error. */
static double batch_decode(stage *s, int K, const int32_t *tok, size_t n_tok, int depth, int n,
                           int batch, int32_t *posbuf, int32_t *seqbuf, int8_t *want,
                           float *logits)
{
    for (int j = 0; j < K; j++) {
        stage_seq_truncate(s, j, 0);
        if (depth && feed(s, j, tok, depth, 0, batch, posbuf, seqbuf, want, logits))
            return -1.0;
    }
    int32_t *step_tok = posbuf + K;       /* the caller sized posbuf for 2K */
    uint64_t a = os_now_ns();
    for (int k = 0; k < n; k++) {
        for (int j = 0; j < K; j++) {
            step_tok[j] = tok[((size_t)depth + (size_t)k + 7 * (size_t)j) % n_tok];
            posbuf[j] = depth + k;
            seqbuf[j] = j;
            want[j] = 1;
        }
        stage_batch b = { .n_rows = K, .token = step_tok, .pos = posbuf, .seq = seqbuf,
                          .logits = want };
        if (stage_forward(s, &b, NULL, logits, NULL))
            return -1.0;
    }
    return (double)K * n / ((double)(os_now_ns() - a) * 1e-9);
}

/* n decode steps of K sequences on a shard group from position 0: the
 * aggregate tokens/s, or a negative value on error. */
static double shards_decode(shard_group *g, int K, const int32_t *tok, size_t n_tok, int n,
                            int32_t *posbuf, int32_t *seqbuf, int8_t *want, float *logits)
{
    for (int j = 0; j < K; j++)
        shard_group_truncate(g, j, 0);
    int32_t *step_tok = posbuf + K;
    uint64_t a = os_now_ns();
    for (int k = 0; k < n; k++) {
        for (int j = 0; j < K; j++) {
            step_tok[j] = tok[((size_t)k + 7 * (size_t)j) % n_tok];
            posbuf[j] = k;
            seqbuf[j] = j;
            want[j] = 1;
        }
        stage_batch b = { .n_rows = K, .token = step_tok, .pos = posbuf, .seq = seqbuf,
                          .logits = want };
        if (shard_group_forward(g, &b, logits, NULL))
            return -1.0;
    }
    return (double)K * n / ((double)(os_now_ns() - a) * 1e-9);
}

int cmd_bench(int argc, char **argv)
{
    const char *path = NULL;
    long p = 512, n = 128, reps = 5, depth = 0, batch = 0, threads = cli_default_threads();
    long shards = 0;
    int json = 0, exact = 0, rc = 1, n_bd = 0, kv_type = -1;
    long bd[MAX_BATCH_DECODE_LIST], max_k = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long *num = NULL, lo = 0, hi = 1 << 20;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) { path = argv[++i]; continue; }
        else if (!strcmp(a, "--json")) { json = 1; continue; }
        else if (!strcmp(a, "--exact")) { exact = 1; continue; }
        else if (!strcmp(a, "--cache-type") && has) {
            if (cli_parse_cache_type("bench", argv[++i], &kv_type))
                return 2;
            continue;
        }
        else if (!strcmp(a, "--batch-decode") && has) {
            if ((n_bd = parse_batch_list(argv[++i], bd)) < 0) {
                usage(stderr);
                return 2;
            }
            continue;
        }
        else if (!strcmp(a, "-p")) num = &p;
        else if (!strcmp(a, "-n")) num = &n;
        else if (!strcmp(a, "-d") || !strcmp(a, "--depth")) num = &depth;
        else if (!strcmp(a, "-b")) { num = &batch; lo = 1; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { num = &threads; lo = 1; hi = 512; }
        else if (!strcmp(a, "--reps")) { num = &reps; lo = 1; hi = 1000; }
        else if (!strcmp(a, "--shards")) { num = &shards; lo = 2; hi = SHARD_GROUP_MAX; }
        if (!num || !has || cli_parse_int(argv[++i], lo, hi, num)) {
            fprintf(stderr, "racimo: bench: unknown, incomplete or invalid option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (!batch) {   /* prompts and the --depth fill go in batches of up to 512 */
        long longest = p > depth ? p : depth;
        batch = longest > 0 ? (longest < 512 ? longest : 512) : 1;
    }
    for (int i = 0; i < n_bd; i++)
        if (bd[i] > max_k)
            max_k = bd[i];
    /* one batch of the stage holds a prompt chunk or a decode step */
    long n_batch = batch > max_k ? batch : max_k;

    tensor_kernels_init();
    double bw = measure_bandwidth((int)threads);

    model *m = NULL;
    stage *s = NULL;
    int32_t *tok = NULL, *posbuf = NULL, *seqbuf = NULL;
    int8_t *want = NULL;
    float *logits = NULL;
    double *pp_rate = NULL, *tg_rate = NULL, *bd_rate = NULL;
    spread bd_spread[MAX_BATCH_DECODE_LIST];
    uint64_t t0 = os_now_ns();
    if (model_load(path, 0, -1, &m)) {
        rc = cli_error(NULL);
        goto done;
    }
    if (m->hp.pooling != POOL_NONE) {
        /* its last stage writes every row's hidden state, not logits */
        fprintf(stderr, "racimo: bench: %s is an embedding model (%s pooling): it makes no "
                "logits to generate from\n", path, model_pooling_name(m->hp.pooling));
        rc = 1;
        goto done;
    }
    /* Touch every weight page once so load time includes reading the file
     * and the first repetition is not a cold-cache outlier. */
    model_prefault(m, NULL, NULL);
    double load_s = (double)(os_now_ns() - t0) * 1e-9;
    int ctx = (int)(depth + (p > n ? p : n) + 1);
    kv_type = cli_cache_type(kv_type, exact);
    stage_params sp = { .n_ctx = ctx, .n_seq = (int)max_k, .n_batch = (int)n_batch,
                        .n_threads = (int)threads,
                        .precision = exact ? MATMUL_EXACT : MATMUL_FAST, .kv_type = kv_type };
    if (stage_new(m, &sp, &s)) {
        rc = cli_error(NULL);
        goto done;
    }
    const int V = m->hp.n_vocab;
    size_t n_tok = (size_t)(depth + (p > n ? p : n) + 1);
    tok = rc_mallocarray(n_tok, sizeof *tok);
    posbuf = rc_mallocarray(2 * (size_t)n_batch, sizeof *posbuf);
    seqbuf = rc_mallocarray((size_t)n_batch, sizeof *seqbuf);
    want = rc_mallocarray((size_t)n_batch, sizeof *want);
    logits = rc_mallocarray((size_t)V * (size_t)max_k, sizeof *logits);
    pp_rate = rc_calloc((size_t)reps, sizeof *pp_rate);
    tg_rate = rc_calloc((size_t)reps, sizeof *tg_rate);
    bd_rate = rc_calloc((size_t)reps, sizeof *bd_rate);
    if (!tok || !posbuf || !seqbuf || !want || !logits || !pp_rate || !tg_rate || !bd_rate) {
        fprintf(stderr, "racimo: bench: out of memory\n");
        goto done;
    }
    rng_state r;
    rng_seed(&r, 1234);
    for (size_t i = 0; i < n_tok; i++)
        tok[i] = (int32_t)(rng_next(&r) % (uint64_t)V);

    for (int rep = 0; rep < reps; rep++) {
        if (p > 0) {
            stage_seq_truncate(s, 0, 0);
            if (depth && feed(s, 0, tok, (int)depth, 0, (int)batch, posbuf, seqbuf, want, logits))
                goto fail;
            uint64_t a = os_now_ns();
            if (feed(s, 0, tok + depth, (int)p, (int)depth, (int)batch, posbuf, seqbuf, want, logits))
                goto fail;
            pp_rate[rep] = (double)p / ((double)(os_now_ns() - a) * 1e-9);
        }
        if (n > 0) {
            stage_seq_truncate(s, 0, 0);
            if (depth && feed(s, 0, tok, (int)depth, 0, (int)batch, posbuf, seqbuf, want, logits))
                goto fail;
            uint64_t a = os_now_ns();
            for (int k = 0; k < n; k++)
                if (feed(s, 0, tok + depth + k, 1, (int)depth + k, 1, posbuf, seqbuf, want, logits))
                    goto fail;
            tg_rate[rep] = (double)n / ((double)(os_now_ns() - a) * 1e-9);
        }
    }
    for (int i = 0; i < n_bd && n > 0; i++) {
        for (int rep = 0; rep < reps; rep++)
            if ((bd_rate[rep] = batch_decode(s, (int)bd[i], tok, n_tok, (int)depth, (int)n,
                                             (int)batch, posbuf, seqbuf, want, logits)) < 0)
                goto fail;
        bd_spread[i] = summarize(bd_rate, (int)reps);
    }
    /* the same generation on tensor-parallel shards: tg, then each K */
    spread sh_spread[MAX_BATCH_DECODE_LIST + 1];
    int n_sh = 0;
    if (shards > 1 && n > 0) {
        stage_params gp = sp;
        gp.n_ctx = (int)n + 1;
        shard_group *g = NULL;
        if (shard_group_new(path, (int)shards, &gp, false, &g))
            goto fail;
        for (int i = -1; i < n_bd; i++, n_sh++) {
            int K = i < 0 ? 1 : (int)bd[i];
            for (int rep = 0; rep < reps; rep++)
                if ((bd_rate[rep] = shards_decode(g, K, tok, n_tok, (int)n, posbuf, seqbuf, want,
                                                  logits)) < 0) {
                    shard_group_free(g);
                    goto fail;
                }
            sh_spread[n_sh] = summarize(bd_rate, (int)reps);
        }
        shard_group_free(g);
    }
    if (n <= 0)
        n_bd = 0;
    spread pp = summarize(pp_rate, p > 0 ? (int)reps : 0);
    spread tg = summarize(tg_rate, n > 0 ? (int)reps : 0);
    uint64_t per_tok = model_decode_bytes(m);
    /* generation also reads the cache: depth + n / 2 positions on average */
    const kv_cache *kv = stage_kv(s);
    uint64_t kv_tok = (uint64_t)kv->n_layer * (uint64_t)kv->n_head * (uint64_t)(kv->k_row + kv->v_row) *
                      (uint64_t)(depth + n / 2);
    double roof = bw > 0 ? bw / (double)(per_tok + kv_tok) : 0.0;
    double rss = (double)os_peak_rss_bytes();
    const gguf_file *f = m->file;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (json) {
        printf("{\"model\": \"%s\", \"model_bytes\": %llu, \"threads\": %ld, \"depth\": %ld, "
               "\"prompt_tokens\": %ld, \"gen_tokens\": %ld, \"reps\": %ld, "
               "\"pp_tokens_per_s\": %.3f, \"pp_tokens_per_s_min\": %.3f, \"pp_tokens_per_s_max\": %.3f, "
               "\"tg_tokens_per_s\": %.3f, \"tg_tokens_per_s_min\": %.3f, \"tg_tokens_per_s_max\": %.3f, "
               "\"load_s\": %.3f, \"peak_rss_bytes\": %.0f, \"kv_cache_bytes\": %zu, "
               "\"mem_bandwidth_bytes_per_s\": %.0f, \"weight_bytes_per_token\": %llu, "
               "\"kv_bytes_per_token\": %llu, \"kv_cache_type\": \"%s\", "
               "\"tg_roof_tokens_per_s\": %.3f, \"tg_fraction_of_roof\": %.4f, "
               "\"kernels\": \"%s\", \"repacked_matrices\": %d, \"repacked_bytes\": %llu",
               name, (unsigned long long)f->size_bytes, threads, depth, p, n, reps,
               pp.median, pp.min, pp.max, tg.median, tg.min, tg.max, load_s, rss,
               kv_cache_bytes(kv), bw, (unsigned long long)per_tok, (unsigned long long)kv_tok,
               kv_type_name(kv->type), roof,
               roof > 0 ? tg.median / roof : 0.0, tensor_kernels_name(), m->n_repacked,
               (unsigned long long)m->repacked_bytes);
        if (n_bd) {
            printf(", \"batch_decode\": [");
            for (int i = 0; i < n_bd; i++)
                printf("%s{\"sequences\": %ld, \"tokens_per_s\": %.3f, \"tokens_per_s_min\": %.3f, "
                       "\"tokens_per_s_max\": %.3f}", i ? ", " : "", bd[i], bd_spread[i].median,
                       bd_spread[i].min, bd_spread[i].max);
            printf("]");
        }
        if (n_sh) {
            printf(", \"shards\": %ld, \"shards_decode\": [", shards);
            for (int i = 0; i < n_sh; i++)
                printf("%s{\"sequences\": %ld, \"tokens_per_s\": %.3f, \"tokens_per_s_min\": %.3f, "
                       "\"tokens_per_s_max\": %.3f}", i ? ", " : "", i ? bd[i - 1] : 1L,
                       sh_spread[i].median, sh_spread[i].min, sh_spread[i].max);
            printf("]");
        }
        printf("}\n");
    } else {
        printf("model %s (%.1f MiB, %s, %d layers), %ld threads, depth %ld\n", name,
               (double)f->size_bytes / 1048576.0, m->hp.arch_name, m->hp.n_layer, threads, depth);
        if (m->n_repacked)
            printf("kernels %s; %d matrices (Q4_0, Q4_K, Q6_K, Q8_0) repacked at load (%.1f MiB; RACIMO_REPACK=0 "
                   "keeps them as in the file)\n", tensor_kernels_name(), m->n_repacked,
                   (double)m->repacked_bytes / 1048576.0);
        else
            printf("kernels %s; weights as in the file (%s)\n", tensor_kernels_name(),
                   model_repack_wanted() ? "no Q4_0, Q4_K, Q6_K or Q8_0 matrix to repack"
                                         : "RACIMO_REPACK=0, or kernels without a repacked layout");
        if (p > 0)
            printf("pp%-5ld %9.2f tokens/s  (min %.2f, max %.2f, %ld reps)\n", p, pp.median, pp.min,
                   pp.max, reps);
        if (n > 0)
            printf("tg%-5ld %9.2f tokens/s  (min %.2f, max %.2f, %ld reps)\n", n, tg.median, tg.min,
                   tg.max, reps);
        for (int i = 0; i < n_bd; i++)
            printf("tg%-5ld x%-3ld %9.2f tokens/s  (all sequences; min %.2f, max %.2f; %.2fx tg)\n",
                   n, bd[i], bd_spread[i].median, bd_spread[i].min, bd_spread[i].max,
                   tg.median > 0 ? bd_spread[i].median / tg.median : 0.0);
        for (int i = 0; i < n_sh; i++) {
            long K = i ? bd[i - 1] : 1;
            double one = i ? bd_spread[i - 1].median : tg.median;
            printf("tg%-5ld x%-3ld %9.2f tokens/s  on %ld shards x %ld threads (min %.2f, max %.2f; "
                   "%.2fx one stage)\n", n, K, sh_spread[i].median, shards, threads,
                   sh_spread[i].min, sh_spread[i].max, one > 0 ? sh_spread[i].median / one : 0.0);
        }
        printf("load %.2f s, peak resident %.1f MiB (KV cache %.1f MiB, %s)\n", load_s,
               rss / 1048576.0, (double)kv_cache_bytes(kv) / 1048576.0,
               kv_type_name(kv->type));
        printf("memory read bandwidth %.2f GB/s (%ld threads each streaming its slice of %d MiB, "
               "as generation streams the weights); %.1f MiB of weights + %.1f MiB of cache per "
               "token; roof %.2f tokens/s; generation at %.0f%% of roof\n", bw / 1e9, threads,
               BW_BUFFER_MIB, (double)per_tok / 1048576.0, (double)kv_tok / 1048576.0, roof,
               roof > 0 ? 100.0 * tg.median / roof : 0.0);
    }
    rc = 0;
    goto done;
fail:
    rc = cli_error("bench");
done:
    stage_free(s);
    model_free(m);
    rc_free(tok); rc_free(posbuf); rc_free(seqbuf); rc_free(want); rc_free(logits);
    rc_free(pp_rate); rc_free(tg_rate); rc_free(bd_rate);
    return rc;
}
