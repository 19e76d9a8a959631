/* tok_pretok.c - byte-level BPE pre-tokenizers: splitting text into words.
 *
 * Each tokenizer.ggml.pre name selects a list of regexes, applied one after
 * another: every regex splits each piece left by the one before into its
 * matches and the text between them (which stays as pieces too), as
 * llama.cpp's unicode_regex_split does.  The patterns are llama.cpp's
 * (src/llama-vocab.cpp), written for PCRE2 in UTF mode with two adjustments
 * that make PCRE2 see the text as llama.cpp's engines do:
 *   - "\s" is spelled out as llama.cpp's whitespace set (PCRE2 lacks U+0085),
 *     "\S" as its complement, "$" as "\z";
 *   - classes of literal code points that llama.cpp runs through std::wregex
 *     leave out the whitespace code points, because llama.cpp replaces those
 *     by U+000B in the text before matching (so they never match there);
 *   - llama.cpp's own table of ASCII symbols lacks '~' (see RE_DEEPSEEK3).
 * Checked against llama.cpp's unicode_regex_split on random mixed-script
 * text for every pre-tokenizer below: identical splits.  The Unicode
 * classes come from PCRE2's tables, so code points that llama.cpp's tables
 * (Unicode 15.1 at 34af94cd) class otherwise can split differently: with
 * PCRE2 10.42 (Unicode 14) the letters and digits added in 15.0 and 15.1.
 * llama.cpp replaces some patterns by hand-written code (the gpt2, llama3,
 * qwen2 and qwen35 ones); that code follows the regex semantics, which is
 * what PCRE2 gives us directly.  Kimi K2's hand-written splitter departs
 * from its pattern, so RE_KIMI_K2 is a pattern for what that code does.
 *
 * Matching uses JIT code when PCRE2 has it, with a match limit; a piece whose
 * match fails with an engine error (the limit) is kept whole rather than
 * failing the request.
 */
#include "text/tok_internal.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

struct tok__regex {
    pcre2_code *code;
};

/* llama.cpp's whitespace set (unicode_set_whitespace), as class content. */
#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
           "\\x{202F}\\x{205F}\\x{3000}"
#define S  "[" WS "]"
#define NS "[^" WS "]"

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define WS_TAIL S "*[\\r\\n]+|" S "+(?!" NS ")|" S "+"

static const char *const RE_LLAMA3[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|"
    WS_TAIL,
};
static const char *const RE_QWEN2[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|"
    WS_TAIL,
};
static const char *const RE_QWEN35[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    WS_TAIL,
};

/* GPT-2's pattern; llama.cpp's hand-written version also takes a lone
 * whitespace run ("\s+"), which the pattern itself leaves between pieces. */
#define RE_GPT2_1 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" \
                  S "+(?!" NS ")|" S "+"
static const char *const RE_GPT2[] = { RE_GPT2_1 };
static const char *const RE_STARCODER[] = { "\\p{N}", RE_GPT2_1 };
static const char *const RE_FALCON[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2_1, "[0-9][0-9][0-9]",
};
static const char *const RE_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2_1, "\\p{N}+", "[0-9][0-9][0-9]",
};

/* U+4E00-9FA5, U+0800-4E00 and U+AC00-D7FF without the whitespace in them. */
#define CJK_DS "[\\x{0800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}" \
               "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{9FA5}\\x{AC00}-\\x{D7FF}]+"

static const char *const RE_DEEPSEEK_CODER[] = {
    "[\\r\\n]", S "?\\p{L}+", S "?\\p{P}+", CJK_DS, "\\p{N}",
};

/* The cased letters DeepSeek-LLM's tokenizer.json lists. */
#define DS_LETTERS                                                                          \
    "[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"             \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"      \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"               \
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}" \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"             \
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"             \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"     \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"    \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"             \
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"     \
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"     \
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"               \
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"              \
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"             \
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"             \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"         \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"     \
    "\\x{1E900}-\\x{1E943}]+"

