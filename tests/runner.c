/* runner.c - runs the registered tests, each in a forked process with an
 * alarm, and prints "N passed, N failed, N skipped" as its last line,
 * after the names of the tests that failed.
 *
 * Usage: racimo_tests [-j N] [substring ...]   (runs tests whose name holds
 * one of the substrings; all when none is given).  RACIMO_TEST_TIMEOUT_SCALE
 * multiplies every timeout (sanitizer builds run slower).  -j N (or
 * RACIMO_TEST_JOBS) runs N tests side by side: many wait on timers and
 * sockets, not on the CPU.  Then each test's output goes to a file of its
 * own, shown only when it fails or skips, and results print as they end. */
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 1024
#define MAX_JOBS 64

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

/* A test in flight: its process, scratch folder and captured output. */
typedef struct {
    pid_t pid;
    int idx;
    struct timespec t0;
    char dir[512];
    char out[600];     /* "" when the test writes straight to ours */
} running;

static void start_one(running *r, int idx, double scale, int capture)
{
    r->idx = idx;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/racimo-test-%d-%s",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(),
             tests[idx].name);
    memcpy(r->dir, dir, sizeof r->dir);
    r->out[0] = '\0';
    if (capture)
        snprintf(r->out, sizeof r->out, "%s.out", dir);
    mkdir(r->dir, 0700);
    memcpy(tmpdir, r->dir, sizeof tmpdir);   /* what test_tmpdir() answers in the child */
    fflush(NULL);
    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    pid_t pid = fork();
    if (pid == 0) {
        if (capture) {
            /* Tests side by side would interleave their messages: each
             * writes to its own file, shown when it fails or skips. */
            int fd = open(r->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) {
                dup2(fd, STDOUT_FILENO);
                dup2(fd, STDERR_FILENO);
                close(fd);
            }
        }
        alarm((unsigned)(tests[idx].timeout_s * scale + 0.5));
        tests[idx].fn();
        fflush(NULL);
        if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
            fprintf(stderr, "  memory leaked (LeakSanitizer report above)\n");
            _exit(1);
        }
        _exit(0);
    }
    r->pid = pid;
    if (pid < 0)
        fprintf(stderr, "  cannot fork for %s: %s\n", tests[idx].name, strerror(errno));
}

static void copy_out(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stdout);
    fclose(f);
}

/* Reaps a finished test: 0 passed, 1 failed, 2 skipped. */
static int finish_one(running *r, int status)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
    if (system(cmd) != 0) { /* leftover scratch files are harmless */ }
    int res = 1;
    if (r->pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        res = 0;
    else if (r->pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP_CODE)
        res = 2;
    if (r->out[0]) {
        if (res != 0)
            copy_out(r->out);
        unlink(r->out);
    }
    if (r->pid > 0 && WIFSIGNALED(status))
        printf("  killed by signal %d%s\n", WTERMSIG(status),
               WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
    return res;
}

static int jobs_from(int *argc, char **argv)
{
    int jobs = 1;
    const char *env = getenv("RACIMO_TEST_JOBS");
    if (env && atoi(env) > 0)
        jobs = atoi(env);
    if (*argc >= 3 && strcmp(argv[1], "-j") == 0) {
        jobs = atoi(argv[2]) > 0 ? atoi(argv[2]) : 1;
        memmove(argv + 1, argv + 3, (size_t)(*argc - 3 + 1) * sizeof *argv);
        *argc -= 2;
    }
    return jobs < MAX_JOBS ? jobs : MAX_JOBS;
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
    int jobs = jobs_from(&argc, argv);
    /* Registration order follows link order; sort for a stable report. */
    const char *names[MAX_TESTS];
    for (int i = 0; i < n_tests; i++)
        names[i] = tests[i].name;
    qsort(names, (size_t)n_tests, sizeof names[0], cmp_name);
    int order[MAX_TESTS], n_order = 0;
    for (int k = 0; k < n_tests; k++) {
        int i = 0;
        while (tests[i].name != names[k])
            i++;
        if (selected(tests[i].name, argc, argv, 1))
            order[n_order++] = i;
    }
    running slots[MAX_JOBS];
    int n_running = 0, next = 0;
    while (next < n_order || n_running > 0) {
        int k = -1, status = 0;
        if (next < n_order && n_running < jobs) {
            start_one(&slots[n_running], order[next++], scale, jobs > 1);
            if (slots[n_running++].pid > 0)
                continue;
            k = n_running - 1;                 /* fork failed: report it now */
        } else {
            pid_t pid;
            while ((pid = waitpid(-1, &status, 0)) < 0 && errno == EINTR) {}
            if (pid < 0) {
                fprintf(stderr, "runner: waitpid: %s\n", strerror(errno));
                return 1;
            }
            for (int j = 0; j < n_running; j++)
                if (slots[j].pid == pid)
                    k = j;
            if (k < 0)
                continue;                      /* not one of our tests */
        }
        running *r = &slots[k];
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int res = finish_one(r, status);
        double ms = (t1.tv_sec - r->t0.tv_sec) * 1e3 + (t1.tv_nsec - r->t0.tv_nsec) / 1e6;
        const char *word = res == 0 ? "ok" : res == 2 ? "skip" : "FAIL";
        printf("%-4s %s (%.0f ms)\n", word, tests[r->idx].name, ms);
        fflush(stdout);
        if (res == 0) passed++;
        else if (res == 2) skipped++;
        else failures[failed++] = tests[r->idx].name;
        slots[k] = slots[--n_running];
    }
    for (int k = 0; k < failed; k++)
        printf("failed: %s\n", failures[k]);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
