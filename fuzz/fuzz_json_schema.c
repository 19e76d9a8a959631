/* fuzz_json_schema.c - libFuzzer target for JSON Schema to GBNF
 * (src/grammar/json_schema.c, json_regex.c) and the forced tool-call
 * grammars (src/api/tool_grammar.c).  The first byte picks what the rest
 * is: a schema, a string pattern, or a tool's parameters (and the tool
 * format).  Every refusal must carry a message; every grammar made must
 * compile, except where the engine refuses a limit or left recursion that a
 * schema spelled out ({"$ref": "#"}).  Seeds: fuzz/corpus/json_schema. */
#include "api/reasoning.h"
#include "api/tool_calls.h"
#include "api/tool_grammar.h"
#include "base/err.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_compiles(const char *gbnf)
{
    grammar *g;
    if (grammar_compile(gbnf, strlen(gbnf), &g) == 0) {
        grammar_free(g);
        return;
    }
    const char *why = rc_errmsg();
    if (!strstr(why, "recursion") && !strstr(why, "limit") && !strstr(why, "too") &&
        !strstr(why, "GRAMMAR_MAX"))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 16)
        return 0;
    int what = data[0] % 4;
    json_t *v;
    if (what == 1) {        /* the rest is a pattern */
        v = json_pack("{s:s, s:s%}", "type", "string", "pattern", (const char *)data + 1, size - 1);
    } else {
        v = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    }
    if (!v)
        return 0;
    char *gbnf = NULL;
    int rc;
    if (what <= 1) {
        rc = json_schema_to_gbnf(v, &gbnf);
    } else {
        json_t *tools = json_pack("[{s:s, s:{s:s, s:O}}]", "type", "function", "function", "name",
                                  "f", "parameters", v);
        const char *trigger;
        int format = TOOLS_HERMES + data[0] / 4 % 5;
        rc = tools ? tool_grammar_build(format, what == 3 ? "[ARGS] ```json" : NULL, tools, NULL,
                                        data[0] / 20 % 3, &gbnf, &trigger) : RC_ENOMEM;
        json_decref(tools);
    }
    json_decref(v);
    if (rc == 0) {
        if (!gbnf)
            abort();
        check_compiles(gbnf);
    } else if (gbnf || !rc_errmsg()[0]) {
        abort();
    }
    rc_free(gbnf);
    return 0;
}
