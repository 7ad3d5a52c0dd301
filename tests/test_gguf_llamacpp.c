/*
 * `mkmodel --format gguf` files in llama.cpp's llama-server (built outside
 * the tree: $LLAMACPP_BIN, default /work/peers/llama.cpp/build/bin; the test
 * returns 77, skipped, without it), every preset:
 *   - tiny and small (llama, SentencePiece) and gqa (qwen2: q/k/v biases,
 *     ChatML byte-level vocabulary, pre "qwen2") in F32: both servers get
 *     the same prompt as token ids and generate 24 tokens at temperature 0
 *     over real loopback sockets, and the texts must be equal. (On random
 *     weights a near-tie between the two best logits could in principle be
 *     decided differently by two correct F32 engines; their logits agree to
 *     ~1e-5 here, far below the gaps these seeds give.)
 *   - 1b (llama, Llama-3 byte-level vocabulary, pre "llama-bpe", BF16,
 *     llama3 rope): llama-server loads it, and its /tokenize gives the ids
 *     of our tokenizer read from the same file.
 *   - qwen3 is written with llama.cpp's later "qwen3" names, which the
 *     February 2025 llama.cpp does not know yet: that llama-server must
 *     refuse it for that reason alone; a newer one must load it and give,
 *     along its greedy text, our best token but for near ties (as in the
 *     llama-quantize case below). test_gguf_llamacpp_qwen3 holds a newer
 *     build to the F32 bound.
 *   - tiny and small again with `--quantize q4_0`, gqa with `--quantize
 *     q4_k_m`: the same greedy text from both (and not the F32 one: the
 *     quantization shows).
 *   - with the argument `llama-quantize` (ctest's test_gguf_llamacpp_quantize;
 *     77 without $LLAMACPP_BIN/llama-quantize), only this: gqa in F32 made
 *     Q4_K_M by llama.cpp's own llama-quantize, which holds Q4_K and Q6_K
 *     matrices and nothing else quantized: the same token ids, and along
 *     llama-server's greedy text for 3 prompts x 24 tokens our worker's
 *     next token on the same context is llama.cpp's but for near ties, with
 *     the log-probabilities of both engines' 5 best within 0.03. (The
 *     greedy texts themselves part at the first near tie: llama.cpp rounds
 *     x per 256 for K-quants, we per 32.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"
#include "llamacpp.h"
#include "proc.h"
#include "testclient.h"

#include "infergate/dtype.h"
#include "infergate/gguf.h"
#include "infergate/mkmodel.h"
#include "infergate/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes the preset as GGUF into dir (F32 but for 1b; quant: "" or a
 * --quantize value for mkmodel, the file's matrices in it); its path in
 * path. */
static void make_preset(char *path, size_t len, const char *dir, const char *preset,
                        const char *quant)
{
    char cmd[4400], qf[64] = "";
    snprintf(path, len, "%s/%s.gguf", dir, preset);
    if (*quant)
        snprintf(qf, sizeof(qf), "--quantize %s", quant);
    snprintf(cmd, sizeof(cmd), "'%s' mkmodel --preset %s %s %s --format gguf --out '%s' >/dev/null",
             ig_proc_bin("infergate"), preset, strcmp(preset, "1b") ? "--dtype f32" : "", qf, path);
    assert_int_equal(system(cmd), 0);
}

/* Log-probabilities of llama-quantize's file in the two engines differ by
 * up to ~0.013 here: for K-quant weights llama.cpp rounds x to 8 bits per
 * 256 (Q8_K), we per 32. A wrong weight shows more: a Q6_K offset of 31 s
 * instead of 32 s moves them by up to 0.06 and changes the best token at
 * 19 of these 72 positions, against 3 near ties. */
#define NEAR_TIE 0.03

/* llama-server (L on lport) and our worker (W on wport), one thread each,
 * on one file. */
typedef struct {
    ig_proc_t L, W;
    int lport, wport;
} pair_t;

/* Starts llama-server on path with ig_proc_start's flags, not waiting for
 * it. */
static void start_llama(pair_t *p, const char *server, const char *path, int flags)
{
    char lp[16];
    p->lport = ig_proc_free_port();
    snprintf(lp, sizeof(lp), "%d", p->lport);
    char *largv[] = {(char *)server, "-m", (char *)path, "--port", lp,    "--host", "127.0.0.1",
                     "-t",           "1",  "-c",         "512",    "-np", "1",      NULL};
    assert_int_equal(ig_proc_start(&p->L, largv, flags), 0);
}

