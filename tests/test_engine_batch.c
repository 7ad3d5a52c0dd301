/*
 * Batching invariants of the engine: a sequence decoded alone and the same
 * sequence inside a batch of 16 others (which join with prefill chunks while
 * it decodes) gives identical greedy tokens and logits within batch_bound()
 * (with the KV cache in F32, F16 or BF16);
 * prefill in one chunk and in several chunks gives the same logits; the KV block
 * free list; malformed batches are refused without touching the cache.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "../kernels/cpu/cpu_internal.h"
#include "engine_fixture.h"
#include "files.h"
#include "model_fixture.h"

#include "infergate/engine.h"
#include "infergate/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ig_tengine_t *open_ctx_kv(const char *preset, int threads, int kv_blocks, int block_size,
                                 ig_dtype_t kv_dtype)
{
    ig_tengine_t *c = calloc(1, sizeof(*c));
    char err[256] = "";
    assert_int_equal(ig_fixture_model_dir(preset, IG_DTYPE_F32, c->dir, sizeof(c->dir), NULL), 0);
    if (ig_model_load(&c->model, c->dir, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    c->vocab = ig_model_config(c->model)->vocab_size;
    assert_int_equal(ig_backend_cpu_create(&c->be, threads), 0);
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.kv_blocks = kv_blocks;
    o.block_size = block_size;
    o.max_batched_tokens = 512;
    o.max_num_seqs = 32;
    o.kv_dtype = kv_dtype;
    if (ig_engine_create(&c->e, c->model, c->be, &o, err, sizeof(err)) != 0)
        fail_msg("engine: %s", err);
    return c;
}

static ig_tengine_t *open_ctx(const char *preset, int threads, int kv_blocks, int block_size)
{
    return open_ctx_kv(preset, threads, kv_blocks, block_size, IG_DTYPE_F32);
}

static void close_ctx(ig_tengine_t *c)
{
    ig_tengine_close(c);
    ig_tf_rmtree(c->dir);
    free(c);
}

/* Two f32 forward passes of the same tokens that differ only in summation
 * order (another batch, another GEMM path) are each within
 * ig_bound_forward() of the exact logits, so within twice that of each other.
 * The own GEMM is batch-invariant and measures 0; OpenBLAS does not promise
 * it. */
static double batch_bound(const ig_tengine_t *c, int max_ctx, const float *logits, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(logits[i]));
    return 2 * ig_bound_forward(ig_model_config(c->model), max_ctx, 1.0 + mx);
}

#define STEPS 12
#define OTHERS 16
#define PLEN 9

/* Greedy decode of the target sequence alone: tokens and per-step logits. */
static void decode_alone(ig_tengine_t *c, const int *p, int *toks, float *logits)
{
    ig_tseq_t s = {0};
    ig_tbatch_t *b = malloc(sizeof(*b));
    ig_tbatch_init(b);
    assert_int_equal(ig_tbatch_add(b, c->e, &s, p, PLEN, PLEN - 1), 0);
    assert_int_equal(ig_tbatch_run(b, c->e, logits), 0);
    for (int step = 0; step < STEPS; step++) {
        toks[step] = ig_argmax(logits + (size_t)step * c->vocab, c->vocab);
        if (step + 1 == STEPS)
            break;
        ig_tbatch_init(b);
        assert_int_equal(ig_tbatch_add(b, c->e, &s, &toks[step], 1, 0), 0);
        assert_int_equal(ig_tbatch_run(b, c->e, logits + (size_t)(step + 1) * c->vocab), 0);
    }
    ig_tseq_release(&s, c->e);
    free(b);
}

