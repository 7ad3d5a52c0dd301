/* Automatic prefix caching in the scheduler, with the fake engine (whose
 * logits are a hash of every token its paged KV cache holds for the
 * sequence, read back through the block table): a repeated prompt skips its
 * cached blocks, outputs are the same tokens with and without the cache
 * (greedy and seeded), the LRU evicts the least recently used blocks under
 * pressure, and preemption and cancellation of sequences that share blocks
 * leave the others' blocks alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/prefix.h"
#include "scheduler_fake.h"

#define BS 4

static ctx_t *ctx_new(int blocks, int max_batched, int max_seqs, int cache)
{
    ig_sched_opts_t o;
    fake_sched_opts(&o, max_batched, max_seqs, 64);
    o.prefix_cache = cache;
    o.prefix_seed = ig_prefix_seed("fake");
    return ctx_start(blocks, BS, &o, NULL);
}

static ig_sched_stats_t stats_of(ctx_t *c)
{
    ig_sched_stats_t st;
    ig_sched_stats(c->s, &st);
    return st;
}

static void make_prompt(int *p, int n, int salt)
{
    for (int i = 0; i < n; i++)
        p[i] = (i * 7 + salt * 11 + i / 5) % 26; /* salts 0..25 differ */
}

static ig_sched_req_t req_of(const int *prompt, int n, int max_tokens, uint64_t seed, int greedy)
{
    ig_sched_req_t r = fake_req(prompt, n, max_tokens, seed);
    if (greedy)
        r.sampling.temperature = 0;
    return r;
}

/* Steps until n sequences finished; fails the test after 5000 steps. */
static void finish_all(ctx_t *c, int n)
{
    if (run_until_done(c, n, 5000) < 0)
        fail_msg("sequences did not finish");
}

/* The tokens r generates alone, without a prefix cache. */
static void solo_of(const ig_sched_req_t *r, int *out)
{
    ctx_t *c = ctx_new(256, 64, 8, 0);
    uint64_t id = submit_ok(c, r);
    finish_all(c, 1);
    collected_t *col = collector_get(&c->col, id);
    assert_int_equal(col->ntokens, r->max_tokens);
    memcpy(out, col->tokens, sizeof(int) * (size_t)r->max_tokens);
    ctx_free_all_back(c);
}

static void expect_solo(ctx_t *c, uint64_t id, const ig_sched_req_t *r)
{
    int solo[1024];
    solo_of(r, solo);
    collected_t *col = collector_get(&c->col, id);
    assert_int_equal(col->finish, IG_FINISH_LENGTH);
    assert_int_equal(col->ntokens, r->max_tokens);
    assert_memory_equal(col->tokens, solo, sizeof(int) * (size_t)r->max_tokens);
}

static void test_repeat_skips_cached_blocks(void **state)
{
    ctx_t *c = ctx_new(64, 64, 8, 1);
    int p[40];
    make_prompt(p, 40, 1);
    ig_sched_req_t r = req_of(p, 40, 6, 3, 1);
    uint64_t a = submit_ok(c, &r);
    ig_sched_step(c->s);
    assert_int_equal(c->fe.last_ntok, 40);
    finish_all(c, 1);
    /* 40 prompt + 5 computed generated tokens: 11 full blocks committed */
    assert_int_equal(stats_of(c).prefix_cached_blocks, 11);
    assert_int_equal(ig_sched_prefix_match(c->s, p, 40), 10);

    /* The same prompt: blocks 0..8 are found (the last token is always
     * computed, so block 9, which holds it, is not taken) */
    uint64_t b = submit_ok(c, &r);
    ig_sched_step(c->s);
    assert_int_equal(c->fe.last_ntok, 4);
    finish_all(c, 2);
    expect_solo(c, a, &r);
    expect_solo(c, b, &r);
    assert_memory_equal(collector_get(&c->col, a)->tokens, collector_get(&c->col, b)->tokens,
                        sizeof(int) * 6);
    ig_sched_stats_t st = stats_of(c);
    assert_int_equal(st.prefix_queried_tokens_total, 80);
    assert_int_equal(st.prefix_hit_tokens_total, 36);
    assert_int_equal(st.prompt_tokens_total, 80);

    /* A longer prompt that extends it (the next turn of a chat) */
    int p2[52];
    memcpy(p2, p, sizeof(p));
    make_prompt(p2 + 40, 12, 9);
    ig_sched_req_t r2 = req_of(p2, 52, 5, 4, 0);
    uint64_t d = submit_ok(c, &r2);
    ig_sched_step(c->s);
    assert_int_equal(c->fe.last_ntok, 12);
    finish_all(c, 3);
    expect_solo(c, d, &r2);
    ctx_free_all_back(c);
}

/* Several sequences with common prefixes, interleaved, greedy and seeded:
 * the same tokens with and without the cache. */
