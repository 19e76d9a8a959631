/* state.c - the state directory of a node: the cluster key (stored as its
 * join token, mode 0600), the node's own key pair (node.key, mode 0600) and
 * the id it gives (node.id), and the cache of peers met before (the
 * revocation list, revoked.json, is revoke.c's).
 *
 * The directory must belong to the user running the node and be writable
 * by nobody else: whoever can replace files there can replace the keys.
 * Files are written to a fresh temporary file (mkstemp: never a file or
 * link someone put there), synced and moved into place, so a crash never
 * leaves half a key; a new key is linked (not renamed) into place so two
 * nodes started at once on one directory agree on one key.  Keys are read
 * with O_NOFOLLOW.
 */
#include "cluster/cluster_internal.h"

#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int cluster_state_dir(const char *dir, char *out, size_t cap)
{
    const char *env = getenv("RACIMO_HOME"), *home = getenv("HOME");
    int n;
    if (dir && *dir)
        n = snprintf(out, cap, "%s", dir);
    else if (env && *env)
        n = snprintf(out, cap, "%s", env);
    else
        n = snprintf(out, cap, "%s/.racimo", home && *home ? home : ".");
    if (n < 0 || (size_t)n >= cap)
        return rc_fail(RC_ELIMIT, "state directory path is too long");
    return 0;
}

/* mkdir -p with mode 0700 for the parts it creates. */
static int make_dirs(const char *path)
{
    char tmp[512];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return rc_fail(RC_ELIMIT, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
            return rc_fail(RC_EIO, "cannot create %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return rc_fail(RC_EIO, "cannot create %s: %s", tmp, strerror(errno));
    struct stat st;
    if (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode))
        return rc_fail(RC_EIO, "%s is not a directory", tmp);
    return 0;
}

/* The directory holds keys: it must be this user's and writable by no one
 * else, or another local user could swap them. */
static int check_dir(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return rc_fail(RC_EIO, "cannot stat %s: %s", dir, strerror(errno));
    if (st.st_uid != geteuid())
        return rc_fail(RC_ESTATE, "the state directory %s belongs to uid %ld, not to the user "
                                  "running racimo (uid %ld); refusing to keep keys there "
                                  "(use your own --state-dir)", dir, (long)st.st_uid,
                       (long)geteuid());
    if (st.st_mode & 022)
        return rc_fail(RC_ESTATE, "the state directory %s is writable by %s (mode %03o); "
                                  "refusing to keep keys there (chmod 700 %s)", dir,
                       (st.st_mode & 002) ? "anyone" : "its group",
                       (unsigned)(st.st_mode & 0777), dir);
    return 0;
}

/* Reads a small file (< cap bytes) into buf, NUL-terminated, trailing
 * white space removed; a symbolic link is refused.  0, RC_ENOTFOUND or
 * RC_EIO. */
static int read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? rc_fail(RC_ENOTFOUND, "%s does not exist", path)
                               : rc_fail(RC_EIO, "cannot read %s: %s%s", path, strerror(errno),
                                         errno == ELOOP ? " (a symbolic link is not taken)" : "");
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return rc_fail(RC_EIO, "cannot read %s: %s", path, strerror(errno));
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = 0;
    return 0;
}

/* Writes data to path with `mode`: replace = rename over an old file;
 * otherwise link, failing with RC_ESTATE when the file appeared meanwhile.
 * The temporary file comes from mkstemp (a fresh name no one could have
 * placed a symlink at) and gets `mode` before any byte is written. */
