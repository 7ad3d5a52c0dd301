/*
 * The `qwen3` preset (q/k RMSNorm per head, no biases, ChatML byte-level
 * vocabulary) as `mkmodel --format gguf` writes it, in a llama-server
 * recent enough to know the architecture ($LLAMACPP_NEW_BIN, default
 * /work/peers/llama.cpp-2026/build/bin; 77, skipped, without it):
 *   - llama-server loads the file, and its /tokenize gives the ids of our
 *     tokenizer read from the same file;
 *   - along llama-server's greedy text for 3 token-id prompts x 24 tokens,
 *     our worker's next token on the same context (the prompt and
 *     llama.cpp's tokens before it) is llama.cpp's but for near ties, and the
 *     log-probabilities of both engines' 5 best agree within the bound
 *     below.
 * Both engines compute in F32 (llama-server with an F32 KV cache and flash
 * attention off, so that neither rounds K or V to 16 bits). Each is within
 * ig_bound_forward (tests/support/fp_bound.h) of the exact logits, so the
 * two are within twice that of each other and their log-softmax within four
 * times (a log-probability moves by at most twice the largest logit
 * change). The scale 1 + max|logit| is taken from our engine run in this
 * process on each whole context. The measured difference is printed beside
 * the bound (docs/engine.md).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "engine_fixture.h"
#include "files.h"
#include "llamacpp.h"
#include "proc.h"
#include "testclient.h"

#include "infergate/engine.h"
#include "infergate/kernels.h"
#include "infergate/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NTOK 24
#define MAXCTX 64

static const char *const prompts[] = {
    "[1, 1200, 340, 2000, 77, 901, 15, 3000, 42]",
    "[5, 6000, 12, 812, 4095, 300]",
    "[7000, 7001, 33, 2048, 99, 1024, 512, 8000]",
};

/* 1 + the largest |logit| of our engine over every position of ctx. */
static double logit_scale(ig_engine_t *e, int vocab, const int *ctx, int n)
{
    float *logits = malloc((size_t)n * vocab * sizeof(float));
    assert_non_null(logits);
    assert_int_equal(ig_tbatch_prefill_all(e, ctx, n, &n, 1, logits), 0);
    double m = 0;
    for (size_t i = 0; i < (size_t)n * vocab; i++) {
        assert_false(isnan(logits[i]));
        m = fabs(logits[i]) > m ? fabs(logits[i]) : m;
    }
    free(logits);
    return 1 + m;
}

static void test_qwen3(void **state)
{
    const char *server = *state;
    char dir[4096], path[4200], logf[4200], cmd[9000], err[512] = "";
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/qwen3.gguf", dir);
    snprintf(logf, sizeof(logf), "%s/llama-server.log", dir);
    snprintf(cmd, sizeof(cmd),
             "'%s' mkmodel --preset qwen3 --dtype f32 --format gguf --out '%s' >/dev/null",
             ig_proc_bin("infergate"), path);
    assert_int_equal(system(cmd), 0);

    /* Our engine in this process, for the scale of the bound. */
    ig_model_t *model;
    ig_backend_t *be;
    ig_engine_t *e;
    if (ig_model_load(&model, path, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    const ig_model_config_t *cfg = ig_model_config(model);
    assert_true(cfg->qk_norm);
    assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.kv_blocks = 16;
    if (ig_engine_create(&e, model, be, &o, err, sizeof(err)) != 0)
        fail_msg("engine: %s", err);

    /* llama-server's log goes to a file: its pipe is not read while the
     * test waits on HTTP, and this build logs every request. */
    ig_proc_t L, W;
    int lport = ig_proc_free_port(), wport = ig_proc_free_port();
    char lp[16], wl[64];
    snprintf(lp, sizeof(lp), "%d", lport);
    snprintf(wl, sizeof(wl), "127.0.0.1:%d", wport);
    char *largv[] = {
        (char *)server, "-m",         path,  "--port", lp,     "--host", "127.0.0.1", "-t",  "1",
        "-c",           "512",        "-np", "1",      "-ctk", "f32",    "-ctv",      "f32", "-fa",
        "off",          "--log-file", logf,  NULL};
    assert_int_equal(ig_proc_start(&L, largv, IG_PROC_QUIET), 0);
    const char *wargv[] = {"worker",   "--model", path,          "--device", "cpu:1",
                           "--listen", wl,        "--log-level", "warn",     NULL};
    assert_int_equal(ig_proc_start_bin(&W, "infergate", wargv, 0), 0);
    if (ig_proc_wait_status(lport, "/health", 200, 120000) != 0) {
        snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", logf);
        if (system(cmd) != 0)
            print_message("# no llama-server log\n");
        fail_msg("llama-server did not load the qwen3 file (its log's tail above)");
    }
    assert_int_equal(ig_proc_wait_status(wport, "/ready", 200, 30000), 0);
    ig_llamacpp_same_tokens(lport, path);
    print_message("# qwen3: loaded by llama-server, same token ids\n");

    int same = 0, n = 0;
    for (size_t p = 0; p < sizeof(prompts) / sizeof(prompts[0]); p++) {
        int ctx[MAXCTX];
        json_t *lj = ig_llamacpp_continue(lport, prompts[p], NTOK);
        int len = ig_llamacpp_context(prompts[p], lj, ctx, MAXCTX);
        json_decref(lj);
        double scale = logit_scale(e, cfg->vocab_size, ctx, len);
        double bound = 4 * ig_bound_forward(cfg, len, scale), worst = 0;
        same += ig_llamacpp_compare_forced(lport, wport, prompts[p], NTOK, bound, &worst);
        n += NTOK;
        print_message("#   log-probabilities within %.3g of llama.cpp's, bound %.3g (%.2g%%; "
                      "1 + max|logit| %.3g)\n",
                      worst, bound, 100 * worst / bound, scale);
    }
    /* Near ties are rare in F32 (the bound is small): many would mean a
     * weaker check, or a real difference hiding under it. */
    assert_true(same >= n * 3 / 4);

    ig_proc_stop(&W, 15, 5000);
    ig_proc_stop(&L, 15, 5000);
    ig_proc_dispose(&W);
    ig_proc_dispose(&L);
    ig_engine_free(e);
    be->destroy(be);
    ig_model_free(model);
    ig_tf_rmtree(dir);
}

int main(void)
{
    static char server[1024];
    if (ig_llamacpp_new_tool("llama-server", server, sizeof(server)) == NULL) {
        printf("# SKIP: no llama-server in $LLAMACPP_NEW_BIN (default "
               "/work/peers/llama.cpp-2026/build/bin), a llama.cpp that knows qwen3\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_qwen3, server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
