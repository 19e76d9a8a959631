/* access_log.c - see access_log.h. */
#include "access_log.h"
#include "buf.h"
#include "base/err.h"
#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct access_log {
    int fd;
    bool own_fd;
    bool log_content;
    pthread_mutex_t mu;
};

int access_log_open(const char *path, bool log_content, access_log **out)
{
    *out = NULL;
    if (!path)
        return 0;
    access_log *l = rc_calloc(1, sizeof *l);
    if (!l)
        return rc_fail(RC_ENOMEM, "out of memory");
    if (!strcmp(path, "-")) {
        l->fd = STDOUT_FILENO;
    } else {
        l->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (l->fd < 0) {
            int err = errno;
            rc_free(l);
            return rc_fail(RC_EIO, "cannot open the access log %s: %s", path, strerror(err));
        }
        l->own_fd = true;
    }
    l->log_content = log_content;
    pthread_mutex_init(&l->mu, NULL);
    *out = l;
    return 0;
}

void access_log_close(access_log *l)
{
    if (!l)
        return;
    if (l->own_fd)
        close(l->fd);
    pthread_mutex_destroy(&l->mu);
    rc_free(l);
}

static void str_field(strbuf *b, const char *name, const char *v)
{
    sb_printf(b, ",\"%s\":", name);
    if (!v) {
        sb_puts(b, "null");
        return;
    }
    sb_puts(b, "\"");
    sb_json_escape(b, v, strlen(v));
    sb_puts(b, "\"");
}

void access_log_write(access_log *l, const access_entry *e)
{
    if (!l)
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[40];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    strbuf b = { 0 };
    sb_printf(&b, "{\"time\":\"%s.%03dZ\"", ts, (int)(tv.tv_usec / 1000));
    str_field(&b, "client", e->client);
    str_field(&b, "key", e->key_id);
    str_field(&b, "method", e->method);
    str_field(&b, "path", e->path);
    str_field(&b, "model", e->model);
    sb_printf(&b, ",\"status\":%d,\"tokens_in\":%d,\"tokens_cached\":%d,\"tokens_out\":%d",
              e->status, e->tokens_in, e->tokens_cached, e->tokens_out);
    if (e->ttft_ms >= 0)
        sb_printf(&b, ",\"ttft_ms\":%.1f", e->ttft_ms);
    else
        sb_puts(&b, ",\"ttft_ms\":null");
    sb_printf(&b, ",\"total_ms\":%.1f", e->total_ms);
    str_field(&b, "finish", e->finish);
    if (l->log_content) {
        str_field(&b, "prompt", e->prompt);
        str_field(&b, "answer", e->answer);
    }
    sb_puts(&b, "}\n");
    if (!sb_failed(&b)) {
        pthread_mutex_lock(&l->mu);
        size_t off = 0;
        while (off < b.len) {
            ssize_t w = write(l->fd, b.p + off, b.len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        pthread_mutex_unlock(&l->mu);
    }
    sb_free(&b);
}
