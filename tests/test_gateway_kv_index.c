/*
 * The gateway's exact prefix index fed by the workers' GET /kv/events,
 * over real processes:
 *
 * - a pool's worker killed: its blocks leave the index as soon as the
 *   gateway sees its stream end (the instance shows "approximate" and no
 *   blocks), and the restarted process is indexed again from an empty
 *   snapshot (a new epoch), so a prompt it held before is not routed on it;
 * - two standalone workers found through dnsmasq, and two gateways with no
 *   model files (token-id prompts): the second gateway, started after the
 *   first sent its traffic, catches up from the snapshots, and both agree
 *   block for block on what each worker holds and on where each tenant's
 *   prefix lives, and each takes the workers' "load" events. The workers cut blocks of 32 tokens
 * and the gateways' config says nothing of it: they hash at the block size the workers' snapshots
 * give;
 * - a gateway without model files and a text prompt: once the worker is
 *   ready the gateway fetches its tokenizer files (GET /v1/tokenizer/...),
 *   and a text prompt sent again is routed on its cached prefix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"
#include "peers.h"

static int group_setup(void **state)
{
    return ig_gwf_model_setup(state);
}

static int group_teardown(void **state)
{
    return ig_gwf_model_teardown(state);
}

/* The instance of the first pool named name (or whose device is name) in
 * /status, as a new reference; NULL when absent. */
static json_t *instance(int port, const char *name)
{
    json_t *st = ig_gwf_get_json(port, "/status");
    json_t *insts = json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances");
    json_t *found = NULL;
    for (size_t i = 0; i < json_array_size(insts) && !found; i++) {
        json_t *in = json_array_get(insts, i);
        if (strcmp(json_string_value(json_object_get(in, "name")), name) == 0 ||
            strcmp(json_string_value(json_object_get(in, "device")), name) == 0)
            found = json_incref(in);
    }
    json_decref(st);
    return found;
}

static int exact_blocks(json_t *in)
{
    if (!in || strcmp(json_string_value(json_object_get(in, "prefix_index")), "exact") != 0)
        return -1;
    return (int)json_integer_value(json_object_get(json_object_get(in, "kv_events"), "blocks"));
}

/* Waits up to ms until every named instance has a live exact index. */
static int wait_exact(int port, const char *const *names, int n, int ms)
{
    for (long long end = ig_tc_now_ms() + ms; ig_tc_now_ms() < end; usleep(50000)) {
        int ok = 0;
        for (int i = 0; i < n; i++) {
            json_t *in = instance(port, names[i]);
            ok += exact_blocks(in) >= 0 && json_is_true(json_object_get(in, "eligible"));
            json_decref(in);
        }
        if (ok == n)
            return 0;
    }
    return -1;
}

/* A token-id prompt's body: tenant's 96 ids (6 blocks of 16), then 8 of
 * its own; max_tokens 1. Malloc'ed. */
static char *prompt_body(int tenant, int salt)
{
    json_t *p = json_array();
    for (int k = 0; k < 96; k++)
        json_array_append_new(p, json_integer(10 + (tenant * 131 + k * 7) % 4000));
    for (int k = 0; k < 8; k++)
        json_array_append_new(p, json_integer(20 + (salt * 17 + k) % 4000));
    json_t *b = json_pack("{s:s, s:o, s:i, s:f}", "model", "tiny", "prompt", p, "max_tokens", 1,
                          "temperature", 0.0);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return body;
}

/* POSTs prompt_body(tenant, salt) through the gateway on port. Writes the
 * upstream that served it and the prefix tokens its route header names. */
static void send_prompt(int port, int tenant, int salt, char *up, size_t cap, int *prefix)
{
    char *body = prompt_body(tenant, salt);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/v1/completions", body, &r, 30000), 0);
    free(body);
    assert_int_equal(r.status, 200);
    snprintf(up, cap, "%s", ig_tc_header(&r, "x-infergate-upstream"));
    *prefix = (int)ig_tc_route_num(ig_tc_header(&r, "x-infergate-route"), "prefix_tokens");
    ig_tc_response_free(&r);
}

/* One POST of body straight to ip:port; the answer's status, 0 when none
 * came (nothing listens yet). */