static void check_alone_vs_batch(ig_cpu_gemm_t mode, int threads, ig_dtype_t kv_dtype)
{
    ig_tengine_t *c = open_ctx_kv("tiny", threads, 256, 8, kv_dtype);
    if (ig__cpu_set_gemm(c->be, mode) == IG_ENOTSUP) {
        close_ctx(c);
        return;
    }
    int V = c->vocab;
    int p[PLEN];
    ig_tprompt(7, PLEN, V, p);
    int alone[STEPS];
    float *la = malloc((size_t)STEPS * V * sizeof(float));
    decode_alone(c, p, alone, la);

    /* The target prefills with 16 others of different lengths, then decodes
     * while the others decode too; every fourth step a finished other is
     * replaced by a new one whose prompt arrives in chunks of 5, so decode
     * rows and prefill chunks share batches. */
    ig_tseq_t target = {0}, others[OTHERS];
    int oprompt[OTHERS][40], olen[OTHERS], onext[OTHERS];
    memset(others, 0, sizeof(others));
    float *lb = malloc((size_t)(OTHERS + 1) * 64 * V * sizeof(float));
    ig_tbatch_t *b = malloc(sizeof(*b));
    ig_tbatch_init(b);
    assert_int_equal(ig_tbatch_add(b, c->e, &target, p, PLEN, PLEN - 1), 0);
    for (int o = 0; o < OTHERS; o++) {
        olen[o] = 3 + (o * 7) % 30;
        ig_tprompt(100 + o, olen[o], V, oprompt[o]);
        assert_int_equal(ig_tbatch_add(b, c->e, &others[o], oprompt[o], olen[o], olen[o] - 1), 0);
        onext[o] = -1;
    }
    assert_int_equal(ig_tbatch_run(b, c->e, lb), 0);
    int got[STEPS];
    double worst = 0;
    for (int step = 0; step < STEPS; step++) {
        /* Row 0 of the logits is always the target's. */
        got[step] = ig_argmax(lb, V);
        worst = fmax(worst, ig_max_abs_diff(lb, la + (size_t)step * V, V));
        for (int o = 0, row = 1; o < OTHERS; o++) {
            if (onext[o] == -2) { /* its prompt is still arriving */
                continue;
            }
            onext[o] = ig_argmax(lb + (size_t)row * V, V);
            row++;
        }
        if (step + 1 == STEPS)
            break;
        ig_tbatch_init(b);
        assert_int_equal(ig_tbatch_add(b, c->e, &target, &got[step], 1, 0), 0);
        for (int o = 0; o < OTHERS; o++) {
            if (step % 4 == 3 && o == step % OTHERS) { /* replace: new prompt */
                ig_tseq_release(&others[o], c->e);
                olen[o] = 12;
                ig_tprompt(500 + step, olen[o], V, oprompt[o]);
                onext[o] = -2;
            }
            if (onext[o] == -2) {
                int done = others[o].pos, n = olen[o] - done < 5 ? olen[o] - done : 5;
                int last = done + n == olen[o];
                assert_int_equal(
                    ig_tbatch_add(b, c->e, &others[o], oprompt[o] + done, n, last ? n - 1 : n), 0);
                if (last)
                    onext[o] = -3; /* produces logits this step */
            } else {
                assert_int_equal(ig_tbatch_add(b, c->e, &others[o], &onext[o], 1, 0), 0);
            }
        }
        assert_int_equal(ig_tbatch_run(b, c->e, lb), 0);
        for (int o = 0; o < OTHERS; o++)
            if (onext[o] == -3)
                onext[o] = -1;
    }
    double tol = batch_bound(c, PLEN + STEPS, la, (size_t)STEPS * V);
    printf(
        "# gemm %d threads %d, %s cache: alone vs batch of %d max logit diff %.3g (bound %.3g)\n",
        mode, threads, ig_engine_kv_dtype_name(kv_dtype), OTHERS + 1, worst, tol);
    assert_memory_equal(alone, got, sizeof(alone));
    assert_true(worst <= tol);
    ig_tseq_release(&target, c->e);
    for (int o = 0; o < OTHERS; o++)
        ig_tseq_release(&others[o], c->e);
    assert_int_equal(ig_engine_blocks_free(c->e), 256);
    free(la), free(lb), free(b);
    close_ctx(c);
}

static void test_alone_vs_batch_own(void **state)
{
    check_alone_vs_batch(IG_CPU_GEMM_OWN, 2, IG_DTYPE_F32);
}

/* The same with the KV cache in F16 and in BF16. */
static void test_alone_vs_batch_kv16(void **state)
{
    check_alone_vs_batch(IG_CPU_GEMM_OWN, 2, IG_DTYPE_F16);
    check_alone_vs_batch(IG_CPU_GEMM_OWN, 1, IG_DTYPE_BF16);
}

static void test_alone_vs_batch_blas(void **state)
{
    check_alone_vs_batch(IG_CPU_GEMM_BLAS_POOL, 2, IG_DTYPE_F32);
    check_alone_vs_batch(IG_CPU_GEMM_BLAS_OWN, 1, IG_DTYPE_F32);
}

