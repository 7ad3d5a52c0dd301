/* Prefix-aware routing, pure: the approximate index of where prompts went
 * (matches, per-upstream caps in LRU order, the global bound, sessions),
 * and its hook into the cost model: a warm instance wins while it is cold,
 * the request spills when it is hot, the instance spilled to becomes warm,
 * x-session-id is soft affinity, and a site holds nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "infergate/prefix.h"
#include "infergate/prefix_route.h"
#include "infergate/router.h"
#include "router_fixture.h"

#define S(x) ((uint64_t)((x)*1e9))

static void hashes_of(int salt, int nblocks, uint64_t *out)
{
    int32_t t[64 * 16];
    for (int i = 0; i < nblocks * 16; i++)
        t[i] = salt * 1000 + i;
    ig_prefix_hashes(ig_prefix_seed("m"), t, nblocks * 16, 16, out, nblocks);
}

static void test_index_match_and_caps(void **state)
{
    ig_prefix_index_t *x;
    assert_int_equal(ig_prefix_index_create(&x, 64, 4), 0);
    int a, b; /* two upstreams, by address */
    uint64_t p[32], q[32];
    hashes_of(1, 32, p);
    hashes_of(2, 32, q);
    ig_prefix_index_record(x, &a, p, 10, 0);
    assert_int_equal(ig_prefix_index_match(x, &a, p, 32), 10);
    assert_int_equal(ig_prefix_index_match(x, &b, p, 32), 0);
    /* a leading run only: a prompt that diverges in block 3 matches 3 */
    uint64_t r[10];
    memcpy(r, p, sizeof(r));
    r[3] ^= 1;
    assert_int_equal(ig_prefix_index_match(x, &a, r, 10), 3);
    /* b's cap of 12 blocks: a second prompt pushes out the first's tail
     * (its head was recorded most recently) */
    ig_prefix_index_record(x, &b, p, 10, 12);
    ig_prefix_index_record(x, &b, q, 6, 12);
    assert_int_equal(ig_prefix_index_blocks(x, &b), 12);
    assert_int_equal(ig_prefix_index_match(x, &b, q, 6), 6);
    assert_int_equal(ig_prefix_index_match(x, &b, p, 10), 6);
    /* the global bound (64 entries): the least recently sent go */
    ig_prefix_index_record(x, &a, q, 32, 0);
    ig_prefix_index_record(x, &a, p, 32, 0);
    assert_true(ig_prefix_index_blocks(x, &a) + ig_prefix_index_blocks(x, &b) <= 64);
    assert_int_equal(ig_prefix_index_match(x, &a, p, 32), 32);
    ig_prefix_index_forget(x, &a);
    assert_int_equal(ig_prefix_index_match(x, &a, p, 32), 0);
    /* sessions: the last upstream and its prompt length; 4 at most */
    int tok;
    ig_prefix_index_session_record(x, 7, &a, 300);
    ig_prefix_index_session_record(x, 7, &b, 350);
    assert_ptr_equal(ig_prefix_index_session(x, 7, &tok), &b);
    assert_int_equal(tok, 350);
    for (uint64_t s = 100; s < 110; s++)
        ig_prefix_index_session_record(x, s, &a, 1);
    assert_null(ig_prefix_index_session(x, 7, &tok));
    assert_ptr_equal(ig_prefix_index_session(x, 109, &tok), &a);
    ig_prefix_index_free(x);
}

/* Two CPU instances that prefill 2000 tokens/s, and a site. */
static void instances(ig_router_upstream_t *u, uint64_t now)
{
    const char *names[3] = {"a", "b", "site"};
    for (int i = 0; i < 3; i++) {
        ig_router_upstream_init(&u[i], names[i], i < 2 ? IG_ROUTER_LOCAL : IG_ROUTER_SITE);
        u[i].ready = 1;
        u[i].slots = 8;
        u[i].reported_prefill_tps = 2000;
        u[i].reported_at_ns = now;
    }
}

/* A prefix index of 4,096 entries of 16-token blocks, and instances(). */
static ig_prefix_index_t *index_and_instances(ig_router_upstream_t *u, uint64_t now)
{
    ig_prefix_index_t *x;
    assert_int_equal(ig_prefix_index_create(&x, 4096, 16), 0);
    instances(u, now);
    return x;
}

static int pick(ig_router_t *r, ig_router_upstream_t *u, int n, ig_prefix_index_t *x,
                const ig_prefix_query_t *q, uint64_t now, ig_route_decision_t *d)
{
    ig_router_upstream_t *ups[3] = {&u[0], &u[1], &u[2]};
    ig_prefix_route_score(x, ups, n, q);
    assert_int_equal(ig_router_pick(r, ups, n, q->prompt_tokens, NULL, now, d), 0);
    ig_prefix_route_record(x, ups[d->chosen], q);
    return d->chosen;
}

