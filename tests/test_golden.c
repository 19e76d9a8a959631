/* test_golden.c - the engine against llama.cpp's logits for the tiny
 * random-weight models in ../shared/golden/logits (README there gives the
 * pass criteria, numbered as here).
 *
 * Teacher-forced: the 32 prompt ids as one batch (positions 0..31), then each
 * of the 32 decode ids alone at 32+k; 64 rows of logits are compared.
 *   1. exact math (weights decoded to f32, f32 activations) against
 *      .exact.f32 (.f32 for the F32 file): max |d| <= 1e-3, argmax on rows
 *      whose reference gap >= 2e-3, free-running greedy equal to
 *      exact_greedy_decode_ids, and the 16+16 prompt split within 1e-3;
 *   2. fast kernels (quantised activations) against .exact.f32: max and rms
 *      within 1.5x llama.cpp's own native-vs-exact deviation (floor 1e-3),
 *      argmax on rows whose gap exceeds 2x that max;
 *   4. free-running greedy of the fast path: F32/F16/BF16 equal decode_ids,
 *      Q8_0 equal decode_ids or exact_greedy_decode_ids.
 * Every file is checked and every failure printed before the test fails. */
#include "test.h"
#include "model_util.h"
#include "base/err.h"
#include "tensor/types.h"

#include <dirent.h>
#include <jansson.h>

#define ROWS 64
#define NP 32

typedef struct {
    char name[128];
    char gguf[2400], ref_path[2400], exact_path[2400];
    const char *dtype;
    int prompt[NP], decode[NP], exact_greedy[NP];
    double native_vs_exact_max, native_vs_exact_rms;
    json_t *root;
} golden_case;

static int read_ids(json_t *root, const char *key, int *out)
{
    json_t *a = json_object_get(root, key);
    if (!json_is_array(a) || json_array_size(a) != NP)
        return -1;
    for (int i = 0; i < NP; i++)
        out[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return 0;
}

static float *read_f32(const char *path, int V)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    float *d = malloc(sizeof(float) * ROWS * V);
    size_t got = fread(d, sizeof(float), (size_t)ROWS * V, f);
    fclose(f);
    if (got != (size_t)ROWS * V) {
        free(d);
        return NULL;
    }
    return d;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the cases; skips the test when the golden folder is absent. */
static int load_cases(golden_case **out)
{
    const char *g = test_golden_dir();
    if (!g)
        SKIP("golden data not found (../shared/golden or $RACIMO_GOLDEN)");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/logits", g);
    DIR *d = opendir(dir);
    if (!d)
        SKIP("no %s folder", dir);
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".json"))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    golden_case *cs = calloc((size_t)n, sizeof *cs);
    for (int i = 0; i < n; i++) {
        golden_case *c = &cs[i];
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        json_error_t err;
        c->root = json_load_file(path, 0, &err);
        if (!c->root)
            FAIL("%s: %s (line %d)", path, err.text, err.line);
        snprintf(c->name, sizeof c->name, "%.*s", (int)strlen(names[i]) - 5, names[i]);
        c->dtype = json_string_value(json_object_get(c->root, "dtype"));
        snprintf(c->gguf, sizeof c->gguf, "%s/%s", dir,
                 json_string_value(json_object_get(c->root, "file")));
        snprintf(c->ref_path, sizeof c->ref_path, "%s/%s", dir,
                 json_string_value(json_object_get(c->root, "logits_file")));
        json_t *ex = json_object_get(c->root, "exact_logits_file");
        snprintf(c->exact_path, sizeof c->exact_path, "%s/%s", dir,
                 json_is_string(ex) ? json_string_value(ex)
                                    : json_string_value(json_object_get(c->root, "logits_file")));
        if (read_ids(c->root, "prompt_ids", c->prompt) || read_ids(c->root, "decode_ids", c->decode) ||
            read_ids(c->root, "exact_greedy_decode_ids", c->exact_greedy))
            FAIL("%s: missing id lists", path);
        json_t *nve = json_object_get(json_object_get(c->root, "stats"), "native_vs_exact");
        c->native_vs_exact_max = json_number_value(json_object_get(nve, "max_abs"));
        c->native_vs_exact_rms = json_number_value(json_object_get(nve, "rms"));
        free(names[i]);
    }
    *out = cs;
    return n;
}

static void free_cases(golden_case *cs, int n)
{
    for (int i = 0; i < n; i++)
        json_decref(cs[i].root);
    free(cs);
}

/* 64 teacher-forced rows: prompt in chunks of `chunk`, then decode ids. */
static void teacher_forced(stage *s, const golden_case *c, int chunk, float *out)
{
    const int V = stage_model(s)->hp.n_vocab;
    test_run_tokens(s, c->prompt, NP, 0, 0, chunk, out);
    test_run_tokens(s, c->decode, NP, 0, NP, 1, out + (size_t)NP * V);
}


static double top_gap(const float *x, int n)
{
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) { b = a; a = x[i]; }
        else if (x[i] > b) b = x[i];
    }
    return (double)a - b;
}