/* Prefill in one chunk vs in chunks of 7 (with another sequence decoding in
 * the same batches): the same logits at every position. */
static void check_chunked_prefill(ig_dtype_t kv_dtype)
{
    ig_tengine_t *c = open_ctx_kv("gqa", 2, 64, 16, kv_dtype);
    int V = c->vocab, n = 40;
    int p[40];
    ig_tprompt(3, n, V, p);
    float *one = malloc((size_t)n * V * sizeof(float));
    float *chunks = malloc((size_t)(n + 16) * V * sizeof(float));
    ig_tseq_t s = {0}, other = {0};
    ig_tbatch_t *b = malloc(sizeof(*b));
    ig_tbatch_init(b);
    assert_int_equal(ig_tbatch_add(b, c->e, &s, p, n, 0), 0);
    assert_int_equal(ig_tbatch_run(b, c->e, one), 0);
    ig_tseq_release(&s, c->e);

    int q[2] = {1, 2};
    ig_tbatch_init(b);
    assert_int_equal(ig_tbatch_add(b, c->e, &other, q, 2, 2), 0);
    assert_int_equal(ig_tbatch_run(b, c->e, chunks), 0);
    int done = 0, tok = 3;
    double worst = 0;
    while (done < n) {
        int k = n - done < 7 ? n - done : 7;
        ig_tbatch_init(b);
        assert_int_equal(ig_tbatch_add(b, c->e, &other, &tok, 1, 1), 0); /* no logits */
        assert_int_equal(ig_tbatch_add(b, c->e, &s, p + done, k, 0), 0);
        assert_int_equal(ig_tbatch_run(b, c->e, chunks), 0);
        worst = fmax(worst, ig_max_abs_diff(chunks, one + (size_t)done * V, (size_t)k * V));
        done += k;
    }
    double tol = batch_bound(c, n, one, (size_t)n * V);
    printf("# %s cache: chunked vs one-shot prefill: max logit diff %.3g (bound %.3g)\n",
           ig_engine_kv_dtype_name(kv_dtype), worst, tol);
    assert_true(worst <= tol);
    free(one), free(chunks), free(b);
    close_ctx(c);
}

/* A chunk attends to what earlier chunks cached, a one-shot prefill to what
 * its own kv_append just wrote: the same rounded values in a 16-bit cache. */
static void test_chunked_prefill(void **state)
{
    check_chunked_prefill(IG_DTYPE_F32);
    check_chunked_prefill(IG_DTYPE_F16);
    check_chunked_prefill(IG_DTYPE_BF16);
}

static void test_block_free_list(void **state)
{
    ig_tengine_t *c = open_ctx("tiny", 1, 5, 16);
    assert_int_equal(ig_engine_num_blocks(c->e), 5);
    assert_int_equal(ig_engine_block_size(c->e), 16);
    const ig_model_config_t *cfg = ig_engine_config(c->e);
    assert_int_equal(ig_engine_kv_bytes(c->e), (size_t)5 * 2 * cfg->num_hidden_layers *
                                                   cfg->num_key_value_heads * 16 * cfg->head_dim *
                                                   sizeof(float));
    int got[5], seen = 0;
    for (int i = 0; i < 5; i++) {
        got[i] = ig_engine_block_alloc(c->e);
        assert_true(got[i] >= 0 && got[i] < 5);
        assert_false(seen & (1 << got[i]));
        seen |= 1 << got[i];
    }
    assert_int_equal(ig_engine_blocks_free(c->e), 0);
    assert_int_equal(ig_engine_block_alloc(c->e), IG_ENOKV);
    ig_engine_block_release(c->e, got[2]);
    ig_engine_block_release(c->e, got[2]); /* twice: ignored */
    ig_engine_block_release(c->e, -1);
    ig_engine_block_release(c->e, 5);
    assert_int_equal(ig_engine_blocks_free(c->e), 1);
    assert_int_equal(ig_engine_block_alloc(c->e), got[2]);
    assert_int_equal(ig_engine_block_alloc(c->e), IG_ENOKV);
    for (int i = 0; i < 5; i++)
        ig_engine_block_release(c->e, got[i]);
    assert_int_equal(ig_engine_blocks_free(c->e), 5);
    close_ctx(c);
}

