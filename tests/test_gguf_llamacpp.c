/*
 * The same F32 GGUF gives the same greedy text in our worker and in
 * llama.cpp's llama-server (built outside the tree: $LLAMACPP_BIN, default
 * /work/peers/llama.cpp/build/bin; the test returns 77, skipped, without
 * it). The file is `mkmodel --format gguf` of two presets (tiny: 2 layers,
 * small: the 6-layer stories15M shape, both SentencePiece vocabularies);
 * both servers get the same prompt as token ids, BOS first, and generate
 * 24 tokens at temperature 0 over real loopback sockets, and the texts
 * must be equal. (On random weights a near-tie between the two best logits
 * could in principle be decided differently by two correct F32 engines;
 * their logits agree to ~1e-5 here, far below the gaps these seeds give.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"
#include "proc.h"
#include "testclient.h"

#include "infergate/mkmodel.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char bin[1024];

static const char *llamacpp_server(void)
{
    const char *d = getenv("LLAMACPP_BIN");
    snprintf(bin, sizeof(bin), "%s/llama-server", d && *d ? d : "/work/peers/llama.cpp/build/bin");
    return access(bin, X_OK) == 0 ? bin : NULL;
}

/* POSTs body to 127.0.0.1:port path; the parsed JSON reply (new), or NULL. */
static json_t *post(int port, const char *path, const char *body)
{
    char raw[8192];
    snprintf(raw, sizeof(raw),
             "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             path, strlen(body), body);
    ig_tc_response_t r;
    if (ig_tc_request(port, raw, &r, 60000) != 0)
        return NULL;
    json_t *j = r.status == 200 ? json_loadb(r.body, r.body_len, 0, NULL) : NULL;
    if (j == NULL)
        print_message("# %d: status %d: %.300s\n", port, r.status, r.body ? r.body : "");
    ig_tc_response_free(&r);
    return j;
}

static void check_preset(const char *preset, const char *server)
{
    char dir[4096], path[4200], err[512], cmd[4400];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/%s.gguf", dir, preset);
    snprintf(cmd, sizeof(cmd),
             "'%s' mkmodel --preset %s --dtype f32 --format gguf --out '%s' >/dev/null",
             ig_proc_bin("infergate"), preset, path);
    assert_int_equal(system(cmd), 0);
    (void)err;

    int lport = ig_proc_free_port(), wport = ig_proc_free_port();
    char lp[16], wl[64];
    snprintf(lp, sizeof(lp), "%d", lport);
    snprintf(wl, sizeof(wl), "127.0.0.1:%d", wport);
    char *largv[] = {(char *)server, "-m", path, "--port", lp,    "--host", "127.0.0.1",
                     "-t",           "1",  "-c", "512",    "-np", "1",      NULL};
    ig_proc_t L, W;
    assert_int_equal(ig_proc_start(&L, largv, IG_PROC_PIPE_ERR | IG_PROC_PIPE_OUT), 0);
    const char *wargv[] = {"worker",   "--model", path,          "--device", "cpu:1",
                           "--listen", wl,        "--log-level", "warn",     NULL};
    assert_int_equal(ig_proc_start_bin(&W, "infergate", wargv, 0), 0);
    assert_int_equal(ig_proc_wait_status(wport, "/ready", 200, 30000), 0);
    assert_int_equal(ig_proc_wait_status(lport, "/health", 200, 60000), 0);

    const char *ids = "[1, 1200, 340, 2000, 77, 901, 15, 3000, 42]";
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"prompt\": %s, \"n_predict\": 24, \"temperature\": 0, \"top_k\": 1, "
             "\"cache_prompt\": false, \"n_probs\": 2}",
             ids);
    json_t *lj = post(lport, "/completion", body);
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": 24, \"temperature\": 0}", ids);
    json_t *wj = post(wport, "/v1/completions", body);
    assert_non_null(lj);
    assert_non_null(wj);
    const char *lt = json_string_value(json_object_get(lj, "content"));
    const char *wt = json_string_value(
        json_object_get(json_array_get(json_object_get(wj, "choices"), 0), "text"));
    assert_non_null(lt);
    assert_non_null(wt);
    print_message("# %s: llama.cpp \"%s\"\n#   infergate \"%s\"\n", preset, lt, wt);
    assert_true(strlen(wt) > 0);
    assert_string_equal(lt, wt);
    json_decref(lj);
    json_decref(wj);
    ig_proc_stop(&W, 15, 5000);
    ig_proc_stop(&L, 15, 5000);
    ig_proc_dispose(&W);
    ig_proc_dispose(&L);
    ig_tf_rmtree(dir);
}

static void test_tiny_same_greedy_text(void **state)
{
    check_preset("tiny", *state);
}

static void test_small_same_greedy_text(void **state)
{
    check_preset("small", *state);
}

int main(void)
{
    const char *server = llamacpp_server();
    if (server == NULL) {
        printf(
            "# SKIP: no llama-server in $LLAMACPP_BIN (default /work/peers/llama.cpp/build/bin)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_tiny_same_greedy_text, (void *)server),
        cmocka_unit_test_prestate(test_small_same_greedy_text, (void *)server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
