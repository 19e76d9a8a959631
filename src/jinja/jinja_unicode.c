/* jinja_unicode.c - UTF-8 and the small Unicode tables Python semantics need.
 *
 * Template values are Python str objects; here they are valid UTF-8 (the
 * engine checks template source and JSON input), so decoding needs no
 * error handling.  The character classes follow Python's str methods:
 * isspace (used by strip/split and by the lexer's \s), isprintable (repr
 * escapes what is not), and a case mapping that covers Latin, Greek,
 * Cyrillic, Armenian and fullwidth letters - the scripts chat templates
 * meet.  Characters outside these tables are treated as uncased.
 */
#include "jinja/jinja_internal.h"

uint32_t ju_next(const char *s, size_t *i)
{
    const unsigned char *p = (const unsigned char *)s + *i;
    uint32_t c = p[0];
    if (c < 0x80) {
        *i += 1;
        return c;
    }
    if (c < 0xE0) {
        *i += 2;
        return ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    }
    if (c < 0xF0) {
        *i += 3;
        return ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    }
    *i += 4;
    return ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
           (p[3] & 0x3Fu);
}

size_t ju_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t ju_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

size_t ju_offset(const char *s, size_t len, size_t idx)
{
    size_t i = 0;
    while (idx > 0 && i < len) {
        i++;
        while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        idx--;
    }
    return i;
}

bool ju_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1; cp = c & 0x1F; min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2; cp = c & 0x0F; min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3; cp = c & 0x07; min = 0x10000;
        } else {
            return false;
        }
        if (len - i <= n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

bool ju_isspace(uint32_t c)
{
    if (c < 0x80)
        return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python's isprintable: false for categories Cc, Cf, Co, Cs, Cn, Zl, Zp and
 * Zs other than the space.  Cn (unassigned) is approximated by the large
 * unassigned planes. */
bool ju_isprintable(uint32_t c)
{
    static const uint32_t ranges[][2] = {
        {0x00, 0x1F}, {0x7F, 0xA0}, {0xAD, 0xAD}, {0x600, 0x605}, {0x61C, 0x61C},
        {0x6DD, 0x6DD}, {0x70F, 0x70F}, {0x890, 0x891}, {0x8E2, 0x8E2},
        {0x1680, 0x1680}, {0x180E, 0x180E}, {0x2000, 0x200F}, {0x2028, 0x202F},
        {0x205F, 0x2064}, {0x2066, 0x206F}, {0x3000, 0x3000}, {0xD800, 0xF8FF},
        {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0xFFFE, 0xFFFF}, {0x110BD, 0x110BD},
        {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
        {0x1D173, 0x1D17A}, {0x323B0, 0xDFFFF}, {0xE0000, 0xE00FF},
        {0xE01F0, 0x10FFFF},
    };
    if (c >= 0x20 && c < 0x7F)
        return true;
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (c >= ranges[i][0] && c <= ranges[i][1])
            return false;
    return true;
}

/* Upper -> lower for the cased scripts; returns c when c is not upper. */
static uint32_t lower_of(uint32_t c)
{
    if (c < 0x80)
        return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7))
        return c + 32;
    if (c >= 0x100 && c <= 0x137)
        return (c & 1) || c == 0x130 ? c : c + 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E))
        return (c & 1) ? c + 1 : c;
    if (c >= 0x14A && c <= 0x177)
        return (c & 1) ? c : c + 1;
    if (c == 0x178)
        return 0xFF;
    if (c == 0x386)
        return 0x3AC;
    if (c >= 0x388 && c <= 0x38A)
        return c + 37;
    if (c == 0x38C)
        return 0x3CC;
    if (c == 0x38E || c == 0x38F)
        return c + 63;
    if (c >= 0x391 && c <= 0x3AB && c != 0x3A2)
        return c + 32;
    if (c >= 0x400 && c <= 0x40F)
        return c + 80;
    if (c >= 0x410 && c <= 0x42F)
        return c + 32;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) ||
        (c >= 0x4D0 && c <= 0x52F) || (c >= 0x1E00 && c <= 0x1E95) ||
        (c >= 0x1EA0 && c <= 0x1EFF))
        return (c & 1) ? c : c + 1;
    if (c >= 0x4C1 && c <= 0x4CE)
        return (c & 1) ? c + 1 : c;
    if (c == 0x4C0)
        return 0x4CF;
    if (c >= 0x531 && c <= 0x556)
        return c + 48;
    if (c >= 0xFF21 && c <= 0xFF3A)
        return c + 32;
    return c;
}

/* Lower -> upper; returns c when c is not lower. */
static uint32_t upper_of(uint32_t c)
{
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c == 0xB5)
        return 0x39C;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7)
        return c - 32;
    if (c == 0xFF)
        return 0x178;
    if (c >= 0x100 && c <= 0x137)
        return (c & 1) && c != 0x131 ? c - 1 : (c == 0x131 ? 'I' : c);
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E))
        return (c & 1) ? c : c - 1;
    if (c >= 0x14A && c <= 0x177)
        return (c & 1) ? c - 1 : c;
    if (c == 0x17F)
        return 'S';
    if (c == 0x3AC)
        return 0x386;
    if (c >= 0x3AD && c <= 0x3AF)
        return c - 37;
    if (c == 0x3CC)
        return 0x38C;
    if (c == 0x3CD || c == 0x3CE)
        return c - 63;
    if (c == 0x3C2)
        return 0x3A3;
    if (c >= 0x3B1 && c <= 0x3CB)
        return c - 32;
    if (c >= 0x430 && c <= 0x44F)
        return c - 32;
    if (c >= 0x450 && c <= 0x45F)
        return c - 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) ||
        (c >= 0x4D0 && c <= 0x52F) || (c >= 0x1E00 && c <= 0x1E95) ||
        (c >= 0x1EA0 && c <= 0x1EFF))
        return (c & 1) ? c - 1 : c;
    if (c >= 0x4C1 && c <= 0x4CE)
        return (c & 1) ? c : c - 1;
    if (c == 0x4CF)
        return 0x4C0;
    if (c >= 0x561 && c <= 0x586)
        return c - 48;
    if (c >= 0xFF41 && c <= 0xFF5A)
        return c - 32;
    return c;
}

uint32_t ju_tolower(uint32_t c) { return lower_of(c); }
uint32_t ju_toupper(uint32_t c) { return upper_of(c); }

bool ju_isupper(uint32_t c) { return lower_of(c) != c || c == 0x130; }
bool ju_islower(uint32_t c)
{
    return upper_of(c) != c || c == 0xDF || c == 0x138 || c == 0x149;
}

bool ju_isdigit(uint32_t c) { return c >= '0' && c <= '9'; }

bool ju_isalpha(uint32_t c)
{
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (ju_isupper(c) || ju_islower(c) || c == 0xAA || c == 0xBA)
        return true;
    if (c < 0x100)
        return false;
    /* Uncased scripts: treat everything outside the symbol, punctuation
     * and space blocks as letters. */
    static const uint32_t non_alpha[][2] = {
        {0x2000, 0x2BFF}, {0x2E00, 0x2E7F}, {0x3000, 0x303F}, {0xD800, 0xF8FF},
        {0xFE30, 0xFE4F}, {0xFF00, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65},
        {0xFFF0, 0xFFFF}, {0x1F000, 0x1FBFF},
    };
    for (size_t i = 0; i < sizeof non_alpha / sizeof non_alpha[0]; i++)
        if (c >= non_alpha[i][0] && c <= non_alpha[i][1])
            return false;
    return ju_isprintable(c) && !ju_isspace(c);
}