static int write_file(const char *path, const char *data, size_t n, int mode, bool replace)
{
    char tmp[600];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return rc_fail(RC_ELIMIT, "path too long: %s", path);
    int fd = mkstemp(tmp);       /* O_EXCL: never follows a link planted there */
    if (fd < 0)
        return rc_fail(RC_EIO, "cannot write %s: %s", path, strerror(errno));
    bool ok = fchmod(fd, (mode_t)mode) == 0 && write(fd, data, n) == (ssize_t)n && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        int e = errno;
        unlink(tmp);
        return rc_fail(RC_EIO, "cannot write %s: %s", tmp, strerror(e));
    }
    int r = 0;
    if (replace) {
        if (rename(tmp, path) != 0)
            r = rc_fail(RC_EIO, "cannot replace %s: %s", path, strerror(errno));
    } else if (link(tmp, path) != 0) {
        r = errno == EEXIST ? RC_ESTATE
                            : rc_fail(RC_EIO, "cannot create %s: %s", path, strerror(errno));
    }
    unlink(tmp);
    return r;
}

int cl__write_file(const char *path, const char *data, size_t n, int mode, bool replace)
{
    return write_file(path, data, n, mode, replace);
}

int cluster_read_token(const char *state_dir, char *out, size_t cap)
{
    char path[600], buf[WIRE_TOKEN_MAX];
    uint8_t key[WIRE_KEY_BYTES];
    snprintf(path, sizeof path, "%s/cluster.key", state_dir);
    int r = read_small(path, buf, sizeof buf);
    if (r == RC_ENOTFOUND)
        return rc_fail(RC_ENOTFOUND, "%s holds no cluster key yet (run 'racimo serve' once, "
                                     "or join a cluster with --join)", state_dir);
    if (r)
        return r;
    if (wire_token_decode(buf, key, NULL, 0))
        return rc_wrap(RC_EFORMAT, "%s: ", path);
    sodium_memzero(key, sizeof key);
    if (strlen(buf) + 1 > cap)
        return rc_fail(RC_ELIMIT, "token buffer too small");
    strcpy(out, buf);
    return 0;
}

static int load_key(struct cluster *c, bool *created)
{
    char path[600], stored[WIRE_TOKEN_MAX], tok[WIRE_TOKEN_MAX];
    snprintf(path, sizeof path, "%s/cluster.key", c->state_dir);
    const char *given = c->cfg.join_token;
    if (!given || !*given)
        given = getenv("RACIMO_JOIN_TOKEN");
    if (given && !*given)
        given = NULL;
    uint8_t key[WIRE_KEY_BYTES];
    if (given) {
        if (wire_token_decode(given, key, c->hint, sizeof c->hint))
            return rc_wrap(RC_EFORMAT, "--join: ");
    }
    int r = read_small(path, stored, sizeof stored);
    if (r && r != RC_ENOTFOUND)
        return r;
    bool have = r == 0;
    uint8_t old[WIRE_KEY_BYTES];
    if (have && wire_token_decode(stored, old, NULL, 0)) {
        if (!given)
            return rc_wrap(RC_EFORMAT, "%s (remove it to start a new cluster): ", path);
        have = false;
    }
    if (have) {
        struct stat st;
        if (stat(path, &st) == 0 && (st.st_mode & 077)) {
            rc_log(LOG_WARN, "cluster: %s was readable by others; making it owner-only", path);
            chmod(path, 0600);
        }
    }
    if (!given) {
        if (have) {
            memcpy(c->key, old, sizeof old);
        } else {
            randombytes_buf(key, sizeof key);
            wire_token_encode(key, tok, sizeof tok);
            strcat(tok, "\n");
            r = write_file(path, tok, strlen(tok), 0600, false);
            if (r == RC_ESTATE)            /* another node on this directory made one first */
                return load_key(c, created);
            if (r)
                return r;
            memcpy(c->key, key, sizeof key);
            if (created)
                *created = true;
        }
    } else {
        if (!have || sodium_memcmp(old, key, sizeof key) != 0) {
            if (have)
                rc_log(LOG_WARN, "cluster: the join token names another cluster than the key "
                                 "in %s; replacing it", path);
            wire_token_encode(key, tok, sizeof tok);
            strcat(tok, "\n");
            if ((r = write_file(path, tok, strlen(tok), 0600, true)))
                return r;
        }
        memcpy(c->key, key, sizeof key);
    }
    sodium_memzero(key, sizeof key);
    sodium_memzero(old, sizeof old);
    wire_token_encode(c->key, c->token, sizeof c->token);
    wire_fingerprint(c->key, c->fp);
    return 0;
}

