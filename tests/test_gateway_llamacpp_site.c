/*
 * llama.cpp's llama-server as a site (built outside the tree:
 * $LLAMACPP_BIN, default /work/peers/llama.cpp/build/bin; the test returns
 * 77, skipped, without it). Two servers on the same `mkmodel --format gguf`
 * file: one with --jinja (its chat templates and tool calling), one with
 * --embeddings. A function-calling chat request and an embeddings request
 * go through the gateway and directly; the answers must be the same (but
 * for the fields a server makes up per answer: id, created, timings), the
 * chat answer must carry llama-server's tool call, and the body each
 * server logged (its -v log prints every request body) must be the
 * client's, field for field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"
#include "gwfixture.h"
#include "llamacpp.h"
#include "proc.h"
#include "testclient.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *bin;
static char dir[4096];
static ig_proc_t chat_srv, embed_srv, gw;

/* Starts llama-server on model with the flags in extra (NULL-terminated,
 * at most 4) and -v, and waits until /health answers 200 (60 s). */
static int start_server(ig_proc_t *p, const char *model, const char *const *extra)
{
    char port[16];
    int pn = ig_proc_free_port();
    snprintf(port, sizeof(port), "%d", pn);
    char *argv[24] = {(char *)bin, "-m", (char *)model, "--port", port,  "--host", "127.0.0.1",
                      "-t",        "1",  "-c",          "2048",   "-np", "1",      "-v"};
    int n = 14;
    for (int i = 0; extra[i] != NULL && i < 4; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    if (ig_proc_start(p, argv, IG_PROC_PIPES) != 0)
        return -1;
    p->port = pn;
    return ig_proc_wait_status(pn, "/health", 200, 60000);
}

static int setup(void **state)
{
    (void)state;
    char path[4200], cmd[4400];
    if (ig_tf_mkdtemp(dir, sizeof(dir)) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/tiny.gguf", dir);
    snprintf(cmd, sizeof(cmd),
             "'%s' mkmodel --preset tiny --dtype f32 --format gguf --out '%s' "
             ">/dev/null",
             ig_proc_bin("infergate"), path);
    static const char *const chat_flags[] = {"--jinja", NULL};
    static const char *const embed_flags[] = {"--embeddings", "--pooling", "mean", NULL};
    if (system(cmd) != 0 || start_server(&chat_srv, path, chat_flags) != 0 ||
        start_server(&embed_srv, path, embed_flags) != 0)
        return -1;
    int port = ig_proc_free_port();
    return ig_gwf_serve_config(
        &gw, port, "warn", 0, 10000, 20000,
        "{\"region\":\"lc\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
        "\"sites\":[{\"name\":\"chat\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"tiny\"]},"
        "{\"name\":\"embed\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"tiny-embed\"]}]}",
        port, chat_srv.port, embed_srv.port);
}

static int teardown(void **state)
{
    (void)state;
    ig_proc_t *all[] = {&gw, &chat_srv, &embed_srv};
    for (int i = 0; i < 3; i++) {
        ig_proc_stop(all[i], SIGTERM, 10000);
        ig_proc_dispose(all[i]);
    }
    ig_tf_rmtree(dir);
    return 0;
}

/* POSTs body to path on port: the parsed 200 answer without the fields a
 * server makes up per answer (new reference). */
static json_t *answer(int port, const char *path, const char *body)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, path, body, &r, 60000), 0);
    print_message("%d %s -> %d %.400s\n", port, path, r.status, r.body ? r.body : "");
    assert_int_equal(r.status, 200);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    ig_tc_response_free(&r);
    assert_non_null(j);
    static const char *const made_up[] = {"id", "created", "timings", "__verbose",
                                          "system_fingerprint"};
    for (size_t i = 0; i < sizeof(made_up) / sizeof(made_up[0]); i++)
        json_object_del(j, made_up[i]);
    return j;
}

/* The request bodies p logged since from ("request:  {...}" lines of its
 * -v log). */
