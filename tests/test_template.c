/* test_template.c - chat templates against Python jinja2's renderings in
 * ../shared/golden/templates (README there: HF's apply_chat_template
 * settings, one case per template x conversation x add_generation_prompt).
 *
 * Every case is rendered through chat_template_render and must match
 * `expected` byte for byte, or fail with a message containing
 * `expected_error`.  All cases run; each failure is printed (template,
 * conversation, first differing byte with context) and the test fails at
 * the end if any did.  Skipped when the golden folder is absent. */
#include "test.h"
#include "base/err.h"
#include "base/mem.h"
#include "text/chat_template.h"

#include <jansson.h>

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[8192];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!buf)
        buf = calloc(1, 1);
    else
        buf[len] = '\0';
    return buf;
}

/* Prints `s` around byte `at` with control characters escaped. */
static void print_context(const char *label, const char *s, size_t at)
{
    size_t len = strlen(s), from = at > 60 ? at - 60 : 0, to = at + 60 < len ? at + 60 : len;
    fprintf(stderr, "      %s: \"", label);
    for (size_t i = from; i < to; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == at)
            fputs("\xe2\x9f\xa6", stderr);  /* a marker at the first difference */
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fprintf(stderr, "\"%s\n", to < len ? "..." : "");
}

TEST(template_golden)
{
    const char *golden = test_golden_dir();
    if (!golden)
        SKIP("no golden directory");
    char dir[1200], path[1500];
    snprintf(dir, sizeof dir, "%s/templates", golden);
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        SKIP("%s: %s", path, jerr.text);
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_is_array(cases) && json_array_size(cases) > 0);

    size_t i, n_pass = 0, n_fail = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *tname = json_string_value(json_object_get(c, "template"));
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        const char *expected = json_string_value(json_object_get(c, "expected"));
        const char *expected_err = json_string_value(json_object_get(c, "expected_error"));
        json_t *tools = json_object_get(c, "tools");
        bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        if (!tname || !conv || (!expected && !expected_err)) {
            fprintf(stderr, "  case %zu: malformed\n", i);
            n_fail++;
            continue;
        }
        snprintf(path, sizeof path, "%s/%s.jinja", dir, tname);
        char *src = read_file(path);
        if (!src) {
            fprintf(stderr, "  case %zu: cannot read %s\n", i, path);
            n_fail++;
            continue;
        }
        char *out = NULL;
        int rc = chat_template_render(src, json_object_get(c, "messages"),
                                      json_is_null(tools) ? NULL : tools, agp,
                                      json_string_value(json_object_get(c, "bos_token")),
                                      json_string_value(json_object_get(c, "eos_token")),
                                      NULL, &out);
        bool ok;
        if (expected)
            ok = rc == 0 && strcmp(out, expected) == 0;
        else
            ok = rc < 0 && strstr(rc_errmsg(), expected_err) != NULL;
        if (ok) {
            n_pass++;
        } else {
            n_fail++;
            fprintf(stderr, "  FAIL %s / %s (add_generation_prompt=%s)\n", tname, conv,
                    agp ? "true" : "false");
            if (expected_err && rc == 0)
                fprintf(stderr, "      rendered, but expected error \"%s\"\n", expected_err);
            else if (expected_err)
                fprintf(stderr, "      error \"%s\"\n      expected error containing \"%s\"\n",
                        rc_errmsg(), expected_err);
            else if (rc < 0)
                fprintf(stderr, "      error %d: %s\n", rc, rc_errmsg());
            else {
                size_t at = 0;
                while (out[at] && out[at] == expected[at])
                    at++;
                fprintf(stderr, "      first difference at byte %zu (got %zu bytes, expected %zu)\n",
                        at, strlen(out), strlen(expected));
                print_context("got     ", out, at);
                print_context("expected", expected, at);
            }
        }
        rc_free(out);
        free(src);
    }
    fprintf(stderr, "  template golden: %zu of %zu cases pass\n", n_pass, n_pass + n_fail);
    json_decref(root);
    CHECK_INT(n_fail, ==, 0);
}
