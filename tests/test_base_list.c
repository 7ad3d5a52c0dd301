/*
 * base/list.h: order of push_front/push_back/insert_after, removal from the
 * middle and the ends, removing twice, the safe walk freeing as it goes, and
 * moving a whole list.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../gateway/base/list.h"

#include <stdlib.h>

typedef struct {
    int v;
    ig_list_t node;
} item_t;

static int values(const ig_list_t *h, int *out, int cap)
{
    int n = 0;
    const ig_list_t *it;
    IG_LIST_FOREACH(it, h)
    {
        if (n < cap)
            out[n] = IG_LIST_DATA(it, const item_t, node)->v;
        n++;
    }
    return n;
}

static void test_order_and_remove(void **state)
{
    ig_list_t h;
    item_t a = {1, {0}}, b = {2, {0}}, c = {3, {0}}, d = {4, {0}};
    int v[8];
    ig_list_init(&h);
    assert_true(ig_list_empty(&h));
    assert_null(ig_list_first(&h));
    assert_null(ig_list_last(&h));
    assert_false(ig_list_linked(&a.node));
    ig_list_push_back(&h, &b.node);
    ig_list_push_front(&h, &a.node);
    ig_list_push_back(&h, &d.node);
    ig_list_insert_after(&b.node, &c.node);
    assert_int_equal(values(&h, v, 8), 4);
    assert_int_equal(v[0] * 1000 + v[1] * 100 + v[2] * 10 + v[3], 1234);
    assert_ptr_equal(ig_list_first(&h), &a.node);
    assert_ptr_equal(ig_list_last(&h), &d.node);
    assert_int_equal(ig_list_count(&h), 4);

    ig_list_remove(&c.node);
    assert_false(ig_list_linked(&c.node));
    ig_list_remove(&c.node); /* twice: nothing */
    ig_list_remove(&a.node);
    ig_list_remove(&d.node);
    assert_int_equal(values(&h, v, 8), 1);
    assert_int_equal(v[0], 2);
    assert_ptr_equal(ig_list_pop_front(&h), &b.node);
    assert_true(ig_list_empty(&h));
    assert_null(ig_list_pop_front(&h));
}

static void test_safe_walk_and_move(void **state)
{
    ig_list_t h, dst;
    ig_list_init(&h);
    ig_list_init(&dst);
    for (int i = 0; i < 10; i++) {
        item_t *it = calloc(1, sizeof *it);
        assert_non_null(it);
        it->v = i;
        ig_list_push_back(&h, &it->node);
    }
    /* Free the odd ones while walking. */
    ig_list_t *it, *tmp;
    IG_LIST_FOREACH_SAFE(it, tmp, &h)
    {
        item_t *x = IG_LIST_DATA(it, item_t, node);
        if (x->v % 2) {
            ig_list_remove(it);
            free(x);
        }
    }
    int v[16];
    assert_int_equal(values(&h, v, 16), 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(v[i], 2 * i);

    ig_list_move(&dst, &h);
    assert_true(ig_list_empty(&h));
    assert_int_equal(values(&dst, v, 16), 5);
    assert_int_equal(v[4], 8);
    ig_list_t empty;
    ig_list_init(&empty);
    ig_list_move(&h, &empty); /* an empty source leaves dst empty */
    assert_true(ig_list_empty(&h));
    while ((it = ig_list_pop_front(&dst)) != NULL)
        free(IG_LIST_DATA(it, item_t, node));
    assert_true(ig_list_empty(&dst));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_remove),
        cmocka_unit_test(test_safe_walk_and_move),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
