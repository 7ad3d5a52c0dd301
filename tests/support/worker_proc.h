/*
 * Helpers of the worker integration tests: worker processes (through
 * tests/support/proc) on Unix sockets beside a tiny model made by
 * tests/support/gwfixture, and JSON requests over the test client. Every
 * wait is bounded.
 */
#ifndef IG_TEST_WORKER_PROC_H
#define IG_TEST_WORKER_PROC_H

#include "gwfixture.h"
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
    ig_proc_t proc;
    char sock[108];
} wproc_t;

/* The sockets and the model live in gwfixture's run directory: a test's
 * group setup makes it with ig_gwf_model_setup (the model at
 * ig_gwf_model_dir) and its teardown removes it with ig_gwf_model_teardown;
 * workers a failed test left are killed at exit. */

static int wt_get(const wproc_t *w, const char *path, ig_tc_response_t *resp);

/* Starts a worker on model (NULL: ig_gwf_model_dir) listening on
 * run_dir/name.sock, with extra flags (NULL-terminated, may be NULL) and
 * ig_proc_start flags (IG_PROC_PIPE_ERR to read its log), and waits up to
 * 30 s for /ready. 0 or -1. */
static int wt_start_on(wproc_t *w, const char *name, const char *model, const char *const *extra,
                       int flags)
{
    int len = snprintf(w->sock, sizeof(w->sock), "%s/%s.sock", ig_gwf_run_dir, name);
    if (len < 0 || (size_t)len >= sizeof(w->sock))
        return -1; /* too long for a Unix socket address */
    unlink(w->sock);
    char listen[300];
    snprintf(listen, sizeof(listen), "unix:%s", w->sock);
    const char *argv[32] = {"worker",   "--model",     model ? model : ig_gwf_model_dir,
                            "--device", "cpu:1",       "--listen",
                            listen,     "--log-level", "warn"};
    int argc = 9;
    for (int i = 0; extra && extra[i] && argc < 31; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    if (ig_proc_start_bin(&w->proc, "infergate", argv, flags) != 0)
        return -1;
    long long t0 = ig_tc_now_ms();
    while (ig_tc_now_ms() - t0 < 30000) {
        ig_tc_response_t r;
        if (wt_get(w, "/ready", &r) == 0) {
            int st = r.status;
            ig_tc_response_free(&r);
            if (st == 200)
                return 0;
        }
        if (ig_proc_wait_exit(&w->proc, 10) >= 0)
            return -1;
    }
    return -1;
}

/* wt_start_on the fixture's model with the worker's stderr inherited. */
static int wt_start(wproc_t *w, const char *name, const char *const *extra)
{
    return wt_start_on(w, name, NULL, extra, 0);
}

/* Waits up to ms for the worker to exit; its exit status, or -1. */
__attribute__((unused)) static int wt_wait_exit(wproc_t *w, int ms)
{
    return ig_proc_wait_exit(&w->proc, ms);
}

/* SIGTERM, up to 10 s to exit, then SIGKILL. */
static void wt_stop(wproc_t *w)
{
    ig_proc_stop(&w->proc, SIGTERM, 10000);
    ig_proc_dispose(&w->proc);
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

/* wt_post_json of a body built with jansson (stolen: freed here). */
__attribute__((unused)) static json_t *wt_post_value(const wproc_t *w, const char *path,
                                                     json_t *body, int *status)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    json_t *j = wt_post_json(w, path, text != NULL ? text : "", status);
    free(text);
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
                json_array_append_new(
                    arr, json_loadb(p + 6, (size_t)(end - p - 6), JSON_ALLOW_NUL, NULL));
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