static int post_direct(const char *ip, int port, const char *body)
{
    ig_tc_t *tc = ig_tc_connect_ip(ip, port);
    if (tc == NULL)
        return 0;
    ig_tc_response_t r;
    int status = 0;
    if (ig_tc_send_post(tc, "/v1/completions", body) == 0 &&
        ig_tc_read_response(tc, &r, 30000) == 0) {
        status = r.status;
        ig_tc_response_free(&r);
    }
    ig_tc_close(tc);
    return status;
}

/* Sends n prompts of a tenant no test uses straight to the worker at
 * ip:port once it answers (up to 30 s: it listens before its model is
 * loaded), so that its first, slow answers (a cold process; many times
 * slower under a sanitizer) are not the gateways' first service samples. */
static void warm_worker(const char *ip, int port, int n)
{
    long long end = ig_tc_now_ms() + 30000;
    for (int i = 0; i < n; i++) {
        char *body = prompt_body(1000, i);
        int status;
        while ((status = post_direct(ip, port, body)) != 200 && ig_tc_now_ms() < end)
            usleep(50000);
        free(body);
        assert_int_equal(status, 200);
    }
}

/* Waits up to ms until instance name's exact index holds at least n blocks. */
static int wait_blocks(int port, const char *name, int n, int ms)
{
    for (long long end = ig_tc_now_ms() + ms; ig_tc_now_ms() < end; usleep(20000)) {
        json_t *in = instance(port, name);
        int b = exact_blocks(in);
        json_decref(in);
        if (b >= n)
            return 0;
    }
    return -1;
}

static void test_killed_worker_leaves_index(void **state)
{
    (void)state;
    int port = ig_proc_free_port();
    ig_proc_t gw;
    assert_int_equal(
        ig_gwf_serve_config(
            &gw, port, "warn", 0, 20000, 60000,
            "{\"region\":\"r\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
            "\"routing\":{\"policy\":\"latency\"},"
            "\"models\":[{\"name\":\"tiny\",\"path\":\"%s\"}],"
            "\"pools\":[{\"name\":\"cpu\",\"model\":\"tiny\",\"devices\":[\"cpu\",\"cpu\"],"
            "\"threads\":1,\"min_instances\":2,\"max_instances\":2,"
            "\"batching\":{\"kv_blocks\":64,\"block_size\":16}}]}",
            port, ig_gwf_model_dir),
        0);
    const char *names[] = {"cpu/0", "cpu/1"};
    assert_int_equal(wait_exact(port, names, 2, 30000), 0);

    char up[64], again[64];
    int prefix;
    send_prompt(port, 1, 0, up, sizeof(up), &prefix);
    assert_int_equal(prefix, 0);
    assert_int_equal(wait_blocks(port, up, 6, 5000), 0);
    send_prompt(port, 1, 1, again, sizeof(again), &prefix);
    assert_string_equal(again, up);
    assert_int_equal(prefix, 96);

    json_t *in = instance(port, up);
    int pid = (int)json_integer_value(json_object_get(in, "pid"));
    char epoch[64];
    snprintf(epoch, sizeof(epoch), "%s",
             json_string_value(json_object_get(json_object_get(in, "kv_events"), "epoch")));
    json_decref(in);
    assert_true(pid > 0);
    long long t0 = ig_tc_now_ms();
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* Gone from the index as soon as the gateway sees the stream end. */
    int gone = 0;
    while (!gone && ig_tc_now_ms() - t0 < 1000) {
        in = instance(port, up);
        gone = exact_blocks(in) <= 0;
        json_decref(in);
    }
    assert_true(gone);
    assert_true(ig_tc_now_ms() - t0 < 500);

    /* Back: a new process, indexed from an empty snapshot. */
    assert_int_equal(wait_exact(port, names, 2, 30000), 0);
    in = instance(port, up);
    assert_int_equal(exact_blocks(in), 0);
    assert_string_not_equal(
        json_string_value(json_object_get(json_object_get(in, "kv_events"), "epoch")), epoch);
    json_decref(in);
    send_prompt(port, 1, 2, again, sizeof(again), &prefix);
    assert_int_equal(prefix, 0); /* nobody holds it now */
    char series[128];
    snprintf(series, sizeof(series), "infergate_kv_events_lost_total{upstream=\"%s\"}", up);
    assert_true(ig_gwf_metric(port, series) >= 1);

    ig_proc_stop(&gw, SIGTERM, 10000);
    ig_proc_dispose(&gw);
}

