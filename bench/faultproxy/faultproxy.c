/*
 * faultproxy: a TCP proxy that injects network faults between a client and a
 * server: delay and jitter per direction, a bandwidth cap, refused or
 * black-holed connections, and resets in the middle of a response. Every
 * fault can be switched at run time through a control socket (line
 * commands) or with SIGUSR1/SIGUSR2.
 *
 * Delay keeps byte order: each direction of each connection is a FIFO of
 * chunks stamped with a release time that never goes backwards, and the
 * head's release time sits in one timer queue (timerfd, µs precision) shared
 * by all connections. Nothing sleeps.
 */
#include "../lib/benchutil.h"

#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C2S = 0, S2C = 1 };
enum { REFUSE_OFF = 0, REFUSE_CLOSE, REFUSE_UNLISTEN };

#define PAUSE_BYTES (4u << 20)  /* stop reading a side with this much queued */
#define RESUME_BYTES (1u << 20) /* read again below this */

typedef struct chunk_s {
    struct chunk_s *next;
    uint64_t release;
    size_t len;
    int eof;
    char data[];
} chunk_t;

typedef struct pconn_s pconn_t;

typedef struct {
    pconn_t *pc;
    int dir;
    uv_stream_t *src, *dst;
    chunk_t *head, *tail;
    size_t queued; /* bytes read and not yet written */
    uint64_t last_release;
    uint64_t link_free; /* bandwidth model: when the "wire" is free again */
    uint64_t forwarded;
    int read_paused;
    int shut; /* EOF passed on */
    igb_tq_entry_t tq;
} dir_t;

struct pconn_s {
    uv_tcp_t client, server;
    uv_connect_t creq;
    dir_t d[2];
    int closing;
    int nclosed;
    int reset_pending;
    int blackhole;
};

typedef struct {
    uv_write_t w;
    dir_t *d;
    chunk_t *chunk;
    int reset_after_write;
} fwrite_t;

static struct {
    uv_loop_t *loop;
    igb_tq_t tq;
    igb_rng_t rng;
    igb_addr_t listen_addr, target;
    char listen_name[128];
    uv_tcp_t *server; /* the listener; NULL while "refuse unlisten" */
    double delay_ms[2], jitter_ms[2];
    double bandwidth; /* bytes/s per direction per connection, 0 = unlimited */
    int refuse;
    int drop;
    uint64_t reset_after;  /* 0 = off */
    double saved_delay[2]; /* SIGUSR1 toggles between these and 0 */
    uint64_t accepted, open, refused, dropped, resets, upstream_fail;
    uint64_t bytes[2];
    int quiet;
} g;

/* ------------------------------------------------------------------------- */
/* Connections                                                               */
/* ------------------------------------------------------------------------- */

static void free_chunks(dir_t *d)
{
    while (d->head) {
        chunk_t *c = d->head;
        d->head = c->next;
        free(c);
    }
    d->tail = NULL;
}

static void on_pc_closed(uv_handle_t *h)
{
    pconn_t *pc = h->data;
    if (++pc->nclosed == 2)
        free(pc);
}

static void pc_close(pconn_t *pc, int reset_client)
{
    if (pc->closing)
        return;
    pc->closing = 1;
    g.open--;
    for (int i = 0; i < 2; i++) {
        igb_tq_remove(&g.tq, &pc->d[i].tq);
        free_chunks(&pc->d[i]);
    }
    if (!(reset_client && uv_tcp_close_reset(&pc->client, on_pc_closed) == 0))
        uv_close((uv_handle_t *)&pc->client, on_pc_closed);
    if (uv_is_closing((uv_handle_t *)&pc->server))
        pc->nclosed++;
    else
        uv_close((uv_handle_t *)&pc->server, on_pc_closed);
}

static void dir_release(igb_tq_entry_t *e);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void dir_schedule(dir_t *d)
{
    if (d->head)
        igb_tq_add(&g.tq, &d->tq, d->head->release, dir_release);
}

static void maybe_resume(dir_t *d)
{
    if (d->read_paused && d->queued < RESUME_BYTES && !d->pc->closing) {
        d->read_paused = 0;
        uv_read_start(d->src, igb_on_alloc, on_read);
    }
}

