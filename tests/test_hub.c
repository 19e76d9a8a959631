/* test_hub.c - the parts of `racimo pull` that need no network: Hugging
 * Face names and the choice of files in a tree listing (the transfers are
 * tested against a fake Hub in tests/e2e/pull.test.mjs). */
#include "test.h"
#include "base/err.h"
#include "hub/hub.h"
#include "model/gguf.h"

TEST(hub_parse_names)
{
    static const struct { const char *in, *repo, *quant; } ok[] = {
        { "hf.co/org/repo", "org/repo", "" },
        { "hf.co/org/repo:Q4_K_M", "org/repo", "Q4_K_M" },
        { "huggingface.co/org/Re.po-GGUF:q8_0", "org/Re.po-GGUF", "q8_0" },
        { "https://huggingface.co/org/repo", "org/repo", "" },
        { "org/repo:latest", "org/repo", "" },
        { "HF.CO/org/repo:IQ4_XS", "org/repo", "IQ4_XS" },
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        hub_ref r;
        CHECK_OK(hub_parse_ref(ok[i].in, &r));
        CHECK_STR(r.repo, ok[i].repo);
        CHECK_STR(r.quant, ok[i].quant);
    }
    static const char *bad[] = { "", "llama3", "hf.co/org", "org/", "/repo", "org/a/b",
                                 "org/repo:", "org/re po", "org/repo:Q4 K", "hf.co/org/repo:a/b" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hub_ref r;
        if (hub_parse_ref(bad[i], &r) != RC_EINVAL)
            FAIL("'%s' was accepted", bad[i]);
    }
}

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define ENTRY(p, n) "{\"type\":\"file\",\"path\":\"" p "\",\"size\":" #n \
                    ",\"lfs\":{\"oid\":\"" SHA "\",\"size\":" #n "}}"

static const char *tree =
    "[{\"type\":\"file\",\"path\":\"README.md\",\"size\":10},"
    "{\"type\":\"directory\",\"path\":\"big\",\"size\":0},"
    ENTRY("m-Q4_K.gguf", 10) "," ENTRY("m-Q4_K_M.gguf", 11) "," ENTRY("mmproj-m-Q8_0.gguf", 3) ","
    ENTRY("m.Q8_0.gguf", 12) ","
    ENTRY("big/m-F16-00002-of-00002.gguf", 20) "," ENTRY("big/m-F16-00001-of-00002.gguf", 21) "]";

static void pick(const char *tag, const char *file, int n, const char *first, uint64_t total)
{
    hub_ref r;
    hub_plan p;
    char name[80];
    snprintf(name, sizeof name, "org/m%s%s", tag ? ":" : "", tag ? tag : "");
    CHECK_OK(hub_parse_ref(name, &r));
    CHECK_OK(hub_pick(tree, &r, file, &p));
    CHECK_INT(p.n_files, ==, n);
    CHECK_STR(p.files[0].name, first);
    CHECK_STR(p.files[0].sha256, SHA);
    CHECK_INT(p.total_bytes, ==, total);
    CHECK_STR(p.repo, "org/m");
}

TEST(hub_pick_files)
{
    pick(NULL, NULL, 1, "m-Q4_K_M.gguf", 11);          /* the default tag */
    pick("q4_k", NULL, 1, "m-Q4_K.gguf", 10);           /* a whole word, any case */
    pick("Q8_0", NULL, 1, "m.Q8_0.gguf", 12);           /* never the projector */
    pick("F16", NULL, 2, "m-F16-00001-of-00002.gguf", 41);   /* parts in order */
    pick(NULL, "m-F16-00002-of-00002.gguf", 2, "m-F16-00001-of-00002.gguf", 41);
    pick(NULL, "big/m-F16-00001-of-00002.gguf", 2, "m-F16-00001-of-00002.gguf", 41);
    hub_ref r;
    hub_plan p;
    CHECK_OK(hub_parse_ref("org/m:Q5_K_M", &r));
    CHECK_INT(hub_pick(tree, &r, NULL, &p), ==, RC_ENOTFOUND);
    CHECK(strstr(rc_errmsg(), "no GGUF file tagged Q5_K_M"));
    CHECK(strstr(rc_errmsg(), "m-Q4_K_M.gguf"));
    CHECK(!strstr(rc_errmsg(), "00002-of"));            /* a split model listed once */
    char name[HUB_PATH_MAX];
    CHECK_OK(hub_parse_ref("org/m:F16", &r));
    CHECK_OK(hub_pick(tree, &r, NULL, &p));
    hub_config cfg;
    hub_config_default(&cfg);
    hub_model_name(&cfg, &p, name, sizeof name);
    CHECK_STR(name, "m-F16");                   /* the parts as they are: a set */
    CHECK_STR(p.set_name, "m-F16.gguf");
    cfg.join = gguf_join;
    hub_model_name(&cfg, &p, name, sizeof name);
    CHECK_STR(name, "m-F16");                   /* joined */
    CHECK_OK(hub_parse_ref("org/m:Q8_0", &r));
    CHECK_OK(hub_pick(tree, &r, NULL, &p));
    CHECK_STR(p.set_name, "m.Q8_0.gguf");
}

TEST(hub_pick_hostile_listings)
{
    hub_ref r;
    hub_plan p;
    CHECK_OK(hub_parse_ref("org/m", &r));
    static const char *bad[] = {
        "{}", "[", "not json",
        /* a part is missing */
        "[" ENTRY("a-00001-of-00003.gguf", 1) "," ENTRY("a-00003-of-00003.gguf", 1) "]",
        /* names racimo must not write */
        "[" ENTRY("x/.hidden-Q4_K_M.gguf", 1) "]",
        /* no size, a short sha256 */
        "[{\"type\":\"file\",\"path\":\"a-Q4_K_M.gguf\"}]",
        "[{\"type\":\"file\",\"path\":\"a-Q4_K_M.gguf\",\"size\":1,\"lfs\":{\"oid\":\"abc\",\"size\":1}}]",
        /* two models, none Q4_K_M */
        "[" ENTRY("a-Q8_0.gguf", 1) "," ENTRY("a-Q6_K.gguf", 1) "]",
        /* a split model without a name */
        "[" ENTRY("x/-00001-of-00002.gguf", 1) "," ENTRY("x/-00002-of-00002.gguf", 1) "]",
        /* two parts with the same base name in two folders */
        "[" ENTRY("x/a-00001-of-00002.gguf", 1) "," ENTRY("y/a-00002-of-00002.gguf", 1) "]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (hub_pick(bad[i], &r, NULL, &p) == 0)
            FAIL("listing %zu accepted: %s", i, bad[i]);
    CHECK_INT(p.n_files, ==, 0);
}