static int count_logged(const ig_proc_t *p, size_t from)
{
    int n = 0;
    for (const char *s = p->err != NULL ? p->err + from : ""; (s = strstr(s, "request:  {")); s++)
        n++;
    return n;
}

/* Waits for expect such bodies since *from; each must equal body. Returns
 * how many there were. */
static int logged_bodies_equal(ig_proc_t *p, size_t *from, const char *body, int expect)
{
    json_t *want = json_loads(body, 0, NULL);
    assert_non_null(want);
    /* the server logs a request after its answer: wait for them (10 s; its
     * verbose log keeps the pipe busy, so the wait is by the clock) */
    long long until = ig_tc_now_ms() + 10000;
    while (count_logged(p, *from) < expect && ig_tc_now_ms() < until)
        ig_proc_pump(p, 100);
    int n = 0;
    const char *s = p->err != NULL ? p->err + *from : "";
    const char *at;
    while ((at = strstr(s, "request:  {")) != NULL) {
        const char *b = at + strlen("request:  ");
        const char *nl = strchr(b, '\n');
        size_t len = nl != NULL ? (size_t)(nl - b) : strlen(b);
        json_t *got = json_loadb(b, len, 0, NULL);
        if (got == NULL || !json_equal(got, want))
            print_message("logged %.*s\n", (int)len, b);
        assert_non_null(got);
        assert_true(json_equal(got, want));
        json_decref(got);
        n++;
        s = b + len;
    }
    *from = p->errlen;
    json_decref(want);
    return n;
}

/* POSTs body to path through the gateway and straight to srv: the answers
 * must be equal and srv must have logged body, unchanged, for both. Returns
 * the gateway's answer (new reference). */
static json_t *same_as_direct(ig_proc_t *srv, const char *path, const char *body)
{
    ig_proc_pump(srv, 0);
    size_t from = srv->errlen;
    json_t *via = answer(gw.port, path, body);
    json_t *direct = answer(srv->port, path, body);
    assert_true(json_equal(via, direct));
    json_decref(direct);
    assert_int_equal(logged_bodies_equal(srv, &from, body, 2), 2);
    return via;
}

static void test_tool_call_same_as_direct(void **state)
{
    (void)state;
    /* tool_choice "required" makes llama-server constrain the answer to a
     * tool call; the bias on '"' (token 484 of the tiny vocabulary, in
     * llama.cpp's own [[id, bias]] form) ends the random model's argument
     * string at once, so the call completes within max_tokens. */
    static const char body[] =
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"the weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
        "\"tool_choice\":\"required\",\"logit_bias\":[[484,100]],\"max_tokens\":60,"
        "\"temperature\":0,\"seed\":1}";
    json_t *via = same_as_direct(&chat_srv, "/v1/chat/completions", body);
    json_t *c = json_array_get(json_object_get(via, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    json_t *call = json_array_get(json_object_get(json_object_get(c, "message"), "tool_calls"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(call, "function"), "name")),
        "get_weather");
    json_decref(via);
}

static void test_embeddings_same_as_direct(void **state)
{
    (void)state;
    static const char body[] = "{\"model\":\"tiny-embed\",\"input\":[\"once upon a time\","
                               "\"the end\"],\"encoding_format\":\"float\"}";
    json_t *via = same_as_direct(&embed_srv, "/v1/embeddings", body);
    json_t *data = json_object_get(via, "data");
    assert_int_equal(json_array_size(data), 2);
    assert_true(json_array_size(json_object_get(json_array_get(data, 1), "embedding")) > 0);
    json_decref(via);
}

int main(void)
{
    if ((bin = ig_llamacpp_server()) == NULL) {
        printf(
            "# SKIP: no llama-server in $LLAMACPP_BIN (default /work/peers/llama.cpp/build/bin)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_call_same_as_direct),
        cmocka_unit_test(test_embeddings_same_as_direct),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