/* This node's identity: node.key holds its secret X25519 key (64 hex
 * digits); node.id the id it gives, written for scripts and people.  A
 * state directory from before identities (node.id alone) gets a key pair,
 * and so a new id: said once, when the key is made. */
static int load_identity(struct cluster *c)
{
    char path[600], idpath[600], buf[160], idh[2 * WIRE_ID_BYTES + 1];
    uint8_t sk[WIRE_PK_BYTES];
    snprintf(path, sizeof path, "%s/node.key", c->state_dir);
    snprintf(idpath, sizeof idpath, "%s/node.id", c->state_dir);
    int r = read_small(path, buf, sizeof buf);
    if (r == RC_ENOTFOUND) {
        wire_identity_new(&c->ident);
        wire_hex(c->ident.sk, WIRE_PK_BYTES, buf);
        strcat(buf, "\n");
        r = write_file(path, buf, strlen(buf), 0600, false);
        sodium_memzero(buf, sizeof buf);
        if (r == RC_ESTATE)            /* made meanwhile: take that one */
            return load_identity(c);
        if (r)
            return r;
        char old[80];
        wire_hex(c->ident.id, WIRE_ID_BYTES, idh);
        if (read_small(idpath, old, sizeof old) == 0 && strcmp(old, idh))
            rc_log(LOG_WARN, "cluster: this node now has a key pair (%s), and its id changes "
                             "from %.32s to %s: node ids are proven by keys since cluster "
                             "protocol 2.0", path, old, idh);
    } else if (r) {
        return r;
    } else {
        if (wire_unhex(buf, sk, WIRE_PK_BYTES)) {
            sodium_memzero(buf, sizeof buf);
            return rc_fail(RC_EFORMAT, "%s does not hold a node key (64 hex digits); remove it "
                                       "to make a new one (the node's id changes)", path);
        }
        struct stat st;
        if (lstat(path, &st) == 0 && (st.st_mode & 077)) {
            rc_log(LOG_WARN, "cluster: %s was readable by others; making it owner-only", path);
            chmod(path, 0600);
        }
        wire_identity_from_secret(&c->ident, sk);
        sodium_memzero(sk, sizeof sk);
        sodium_memzero(buf, sizeof buf);
        wire_hex(c->ident.id, WIRE_ID_BYTES, idh);
    }
    char have[80];
    if (read_small(idpath, have, sizeof have) != 0 || strcmp(have, idh)) {
        char line[2 * WIRE_ID_BYTES + 2];
        snprintf(line, sizeof line, "%s\n", idh);
        if ((r = write_file(idpath, line, strlen(line), 0644, true)))
            return r;
    }
    return 0;
}

