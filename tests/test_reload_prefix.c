/*
 * A model that a reload adds is routed by prefix like one the gateway
 * started with: the gateway starts with no model at all, a reload adds a
 * pool of the tiny model, and a prompt sent twice is found in the prefix
 * index the second time (the route header's prefix_tokens), which needs the
 * gateway to have loaded the new model's tokenizer (docs/routing.md,
 * "Prefix-aware routing"). A second reload that changes nothing keeps it.
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

static ig_proc_t G;
static char path[1024];
static int port;

/* Writes text over path, beside and renamed: a reload never reads half a file. */
static void write_config(const char *text)
{
    assert_int_equal(ig_tf_replace(path, text, strlen(text)), 0);
}

static void reload(void)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    if (r.status != 200)
        fprintf(stderr, "reload: %d %s\n", r.status, r.body);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
}

/* The route header's prefix_tokens of one completion of a prompt of about
 * ten 16-token blocks, or -1. */
static int prefix_tokens(void)
{
    char text[2048] = "";
    for (int i = 0; i < 10; i++)
        strcat(text, i % 2 ? "the system prompt of tenant one says hello. "
                           : "answer politely and briefly, always. ");
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", "tiny", "prompt", text, "max_tokens", 2,
                          "temperature", 0.0);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    ig_tc_response_t r;
    int rc = ig_gwf_post(port, "/v1/completions", body, &r, 30000);
    free(body);
    assert_int_equal(rc, 0);
    if (r.status != 200)
        fprintf(stderr, "completion: %d %s\n", r.status, r.body ? r.body : "");
    assert_int_equal(r.status, 200);
    int n = (int)ig_tc_route_num(ig_tc_header(&r, "x-infergate-route"), "prefix_tokens");
    ig_tc_response_free(&r);
    return n;
}

static void test_added_model_routed_by_prefix(void **state)
{
    (void)state;
    port = ig_proc_free_port();
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"region\":\"r1\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0}}",
             port);
    const char *tmp = ig_proc_temp_file(text, ".json");
    assert_non_null(tmp);
    snprintf(path, sizeof(path), "%s", tmp);
    assert_int_equal(ig_gwf_serve(&G, path, port, "warn", 0, 20000, 0), 0);

    /* The same config as ig_gwf_pool_config's, now with its pool. */
    const char *pool = ig_gwf_pool_config("r1", port, ig_gwf_model_dir, 1, 1, 1, 4, NULL, NULL);
    assert_non_null(pool);
    size_t len;
    char *pool_text = ig_tf_read(pool, &len);
    assert_non_null(pool_text);
    unlink(pool);
    write_config(pool_text);
    reload();
    assert_int_equal(ig_proc_wait_status(port, "/ready", 200, 60000), 0);

    int first = prefix_tokens();
    /* The worker's KV events reach the index on their own connection, so
     * the next request may come first: the index must know the prefix
     * within a second. */
    int second = prefix_tokens(), tries = 1;
    for (; second < 16 * 8 && tries < 10; tries++) {
        usleep(100 * 1000);
        second = prefix_tokens();
    }
    fprintf(stderr, "added by reload: prefix_tokens %d then %d (request %d)\n", first, second,
            tries + 1);
    assert_int_equal(first, 0);    /* nobody held it */
    assert_true(second >= 16 * 8); /* ~10 blocks of 16, found again */

    /* A reload that changes nothing keeps the tokenizer and the index. */
    reload();
    int third = prefix_tokens();
    assert_true(third >= 16 * 8);
    free(pool_text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_added_model_routed_by_prefix),
    };
    if (ig_gwf_model_setup(NULL) != 0)
        return 1;
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ig_proc_stop(&G, SIGTERM, 10000);
    ig_proc_dispose(&G);
    unlink(path);
    ig_gwf_model_teardown(NULL);
    return rc;
}
