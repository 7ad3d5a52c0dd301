#ifndef IG_TESTCLIENT_H
#define IG_TESTCLIENT_H

/*
 * A small blocking HTTP/1.1 test client over loopback sockets, for tests.
 * It sends raw bytes (so that tests can send malformed requests) and parses
 * responses on its own (independently of the server's parser): status line,
 * headers, and a body framed by Content-Length, chunked encoding, or the
 * connection close. Every call is bounded by a timeout.
 */

#include <stddef.h>

typedef struct ig_tc_s ig_tc_t;

#define IG_TC_MAX_HEADERS 64

typedef struct {
    int status; /* 0 when no response was read */
    int minor;  /* HTTP/1.<minor> */
    char reason[64];
    unsigned nheaders;
    struct {
        char *name;
        char *value;
    } headers[IG_TC_MAX_HEADERS];
    char *body; /* NUL-terminated, de-chunked; malloc'ed */
    size_t body_len;
    size_t body_cap; /* private */
    int chunked;
    unsigned nchunks; /* data chunks received (chunked only) */
} ig_tc_response_t;

/* Connects to 127.0.0.1:port or a Unix socket. NULL on failure. */
ig_tc_t *ig_tc_connect(int port);
/* Connects to ip (IPv4, dotted) and port. NULL on failure. */
ig_tc_t *ig_tc_connect_ip(const char *ip, int port);
ig_tc_t *ig_tc_connect_unix(const char *path);
void ig_tc_close(ig_tc_t *tc);
int ig_tc_fd(const ig_tc_t *tc);

/* Sends all bytes; 0 or -1. */
int ig_tc_send(ig_tc_t *tc, const void *data, size_t len);
int ig_tc_sends(ig_tc_t *tc, const char *s);

/* Sends "POST path" with Host and Content-Length and then body (a string),
 * without reading the answer; 0 or -1. */
int ig_tc_send_post(ig_tc_t *tc, const char *path, const char *body);

/*
 * Reads one response (skipping 1xx interim responses unless keep_1xx).
 * head: the request was HEAD (no body follows). 0 on success, -1 on
 * timeout, malformed response or a close before the response ended.
 * Bytes after the response stay buffered for the next call.
 */
int ig_tc_read_response(ig_tc_t *tc, ig_tc_response_t *resp, int timeout_ms);
int ig_tc_read_response_ex(ig_tc_t *tc, ig_tc_response_t *resp, int timeout_ms, int head,
                           int keep_1xx);
void ig_tc_response_free(ig_tc_response_t *resp);

/* Case-insensitive header lookup in a response, or NULL. */
const char *ig_tc_header(const ig_tc_response_t *resp, const char *name);

/* The number after "key=" in an x-infergate-route header value ("policy=P;
 * key=value; ..."), where key starts a field; -1 when there is none or
 * route is NULL. */
double ig_tc_route_num(const char *route, const char *key);

/* Reads exactly n raw bytes (or fewer at EOF). Returns bytes read or -1. */
long ig_tc_read_raw(ig_tc_t *tc, char *buf, size_t n, int timeout_ms);

/* 1 when the peer closes (EOF or reset) within timeout_ms with no further
 * bytes, 0 when it stays open, -1 when unexpected bytes arrive. */
int ig_tc_wait_closed(ig_tc_t *tc, int timeout_ms);

/* One-shot: connect, send raw, read one response, close. 0 or -1. */
int ig_tc_request(int port, const char *raw, ig_tc_response_t *resp, int timeout_ms);

/* Milliseconds on a monotonic clock. */
long long ig_tc_now_ms(void);

#endif
