/* tool_grammar.c - the grammars of tool_grammar.h.
 *
 * Each tool's parameters become rule "fn-K" (json_schema.c); a call of tool K
 * is the format's frame around its name and that rule; a format's root joins
 * the tools' calls by alternation and repeats them up to
 * TOOL_GRAMMAR_MAX_CALLS.  The frames are written as GBNF text here; the
 * literals (names, markers) go through gt_literal so that any name is safe.
 */
#include "tool_grammar.h"
#include "reasoning.h"
#include "tool_calls.h"
#include "base/err.h"
#include "base/mem.h"
#include "grammar/gbnf_text.h"
#include "grammar/json_schema.h"

#include <stdio.h>
#include <string.h>

/* Openers, also the lazy triggers. */
static const char HERMES[] = "<tool_call>", MISTRAL[] = "[TOOL_CALLS]", LLAMA3[] = "{\"name\"";
static const char DS_BEGIN[] = "<｜tool▁calls▁begin｜>", DS_END[] = "<｜tool▁calls▁end｜>";
static const char DS_CALL[] = "<｜tool▁call▁begin｜>", DS_CALL_END[] = "<｜tool▁call▁end｜>";
static const char DS_SEP[] = "<｜tool▁sep｜>";
static const char KIMI_BEGIN[] = "<|tool_calls_section_begin|>";
static const char KIMI_END[] = "<|tool_calls_section_end|>", KIMI_CALL[] = "<|tool_call_begin|>";
static const char KIMI_ARGS[] = "<|tool_call_argument_begin|>", KIMI_CALL_END[] = "<|tool_call_end|>";

static void lit(gtext *t, const char *s)
{
    gt_puts(t, " ");
    gt_literal(t, s, strlen(s));
}

/* One call of a tool named `name` with arguments rule `args`, in the frame
 * of `format` (variant: Mistral's [ARGS] form, DeepSeek's fenced form). */
static void call_frame(gtext *t, int format, bool variant, const char *name, const char *args,
                       const char *ws)
{
    switch (format) {
    case TOOLS_HERMES:
    case TOOLS_LLAMA3:
    case TOOLS_MISTRAL:
        if (format == TOOLS_MISTRAL && variant) {
            lit(t, name);
            lit(t, "[ARGS]");
            gt_printf(t, " %s", args);
            return;
        }
        {
            /* {"name": "NAME", "arguments": ARGS} */
            json_t *q = json_string(name);
            char *quoted = q ? json_dumps(q, JSON_ENCODE_ANY) : NULL;
            json_decref(q);
            if (!quoted) {
                t->rc = RC_ENOMEM;
                return;
            }
            gt_printf(t, " \"{\" %s \"\\\"name\\\"\" %s \":\" %s", ws, ws, ws);
            lit(t, quoted);
            free(quoted);
            gt_printf(t, " %s \",\" %s", ws, ws);
            lit(t, format == TOOLS_LLAMA3 ? "\"parameters\"" : "\"arguments\"");
            gt_printf(t, " %s \":\" %s %s %s \"}\"", ws, ws, args, ws);
        }
        return;
    case TOOLS_DEEPSEEK:
        lit(t, DS_CALL);
        if (variant) {
            lit(t, "function");
            lit(t, DS_SEP);
            lit(t, name);
            lit(t, "\n```json\n");
            gt_printf(t, " %s", args);
            lit(t, "\n```");
        } else {
            lit(t, name);
            lit(t, DS_SEP);
            gt_printf(t, " %s", args);
        }
        lit(t, DS_CALL_END);
        return;
    case TOOLS_KIMI:
        lit(t, KIMI_CALL);
        lit(t, "functions.");
        gt_puts(t, " ");
        gt_literal(t, name, strlen(name));
        gt_puts(t, " \":\" [0-9]{1,3}");
        lit(t, KIMI_ARGS);
        gt_printf(t, " %s", args);
        lit(t, KIMI_CALL_END);
        return;
    default:
        return;
    }
}

