/* tls.c - OpenSSL contexts and bufferevents for HTTPS (tls.h).
 *
 * libevent's OpenSSL bufferevent does the record layer; evhttp reads and
 * writes through it as through a socket.  Dirty shutdowns are allowed: many
 * HTTP clients close the TCP connection without a TLS close_notify, and the
 * HTTP framing (Content-Length, chunked end) already says where a message
 * ends, so a missing close_notify cannot cut an answer short unnoticed.
 */
#include "tls.h"
#include "base/err.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

const char *tls_error(struct bufferevent *bev, char *buf, size_t cap)
{
    /* libevent moves the errors of its connections off OpenSSL's queue */
    unsigned long e = bev ? bufferevent_get_openssl_error(bev) : ERR_peek_last_error();
    buf[0] = '\0';
    if (e)
        ERR_error_string_n(e, buf, cap);
    ERR_clear_error();
    return buf;
}

/* OpenSSL says "system lib" for a file it cannot open: name the reason. */
static int readable(const char *opt, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return rc_fail(RC_EIO, "%s %s: %s", opt, path, strerror(errno));
    fclose(f);
    return 0;
}

int tls_server_ctx(const char *cert_file, const char *key_file, SSL_CTX **out)
{
    char why[256];
    *out = NULL;
    int rc = readable("--tls-cert", cert_file);
    if (rc || (rc = readable("--tls-key", key_file)))
        return rc;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        return rc_fail(RC_ENOMEM, "cannot make a TLS context: %s", tls_error(NULL, why, sizeof why));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* no TLS-level renegotiation or session tickets to keep between requests:
     * HTTP keep-alive already reuses a connection */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1)
        rc = rc_fail(RC_EIO, "--tls-cert %s: not a readable PEM certificate (%s)", cert_file,
                     tls_error(NULL, why, sizeof why));
    else if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1 &&
             ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH)
        rc = rc_fail(RC_EIO, "--tls-key %s: not a readable PEM private key (%s)", key_file,
                     tls_error(NULL, why, sizeof why));
    else if (SSL_CTX_check_private_key(ctx) != 1)
        rc = rc_fail(RC_EIO, "--tls-key %s is not the private key of the certificate in "
                     "--tls-cert %s", key_file, cert_file);
    ERR_clear_error();
    if (rc) {
        SSL_CTX_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

/* A bufferevent over ssl (freed with it, or here on failure); evhttp gives
 * it the socket. */
static struct bufferevent *ssl_bev(struct event_base *base, SSL *ssl,
                                   enum bufferevent_ssl_state state)
{
    struct bufferevent *bev = bufferevent_openssl_socket_new(base, -1, ssl, state,
                                                             BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

struct bufferevent *tls_server_bev(struct event_base *base, void *arg)
{
    SSL *ssl = SSL_new(arg);
    return ssl ? ssl_bev(base, ssl, BUFFEREVENT_SSL_ACCEPTING) : NULL;
}

int tls_client_ctx(SSL_CTX **out)
{
    char why[256];
    *out = NULL;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return rc_fail(RC_ENOMEM, "cannot make a TLS context: %s", tls_error(NULL, why, sizeof why));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        SSL_CTX_free(ctx);
        return rc_fail(RC_EIO, "cannot read the system's certificate authorities: %s",
                       tls_error(NULL, why, sizeof why));
    }
    *out = ctx;
    return 0;
}

struct bufferevent *tls_client_bev(struct event_base *base, SSL_CTX *ctx, const char *host)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    /* SNI only for names (RFC 6066), the certificate check for names and
     * addresses alike */
    unsigned char ip[16];
    bool is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    if ((!is_ip && SSL_set_tlsext_host_name(ssl, host) != 1) ||
        (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host)
               : SSL_set1_host(ssl, host)) != 1) {
        SSL_free(ssl);
        return NULL;
    }
    return ssl_bev(base, ssl, BUFFEREVENT_SSL_CONNECTING);
}
