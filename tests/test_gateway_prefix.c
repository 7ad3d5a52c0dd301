/*
 * Prefix-aware routing through `infergate serve` and two real workers: a
 * repeated prompt goes back to the instance that holds it (the route header
 * names its matched prefix tokens), spills to the other instance while the
 * warm one is hot (a long stream in flight there), and the instance it
 * spilled to is warm for that prefix afterwards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"

static ig_proc_t G;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    int port = ig_proc_free_port();
    const char *path = ig_gwf_pool_config("solo", port, ig_gwf_model_dir, 2, 2, 2, 8, NULL,
                                          ",\"routing\":{\"policy\":\"latency\"}");
    if (!path)
        return -1;
    if (ig_gwf_serve(&G, path, port, "warn", 0, 20000, 60000) != 0)
        return -1;
    /* both instances eligible (ready and probed), up to 30 s */
    for (long long t0 = ig_tc_now_ms(); ig_tc_now_ms() - t0 < 30000; usleep(50000)) {
        json_t *st = ig_gwf_get_json(port, "/status");
        json_t *insts =
            json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances");
        int ok = 0;
        for (size_t i = 0; i < json_array_size(insts); i++)
            ok += json_is_true(json_object_get(json_array_get(insts, i), "eligible"));
        json_decref(st);
        if (ok == 2)
            return 0;
    }
    return -1;
}

static int teardown(void **state)
{
    ig_proc_stop(&G, SIGTERM, 10000);
    ig_proc_dispose(&G);
    ig_gwf_model_teardown(state);
    return 0;
}

static char *body_of(int max_tokens, int stream)
{
    static char text[4096];
    text[0] = 0;
    for (int i = 0; i < 10; i++)
        strcat(text, i % 2 ? "the system prompt of tenant one says hello. "
                           : "answer politely and briefly, always. ");
    json_t *b =
        json_pack("{s:s, s:s, s:i, s:f, s:b, s:b}", "model", "tiny", "prompt", text, "max_tokens",
                  max_tokens, "temperature", 0.0, "ignore_eos", 1, "stream", stream);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* A number after key= in the route header, or -1. */
static int route_num(const ig_tc_response_t *r, const char *key)
{
    return (int)ig_tc_route_num(ig_tc_header(r, "x-infergate-route"), key);
}

typedef struct {
    char upstream[32];
    int prefix, runner_prefix;
} routed_t;

static routed_t complete(const char *step)
{
    char *b = body_of(2, 0);
    ig_tc_response_t r;
    if (ig_gwf_post(G.port, "/v1/completions", b, &r, 30000) != 0)
        fail_msg("%s: no answer", step);
    free(b);
    assert_int_equal(r.status, 200);
    routed_t o;
    const char *u = ig_tc_header(&r, "x-infergate-upstream");
    assert_non_null(u);
    snprintf(o.upstream, sizeof(o.upstream), "%s", u);
    o.prefix = route_num(&r, "prefix_tokens");
    o.runner_prefix = route_num(&r, "runner_up_prefix_tokens");
    ig_tc_response_free(&r);
    return o;
}

/* Pairs of short prompts of their own, sent together (the second finds the
 * first in flight: the other instance is the cold one), until both
 * instances have served one, so that each has observed TTFTs: an instance
 * with none is costed at the prior rate, which a slow build can beat. */
static void warm_up(void)
{
    int seen[2] = {0, 0};
    for (int i = 0; i < 10 && !(seen[0] && seen[1]); i++) {
        ig_tc_t *tc[2];
        for (int k = 0; k < 2; k++) {
            char b[160];
            snprintf(b, sizeof(b),
                     "{\"model\":\"tiny\",\"prompt\":\"warm up %d %d\",\"max_tokens\":8,"
                     "\"ignore_eos\":true}",
                     i, k);
            tc[k] = ig_tc_connect(G.port);
            assert_non_null(tc[k]);
            assert_int_equal(ig_tc_send_post(tc[k], "/v1/completions", b), 0);
        }
        for (int k = 0; k < 2; k++) {
            ig_tc_response_t r;
            assert_int_equal(ig_tc_read_response(tc[k], &r, 30000), 0);
            const char *u = ig_tc_header(&r, "x-infergate-upstream");
            if (u && strlen(u) == 5)
                seen[u[4] == '1'] = 1;
            ig_tc_response_free(&r);
            ig_tc_close(tc[k]);
        }
    }
    assert_true(seen[0] && seen[1]);
}

static void test_affinity_then_spill_when_hot(void **state)
{
    warm_up();
    routed_t a = complete("first");
    assert_int_equal(a.prefix, 0); /* nobody held it */
    routed_t b = complete("repeat");
    assert_string_equal(b.upstream, a.upstream);
    assert_true(b.prefix >= 16 * 8); /* the prompt is ~10 blocks of 16 */
    assert_int_equal(b.runner_prefix, 0);

    /* long streams of the same prompt go to the warm instance while it is
     * not hot; once its in-flight count is past the others' by the warm
     * slack (2), the next one spills to the cold instance */
    ig_tc_t *tc[6];
    int nopen = 0, spilled = -1;
    for (; nopen < 6 && spilled < 0; nopen++) {
        tc[nopen] = ig_tc_connect(G.port);
        assert_non_null(tc[nopen]);
        char *sb = body_of(200, 1);
        assert_int_equal(ig_tc_send_post(tc[nopen], "/v1/completions", sb), 0);
        free(sb);
        ig_tc_response_t head;
        assert_int_equal(ig_tc_read_response_ex(tc[nopen], &head, 30000, 1, 0), 0);
        assert_int_equal(head.status, 200);
        const char *u = ig_tc_header(&head, "x-infergate-upstream");
        assert_non_null(u);
        if (strcmp(u, a.upstream) != 0) {
            spilled = nopen;
            assert_int_equal(route_num(&head, "prefix_tokens"), 0);
            assert_true(route_num(&head, "runner_up_prefix_tokens") >= 16 * 8);
        } else {
            assert_true(route_num(&head, "prefix_tokens") >= 16 * 8);
        }
        ig_tc_response_free(&head);
    }
    /* not at the first hint of load (one stream), but before six */
    assert_true(spilled >= 2);
    for (int i = 0; i < nopen; i++)
        ig_tc_close(tc[i]); /* cancels the streams */

    /* the one it spilled to is warm now too: whichever wins, both hold it */
    long long t0 = ig_tc_now_ms();
    routed_t d;
    do {
        d = complete("both warm");
    } while (d.runner_prefix < 0 && ig_tc_now_ms() - t0 < 5000);
    assert_true(d.prefix >= 16 * 8);
    assert_true(d.runner_prefix >= 16 * 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_affinity_then_spill_when_hot),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
