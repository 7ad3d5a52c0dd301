#include "testclient.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct ig_tc_s {
    int fd;
    char *buf;
    size_t len, cap;
    int eof;
};

long long ig_tc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static ig_tc_t *wrap(int fd)
{
    ig_tc_t *tc = calloc(1, sizeof(*tc));
    if (tc == NULL) {
        close(fd);
        return NULL;
    }
    tc->fd = fd;
    return tc;
}

/* A stream socket connected to a (of its own family), or NULL. */
static ig_tc_t *connect_to(const struct sockaddr *a, socklen_t alen)
{
    signal(SIGPIPE, SIG_IGN);
    int fd = socket(a->sa_family, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    if (connect(fd, a, alen) < 0) {
        close(fd);
        return NULL;
    }
    if (a->sa_family == AF_INET) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return wrap(fd);
}

ig_tc_t *ig_tc_connect(int port)
{
    return ig_tc_connect_ip("127.0.0.1", port);
}

ig_tc_t *ig_tc_connect_ip(const char *ip, int port)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
        return NULL;
    return connect_to((struct sockaddr *)&a, sizeof(a));
}

ig_tc_t *ig_tc_connect_unix(const char *path)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(a.sun_path))
        return NULL;
    strcpy(a.sun_path, path);
    return connect_to((struct sockaddr *)&a, sizeof(a));
}

void ig_tc_close(ig_tc_t *tc)
{
    if (tc == NULL)
        return;
    close(tc->fd);
    free(tc->buf);
    free(tc);
}

int ig_tc_fd(const ig_tc_t *tc)
{
    return tc->fd;
}

