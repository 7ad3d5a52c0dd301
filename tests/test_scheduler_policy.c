/* Scheduler policy with a fake engine: batching, admission under block
 * pressure, preemption of the newest with recompute, queue bound,
 * cancellation, deadlines, stop strings, prompt logprobs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "scheduler_fake.h"

static ctx_t *ctx_new(int blocks, int bs, int max_batched, int max_seqs, int max_waiting)
{
    ig_sched_opts_t o;
    fake_sched_opts(&o, max_batched, max_seqs, max_waiting);
    o.now_ns = fake_clock;
    return ctx_start(blocks, bs, &o, NULL);
}

static void make_prompt(int *p, int n, int salt)
{
    for (int i = 0; i < n; i++)
        p[i] = (i * 7 + salt * 13) % 26;
}

/* Submits a greedy-by-seed request for prompt[0..n). */
static uint64_t submit_prompt(ctx_t *c, const int *prompt, int n, int max_tokens, uint64_t seed)
{
    ig_sched_req_t r = fake_req(prompt, n, max_tokens, seed);
    return submit_ok(c, &r);
}

/* Runs nsteps steps, draining the events after each. */
static void step_drain(ctx_t *c, int nsteps)
{
    for (int k = 0; k < nsteps; k++) {
        ig_sched_step(c->s);
        ig_sched_drain(c->s, collect_cb, &c->col);
    }
}

/* The streamed text of col is exactly the pieces of its first n tokens. */
static void expect_text_is_pieces(const collected_t *col, int n)
{
    char want[64];
    size_t w = 0;
    for (int i = 0; i < n; i++)
        w += (size_t)fake_piece(NULL, col->tokens[i], want + w, sizeof(want) - w);
    assert_int_equal(col->text_len, w);
    assert_memory_equal(col->text, want, w);
}

/* The tokens the request r generates when it runs alone. */
static void solo_of(const ig_sched_req_t *r, int *out)
{
    ctx_t *c = ctx_new(64, 4, 64, 8, 8);
    uint64_t id = submit_ok(c, r);
    assert_true(run_until_done(c, 1, 1000) > 0);
    collected_t *col = collector_get(&c->col, id);
    assert_int_equal(col->ntokens, r->max_tokens);
    memcpy(out, col->tokens, sizeof(int) * (size_t)r->max_tokens);
    ctx_free(c);
}

/* col holds exactly the tokens r generates when it runs alone. */
static void expect_solo(const collected_t *col, const ig_sched_req_t *r)
{
    int solo[1024];
    solo_of(r, solo);
    assert_memory_equal(col->tokens, solo, sizeof(int) * (size_t)r->max_tokens);
}

static void expect_solo_prompt(const collected_t *col, const int *prompt, int n, int max_tokens,
                               uint64_t seed)
{
    ig_sched_req_t r = fake_req(prompt, n, max_tokens, seed);
    expect_solo(col, &r);
}

static void test_basic_and_text(void **state)
{
    ctx_t *c = ctx_new(32, 4, 64, 8, 8);
    int p[6];
    make_prompt(p, 6, 1);
    uint64_t id = submit_prompt(c, p, 6, 10, 1);
    /* first step: one prefill of 6 tokens that also samples the first token */
    assert_int_equal(ig_sched_step(c->s), 1);
    assert_int_equal(c->fe.last_ntok, 6);
    ig_sched_drain(c->s, collect_cb, &c->col);
    assert_int_equal(collector_get(&c->col, id)->ntokens, 1);
    assert_true(run_until_done(c, 1, 100) > 0);
    collected_t *col = collector_get(&c->col, id);
    assert_int_equal(col->finish, IG_FINISH_LENGTH);
    assert_int_equal(col->ntokens, 10);
    assert_int_equal(col->completion_tokens, 10);
    assert_int_equal(col->prompt_tokens, 6);
    /* the streamed text is exactly the pieces of the tokens */
    expect_text_is_pieces(col, 10);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.generation_tokens_total, 10);
    assert_int_equal(st.prompt_tokens_total, 6);
    assert_int_equal(st.finished_total[IG_FINISH_LENGTH], 1);
    ctx_free_all_back(c);
}

