/* runner.c - runs the registered tests, each in a forked process with an
 * alarm, and prints "N passed, N failed, N skipped" as its last line,
 * after the names of the tests that failed.
 *
 * Usage: racimo_tests [-j N] [substring ...]   (runs tests whose name holds
 * one of the substrings; all when none is given).  RACIMO_TEST_TIMEOUT_SCALE
 * multiplies every timeout (sanitizer builds run slower). */
#include "test.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 1024

static struct { const char *name; test_fn fn; int timeout_s; } tests[MAX_TESTS];
static int n_tests;
static char tmpdir[512];

void test_register(const char *name, test_fn fn, int timeout_s)
{
    if (n_tests < MAX_TESTS) {
        tests[n_tests].name = name;
        tests[n_tests].fn = fn;
        tests[n_tests].timeout_s = timeout_s;
        n_tests++;
    }
}

const char *test_tmpdir(void) { return tmpdir; }

const char *test_golden_dir(void)
{
    static char path[1024];
    const char *env = getenv("RACIMO_GOLDEN");
    struct stat st;
    snprintf(path, sizeof path, "%s", env ? env : "../shared/golden");
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return NULL;
    return path;
}

/* LeakSanitizer's check, when the build has it: a test ends with _exit,
 * which skips the check LSan would run at exit. */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int selected(const char *name, int argc, char **argv, int first)
{
    if (first >= argc)
        return 1;
    for (int i = first; i < argc; i++)
        if (strstr(name, argv[i]))
            return 1;
    return 0;
}

static int run_one(int idx, double scale)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/racimo-test-%d-%s",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(),
             tests[idx].name);
    mkdir(tmpdir, 0700);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm((unsigned)(tests[idx].timeout_s * scale + 0.5));
        tests[idx].fn();
        fflush(NULL);
        if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
            fprintf(stderr, "  memory leaked (LeakSanitizer report above)\n");
            _exit(1);
        }
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) { /* leftover scratch files are harmless */ }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        return 2;
    if (WIFSIGNALED(status))
        fprintf(stderr, "  killed by signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
    return 1;
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    /* Names of the failures, repeated just above the closing line: CI
     * shows only the tail of a long log. */
    const char *failures[MAX_TESTS];
    double scale = 1.0;
    const char *s = getenv("RACIMO_TEST_TIMEOUT_SCALE");
    if (s && atof(s) > 0)
        scale = atof(s);
    /* Registration order follows link order; sort for a stable report. */
    const char *names[MAX_TESTS];
    for (int i = 0; i < n_tests; i++)
        names[i] = tests[i].name;
    qsort(names, (size_t)n_tests, sizeof names[0], cmp_name);
    for (int k = 0; k < n_tests; k++) {
        int i = 0;
        while (tests[i].name != names[k])
            i++;
        if (!selected(tests[i].name, argc, argv, 1))
            continue;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int r = run_one(i, scale);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        const char *word = r == 0 ? "ok" : r == 2 ? "skip" : "FAIL";
        printf("%-4s %s (%.0f ms)\n", word, tests[i].name, ms);
        fflush(stdout);
        if (r == 0) passed++;
        else if (r == 2) skipped++;
        else failures[failed++] = tests[i].name;
    }
    for (int k = 0; k < failed; k++)
        printf("failed: %s\n", failures[k]);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