/* Starts our worker on path and waits until both answer. */
static void start_worker(pair_t *p, const char *path)
{
    char wl[64];
    p->wport = ig_proc_free_port();
    snprintf(wl, sizeof(wl), "127.0.0.1:%d", p->wport);
    const char *wargv[] = {"worker",   "--model", path,          "--device", "cpu:1",
                           "--listen", wl,        "--log-level", "warn",     NULL};
    assert_int_equal(ig_proc_start_bin(&p->W, "infergate", wargv, 0), 0);
    assert_int_equal(ig_proc_wait_status(p->lport, "/health", 200, 120000), 0);
    assert_int_equal(ig_proc_wait_status(p->wport, "/ready", 200, 30000), 0);
}

static void stop_pair(pair_t *p)
{
    ig_proc_stop(&p->W, 15, 5000);
    ig_proc_stop(&p->L, 15, 5000);
    ig_proc_dispose(&p->W);
    ig_proc_dispose(&p->L);
}

/* llama-server and our worker on the file at path (of the preset; label
 * names it in messages): see the head of this file. */
static void check_file(const char *path, const char *preset, const char *label, const char *server)
{
    int big = strcmp(preset, "1b") == 0, qwen3 = strcmp(preset, "qwen3") == 0;
    pair_t P;
    /* Its log is read only for qwen3; elsewhere it is dropped, since no
     * pipe is read while the test waits on HTTP and a newer build logs
     * every request. */
    start_llama(&P, server, path, qwen3 ? IG_PROC_PIPES : IG_PROC_QUIET);
    if (qwen3) {
        /* A llama.cpp older than Qwen3 stops at the architecture name,
         * before anything else of the file is read; now and then its loader
         * thread's throw ends the process (std::terminate) before the
         * message is out. A refusal is either, with the model never loaded;
         * a newer one loads the file and gets the comparison. */
        int said = 0, loaded = 0, died = 0;
        for (int t = 0; t < 720 && !said && !loaded && !died; t++) {
            ig_proc_pump(&P.L, 250);
            said = P.L.err && strstr(P.L.err, "unknown model architecture: 'qwen3'");
            loaded = P.L.err && strstr(P.L.err, "model loaded");
            died = !said && !loaded && ig_proc_wait_exit(&P.L, 0) >= 0;
        }
        said = P.L.err && strstr(P.L.err, "unknown model architecture: 'qwen3'");
        if (loaded) {
            /* Again with its log dropped, as above. */
            ig_proc_stop(&P.L, 15, 5000);
            ig_proc_dispose(&P.L);
            start_llama(&P, server, path, IG_PROC_QUIET);
            start_worker(&P, path);
            ig_llamacpp_same_tokens(P.lport, path);
            print_message("# qwen3: this llama.cpp loads it (test_gguf_llamacpp_qwen3 holds it "
                          "to the F32 bound)\n");
            int same = ig_llamacpp_compare_forced(P.lport, P.wport,
                                                  "[1, 1200, 340, 2000, 77, 901, 15, 3000, 42]", 24,
                                                  NEAR_TIE, NULL);
            assert_true(same >= 24 * 3 / 4);
            stop_pair(&P);
            return;
        }
        if (!said && !(died && P.L.err && strstr(P.L.err, "terminate called"))) {
            fprintf(stderr, "llama-server's stderr:\n%s\n", P.L.err ? P.L.err : "(none)");
            fail_msg("qwen3: llama-server neither refused the architecture nor loaded it");
        }
        print_message("# qwen3: this llama.cpp does not know the qwen3 architecture\n");
        ig_proc_stop(&P.L, 9, 5000);
        ig_proc_dispose(&P.L);
        return;
    }
    if (big) {
        assert_int_equal(ig_proc_wait_status(P.lport, "/health", 200, 120000), 0);
        ig_llamacpp_same_tokens(P.lport, path);
        print_message("# %s: loaded by llama-server, same token ids\n", preset);
        ig_proc_stop(&P.L, 15, 5000);
        ig_proc_dispose(&P.L);
        return;
    }
    start_worker(&P, path);
    ig_llamacpp_same_tokens(P.lport, path);

    char *lt, *wt;
    ig_llamacpp_greedy(P.lport, P.wport, "[1, 1200, 340, 2000, 77, 901, 15, 3000, 42]", 24,
                       ", \"n_probs\": 2", &lt, &wt);
    print_message("# %s: llama.cpp \"%s\"\n#   infergate \"%s\"\n", label, lt, wt);
    assert_true(strlen(wt) > 0);
    assert_string_equal(lt, wt);
    free(lt);
    free(wt);
    stop_pair(&P);
}

/* quant: "" or a --quantize value for mkmodel. */
static void check_preset(const char *preset, const char *quant, const char *server)
{
    char dir[4096], path[4200], label[128];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    make_preset(path, sizeof(path), dir, preset, quant);
    snprintf(label, sizeof(label), "%s %s", preset, quant);
    check_file(path, preset, label, server);
    ig_tf_rmtree(dir);
}

