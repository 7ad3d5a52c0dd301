/* The worker binary: 429 when the queue is full, client disconnect cancels
 * the sequences, seeds give the same text across processes, SIGTERM
 * drains, a model that fails to load ends the process with status 1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

#include <sys/socket.h>

/* Polls /load until key reaches want (bounded); the last value. */
static double wait_load(const wproc_t *w, const char *key, double want, int ms)
{
    long long t0 = ig_tc_now_ms();
    double v;
    do {
        v = wt_load(w, key);
        if (v == want)
            return v;
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    } while (ig_tc_now_ms() - t0 < ms);
    return v;
}

/* Value of a metric line that starts with prefix, or -1. */
static double metric(const wproc_t *w, const char *prefix)
{
    ig_tc_response_t r;
    if (wt_get(w, "/metrics", &r) < 0)
        return -1;
    double v = -1;
    for (const char *p = r.body; p && *p;) {
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            const char *sp = strchr(p + strlen(prefix), ' ');
            if (sp)
                v = atof(sp + 1);
            break;
        }
        const char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : NULL;
    }
    ig_tc_response_free(&r);
    return v;
}

static const char *LONG_STREAM = "{\"prompt\":\"Tell me a long story\",\"max_tokens\":480,"
                                 "\"ignore_eos\":true,\"stream\":true}";

static const char *LONG_REQ = "{\"prompt\":\"Tell me a long story\",\"max_tokens\":480,"
                              "\"ignore_eos\":true}";

static void test_queue_full_and_disconnect(void **state)
{
    wproc_t w;
    const char *extra[] = {"--max-num-seqs", "1", "--max-waiting", "1", NULL};
    assert_int_equal(wt_start(&w, "q", extra), 0);

    /* One running, one waiting: the third is refused with 429. */
    ig_tc_t *a = ig_tc_connect_unix(w.sock), *b = ig_tc_connect_unix(w.sock);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(wt_send(a, "POST", "/v1/completions", LONG_STREAM), 0);
    assert_int_equal(wait_load(&w, "running", 1, 5000), 1);
    assert_int_equal(wt_send(b, "POST", "/v1/completions", LONG_REQ), 0);
    assert_int_equal(wait_load(&w, "waiting", 1, 5000), 1);
    ig_tc_response_t r;
    assert_int_equal(wt_request(&w, "POST", "/v1/completions", LONG_REQ, &r), 0);
    assert_int_equal(r.status, 429);
    assert_non_null(ig_tc_header(&r, "retry-after"));
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_non_null(json_object_get(j, "error"));
    json_decref(j);
    ig_tc_response_free(&r);

    /* Both clients go away (the streaming running one and the waiting
     * non-streamed one): their sequences are cancelled, not finished, and
     * the worker is idle again at once. */
    double cancelled0 =
        metric(&w, "infergate_worker_request_success_total{finished_reason=\"cancelled\"}");
    ig_tc_close(a);
    ig_tc_close(b);
    long long t0 = ig_tc_now_ms();
    assert_int_equal(wait_load(&w, "running", 0, 5000), 0);
    assert_int_equal(wait_load(&w, "waiting", 0, 5000), 0);
    long long dt = ig_tc_now_ms() - t0;
    double cancelled =
        metric(&w, "infergate_worker_request_success_total{finished_reason=\"cancelled\"}");
    if (cancelled - (cancelled0 < 0 ? 0 : cancelled0) < 2)
        fail_msg("cancelled %g -> %g; finished length %g", cancelled0, cancelled,
                 metric(&w, "infergate_worker_request_success_total{finished_reason=\"length\"}"));
    assert_int_equal(wt_load(&w, "kv_blocks_used"), 0);
    fprintf(stderr, "disconnect -> idle in %lld ms\n", dt);

    /* And it serves again. */
    int st;
    j = wt_post_json(&w, "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2}", &st);
    assert_int_equal(st, 200);
    json_decref(j);
    wt_stop(&w);
}

