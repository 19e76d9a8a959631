/* utf8.c - UTF-8 classification, encoding and sanitising (see utf8.h). */
#include "text/utf8.h"

#include <string.h>

int utf8_check(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return UTF8_VALID;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;      /* range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
        if (c == 0xED) hi = 0x9F;      /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;      /* nothing above U+10FFFF */
    } else {
        *len = 1;                      /* 80..C1, F5..FF */
        return UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = n;
            return UTF8_INCOMPLETE;
        }
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *len = i;
            return UTF8_INVALID;
        }
    }
    *len = need;
    return UTF8_VALID;
}

size_t utf8_encode(uint32_t cp, char *out)
{
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        o[0] = (uint8_t)(0xF0 | (cp >> 18));
        o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (uint8_t)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

uint32_t utf8_decode_valid(const uint8_t *s, size_t len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

size_t utf8_sanitize(const char *s, size_t n, char *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        /* fast path for ASCII runs */
        while (i < n && u[i] < 0x80)
            out[o++] = s[i++];
        if (i >= n)
            break;
        size_t len;
        if (utf8_check(u + i, n - i, &len) == UTF8_VALID) {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, UTF8_REPLACEMENT, 3);
            o += 3;
            i += 1;
        }
    }
    return o;
}