static void on_shutdown(uv_shutdown_t *sd, int status)
{
    pconn_t *pc = sd->data;
    free(sd);
    if (!pc->closing && pc->d[C2S].shut && pc->d[S2C].shut)
        pc_close(pc, 0);
}

static void on_fwritten(uv_write_t *w, int status)
{
    fwrite_t *fw = (fwrite_t *)w;
    dir_t *d = fw->d;
    pconn_t *pc = d->pc;
    d->queued -= fw->chunk->len;
    free(fw->chunk);
    int reset = fw->reset_after_write;
    free(fw);
    if (pc->closing)
        return;
    if (status < 0) {
        pc_close(pc, 0);
        return;
    }
    if (reset) {
        g.resets++;
        pc_close(pc, 1);
        return;
    }
    maybe_resume(d);
}

/* Writes released chunks of d to its destination. */
static void dir_release(igb_tq_entry_t *e)
{
    dir_t *d = (dir_t *)((char *)e - offsetof(dir_t, tq));
    pconn_t *pc = d->pc;
    uint64_t now = uv_hrtime();
    while (d->head && d->head->release <= now && !pc->closing && !pc->reset_pending) {
        chunk_t *c = d->head;
        d->head = c->next;
        if (!d->head)
            d->tail = NULL;
        if (c->eof) {
            free(c);
            d->shut = 1;
            uv_shutdown_t *sd = malloc(sizeof(*sd));
            if (sd) {
                sd->data = pc;
                if (uv_shutdown(sd, d->dst, on_shutdown) == 0)
                    continue;
                free(sd);
            }
            pc_close(pc, 0);
            return;
        }
        fwrite_t *fw = calloc(1, sizeof(*fw));
        if (!fw) {
            free(c);
            pc_close(pc, 0);
            return;
        }
        fw->d = d;
        fw->chunk = c;
        size_t n = c->len;
        if (d->dir == S2C && g.reset_after && d->forwarded + n >= g.reset_after) {
            /* Pass exactly reset_after bytes, then RST the client. */
            n = (size_t)(g.reset_after - d->forwarded);
            fw->reset_after_write = 1;
            pc->reset_pending = 1;
        }
        d->forwarded += n;
        g.bytes[d->dir] += n;
        uv_buf_t buf = uv_buf_init(c->data, (unsigned)n);
        if (uv_write(&fw->w, d->dst, &buf, 1, on_fwritten) != 0) {
            d->queued -= c->len;
            free(c);
            free(fw);
            pc_close(pc, 0);
            return;
        }
    }
    if (!pc->closing && !pc->reset_pending)
        dir_schedule(d);
}

static uint64_t release_time(dir_t *d, size_t len)
{
    uint64_t now = uv_hrtime();
    double ms = g.delay_ms[d->dir];
    if (g.jitter_ms[d->dir] > 0)
        ms += g.jitter_ms[d->dir] * (2.0 * igb_rng_double(&g.rng) - 1.0);
    if (ms < 0)
        ms = 0;
    uint64_t t = now + (uint64_t)(ms * 1e6);
    if (g.bandwidth > 0 && len) {
        /* The chunk reaches the far end once the link has carried it. */
        uint64_t start = t > d->link_free ? t : d->link_free;
        d->link_free = start + (uint64_t)((double)len / g.bandwidth * 1e9);
        t = d->link_free;
    }
    /* Jitter must not reorder bytes. */
    if (t < d->last_release)
        t = d->last_release;
    d->last_release = t;
    return t;
}