static const char *const RE_DEEPSEEK_LLM[] = {
    "[\\r\\n]",
    S "?" DS_LETTERS,
    S "?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+",
    S "+\\z",
    CJK_DS,
    "\\p{N}+",
};

/* llama.cpp matches \p{S} through a table of ASCII symbols that lacks '~'
 * (unicode_regex_split's k_ucat_map), so here '~' is neither P nor S. */
#define PS_LC     "(?:(?!~)[\\p{P}\\p{S}])"
#define NOT_LPS_LC "(?:~|[^\\r\\n\\p{L}\\p{P}\\p{S}])"
static const char *const RE_DEEPSEEK3[] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|" NOT_LPS_LC "?[\\p{L}\\p{M}]+|"
    " ?" PS_LC "+[\\r\\n]*|" WS_TAIL,
};

#define UPPERISH "(?:(?=\\p{L})[^a-z])"
#define LOWERISH "(?:(?=\\p{L})[^A-Z])"
static const char *const RE_TEKKEN[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH "*|"
    "\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" WS_TAIL,
};
static const char *const RE_GPT4O[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+" CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH "*" CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" WS_TAIL,
};

/* Kimi K2.  llama.cpp does not run the published pattern (tokenization_kimi.py)
 * but its own splitter (unicode_regex_split_custom_kimi_k2), and its quirks
 * are what a Kimi GGUF tokenizes by:
 *   - "Han" is unicode_cpt_is_han's list of blocks (CJK Unified Ideographs,
 *     Extensions A-F, the Compatibility Ideographs and their supplement),
 *     unassigned code points in them included, not the Han script: radicals,
 *     々, 〇 and Extensions G and later are not Han (they are letters,
 *     symbols or numbers like any other), nor is the gap U+2A6E0-2A6FF;
 *   - a word is any run of letters that are not Han: the pattern's upper-
 *     then-lowercase split is not made ("camelCase" and "HTTPServer" stay
 *     whole), and marks are not letters there, so a combining accent ends a
 *     word (and leads the next one, as any non-letter may).
 * "[^\P{L}HAN]" is PCRE2's spelling of the letters outside HAN, which it has
 * no class intersection for. */
#define HAN_K2 "\\x{3400}-\\x{4DBF}\\x{4E00}-\\x{9FFF}\\x{F900}-\\x{FAFF}\\x{20000}-\\x{2A6DF}" \
               "\\x{2A700}-\\x{2EBEF}\\x{2F800}-\\x{2FA1F}"
static const char *const RE_KIMI_K2[] = {
    "[" HAN_K2 "]+|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}" HAN_K2 "]+" CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|" WS_TAIL,
};

#define RE_BLOOM_1 " ?[^(" WS "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
static const char *const RE_BLOOM[] = { RE_BLOOM_1 };
static const char *const RE_VIKING[] = { RE_BLOOM_1, "\\p{N}" };

typedef struct {
    const char *canonical;
    const char *const *names;       /* NULL-terminated aliases */
    const char *const *re;
    int n_re;
    int flags;                      /* TOK_PRE_* */
} pre_def;

#define NAMES(...) (const char *const[]){ __VA_ARGS__, NULL }
#define RE(a) a, (int)(sizeof(a) / sizeof(a[0]))

