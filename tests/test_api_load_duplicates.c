/* API: the GET /load decoder rejects a document with a key twice in one
 * object (base/jsonv's rule for every document the project reads), so that
 * no reader of /load picks the first or the last of two values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/load.h"

#include <string.h>

static int decode(const char *text, ig_load_t *l, char *err, size_t errlen)
{
    return ig_load_decode(text, strlen(text), l, err, errlen);
}

static void test_duplicate_key_is_not_json(void **state)
{
    (void)state;
    ig_load_t l;
    char err[128];
    ig_load_init(&l);
    assert_int_equal(decode("{\"version\":1,\"waiting\":3,\"waiting\":900}", &l, err, sizeof(err)),
                     IG_EPARSE);
    assert_string_equal(err, "$: not JSON");
    assert_int_equal(l.has, 0);
    ig_load_dispose(&l);
}

static void test_duplicate_key_in_nested_object(void **state)
{
    (void)state;
    ig_load_t l;
    char err[128];
    ig_load_init(&l);
    assert_int_equal(decode("{\"models\":[{\"id\":\"a\",\"id\":\"b\"}]}", &l, err, sizeof(err)),
                     IG_EPARSE);
    assert_int_equal(l.has, 0);
    ig_load_dispose(&l);
}

static void test_distinct_keys_still_decode(void **state)
{
    (void)state;
    ig_load_t l;
    char err[128];
    ig_load_init(&l);
    assert_int_equal(decode("{\"version\":1,\"waiting\":3,\"running\":4}", &l, err, sizeof(err)),
                     0);
    assert_true(l.has & IG_LOAD_WAITING);
    assert_int_equal(l.waiting, 3);
    ig_load_dispose(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duplicate_key_is_not_json),
        cmocka_unit_test(test_duplicate_key_in_nested_object),
        cmocka_unit_test(test_distinct_keys_still_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
