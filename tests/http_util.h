/* http_util.h - raw HTTP/1.1 over loopback sockets for in-process server
 * tests (no client library between the test and the bytes on the wire). */
#ifndef RC_TEST_HTTP_UTIL_H
#define RC_TEST_HTTP_UTIL_H

#include <stddef.h>

/* Connects to 127.0.0.1:port and sends one request ("Connection: close";
 * headers: extra lines, each ending in \r\n, or NULL).  Returns the socket. */
int http_open(int port, const char *method, const char *path, const char *headers,
              const char *body);

/* The whole response (until the server closes) into out; returns the
 * status. */
int http_request(int port, const char *method, const char *path, const char *headers,
                 const char *body, char *out, size_t cap);

#endif
