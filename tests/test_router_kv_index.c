/*
 * The exact index (infergate/kv_index.h) and how the prefix hook scores an
 * upstream whose KV events are live: its exact blocks and nothing else (no
 * session affinity, nothing from the approximate index), none when its
 * block size is not the query's, and the approximate index again once the
 * feed drops it (kv_exact NULL).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/kv_index.h"
#include "infergate/prefix_route.h"
#include "infergate/router.h"

static void test_set(void **state)
{
    (void)state;
    ig_kv_index_t *x;
    assert_int_equal(ig_kv_index_create(&x, 0, 16), IG_EINVAL);
    assert_int_equal(ig_kv_index_create(&x, 3, 16), 0);
    assert_int_equal(ig_kv_index_add(x, 11), 0);
    assert_int_equal(ig_kv_index_add(x, 11), 0); /* once */
    assert_int_equal(ig_kv_index_add(x, 12), 0);
    assert_int_equal(ig_kv_index_add(x, 13), 0);
    assert_int_equal(ig_kv_index_count(x), 3);
    assert_int_equal(ig_kv_index_add(x, 14), IG_EFULL); /* never more than the worker has */
    uint64_t chain[4] = {11, 12, 14, 13};
    assert_int_equal(ig_kv_index_match(x, chain, 4), 2);
    assert_int_equal(ig_kv_index_remove(x, 12), 0);
    assert_int_equal(ig_kv_index_remove(x, 12), IG_ENOENT);
    assert_int_equal(ig_kv_index_match(x, chain, 4), 1);
    assert_int_equal(ig_kv_index_add(x, 14), 0);
    ig_kv_index_clear(x);
    assert_int_equal(ig_kv_index_count(x), 0);
    assert_int_equal(ig_kv_index_match(x, chain, 4), 0);
    /* Many adds and removes through the same slots stay consistent. */
    for (uint64_t h = 1; h < 10000; h++) {
        assert_int_equal(ig_kv_index_add(x, h * 0x9e3779b97f4a7c15ULL), 0);
        if (h > 2)
            assert_int_equal(ig_kv_index_remove(x, (h - 2) * 0x9e3779b97f4a7c15ULL), 0);
    }
    assert_int_equal(ig_kv_index_count(x), 2);
    ig_kv_index_free(x);
}

static void test_score(void **state)
{
    (void)state;
    ig_router_upstream_t a, b;
    ig_router_upstream_init(&a, "a", IG_ROUTER_LOCAL);
    ig_router_upstream_init(&b, "b", IG_ROUTER_LOCAL);
    ig_router_upstream_t *ups[2] = {&a, &b};
    ig_prefix_index_t *approx;
    assert_int_equal(ig_prefix_index_create(&approx, 1024, 16), 0);
    uint64_t h[4] = {101, 102, 103, 104};
    ig_prefix_query_t q = {.hashes = h,
                           .nhashes = 4,
                           .block_size = 16,
                           .has_session = 1,
                           .session = 7,
                           .prompt_tokens = 70};
    /* The approximate index believes both got the prompt (b last, with
     * the session). */
    ig_prefix_route_record(approx, &a, &q);
    ig_prefix_route_record(approx, &b, &q);
    ig_prefix_route_score(approx, ups, 2, &q);
    assert_int_equal(a.cached_tokens, 64);
    assert_int_equal(b.cached_tokens, 69); /* its session's whole last turn */

    /* a's events say it holds the first two blocks, b's that it holds none. */
    ig_kv_index_t *xa, *xb;
    assert_int_equal(ig_kv_index_create(&xa, 8, 16), 0);
    assert_int_equal(ig_kv_index_create(&xb, 8, 16), 0);
    ig_kv_index_add(xa, 101);
    ig_kv_index_add(xa, 102);
    ig_kv_index_add(xa, 104);
    a.kv_exact = xa;
    b.kv_exact = xb;
    ig_prefix_route_score(approx, ups, 2, &q);
    assert_int_equal(a.cached_tokens, 32);
    assert_int_equal(b.cached_tokens, 0); /* no session affinity either */

    /* Another block size: the hashes mean nothing there. */
    ig_kv_index_t *x8;
    assert_int_equal(ig_kv_index_create(&x8, 8, 8), 0);
    ig_kv_index_add(x8, 101);
    a.kv_exact = x8;
    ig_prefix_route_score(approx, ups, 2, &q);
    assert_int_equal(a.cached_tokens, 0);

    /* The whole prompt held: its last token is still computed. */
    for (int i = 0; i < 4; i++)
        ig_kv_index_add(xb, h[i]);
    q.prompt_tokens = 64;
    ig_prefix_route_score(approx, ups, 2, &q);
    assert_int_equal(b.cached_tokens, 63);

    /* Feeds lost: the approximate index stands in again. */
    a.kv_exact = NULL;
    b.kv_exact = NULL;
    q.prompt_tokens = 70;
    ig_prefix_route_score(approx, ups, 2, &q);
    assert_int_equal(a.cached_tokens, 64);
    assert_int_equal(b.cached_tokens, 69);

    ig_kv_index_free(xa);
    ig_kv_index_free(xb);
    ig_kv_index_free(x8);
    ig_prefix_index_free(approx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_score),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
