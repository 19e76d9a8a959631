/* utf8.h - small UTF-8 helpers shared by the tokenizers and the streaming
 * detokenizer.
 *
 * "Valid" means well-formed per Unicode (Table 3-7): no overlong forms, no
 * surrogates, nothing above U+10FFFF.  All functions are pure and thread
 * safe; none allocates.
 */
#ifndef RC_UTF8_H
#define RC_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT "\xEF\xBF\xBD"   /* U+FFFD */

enum { UTF8_INVALID = -1, UTF8_INCOMPLETE = 0, UTF8_VALID = 1 };

/* Classifies the sequence at the start of s[0..n) (n >= 1):
 *   UTF8_VALID      a whole character; *len = its byte length (1..4),
 *   UTF8_INCOMPLETE s[0..n) is a proper prefix of a valid character that the
 *                   data ends inside of; *len = n,
 *   UTF8_INVALID    *len = the length of the maximal subpart (the bytes that
 *                   were a valid prefix before the failure, at least 1), the
 *                   unit a decoder replaces with one U+FFFD. */
int utf8_check(const uint8_t *s, size_t n, size_t *len);

/* Byte length a SentencePiece-style splitter gives a character from its
 * first byte alone (1 for ASCII and stray continuation bytes, 2/3/4 by the
 * lead byte's high bits); not validated. */
static inline size_t utf8_lead_len(uint8_t c)
{
    static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return len[c >> 4];
}

/* Encodes code point cp (<= 0x10FFFF) into out (room for 4); returns the
 * byte count, or 0 for a value beyond U+10FFFF. */
size_t utf8_encode(uint32_t cp, char *out);

/* Decodes the valid character at s (caller checked with utf8_check). */
uint32_t utf8_decode_valid(const uint8_t *s, size_t len);

/* Copies s[0..n) to out, replacing each byte that does not start or
 * continue a valid character with U+FFFD (one replacement per bad byte, as
 * llama.cpp's decoder does).  out needs room for 3 * n bytes.  Returns the
 * bytes written. */
size_t utf8_sanitize(const char *s, size_t n, char *out);

#endif