static void test_batching_is_continuous_and_seed_independent(void **state)
{
    int pa[5], pb[9], pc[3];
    make_prompt(pa, 5, 1);
    make_prompt(pb, 9, 2);
    make_prompt(pc, 3, 3);

    ctx_t *c = ctx_new(64, 4, 64, 8, 8);
    uint64_t ib = submit_prompt(c, pb, 9, 20, 5);
    ig_sched_step(c->s);
    ig_sched_step(c->s); /* b is decoding now */
    uint64_t ia = submit_prompt(c, pa, 5, 12, 77);
    uint64_t ic = submit_prompt(c, pc, 3, 4, 9);
    /* one pass: b's decode token plus both prefills */
    assert_int_equal(ig_sched_step(c->s), 3);
    assert_int_equal(c->fe.last_ntok, 1 + 5 + 3);
    assert_true(run_until_done(c, 3, 200) > 0);
    expect_solo_prompt(collector_get(&c->col, ia), pa, 5, 12, 77);
    assert_int_equal(collector_get(&c->col, ic)->ntokens, 4);
    assert_int_equal(collector_get(&c->col, ib)->ntokens, 20);
    ctx_free_all_back(c);
}

static void test_chunked_prefill(void **state)
{
    /* max_batched_tokens 8: a 20-token prompt takes 3 steps of prefill
     * while a decoding sequence keeps getting its token every step. */
    ctx_t *c = ctx_new(64, 4, 8, 8, 8);
    int p1[3], p2[20];
    make_prompt(p1, 3, 4);
    make_prompt(p2, 20, 5);
    uint64_t i1 = submit_prompt(c, p1, 3, 30, 1);
    ig_sched_step(c->s);
    uint64_t i2 = submit_prompt(c, p2, 20, 2, 2);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(ig_sched_step(c->s), 2);
        assert_true(c->fe.last_ntok <= 8);
        ig_sched_drain(c->s, collect_cb, &c->col);
    }
    /* 1 decode + 7, 1 + 7, 1 + 6: the prompt is in, its first token out */
    assert_int_equal(collector_get(&c->col, i2)->ntokens, 1);
    assert_int_equal(collector_get(&c->col, i1)->ntokens, 4);
    assert_true(run_until_done(c, 2, 200) > 0);
    expect_solo_prompt(collector_get(&c->col, i2), p2, 20, 2, 2);
    ctx_free(c);
}

static void test_admission_under_block_pressure(void **state)
{
    /* 10 blocks of 4 tokens. Each sequence: 8-token prompt (2 blocks), 8
     * new tokens (4 blocks in all). Not all four fit at once. */
    ctx_t *c = ctx_new(10, 4, 64, 8, 8);
    int p[4][8];
    uint64_t id[4];
    for (int i = 0; i < 4; i++) {
        make_prompt(p[i], 8, i + 10);
        id[i] = submit_prompt(c, p[i], 8, 8, (uint64_t)i);
    }
    ig_sched_step(c->s);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    /* prefill needs 2 blocks + 1 for the token after: at most 3 admitted
     * with 10 blocks; and the blocks are in use */
    assert_true(st.running >= 1 && st.running <= 4);
    assert_int_equal(st.running + st.waiting, 4);
    assert_int_equal(st.kv_blocks_total, 10);
    assert_true(st.kv_blocks_used > 0 && st.kv_blocks_used <= 10);
    assert_true(run_until_done(c, 4, 500) > 0);
    for (int i = 0; i < 4; i++) {
        collected_t *col = collector_get(&c->col, id[i]);
        assert_int_equal(col->finish, IG_FINISH_LENGTH);
        expect_solo_prompt(col, p[i], 8, 8, (uint64_t)i);
    }
    ctx_free_all_back(c);
}

