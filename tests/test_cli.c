/* test_cli.c - the racimo command end to end: real processes on a model
 * made by the project's writer.  `chat` is driven through a pseudo terminal
 * (forkpty) the way a person types: lines, Ctrl-C during an answer, Ctrl-D.
 * The binary comes from $RACIMO_BIN (set by the Makefile). */
#include "test.h"
#include "cli_util.h"
#include "model_util.h"
#include "tensor/types.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#if defined(__APPLE__)
#include <util.h>
#else
#include <pty.h>
#endif
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>



TEST(cli_run_streams_and_reports)
{
    const char *mpath = test_make_model("tiny", TT_Q8_0, NULL);
    char cmd[16384], out[65536];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'the quick brown fox' -n 12 --temp 0 -t 1", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(strstr(out, "generation: 12 tokens") != NULL);
    CHECK(strstr(out, "prompt: ") != NULL && strstr(out, "tokens/s") != NULL);
    /* greedy is reproducible */
    char out2[65536];
    CHECK_INT(test_run(cmd, out2, sizeof out2), ==, 0);
    CHECK(!strncmp(out, out2, (size_t)(strstr(out, "\nprompt:") - out)));
    /* a seeded sample too */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'hello' -n 8 --temp 1 --seed 42 -t 1", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK_INT(test_run(cmd, out2, sizeof out2), ==, 0);
    CHECK(!strncmp(out, out2, (size_t)(strstr(out, "\nprompt:") - out)));
    CHECK(strstr(out, "seed 42") != NULL);
}

/* --grammar-file: the answer matches the grammar and stops where it must
 * end; a grammar that does not compile is told before the model loads. */