/* ---- two gateways over discovered workers ------------------------------------ */

static const char *const ips[2] = {"127.0.0.2", "127.0.0.3"};

static void start_worker(ig_proc_t *w, const char *ip, int port)
{
    char listen[64];
    snprintf(listen, sizeof(listen), "%s:%d", ip, port);
    const char *args[] = {"worker",
                          "--model",
                          ig_gwf_model_dir,
                          "--device",
                          "cpu",
                          "--listen",
                          listen,
                          "--name",
                          "tiny",
                          "--threads",
                          "1",
                          "--kv-blocks",
                          "48",
                          "--block-size",
                          "32",
                          "--log-level",
                          "warn",
                          NULL};
    assert_int_equal(ig_proc_start_bin(w, "infergate", args, IG_PROC_QUIET), 0);
}

/* A gateway with no model files (the model has no path) over the discovered
 * workers; no exploration, so that every pick is the cost model's (the test
 * reads where the index sends each prompt). */
static void start_gateway(ig_proc_t *gw, int port, int wport, int dport)
{
    assert_int_equal(
        ig_gwf_serve_config(
            gw, port, "warn", 0, 20000, 30000,
            "{\"region\":\"r\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
            "\"routing\":{\"policy\":\"latency\",\"explore_ratio\":0},"
            "\"models\":[{\"name\":\"tiny\"}],"
            "\"pools\":[{\"name\":\"remote\",\"model\":\"tiny\",\"max_instances\":4,"
            "\"discover\":{\"dns\":\"workers.test\",\"port\":%d,\"interval_s\":0.2,"
            "\"resolver\":\"127.0.0.1:%d\"}}]}",
            port, wport, dport),
        0);
}

#define TENANTS 6

static void test_replicas_agree(void **state)
{
    (void)state;
    if (access(IG_DNSMASQ, X_OK) != 0) {
        fprintf(stderr, "dnsmasq not installed (scripts/deps.sh test)\n");
        skip();
    }
    int wport = ig_proc_free_port(), dport = ig_proc_free_port();
    int pa = ig_proc_free_port(), pb = ig_proc_free_port();
    char hosts[160];
    snprintf(hosts, sizeof(hosts), "%s/hosts", ig_gwf_run_dir);
    const char *text = "127.0.0.2 workers.test\n127.0.0.3 workers.test\n";
    assert_int_equal(ig_tf_replace(hosts, text, strlen(text)), 0);
    ig_proc_t w[2], dns, ga, gb;
    for (int i = 0; i < 2; i++)
        start_worker(&w[i], ips[i], wport);
    for (int i = 0; i < 2; i++)
        warm_worker(ips[i], wport, 3);
    assert_int_equal(ig_dnsmasq_start(&dns, dport, hosts), 0);
    start_gateway(&ga, pa, wport, dport);
    assert_int_equal(wait_exact(pa, ips, 2, 30000), 0);

    /* Gateway A alone: each tenant's prefix lands somewhere and is found
     * there again (no tokenizer here: the prompts are token ids). */
    char where[TENANTS][64], up[64];
    int prefix;
    for (int t = 0; t < TENANTS; t++) {
        send_prompt(pa, t, 0, where[t], sizeof(where[t]), &prefix);
        json_t *in = instance(pa, where[t]);
        snprintf(where[t], sizeof(where[t]), "%s",
                 json_string_value(json_object_get(in, "device")));
        json_decref(in);
    }
    for (int t = 0; t < TENANTS; t++)
        assert_int_equal(wait_blocks(pa, where[t], 3, 5000), 0);

    /* Gateway B, late: it learns all of that from the snapshots. */
    start_gateway(&gb, pb, wport, dport);
    assert_int_equal(wait_exact(pb, ips, 2, 30000), 0);
    int total = 0;
    for (int i = 0; i < 2; i++) {
        json_t *a = instance(pa, ips[i]), *b = instance(pb, ips[i]);
        total += exact_blocks(a);
        assert_int_equal(exact_blocks(a), exact_blocks(b));
        /* Each has the worker's load report from the stream too. */
        assert_true(json_integer_value(json_object_get(json_object_get(b, "kv_events"), "loads")) >=
                    1);
        json_decref(a);
        json_decref(b);
    }
    assert_true(total >= 3 * TENANTS);
    /* Both send each tenant where its prefix lives, alternately. The pick
     * weighs the 96 cached tokens against the workers' learned hold times,
     * whose noise under a sanitizer's slowness can outweigh so short a
     * prefill now and then: at most one send in six may go elsewhere, and
     * one that lands on its prefix must know it holds all 96 tokens. */
    int home = 0;
    for (int t = 0; t < TENANTS; t++) {
        for (int g = 0; g < 2; g++) {
            int port = g ? pb : pa;
            send_prompt(port, t, 1 + g, up, sizeof(up), &prefix);
            json_t *in = instance(port, up);
            const char *dev = json_string_value(json_object_get(in, "device"));
            if (strcmp(dev, where[t]) != 0) {
                fprintf(stderr, "tenant %d: gateway %c sent it to %s, its prefix is on %s\n", t,
                        'A' + g, dev, where[t]);
            } else {
                home++;
                assert_int_equal(prefix, 96);
            }
            json_decref(in);
        }
    }
    assert_true(home >= 2 * TENANTS - 2 * TENANTS / 6);
    /* And they agree block for block once the events are in. */
    int same = 0;
    for (long long end = ig_tc_now_ms() + 3000; !same && ig_tc_now_ms() < end; usleep(50000)) {
        same = 1;
        for (int i = 0; i < 2; i++) {
            json_t *a = instance(pa, ips[i]), *b = instance(pb, ips[i]);
            same &= exact_blocks(a) >= 0 && exact_blocks(a) == exact_blocks(b);
            json_decref(a);
            json_decref(b);
        }
    }
    assert_true(same);

    ig_proc_stop(&gb, SIGTERM, 10000);
    ig_proc_stop(&ga, SIGTERM, 10000);
    for (int i = 0; i < 2; i++) {
        ig_proc_stop(&w[i], SIGTERM, 10000);
        ig_proc_dispose(&w[i]);
    }
    ig_proc_stop(&dns, SIGTERM, 5000);
    ig_proc_dispose(&gb);
    ig_proc_dispose(&ga);
    ig_proc_dispose(&dns);
}