static void test_stream_client_never_reads(void **state)
{
    /* A stream with big chunks (chat logprobs, 20 alternatives with their
     * bytes) to a client that reads nothing: the worker stops writing when
     * the HTTP server reports backpressure, holds a bounded amount, and
     * cancels the sequence after the stall timeout. */
    wproc_t w;
    const char *extra[] = {"--stream-stall-timeout", "1", NULL};
    assert_int_equal(wt_start(&w, "bp", extra), 0);
    double c0 = metric(&w, "infergate_worker_request_success_total{finished_reason=\"cancelled\"}");
    ig_tc_t *a = ig_tc_connect_unix(w.sock);
    assert_non_null(a);
    int rcvbuf = 4096;
    setsockopt(ig_tc_fd(a), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    assert_int_equal(wt_send(a, "POST", "/v1/chat/completions",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                             "\"max_tokens\":470,\"ignore_eos\":true,\"stream\":true,"
                             "\"logprobs\":true,\"top_logprobs\":20}"),
                     0);
    assert_int_equal(wait_load(&w, "running", 1, 5000), 1);
    /* cancelled (not finished) within the stall timeout and a tick or two */
    assert_int_equal(wait_load(&w, "running", 0, 10000), 0);
    double c1 = metric(&w, "infergate_worker_request_success_total{finished_reason=\"cancelled\"}");
    if (c1 - (c0 < 0 ? 0 : c0) != 1)
        fail_msg("cancelled %g -> %g", c0, c1);
    ig_tc_close(a);

    /* A client that stalls for a while, less than the timeout, and then
     * reads: generation resumes on the drain and the stream is complete. */
    a = ig_tc_connect_unix(w.sock);
    assert_non_null(a);
    assert_int_equal(wt_send(a, "POST", "/v1/chat/completions",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                             "\"max_tokens\":470,\"ignore_eos\":true,\"stream\":true,"
                             "\"logprobs\":true,\"top_logprobs\":20,"
                             "\"stream_options\":{\"include_usage\":true}}"),
                     0);
    assert_int_equal(wait_load(&w, "running", 1, 5000), 1);
    struct timespec pause = {0, 400 * 1000000L};
    nanosleep(&pause, NULL);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(a, &r, 30000), 0);
    int done;
    json_t *ev = wt_sse_events(r.body, &done);
    assert_true(done);
    size_t entries = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *ch = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
        entries += json_array_size(json_object_get(json_object_get(ch, "logprobs"), "content"));
    }
    json_t *last = json_array_get(ev, json_array_size(ev) - 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(last, "usage"), "completion_tokens")),
        470);
    assert_int_equal(entries, 470);
    json_decref(ev);
    ig_tc_response_free(&r);
    ig_tc_close(a);
    wt_stop(&w);
}