TEST(cli_run_grammar_file)
{
    const char *mpath = test_make_model("tiny", TT_Q8_0, NULL);
    char g[600], cmd[16384], out[65536];
    snprintf(g, sizeof g, "%s/list.gbnf", test_tmpdir());
    FILE *f = fopen(g, "w");
    CHECK(f);
    fputs("root ::= \"<\" [a-c]{2} \">\"   # two letters in brackets\n", f);
    fclose(f);
    for (int temp = 0; temp < 2; temp++) {
        snprintf(cmd, sizeof cmd, "%s run -m %s -p 'the quick brown fox' -n 30 --temp %d --seed 9 -t 1 "
                 "--grammar-file %s", test_bin(), mpath, temp, g);
        CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
        if (!(out[0] == '<' && out[1] >= 'a' && out[1] <= 'c' && out[2] >= 'a' && out[2] <= 'c' &&
              out[3] == '>' && out[4] == '\n'))
            FAIL("output: %s", out);
        CHECK(strstr(out, "(stop, seed") != NULL);
    }
    f = fopen(g, "w");
    CHECK(f);
    fputs("root ::= \"a\"\n  | [b-\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run -m /nonexistent.gguf -p hi --grammar-file %s", test_bin(), g);
    CHECK(test_run(cmd, out, sizeof out) != 0);
    if (!strstr(out, "list.gbnf: grammar line 2"))
        FAIL("output: %s", out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi --grammar-file /nonexistent.gbnf", test_bin(), mpath);
    CHECK(test_run(cmd, out, sizeof out) != 0);
    CHECK(strstr(out, "cannot read the grammar file /nonexistent.gbnf") != NULL);
}

TEST(cli_errors_are_one_line)
{
    const char *mpath = test_make_model("tiny", TT_F32, NULL);
    char cmd[16384], out[8192];
    struct { const char *args; const char *want; } cases[] = {
        { "run -m /nonexistent.gguf -p hi", "/nonexistent.gguf: cannot open" },
        { "run -m /etc/hostname -p hi", "magic" },
        { "run -m MODEL -p hi -c 8 -f /nonexistent", "cannot read prompt file" },
        { "run -m MODEL -f /etc/services -c 64", "context" },
        { "run -m MODEL -p hi --temp abc", "--temp wants a number" },
        { "tokenize -m MODEL", "usage" },
        { "frobnicate", "unknown command" },
        { "nodes remove", "missing value: 'remove'" },
        { "token --rotate --host 127.0.0.1 --port 9", "nothing answers there" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[4096];
        const char *m = strstr(cases[i].args, "MODEL");
        if (m)
            snprintf(args, sizeof args, "%.*s%s%s", (int)(m - cases[i].args), cases[i].args, mpath, m + 5);
        else
            snprintf(args, sizeof args, "%s", cases[i].args);
        snprintf(cmd, sizeof cmd, "%s %s", test_bin(), args);
        int st = test_run(cmd, out, sizeof out);
        if (st == 0 || !strstr(out, cases[i].want))
            FAIL("'%s': status %d, output '%s' lacks '%s'", args, st, out, cases[i].want);
    }
}

TEST(cli_tokenize_roundtrip)
{
    const char *mpath = test_make_model("tiny", TT_F32, NULL);
    char cmd[16384], out[8192], ids[4096];
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --json 'the end, señor'", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(out[0] == '[');
    snprintf(ids, sizeof ids, "%.4000s", out);
    ids[strcspn(ids, "\n")] = '\0';
    snprintf(cmd, sizeof cmd, "%s detokenize -m %s '%s'", test_bin(), mpath, ids);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(strstr(out, "the end, señor") != NULL);
    /* special tokens only with --special */
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --no-bos --special '<|eot_id|>'", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK_STR(out, "511\n");
}

TEST(cli_template_prints_prompt)
{
    const char *mpath = test_make_model("tiny", TT_F32, NULL);
    char path[1024], cmd[2048], out[8192];
    snprintf(path, sizeof path, "%s/messages.json", test_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hola\"}]", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s template -m %s --messages %s", test_bin(), mpath, path);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK_STR(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHola<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n");
    snprintf(cmd, sizeof cmd, "%s template -m %s --messages %s --no-generation-prompt", test_bin(), mpath, path);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK(strstr(out, "assistant") == NULL);
    /* --chat-template-file overrides the model's */
    char tpl[512];
    snprintf(tpl, sizeof tpl, "%s/t.jinja", test_tmpdir());
    f = fopen(tpl, "w");
    fputs("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s template -m %s --messages %s --chat-template-file %s", test_bin(), mpath, path, tpl);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    CHECK_STR(out, "[system] Be brief.\n[user] Hola\n");
}

/* ---- chat through a pseudo terminal ---- */

typedef struct { int fd; char buf[1 << 16]; size_t len; } term;

/* Reads until `want` appears in what was read since `from`, or timeout. */
static int expect(term *t, size_t from, const char *want, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 50) {
        t->buf[t->len] = '\0';
        if (strstr(t->buf + from, want))
            return 1;
        struct pollfd p = { t->fd, POLLIN, 0 };
        if (poll(&p, 1, 50) > 0) {
            ssize_t n = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
            if (n > 0)
                t->len += (size_t)n;
            else if (n <= 0 && errno != EINTR && errno != EAGAIN) {
                usleep(50 * 1000);       /* the other side closed: wait, not spin */
                return 0;
            }
        }
        if (t->len > sizeof t->buf - 4096) {   /* keep the tail */
            size_t shift = t->len / 2;
            memmove(t->buf, t->buf + shift, t->len - shift);
            t->len -= shift;
            from = from > shift ? from - shift : 0;
        }
    }
    t->buf[t->len] = '\0';
    return strstr(t->buf + from, want) != NULL;
}

TEST_T(cli_chat_in_a_terminal, 120)
{
    const char *mpath = test_make_model("tiny", TT_Q8_0, NULL);
    const char *b = test_bin();
    term t = { 0 };
    pid_t pid = forkpty(&t.fd, NULL, NULL, NULL);
    CHECK(pid >= 0);
    if (pid == 0) {
        execl(b, b, "chat", "-m", mpath, "--system", "You are terse.", "--temp", "0",
              "-t", "1", "-c", "2048", (char *)NULL);
        _exit(127);
    }
    if (!expect(&t, 0, "> ", 20000))
        FAIL("no prompt; terminal shows: %s", t.buf);
    /* turn 1: a short answer (-n is not set: the model runs until it is
     * stopped, so stop it with Ctrl-C once text arrives) */
    size_t mark = t.len;
    CHECK(write(t.fd, "hello there\r", 12) == 12);
    if (!expect(&t, mark, "hello there\r\n", 5000))
        FAIL("input not echoed: %s", t.buf + mark);
    size_t answer = t.len;
    for (int i = 0; i < 200 && t.len < answer + 64; i++)   /* the answer streams */
        expect(&t, answer, "\x01\x02never", 50);
    CHECK(t.len >= answer + 64);
    CHECK(write(t.fd, "\x03", 1) == 1);            /* Ctrl-C: stop the answer */
    if (!expect(&t, mark, "(stopped)", 20000))
        FAIL("Ctrl-C did not stop the answer: %s", t.buf + mark);
    if (!expect(&t, mark, "generation: ", 5000))
        FAIL("no timings: %s", t.buf + mark);
    if (!expect(&t, mark, "\n> ", 5000))
        FAIL("no prompt after the stopped answer: %s", t.buf + mark);
    /* turn 2: the conversation so far is reused from the KV cache */
    mark = t.len;
    CHECK(write(t.fd, "and again\r", 10) == 10);
    if (!expect(&t, mark, "and again\r\n", 5000))
        FAIL("input not echoed: %s", t.buf + mark);
    answer = t.len;
    for (int i = 0; i < 200 && t.len < answer + 64; i++)
        expect(&t, answer, "\x01\x02never", 50);
    CHECK(t.len >= answer + 64);
    CHECK(write(t.fd, "\x03", 1) == 1);
    if (!expect(&t, mark, "reused)", 20000))
        FAIL("no timings on turn 2: %s", t.buf + mark);
    char *p = strstr(t.buf + mark, "prompt: ");
    CHECK(p != NULL);
    int n_prompt = 0, n_reused = 0;
    CHECK(sscanf(p, "prompt: %d tokens (%d reused)", &n_prompt, &n_reused) == 2);
    if (!(n_reused > 10 && n_reused < n_prompt))
        FAIL("turn 2 reused %d of %d prompt tokens", n_reused, n_prompt);
    /* Ctrl-C at the prompt does not quit; Ctrl-D does */
    if (!expect(&t, p - t.buf, "\n> ", 5000))
        FAIL("no prompt after turn 2: %s", p);
    mark = t.len;
    CHECK(write(t.fd, "\x03", 1) == 1);
    if (!expect(&t, mark, "Ctrl-D or /bye quits", 5000))
        FAIL("Ctrl-C at the prompt: %s", t.buf + mark);
    if (!expect(&t, mark, "quits)\r\n> ", 5000))
        FAIL("no prompt after Ctrl-C: %s", t.buf + mark);
    CHECK(write(t.fd, "\x04", 1) == 1);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; i++) {
        expect(&t, t.len, "\x01", 50);           /* drain output */
    }
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAIL("chat did not exit on Ctrl-D: %s", t.buf + mark);
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(t.fd);
}

