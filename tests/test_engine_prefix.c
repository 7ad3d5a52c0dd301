/*
 * Automatic prefix caching through the real worker binary and the real CPU
 * engine: the same requests (greedy and seeded, with logprobs) get
 * byte-identical answers from a worker with --prefix-cache off, one with it
 * on, and one with it on and a KV cache so small that concurrent requests
 * preempt each other and cached blocks are evicted. The worker's metrics
 * count the prefix-cache hits. The same three again with the KV cache in
 * F16 (--kv-dtype f16): byte-identical among themselves, and the workers
 * report the cache's dtype and bytes (half of F32's for the same blocks).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

#define SYS 160 /* tokens of the shared "system prompt" */
#define NREQ 6

static wproc_t OFF, ON, TIGHT, OFF16, ON16, TIGHT16;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    const char *off[] = {"--prefix-cache", "off", NULL};
    const char *on[] = {"--prefix-cache", "on", NULL};
    /* 16 blocks of 16: one request (up to 15 blocks) fits, any two at once
     * (10 shared + 4 or 5 each by their end) do not, so that preemption
     * happens even when a busy machine spreads the five requests out */
    const char *tight[] = {"--kv-blocks", "16", "--max-num-seqs", "4", NULL};
    if (wt_start(&OFF, "off", off) < 0 || wt_start(&ON, "on", on) < 0 ||
        wt_start(&TIGHT, "tight", tight) < 0)
        return -1;
    const char *off16[] = {"--prefix-cache", "off", "--kv-dtype", "f16", NULL};
    const char *on16[] = {"--prefix-cache", "on", "--kv-dtype", "f16", NULL};
    const char *tight16[] = {"--kv-blocks", "16", "--max-num-seqs", "4", "--kv-dtype", "f16", NULL};
    if (wt_start(&OFF16, "off16", off16) < 0 || wt_start(&ON16, "on16", on16) < 0)
        return -1;
    return wt_start(&TIGHT16, "tight16", tight16);
}

static int teardown(void **state)
{
    wt_stop(&OFF);
    wt_stop(&ON);
    wt_stop(&TIGHT);
    wt_stop(&OFF16);
    wt_stop(&ON16);
    wt_stop(&TIGHT16);
    ig_gwf_model_teardown(state);
    return 0;
}

/* Request i: the shared prefix, then a suffix of its own (pairs share
 * part of it); even ones greedy, odd ones seeded at temperature 0.9. */
static char *body_of(int i)
{
    json_t *ids = json_array();
    for (int k = 0; k < SYS; k++)
        json_array_append_new(ids, json_integer(100 + (k * 37) % 3000));
    for (int k = 0; k < 20 + 7 * i; k++)
        json_array_append_new(ids, json_integer(200 + ((i / 2) * 11 + k * 13) % 3000));
    json_t *b = json_pack("{s:o, s:i, s:i, s:b}", "prompt", ids, "max_tokens", 24, "logprobs", 3,
                          "ignore_eos", 1);
    if (i % 2) {
        json_object_set_new(b, "temperature", json_real(0.9));
        json_object_set_new(b, "seed", json_integer(1000 + i));
    } else {
        json_object_set_new(b, "temperature", json_real(0.0));
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* The answer's choices as canonical text (sorted keys; reals with 17
 * digits, so equal text is equal bits). */
static char *choices_of(const char *body, size_t len)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    assert_non_null(j);
    json_t *c = json_object_get(j, "choices");
    assert_true(json_is_array(c) && json_array_size(c) == 1);
    json_t *lp = json_object_get(json_array_get(c, 0), "logprobs");
    assert_true(json_array_size(json_object_get(lp, "token_logprobs")) == 24);
    char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(j);
    return s;
}

/* Sends requests from..to-1 at once (one connection each, so the worker
 * batches them), then reads every answer into out. */
static void run_batch(const wproc_t *w, int from, int to, char **out)
{
    ig_tc_t *tc[NREQ];
    for (int i = from; i < to; i++) {
        tc[i] = ig_tc_connect_unix(w->sock);
        assert_non_null(tc[i]);
        char *b = body_of(i);
        assert_int_equal(wt_send(tc[i], "POST", "/v1/completions", b), 0);
        free(b);
    }
    for (int i = from; i < to; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_tc_read_response(tc[i], &r, 60000), 0);
        if (r.status != 200)
            fail_msg("request %d: status %d: %.*s", i, r.status, (int)r.body_len, r.body);
        out[i] = choices_of(r.body, r.body_len);
        ig_tc_response_free(&r);
        ig_tc_close(tc[i]);
    }
}

