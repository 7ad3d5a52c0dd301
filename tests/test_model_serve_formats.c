/*
 * `infergate serve` with the new model keys, as real processes: one config
 * with three models of the same tiny weights, "plain" (the Hugging Face
 * directory), "q8" (the same with models[].quantize "q8_0") and "gguf"
 * (models[].path naming a GGUF file written by mkmodel --format gguf).
 * Each answers greedy completions through the gateway; the worker of "q8"
 * runs with --quantize q8_0 and, from its pool's batching.kv_dtype,
 * --kv-dtype bf16 (read from its /proc cmdline), the others without; "plain" and "gguf" give the
 * same text (bit-identical logits, test_gguf_load).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"
#include "gwfixture.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ig_proc_t GW;
static int port;
static char gguf[200];

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    char cmd[1024];
    snprintf(gguf, sizeof(gguf), "%s/tiny.gguf", ig_gwf_run_dir);
    snprintf(cmd, sizeof(cmd), "'%s' mkmodel --preset tiny --format gguf --out '%s' >/dev/null",
             ig_proc_bin("infergate"), gguf);
    if (system(cmd) != 0)
        return -1;
    port = ig_proc_free_port();
    char cfg[4096], path[300];
    snprintf(
        cfg, sizeof(cfg),
        "{\"region\": \"r\", \"listen\": \"127.0.0.1:%d\", \"limits\": {\"drain_grace_ms\": 0},"
        " \"models\": [{\"name\": \"plain\", \"path\": \"%s\"},"
        " {\"name\": \"q8\", \"path\": \"%s\", \"quantize\": \"q8_0\"},"
        " {\"name\": \"gguf\", \"path\": \"%s\"}],"
        " \"pools\": [{\"name\": \"p1\", \"model\": \"plain\", \"devices\": [\"cpu:1\"],"
        " \"min_instances\": 1, \"max_instances\": 1},"
        " {\"name\": \"p2\", \"model\": \"q8\", \"devices\": [\"cpu:1\"],"
        " \"min_instances\": 1, \"max_instances\": 1, \"batching\": {\"kv_dtype\": \"bf16\"}},"
        " {\"name\": \"p3\", \"model\": \"gguf\", \"devices\": [\"cpu:1\"],"
        " \"min_instances\": 1, \"max_instances\": 1}]}",
        port, ig_gwf_model_dir, ig_gwf_model_dir, gguf);
    snprintf(path, sizeof(path), "%s/serve.json", ig_gwf_run_dir);
    if (ig_tf_write(path, cfg, strlen(cfg)) != 0)
        return -1;
    return ig_gwf_serve(&GW, path, port, "warn", 0, 10000, 60000);
}

static int teardown(void **state)
{
    ig_proc_stop(&GW, 15, 10000);
    ig_proc_dispose(&GW);
    ig_gwf_model_teardown(state);
    return 0;
}

static char *complete(const char *model)
{
    char body[256], raw[1024];
    snprintf(body, sizeof(body),
             "{\"model\": \"%s\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8, "
             "\"temperature\": 0}",
             model);
    snprintf(raw, sizeof(raw),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             strlen(body), body);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(port, raw, &r, 30000), 0);
    if (r.status != 200)
        fail_msg("%s: status %d: %s", model, r.status, r.body);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_non_null(j);
    char *text = strdup(json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
    json_decref(j);
    ig_tc_response_free(&r);
    return text;
}

/* Whether a child worker of the gateway serving `name` runs with `flag`
 * followed by `value`. */
static int worker_has(const char *name, const char *flag, const char *value, int *found)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int q = 0;
    *found = 0;
    while (d && (e = readdir(d)) != NULL) {
        char p[300], buf[4096];
        snprintf(p, sizeof(p), "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(p, "rb");
        if (f == NULL)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        int is_worker = 0, has_name = 0, has_q = 0;
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            if (strcmp(buf + i, "worker") == 0)
                is_worker = 1;
            if (strcmp(buf + i, "--name") == 0 && i + 7 < n && strcmp(buf + i + 7, name) == 0)
                has_name = 1;
            if (strcmp(buf + i, flag) == 0 && i + strlen(flag) + 1 < n &&
                strcmp(buf + i + strlen(flag) + 1, value) == 0)
                has_q = 1;
        }
        /* only the workers of this test's gateway: their model is in our run dir */
        if (is_worker && has_name && memmem(buf, n, ig_gwf_run_dir, strlen(ig_gwf_run_dir))) {
            *found = 1;
            q = has_q;
        }
    }
    if (d)
        closedir(d);
    return q;
}

static void test_three_formats_serve(void **state)
{
    char *a = complete("plain"), *b = complete("q8"), *c = complete("gguf");
    print_message("# plain \"%s\", q8 \"%s\", gguf \"%s\"\n", a, b, c);
    assert_true(strlen(a) > 0 && strlen(b) > 0);
    assert_string_equal(a, c);
    int found;
    assert_int_equal(worker_has("q8", "--quantize", "q8_0", &found), 1);
    assert_true(found);
    assert_int_equal(worker_has("q8", "--kv-dtype", "bf16", &found), 1);
    assert_int_equal(worker_has("plain", "--quantize", "q8_0", &found), 0);
    assert_true(found);
    assert_int_equal(worker_has("plain", "--kv-dtype", "bf16", &found), 0);
    assert_int_equal(worker_has("gguf", "--quantize", "q8_0", &found), 0);
    assert_true(found);
    free(a), free(b), free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_three_formats_serve)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
