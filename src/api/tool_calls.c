/* tool_calls.c - the tool-call formats of tool_calls.h.
 *
 * JSON values inside the text are read with jansson in "first value only"
 * mode (JSON_DISABLE_EOF_CHECK), which reports how many bytes the value
 * took, so text after a call is found without a hand-written scanner.
 * DeepSeek and Kimi share one reader of marker-delimited sections (a
 * section of calls, each call a head, a separator, JSON arguments and an
 * end marker); only the reading of a call's head differs.
 */
#include "tool_calls.h"
#include "base/mem.h"

#include <string.h>

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]", MISTRAL_ARGS[] = "[ARGS]";
static const char PYTHON_TAG[] = "<|python_tag|>";

/* Marker-delimited formats: a section of calls, each call
 * CALL_BEGIN head SEP arguments CALL_END. */
typedef struct {
    const char *sec_begin, *sec_end, *call_begin, *call_end, *sep;
    const char *markers[6];   /* the five above, NULL-terminated */
} section_fmt;

static const section_fmt DEEPSEEK = {
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    { "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
      "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", NULL },
};
static const section_fmt KIMI = {
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_end|>", "<|tool_call_argument_begin|>",
    { "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
      "<|tool_call_end|>", "<|tool_call_argument_begin|>", NULL },
};

int tool_format_detect(const char *src)
{
    if (!src)
        return TOOLS_NONE;
    if (strstr(src, DEEPSEEK.call_begin))
        return TOOLS_DEEPSEEK;
    /* Kimi K2's first published template declares tools (a "tool_declare"
     * turn) without writing calls back */
    if (strstr(src, KIMI.call_begin) || strstr(src, "<|im_system|>tool_declare"))
        return TOOLS_KIMI;
    if (strstr(src, HERMES_OPEN))
        return TOOLS_HERMES;
    if (strstr(src, MISTRAL_MARK))
        return TOOLS_MISTRAL;
    /* Llama 3.1+: tools are described in the header-style turns and the
     * model is told to answer with {"name": ..., "parameters": ...} */
    if (strstr(src, "<|start_header_id|>") && strstr(src, "tools") && strstr(src, "parameters"))
        return TOOLS_LLAMA3;
    return TOOLS_NONE;
}

const char *tool_format_name(int f)
{
    static const char *const names[] = { "none", "hermes", "llama3-json", "mistral", "deepseek",
                                         "kimi-k2" };
    return f >= 0 && f <= TOOLS_KIMI ? names[f] : "unknown";
}

const char *const *tool_format_markers(int f)
{
    static const char *const none[] = { NULL };
    return f == TOOLS_DEEPSEEK ? DEEPSEEK.markers : f == TOOLS_KIMI ? KIMI.markers : none;
}