static void test_text_prompt_tokenizer_fetched(void **state)
{
    (void)state;
    int wport = ig_proc_free_port(), port = ig_proc_free_port();
    ig_proc_t w, gw;
    start_worker(&w, "127.0.0.1", wport);
    assert_int_equal(
        ig_gwf_serve_config(
            &gw, port, "warn", 0, 20000, 30000,
            "{\"region\":\"r\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
            "\"routing\":{\"policy\":\"latency\",\"explore_ratio\":0},"
            "\"models\":[{\"name\":\"tiny\"}],"
            "\"pools\":[{\"name\":\"remote\",\"model\":\"tiny\","
            "\"discover\":{\"dns\":\"localhost\",\"port\":%d,\"interval_s\":0.5}}]}",
            port, wport),
        0);
    const char *names[] = {"127.0.0.1"};
    assert_int_equal(wait_exact(port, names, 1, 30000), 0);
    /* About 150 tokens of text: four blocks of 32 and some. */
    char text[1200] = "";
    for (int k = 0; k < 30; k++)
        snprintf(text + strlen(text), sizeof(text) - strlen(text), "tenant seven asks %d, ", k);
    json_t *b = json_pack("{s:s, s:s, s:i}", "model", "tiny", "prompt", text, "max_tokens", 1);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    int prefix = 0;
    for (long long end = ig_tc_now_ms() + 20000; prefix == 0 && ig_tc_now_ms() < end;
         usleep(100000)) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(port, "/v1/completions", body, &r, 30000), 0);
        assert_int_equal(r.status, 200);
        prefix = (int)ig_tc_route_num(ig_tc_header(&r, "x-infergate-route"), "prefix_tokens");
        ig_tc_response_free(&r);
    }
    free(body);
    assert_true(prefix >= 3 * 32);
    assert_int_equal(ig_proc_stop(&gw, SIGTERM, 10000), 0);
    ig_proc_dispose(&gw);
    ig_proc_stop(&w, SIGTERM, 10000);
    ig_proc_dispose(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_worker_leaves_index),
        cmocka_unit_test(test_replicas_agree),
        cmocka_unit_test(test_text_prompt_tokenizer_fetched),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
