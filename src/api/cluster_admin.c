/* cluster_admin.c - the endpoints that change who belongs to the cluster:
 *
 *   POST /v1/cluster/nodes/{id}/remove   revokes a node (racimo nodes remove)
 *   POST /v1/cluster/key/rotate          a new cluster key (racimo token --rotate);
 *                                        the answer carries the new join token
 *
 * They pass the API key check like every endpoint, and are taken only from a
 * client on this machine (loopback or one of this host's own addresses): the
 * key of an API user is not the right to reshape the cluster or to read its
 * new token, and a node run without API keys on 0.0.0.0 must not let any
 * LAN host do either.
 */
#include "server_internal.h"

#include "base/err.h"
#include "cluster/cluster.h"

#include <sodium.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/http.h>

/* Whether `addr` (a literal) is loopback or an address of this host. */
static bool local_address(const char *addr)
{
    struct in_addr a4;
    struct in6_addr a6;
    bool v4 = inet_pton(AF_INET, addr, &a4) == 1;
    if (v4 && (ntohl(a4.s_addr) >> 24) == 127)
        return true;
    if (!v4 && inet_pton(AF_INET6, addr, &a6) != 1)
        return false;
    if (!v4 && IN6_IS_ADDR_LOOPBACK(&a6))
        return true;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool mine = false;
    for (struct ifaddrs *i = ifs; i && !mine; i = i->ifa_next) {
        if (!i->ifa_addr)
            continue;
        if (v4 && i->ifa_addr->sa_family == AF_INET)
            mine = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a4.s_addr;
        else if (!v4 && i->ifa_addr->sa_family == AF_INET6)
            mine = !memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &a6, sizeof a6);
    }
    freeifaddrs(ifs);
    return mine;
}

static bool from_this_host(struct evhttp_request *req)
{
    struct evhttp_connection *con = evhttp_request_get_connection(req);
    char *addr = NULL;
    ev_uint16_t port = 0;
    if (!con)
        return false;
    evhttp_connection_get_peer(con, &addr, &port);
    return addr && local_address(addr);
}

static int reply_fail(api_server *s, struct evhttp_request *req, int status, const char *code,
                      const char *msg)
{
    api_error e;
    api_fail(&e, status, code, NULL, "%s", msg);
    http_reply_error(s, req, false, &e);
    return status;
}

static int status_of(int rc)
{
    return rc == RC_ENOTFOUND ? 404 : rc == RC_EINVAL ? 400 : rc == RC_ESTATE ? 409 : 500;
}

int cluster_admin(api_server *s, struct evhttp_request *req, const char *path, int method)
{
    static const char rotate[] = "/v1/cluster/key/rotate", nodes[] = "/v1/cluster/nodes/",
                      remove[] = "/remove";
    size_t pl = strlen(path), nl = strlen(nodes), rl = strlen(remove);
    bool is_rotate = !strcmp(path, rotate);
    bool is_remove = pl > nl + rl && !strncmp(path, nodes, nl) && !strcmp(path + pl - rl, remove);
    if (!is_rotate && !is_remove)
        return reply_fail(s, req, 404, "not_found", "no such cluster endpoint");
    if (method != EVHTTP_REQ_POST)
        return reply_fail(s, req, 405, "method_not_allowed", "use POST");
    if (!s->cfg.cluster)
        return reply_fail(s, req, 409, "no_cluster", "this node runs without a cluster");
    if (!from_this_host(req))
        return reply_fail(s, req, 403, "forbidden", "cluster membership is changed only from the "
                          "node's own machine (run racimo nodes remove / racimo token --rotate "
                          "there)");
    if (is_rotate) {
        char token[128];
        int rc = cluster_rotate_key(s->cfg.cluster, token, sizeof token);
        if (rc)
            return reply_fail(s, req, status_of(rc), "rotation_refused", rc_errmsg());
        http_reply_json(s, req, 200, json_pack("{s:s}", "token", token), NULL, NULL);
        sodium_memzero(token, sizeof token);
        return 200;
    }
    char spec[64], id[33];
    size_t n = pl - nl - rl;
    snprintf(spec, sizeof spec, "%.*s", (int)(n < sizeof spec ? n : sizeof spec - 1), path + nl);
    int rc = cluster_remove_node(s->cfg.cluster, spec, id);
    if (rc)
        return reply_fail(s, req, status_of(rc), "remove_refused", rc_errmsg());
    http_reply_json(s, req, 200, json_pack("{s:s, s:s}", "removed", id, "by",
                                           cluster_self_id(s->cfg.cluster)), NULL, NULL);
    return 200;
}