static void run_mix(int cache, int blocks, int out[8][24], uint64_t *hits)
{
    ctx_t *c = ctx_new(blocks, 32, 4, cache);
    int sys[24];
    make_prompt(sys, 24, 5);
    int prompts[8][40]; /* up to 24 + 2 + 2 * 7 = 40 tokens used */
    ig_sched_req_t rs[8];
    uint64_t ids[8];
    for (int i = 0; i < 8; i++) {
        memcpy(prompts[i], sys, sizeof(sys));
        make_prompt(prompts[i] + 24, 16, i % 3); /* pairs share more than the system part */
        rs[i] = req_of(prompts[i], 24 + 2 + 2 * i, 24, 100 + (uint64_t)i, i % 2);
    }
    for (int i = 0; i < 8; i++) {
        ids[i] = submit_ok(c, &rs[i]);
        for (int k = 0; k < 3; k++) {
            ig_sched_step(c->s);
            ig_sched_drain(c->s, collect_cb, &c->col);
        }
    }
    finish_all(c, 8);
    for (int i = 0; i < 8; i++) {
        collected_t *col = collector_get(&c->col, ids[i]);
        assert_int_equal(col->finish, IG_FINISH_LENGTH);
        memcpy(out[i], col->tokens, sizeof(int) * 24);
    }
    *hits = stats_of(c).prefix_hit_tokens_total;
    ctx_free_all_back(c);
}

/* A waiting prompt counts toward the wait only by what the cache lacks. */
static void test_waiting_counts_uncached_tokens(void **state)
{
    ctx_t *c = ctx_new(64, 64, 1, 1);
    int p[40], q[40], busy[8];
    make_prompt(p, 40, 1);
    make_prompt(q, 40, 2);
    make_prompt(busy, 8, 3);
    ig_sched_req_t r = req_of(p, 40, 1, 3, 1);
    submit_ok(c, &r);
    finish_all(c, 1); /* p's first 9 blocks are cached now */
    ig_sched_req_t hold = req_of(busy, 8, 40, 3, 1);
    submit_ok(c, &hold);
    ig_sched_step(c->s); /* it runs: the one place is taken */
    submit_ok(c, &r);
    ig_sched_step(c->s);
    ig_sched_stats_t st = stats_of(c);
    assert_int_equal(st.waiting, 1);
    assert_int_equal(st.waiting_prefill_tokens, 40 - 9 * BS);
    ig_sched_req_t other = req_of(q, 40, 1, 3, 1);
    submit_ok(c, &other);
    ig_sched_step(c->s);
    st = stats_of(c);
    assert_int_equal(st.waiting, 2);
    assert_int_equal(st.waiting_prefill_tokens, 40 - 9 * BS + 40);
    finish_all(c, 4);
    assert_int_equal(stats_of(c).waiting_prefill_tokens, 0);
    ctx_free_all_back(c);
}

static void test_bit_identical_with_and_without(void **state)
{
    int off[8][24], on[8][24], tight[8][24];
    uint64_t h_off, h_on, h_tight;
    run_mix(0, 256, off, &h_off);
    run_mix(1, 256, on, &h_on);
    run_mix(1, 40, tight, &h_tight); /* preemption and eviction too */
    assert_int_equal(h_off, 0);
    assert_true(h_on >= 7 * 24); /* every later one found the system prefix */
    assert_true(h_tight > 0);
    assert_memory_equal(off, on, sizeof(off));
    assert_memory_equal(off, tight, sizeof(off));
}

static void test_lru_evicts_least_recently_used(void **state)
{
    /* 14 blocks of 4: a 21-token prompt + 2 tokens holds 6 blocks while it
     * runs and leaves 5 cached (its first 20 tokens) */
    ctx_t *c = ctx_new(14, 64, 4, 1);
    int pa[21], pb[21], pc[21];
    make_prompt(pa, 21, 1);
    make_prompt(pb, 21, 2);
    make_prompt(pc, 21, 3);
    ig_sched_req_t ra = req_of(pa, 21, 2, 1, 1), rb = req_of(pb, 21, 2, 1, 1),
                   rc = req_of(pc, 21, 2, 1, 1);
    submit_ok(c, &ra);
    finish_all(c, 1);
    submit_ok(c, &rb);
    finish_all(c, 2);
    assert_int_equal(ig_sched_prefix_match(c->s, pa, 21), 5);
    assert_int_equal(ig_sched_prefix_match(c->s, pb, 21), 5);
    assert_int_equal(stats_of(c).prefix_evictions_total, 0);
    /* A used again (all 5 found): now B is the least recently used */
    submit_ok(c, &ra);
    ig_sched_step(c->s);
    assert_int_equal(c->fe.last_ntok, 1);
    finish_all(c, 3);
    assert_int_equal(stats_of(c).prefix_evictions_total, 0);
    /* C needs 6 blocks, 4 are free: B's last two cached blocks go, A stays */
    uint64_t idc = submit_ok(c, &rc);
    finish_all(c, 4);
    assert_int_equal(stats_of(c).prefix_evictions_total, 2);
    assert_int_equal(ig_sched_prefix_match(c->s, pa, 21), 5);
    assert_int_equal(ig_sched_prefix_match(c->s, pb, 21), 3);
    assert_int_equal(ig_sched_prefix_match(c->s, pc, 21), 5);
    expect_solo(c, idc, &rc);
    /* B again: the 3 blocks left are found, the rest recomputed, right */
    uint64_t idb = submit_ok(c, &rb);
    ig_sched_step(c->s);
    assert_int_equal(c->fe.last_ntok, 9);
    finish_all(c, 5);
    expect_solo(c, idb, &rb);
    assert_true(stats_of(c).prefix_cached_blocks <= 14);
    ctx_free_all_back(c);
}

