#ifndef TEST_IGBENCH_UTIL_H
#define TEST_IGBENCH_UTIL_H

/*
 * Helpers shared by the igbench and faultproxy integration tests: start the
 * bench tools as real processes on loopback, run igbench to completion and
 * read its JSON report. Every wait is bounded.
 *
 * The processes under measurement get a higher scheduling priority when the
 * test may give it (root: SCHED_FIFO 10, else nice -10): the test machine is
 * shared, and a process that waits for a CPU adds that wait to every figure,
 * which is the machine's error, not the tool's.
 */
#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    int out_fd;
    int port;
} tproc_t;

static inline const char *tu_bin_dir(void)
{
    const char *d = getenv("IG_BIN_DIR");
    return d ? d : IG_BIN_DIR;
}

static inline double tu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Splits a command line on spaces into argv (no quoting), in place. */
static inline int tu_split(char *line, char **argv, int max)
{
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line, " ", &save); t && n < max - 1;
         t = strtok_r(NULL, " ", &save))
        argv[n++] = t;
    argv[n] = NULL;
    return n;
}

/* Children still running when the test ends (a failed assertion jumps past
 * tu_stop): killed at exit, so that they do not hold ctest's output pipe. */
static pid_t tu_children[64];

static inline void tu_kill_children(void)
{
    for (int i = 0; i < 64; i++) {
        if (tu_children[i] > 0) {
            kill(tu_children[i], SIGKILL);
            waitpid(tu_children[i], NULL, 0);
            tu_children[i] = 0;
        }
    }
}

static inline void tu_forget_child(pid_t pid)
{
    for (int i = 0; i < 64; i++)
        if (tu_children[i] == pid)
            tu_children[i] = 0;
}

static inline pid_t tu_fork_exec(char **argv, int out_fd)
{
    static int registered;
    if (!registered) {
        atexit(tu_kill_children);
        registered = 1;
    }
    pid_t pid = fork();
    if (pid > 0) {
        for (int i = 0; i < 64; i++) {
            if (tu_children[i] == 0) {
                tu_children[i] = pid;
                break;
            }
        }
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* and if the test itself dies */
        /* Real-time priority where allowed, else a better nice level; both
         * fail quietly for an unprivileged user. The tools sleep between
         * events, so they cannot starve the machine. */
        struct sched_param sp = {.sched_priority = 10};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
            setpriority(PRIO_PROCESS, 0, -10);
        if (out_fd >= 0)
            dup2(out_fd, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Starts tool (a name under the build dir) with the arguments in fmt and
 * waits (at most 10 s) for its "listening on HOST:PORT" line. 0 or -1. */
static inline int tu_start(tproc_t *p, const char *tool, const char *fmt, ...)
{
    char line[2048], *argv[64];
    int n = snprintf(line, sizeof(line), "%s/%s ", tu_bin_dir(), tool);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    tu_split(line, argv, 64);
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    p->pid = tu_fork_exec(argv, fds[1]);
    close(fds[1]);
    p->out_fd = fds[0];
    p->port = 0;
    char buf[1024];
    size_t len = 0;
    double deadline = tu_now() + 10;
    while (tu_now() < deadline && len + 1 < sizeof(buf)) {
        struct pollfd pfd = {p->out_fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0)
            continue;
        ssize_t r = read(p->out_fd, buf + len, 1);
        if (r <= 0)
            break;
        len++;
        buf[len] = 0;
        if (buf[len - 1] == '\n' && strstr(buf, "listening on ")) {
            char *colon = strrchr(buf, ':');
            p->port = colon ? atoi(colon + 1) : 0;
            break;
        }
    }
    return p->port > 0 ? 0 : -1;
}

/* Reads the next stdout line of p (at most 5 s), e.g. the control address. */
static inline int tu_read_line(tproc_t *p, char *buf, size_t cap)
{
    size_t len = 0;
    double deadline = tu_now() + 5;
    while (tu_now() < deadline && len + 1 < cap) {
        struct pollfd pfd = {p->out_fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0)
            continue;
        if (read(p->out_fd, buf + len, 1) <= 0)
            break;
        if (buf[len++] == '\n')
            break;
    }
    buf[len] = 0;
    return len ? 0 : -1;
}

static inline void tu_stop(tproc_t *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGTERM);
    int status;
    for (int i = 0; i < 50; i++) {
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            tu_forget_child(p->pid);
            p->pid = 0;
            close(p->out_fd);
            return;
        }
        usleep(20000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    tu_forget_child(p->pid);
    p->pid = 0;
    close(p->out_fd);
}

/* Runs igbench with the arguments in fmt (plus --json and --quiet), waits
 * at most 60 s and returns its JSON report (new reference), or NULL. */
static inline json_t *tu_igbench(const char *fmt, ...)
{
    static int seq;
    char json_path[256];
    snprintf(json_path, sizeof(json_path), "/tmp/igbench-test-%d-%d.json", (int)getpid(), seq++);
    unlink(json_path);
    char line[2048], *argv[80];
    int n = snprintf(line, sizeof(line), "%s/igbench --quiet --json %s ", tu_bin_dir(), json_path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    tu_split(line, argv, 80);
    pid_t pid = tu_fork_exec(argv, -1);
    int status = -1;
    double deadline = tu_now() + 60;
    while (tu_now() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            tu_forget_child(pid);
            break;
        }
        usleep(10000);
        status = -1;
    }
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        tu_forget_child(pid);
        return NULL;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return NULL;
    json_error_t err;
    json_t *root = json_load_file(json_path, 0, &err);
    unlink(json_path);
    return root;
}

/* A number from the report at a path of keys ("latency_ms", "e2e", "p50"),
 * NAN when absent. */
static inline double tu_num(json_t *root, ...)
{
    va_list ap;
    va_start(ap, root);
    json_t *v = root;
    for (const char *k = va_arg(ap, const char *); k && v; k = va_arg(ap, const char *))
        v = json_object_get(v, k);
    va_end(ap);
    return json_is_number(v) ? json_number_value(v) : (0.0 / 0.0);
}

#define TU_NUM(root, ...) tu_num(root, __VA_ARGS__, (const char *)NULL)

static inline int tu_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double tu_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), tu_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Sends one line to a unix control socket and returns the answer line in
 * out. 0 or -1. */
static inline int tu_control(const char *path, const char *cmd, char *out, size_t cap)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    char line[256];
    int n = snprintf(line, sizeof(line), "%s\n", cmd);
    if (write(fd, line, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    double deadline = tu_now() + 5;
    while (tu_now() < deadline && len + 1 < cap) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0)
            continue;
        if (read(fd, out + len, 1) <= 0)
            break;
        if (out[len++] == '\n')
            break;
    }
    out[len] = 0;
    close(fd);
    return len ? 0 : -1;
}

#endif
