#include "proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testclient.h"

/* Captured output is kept whole: tests search all of it. */
#define LOG_MAX (256 * 1024)
#define MAX_CHILDREN 64

/* ---- children killed at exit --------------------------------------------- */

static pid_t children[MAX_CHILDREN];
static int atexit_set;

static void kill_children(void)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
    }
}

static void track_child(pid_t pid)
{
    if (!atexit_set) {
        atexit(kill_children);
        atexit_set = 1;
    }
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] == 0) {
            children[i] = pid;
            return;
        }
    }
}

static void forget_child(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i] == pid)
            children[i] = 0;
    }
}

/* Records a reaped child's wait status. */
static int reaped(ig_proc_t *p, int st)
{
    forget_child(p->pid);
    p->pid = 0;
    p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return p->status;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- start ---------------------------------------------------------------- */

const char *ig_proc_bin(const char *name)
{
    static char buf[1024];
    char self[1024] = ".";
    const char *dir = getenv("IG_BIN_DIR");
    if (dir == NULL) {
        /* Run by hand, outside ctest: the test binaries live in the build
         * directory, beside the programs they start. */
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 1] = '\0';
        char *slash = strrchr(self, '/');
        if (n > 0 && slash != NULL)
            *slash = '\0';
        else
            strcpy(self, ".");
        dir = self;
    }
    int n = snprintf(buf, sizeof(buf), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return NULL; /* a path this long is no binary of ours */
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

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int ig_proc_start(ig_proc_t *p, char *const argv[], int flags)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    memset(p, 0, sizeof(*p));
    p->status = -1;
    p->out_fd = p->err_fd = -1;
    if ((flags & IG_PROC_PIPE_OUT) && (pipe(out) != 0 || (p->out = malloc(LOG_MAX)) == NULL))
        goto fail;
    if ((flags & IG_PROC_PIPE_ERR) && (pipe(err) != 0 || (p->err = malloc(LOG_MAX)) == NULL))
        goto fail;
    if (p->out)
        p->out[0] = '\0';
    if (p->err)
        p->err[0] = '\0';
    pid_t pid = fork();
    if (pid < 0)
        goto fail;
    if (pid == 0) {
        if (flags & IG_PROC_BOOST) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            /* The machine is shared: a tool waiting for a CPU would add the
             * wait to every figure it measures. */
            struct sched_param sp = {.sched_priority = 10};
            if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
                (void)setpriority(PRIO_PROCESS, 0, -10);
        }
        if (out[1] >= 0)
            dup2(out[1], 1);
        if (err[1] >= 0) {
            dup2(err[1], 2);
        } else if (flags & IG_PROC_QUIET) {
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0)
                dup2(devnull, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    p->pid = pid;
    track_child(pid);
    close_fd(&out[1]);
    close_fd(&err[1]);
    p->out_fd = out[0];
    p->err_fd = err[0];
    return 0;

fail:
    close_fd(&out[0]);
    close_fd(&out[1]);
    close_fd(&err[0]);
    close_fd(&err[1]);
    free(p->out);
    free(p->err);
    p->out = p->err = NULL;
    return -1;
}

int ig_proc_start_bin(ig_proc_t *p, const char *name, const char *const *args, int flags)
{
    char *argv[64];
    int n = 0;
    argv[n++] = strdup(ig_proc_bin(name));
    for (int i = 0; args != NULL && args[i] != NULL && n < 63; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    int rc = argv[0] != NULL ? ig_proc_start(p, argv, flags) : -1;
    free(argv[0]);
    return rc;
}

/* ---- captured output ------------------------------------------------------ */

int ig_proc_pump(ig_proc_t *p, int ms)
{
    struct pollfd fds[2] = {{p->out_fd, POLLIN, 0}, {p->err_fd, POLLIN, 0}};
    int open = (p->out_fd >= 0) + (p->err_fd >= 0);
    if (open == 0) {
        if (ms > 0)
            sleep_ms(ms < 20 ? ms : 20);
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
        /* When full, the rest is read and dropped so that the child never
         * blocks on a full pipe. */
        char spill[4096];
        char *dst = *len < LOG_MAX - 1 ? buf + *len : spill;
        size_t room = *len < LOG_MAX - 1 ? LOG_MAX - 1 - *len : sizeof(spill);
        ssize_t r = read(*fd, dst, room);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue; /* a signal (a child's SIGCHLD): the pipe is still open */
        if (r <= 0) {
            close_fd(fd);
            continue;
        }
        if (dst != spill) {
            *len += (size_t)r;
            buf[*len] = '\0';
        }
    }
    return (p->out_fd >= 0) + (p->err_fd >= 0);
}

int ig_proc_wait_log(ig_proc_t *p, const char *needle, int timeout_ms)
{
    if (p->err == NULL)
        return -1;
    long long end = ig_tc_now_ms() + timeout_ms;
    while (strstr(p->err, needle) == NULL) {
        long long left = end - ig_tc_now_ms();
        if (left <= 0 || (ig_proc_pump(p, (int)left) == 0 && strstr(p->err, needle) == NULL))
            return -1;
    }
    return 0;
}

int ig_proc_wait_announce(ig_proc_t *p, int from_stderr, int timeout_ms)
{
    static const char needle[] = "listening on ";
    if ((from_stderr ? p->err : p->out) == NULL)
        return -1;
    long long end = ig_tc_now_ms() + timeout_ms;
    for (;;) {
        /* stdout is searched from its unread part only. */
        const char *from = from_stderr ? p->err : p->out + p->outpos;
        const char *at = strstr(from, needle);
        const char *nl = at ? strchr(at, '\n') : NULL;
        if (nl != NULL) {
            /* The port follows the last ':' of the address (the first word). */
            const char *addr = at + strlen(needle);
            const char *colon = addr + strcspn(addr, " \n");
            while (colon > addr && colon[-1] != ':')
                colon--;
            p->port = colon > addr ? atoi(colon) : 0;
            if (!from_stderr)
                p->outpos = (size_t)(nl + 1 - p->out);
            return p->port > 0 ? 0 : -1;
        }
        long long left = end - ig_tc_now_ms();
        if (left <= 0 || (from_stderr ? p->err_fd : p->out_fd) < 0)
            return -1;
        ig_proc_pump(p, left < 200 ? (int)left : 200);
    }
}

int ig_proc_read_line(ig_proc_t *p, char *buf, size_t cap, int timeout_ms)
{
    if (p->out == NULL || cap == 0)
        return -1;
    long long end = ig_tc_now_ms() + timeout_ms;
    for (;;) {
        const char *from = p->out + p->outpos;
        const char *nl = strchr(from, '\n');
        long long left = end - ig_tc_now_ms();
        int ended = p->out_fd < 0;
        if (nl != NULL || ((left <= 0 || ended) && *from != '\0')) {
            /* A full line, or what came of one before the time or the
             * stream ran out. */
            size_t n = nl ? (size_t)(nl + 1 - from) : strlen(from);
            if (n > cap - 1)
                n = cap - 1;
            memcpy(buf, from, n);
            buf[n] = '\0';
            p->outpos += n;
            return 0;
        }
        if (left <= 0 || ended) {
            buf[0] = '\0';
            return -1;
        }
        ig_proc_pump(p, left < 200 ? (int)left : 200);
    }
}

/* ---- waits ---------------------------------------------------------------- */

int ig_proc_wait_listening(ig_proc_t *p, int port, int timeout_ms)
{
    long long end = ig_tc_now_ms() + timeout_ms;
    while (ig_tc_now_ms() < end) {
        int status;
        if (p->pid > 0 && waitpid(p->pid, &status, WNOHANG) == p->pid) {
            reaped(p, status);
            return -1;
        }
        ig_tc_t *tc = ig_tc_connect(port);
        if (tc != NULL) {
            ig_tc_close(tc);
            p->port = port;
            return 0;
        }
        if (p->out_fd >= 0 || p->err_fd >= 0)
            ig_proc_pump(p, 20);
        else
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

/* Reads the pipes to their end after the exit; bounded, since a grandchild
 * may still hold them open. */
static void drain(ig_proc_t *p)
{
    long long end = ig_tc_now_ms() + 2000;
    while (ig_tc_now_ms() < end && ig_proc_pump(p, 100) > 0)
        ;
}

int ig_proc_wait_exit(ig_proc_t *p, int timeout_ms)
{
    if (p->pid <= 0)
        return p->status;
    long long end = ig_tc_now_ms() + timeout_ms;
    for (;;) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            reaped(p, st);
            drain(p);
            return p->status;
        }
        long long left = end - ig_tc_now_ms();
        if (left <= 0)
            return -1;
        if (p->out_fd >= 0 || p->err_fd >= 0)
            ig_proc_pump(p, left < 10 ? (int)left : 10);
        else
            sleep_ms(left < 10 ? (int)left : 10);
    }
}

/* SIGKILL if still running, reap, close the pipes. */
static void kill_and_close(ig_proc_t *p)
{
    if (p->pid > 0) {
        int st;
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
        reaped(p, st);
    }
    close_fd(&p->out_fd);
    close_fd(&p->err_fd);
}

int ig_proc_stop(ig_proc_t *p, int sig, int timeout_ms)
{
    int rc = -1;
    if (p->pid > 0) {
        if (sig != 0)
            kill(p->pid, sig);
        rc = ig_proc_wait_exit(p, timeout_ms);
    }
    kill_and_close(p);
    return rc;
}

void ig_proc_dispose(ig_proc_t *p)
{
    kill_and_close(p);
    free(p->out);
    free(p->err);
    p->out = p->err = NULL;
    p->outlen = p->errlen = p->outpos = 0;
}

/* ---- sockets and files ---------------------------------------------------- */

int ig_proc_connect(int port)
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

#define MAX_TEMP_FILES 256

static char *temp_files[MAX_TEMP_FILES]; /* removed when the test exits */
static int ntemp_files;

static void remove_temp_files(void)
{
    for (int i = 0; i < ntemp_files; i++) {
        unlink(temp_files[i]);
        free(temp_files[i]);
    }
    ntemp_files = 0;
}

const char *ig_proc_temp_file(const char *text, const char *suffix)
{
    static char paths[8][256];
    static int next;
    static int registered;
    char *path = paths[next++ % 8];
    if (!registered) {
        atexit(remove_temp_files);
        registered = 1;
    }
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
    if (ntemp_files < MAX_TEMP_FILES)
        temp_files[ntemp_files++] = strdup(path);
    return path;
}

int ig_proc_capture(const char *cmd, char *out, size_t cap)
{
    if (cap > 0)
        out[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return -1;
    size_t n = cap > 0 ? fread(out, 1, cap - 1, f) : 0;
    if (cap > 0)
        out[n] = '\0';
    int st = pclose(f);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
