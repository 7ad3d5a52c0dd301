/*
 * base/jsonv: absent / present / fault for each getter, the JSON path and
 * fault details handed to the reader, null as absent or as a wrong type,
 * integral reals, open and closed ranges, unknown keys, and duplicate keys
 * refused at load.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/jsonv.h"

#include <math.h>
#include <string.h>

typedef struct {
    int calls;
    ig_jsonv_fault_t last;
    char path[IG_JSONV_PATH_MAX];
} seen_t;

static int record(ig_jsonv_t *v, const ig_jsonv_fault_t *f)
{
    seen_t *s = v->data;
    s->calls++;
    s->last = *f;
    snprintf(s->path, sizeof s->path, "%s", f->path);
    return IG_ECONFIG;
}

static json_t *doc(const char *text)
{
    json_error_t e;
    json_t *j = ig_jsonv_loadb(text, strlen(text), &e);
    assert_non_null(j);
    return j;
}

static void test_getters(void **state)
{
    seen_t s = {0};
    ig_jsonv_t v = {0, record, &s};
    json_t *j = doc("{\"a\":{\"n\":5,\"r\":0.5,\"b\":true,\"s\":\"x\",\"e\":\"two\",\"l\":[1]}}");
    json_t *a;
    assert_int_equal(ig_jsonv_object(&v, j, "", "a", 0, &a), 1);
    long long i;
    uint64_t u;
    double d;
    int b, e;
    const char *str;
    size_t len;
    assert_int_equal(ig_jsonv_int(&v, a, "a", "n", 0, 0, 10, 7, &i), 1);
    assert_int_equal(i, 5);
    assert_int_equal(ig_jsonv_int(&v, a, "a", "zz", 0, 0, 10, 7, &i), 0);
    assert_int_equal(i, 7);
    assert_int_equal(ig_jsonv_uint(&v, a, "a", "n", 0, 1, 5, 0, &u), 1);
    assert_int_equal(ig_jsonv_number(&v, a, "a", "r", IG_JSONV_LO_OPEN, 0, 1, 9, &d), 1);
    assert_true(d == 0.5);
    assert_int_equal(ig_jsonv_bool(&v, a, "a", "b", 0, 0, &b), 1);
    assert_true(b);
    assert_int_equal(ig_jsonv_string(&v, a, "a", "s", 0, NULL, &str, &len), 1);
    assert_string_equal(str, "x");
    assert_int_equal(len, 1);
    static const char *const names[] = {"one", "two", NULL};
    assert_int_equal(ig_jsonv_enum(&v, a, "a", "e", 0, names, 0, &e), 1);
    assert_int_equal(e, 1);
    assert_int_equal(s.calls, 0);

    /* Faults carry the path and the details. */
    assert_int_equal(ig_jsonv_int(&v, a, "a", "n", 0, 6, 10, 0, &i), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_RANGE);
    assert_string_equal(s.path, "a.n");
    assert_int_equal(s.last.x, 5);
    assert_int_equal(s.last.lo, 6);
    assert_int_equal(ig_jsonv_uint(&v, a, "a", "n", 0, 0, 4, 0, &u), IG_ECONFIG);
    assert_true(s.last.is_unsigned);
    assert_int_equal(s.last.uhi, 4);
    assert_int_equal(ig_jsonv_number(&v, a, "a", "r", IG_JSONV_HI_OPEN, 0, 0.5, 0, &d), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_RANGE);
    assert_true(s.last.dx == 0.5);
    assert_int_equal(ig_jsonv_bool(&v, a, "a", "n", 0, 0, &b), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_TYPE);
    assert_int_equal(s.last.want, IG_JSONV_BOOLEAN);
    assert_string_equal(ig_jsonv_type_name(s.last.value), "an integer");
    assert_int_equal(ig_jsonv_array(&v, a, "a", "zz", IG_JSONV_REQUIRED, &a), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_MISSING);
    assert_string_equal(s.path, "a.zz");
    json_decref(j);
}

static void test_null_real_keys(void **state)
{
    seen_t s = {0};
    ig_jsonv_t strict = {0, record, &s};
    ig_jsonv_t lax = {IG_JSONV_NULL_ABSENT | IG_JSONV_INTEGRAL_REAL, record, &s};
    json_t *j = doc("{\"n\":null,\"f\":16.0,\"g\":16.5,\"x\":1}");
    json_object_set_new(j, "s", json_stringn("a\0b", 3)); /* jansson loads no NUL */
    long long i;
    assert_int_equal(ig_jsonv_int(&lax, j, "", "n", 0, 0, 99, 3, &i), 0);
    assert_int_equal(i, 3);
    assert_int_equal(ig_jsonv_int(&strict, j, "", "n", 0, 0, 99, 3, &i), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_TYPE);
    assert_string_equal(s.path, "n"); /* top level: no dot */
    assert_int_equal(ig_jsonv_int(&lax, j, "", "f", 0, 0, 99, 0, &i), 1);
    assert_int_equal(i, 16);
    assert_int_equal(ig_jsonv_int(&strict, j, "", "f", 0, 0, 99, 0, &i), IG_ECONFIG);
    assert_int_equal(ig_jsonv_int(&lax, j, "", "g", 0, 0, 99, 0, &i), IG_ECONFIG);
    const char *str;
    assert_int_equal(ig_jsonv_string(&lax, j, "", "s", 0, NULL, &str, NULL), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_NUL);

    static const char *const allowed[] = {"n", "f", "g", "s", NULL};
    s.calls = 0;
    assert_int_equal(ig_jsonv_keys(&strict, j, "top", allowed), IG_ECONFIG);
    assert_int_equal(s.last.kind, IG_JSONV_UNKNOWN);
    assert_string_equal(s.path, "top.x");
    json_decref(j);

    char p[IG_JSONV_PATH_MAX];
    ig_jsonv_join_index(p, "pools", 3);
    assert_string_equal(p, "pools[3]");
}

static void test_duplicates(void **state)
{
    json_error_t e;
    const char *t = "{\"a\":1,\"a\":2}";
    assert_null(ig_jsonv_loadb(t, strlen(t), &e));
    assert_non_null(strstr(e.text, "duplicate"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_null_real_keys),
        cmocka_unit_test(test_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
