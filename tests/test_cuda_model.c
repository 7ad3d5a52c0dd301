/*
 * The whole model on the CUDA backend: logits against the CPU backend on the
 * tiny and gqa presets (written by mkmodel in BF16, so that both backends
 * hold the very same weights), and greedy tokens that are the same whether a
 * sequence decodes alone or in a batch.
 *
 * Tolerance of the logits, an error bound (tests/support/fp_bound.h): the CUDA
 * matmuls feed activations rounded to BF16 (round to nearest: 2^-8
 * relative each) to F32-accumulating GEMMs, the CPU keeps them in F32. A
 * logit passes through 4 such roundings per layer (the inputs of q/k/v, of
 * the output projection, of gate/up and of down) and one for lm_head, first
 * order relative to the row's scale: each row must agree within
 * IG_BOUND_C * (4 layers + 1) * 2^-8 of its largest |logit| (7% on tiny,
 * 13% on gqa), plus both sides' f32 budget (ig_bound_forward). The RMS
 * difference over all rows is a statistical check, not a bound: independent
 * roundings add in quadrature, sqrt(4 layers + 1) * 2^-8 / sqrt(3) of the
 * RMS logit (1-2% here); it must stay below the measured 3%.
 *
 * Without a GPU (or without CUDA in the build) the program prints "no usable
 * GPU: <reason>" and exits 77 (ctest: Skipped); with a GPU present, a
 * backend that does not start fails (tests/support/gpu_probe.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fp_bound.h"
#include "gpu_probe.h"

#include "engine_fixture.h"
#include "files.h"
#include "model_fixture.h"

#include "infergate/engine.h"
#include "infergate/error.h"
#include "infergate/kernels.h"
#include "infergate/mkmodel.h"
#include "infergate/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char why[256] = "no usable GPU: this build has no CUDA support (IG_CUDA=OFF)";
static int have_gpu;

static int group_setup(void **state)
{
#ifdef IG_HAVE_CUDA
    ig_backend_t *be = NULL;
    char err[256] = "";
    int rc = ig_backend_cuda_create(&be, 0, err, sizeof(err));
    if (rc == 0) {
        have_gpu = 1;
        be->destroy(be);
    } else if (strncmp(err, "no usable GPU", 13) == 0) {
        snprintf(why, sizeof(why), "%s", err);
    } else {
        snprintf(why, sizeof(why), "no usable GPU: %s (%s)", err, ig_strerror(rc));
    }
#endif
    return 0;
}

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!have_gpu) {                                                                           \
            print_message("%s\n", why);                                                            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static void write_model(const char *preset, char *dir, size_t len)
{
    char err[256] = "";
    ig_mkmodel_opts_t o;
    assert_int_equal(ig_tf_mkdtemp(dir, len), 0);
    ig_mkmodel_opts_default(&o);
    o.preset = preset;
    o.seed = 7;
    o.has_dtype = 1;
    o.dtype = IG_DTYPE_BF16;
    if (ig_mkmodel_write(dir, &o, err, sizeof(err)) != 0)
        fail_msg("mkmodel %s: %s", preset, err);
}

static void open_side(ig_tengine_t *s, const char *dir, const char *device)
{
    char err[256] = "";
    memset(s, 0, sizeof(*s));
    snprintf(s->dir, sizeof(s->dir), "%s", dir);
    if (ig_model_load(&s->model, dir, err, sizeof(err)) != 0)
        fail_msg("load %s: %s", dir, err);
    s->vocab = ig_model_config(s->model)->vocab_size;
    if (ig_backend_open(&s->be, device, 2, err, sizeof(err)) != 0)
        fail_msg("backend %s: %s", device, err);
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.kv_blocks = 96;
    o.block_size = 16;
    o.max_batched_tokens = 256;
    o.max_num_seqs = 16;
    if (ig_engine_create(&s->e, s->model, s->be, &o, err, sizeof(err)) != 0)
        fail_msg("engine on %s: %s", device, err);
}

/* Row-wise and RMS comparison of rows x vocab logits. */
static void compare_logits(const char *what, const float *gpu, const float *cpu, int rows,
                           int vocab, const ig_model_config_t *cfg)
{
    double rel = IG_BOUND_C * (4.0 * cfg->num_hidden_layers + 1) * 0x1p-8;
    double se = 0, sr = 0;
    for (int r = 0; r < rows; r++) {
        const float *g = gpu + (size_t)r * vocab, *c = cpu + (size_t)r * vocab;
        double scale = 0, maxd = 0;
        for (int i = 0; i < vocab; i++) {
            double d = fabs((double)g[i] - c[i]);
            if (!(d <= maxd))
                maxd = d; /* NaN becomes the maximum */
            if (fabs(c[i]) > scale)
                scale = fabs(c[i]);
            se += d * d;
            sr += (double)c[i] * c[i];
        }
        if (!(maxd <= rel * scale + 2 * ig_bound_forward(cfg, 64, 1.0 + scale)))
            fail_msg("%s: row %d differs by %g (largest |logit| %g)", what, r, maxd, scale);
    }
    if (!(sqrt(se) <= 3e-2 * sqrt(sr)))
        fail_msg("%s: RMS difference %g of RMS logit %g", what, sqrt(se / ((double)rows * vocab)),
                 sqrt(sr / ((double)rows * vocab)));
}