int ig_tc_send(ig_tc_t *tc, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = send(tc->fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int ig_tc_sends(ig_tc_t *tc, const char *s)
{
    return ig_tc_send(tc, s, strlen(s));
}

int ig_tc_send_post(ig_tc_t *tc, const char *path, const char *body)
{
    /* One send, as a client writes a small request. */
    size_t blen = strlen(body), cap = strlen(path) + blen + 128;
    char *raw = malloc(cap);
    if (raw == NULL)
        return -1;
    int n = snprintf(raw, cap, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n%s", path,
                     blen, body);
    int rc = n > 0 && (size_t)n < cap ? ig_tc_send(tc, raw, (size_t)n) : -1;
    free(raw);
    return rc;
}

/* Reads more bytes into the buffer before the deadline. 1 read, 0 EOF,
 * -1 timeout or error. */
static int fill(ig_tc_t *tc, long long deadline)
{
    if (tc->eof)
        return 0;
    long long left = deadline - ig_tc_now_ms();
    if (left < 0)
        left = 0; /* still look once: a zero timeout is a poll */
    struct pollfd pfd = {.fd = tc->fd, .events = POLLIN};
    int pr = poll(&pfd, 1, (int)left);
    if (pr <= 0)
        return -1;
    if (tc->cap - tc->len < 65536) {
        size_t cap = tc->cap ? tc->cap * 2 : 131072;
        char *nb = realloc(tc->buf, cap);
        if (nb == NULL)
            return -1;
        tc->buf = nb;
        tc->cap = cap;
    }
    ssize_t n = recv(tc->fd, tc->buf + tc->len, tc->cap - tc->len - 1, 0);
    if (n < 0) {
        if (errno == EINTR || errno == EAGAIN)
            return 1;
        tc->eof = 1;
        return 0;
    }
    if (n == 0) {
        tc->eof = 1;
        return 0;
    }
    tc->len += (size_t)n;
    return 1;
}

static void consume(ig_tc_t *tc, size_t n)
{
    memmove(tc->buf, tc->buf + n, tc->len - n);
    tc->len -= n;
}

/* Finds CRLF at or after off; returns its index or -1. */
static long find_crlf(const ig_tc_t *tc, size_t off)
{
    for (size_t i = off; i + 1 < tc->len; i++)
        if (tc->buf[i] == '\r' && tc->buf[i + 1] == '\n')
            return (long)i;
    return -1;
}

static int need(ig_tc_t *tc, size_t n, long long deadline)
{
    while (tc->len < n)
        if (fill(tc, deadline) <= 0)
            return -1;
    return 0;
}

static int append_body(ig_tc_response_t *r, const char *d, size_t n)
{
    if (r->body == NULL || r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 256;
        while (cap < r->body_len + n + 1)
            cap *= 2;
        char *nb = realloc(r->body, cap);
        if (nb == NULL)
            return -1;
        r->body = nb;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, d, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}

static int read_head(ig_tc_t *tc, ig_tc_response_t *r, long long deadline)
{
    long end;
    for (;;) {
        end = -1;
        for (size_t i = 0; i + 3 < tc->len; i++) {
            if (memcmp(tc->buf + i, "\r\n\r\n", 4) == 0) {
                end = (long)i;
                break;
            }
        }
        if (end >= 0)
            break;
        if (fill(tc, deadline) <= 0)
            return -1;
    }
    tc->buf[end + 2] = '\0';
    char *line = tc->buf;
    char *nl = strstr(line, "\r\n");
    *nl = '\0';
    if (sscanf(line, "HTTP/1.%d %d", &r->minor, &r->status) != 2)
        return -1;
    const char *sp = strchr(line + 9, ' ');
    snprintf(r->reason, sizeof(r->reason), "%s", sp != NULL ? sp + 1 : "");
    line = nl + 2;
    while (*line) {
        nl = strstr(line, "\r\n");
        *nl = '\0';
        char *colon = strchr(line, ':');
        if (colon == NULL || r->nheaders >= IG_TC_MAX_HEADERS)
            return -1;
        *colon = '\0';
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        r->headers[r->nheaders].name = strdup(line);
        r->headers[r->nheaders].value = strdup(v);
        r->nheaders++;
        line = nl + 2;
    }
    consume(tc, (size_t)end + 4);
    return 0;
}

static void reset(ig_tc_response_t *r)
{
    ig_tc_response_free(r);
    memset(r, 0, sizeof(*r));
}

int ig_tc_read_response_ex(ig_tc_t *tc, ig_tc_response_t *r, int timeout_ms, int head, int keep_1xx)
{
    long long deadline = ig_tc_now_ms() + timeout_ms;
    memset(r, 0, sizeof(*r));
    for (;;) {
        if (read_head(tc, r, deadline) < 0)
            return -1;
        if (r->status >= 200 || keep_1xx)
            break;
        reset(r);
    }
    if (append_body(r, "", 0) < 0)
        return -1;
    if (head || r->status == 204 || r->status == 304 || r->status < 200)
        return 0;
    const char *te = ig_tc_header(r, "transfer-encoding");
    const char *cl = ig_tc_header(r, "content-length");
    if (te != NULL && strcasecmp(te, "chunked") == 0) {
        r->chunked = 1;
        for (;;) {
            long e;
            while ((e = find_crlf(tc, 0)) < 0)
                if (fill(tc, deadline) <= 0)
                    return -1;
            char *endp;
            unsigned long size = strtoul(tc->buf, &endp, 16);
            if (endp == tc->buf)
                return -1;
            consume(tc, (size_t)e + 2);
            if (size == 0) {
                /* trailers until an empty line */
                for (;;) {
                    while ((e = find_crlf(tc, 0)) < 0)
                        if (fill(tc, deadline) <= 0)
                            return -1;
                    consume(tc, (size_t)e + 2);
                    if (e == 0)
                        return 0;
                }
            }
            if (need(tc, size + 2, deadline) < 0)
                return -1;
            if (tc->buf[size] != '\r' || tc->buf[size + 1] != '\n')
                return -1;
            if (append_body(r, tc->buf, size) < 0)
                return -1;
            r->nchunks++;
            consume(tc, size + 2);
        }
    }
    if (cl != NULL) {
        size_t n = strtoul(cl, NULL, 10);
        if (need(tc, n, deadline) < 0)
            return -1;
        if (append_body(r, tc->buf, n) < 0)
            return -1;
        consume(tc, n);
        return 0;
    }
    /* Delimited by the close. */
    for (;;) {
        int f = fill(tc, deadline);
        if (f < 0)
            return -1;
        if (f == 0)
            break;
    }
    if (append_body(r, tc->buf, tc->len) < 0)
        return -1;
    consume(tc, tc->len);
    return 0;
}

int ig_tc_read_response(ig_tc_t *tc, ig_tc_response_t *resp, int timeout_ms)
{
    return ig_tc_read_response_ex(tc, resp, timeout_ms, 0, 0);
}

void ig_tc_response_free(ig_tc_response_t *r)
{
    for (unsigned i = 0; i < r->nheaders; i++) {
        free(r->headers[i].name);
        free(r->headers[i].value);
    }
    free(r->body);
    r->nheaders = 0;
    r->body = NULL;
    r->body_cap = 0;
}

const char *ig_tc_header(const ig_tc_response_t *r, const char *name)
{
    for (unsigned i = 0; i < r->nheaders; i++)
        if (strcasecmp(r->headers[i].name, name) == 0)
            return r->headers[i].value;
    return NULL;
}

double ig_tc_route_num(const char *route, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "%s=", key);
    const char *p = route;
    while (p != NULL && (p = strstr(p, pat)) != NULL) {
        if (p == route || p[-1] == ' ' || p[-1] == ';')
            return atof(p + strlen(pat));
        p++;
    }
    return -1;
}

long ig_tc_read_raw(ig_tc_t *tc, char *buf, size_t n, int timeout_ms)
{
    long long deadline = ig_tc_now_ms() + timeout_ms;
    while (tc->len < n) {
        int f = fill(tc, deadline);
        if (f < 0)
            return -1;
        if (f == 0)
            break;
    }
    size_t k = tc->len < n ? tc->len : n;
    memcpy(buf, tc->buf, k);
    consume(tc, k);
    return (long)k;
}

int ig_tc_wait_closed(ig_tc_t *tc, int timeout_ms)
{
    long long deadline = ig_tc_now_ms() + timeout_ms;
    if (tc->len > 0)
        return -1;
    int f = fill(tc, deadline);
    if (f == 0)
        return 1;
    if (f < 0)
        return 0;
    return -1;
}

int ig_tc_request(int port, const char *raw, ig_tc_response_t *resp, int timeout_ms)
{
    ig_tc_t *tc = ig_tc_connect(port);
    if (tc == NULL)
        return -1;
    int rc = ig_tc_sends(tc, raw);
    if (rc == 0)
        rc = ig_tc_read_response(tc, resp, timeout_ms);
    ig_tc_close(tc);
    return rc;
}