static void test_affinity_spills_when_hot(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u[3];
    uint64_t now = S(1);
    ig_prefix_index_t *x = index_and_instances(u, now);
    uint64_t h[32];
    hashes_of(3, 32, h);
    ig_prefix_query_t q = {.hashes = h, .nhashes = 32, .block_size = 16, .prompt_tokens = 520};
    ig_route_decision_t d;
    /* nobody holds it: either; it is warm there afterwards */
    int warm = pick(&r, u, 2, x, &q, now, &d);
    int other = 1 - warm;
    /* cold and warm: the warm one wins, by the prefill it saves */
    for (int i = 0; i < 3; i++)
        assert_int_equal(pick(&r, u, 2, x, &q, now, &d), warm);
    ig_router_upstream_t *ups[2] = {&u[0], &u[1]};
    ig_prefix_route_score(x, ups, 2, &q);
    assert_int_equal(u[warm].cached_tokens, 512);
    assert_int_equal(u[other].cached_tokens, 0);
    double saved = ig_router_cost(&r, &u[other], 520, now) - ig_router_cost(&r, &u[warm], 520, now);
    assert_true(saved > 0.2); /* 512 tokens at 2000/s */
    /* the warm one is hot (its in-flight above the others'): spill */
    u[warm].inflight = 6;
    assert_int_equal(pick(&r, u, 2, x, &q, now, &d), other);
    /* the one spilled to is warm now */
    ig_prefix_route_score(x, ups, 2, &q);
    assert_int_equal(u[other].cached_tokens, 512);
    /* a restarted instance (its pool bumped kv_epoch) holds nothing */
    u[other].kv_epoch++;
    ig_prefix_route_score(x, ups, 2, &q);
    assert_int_equal(u[other].cached_tokens, 0);
    assert_int_equal(u[warm].cached_tokens, 512);
    assert_int_equal(ig_prefix_index_blocks(x, &u[other]), 0);
    ig_prefix_index_free(x);
}

static void test_session_affinity_and_sites(void **state)
{
    ig_router_t r = ig_trouter(IG_ROUTE_LATENCY);
    ig_router_upstream_t u[3];
    uint64_t now = S(1);
    ig_prefix_index_t *x = index_and_instances(u, now);
    /* no tokenizer (no hashes), a session id: the upstream of its last
     * turn is believed to hold that turn's prompt */
    ig_prefix_query_t q = {.has_session = 1, .session = 42, .prompt_tokens = 400};
    ig_route_decision_t d;
    int first = pick(&r, u, 2, x, &q, now, &d);
    q.prompt_tokens = 600;
    for (int i = 0; i < 3; i++)
        assert_int_equal(pick(&r, u, 2, x, &q, now, &d), first);
    ig_router_upstream_t *ups[3] = {&u[0], &u[1], &u[2]};
    ig_prefix_route_score(x, ups, 3, &q);
    assert_int_equal(u[first].cached_tokens, 599); /* all but the last token */
    /* a plain site is never believed to hold anything, even after it
     * served; an infergate peer (it routes by prefix in its region) is */
    uint64_t h[8];
    hashes_of(4, 8, h);
    ig_prefix_query_t qs = {.hashes = h, .nhashes = 8, .block_size = 16, .prompt_tokens = 130};
    ig_prefix_route_record(x, &u[2], &qs);
    ig_prefix_route_score(x, ups, 3, &qs);
    assert_int_equal(u[2].cached_tokens, 0);
    u[2].prefix_peer = 1;
    ig_prefix_route_score(x, ups, 3, &qs);
    assert_int_equal(u[2].cached_tokens, 0); /* nothing recorded while plain */
    ig_prefix_route_record(x, &u[2], &qs);
    ig_prefix_route_score(x, ups, 3, &qs);
    assert_int_equal(u[2].cached_tokens, 128);
    /* its RTT still counts: a warm peer 50 ms away against a cold local
     * instance that prefills 130 tokens in 65 ms */
    u[2].rtt_s = 0.050;
    u[2].rtt_at_ns = now;
    ig_router_upstream_t *two[2] = {&u[1], &u[2]};
    ig_prefix_route_score(x, two, 2, &qs);
    assert_int_equal(u[1].cached_tokens, 0);
    assert_true(ig_router_cost(&r, &u[2], 130, now) < ig_router_cost(&r, &u[1], 130, now));
    /* ... and 100 ms away it is not worth it */
    u[2].rtt_s = 0.100;
    assert_true(ig_router_cost(&r, &u[2], 130, now) > ig_router_cost(&r, &u[1], 130, now));
    u[2].prefix_peer = 0;
    ig_prefix_route_record(x, &u[0], &qs); /* reset for what follows */
    /* the whole prompt is never taken as cached: its last token is computed */
    ig_prefix_route_record(x, &u[0], &qs);
    qs.prompt_tokens = 128;
    ig_prefix_route_score(x, ups, 3, &qs);
    assert_int_equal(u[0].cached_tokens, 127);
    ig_prefix_index_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_match_and_caps),
        cmocka_unit_test(test_affinity_spills_when_hot),
        cmocka_unit_test(test_session_affinity_and_sites),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
