/* test_api_reasoning.c - thinking blocks: the splitter on whole answers and
 * on every way of cutting them into pieces (a stream must give the same
 * split, and never release a byte that a later piece turns into a marker),
 * and what a template's source says about thinking. */
#include "test.h"
#include "api/reasoning.h"
#include "base/mem.h"

typedef struct {
    int mode;
    const char *text, *reasoning, *content;
} split_case;

static const split_case cases[] = {
    { REASONING_AUTO, "<think>\nI think.\n</think>\n\nAnswer.", "I think.", "Answer." },
    { REASONING_AUTO, "  \n<think>x</think>y", "x", "y" },
    { REASONING_AUTO, "No thinking <think>x</think>", "", "No thinking <think>x</think>" },
    { REASONING_AUTO, "<thinking>aloud</thinking>", "", "<thinking>aloud</thinking>" },
    { REASONING_AUTO, "<think>a\n\n</think>b</think>c", "a", "b</think>c" },
    { REASONING_AUTO, "<think>", "", "" },
    { REASONING_AUTO, "<thi", "", "<thi" },
    { REASONING_AUTO, " \n", "", " \n" },
    { REASONING_AUTO, "", "", "" },
    { REASONING_AUTO, "<think>\n\n</think>\n\n", "", "" },
    { REASONING_OPEN, "\nreasoning here\n</think>\n\nThe answer", "reasoning here", "The answer" },
    { REASONING_OPEN, "all reasoning, cut at </thi", "all reasoning, cut at </thi", "" },
    { REASONING_OPEN, "a </b> c <\n</think>", "a </b> c <", "" },
    { REASONING_OPEN, "x</think>", "x", "" },
    { REASONING_OPEN, "  lines\n\n  inside\n\n", "lines\n\n  inside", "" },
    { REASONING_OPEN, "piensa… ñ</think> respuesta ✓", "piensa… ñ", "respuesta ✓" },
    { REASONING_OPEN, "<think>twice</think>ok", "<think>twice", "ok" },
    { REASONING_NONE, "<think>x</think>y", "", "<think>x</think>y" },
    { REASONING_NONE, "  plain", "", "  plain" },
};

/* Feeds text in pieces cut at a and b (0 <= a <= b <= len) and checks the
 * split; after every piece the reasoning and content so far must be
 * prefixes of the expected ones. */
static void run(const split_case *c, size_t a, size_t b)
{
    size_t len = strlen(c->text);
    size_t cuts[4] = { 0, a, b, len };
    reasoning_split r;
    strbuf rs = { 0 }, cs = { 0 };
    reasoning_init(&r, c->mode);
    for (int k = 0; k < 3; k++) {
        reasoning_push(&r, c->text + cuts[k], cuts[k + 1] - cuts[k], &rs, &cs);
        if (rs.len > strlen(c->reasoning) || memcmp(sb_cstr(&rs), c->reasoning, rs.len) ||
            cs.len > strlen(c->content) || memcmp(sb_cstr(&cs), c->content, cs.len))
            FAIL("'%s' cut at %zu,%zu: after piece %d reasoning '%s', content '%s'", c->text, a, b,
                 k, sb_cstr(&rs), sb_cstr(&cs));
    }
    reasoning_finish(&r, &rs, &cs);
    if (strcmp(sb_cstr(&rs), c->reasoning) || strcmp(sb_cstr(&cs), c->content))
        FAIL("'%s' cut at %zu,%zu: reasoning '%s' (want '%s'), content '%s' (want '%s')", c->text,
             a, b, sb_cstr(&rs), c->reasoning, sb_cstr(&cs), c->content);
    reasoning_free(&r);
    sb_free(&rs);
    sb_free(&cs);
}

TEST(api_reasoning_split)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = strlen(cases[i].text);
        for (size_t a = 0; a <= len; a++)
            for (size_t b = a; b <= len; b++)
                run(&cases[i], a, b);
    }
}