int cl__state_init(struct cluster *c, bool *created)
{
    int r;
    if ((r = cluster_state_dir(c->cfg.state_dir, c->state_dir, sizeof c->state_dir)) ||
        (r = make_dirs(c->state_dir)) || (r = check_dir(c->state_dir)))
        return r;
    /* one node per state directory: two would share a node id */
    char lock[600];
    snprintf(lock, sizeof lock, "%s/lock", c->state_dir);
    c->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (c->lock_fd < 0)
        return rc_fail(RC_EIO, "cannot open %s: %s", lock, strerror(errno));
    if (flock(c->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return rc_fail(RC_ESTATE, "the state directory %s is in use by another racimo node "
                                  "(give each node its own --state-dir)", c->state_dir);
    if ((r = load_key(c, created)) || (r = load_identity(c)))
        return r;
    cl_node *self = cl__node_add(c, c->ident.id);
    if (!self)
        return rc_fail(RC_ENOMEM, "cluster node table");
    self->is_self = true;
    self->up = true;
    self->member = true;
    memcpy(self->pk, c->ident.pk, WIRE_PK_BYTES);
    snprintf(self->name, sizeof self->name, "%s", c->name);
    return 0;
}

/* ---- peers met before ---- */

void cl__peers_load(struct cluster *c)
{
    char path[600];
    snprintf(path, sizeof path, "%s/peers.json", c->state_dir);
    json_t *arr = json_load_file(path, 0, NULL);
    if (!json_is_array(arr)) {
        json_decref(arr);
        return;
    }
    size_t i;
    json_t *p;
    json_array_foreach(arr, i, p) {
        const char *id = json_string_value(json_object_get(p, "id"));
        uint8_t bin[WIRE_ID_BYTES];
        if (!id || wire_unhex(id, bin, WIRE_ID_BYTES) || i >= 256)
            continue;
        cl_node *n = cl__node_find(c, bin);
        if (!n && !(n = cl__node_add(c, bin)))
            continue;               /* removed from the cluster (or out of memory) */
        if (n->is_self)
            continue;
        /* met before: a member again when its key was kept and gives its
         * id; an entry without one (protocol 1.x) is only a candidate */
        uint8_t pk[WIRE_PK_BYTES], kid[WIRE_ID_BYTES];
        const char *key = json_string_value(json_object_get(p, "key"));
        if (key && !wire_unhex(key, pk, WIRE_PK_BYTES)) {
            wire_id_of_key(pk, kid);
            if (!memcmp(kid, bin, WIRE_ID_BYTES)) {
                n->member = true;
                memcpy(n->pk, pk, WIRE_PK_BYTES);
            }
        }
        json_t *port = json_object_get(p, "cluster_port");
        if (json_is_integer(port) && json_integer_value(port) > 0 && json_integer_value(port) < 65536)
            n->cluster_port = (int)json_integer_value(port);
        const char *name = json_string_value(json_object_get(p, "name"));
        if (name && !n->name[0])
            snprintf(n->name, sizeof n->name, "%s", name);
        size_t j;
        json_t *a;
        json_array_foreach(json_object_get(p, "addresses"), j, a)
            if (json_is_string(a))
                cl__node_add_addr(c, n, json_string_value(a));
    }
    json_decref(arr);
}

void cl__peers_save(struct cluster *c)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < c->n_nodes; i++) {
        cl_node *n = c->nodes[i];
        if (n->is_self || !n->member || !n->cluster_port || !n->addrs.n_addrs)
            continue;
        json_t *addrs = json_array();
        for (int j = 0; j < n->addrs.n_addrs; j++)
            json_array_append_new(addrs, json_string(n->addrs.addrs[j]));
        char key[2 * WIRE_PK_BYTES + 1];
        wire_hex(n->pk, WIRE_PK_BYTES, key);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:o, s:i}", "id", n->id_hex,
                                             "key", key, "name", n->name, "addresses", addrs,
                                             "cluster_port", n->cluster_port));
    }
    char *s = arr ? json_dumps(arr, JSON_INDENT(1)) : NULL;
    json_decref(arr);
    if (!s)
        return;
    char path[600];
    snprintf(path, sizeof path, "%s/peers.json", c->state_dir);
    if (write_file(path, s, strlen(s), 0600, true))
        rc_log(LOG_DEBUG, "cluster: %s", rc_errmsg());
    free(s);
}

int cl__local_addrs(addr_list *out, bool with_loopback)
{
    struct ifaddrs *ifs = NULL;
    out->n_addrs = 0;
    if (getifaddrs(&ifs) != 0)
        return rc_fail(RC_EIO, "getifaddrs: %s", strerror(errno));
    for (struct ifaddrs *i = ifs; i && out->n_addrs < CL_MAX_ADDRS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
            continue;
        if ((i->ifa_flags & IFF_LOOPBACK) && !with_loopback)
            continue;
        const struct sockaddr_in *sin = (const struct sockaddr_in *)i->ifa_addr;
        inet_ntop(AF_INET, &sin->sin_addr, out->addrs[out->n_addrs], CL_ADDR_LEN);
        out->n_addrs++;
    }
    freeifaddrs(ifs);
    return 0;
}