static char *seeded_text(const wproc_t *w, int seed)
{
    char body[256];
    snprintf(body, sizeof(body),
             "{\"prompt\":\"Once\",\"max_tokens\":16,\"temperature\":1.0,\"top_p\":0.95,"
             "\"seed\":%d,\"ignore_eos\":true}",
             seed);
    int st;
    json_t *j = wt_post_json(w, "/v1/completions", body, &st);
    assert_int_equal(st, 200);
    char *t = strdup(json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
    json_decref(j);
    return t;
}

static void test_seed_across_runs(void **state)
{
    wproc_t w1, w2;
    assert_int_equal(wt_start(&w1, "s1", NULL), 0);
    char *a = seeded_text(&w1, 42);
    char *c = seeded_text(&w1, 43);
    wt_stop(&w1);
    assert_int_equal(wt_start(&w2, "s2", NULL), 0);
    /* with other requests in the batch at the same time */
    ig_tc_t *busy = ig_tc_connect_unix(w2.sock);
    assert_non_null(busy);
    assert_int_equal(wt_send(busy, "POST", "/v1/completions", LONG_REQ), 0);
    char *b = seeded_text(&w2, 42);
    ig_tc_close(busy);
    wt_stop(&w2);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
}

static void test_preemption_keeps_tokens(void **state)
{
    /* A KV cache too small for the load: sequences are preempted and
     * recomputed, and each still produces exactly the text it produces
     * alone (seeded sampling, the real engine). */
    enum { N = 6 };
    char bodies[N][256];
    for (int i = 0; i < N; i++)
        snprintf(bodies[i], sizeof(bodies[i]),
                 "{\"prompt\":\"Story number %d begins\",\"max_tokens\":150,"
                 "\"temperature\":1.0,\"seed\":%d,\"ignore_eos\":true}",
                 i, 100 + i);
    wproc_t w;
    assert_int_equal(wt_start(&w, "pre-alone", NULL), 0);
    char *alone[N];
    for (int i = 0; i < N; i++) {
        int st;
        json_t *j = wt_post_json(&w, "/v1/completions", bodies[i], &st);
        assert_int_equal(st, 200);
        alone[i] = strdup(json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
        json_decref(j);
    }
    wt_stop(&w);

    const char *extra[] = {"--kv-blocks", "24", NULL};
    assert_int_equal(wt_start(&w, "pre", extra), 0);
    ig_tc_t *tc[N];
    for (int i = 0; i < N; i++) {
        tc[i] = ig_tc_connect_unix(w.sock);
        assert_non_null(tc[i]);
        assert_int_equal(wt_send(tc[i], "POST", "/v1/completions", bodies[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_tc_read_response(tc[i], &r, 60000), 0);
        assert_int_equal(r.status, 200);
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        const char *text = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        assert_non_null(text);
        if (strcmp(text, alone[i]) != 0)
            fail_msg("request %d differs under preemption", i);
        json_decref(j);
        ig_tc_response_free(&r);
        ig_tc_close(tc[i]);
        free(alone[i]);
    }
    double pre = metric(&w, "infergate_worker_preemptions_total");
    fprintf(stderr, "preemptions: %g\n", pre);
    assert_true(pre > 0);
    wt_stop(&w);
}

static void test_sigterm_drains(void **state)
{
    wproc_t w;
    assert_int_equal(wt_start(&w, "d", NULL), 0);
    ig_tc_t *a = ig_tc_connect_unix(w.sock);
    assert_non_null(a);
    assert_int_equal(wt_send(a, "POST", "/v1/completions",
                             "{\"prompt\":\"Hi\",\"max_tokens\":300,\"ignore_eos\":true,"
                             "\"stream\":true}"),
                     0);
    assert_int_equal(wait_load(&w, "running", 1, 5000), 1);
    kill(w.proc.pid, SIGTERM);
    /* not ready any more, while the stream goes on */
    ig_tc_response_t r;
    int ready = 0;
    for (int i = 0; i < 200 && ready != 503; i++) {
        if (wt_get(&w, "/ready", &r) == 0) {
            ready = r.status;
            ig_tc_response_free(&r);
        }
    }
    assert_int_equal(ready, 503);
    assert_int_equal(ig_tc_read_response(a, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    int done;
    json_t *ev = wt_sse_events(r.body, &done);
    assert_true(done);
    json_t *last = json_array_get(ev, json_array_size(ev) - 1);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(last, "choices"), 0), "finish_reason")),
                        "length");
    json_decref(ev);
    ig_tc_response_free(&r);
    ig_tc_close(a);
    assert_int_equal(wt_wait_exit(&w, 10000), 0);
}

static void test_loading_answers_503(void **state)
{
    wproc_t w;
    memset(&w, 0, sizeof(w));
    snprintf(w.sock, sizeof(w.sock), "%s/slow.sock", ig_gwf_run_dir);
    unlink(w.sock);
    char listen[200];
    snprintf(listen, sizeof(listen), "unix:%s", w.sock);
    const char *args[] = {"worker", "--model",  ig_gwf_model_dir, "--device",
                          "cpu:1",  "--listen", listen,           NULL};
    /* Only the child sees the delay: the test is single-threaded here. */
    setenv("IG_WORKER_LOAD_DELAY_MS", "1500", 1);
    int rc = ig_proc_start_bin(&w.proc, "infergate", args, IG_PROC_QUIET);
    unsetenv("IG_WORKER_LOAD_DELAY_MS");
    assert_int_equal(rc, 0);
    /* the socket listens at once; /health answers 503 Loading model */
    ig_tc_response_t r;
    int got = -1;
    long long t0 = ig_tc_now_ms();
    while (got < 0 && ig_tc_now_ms() - t0 < 5000) {
        if (wt_get(&w, "/health", &r) == 0) {
            got = r.status;
            assert_int_equal(r.status, 503);
            json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
            json_t *e = json_object_get(j, "error");
            assert_int_equal(json_integer_value(json_object_get(e, "code")), 503);
            assert_string_equal(json_string_value(json_object_get(e, "message")), "Loading model");
            assert_string_equal(json_string_value(json_object_get(e, "type")), "unavailable_error");
            json_decref(j);
            ig_tc_response_free(&r);
        }
    }
    assert_int_equal(got, 503);
    assert_int_equal(wt_get(&w, "/ready", &r), 0);
    assert_int_equal(r.status, 503);
    ig_tc_response_free(&r);
    assert_int_equal(wt_request(&w, "POST", "/v1/completions", "{\"prompt\":\"x\"}", &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(ig_tc_header(&r, "retry-after"));
    ig_tc_response_free(&r);
    /* then it becomes healthy and ready */
    int ready = 0;
    while (!ready && ig_tc_now_ms() - t0 < 20000) {
        if (wt_get(&w, "/ready", &r) == 0) {
            ready = r.status == 200;
            ig_tc_response_free(&r);
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_true(ready);
    assert_int_equal(wt_get(&w, "/health", &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    wt_stop(&w);
}

static void test_load_failure_exits(void **state)
{
    char dir[160], cmd[1024];
    snprintf(dir, sizeof(dir), "%s/broken", ig_gwf_run_dir);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && echo '{' > %s/config.json", dir, dir);
    assert_int_equal(system(cmd), 0);
    char sock[200];
    snprintf(sock, sizeof(sock), "unix:%s/broken.sock", ig_gwf_run_dir);
    const char *args[] = {"worker", "--model", dir, "--listen", sock, NULL};
    ig_proc_t p;
    assert_int_equal(ig_proc_start_bin(&p, "infergate", args, IG_PROC_QUIET), 0);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 1);
    ig_proc_dispose(&p);
    /* usage errors are status 2 */
    snprintf(cmd, sizeof(cmd), "%s worker --model %s >/dev/null 2>&1", ig_proc_bin("infergate"),
             dir);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    /* so is a KV dtype the worker does not know, and the message names it */
    snprintf(cmd, sizeof(cmd), "%s worker --model %s --listen %s --kv-dtype fp8 >/dev/null 2>&1",
             ig_proc_bin("infergate"), dir, sock);
    st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    snprintf(cmd, sizeof(cmd),
             "%s worker --model %s --listen %s --kv-dtype fp8 2>&1 >/dev/null | "
             "grep -q -- \"--kv-dtype: 'fp8' is not f32, f16 or bf16\"",
             ig_proc_bin("infergate"), dir, sock);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_full_and_disconnect),
        cmocka_unit_test(test_stream_client_never_reads),
        cmocka_unit_test(test_seed_across_runs),
        cmocka_unit_test(test_preemption_keeps_tokens),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_loading_answers_503),
        cmocka_unit_test(test_load_failure_exits),
    };
    return cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
}