static void test_every_preset(void **state)
{
    int n = 0;
    for (size_t i = 0; ig_mkmodel_preset_name(i) != NULL; i++, n++)
        check_preset(ig_mkmodel_preset_name(i), "", *state);
    assert_int_equal(n, 5); /* a new preset gets its check here */
}

/* Q4_0 files: llama.cpp quantizes x per block of 32 for them as we do, and
 * sums each block's integer products exactly: the greedy text is the same.
 * Q4_K_M (gqa: every row a whole number of 256-weight super-blocks): its
 * x is quantized per 256 (Q8_K), ours per 32, so the logits differ by
 * more; these seeds' gaps are wider. */
static void test_quantized(void **state)
{
    check_preset("tiny", "q4_0", *state);
    check_preset("small", "q4_0", *state);
    check_preset("gqa", "q4_k_m", *state);
}

/* llama-quantize's Q4_K_M of the F32 gqa preset (every row whole
 * super-blocks of 256, so no fallback type): llama.cpp's mix, Q6_K for
 * output.weight and for some layers' attn_v and ffn_down, Q4_K for the
 * other matrices; quantized by its own search (make_qkx2_quants), not by
 * mkmodel's. */
static void test_llama_quantize_q4_k_m(void **state)
{
    const char *const *bins = *state;
    char dir[4096], f32[4200], out[4200], log[4200], cmd[13000], err[512];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    make_preset(f32, sizeof(f32), dir, "gqa", "");
    snprintf(out, sizeof(out), "%s/gqa-q4_k_m.gguf", dir);
    snprintf(log, sizeof(log), "%s/quantize.log", dir);
    snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' Q4_K_M 1 >'%s' 2>&1", bins[1], f32, out, log);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", log);
        int shown = system(cmd);
        fail_msg("llama-quantize failed (its log's tail %s)", shown == 0 ? "above" : "unread");
    }
    ig_gguf_t *g;
    if (ig_gguf_open(&g, out, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    int q4k = 0, q6k = 0;
    for (size_t i = 0; i < ig_gguf_tensor_count(g); i++) {
        const ig_gguf_tensor_t *t = ig_gguf_tensor_at(g, i);
        q4k += t->dtype == IG_DTYPE_Q4_K;
        q6k += t->dtype == IG_DTYPE_Q6_K;
        if (t->ndim == 2 && t->dtype != IG_DTYPE_Q4_K && t->dtype != IG_DTYPE_Q6_K)
            fail_msg("%s: %s, not a K-quant", t->name, ig_dtype_name(t->dtype));
    }
    ig_gguf_close(g);
    print_message("# llama-quantize Q4_K_M: %d Q4_K and %d Q6_K matrices\n", q4k, q6k);
    assert_true(q4k > 0 && q6k > 0);

    pair_t P;
    start_llama(&P, bins[0], out, IG_PROC_QUIET);
    start_worker(&P, out);
    ig_llamacpp_same_tokens(P.lport, out);
    static const char *const prompts[] = {
        "[1, 1200, 340, 2000, 77, 901, 15, 3000, 42]",
        "[5, 6000, 12, 812, 4095, 300]",
        "[7000, 7001, 33, 2048, 99, 1024, 512, 8000]",
    };
    int same = 0, n = 24;
    for (size_t i = 0; i < sizeof(prompts) / sizeof(prompts[0]); i++)
        same += ig_llamacpp_compare_forced(P.lport, P.wport, prompts[i], n, NEAR_TIE, NULL);
    /* Near ties are few (3 of 72 here): many would mean a weaker check. */
    assert_true(same >= 3 * n * 3 / 4);
    stop_pair(&P);
    ig_tf_rmtree(dir);
}

int main(int argc, char **argv)
{
    const char *server = ig_llamacpp_server();
    if (server == NULL) {
        printf(
            "# SKIP: no llama-server in $LLAMACPP_BIN (default /work/peers/llama.cpp/build/bin)\n");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "llama-quantize") == 0) {
        static char qbin[1024];
        const char *bins[2] = {server, ig_llamacpp_tool("llama-quantize", qbin, sizeof(qbin))};
        if (bins[1] == NULL) {
            printf("# SKIP: no llama-quantize in $LLAMACPP_BIN\n");
            return 77;
        }
        const struct CMUnitTest q[] = {
            cmocka_unit_test_prestate(test_llama_quantize_q4_k_m, (void *)bins),
        };
        return cmocka_run_group_tests(q, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_every_preset, (void *)server),
        cmocka_unit_test_prestate(test_quantized, (void *)server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