/* racimo bench: prompt, generation, K sequences at once and the same on
 * in-process tensor-parallel shards, as JSON; bad options name themselves. */
TEST_T(cli_bench_json_and_shards, 120)
{
    const char *mpath = test_make_model("tiny", TT_Q8_0, NULL);
    char cmd[16384], out[65536];
    snprintf(cmd, sizeof cmd, "%s bench -m %s -p 16 -n 4 -t 1 --reps 1 --batch-decode 2,3 "
             "--shards 2 --json 2>/dev/null", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 0);
    json_t *j = json_loads(out, 0, NULL);
    CHECK(j != NULL);
    CHECK(json_number_value(json_object_get(j, "pp_tokens_per_s")) > 0);
    CHECK(json_number_value(json_object_get(j, "tg_tokens_per_s")) > 0);
    CHECK_INT(json_array_size(json_object_get(j, "batch_decode")), ==, 2);
    CHECK_INT(json_integer_value(json_object_get(j, "shards")), ==, 2);
    json_t *sd = json_object_get(j, "shards_decode");
    CHECK_INT(json_array_size(sd), ==, 3);              /* x1, x2, x3 */
    CHECK_INT(json_integer_value(json_object_get(json_array_get(sd, 2), "sequences")), ==, 3);
    CHECK(json_number_value(json_object_get(json_array_get(sd, 2), "tokens_per_s")) > 0);
    json_decref(j);
    /* tiny-qwen3moe has 4 experts: 5 shards cannot share them, and it says so */
    snprintf(cmd, sizeof cmd, "%s bench -m %s -p 0 -n 2 -t 1 --reps 1 --shards 5", test_bin(),
             test_make_model("tiny-qwen3moe", TT_Q8_0, NULL));
    CHECK_INT(test_run(cmd, out, sizeof out), !=, 0);
    CHECK(strstr(out, "4 experts cannot be shared by 5") != NULL);
    snprintf(cmd, sizeof cmd, "%s bench -m %s --shards 1", test_bin(), mpath);
    CHECK_INT(test_run(cmd, out, sizeof out), ==, 2);
    CHECK(strstr(out, "'--shards'") != NULL);
}

/* An embedding model makes no logits: the commands that need them say so
 * (and do not read hidden states as logits). */
TEST(cli_embedding_model_refused)
{
    const char *mpath = test_make_model("tiny-qwen3-embed", TT_F32, NULL);
    char cmd[4096], out[8192];
    struct { const char *args; const char *want; } cases[] = {
        { "logits -m %s --tokens 1,2,3", "embedding model (last pooling): it makes no logits" },
        { "bench -m %s -p 8 -n 2 --reps 1", "embedding model (last pooling)" },
        { "run -m %s -p hi -n 2", "makes embeddings; it does not generate text" },
        { "make-model --preset tiny --pooling max -o %s.x", "pooling 'max' is not mean, cls or last" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048];
        snprintf(args, sizeof args, cases[i].args, mpath);
        snprintf(cmd, sizeof cmd, "%s %s", test_bin(), args);
        int st = test_run(cmd, out, sizeof out);
        if (st == 0 || !strstr(out, cases[i].want))
            FAIL("'%s': status %d, output '%s' lacks '%s'", args, st, out, cases[i].want);
    }
}