static void test_preempts_newest_and_recomputes(void **state)
{
    /* 6 blocks of 4: two sequences of 4 + 16 tokens (5 blocks each) cannot
     * both finish together; the newer one must be preempted, then rerun
     * with the same tokens. */
    ctx_t *c = ctx_new(6, 4, 64, 8, 8);
    int pa[4], pb[4];
    make_prompt(pa, 4, 20);
    make_prompt(pb, 4, 21);
    ig_sched_req_t ra = fake_req(pa, 4, 16, 100), rb = fake_req(pb, 4, 16, 200);
    ra.sampling.temperature = rb.sampling.temperature = 0.8f;
    uint64_t ia = submit_ok(c, &ra), ib = submit_ok(c, &rb);
    ig_sched_step(c->s);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.running, 2);

    int preempted_at = -1;
    for (int k = 0; k < 100 && preempted_at < 0; k++) {
        step_drain(c, 1);
        ig_sched_stats(c->s, &st);
        if (st.preemptions_total > 0)
            preempted_at = k;
    }
    assert_true(preempted_at >= 0);
    /* the older one kept running; the newer one waits with no blocks */
    assert_int_equal(st.running, 1);
    assert_int_equal(st.waiting, 1);
    collected_t *ca = collector_get(&c->col, ia), *cb = collector_get(&c->col, ib);
    int b_tokens_before = cb->ntokens, a_tokens_before = ca->ntokens;
    assert_true(b_tokens_before > 0);
    /* it was the newer one (b) that gave its blocks back: a goes on, b waits */
    ig_sched_step(c->s);
    ig_sched_step(c->s);
    ig_sched_drain(c->s, collect_cb, &c->col);
    assert_int_equal(cb->ntokens, b_tokens_before);
    assert_true(ca->ntokens == 16 || ca->ntokens == a_tokens_before + 2);
    assert_true(run_until_done(c, 2, 500) > 0);
    assert_int_equal(ca->ntokens, 16);
    assert_int_equal(cb->ntokens, 16);
    /* Recompute gives the same tokens: compare with solo runs at T=0.8. */
    expect_solo(ca, &ra);
    expect_solo(cb, &rb);
    /* and the text streamed across the preemption has no repeats or gaps */
    expect_text_is_pieces(cb, 16);
    ctx_free_all_back(c);
}

static void test_queue_full(void **state)
{
    ctx_t *c = ctx_new(16, 4, 64, 8, 2);
    int p[4] = {1, 2, 3, 4};
    ig_sched_req_t r = fake_req(p, 4, 2, 1);
    uint64_t id;
    submit_ok(c, &r);
    submit_ok(c, &r);
    assert_int_equal(ig_sched_submit(c->s, &r, &id), IG_EFULL);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.waiting, 2);
    assert_int_equal(st.rejected_total, 1);
    /* once they run, the queue has room again */
    ig_sched_step(c->s);
    submit_ok(c, &r);
    /* never fits: prompt + max_tokens over the whole cache -> ETOOLONG */
    r.max_tokens = 100;
    assert_int_equal(ig_sched_submit(c->s, &r, &id), IG_ETOOLONG);
    /* a bad token id */
    int bad[2] = {1, FAKE_VOCAB};
    r = fake_req(bad, 2, 2, 1);
    assert_int_equal(ig_sched_submit(c->s, &r, &id), IG_EINVAL);
    ctx_free(c);
}

static void test_cancel_frees_blocks_within_one_step(void **state)
{
    ctx_t *c = ctx_new(16, 4, 64, 8, 8);
    int p[10];
    make_prompt(p, 10, 3);
    uint64_t id = submit_prompt(c, p, 10, 50, 1);
    ig_sched_step(c->s);
    ig_sched_step(c->s);
    assert_true(c->fe.nfree < 16);
    /* one waiting, never run */
    uint64_t id2 = submit_prompt(c, p, 10, 50, 1);
    ig_sched_cancel(c->s, id);
    ig_sched_cancel(c->s, id2);
    ig_sched_cancel(c->s, 12345); /* unknown: nothing happens */
    int forwards = c->fe.forwards;
    ig_sched_step(c->s);
    /* 2 of its blocks are full: cached, held by nobody; the rest are free */
    assert_int_equal(c->fe.nfree, 14);
    assert_int_equal(c->fe.forwards, forwards); /* nothing left to run */
    ig_sched_drain(c->s, collect_cb, &c->col);
    assert_int_equal(collector_get(&c->col, id)->finish, IG_FINISH_CANCELLED);
    assert_int_equal(collector_get(&c->col, id2)->finish, IG_FINISH_CANCELLED);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.running + st.waiting, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    ctx_free(c);
}

static void test_deadline(void **state)
{
    ctx_t *c = ctx_new(16, 4, 64, 8, 8);
    fake_now = 1000000000ULL;
    int p[4] = {1, 2, 3, 4};
    ig_sched_req_t r = fake_req(p, 4, 100 - 4 - 40, 1);
    r.deadline_ns = fake_now + 500000000ULL;
    uint64_t id = submit_ok(c, &r);
    ig_sched_step(c->s);
    ig_sched_step(c->s);
    fake_now += 400000000ULL;
    step_drain(c, 1);
    assert_int_equal(collector_get(&c->col, id)->finish, IG_FINISH_NONE);
    fake_now += 200000000ULL;
    step_drain(c, 1);
    collected_t *col = collector_get(&c->col, id);
    assert_int_equal(col->finish, IG_FINISH_TIMEOUT);
    assert_int_equal(col->error, IG_ETIMEDOUT);
    assert_int_equal(col->ntokens, 3);
    fake_now = 0;
    ctx_free_all_back(c);
}