/* kv_blocks 0 on the CPU: room for max_num_seqs full-length sequences (the
 * tiny model is far below the 2 GiB cap). */
static void test_default_kv_size(void **state)
{
    ig_tengine_t *c = open_ctx("tiny", 1, 0, 16);
    const ig_model_config_t *cfg = ig_engine_config(c->e);
    int per_seq = (cfg->max_position_embeddings + 15) / 16;
    assert_int_equal(ig_engine_num_blocks(c->e), 32 * per_seq);
    close_ctx(c);
}

static void test_bad_batches(void **state)
{
    ig_tengine_t *c = open_ctx("tiny", 1, 8, 4);
    int V = c->vocab;
    float *logits = malloc((size_t)8 * V * sizeof(float));
    int blocks[2] = {0, 1}, tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int *tables[1] = {blocks};
    int seq_start[2] = {0, 3}, pos_start[1] = {0}, from[1] = {2};
    ig_batch_t b = {1, tokens, seq_start, pos_start, tables, from, logits};
    assert_int_equal(ig_batch_logit_rows(&b), 1);
    assert_int_equal(ig_engine_forward(c->e, &b), 0);

    tokens[1] = V; /* out of the vocabulary */
    assert_int_equal(ig_engine_forward(c->e, &b), IG_ERANGE);
    tokens[1] = -1;
    assert_int_equal(ig_engine_forward(c->e, &b), IG_ERANGE);
    tokens[1] = 2;
    blocks[0] = 8; /* not a block of this cache */
    assert_int_equal(ig_engine_forward(c->e, &b), IG_ERANGE);
    blocks[0] = 0;
    from[0] = 4; /* past the sequence */
    assert_int_equal(ig_engine_forward(c->e, &b), IG_EINVAL);
    from[0] = 3; /* no logits at all is fine */
    assert_int_equal(ig_batch_logit_rows(&b), 0);
    assert_int_equal(ig_engine_forward(c->e, &b), 0);
    b.nseq = 0;
    assert_int_equal(ig_engine_forward(c->e, &b), IG_EINVAL);
    b.nseq = 1;
    pos_start[0] = 1 << 20; /* beyond max_position_embeddings */
    assert_int_equal(ig_engine_forward(c->e, &b), IG_ETOOLONG);
    pos_start[0] = 0;
    seq_start[1] = 600; /* more rows than max_batched_tokens */
    assert_int_equal(ig_engine_forward(c->e, &b), IG_ETOOLONG);
    seq_start[1] = 3;
    b.nseq = 33; /* more sequences than max_num_seqs (32) */
    assert_int_equal(ig_engine_forward(c->e, &b), IG_EINVAL);
    b.nseq = 1;
    assert_int_equal(ig_engine_forward(c->e, &b), 0); /* still usable */
    free(logits);
    close_ctx(c);
}

/* Options the engine cannot work with are refused with a message. */
static void test_bad_options(void **state)
{
    char err[256];
    ig_tengine_t t;
    assert_int_equal(ig_tengine_model(&t, "tiny", 1, err, sizeof(err)), 0);
    ig_engine_opts_t o;
    int *fields[] = {&o.block_size, &o.max_batched_tokens, &o.max_num_seqs, &o.kv_blocks};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        ig_engine_opts_default(&o);
        *fields[i] = -1;
        ig_engine_t *e = NULL;
        err[0] = 0;
        assert_int_equal(ig_engine_create(&e, t.model, t.be, &o, err, sizeof(err)), IG_EINVAL);
        assert_null(e);
        assert_true(strlen(err) > 0);
    }
    ig_engine_t *e = NULL;
    assert_int_equal(ig_engine_create(&e, t.model, t.be, NULL, err, sizeof(err)), 0); /* defaults */
    assert_int_equal(ig_engine_block_size(e), 16);
    ig_engine_free(e);
    ig_tengine_close(&t);
    ig_tf_rmtree(t.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_vs_batch_own),  cmocka_unit_test(test_alone_vs_batch_kv16),
        cmocka_unit_test(test_alone_vs_batch_blas), cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_block_free_list),     cmocka_unit_test(test_default_kv_size),
        cmocka_unit_test(test_bad_batches),         cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