static const pre_def PRE_DEFS[] = {
    { "llama3", NAMES("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                      "midm-2.0", "lfm2", "jina-v5-nano"),
      RE(RE_LLAMA3), TOK_PRE_IGNORE_MERGES | TOK_PRE_ADD_BOS },
    { "dbrx", NAMES("dbrx", "smaug-bpe"), RE(RE_LLAMA3), 0 },
    { "chatglm4", NAMES("glm4", "chatglm-bpe"), RE(RE_LLAMA3), 0 },
    { "qwen2", NAMES("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
                     "hunyuan", "solar-open", "grok-2"),
      RE(RE_QWEN2), 0 },
    { "qwen35", NAMES("qwen35"), RE(RE_QWEN35), 0 },
    { "deepseek-llm", NAMES("deepseek-llm"), RE(RE_DEEPSEEK_LLM), 0 },
    { "deepseek-coder", NAMES("deepseek-coder"), RE(RE_DEEPSEEK_CODER), 0 },
    { "deepseek-v3", NAMES("deepseek-v3", "hunyuan-dense", "joyai-llm"), RE(RE_DEEPSEEK3), 0 },
    { "gpt-2", NAMES("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                     "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jina-v1-en",
                     "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
                     "granite-docling", "exaone4"),
      RE(RE_GPT2), 0 },
    { "starcoder", NAMES("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                         "minerva-7b", "mellum2"),
      RE(RE_STARCODER), 0 },
    { "falcon", NAMES("falcon"), RE(RE_FALCON), 0 },
    { "tekken", NAMES("tekken"), RE(RE_TEKKEN), TOK_PRE_IGNORE_MERGES | TOK_PRE_ADD_BOS },
    { "kimi-k2", NAMES("kimi-k2"), RE(RE_KIMI_K2), 0 },
    { "gpt-4o", NAMES("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), RE(RE_GPT4O), 0 },
    { "bloom", NAMES("poro-chat", "bloom", "gpt3-finnish"), RE(RE_BLOOM), 0 },
    { "viking", NAMES("viking"), RE(RE_VIKING), 0 },
    { "default", NAMES("default"), RE(RE_DEFAULT), 0 },
};

/* PCRE2's allocations go through the racimo allocator too. */
static void *pc_malloc(PCRE2_SIZE n, void *ctx)
{
    (void)ctx;
    return rc_malloc(n);
}

static void pc_free(void *p, void *ctx)
{
    (void)ctx;
    rc_free(p);
}

static const pre_def *find_def(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; i++)
        for (const char *const *n = PRE_DEFS[i].names; *n; n++)
            if (strlen(*n) == len && memcmp(*n, name, len) == 0)
                return &PRE_DEFS[i];
    return NULL;
}

int tok__pretok_init(tokenizer *t, const char *name, size_t len)
{
    const pre_def *def = name ? find_def(name, len) : NULL;
    if (!def) {
        def = find_def("default", 7);
        if (name)
            rc_log(LOG_WARN, "tokenizer: unknown pre-tokenizer '%.*s', using 'default' "
                   "(tokenization may differ from the model's)", (int)(len > 64 ? 64 : len), name);
        else
            rc_log(LOG_WARN, "tokenizer: tokenizer.ggml.pre is missing, using 'default' "
                   "(tokenization may differ from the model's)");
    }
    t->pre_name = def->canonical;

    pcre2_general_context *gc = pcre2_general_context_create(pc_malloc, pc_free, NULL);
    pcre2_compile_context *cc = gc ? pcre2_compile_context_create(gc) : NULL;
    t->re = rc_calloc((size_t)def->n_re, sizeof *t->re);
    if (!gc || !cc || !t->re) {
        pcre2_compile_context_free(cc);
        pcre2_general_context_free(gc);
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory compiling regexes");
    }
    int rc = 0;
    for (int i = 0; i < def->n_re; i++) {
        int err;
        PCRE2_SIZE at;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)def->re[i], PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_NO_AUTO_CAPTURE, &err, &at, cc);
        if (!code) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            /* Only a failed allocation can make our fixed patterns fail. */
            rc = rc_fail(err == PCRE2_ERROR_HEAPLIMIT || strstr((char *)msg, "memory")
                             ? RC_ENOMEM : RC_EFORMAT,
                         "tokenizer: pre-tokenizer '%s' regex %d: %s at %zu",
                         def->canonical, i, (char *)msg, (size_t)at);
            break;
        }
        t->re[i].code = code;
        t->n_re = i + 1;
        /* Without JIT (unsupported CPU, no memory) the interpreter is used. */
        (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    }
    pcre2_compile_context_free(cc);
    pcre2_general_context_free(gc);
    return rc ? rc : def->flags;
}

void tok__pretok_free(tokenizer *t)
{
    if (!t->re)
        return;
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i].code);
    rc_free(t->re);
    t->re = NULL;
    t->n_re = 0;
}