static void test_stop_strings_across_tokens(void **state)
{
    ctx_t *c = ctx_new(16, 4, 64, 8, 8);
    c->fe.script = 1;
    /* 0 -> 1 -> 2 -> 3 -> 4 -> 5 ...: "he" "llo" " wo" "rld" "!" */
    for (int i = 0; i < FAKE_VOCAB; i++)
        c->fe.script_next[i] = (i + 1) % (FAKE_VOCAB - 1);
    fake_pieces[1] = "he";
    fake_pieces[2] = "llo";
    fake_pieces[3] = " wo";
    fake_pieces[4] = "rld";
    fake_pieces[5] = "!";
    int p[1] = {0};
    const char *stops[] = {"xyz", "lo w"};
    ig_sched_req_t r = fake_req(p, 1, 10, 1);
    r.stop = stops;
    r.nstop = 2;
    uint64_t id = submit_ok(c, &r);
    ig_sched_step(c->s); /* "he" */
    ig_sched_step(c->s); /* "llo": "lo" could start "lo w", held back */
    ig_sched_drain(c->s, collect_cb, &c->col);
    collected_t *col = collector_get(&c->col, id);
    assert_string_equal(col->text, "hel");
    step_drain(c, 1); /* " wo": "hello wo" holds "lo w" -> stop */
    assert_int_equal(col->finish, IG_FINISH_STOP);
    assert_string_equal(col->text, "hel");
    assert_int_equal(col->completion_tokens, 3);

    /* A held-back prefix that never completes is released at the end. */
    const char *stops2[] = {"d!?"};
    r.stop = stops2;
    r.nstop = 1;
    r.max_tokens = 5;
    id = submit_ok(c, &r);
    assert_true(run_until_done(c, 2, 20) > 0);
    col = collector_get(&c->col, id);
    assert_int_equal(col->finish, IG_FINISH_LENGTH);
    assert_string_equal(col->text, "hello world!");

    /* EOS ends with "stop" and its (empty) text is not shown. */
    c->fe.script_next[3] = FAKE_EOS;
    r.nstop = 0;
    r.max_tokens = 10;
    id = submit_ok(c, &r);
    assert_true(run_until_done(c, 3, 20) > 0);
    col = collector_get(&c->col, id);
    assert_int_equal(col->finish, IG_FINISH_STOP);
    assert_string_equal(col->text, "hello wo");
    assert_int_equal(col->ntokens, 3);           /* EOS not listed */
    assert_int_equal(col->completion_tokens, 4); /* but counted */
    /* ignore_eos runs through it */
    r.ignore_eos = 1;
    r.max_tokens = 6;
    id = submit_ok(c, &r);
    assert_true(run_until_done(c, 4, 20) > 0);
    assert_int_equal(collector_get(&c->col, id)->finish, IG_FINISH_LENGTH);
    assert_int_equal(collector_get(&c->col, id)->ntokens, 6);
    /* stop token ids */
    int sid = 2;
    r.ignore_eos = 0;
    r.stop_ids = &sid;
    r.nstop_ids = 1;
    id = submit_ok(c, &r);
    assert_true(run_until_done(c, 5, 20) > 0);
    assert_string_equal(collector_get(&c->col, id)->text, "he");
    for (int i = 0; i < FAKE_VOCAB; i++)
        fake_pieces[i] = NULL;
    ctx_free(c);
}

static void test_prompt_logprobs_chunked(void **state)
{
    /* A 20-token prompt with echo logprobs, prefilled in chunks of 6:
     * positions 1..19 each get exactly one logprob, equal to the fake
     * model's log-softmax, in order. */
    ctx_t *c = ctx_new(32, 4, 6, 8, 8);
    int p[20];
    make_prompt(p, 20, 9);
    ig_sched_req_t r = fake_req(p, 20, 2, 1);
    r.logprobs = 2;
    r.prompt_logprobs = 1;
    uint64_t id = submit_ok(c, &r);
    assert_true(run_until_done(c, 1, 50) > 0);
    collected_t *col = collector_get(&c->col, id);
    assert_int_equal(col->nprompt_lp, 19);
    float lg[FAKE_VOCAB];
    for (int i = 0; i < 19; i++) {
        assert_int_equal(col->prompt_lp_pos[i], i + 1);
        fake_logits_of(&c->fe, p, i + 1, lg);
        double m = -1e30, z = 0;
        for (int v = 0; v < FAKE_VOCAB; v++)
            if (lg[v] > m)
                m = lg[v];
        for (int v = 0; v < FAKE_VOCAB; v++)
            z += exp(lg[v] - m);
        double want = lg[p[i + 1]] - m - log(z);
        assert_true(fabs(col->prompt_lp[i] - want) < 1e-4);
    }
    assert_int_equal(col->ntokens, 2);
    ctx_free(c);
}

