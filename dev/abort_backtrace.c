/* A native backtrace when a process aborts (SIGABRT: "terminate called without an active exception" at exit, HISTORY
 * run 60), for `dev/diag_exit_abort.py --preload`. Preloaded, it installs a SIGABRT handler that writes the aborting
 * thread's id and its backtrace (library + offset per frame: resolve with `addr2line -e LIB OFFSET` or the library's
 * exported symbols) to stderr, then re-raises. Async-signal-safe calls only, but for backtrace(), loaded before.
 *
 *     gcc -shared -fPIC -O1 -o .abort/abort_backtrace.so dev/abort_backtrace.c
 *     LD_PRELOAD=$PWD/.abort/abort_backtrace.so python3 ...
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void on_abort(int sig) {
    void *frames[64];
    char line[96];
    long tid = syscall(SYS_gettid);
    int n = backtrace(frames, 64);
    int len = 0;
    const char *head = "== SIGABRT backtrace, thread ";
    write(2, head, strlen(head));
    /* the thread id, in decimal, without printf */
    char digits[24];
    int k = 0;
    do { digits[k++] = (char)('0' + tid % 10); tid /= 10; } while (tid && k < 23);
    while (k) line[len++] = digits[--k];
    line[len++] = getpid() == (pid_t)syscall(SYS_gettid) ? '*' : ' ';
    line[len++] = '\n';
    write(2, line, (size_t)len);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc_s now, not inside the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_abort;
    sigaction(SIGABRT, &sa, 0);
}