/* root from rule `call` (one call of any allowed tool). */
static void root_rule(gtext *t, int format, bool variant)
{
    int more = TOOL_GRAMMAR_MAX_CALLS - 1;
    switch (format) {
    case TOOLS_HERMES:
        gt_printf(t, "\"<tool_call>\\n\" call \"\\n</tool_call>\" "
                     "( \"\\n<tool_call>\\n\" call \"\\n</tool_call>\" ){0,%d}", more);
        return;
    case TOOLS_LLAMA3:
        gt_puts(t, "call");
        return;
    case TOOLS_MISTRAL:
        gt_literal(t, MISTRAL, strlen(MISTRAL));
        if (variant)
            gt_printf(t, " call ( \"[TOOL_CALLS]\" call ){0,%d}", more);
        else
            gt_printf(t, " \"[\" call ( \",\" ws call ){0,%d} \"]\"", more);
        return;
    case TOOLS_DEEPSEEK:
        gt_literal(t, DS_BEGIN, strlen(DS_BEGIN));
        gt_printf(t, " call{1,%d}", TOOL_GRAMMAR_MAX_CALLS);
        lit(t, DS_END);
        return;
    case TOOLS_KIMI:
        gt_literal(t, KIMI_BEGIN, strlen(KIMI_BEGIN));
        gt_printf(t, " call{1,%d}", TOOL_GRAMMAR_MAX_CALLS);
        lit(t, KIMI_END);
        return;
    default:
        return;
    }
}

/* A thinking block's text: anything without "</think>" (a "<" is read with
 * what follows it, so that the text cannot run past the closing tag), then
 * the tag and a few blanks before the calls. */
static const char THINK_TEXT[] = "( [^<] | \"<\" think-lt )*";
static const char THINK_LT[] = "[^/] | \"/\" ( [^t] | \"t\" ( [^h] | \"h\" ( [^i] | \"i\" "
                               "( [^n] | \"n\" ( [^k] | \"k\" [^>] ) ) ) ) )";
#define THINK_REST "think-text \"</think>\" [ \\n]{0,4}"

static const char *trigger_of(int format)
{
    switch (format) {
    case TOOLS_HERMES:   return HERMES;
    case TOOLS_LLAMA3:   return LLAMA3;
    case TOOLS_MISTRAL:  return MISTRAL;
    case TOOLS_DEEPSEEK: return DS_BEGIN;
    case TOOLS_KIMI:     return KIMI_BEGIN;
    default:             return NULL;
    }
}

int tool_grammar_build(int format, const char *template_src, const json_t *tools, const char *only,
                       int reasoning, char **gbnf, const char **trigger)
{
    if (!trigger_of(format))
        return rc_fail(RC_EUNSUPPORTED, "the model's template has no tool-call format");
    bool variant = template_src &&
                   ((format == TOOLS_MISTRAL && strstr(template_src, "[ARGS]")) ||
                    (format == TOOLS_DEEPSEEK && strstr(template_src, "```json")));
    json_gbnf *g;
    if (json_gbnf_new(&g))
        return RC_ENOMEM;
    const char *ws = json_gbnf_shared(g, "ws");
    gtext call = { 0 };
    int rc = 0, n = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only)))
            continue;
        json_t *params = json_object_get(fn, "parameters");
        char prefix[32], args[64];
        snprintf(prefix, sizeof prefix, "fn-%zu", i);
        if (!params || json_is_null(params)) {
            snprintf(args, sizeof args, "%s", json_gbnf_shared(g, "json-object"));
        } else if ((rc = json_gbnf_add_schema(g, params, prefix, args, sizeof args))) {
            rc = rc_wrap(rc, "tool '%.64s' parameters: ", name);
            break;
        }
        gt_puts(&call, n++ ? " |" : "");
        call_frame(&call, format, variant, name, args, ws);
    }
    if (!rc && n == 0)
        rc = only ? rc_fail(RC_ENOTFOUND, "no tool is named '%.64s'", only)
                  : rc_fail(RC_EINVAL, "no tools");
    if (!rc && !(rc = gt_status(&call)))
        rc = json_gbnf_add_rule(g, "call", call.p);
    gtext calls = { 0 };
    if (!rc) {
        root_rule(&calls, format, variant);
        if (!(rc = gt_status(&calls)))
            rc = json_gbnf_add_rule(g, "calls", calls.p);
    }
    if (!rc && reasoning != REASONING_NONE && !(rc = json_gbnf_add_rule(g, "think-text", THINK_TEXT)))
        rc = json_gbnf_add_rule(g, "think-lt", THINK_LT);
    if (!rc)
        rc = json_gbnf_add_rule(g, "root", reasoning == REASONING_OPEN ? THINK_REST " calls" :
                                           reasoning == REASONING_AUTO ?
                                           "( \"<think>\" " THINK_REST " )? calls" : "calls");
    if (!rc && !(*gbnf = rc_strdup(json_gbnf_text(g, NULL))))
        rc = rc_fail(RC_ENOMEM, "out of memory");
    if (!rc)
        *trigger = trigger_of(format);
    gt_free(&call);
    gt_free(&calls);
    json_gbnf_free(g);
    return rc;
}
