/* tls.h - HTTPS for the API server and the command-line clients: OpenSSL
 * contexts and libevent's OpenSSL bufferevents (libevent_openssl), which
 * evhttp uses in place of plain sockets. */
#ifndef RC_API_TLS_H
#define RC_API_TLS_H

#include <openssl/ssl.h>

struct event_base;
struct bufferevent;

/* A server context with the certificate chain of `cert_file` and the
 * private key of `key_file` (PEM), TLS 1.2 at least.  RC_EIO with a message
 * naming the file that cannot be read or parsed, or both when the key is not
 * the certificate's. */
int tls_server_ctx(const char *cert_file, const char *key_file, SSL_CTX **out);

/* The bufferevent of one accepted connection (evhttp_set_bevcb); `arg` is the
 * SSL_CTX.  NULL when out of memory (evhttp then drops the connection). */
struct bufferevent *tls_server_bev(struct event_base *base, void *arg);

/* A client context that verifies servers against the system's certificate
 * authorities (or $SSL_CERT_FILE / $SSL_CERT_DIR, which OpenSSL reads). */
int tls_client_ctx(SSL_CTX **out);

/* A connecting bufferevent for `host` (sent as SNI and checked against the
 * certificate's names) to give evhttp_connection_base_bufferevent_new. */
struct bufferevent *tls_client_bev(struct event_base *base, SSL_CTX *ctx, const char *host);

/* OpenSSL's last error (of bev's connection, or NULL: of this thread) as
 * text ("" when none), for messages. */
const char *tls_error(struct bufferevent *bev, char *buf, size_t cap);

#endif