static void dir_push(dir_t *d, const char *data, size_t len, int eof)
{
    chunk_t *c = malloc(sizeof(*c) + len);
    if (!c) {
        pc_close(d->pc, 0);
        return;
    }
    c->next = NULL;
    c->len = len;
    c->eof = eof;
    if (len)
        memcpy(c->data, data, len);
    c->release = release_time(d, len);
    d->queued += len;
    int was_empty = d->head == NULL;
    if (d->tail)
        d->tail->next = c;
    else
        d->head = c;
    d->tail = c;
    if (was_empty && !d->pc->reset_pending)
        dir_schedule(d);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pconn_t *pc = s->data;
    if (pc->closing)
        return;
    if (pc->blackhole) {
        if (nread < 0)
            pc_close(pc, 0);
        return; /* read and forget */
    }
    dir_t *d = s == (uv_stream_t *)&pc->client ? &pc->d[C2S] : &pc->d[S2C];
    if (nread == UV_EOF) {
        uv_read_stop(s);
        dir_push(d, NULL, 0, 1);
        return;
    }
    if (nread < 0) {
        /* A reset on one side resets the other. */
        pc_close(pc, 1);
        return;
    }
    /* Under a bandwidth cap, cut reads into 10 ms slices so the rate is smooth. */
    size_t slice = (size_t)nread;
    if (g.bandwidth > 0) {
        slice = (size_t)(g.bandwidth / 100);
        if (slice < 256)
            slice = 256;
    }
    for (size_t off = 0; off < (size_t)nread && !pc->closing; off += slice) {
        size_t n = (size_t)nread - off < slice ? (size_t)nread - off : slice;
        dir_push(d, buf->base + off, n, 0);
    }
    if (!pc->closing && d->queued > PAUSE_BYTES) {
        d->read_paused = 1;
        uv_read_stop(s);
    }
}

static void on_upstream(uv_connect_t *creq, int status)
{
    pconn_t *pc = creq->data;
    if (pc->closing)
        return;
    if (status < 0) {
        g.upstream_fail++;
        if (!g.quiet)
            fprintf(stderr, "faultproxy: upstream connect: %s\n", uv_strerror(status));
        pc_close(pc, 1);
        return;
    }
    uv_tcp_nodelay(&pc->server, 1);
    uv_read_start((uv_stream_t *)&pc->client, igb_on_alloc, on_read);
    uv_read_start((uv_stream_t *)&pc->server, igb_on_alloc, on_read);
}

static void on_refused_closed(uv_handle_t *h)
{
    free(h);
}

static void on_connection(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    if (g.refuse == REFUSE_CLOSE) {
        uv_tcp_t *t = malloc(sizeof(*t));
        if (!t)
            return;
        uv_tcp_init(g.loop, t);
        if (uv_accept(server, (uv_stream_t *)t) == 0)
            g.refused++;
        uv_close((uv_handle_t *)t, on_refused_closed);
        return;
    }
    pconn_t *pc = calloc(1, sizeof(*pc));
    if (!pc)
        return;
    uv_tcp_init(g.loop, &pc->client);
    uv_tcp_init(g.loop, &pc->server);
    pc->client.data = pc->server.data = pc->creq.data = pc;
    g.open++;
    if (uv_accept(server, (uv_stream_t *)&pc->client) != 0) {
        pc_close(pc, 0);
        return;
    }
    g.accepted++;
    uv_tcp_nodelay(&pc->client, 1);
    for (int i = 0; i < 2; i++) {
        pc->d[i].pc = pc;
        pc->d[i].dir = i;
        igb_tq_entry_init(&pc->d[i].tq);
    }
    pc->d[C2S].src = pc->d[S2C].dst = (uv_stream_t *)&pc->client;
    pc->d[C2S].dst = pc->d[S2C].src = (uv_stream_t *)&pc->server;
    if (g.drop) {
        /* A black hole: the connection is accepted, then nothing ever answers. */
        g.dropped++;
        pc->blackhole = 1;
        uv_read_start((uv_stream_t *)&pc->client, igb_on_alloc, on_read);
        return;
    }
    if (uv_tcp_connect(&pc->creq, &pc->server, (struct sockaddr *)&g.target.ss, on_upstream) != 0) {
        g.upstream_fail++;
        pc_close(pc, 1);
    }
}

static void on_listener_closed(uv_handle_t *h)
{
    free(h);
}

/* Opens the listener; a fresh handle each time, since the old one may still
 * be closing when `refuse off` follows `refuse unlisten`. */
static int listen_start(void)
{
    uv_tcp_t *t = malloc(sizeof(*t));
    if (!t)
        return UV_ENOMEM;
    int rc = uv_tcp_init(g.loop, t);
    if (rc != 0) {
        free(t);
        return rc;
    }
    rc = uv_tcp_bind(t, (struct sockaddr *)&g.listen_addr.ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)t, 1024, on_connection);
    if (rc != 0) {
        uv_close((uv_handle_t *)t, on_listener_closed);
        return rc;
    }
    g.server = t;
    return 0;
}

static void listen_stop(void)
{
    if (g.server) {
        uv_close((uv_handle_t *)g.server, on_listener_closed);
        g.server = NULL;
    }
}