static void test_pause_resume(void **state)
{
    ctx_t *c = ctx_new(32, 4, 64, 8, 8);
    int pa[5], pb[5];
    make_prompt(pa, 5, 30);
    make_prompt(pb, 5, 31);
    uint64_t ia = submit_prompt(c, pa, 5, 10, 7);
    uint64_t ib = submit_prompt(c, pb, 5, 10, 8);
    ig_sched_step(c->s);
    ig_sched_step(c->s);
    ig_sched_pause(c->s, ia, 1);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(ig_sched_step(c->s), 1); /* only b runs */
        ig_sched_drain(c->s, collect_cb, &c->col);
    }
    assert_int_equal(collector_get(&c->col, ia)->ntokens, 2);
    assert_int_equal(collector_get(&c->col, ib)->ntokens, 6);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.running, 2); /* paused, not preempted: blocks kept */
    ig_sched_pause(c->s, ia, 0);
    assert_true(run_until_done(c, 2, 100) > 0);
    expect_solo_prompt(collector_get(&c->col, ia), pa, 5, 10, 7);
    /* everything paused: a step does nothing */
    ia = submit_prompt(c, pa, 5, 10, 7);
    ig_sched_step(c->s);
    ig_sched_pause(c->s, ia, 1);
    int f = c->fe.forwards;
    assert_int_equal(ig_sched_step(c->s), 0);
    assert_int_equal(c->fe.forwards, f);
    ig_sched_cancel(c->s, ia); /* a paused one can still be cancelled */
    ig_sched_step(c->s);
    ctx_free_all_back(c);
}

static void test_paused_gives_blocks_to_waiting(void **state)
{
    /* 10 blocks of 4. A runs, then pauses holding its blocks; B needs more
     * than is free: A is preempted (not B kept waiting), B completes, and A,
     * resumed, is recomputed into its solo tokens. */
    ctx_t *c = ctx_new(10, 4, 64, 8, 8);
    int pa[8], pb[28];
    make_prompt(pa, 8, 40);
    make_prompt(pb, 28, 41);
    uint64_t ia = submit_prompt(c, pa, 8, 12, 5);
    for (int k = 0; k < 5; k++)
        ig_sched_step(c->s);
    ig_sched_pause(c->s, ia, 1);
    ig_sched_step(c->s);
    uint64_t ib = submit_prompt(c, pb, 28, 4, 6);
    step_drain(c, 10);
    assert_int_equal(collector_get(&c->col, ib)->finish, IG_FINISH_LENGTH);
    assert_int_equal(collector_get(&c->col, ia)->finish, IG_FINISH_NONE);
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    assert_int_equal(st.preemptions_total, 1);
    ig_sched_pause(c->s, ia, 0);
    assert_true(run_until_done(c, 2, 100) > 0);
    expect_solo_prompt(collector_get(&c->col, ia), pa, 8, 12, 5);
    ctx_free_all_back(c);
}

static void test_engine_error_finishes_batch(void **state)
{
    ctx_t *c = ctx_new(16, 4, 64, 8, 8);
    int p[4] = {1, 2, 3, 4};
    uint64_t id = submit_prompt(c, p, 4, 5, 1);
    c->fe.fail_next = IG_EDEVICE;
    assert_int_equal(ig_sched_step(c->s), IG_EDEVICE);
    ig_sched_drain(c->s, collect_cb, &c->col);
    assert_int_equal(collector_get(&c->col, id)->finish, IG_FINISH_ERROR);
    assert_int_equal(collector_get(&c->col, id)->error, IG_EDEVICE);
    ctx_free_all_back(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_and_text),
        cmocka_unit_test(test_batching_is_continuous_and_seed_independent),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_admission_under_block_pressure),
        cmocka_unit_test(test_preempts_newest_and_recomputes),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_cancel_frees_blocks_within_one_step),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_stop_strings_across_tokens),
        cmocka_unit_test(test_prompt_logprobs_chunked),
        cmocka_unit_test(test_pause_resume),
        cmocka_unit_test(test_paused_gives_blocks_to_waiting),
        cmocka_unit_test(test_engine_error_finishes_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
