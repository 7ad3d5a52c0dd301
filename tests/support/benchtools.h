#ifndef IG_TEST_BENCHTOOLS_H
#define IG_TEST_BENCHTOOLS_H

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

#include "proc.h"

#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double tu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Starts the tool of the build with the arguments in fmt, split on spaces
 * (no quoting), as a process under measurement (IG_PROC_BOOST) with flags.
 * 0 or -1, as ig_proc_start. */
static inline int tu_vspawn(ig_proc_t *p, int flags, const char *tool, const char *fmt, va_list ap)
{
    char line[2048], *argv[80];
    int n = snprintf(line, sizeof(line), "%s ", ig_proc_bin(tool));
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    int argc = 0;
    for (char *save = NULL, *t = strtok_r(line, " ", &save); t && argc < 79;
         t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    return ig_proc_start(p, argv, flags | IG_PROC_BOOST);
}

static inline int tu_spawn(ig_proc_t *p, int flags, const char *tool, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tu_vspawn(p, flags, tool, fmt, ap);
    va_end(ap);
    return rc;
}

/* Starts tool (a name under the build dir) with the arguments in fmt and
 * waits (at most 10 s) for its "listening on HOST:PORT" line on stdout
 * (p->port); later stdout lines come with ig_proc_read_line. 0 or -1;
 * tu_stop it either way. */
static inline int tu_start(ig_proc_t *p, const char *tool, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tu_vspawn(p, IG_PROC_PIPE_OUT, tool, fmt, ap);
    va_end(ap);
    return rc == 0 ? ig_proc_wait_announce(p, 0, 10000) : -1;
}

/* SIGTERM, at most 1 s to exit, then SIGKILL; frees what p holds. */
static inline void tu_stop(ig_proc_t *p)
{
    ig_proc_stop(p, SIGTERM, 1000);
    ig_proc_dispose(p);
}

/* Runs igbench with the arguments in fmt (plus --json and --quiet), waits
 * at most 60 s and returns its JSON report (new reference), or NULL. */
static inline json_t *tu_igbench(const char *fmt, ...)
{
    static int seq;
    char json_path[256], args[1800];
    snprintf(json_path, sizeof(json_path), "/tmp/igbench-test-%d-%d.json", (int)getpid(), seq++);
    unlink(json_path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    ig_proc_t p;
    if (tu_spawn(&p, 0, "igbench", "--quiet --json %s %s", json_path, args) != 0)
        return NULL;
    int rc = ig_proc_wait_exit(&p, 60000);
    ig_proc_dispose(&p); /* kills it on a timeout */
    if (rc != 0)
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
    size_t plen = strlen(path);
    if (plen >= sizeof(sa.sun_path)) {
        close(fd);
        return -1;
    }
    memcpy(sa.sun_path, path, plen + 1);
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
