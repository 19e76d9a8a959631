/* cli_util.c - running the racimo binary from tests. */
#include "cli_util.h"
#include "test.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

const char *test_bin(void)
{
    const char *b = getenv("RACIMO_BIN");
    if (!b)
        SKIP("RACIMO_BIN is not set (run through make test)");
    return b;
}

int test_run(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    CHECK(p != NULL);
    /* a signal (the engine threads' timers, a child's exit) can cut one fread short:
     * read to the end of the output */
    size_t n = 0;
    while (n < cap - 1) {
        size_t k = fread(out + n, 1, cap - 1 - n, p);
        n += k;
        if (k == 0) {
            if (feof(p) || errno != EINTR)
                break;
            clearerr(p);
        }
    }
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}