/* Prefill of three sequences (every row's logits), then three decode steps
 * fed by the CPU's greedy tokens, on both backends. */
static void check_preset_logits(const char *preset)
{
    char dir[4096];
    ig_tengine_t cpu, gpu;
    enum { NS = 3, STEPS = 3 };
    const int len[NS] = {13, 5, 30};
    write_model(preset, dir, sizeof(dir));
    open_side(&cpu, dir, "cpu");
    open_side(&gpu, dir, "cuda:0");
    int vocab = cpu.vocab, rows = len[0] + len[1] + len[2];
    float *lc = malloc(sizeof(float) * rows * vocab), *lg = malloc(sizeof(float) * rows * vocab);
    ig_tseq_t sc[NS], sg[NS];
    memset(sc, 0, sizeof(sc));
    memset(sg, 0, sizeof(sg));
    static ig_tbatch_t bc, bg;
    ig_tbatch_init(&bc);
    ig_tbatch_init(&bg);
    for (int s = 0; s < NS; s++) {
        int toks[64];
        ig_tprompt(s + 1, len[s], vocab, toks);
        assert_int_equal(ig_tbatch_add(&bc, cpu.e, &sc[s], toks, len[s], 0), 0);
        assert_int_equal(ig_tbatch_add(&bg, gpu.e, &sg[s], toks, len[s], 0), 0);
    }
    assert_int_equal(ig_tbatch_run(&bc, cpu.e, lc), 0);
    assert_int_equal(ig_tbatch_run(&bg, gpu.e, lg), 0);
    char what[64];
    snprintf(what, sizeof(what), "%s prefill", preset);
    compare_logits(what, lg, lc, rows, vocab, ig_model_config(cpu.model));

    int next[NS];
    for (int s = 0, r = 0; s < NS; r += len[s], s++)
        next[s] = ig_argmax(lc + (size_t)(r + len[s] - 1) * vocab, vocab);
    for (int step = 0; step < STEPS; step++) {
        ig_tbatch_init(&bc);
        ig_tbatch_init(&bg);
        for (int s = 0; s < NS; s++) {
            assert_int_equal(ig_tbatch_add(&bc, cpu.e, &sc[s], &next[s], 1, 0), 0);
            assert_int_equal(ig_tbatch_add(&bg, gpu.e, &sg[s], &next[s], 1, 0), 0);
        }
        assert_int_equal(ig_tbatch_run(&bc, cpu.e, lc), 0);
        assert_int_equal(ig_tbatch_run(&bg, gpu.e, lg), 0);
        snprintf(what, sizeof(what), "%s decode step %d", preset, step);
        compare_logits(what, lg, lc, NS, vocab, ig_model_config(cpu.model));
        for (int s = 0; s < NS; s++)
            next[s] = ig_argmax(lc + (size_t)s * vocab, vocab);
    }
    for (int s = 0; s < NS; s++) {
        ig_tseq_release(&sc[s], cpu.e);
        ig_tseq_release(&sg[s], gpu.e);
    }
    free(lc);
    free(lg);
    ig_tengine_close(&cpu);
    ig_tengine_close(&gpu);
    ig_tf_rmtree(dir);
}