/* ------------------------------------------------------------------------- */
/* Control                                                                   */
/* ------------------------------------------------------------------------- */

static const char *refuse_name(int r)
{
    return r == REFUSE_CLOSE ? "close" : r == REFUSE_UNLISTEN ? "unlisten" : "off";
}

static int set_refuse(int mode)
{
    if (mode == REFUSE_UNLISTEN) {
        listen_stop();
    } else if (!g.server) {
        int rc = listen_start();
        if (rc != 0)
            return rc;
    }
    g.refuse = mode;
    return 0;
}

static void status_line(char *out, size_t cap)
{
    snprintf(out, cap,
             "{\"listen\":\"%s\",\"delay_ms\":{\"c2s\":%g,\"s2c\":%g},"
             "\"jitter_ms\":{\"c2s\":%g,\"s2c\":%g},\"bandwidth\":%g,\"refuse\":\"%s\","
             "\"drop\":%s,\"reset_after\":%llu,\"connections\":{\"accepted\":%llu,\"open\":%llu,"
             "\"refused\":%llu,\"dropped\":%llu,\"reset\":%llu,\"upstream_failed\":%llu},"
             "\"bytes\":{\"c2s\":%llu,\"s2c\":%llu}}\n",
             g.listen_name, g.delay_ms[C2S], g.delay_ms[S2C], g.jitter_ms[C2S], g.jitter_ms[S2C],
             g.bandwidth, refuse_name(g.refuse), g.drop ? "true" : "false",
             (unsigned long long)g.reset_after, (unsigned long long)g.accepted,
             (unsigned long long)g.open, (unsigned long long)g.refused,
             (unsigned long long)g.dropped, (unsigned long long)g.resets,
             (unsigned long long)g.upstream_fail, (unsigned long long)g.bytes[C2S],
             (unsigned long long)g.bytes[S2C]);
}

static int parse_onoff(const char *v, int *out)
{
    if (!strcmp(v, "on") || !strcmp(v, "1") || !strcmp(v, "true"))
        *out = 1;
    else if (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "false"))
        *out = 0;
    else
        return -1;
    return 0;
}

static int parse_num(const char *v, double *out)
{
    char *end;
    if (!v)
        return -1;
    *out = strtod(v, &end);
    return (end == v || *end || *out < 0) ? -1 : 0;
}

/* Sets a per-direction value from "VALUE" (both) or "c2s|s2c VALUE". */
static int set_dir_value(double *arr, const char *a1, const char *a2)
{
    double v;
    if (a1 && a2 && (!strcmp(a1, "c2s") || !strcmp(a1, "s2c"))) {
        if (parse_num(a2, &v))
            return -1;
        arr[!strcmp(a1, "s2c") ? S2C : C2S] = v;
        return 0;
    }
    if (a2 || parse_num(a1, &v))
        return -1;
    arr[C2S] = arr[S2C] = v;
    return 0;
}

/* Runs one control command; writes the answer line into out. */
static void control_exec(char *line, char *out, size_t cap)
{
    char *save = NULL;
    char *cmd = strtok_r(line, " \t\r", &save);
    char *a1 = strtok_r(NULL, " \t\r", &save);
    char *a2 = strtok_r(NULL, " \t\r", &save);
    double v;
    int on;
    if (!cmd) {
        out[0] = 0;
        return;
    }
    if (!strcmp(cmd, "status")) {
        status_line(out, cap);
        return;
    }
    if (!strcmp(cmd, "help")) {
        snprintf(out, cap,
                 "commands: delay [c2s|s2c] MS; jitter [c2s|s2c] MS; bandwidth BYTES_PER_S "
                 "(0 off); refuse on|off|close|unlisten; drop on|off; reset-after BYTES (0 off); "
                 "status\n");
        return;
    }
    int rc = -1;
    if (!strcmp(cmd, "delay")) {
        rc = set_dir_value(g.delay_ms, a1, a2);
    } else if (!strcmp(cmd, "jitter")) {
        rc = set_dir_value(g.jitter_ms, a1, a2);
    } else if (!strcmp(cmd, "bandwidth") && !a2 && parse_num(a1, &v) == 0) {
        g.bandwidth = v;
        rc = 0;
    } else if (!strcmp(cmd, "reset-after") && !a2 && parse_num(a1, &v) == 0) {
        g.reset_after = (uint64_t)v;
        rc = 0;
    } else if (!strcmp(cmd, "drop") && a1 && !a2 && parse_onoff(a1, &on) == 0) {
        g.drop = on;
        rc = 0;
    } else if (!strcmp(cmd, "refuse") && a1 && !a2) {
        int mode = -1;
        if (!strcmp(a1, "unlisten"))
            mode = REFUSE_UNLISTEN;
        else if (!strcmp(a1, "close"))
            mode = REFUSE_CLOSE;
        else if (parse_onoff(a1, &on) == 0)
            mode = on ? REFUSE_CLOSE : REFUSE_OFF;
        if (mode >= 0 && set_refuse(mode) != 0) {
            snprintf(out, cap, "error: cannot listen again on %s\n", g.listen_name);
            return;
        }
        rc = mode >= 0 ? 0 : -1;
    }
    if (rc == 0)
        snprintf(out, cap, "ok\n");
    else
        snprintf(out, cap, "error: bad command (try help)\n");
}

