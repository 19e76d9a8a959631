/* digests.c - content digests of model files and their cache (digests.h). */
#include "digests.h"

#include "base/err.h"
#include "base/le.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/os.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef unsigned long long ull;

static const char MAGIC[8] = "RCDIGST1";
#define HDR_BYTES (8 + 8 + 8 + 8 + 8 + 4 + 4 + DIGEST_BYTES)

int digests_blocks(uint64_t size, uint32_t *n)
{
    if (size > DIGEST_FILE_MAX)
        return rc_fail(RC_ELIMIT, "a model file of %llu bytes is larger than the %llu bytes "
                       "this version handles", (ull)size, (ull)DIGEST_FILE_MAX);
    *n = (uint32_t)((size + DIGEST_BLOCK - 1) / DIGEST_BLOCK);
    return 0;
}

int digests_alloc(digests *d, uint64_t size)
{
    memset(d, 0, sizeof *d);
    int rc = digests_blocks(size, &d->n);
    if (rc)
        return rc;
    d->size = size;
    if (!(d->d = rc_calloc(d->n ? d->n : 1, DIGEST_BYTES)))
        return rc_fail(RC_ENOMEM, "out of memory for %u block digests", d->n);
    return 0;
}

void digests_free(digests *d)
{
    rc_free(d->d);
    memset(d, 0, sizeof *d);
}

void digests_block(const uint8_t *data, size_t len, uint8_t out[DIGEST_BYTES])
{
    crypto_generichash(out, DIGEST_BYTES, data, len, NULL, 0);
}

void digests_root(const digests *d, uint8_t out[DIGEST_BYTES])
{
    crypto_generichash_state st;
    uint8_t hdr[16 + 8 + 4];
    memcpy(hdr, "racimo-digests-1", 16);
    le_put64(hdr + 16, d->size);
    le_put32(hdr + 24, DIGEST_BLOCK);
    crypto_generichash_init(&st, NULL, 0, DIGEST_BYTES);
    crypto_generichash_update(&st, hdr, sizeof hdr);
    crypto_generichash_update(&st, (const uint8_t *)d->d, (size_t)d->n * DIGEST_BYTES);
    crypto_generichash_final(&st, out, DIGEST_BYTES);
}

void digests_hex(const uint8_t root[DIGEST_BYTES], char out[DIGEST_HEX])
{
    sodium_bin2hex(out, DIGEST_HEX, root, DIGEST_BYTES);
}

int digests_parse(const char *s, uint8_t out[DIGEST_BYTES])
{
    size_t n;
    if (!s || strlen(s) != 2 * DIGEST_BYTES ||
        sodium_hex2bin(out, DIGEST_BYTES, s, strlen(s), NULL, &n, NULL) || n != DIGEST_BYTES)
        return rc_fail(RC_EINVAL, "a content digest is %d hex digits", 2 * DIGEST_BYTES);
    return 0;
}

static int compute(const export_src *src, const char *path, uint64_t size, digests *out)
{
    int rc = digests_alloc(out, size);
    uint8_t *buf = rc ? NULL : rc_malloc(DIGEST_BLOCK);
    if (!rc && !buf)
        rc = rc_fail(RC_ENOMEM, "out of memory hashing %s", path);
    uint64_t t0 = os_now_ns();
    for (uint32_t i = 0; !rc && i < out->n; i++) {
        uint64_t off = (uint64_t)i * DIGEST_BLOCK;
        size_t len = size - off < DIGEST_BLOCK ? (size_t)(size - off) : DIGEST_BLOCK;
        if (export_src_pread(src, buf, len, off))
            rc = rc_fail(RC_EIO, "%s: read error at byte %llu: %s", path, (ull)off,
                         errno ? strerror(errno) : "short file");
        else
            digests_block(buf, len, out->d[i]);
    }
    rc_free(buf);
    if (rc) {
        digests_free(out);
        return rc;
    }
    digests_root(out, out->root);
    char hex[DIGEST_HEX];
    digests_hex(out->root, hex);
    rc_log(LOG_INFO, "weights: content digest of %s: %s (%u blocks, hashed in %.1f s)",
           path, hex, out->n, (double)(os_now_ns() - t0) * 1e-9);
    return 0;
}