static void test_logits_tiny(void **state)
{
    NEED_GPU();
    check_preset_logits("tiny");
}

static void test_logits_gqa(void **state)
{
    NEED_GPU();
    check_preset_logits("gqa");
}

/*
 * Six sequences decode greedily, first each alone, then all together after
 * the same (separate) prefills. Six rows take the cuBLAS path where one row
 * takes the GEMV kernel; both round activations alike, so the tokens match.
 */
static void check_greedy_batched(const char *preset)
{
    enum { NS = 6, STEPS = 6 };
    const int len[NS] = {7, 11, 3, 16, 9, 1};
    char dir[4096];
    ig_tengine_t g;
    int alone[NS][STEPS + 1], together[NS][STEPS + 1];
    write_model(preset, dir, sizeof(dir));
    open_side(&g, dir, "cuda:0");
    float *logits = malloc(sizeof(float) * NS * g.vocab);
    static ig_tbatch_t b;
    ig_tseq_t seq[NS];
    memset(seq, 0, sizeof(seq));

    /* Prefill of sequence s alone; its first token. */
    for (int pass = 0; pass < 2; pass++) {
        int(*out)[STEPS + 1] = pass == 0 ? alone : together;
        for (int s = 0; s < NS; s++) {
            int toks[32];
            ig_tprompt(100 + s, len[s], g.vocab, toks);
            ig_tbatch_init(&b);
            assert_int_equal(ig_tbatch_add(&b, g.e, &seq[s], toks, len[s], len[s] - 1), 0);
            assert_int_equal(ig_tbatch_run(&b, g.e, logits), 0);
            out[s][0] = ig_argmax(logits, g.vocab);
            if (pass == 0) {
                for (int t = 1; t <= STEPS; t++) {
                    ig_tbatch_init(&b);
                    assert_int_equal(ig_tbatch_add(&b, g.e, &seq[s], &out[s][t - 1], 1, 0), 0);
                    assert_int_equal(ig_tbatch_run(&b, g.e, logits), 0);
                    out[s][t] = ig_argmax(logits, g.vocab);
                }
                ig_tseq_release(&seq[s], g.e);
            }
        }
        if (pass == 1) {
            for (int t = 1; t <= STEPS; t++) {
                ig_tbatch_init(&b);
                for (int s = 0; s < NS; s++)
                    assert_int_equal(ig_tbatch_add(&b, g.e, &seq[s], &out[s][t - 1], 1, 0), 0);
                assert_int_equal(ig_tbatch_run(&b, g.e, logits), 0);
                for (int s = 0; s < NS; s++)
                    out[s][t] = ig_argmax(logits + (size_t)s * g.vocab, g.vocab);
            }
            for (int s = 0; s < NS; s++)
                ig_tseq_release(&seq[s], g.e);
        }
    }
    for (int s = 0; s < NS; s++)
        for (int t = 0; t <= STEPS; t++)
            if (alone[s][t] != together[s][t])
                fail_msg("%s: sequence %d token %d: %d alone, %d batched", preset, s, t,
                         alone[s][t], together[s][t]);
    free(logits);
    ig_tengine_close(&g);
    ig_tf_rmtree(dir);
}

static void test_greedy_batched_tiny(void **state)
{
    NEED_GPU();
    check_greedy_batched("tiny");
}

static void test_greedy_batched_gqa(void **state)
{
    NEED_GPU();
    check_greedy_batched("gqa");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_tiny),
        cmocka_unit_test(test_logits_gqa),
        cmocka_unit_test(test_greedy_batched_tiny),
        cmocka_unit_test(test_greedy_batched_gqa),
    };
    group_setup(NULL);
    if (!have_gpu) {
#ifdef IG_HAVE_CUDA
        return ig_test_no_backend("test_cuda_model", 1, why);
#else
        return ig_test_no_backend("test_cuda_model", 0, why);
#endif
    }
    return cmocka_run_group_tests_name("cuda_model", tests, NULL, NULL);
}
