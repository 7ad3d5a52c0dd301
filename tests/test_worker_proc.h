/*
 * Helpers of the worker integration tests: a tiny model made by the real
 * `infergate mkmodel` (plus a tokenizer from the generator when mkmodel does
 * not write one), worker processes on Unix sockets, and JSON requests over
 * the test client. Every wait is bounded.
 */
#ifndef TEST_WORKER_PROC_H
#define TEST_WORKER_PROC_H

#include "infergate/tokgen.h"
#include "testclient.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    char sock[108];
    char log[160];
} wproc_t;

static char wt_dir[96];

/* Workers started by this test binary, killed at the end even when a test
 * failed half-way (cmocka jumps out of the test function). */
static pid_t wt_pids[16];
static int wt_npids;

static void wt_kill_all(void)
{
    for (int i = 0; i < wt_npids; i++)
        if (wt_pids[i] > 0 && kill(wt_pids[i], 0) == 0) {
            kill(wt_pids[i], SIGKILL);
            waitpid(wt_pids[i], NULL, 0);
        }
    wt_npids = 0;
}

static const char *bin_dir(void)
{
    const char *b = getenv("IG_BIN_DIR");
    return b ? b : IG_BIN_DIR;
}

/* Makes DIR/tiny once per test binary. 0 or -1. */
static int wt_make_model(void)
{
    snprintf(wt_dir, sizeof(wt_dir), "/tmp/igwt-%d", (int)getpid());
    mkdir(wt_dir, 0755);
    char cmd[1024], path[512];
    snprintf(cmd, sizeof(cmd), "%s/infergate mkmodel --preset tiny --out %s/tiny >/dev/null 2>&1",
             bin_dir(), wt_dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/tiny/tokenizer.json", wt_dir);
    if (access(path, R_OK) != 0) {
        char err[256];
        snprintf(path, sizeof(path), "%s/tiny", wt_dir);
        if (ig_tokgen_write(path, 4096, IG_TOKGEN_SENTENCEPIECE, 1, err, sizeof(err)) != 0) {
            fprintf(stderr, "tokgen: %s\n", err);
            return -1;
        }
    }
    return 0;
}

static void wt_cleanup(void)
{
    char cmd[512];
    wt_kill_all();
    if (wt_dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", wt_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cleanup of %s failed\n", wt_dir);
    }
}

static int wt_get(const wproc_t *w, const char *path, ig_tc_response_t *resp);

/* Starts a worker with extra flags (NULL-terminated) and waits for /ready. */
static int wt_start(wproc_t *w, const char *name, const char *const *extra)
{
    snprintf(w->sock, sizeof(w->sock), "%s/%s.sock", wt_dir, name);
    snprintf(w->log, sizeof(w->log), "%s/%s.log", wt_dir, name);
    unlink(w->sock);
    char exe[512], model[512], listen[300];
    snprintf(exe, sizeof(exe), "%s/infergate", bin_dir());
    snprintf(model, sizeof(model), "%s/tiny", wt_dir);
    snprintf(listen, sizeof(listen), "unix:%s", w->sock);
    const char *argv[32] = {exe,     "worker",   "--model", model,         "--device",
                            "cpu:1", "--listen", listen,    "--log-level", "warn"};
    int argc = 10;
    for (int i = 0; extra && extra[i] && argc < 30; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    w->pid = fork();
    if (w->pid < 0)
        return -1;
    if (w->pid > 0 && wt_npids < 16)
        wt_pids[wt_npids++] = w->pid;
    if (w->pid == 0) {
        FILE *f = freopen(w->log, "w", stderr);
        f = freopen("/dev/null", "w", stdout);
        (void)f;
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    long long t0 = ig_tc_now_ms();
    while (ig_tc_now_ms() - t0 < 30000) {
        ig_tc_response_t r;
        if (wt_get(w, "/ready", &r) == 0) {
            int st = r.status;
            ig_tc_response_free(&r);
            if (st == 200)
                return 0;
        }
        int status;
        if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
            w->pid = 0;
            return -1;
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* Waits up to ms for the worker to exit; its exit status, or -1. */
__attribute__((unused)) static int wt_wait_exit(wproc_t *w, int ms)
{
    long long t0 = ig_tc_now_ms();
    while (w->pid > 0 && ig_tc_now_ms() - t0 < ms) {
        int status;
        if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
            w->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static void wt_stop(wproc_t *w)
{
    if (w->pid > 0) {
        kill(w->pid, SIGTERM);
        if (wt_wait_exit(w, 10000) < 0) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, NULL, 0);
        }
        w->pid = 0;
    }
}

static int wt_send(ig_tc_t *tc, const char *method, const char *path, const char *body)
{
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    snprintf(head, sizeof(head),
             "%s %s HTTP/1.1\r\nHost: worker\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             method, path, blen);
    if (ig_tc_sends(tc, head) < 0)
        return -1;
    return blen ? ig_tc_send(tc, body, blen) : 0;
}

static int wt_request(const wproc_t *w, const char *method, const char *path, const char *body,
                      ig_tc_response_t *resp)
{
    memset(resp, 0, sizeof(*resp));
    ig_tc_t *tc = ig_tc_connect_unix(w->sock);
    if (!tc)
        return -1;
    int rc = wt_send(tc, method, path, body);
    if (rc == 0)
        rc = ig_tc_read_response(tc, resp, 20000);
    ig_tc_close(tc);
    return rc;
}

static int wt_get(const wproc_t *w, const char *path, ig_tc_response_t *resp)
{
    return wt_request(w, "GET", path, NULL, resp);
}

/* POSTs and parses a JSON reply; NULL when the reply is not JSON. */
static json_t *wt_post_json(const wproc_t *w, const char *path, const char *body, int *status)
{
    ig_tc_response_t r;
    *status = 0;
    if (wt_request(w, "POST", path, body, &r) < 0)
        return NULL;
    *status = r.status;
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    ig_tc_response_free(&r);
    return j;
}

/* Splits an SSE body into its JSON events; *done says whether [DONE] came
 * last. Returns a JSON array (new reference). */
__attribute__((unused)) static json_t *wt_sse_events(const char *body, int *done)
{
    json_t *arr = json_array();
    *done = 0;
    const char *p = body;
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        if (!end)
            break;
        if (strncmp(p, "data: ", 6) == 0) {
            if (strncmp(p + 6, "[DONE]", 6) == 0)
                *done = 1;
            else
                json_array_append_new(arr, json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL));
        }
        p = end + 2;
    }
    return arr;
}

/* A number from GET /load. */
__attribute__((unused)) static double wt_load(const wproc_t *w, const char *key)
{
    ig_tc_response_t r;
    if (wt_get(w, "/load", &r) < 0)
        return -1;
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    ig_tc_response_free(&r);
    double v = json_number_value(json_object_get(j, key));
    json_decref(j);
    return v;
}

#endif
