/* stop.h - stop strings over streamed text.
 *
 * Generated text arrives piece by piece (one detokenised token at a time);
 * a stop string may be split across any number of pieces.  The matcher
 * releases bytes as soon as they can no longer be part of a stop string and
 * holds back the longest tail that is still the beginning of one.  When a
 * stop string completes, the output ends just before it: none of its bytes
 * are ever released, and whatever follows it is discarded.
 *
 * Matching is on bytes, so UTF-8 stop strings work unchanged; the matcher
 * does not keep multi-byte characters whole (a piece that ends inside a
 * character is released as it came when it cannot start a stop string).
 *
 * The stop that wins is the one that completes first in the text (the
 * smallest end offset; among those ending at the same byte, the longest), so
 * the result does not depend on how the text was cut into pieces.
 */
#ifndef RC_STOP_H
#define RC_STOP_H

#include <stddef.h>

#define STOP_MAX_STRINGS 64     /* most stop strings per matcher */
#define STOP_MAX_BYTES   1024   /* longest stop string */

typedef struct stop_matcher stop_matcher;

/* Copies the n stop strings (NUL-terminated; empty ones are ignored, n may
 * be 0 and then everything passes).  RC_ELIMIT beyond STOP_MAX_STRINGS or
 * STOP_MAX_BYTES, RC_EINVAL for a NULL string, RC_ENOMEM. */
int  stop_new(const char *const *stops, int n, stop_matcher **out);
void stop_free(stop_matcher *m);                 /* accepts NULL */

/* Appends len bytes of text.  On return *emit / *emit_len are the bytes
 * that are safe to send now (possibly earlier held bytes followed by part
 * of this text); the pointer stays valid until the next call on m.
 * Returns 1 when a stop string completed (the output ends before it, and
 * this and every later push return 1 with nothing to emit), 0 when not,
 * or RC_ENOMEM / RC_ELIMIT when the buffer could not grow (nothing emitted,
 * the text is not taken). */
int  stop_push(stop_matcher *m, const char *text, size_t len,
               const char **emit, size_t *emit_len);

/* At the end of generation: releases the held bytes (a partial stop that
 * never completed).  Nothing after a completed stop. */
void stop_flush(stop_matcher *m, const char **emit, size_t *emit_len);

/* Index (into the array given to stop_new) of the stop string that
 * completed, or -1. */
int  stop_matched(const stop_matcher *m);

/* Forgets held bytes and any match, for the next generation. */
void stop_reset(stop_matcher *m);

#endif