void tok__scratch_free(tok__scratch *s)
{
    rc_free(s->buf);
    rc_free(s->word);
    rc_free(s->sp[0]);
    rc_free(s->sp[1]);
    rc_free(s->sym);
    rc_free(s->heap);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit_stack);
    memset(s, 0, sizeof *s);
}

/* Match data, match context (limits) and JIT stack, made once per
 * tok_encode call on first use. */
static int ensure_match_state(tok__scratch *s)
{
    if (s->md)
        return 0;
    pcre2_general_context *gc = pcre2_general_context_create(pc_malloc, pc_free, NULL);
    if (!gc)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    s->md = pcre2_match_data_create(1, gc);
    s->mctx = pcre2_match_context_create(gc);
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, gc);
    pcre2_general_context_free(gc);
    if (!s->md || !s->mctx)
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    pcre2_set_match_limit(s->mctx, 10u * 1000 * 1000);
    pcre2_set_depth_limit(s->mctx, 100u * 1000);
    if (s->jit_stack)   /* without it JIT uses 32 KiB of machine stack */
        pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    return 0;
}

static int push_span(tok__scratch *s, int which, size_t *n, size_t off, size_t len)
{
    if (*n == s->sp_cap[which] &&
        tok__reserve((void **)&s->sp[which], &s->sp_cap[which], *n + 1, sizeof(tok__span)))
        return RC_ENOMEM;
    s->sp[which][(*n)++] = (tok__span){ (uint32_t)off, (uint32_t)len };
    return 0;
}

/* Splits one piece [off, off+len) of text with `code` into spans[which]. */
static int split_piece(tok__scratch *s, const pcre2_code *code, const char *text, size_t off,
                       size_t len, int which, size_t *n)
{
    PCRE2_SPTR subject = (PCRE2_SPTR)(text + off);
    size_t pos = 0, last = 0;
    while (pos < len) {
        int m = pcre2_match(code, subject, len, pos, PCRE2_NO_UTF_CHECK,
                            (pcre2_match_data *)s->md, (pcre2_match_context *)s->mctx);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            /* Match limit or another engine error: keep the rest whole. */
            rc_log(LOG_DEBUG, "tokenizer: regex error %d at byte %zu; piece kept whole",
                   m, off + pos);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer((pcre2_match_data *)s->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            /* Our patterns never match empty; step over one character anyway. */
            pos = ms + 1;
            while (pos < len && (subject[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (ms > last && push_span(s, which, n, off + last, ms - last))
            return RC_ENOMEM;
        if (push_span(s, which, n, off + ms, me - ms))
            return RC_ENOMEM;
        last = pos = me;
    }
    if (last < len && push_span(s, which, n, off + last, len - last))
        return RC_ENOMEM;
    return 0;
}

int tok__pretok_split(const tokenizer *t, tok__scratch *s, const char *text, size_t len,
                      tok__span **out, size_t *n_out)
{
    int rc = ensure_match_state(s);
    if (rc)
        return rc;
    size_t n = 0;
    int cur = 0;
    if (push_span(s, cur, &n, 0, len))
        return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
    for (int r = 0; r < t->n_re; r++) {
        int nxt = cur ^ 1;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            tok__span sp = s->sp[cur][i];
            if (split_piece(s, t->re[r].code, text, sp.off, sp.len, nxt, &m))
                return rc_fail(RC_ENOMEM, "tokenizer: out of memory");
        }
        cur = nxt;
        n = m;
    }
    *out = s->sp[cur];
    *n_out = n;
    return 0;
}