/* The same traffic to every worker: one alone (it fills the cache), then
 * the others together, then the first again. */
static void run_all(const wproc_t *w, char **out)
{
    run_batch(w, 0, 1, out);
    run_batch(w, 1, NREQ, out);
}

/* A counter or gauge of the worker's /metrics (the first sample). */
static double metric(const wproc_t *w, const char *name)
{
    ig_tc_response_t r;
    assert_int_equal(wt_get(w, "/metrics", &r), 0);
    double v = -1;
    size_t n = strlen(name);
    for (const char *p = r.body; p && p < r.body + r.body_len; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, name, n) == 0 && (p[n] == ' ' || p[n] == '{')) {
            const char *sp = strchr(p, ' ');
            v = sp ? strtod(sp + 1, NULL) : -1;
            break;
        }
    }
    ig_tc_response_free(&r);
    return v;
}

static void check_identical(const wproc_t *w_off, const wproc_t *w_on, const wproc_t *w_tight)
{
    char *off[NREQ], *on[NREQ], *tight[NREQ], *again[NREQ];
    run_all(w_off, off);
    run_all(w_on, on);
    run_all(w_tight, tight);
    /* the cache is warm now: every prompt finds at least its prefix */
    run_all(w_on, again);
    for (int i = 0; i < NREQ; i++) {
        if (strcmp(off[i], on[i]) != 0 || strcmp(off[i], tight[i]) != 0 ||
            strcmp(off[i], again[i]) != 0)
            fail_msg("request %d differs:\n off   %s\n on    %s\n tight %s\n again %s", i, off[i],
                     on[i], tight[i], again[i]);
    }
    for (int i = 0; i < NREQ; i++) {
        free(off[i]);
        free(on[i]);
        free(tight[i]);
        free(again[i]);
    }
}

static void test_identical_with_and_without_cache(void **state)
{
    check_identical(&OFF, &ON, &TIGHT);
    assert_true(metric(&OFF, "infergate_worker_prefix_cache_queries_total") > 0);
    assert_true(metric(&OFF, "infergate_worker_prefix_cache_hits_total") == 0);
    /* first round: requests 1..5 find the 160-token prefix (10 blocks);
     * second round: each finds its whole prompt but the last block */
    double hits = metric(&ON, "infergate_worker_prefix_cache_hits_total");
    assert_true(hits >= (NREQ - 1) * SYS + NREQ * SYS);
    assert_true(metric(&ON, "infergate_worker_prefix_cache_blocks") > SYS / 16);
    assert_true(metric(&TIGHT, "infergate_worker_preemptions_total") > 0);
    assert_true(metric(&TIGHT, "infergate_worker_prefix_cache_evictions_total") > 0);
    assert_true(metric(&TIGHT, "infergate_worker_prefix_cache_hits_total") > 0);
}

/* The sample of name{dtype="<dtype>"} in the worker's /metrics, or -1. */
static double kv_bytes(const wproc_t *w, const char *dtype)
{
    char want[128];
    snprintf(want, sizeof(want), "infergate_worker_kv_cache_bytes{dtype=\"%s\"} ", dtype);
    ig_tc_response_t r;
    assert_int_equal(wt_get(w, "/metrics", &r), 0);
    const char *p = memmem(r.body, r.body_len, want, strlen(want));
    double v = p ? strtod(p + strlen(want), NULL) : -1;
    ig_tc_response_free(&r);
    return v;
}

static void test_identical_with_and_without_cache_f16(void **state)
{
    check_identical(&OFF16, &ON16, &TIGHT16);
    assert_true(metric(&ON16, "infergate_worker_prefix_cache_hits_total") > 0);
    assert_true(metric(&TIGHT16, "infergate_worker_preemptions_total") > 0);
    assert_true(metric(&TIGHT16, "infergate_worker_prefix_cache_evictions_total") > 0);
    /* 16 blocks either way; the F16 ones in half the bytes */
    double b32 = kv_bytes(&TIGHT, "f32"), b16 = kv_bytes(&TIGHT16, "f16");
    print_message("# kv cache of 16 blocks: %.0f bytes in f32, %.0f in f16\n", b32, b16);
    assert_true(b32 > 0 && b16 * 2 == b32);
    assert_true(kv_bytes(&TIGHT16, "f32") < 0);
    assert_true(kv_bytes(&ON16, "f16") * 2 == kv_bytes(&ON, "f32"));
}

int main(void)
{
    (void)wt_post_json;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_with_and_without_cache),
        cmocka_unit_test(test_identical_with_and_without_cache_f16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
