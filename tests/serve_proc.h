/*
 * Test helpers for the serve integration tests: start the real infergate
 * binary with its stdout and stderr on pipes, wait for log lines, send one
 * HTTP request over loopback (with the shared test client), wait for the exit. Every wait is
 * bounded. Static functions: each test file includes its own copy.
 */
#ifndef IG_TEST_SERVE_PROC_H
#define IG_TEST_SERVE_PROC_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testclient.h"

#define SP_LOG_MAX (256 * 1024)

typedef struct {
    pid_t pid;
    int out_fd, err_fd;
    char out[SP_LOG_MAX];
    size_t outlen;
    char err[SP_LOG_MAX];
    size_t errlen;
    int port;   /* from the "listening on" line */
    int status; /* exit status once exited, -1 before */
} sp_proc_t;

static inline long long sp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts the program at bin with argv (NULL-terminated, after argv[0]). */
static inline int sp_start_exe(sp_proc_t *p, const char *bin, const char *const *args)
{
    int out[2], err[2];
    char *argv[32];
    int n = 0;
    memset(p, 0, sizeof(*p));
    p->status = -1;
    if (pipe(out) != 0 || pipe(err) != 0)
        return -1;
    argv[n++] = (char *)bin;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        close(out[1]);
        close(err[1]);
        execv(bin, argv);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    p->out_fd = out[0];
    p->err_fd = err[0];
    return 0;
}

/* Starts IG_BIN_DIR/infergate with args (NULL-terminated, after argv[0]). */
static inline int sp_start(sp_proc_t *p, const char *const *args)
{
    return sp_start_exe(p, IG_BIN_DIR "/infergate", args);
}

/* Reads what is there on both pipes, waiting up to ms. 0 at EOF of both. */
static inline int sp_pump(sp_proc_t *p, int ms)
{
    struct pollfd fds[2] = {{p->out_fd, POLLIN, 0}, {p->err_fd, POLLIN, 0}};
    int open = (p->out_fd >= 0) + (p->err_fd >= 0);
    if (open == 0) {
        if (ms > 0)
            poll(NULL, 0, ms < 20 ? ms : 20);
        return 0;
    }
    if (poll(fds, 2, ms) <= 0)
        return open;
    for (int i = 0; i < 2; i++) {
        int *fd = i ? &p->err_fd : &p->out_fd;
        char *buf = i ? p->err : p->out;
        size_t *len = i ? &p->errlen : &p->outlen;
        if (*fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        ssize_t r = read(*fd, buf + *len, SP_LOG_MAX - 1 - *len);
        if (r <= 0) {
            close(*fd);
            *fd = -1;
            continue;
        }
        *len += (size_t)r;
        buf[*len] = '\0';
    }
    return (p->out_fd >= 0) + (p->err_fd >= 0);
}

/* Waits for needle on stderr. 0 when seen, -1 on timeout or EOF. */
static inline int sp_wait_log(sp_proc_t *p, const char *needle, int timeout_ms)
{
    long long end = sp_now_ms() + timeout_ms;
    while (strstr(p->err, needle) == NULL) {
        long long left = end - sp_now_ms();
        if (left <= 0 || (sp_pump(p, (int)left) == 0 && strstr(p->err, needle) == NULL))
            return -1;
    }
    return 0;
}

/* Waits for the "listening on http://HOST:PORT" line and reads the port. */
static inline int sp_wait_listening(sp_proc_t *p, int timeout_ms)
{
    if (sp_wait_log(p, "listening on http://", timeout_ms) != 0)
        return -1;
    const char *l = strstr(p->err, "listening on http://") + strlen("listening on http://");
    /* A full line is needed: the port may still be arriving. */
    while (strchr(l, '\n') == NULL && sp_pump(p, 1000) > 0)
        ;
    const char *colon = strchr(l, ' ');
    while (colon > l && colon[-1] != ':')
        colon--;
    p->port = atoi(colon);
    return p->port > 0 ? 0 : -1;
}

/* Waits for the exit; returns the exit status, 128+signal, or -1 on
 * timeout (the process keeps running; sp_stop kills it). Keeps draining
 * the pipes meanwhile. */
static inline int sp_wait_exit(sp_proc_t *p, int timeout_ms)
{
    long long end = sp_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            while (sp_pump(p, 100) > 0)
                ;
            p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return p->status;
        }
        long long left = end - sp_now_ms();
        if (left <= 0)
            return -1;
        sp_pump(p, left < 20 ? (int)left : 20);
    }
}

static inline void sp_stop(sp_proc_t *p)
{
    if (p->status < 0 && p->pid > 0) {
        int st;
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
        p->status = 128 + SIGKILL;
    }
    if (p->out_fd >= 0)
        close(p->out_fd);
    if (p->err_fd >= 0)
        close(p->err_fd);
    p->out_fd = p->err_fd = -1;
}

static inline int sp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One request with Connection: close through the shared test client
 * (tests/support/testclient.h); the caller frees r. 0 or -1. */
static inline int sp_request(int port, const char *method, const char *path, ig_tc_response_t *r)
{
    char raw[512];
    snprintf(raw, sizeof(raw), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n",
             method, path, strcmp(method, "POST") == 0 ? "Content-Length: 0\r\n" : "");
    memset(r, 0, sizeof(*r));
    return ig_tc_request(port, raw, r, 5000);
}

/* Writes text to a fresh temp file; returns its malloc'ed path. */
static inline char *sp_write_temp(const char *text)
{
    char tmpl[] = "/tmp/ig-serve-test-XXXXXX.json";
    int fd = mkstemps(tmpl, 5);
    if (fd < 0)
        return NULL;
    size_t len = strlen(text);
    if (write(fd, text, len) != (ssize_t)len) {
        close(fd);
        return NULL;
    }
    close(fd);
    return strdup(tmpl);
}

#endif
