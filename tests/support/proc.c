#include "proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testclient.h"

#define MAX_CHILDREN 64

static pid_t children[MAX_CHILDREN];
static int nchildren;
static int atexit_set;

static void kill_children(void)
{
    for (int i = 0; i < nchildren; i++) {
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
        }
    }
}

static void forget_child(pid_t pid)
{
    for (int i = 0; i < nchildren; i++) {
        if (children[i] == pid)
            children[i] = 0;
    }
}

const char *ig_proc_bin(const char *name)
{
    static char buf[1024];
    const char *dir = getenv("IG_BIN_DIR");
    snprintf(buf, sizeof(buf), "%s/%s", dir ? dir : ".", name);
    return buf;
}

int ig_proc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int ig_proc_start(ig_proc_t *p, char *const argv[], int quiet)
{
    if (!atexit_set) {
        atexit(kill_children);
        atexit_set = 1;
    }
    p->port = 0;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (quiet) {
            FILE *devnull = fopen("/dev/null", "w");
            if (devnull != NULL)
                dup2(fileno(devnull), 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    p->pid = pid;
    if (nchildren < MAX_CHILDREN)
        children[nchildren++] = pid;
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int ig_proc_wait_listening(ig_proc_t *p, int port, int timeout_ms)
{
    long long end = ig_tc_now_ms() + timeout_ms;
    while (ig_tc_now_ms() < end) {
        int status;
        if (p->pid > 0 && waitpid(p->pid, &status, WNOHANG) == p->pid) {
            forget_child(p->pid);
            p->pid = 0;
            return -1;
        }
        ig_tc_t *tc = ig_tc_connect(port);
        if (tc != NULL) {
            ig_tc_close(tc);
            p->port = port;
            return 0;
        }
        sleep_ms(20);
    }
    return -1;
}

int ig_proc_wait_status(int port, const char *path, int status, int timeout_ms)
{
    long long end = ig_tc_now_ms() + timeout_ms;
    char raw[512];
    snprintf(raw, sizeof(raw), "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    while (ig_tc_now_ms() < end) {
        ig_tc_response_t r;
        if (ig_tc_request(port, raw, &r, 2000) == 0) {
            int got = r.status;
            ig_tc_response_free(&r);
            if (got == status)
                return 0;
        }
        sleep_ms(50);
    }
    return -1;
}

int ig_proc_stop(ig_proc_t *p, int sig, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, sig);
    long long end = ig_tc_now_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid)
            break;
        if (ig_tc_now_ms() >= end) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            forget_child(p->pid);
            p->pid = 0;
            return -1;
        }
        sleep_ms(10);
    }
    forget_child(p->pid);
    p->pid = 0;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

const char *ig_proc_temp_file(const char *text, const char *suffix)
{
    static char paths[8][256];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 256, "/tmp/igtest-XXXXXX%s", suffix ? suffix : "");
    int fd = mkstemps(path, suffix ? (int)strlen(suffix) : 0);
    if (fd < 0)
        return NULL;
    size_t len = strlen(text);
    if (write(fd, text, len) != (ssize_t)len) {
        close(fd);
        return NULL;
    }
    close(fd);
    return path;
}