typedef struct {
    igb_stream_t u;
    char line[1024];
    size_t len;
} ctl_conn_t;

static union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
} ctl_server;

static void on_ctl_written(uv_write_t *w, int status)
{
    free(w);
}

static void ctl_reply(ctl_conn_t *cc, const char *msg)
{
    size_t n = strlen(msg);
    uv_write_t *w = malloc(sizeof(*w) + n);
    if (!w)
        return;
    char *copy = (char *)(w + 1);
    memcpy(copy, msg, n);
    uv_buf_t buf = uv_buf_init(copy, (unsigned)n);
    if (uv_write(w, &cc->u.s, &buf, 1, on_ctl_written) != 0)
        free(w);
}

static void on_ctl_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_ctl_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    ctl_conn_t *cc = s->data;
    if (nread < 0) {
        uv_close(&cc->u.h, on_ctl_closed);
        return;
    }
    for (ssize_t i = 0; i < nread; i++) {
        char ch = buf->base[i];
        if (ch != '\n') {
            if (cc->len + 1 < sizeof(cc->line))
                cc->line[cc->len++] = ch;
            continue;
        }
        cc->line[cc->len] = 0;
        cc->len = 0;
        char out[1024];
        control_exec(cc->line, out, sizeof(out));
        if (out[0]) {
            if (!g.quiet)
                fprintf(stderr, "faultproxy: control: %s", out[0] == '{' ? "status\n" : out);
            ctl_reply(cc, out);
        }
    }
}

static void on_ctl_connection(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    ctl_conn_t *cc = calloc(1, sizeof(*cc));
    if (!cc)
        return;
    if (server->type == UV_NAMED_PIPE)
        uv_pipe_init(g.loop, &cc->u.pipe, 0);
    else
        uv_tcp_init(g.loop, &cc->u.tcp);
    cc->u.h.data = cc;
    if (uv_accept(server, &cc->u.s) != 0) {
        uv_close(&cc->u.h, on_ctl_closed);
        return;
    }
    uv_read_start(&cc->u.s, igb_on_alloc, on_ctl_read);
}