static size_t skip_ws(const char *t, size_t len, size_t i)
{
    while (i < len && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t'))
        i++;
    return i;
}

static bool starts_with(const char *t, size_t len, size_t i, const char *lit)
{
    size_t n = strlen(lit);
    return len - i >= n && !memcmp(t + i, lit, n);
}

/* Reads one JSON value at t[i]; on success *end is the offset after it. */
static json_t *json_at(const char *t, size_t len, size_t i, size_t *end)
{
    json_error_t je;
    json_t *v = json_loadb(t + i, len - i, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    if (v)
        *end = i + (size_t)je.position;
    return v;
}

/* One call {"type": "function", "function": {"name", "arguments"}} from an
 * object with "name" and "arguments" (or "parameters"), or NULL. */
static json_t *make_call(const json_t *o)
{
    json_t *name = json_object_get(o, "name");
    if (!json_is_string(name) || !json_string_length(name))
        return NULL;
    json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    json_t *a = NULL;
    if (json_is_object(args))
        a = json_incref(args);
    else if (json_is_string(args))
        a = json_loads(json_string_value(args), 0, NULL);
    else if (!args || json_is_null(args))
        a = json_object();
    if (!json_is_object(a)) {
        json_decref(a);
        return NULL;
    }
    json_t *c = json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", name,
                          "arguments", a);
    json_t *id = json_object_get(o, "id");
    if (c && json_is_string(id))
        json_object_set(c, "id", id);
    return c;
}

/* Appends the call(s) in value v (an object, or a list of objects). */
static int add_calls(json_t *calls, const json_t *v)
{
    if (json_is_object(v)) {
        json_t *c = make_call(v);
        return c ? json_array_append_new(calls, c) : -1;
    }
    if (!json_is_array(v) || !json_array_size(v))
        return -1;
    size_t i;
    json_t *o;
    json_array_foreach(v, i, o)
        if (add_calls(calls, o) || json_is_array(o))
            return -1;
    return 0;
}

typedef struct { char *p; size_t n; } text_out;

static void put(text_out *o, const char *t, size_t n)
{
    memcpy(o->p + o->n, t, n);
    o->n += n;
}

static int parse_hermes(const char *t, size_t len, json_t *calls, text_out *content)
{
    size_t i = 0;
    while (i < len) {
        const char *open = memmem(t + i, len - i, HERMES_OPEN, sizeof HERMES_OPEN - 1);
        if (!open) {
            put(content, t + i, len - i);
            break;
        }
        put(content, t + i, (size_t)(open - (t + i)));
        size_t j = skip_ws(t, len, (size_t)(open - t) + sizeof HERMES_OPEN - 1), end;
        json_t *v = json_at(t, len, j, &end);
        int bad = !v || !json_is_object(v) || add_calls(calls, v);
        json_decref(v);
        if (bad)
            return -1;
        end = skip_ws(t, len, end);
        if (starts_with(t, len, end, HERMES_CLOSE))
            end += sizeof HERMES_CLOSE - 1;
        else if (end < len)
            return -1;
        i = end;
    }
    return 0;
}

static int parse_llama3(const char *t, size_t len, json_t *calls)
{
    size_t i = skip_ws(t, len, 0), end;
    if (starts_with(t, len, i, PYTHON_TAG))
        i = skip_ws(t, len, i + sizeof PYTHON_TAG - 1);
    if (i >= len || (t[i] != '{' && t[i] != '['))
        return -1;
    json_t *v = json_at(t, len, i, &end);
    int bad = !v || add_calls(calls, v);
    json_decref(v);
    if (bad)
        return -1;
    end = skip_ws(t, len, end);
    if (end < len && t[end] == ';')
        end = skip_ws(t, len, end + 1);
    return end == len ? 0 : -1;
}

/* After the marker: a JSON list of calls, or name[ARGS]{...} (the [ARGS]
 * control token may be invisible), repeated after further markers. */
static int parse_mistral(const char *t, size_t len, size_t i, json_t *calls)
{
    while ((i = skip_ws(t, len, i)) < len) {
        size_t end;
        if (t[i] == '[') {
            json_t *v = json_at(t, len, i, &end);
            int bad = !v || !json_is_array(v) || add_calls(calls, v);
            json_decref(v);
            if (bad)
                return -1;
        } else {
            size_t name_start = i;
            while (i < len && t[i] != '{' && t[i] != '[')
                i++;
            size_t name_end = i;
            if (starts_with(t, len, i, MISTRAL_ARGS))
                i += sizeof MISTRAL_ARGS - 1;
            while (name_end > name_start && (t[name_end - 1] == ' ' || t[name_end - 1] == '\n'))
                name_end--;
            if (name_end == name_start || i >= len || t[i] != '{')
                return -1;
            json_t *args = json_at(t, len, i, &end);
            json_t *o = json_is_object(args) ?
                json_pack("{s:s%, s:O}", "name", t + name_start, name_end - name_start,
                          "arguments", args) : NULL;
            int bad = !o || add_calls(calls, o);
            json_decref(o);
            json_decref(args);
            if (bad)
                return -1;
        }
        i = skip_ws(t, len, end);
        if (starts_with(t, len, i, MISTRAL_MARK))
            i += sizeof MISTRAL_MARK - 1;
        else if (i < len)
            return -1;
    }
    return json_array_size(calls) ? 0 : -1;
}

static size_t trim_end(const char *t, size_t a, size_t b)
{
    while (b > a && (t[b - 1] == ' ' || t[b - 1] == '\n' || t[b - 1] == '\r' || t[b - 1] == '\t'))
        b--;
    return b;
}

/* Offset of lit in t[i, len), or len. */
static size_t find_lit(const char *t, size_t len, size_t i, const char *lit)
{
    const char *p = i < len ? memmem(t + i, len - i, lit, strlen(lit)) : NULL;
    return p ? (size_t)(p - t) : len;
}

/* Adds {"name", "arguments", ["id"]} made of a name (and id) in the text
 * and the JSON arguments at t[i]; *end is after the arguments. */
static int add_named_call(json_t *calls, const char *t, size_t len, size_t name_at, size_t name_end,
                          size_t id_at, size_t id_end, size_t i, size_t *end)
{
    json_t *args = json_at(t, len, i, end);
    json_t *o = json_is_object(args) ?
        json_pack("{s:s%, s:O}", "name", t + name_at, name_end - name_at, "arguments", args) : NULL;
    if (o && id_end > id_at)
        json_object_set_new(o, "id", json_stringn(t + id_at, id_end - id_at));
    int bad = !o || add_calls(calls, o);
    json_decref(o);
    json_decref(args);
    return bad ? -1 : 0;
}

/* One DeepSeek call from its head (after <｜tool▁call▁begin｜>) to the end of
 * its arguments.  V3.1 writes NAME<｜tool▁sep｜>{...}; R1 and V3 write
 * TYPE<｜tool▁sep｜>NAME, a newline and the arguments in a ```json fence. */
static int deepseek_call(const char *t, size_t len, size_t i, size_t sep, json_t *calls,
                         size_t *end)
{
    size_t after = sep + strlen(DEEPSEEK.sep), j = skip_ws(t, len, after);
    if (j < len && t[j] == '{') {
        size_t a = skip_ws(t, len, i), b = trim_end(t, a, sep);
        if (a == b || add_named_call(calls, t, len, a, b, 0, 0, j, end))
            return -1;
        return 0;
    }
    size_t name_at = skip_ws(t, len, after), nl = name_at;
    while (nl < len && t[nl] != '\n' && t[nl] != '`' && t[nl] != '{')
        nl++;
    size_t name_end = trim_end(t, name_at, nl);
    j = skip_ws(t, len, nl);
    bool fenced = starts_with(t, len, j, "```");
    if (fenced) {
        j += 3;
        if (starts_with(t, len, j, "json"))
            j += 4;
        j = skip_ws(t, len, j);
    }
    if (name_end == name_at || j >= len || t[j] != '{' ||
        add_named_call(calls, t, len, name_at, name_end, 0, 0, j, end))
        return -1;
    if (fenced) {
        size_t k = skip_ws(t, len, *end);
        if (starts_with(t, len, k, "```"))
            *end = k + 3;
        else if (k < len)
            return -1;
    }
    return 0;
}

/* One Kimi call: functions.NAME:IDX<|tool_call_argument_begin|>{...}; the
 * whole head is the call's id. */
static int kimi_call(const char *t, size_t len, size_t i, size_t sep, json_t *calls, size_t *end)
{
    size_t a = skip_ws(t, len, i), b = trim_end(t, a, sep);
    size_t name_at = a, name_end = b;
    if (starts_with(t, name_end, name_at, "functions."))
        name_at += sizeof "functions." - 1;
    size_t colon = name_end;
    while (colon > name_at && t[colon - 1] >= '0' && t[colon - 1] <= '9')
        colon--;
    bool indexed = colon > name_at && colon < name_end && t[colon - 1] == ':';
    if (indexed)
        name_end = colon - 1;
    if (name_end == name_at)
        return -1;
    return add_named_call(calls, t, len, name_at, name_end, a, indexed ? b : a,
                          skip_ws(t, len, sep + strlen(KIMI.sep)), end);
}

/* Calls in sections (or bare calls, which models also write), text around
 * them is content.  An unclosed last call or section at the end of the
 * answer still counts; anything else malformed rejects the answer. */
static int parse_sections(const section_fmt *f, const char *t, size_t len, json_t *calls,
                          text_out *content)
{
    size_t i = 0;
    while (i < len) {
        size_t sec = find_lit(t, len, i, f->sec_begin), call = find_lit(t, len, i, f->call_begin);
        size_t at = sec < call ? sec : call;
        put(content, t + i, at - i);
        if (at == len)
            break;
        bool in_section = sec < call;
        size_t j = in_section ? at + strlen(f->sec_begin) : at;
        for (;;) {
            j = skip_ws(t, len, j);
            if (!starts_with(t, len, j, f->call_begin))
                break;
            j += strlen(f->call_begin);
            size_t stop = find_lit(t, len, j, f->call_end);
            size_t sep = find_lit(t, stop, j, f->sep);
            size_t end;
            if (sep >= stop)
                return -1;
            if ((f == &DEEPSEEK ? deepseek_call(t, len, j, sep, calls, &end)
                                : kimi_call(t, len, j, sep, calls, &end)))
                return -1;
            j = skip_ws(t, len, end);
            if (starts_with(t, len, j, f->call_end))
                j += strlen(f->call_end);
            else if (j < len)
                return -1;
        }
        if (starts_with(t, len, j, f->sec_end))
            j += strlen(f->sec_end);
        else if (in_section && j < len)
            return -1;
        i = j;
    }
    return 0;
}

int tool_calls_parse(int format, bool marker, const char *text, size_t len, json_t **calls,
                     char **content)
{
    if (format == TOOLS_NONE)
        return 0;
    json_t *arr = json_array();
    text_out out = { rc_malloc(len + 1), 0 };
    if (!arr || !out.p) {
        json_decref(arr);
        rc_free(out.p);
        return -1;
    }
    int bad;
    if (format == TOOLS_HERMES) {
        bad = parse_hermes(text, len, arr, &out);
    } else if (format == TOOLS_LLAMA3) {
        bad = parse_llama3(text, len, arr);
    } else if (format == TOOLS_DEEPSEEK || format == TOOLS_KIMI) {
        bad = parse_sections(format == TOOLS_DEEPSEEK ? &DEEPSEEK : &KIMI, text, len, arr, &out);
    } else {
        size_t i = skip_ws(text, len, 0);
        if (starts_with(text, len, i, MISTRAL_MARK)) {
            bad = parse_mistral(text, len, i + sizeof MISTRAL_MARK - 1, arr);
        } else if (marker) {
            bad = parse_mistral(text, len, 0, arr);
        } else {
            bad = -1;
        }
    }
    size_t n = json_array_size(arr);
    if (bad || n == 0) {
        json_decref(arr);
        rc_free(out.p);
        return 0;
    }
    /* content around the calls, without the blank lines between them */
    size_t a = 0, b = out.n;
    while (a < b && (out.p[a] == '\n' || out.p[a] == ' '))
        a++;
    while (b > a && (out.p[b - 1] == '\n' || out.p[b - 1] == ' '))
        b--;
    memmove(out.p, out.p + a, b - a);
    out.p[b - a] = '\0';
    *calls = arr;
    *content = out.p;
    return (int)n;
}

/* Length of the longest suffix of t[0..len) that is a proper prefix of lit. */
static size_t partial_suffix(const char *t, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    for (size_t k = n - 1; k > 0; k--)
        if (len >= k && !memcmp(t + len - k, lit, k))
            return k;
    return 0;
}

size_t tool_calls_safe_prefix(int format, bool marker, const char *text, size_t len)
{
    size_t i = skip_ws(text, len, 0);
    switch (format) {
    case TOOLS_HERMES: {
        const char *open = memmem(text, len, HERMES_OPEN, sizeof HERMES_OPEN - 1);
        return open ? (size_t)(open - text) : len - partial_suffix(text, len, HERMES_OPEN);
    }
    case TOOLS_LLAMA3:
        if (i == len || text[i] == '{' || text[i] == '[')
            return 0;
        if (len - i < sizeof PYTHON_TAG - 1 && !memcmp(text + i, PYTHON_TAG, len - i))
            return 0;
        return starts_with(text, len, i, PYTHON_TAG) ? 0 : len;
    case TOOLS_DEEPSEEK:
    case TOOLS_KIMI: {
        const section_fmt *f = format == TOOLS_DEEPSEEK ? &DEEPSEEK : &KIMI;
        size_t at = find_lit(text, len, 0, f->sec_begin);
        size_t call = find_lit(text, len, 0, f->call_begin);
        if (call < at)
            at = call;
        if (at < len)
            return at;
        size_t a = partial_suffix(text, len, f->sec_begin);
        size_t b = partial_suffix(text, len, f->call_begin);
        return len - (a > b ? a : b);
    }
    case TOOLS_MISTRAL:
        if (marker || i == len)
            return 0;
        if (len - i < sizeof MISTRAL_MARK - 1)
            return memcmp(text + i, MISTRAL_MARK, len - i) ? len : 0;
        return starts_with(text, len, i, MISTRAL_MARK) ? 0 : len;
    default:
        return len;
    }
}