int digests_read(const char *file, const export_stat *want, digests *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? RC_ENOTFOUND
                               : rc_fail(RC_EIO, "%s: cannot open: %s", file, strerror(errno));
    uint8_t h[HDR_BYTES];
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || os_pread_full(fd, h, sizeof h, 0) || memcmp(h, MAGIC, 8) ||
        le_get32(h + 40) != DIGEST_BLOCK) {
        rc = rc_fail(RC_EFORMAT, "%s: not a digests file of this version", file);
        goto out;
    }
    export_stat s = { le_get64(h + 8), (int64_t)le_get64(h + 16), le_get64(h + 24), le_get64(h + 32) };
    if (want && (s.size != want->size || s.mtime_ns != want->mtime_ns || s.dev != want->dev ||
                 s.ino != want->ino)) {
        rc = RC_ENOTFOUND;                   /* it describes another file (or version) */
        goto out;
    }
    uint32_t n = 0;
    /* the sizes agree before anything is allocated */
    if (digests_blocks(s.size, &n) || le_get32(h + 44) != n ||
        (uint64_t)st.st_size != HDR_BYTES + (uint64_t)n * DIGEST_BYTES) {
        rc = rc_fail(RC_EFORMAT, "%s: truncated or malformed digests file", file);
        goto out;
    }
    if ((rc = digests_alloc(out, s.size)))
        goto out;
    if (os_pread_full(fd, (uint8_t *)out->d, (size_t)out->n * DIGEST_BYTES, HDR_BYTES)) {
        rc = rc_fail(RC_EFORMAT, "%s: truncated or malformed digests file", file);
        goto out;
    }
    digests_root(out, out->root);
    if (sodium_memcmp(out->root, h + 48, DIGEST_BYTES))
        rc = rc_fail(RC_EFORMAT, "%s: its digests do not match its root", file);
out:
    if (rc)
        digests_free(out);
    close(fd);
    return rc;
}

int digests_write(const char *file, const export_stat *st, const digests *d)
{
    char tmp[PATH_MAX + 32];
    uint8_t h[HDR_BYTES];
    export_stat z = { 0 };
    if (!st)
        st = &z;
    memcpy(h, MAGIC, 8);
    le_put64(h + 8, d->size);
    le_put64(h + 16, (uint64_t)st->mtime_ns);
    le_put64(h + 24, st->dev);
    le_put64(h + 32, st->ino);
    le_put32(h + 40, DIGEST_BLOCK);
    le_put32(h + 44, d->n);
    memcpy(h + 48, d->root, DIGEST_BYTES);
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", file, (long)getpid()) >= sizeof tmp)
        return rc_fail(RC_ELIMIT, "%s: path too long", file);
    FILE *f = fopen(tmp, "wbx");
    if (!f)
        return rc_fail(RC_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    bool ok = fwrite(h, 1, sizeof h, f) == sizeof h &&
              fwrite(d->d, DIGEST_BYTES, d->n, f) == d->n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, file) != 0) {
        int e = errno;
        unlink(tmp);
        return rc_fail(RC_EIO, "%s: cannot write: %s", file, strerror(e));
    }
    return 0;
}

/* The cache file of `path`: a hash of the path names it (the header says
 * which version of the file it describes). */
static bool cache_file(const char *cache_dir, const char *path, char *out, size_t cap)
{
    uint8_t key[16];
    char hex[33];
    if (!cache_dir || !*cache_dir)
        return false;
    crypto_generichash(key, sizeof key, (const uint8_t *)path, strlen(path), NULL, 0);
    sodium_bin2hex(hex, sizeof hex, key, sizeof key);
    return (size_t)snprintf(out, cap, "%s/%s", cache_dir, hex) < cap;
}

void digests_cache_store(const char *cache_dir, const char *path, const export_stat *st,
                         const digests *d)
{
    char file[PATH_MAX];
    if (!cache_file(cache_dir, path, file, sizeof file))
        return;
    mkdir(cache_dir, 0700);
    if (digests_write(file, st, d))
        rc_log(LOG_WARN, "weights: cannot cache the digests of %s: %s", path, rc_errmsg());
}

int digests_of_file(const char *cache_dir, const char *path, const export_src *src,
                    const export_stat *st, digests *out)
{
    char file[PATH_MAX];
    if (cache_file(cache_dir, path, file, sizeof file) && digests_read(file, st, out) == 0)
        return 0;
    int rc = compute(src, path, st->size, out);
    if (!rc)
        digests_cache_store(cache_dir, path, st, out);
    return rc;
}