/* Free-running greedy: prompt, then feed back the argmax 32 times. */
static void greedy(stage *s, const golden_case *c, int *ids)
{
    const int V = stage_model(s)->hp.n_vocab;
    float *row = malloc(sizeof(float) * NP * V);
    test_run_tokens(s, c->prompt, NP, 0, 0, NP, row);
    int next = test_argmax(row + (size_t)(NP - 1) * V, V);
    for (int k = 0; k < NP; k++) {
        ids[k] = next;
        int32_t t = next;
        test_run_tokens(s, &t, 1, 0, NP + k, 1, row);
        next = test_argmax(row, V);
    }
    free(row);
}

typedef struct { double max_abs, rms; int bad_argmax; } diff_stats;

static diff_stats diff(const float *got, const float *ref, int V, double gap_min)
{
    diff_stats d = { 0, 0, 0 };
    double sq = 0;
    for (int r = 0; r < ROWS; r++) {
        const float *g = got + (size_t)r * V, *w = ref + (size_t)r * V;
        for (int t = 0; t < V; t++) {
            double e = fabs((double)g[t] - w[t]);
            if (e > d.max_abs) d.max_abs = e;
            sq += e * e;
        }
        if (top_gap(w, V) >= gap_min && test_argmax(g, V) != test_argmax(w, V))
            d.bad_argmax++;
    }
    d.rms = sqrt(sq / ((double)ROWS * V));
    return d;
}

static void run_golden(int precision)
{
    golden_case *cs;
    int n = load_cases(&cs), failures = 0;
    CHECK_INT(n, >=, 1);
    for (int i = 0; i < n; i++) {
        golden_case *c = &cs[i];
        model *m;
        stage *s, *s2;
        test_open_stage(c->gguf, 0, -1, precision, 128, 1, NP, 2, &m, &s);
        const int V = m->hp.n_vocab;
        float *exact = read_f32(c->exact_path, V);
        if (!exact)
            FAIL("%s: cannot read %s", c->name, c->exact_path);
        float *got = malloc(sizeof(float) * ROWS * V), *split = malloc(sizeof(float) * ROWS * V);
        teacher_forced(s, c, NP, got);
        int ok = 1, ids[NP];
        if (precision == MATMUL_EXACT) {
            diff_stats d = diff(got, exact, V, 2e-3);
            stage_seq_truncate(s, 0, 0);
            teacher_forced(s, c, 16, split);
            diff_stats ds = diff(split, got, V, INFINITY);
            stage_params sp = { .n_ctx = 128, .n_seq = 1, .n_batch = NP, .n_threads = 2, .precision = precision, .kv_type = TT_F32 };
            CHECK_OK(stage_new(m, &sp, &s2));
            greedy(s2, c, ids);
            stage_free(s2);
            int greedy_ok = !memcmp(ids, c->exact_greedy, sizeof ids);
            ok = d.max_abs <= 1e-3 && !d.bad_argmax && ds.max_abs <= 1e-3 && greedy_ok;
            fprintf(stderr, "  %-4s %-18s exact: max %.2e rms %.2e argmax-miss %d split %.1e greedy %s\n",
                    ok ? "ok" : "FAIL", c->name, d.max_abs, d.rms, d.bad_argmax, ds.max_abs,
                    greedy_ok ? "same" : "DIFFERENT");
        } else {
            double lim_max = fmax(1.5 * c->native_vs_exact_max, 1e-3);
            double lim_rms = fmax(1.5 * c->native_vs_exact_rms, 1e-3);
            diff_stats d = diff(got, exact, V, 2 * c->native_vs_exact_max);
            float *native = read_f32(c->ref_path, V);
            diff_stats dn = diff(got, native, V, INFINITY);
            free(native);
            stage_params sp = { .n_ctx = 128, .n_seq = 1, .n_batch = NP, .n_threads = 2, .precision = precision, .kv_type = TT_F32 };
            CHECK_OK(stage_new(m, &sp, &s2));
            greedy(s2, c, ids);
            stage_free(s2);
            const char *greedy_word = "informative";
            int greedy_ok = 1;
            if (!strcmp(c->dtype, "F32") || !strcmp(c->dtype, "F16") || !strcmp(c->dtype, "BF16")) {
                greedy_ok = !memcmp(ids, c->decode, sizeof ids);
                greedy_word = greedy_ok ? "same" : "DIFFERENT";
            } else if (!strcmp(c->dtype, "Q8_0")) {
                greedy_ok = !memcmp(ids, c->decode, sizeof ids) || !memcmp(ids, c->exact_greedy, sizeof ids);
                greedy_word = greedy_ok ? "same" : "DIFFERENT";
            }
            ok = d.max_abs <= lim_max && d.rms <= lim_rms && !d.bad_argmax && greedy_ok;
            fprintf(stderr, "  %-4s %-18s fast: max %.3f (<= %.3f) rms %.4f (<= %.4f) argmax-miss %d "
                    "vs-native max %.3f greedy %s\n", ok ? "ok" : "FAIL", c->name, d.max_abs, lim_max,
                    d.rms, lim_rms, d.bad_argmax, dn.max_abs, greedy_word);
        }
        failures += !ok;
        free(exact); free(got); free(split);
        stage_free(s);
        model_free(m);
    }
    free_cases(cs, n);
    if (failures)
        FAIL("%d of %d golden models out of tolerance", failures, n);
}

TEST_T(golden_logits_exact, 300) { run_golden(MATMUL_EXACT); }
TEST_T(golden_logits_fast, 300)  { run_golden(MATMUL_FAST); }