/* Two sequences on one prompt p (n tokens from salt, max_tokens each): r[0]
 * greedy with seed, submitted and stepped once so that its prompt is in
 * committed blocks, then r[1] sampled with seed + 1, and one more step,
 * which takes r[1]'s prompt beside r[0]'s decode. */
typedef struct {
    int p[32];
    ig_sched_req_t r[2];
    uint64_t id[2];
} sharing_t;

static void submit_sharing(ctx_t *c, sharing_t *sh, int n, int salt, int max_tokens, uint64_t seed)
{
    assert_true(n <= 32);
    make_prompt(sh->p, n, salt);
    sh->r[0] = req_of(sh->p, n, max_tokens, seed, 1);
    sh->r[1] = req_of(sh->p, n, max_tokens, seed + 1, 0);
    sh->id[0] = submit_ok(c, &sh->r[0]);
    ig_sched_step(c->s);
    sh->id[1] = submit_ok(c, &sh->r[1]);
    ig_sched_step(c->s);
}

/* Two sequences share their first blocks; the cache is too small for both
 * to grow, so the newer is preempted: its release must leave the shared
 * blocks with the older one, and its recompute finds them again. */
static void test_preemption_with_shared_blocks(void **state)
{
    ctx_t *c = ctx_new(14, 64, 4, 1);
    sharing_t sh;
    submit_sharing(c, &sh, 16, 7, 24, 11);
    /* the first's prompt took 4 blocks; the step took its decode and the
     * second's last block */
    assert_int_equal(c->fe.last_ntok, 1 + 4);
    finish_all(c, 2);
    assert_true(stats_of(c).preemptions_total > 0);
    expect_solo(c, sh.id[0], &sh.r[0]);
    expect_solo(c, sh.id[1], &sh.r[1]);
    ctx_free_all_back(c);
}

static void test_cancel_keeps_shared_blocks(void **state)
{
    ctx_t *c = ctx_new(64, 64, 4, 1);
    sharing_t sh;
    submit_sharing(c, &sh, 24, 4, 12, 1);
    ig_sched_step(c->s);
    ig_sched_cancel(c->s, sh.id[0]); /* the second holds the first's prompt blocks too */
    finish_all(c, 2);
    assert_int_equal(collector_get(&c->col, sh.id[0])->finish, IG_FINISH_CANCELLED);
    expect_solo(c, sh.id[1], &sh.r[1]);
    /* the first's blocks stay cached after its cancel: a third one finds them */
    assert_int_equal(ig_sched_prefix_match(c->s, sh.p, 24), 6);
    ctx_free_all_back(c);
}

/* Prompt logprobs need every prompt position's logits: no hit, the same
 * numbers as the first time. */
static void test_echo_computes_whole_prompt(void **state)
{
    ctx_t *c = ctx_new(64, 64, 4, 1);
    int p[20];
    make_prompt(p, 20, 6);
    ig_sched_req_t r = req_of(p, 20, 2, 1, 1);
    submit_ok(c, &r);
    finish_all(c, 1);
    r.prompt_logprobs = 1;
    r.logprobs = 0;
    uint64_t e1 = submit_ok(c, &r);
    ig_sched_step(c->s);
    assert_int_equal(c->fe.last_ntok, 20);
    finish_all(c, 2);
    collected_t *col = collector_get(&c->col, e1);
    assert_int_equal(col->nprompt_lp, 19);
    assert_int_equal(stats_of(c).prefix_hit_tokens_total, 0);
    ctx_free_all_back(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeat_skips_cached_blocks),
        cmocka_unit_test(test_waiting_counts_uncached_tokens),
        cmocka_unit_test(test_bit_identical_with_and_without),
        cmocka_unit_test(test_lru_evicts_least_recently_used),
        cmocka_unit_test(test_preemption_with_shared_blocks),
        cmocka_unit_test(test_cancel_keeps_shared_blocks),
        cmocka_unit_test(test_echo_computes_whole_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