static int control_start(const char *spec, char *name, size_t cap)
{
    igb_addr_t a;
    if (igb_addr_parse(spec, &a) != 0)
        return UV_EINVAL;
    int rc;
    if (a.is_unix) {
        unlink(a.path); /* a stale socket from an earlier run */
        rc = uv_pipe_init(g.loop, &ctl_server.pipe, 0);
        if (rc == 0)
            rc = uv_pipe_bind(&ctl_server.pipe, a.path);
        snprintf(name, cap, "unix:%s", a.path);
    } else {
        rc = uv_tcp_init(g.loop, &ctl_server.tcp);
        if (rc == 0)
            rc = uv_tcp_bind(&ctl_server.tcp, (struct sockaddr *)&a.ss, 0);
        if (rc == 0)
            igb_tcp_name(&ctl_server.tcp, name, cap);
    }
    if (rc == 0)
        rc = uv_listen(&ctl_server.s, 16, on_ctl_connection);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Main                                                                      */
/* ------------------------------------------------------------------------- */

static void on_signal(uv_signal_t *s, int signum)
{
    if (signum == SIGUSR1) {
        set_refuse(g.refuse ? REFUSE_OFF : REFUSE_CLOSE);
        if (!g.quiet)
            fprintf(stderr, "faultproxy: SIGUSR1: refuse %s\n", refuse_name(g.refuse));
    } else if (signum == SIGUSR2) {
        /* Delay off, or back to the last non-zero setting. */
        if (g.delay_ms[C2S] || g.delay_ms[S2C]) {
            memcpy(g.saved_delay, g.delay_ms, sizeof(g.saved_delay));
            g.delay_ms[C2S] = g.delay_ms[S2C] = 0;
        } else {
            memcpy(g.delay_ms, g.saved_delay, sizeof(g.saved_delay));
        }
        if (!g.quiet)
            fprintf(stderr, "faultproxy: SIGUSR2: delay c2s %g ms s2c %g ms\n", g.delay_ms[C2S],
                    g.delay_ms[S2C]);
    } else {
        uv_stop(g.loop);
    }
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: faultproxy --target HOST:PORT [options]\n"
            "\n"
            "A TCP proxy that adds network faults, switchable at run time.\n"
            "\n"
            "options:\n"
            "  --listen HOST:PORT     where clients connect (default 127.0.0.1:0, a free port)\n"
            "  --target HOST:PORT     the server behind the proxy (required)\n"
            "  --delay-ms MS          delay added in each direction (default 0)\n"
            "  --c2s-delay-ms MS      ... client->server only\n"
            "  --s2c-delay-ms MS      ... server->client only\n"
            "  --jitter-ms MS         uniform +-MS on each delay, both directions (order kept)\n"
            "  --c2s-jitter-ms MS, --s2c-jitter-ms MS   per direction\n"
            "  --bandwidth B          cap each direction of each connection at B bytes/s\n"
            "  --refuse MODE          close: accept and close at once; unlisten: not listening\n"
            "  --drop                 accept and never answer (black hole)\n"
            "  --reset-after BYTES    RST the client (SO_LINGER 0) after BYTES of response\n"
            "  --control ADDR         control socket: unix:PATH or HOST:PORT\n"
            "  --seed N               seed of the jitter (default 1)\n"
            "  --spin-us US           wake this early and spin, for precise delays (default 200)\n"
            "  --quiet                no log lines on stderr\n"
            "  --help                 this text\n"
            "\n"
            "Control commands, one per line, each answered by one line (\"ok\", \"error: ...\"\n"
            "or the JSON status):\n"
            "  delay [c2s|s2c] MS      jitter [c2s|s2c] MS      bandwidth B (0 = unlimited)\n"
            "  refuse on|off|close|unlisten    drop on|off      reset-after N (0 = off)\n"
            "  status                  help\n"
            "  e.g.  echo 'delay s2c 40' | socat - UNIX-CONNECT:/tmp/fp.sock\n"
            "Signals: SIGUSR1 toggles refuse (close mode) on/off; SIGUSR2 toggles the\n"
            "delay between 0 and its last non-zero setting. SIGINT/SIGTERM stop.\n"
            "Delays apply to bytes read after the change; bytes already queued keep\n"
            "their release time. On start it prints \"faultproxy listening on HOST:PORT\"\n"
            "(and \"faultproxy control on ADDR\") to stdout.\n");
}