/* One byte at a time: what is released while the answer is still open. */
TEST(api_reasoning_holdback)
{
    reasoning_split r;
    strbuf rs = { 0 }, cs = { 0 };
    reasoning_init(&r, REASONING_OPEN);
    const char *t = "step one \n</thi";
    for (size_t i = 0; t[i]; i++)
        reasoning_push(&r, t + i, 1, &rs, &cs);
    CHECK_STR(sb_cstr(&rs), "step one");       /* the spaces and "</thi" are held */
    reasoning_push(&r, "s", 1, &rs, &cs);        /* not a marker after all */
    CHECK_STR(sb_cstr(&rs), "step one \n</this");
    CHECK_INT(cs.len, ==, 0);
    reasoning_free(&r);
    sb_free(&rs);
    reasoning_init(&r, REASONING_AUTO);
    sb_reset(&cs);
    reasoning_push(&r, "\n<thi", 5, &rs, &cs);
    CHECK_INT(cs.len, ==, 0);                    /* may still open a block */
    reasoning_push(&r, "s is", 4, &rs, &cs);
    CHECK_STR(sb_cstr(&cs), "\n<this is");
    reasoning_free(&r);
    sb_free(&rs);
    sb_free(&cs);
}

TEST(api_reasoning_prompt_tail)
{
    static const char *open[] = { "<｜User｜>hi<｜Assistant｜><think>\n", "<|im_start|>assistant\n<think>",
                                  "x<think> \n\n" };
    static const char *closed[] = { "<｜Assistant｜></think>", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                                    "<|im_start|>assistant\n", "", "think>" };
    for (size_t i = 0; i < 3; i++)
        if (!reasoning_prompt_open(open[i], strlen(open[i])))
            FAIL("'%s' should open a block", open[i]);
    for (size_t i = 0; i < 5; i++)
        if (reasoning_prompt_open(closed[i], strlen(closed[i])))
            FAIL("'%s' should not open a block", closed[i]);
}

static char *read_template(const char *name)
{
    const char *dir = test_golden_dir();
    if (!dir)
        return NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/%s.jinja", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        FAIL("cannot read %s", path);
    char *src = calloc(1, 1 << 16);
    size_t n = fread(src, 1, (1 << 16) - 1, f);
    fclose(f);
    src[n] = '\0';
    return src;
}

TEST(api_reasoning_template_facts)
{
    /* DeepSeek-V3.1 reads `thinking`, falling back to enable_thinking */
    const char *v31 = "{%- if not thinking is defined -%}{%- if enable_thinking is defined -%}"
                      "{%- set thinking = enable_thinking -%}{%- endif -%}{%- endif -%}"
                      "{%- if not thinking -%}{{'</think>'}}{%- else -%}{{'<think>'}}{%- endif -%}";
    CHECK(reasoning_template_thinks(v31));
    CHECK_INT(reasoning_template_switches(v31), ==, REASONING_VAR_THINKING | REASONING_VAR_ENABLE_THINKING);
    CHECK(!reasoning_template_thinks("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"));
    CHECK(!reasoning_template_thinks(NULL));
    CHECK_INT(reasoning_template_switches("{% if rethinking_mode %}x{% endif %}"), ==, 0);
    json_t *vars = NULL;
    CHECK_INT(reasoning_set_switches(0, true, &vars), ==, 0);
    CHECK(vars == NULL);
    CHECK_INT(reasoning_set_switches(REASONING_VAR_THINKING | REASONING_VAR_ENABLE_THINKING, false, &vars), ==, 0);
    CHECK(json_is_false(json_object_get(vars, "thinking")));
    CHECK(json_is_false(json_object_get(vars, "enable_thinking")));
    json_decref(vars);
    char *qwen3 = read_template("Qwen-Qwen3");
    if (!qwen3)
        SKIP("../shared/golden is absent: the published Qwen3 and DeepSeek-R1 templates were not checked");
    CHECK(reasoning_template_thinks(qwen3));
    CHECK_INT(reasoning_template_switches(qwen3), ==, REASONING_VAR_ENABLE_THINKING);
    free(qwen3);
    char *r1 = read_template("llama-cpp-deepseek-r1");
    CHECK(reasoning_template_thinks(r1));
    CHECK_INT(reasoning_template_switches(r1), ==, 0);
    free(r1);
    char *llama = read_template("meta-llama-Llama-3.1-8B-Instruct");
    CHECK(!reasoning_template_thinks(llama));
    free(llama);
}