int main(int argc, char **argv)
{
    const char *listen = "127.0.0.1:0", *target = NULL, *control = NULL;
    unsigned long long seed = 1;
    double spin_us = 200;
    igb_opts_t o;
    igb_opts_init(&o, "faultproxy", argc, argv, usage);
    int more;
    while ((more = igb_opts_next(&o)) > 0) {
        const char *a = o.opt, *v = NULL;
        double x = 0;
#define NEED_NUM()                                                                                 \
    do {                                                                                           \
        if (parse_num(o.i + 1 < argc ? argv[o.i + 1] : NULL, &x) != 0) {                           \
            fprintf(stderr, "faultproxy: %s needs a number >= 0\n", a);                            \
            return 2;                                                                              \
        }                                                                                          \
        o.i++;                                                                                     \
    } while (0)
        if (!strcmp(a, "--listen")) {
            IGB_NEED(&o, v);
            listen = v;
        } else if (!strcmp(a, "--target")) {
            IGB_NEED(&o, v);
            target = v;
        } else if (!strcmp(a, "--control")) {
            IGB_NEED(&o, v);
            control = v;
        } else if (!strcmp(a, "--delay-ms")) {
            NEED_NUM();
            g.delay_ms[C2S] = g.delay_ms[S2C] = x;
        } else if (!strcmp(a, "--c2s-delay-ms")) {
            NEED_NUM();
            g.delay_ms[C2S] = x;
        } else if (!strcmp(a, "--s2c-delay-ms")) {
            NEED_NUM();
            g.delay_ms[S2C] = x;
        } else if (!strcmp(a, "--jitter-ms")) {
            NEED_NUM();
            g.jitter_ms[C2S] = g.jitter_ms[S2C] = x;
        } else if (!strcmp(a, "--c2s-jitter-ms")) {
            NEED_NUM();
            g.jitter_ms[C2S] = x;
        } else if (!strcmp(a, "--s2c-jitter-ms")) {
            NEED_NUM();
            g.jitter_ms[S2C] = x;
        } else if (!strcmp(a, "--bandwidth")) {
            NEED_NUM();
            g.bandwidth = x;
        } else if (!strcmp(a, "--reset-after")) {
            NEED_NUM();
            g.reset_after = (uint64_t)x;
        } else if (!strcmp(a, "--seed")) {
            NEED_NUM();
            seed = (unsigned long long)x;
        } else if (!strcmp(a, "--spin-us")) {
            NEED_NUM();
            spin_us = x;
        } else if (!strcmp(a, "--refuse")) {
            int k = igb_opt_choice(&o, "close|unlisten");
            if (k < 0)
                return 2;
            g.refuse = k == 0 ? REFUSE_CLOSE : REFUSE_UNLISTEN;
        } else if (!strcmp(a, "--drop")) {
            g.drop = 1;
        } else if (!strcmp(a, "--quiet")) {
            g.quiet = 1;
        } else {
            return igb_opt_unknown(&o);
        }
#undef NEED_NUM
    }
    if (more < 0)
        return 0;
    if (!target || igb_addr_parse(target, &g.target) != 0 || g.target.is_unix) {
        fprintf(stderr, "faultproxy: --target HOST:PORT is required (see --help)\n");
        return 2;
    }
    if (igb_addr_parse(listen, &g.listen_addr) != 0 || g.listen_addr.is_unix) {
        fprintf(stderr, "faultproxy: bad --listen '%s'\n", listen);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    igb_rng_init(&g.rng, seed);
    g.loop = uv_default_loop();
    int rc = igb_tq_start(g.loop, &g.tq);
    if (rc != 0) {
        fprintf(stderr, "faultproxy: timer: %s\n", uv_strerror(rc));
        return 1;
    }
    g.tq.spin_ns = (uint64_t)(spin_us * 1000);
    /* Bind even in unlisten mode, to learn the port that `refuse off` reopens. */
    rc = listen_start();
    if (rc != 0) {
        fprintf(stderr, "faultproxy: cannot listen on %s: %s\n", listen, uv_strerror(rc));
        return 1;
    }
    igb_tcp_name(g.server, g.listen_name, sizeof(g.listen_name));
    igb_addr_parse(g.listen_name, &g.listen_addr);
    if (g.refuse == REFUSE_UNLISTEN)
        listen_stop();
    printf("faultproxy listening on %s\n", g.listen_name);
    if (control) {
        char name[160];
        rc = control_start(control, name, sizeof(name));
        if (rc != 0) {
            fprintf(stderr, "faultproxy: control socket %s: %s\n", control, uv_strerror(rc));
            return 1;
        }
        printf("faultproxy control on %s\n", name);
    }
    fflush(stdout);
    uv_signal_t sig[4];
    int signums[4] = {SIGUSR1, SIGUSR2, SIGINT, SIGTERM};
    for (int i = 0; i < 4; i++) {
        uv_signal_init(g.loop, &sig[i]);
        uv_signal_start(&sig[i], on_signal, signums[i]);
    }
    uv_run(g.loop, UV_RUN_DEFAULT);
    if (control && strncmp(control, "unix:", 5) == 0)
        unlink(control + 5);
    if (!g.quiet)
        fprintf(stderr, "faultproxy: %llu connections, %llu resets\n",
                (unsigned long long)g.accepted, (unsigned long long)g.resets);
    return 0;
}
