/*
 * ig_json_parse (gateway/base/json_parse.c) against jansson's own loader,
 * the reference it replaces on the request path: on hand-picked edge cases
 * (escapes, surrogates, numbers at the limits of json_int_t and double,
 * depth, duplicates, stray bytes) and on thousands of random documents and
 * random mutations of them, both must accept the same inputs and, when
 * they accept, build equal values (one exception: a NUL byte, which ours
 * always refuses). The flags are checked on their own. ig_json_scan, which
 * builds nothing, must accept what the parser accepts (repeated keys
 * allowed in both) and find the members the parser builds. Long strings
 * with an odd byte at every offset cover each step of the string scan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infergate/jsonv.h"
#include "xorshift.h"

/* Scans buf for a few keys; fails the test when the scan disagrees with
 * the parser: in accepting, or in the members found. */
static void scan_agrees(const char *buf, size_t len)
{
    static const char *const keys[] = {"a", "doc", "k", "ab"};
    ig_json_span_t span[4];
    json_error_t e;
    json_t *v = ig_json_parse(buf, len, IG_JSON_ALLOW_DUPLICATES, &e);
    int rc = ig_json_scan(buf, len, IG_JSON_ALLOW_DUPLICATES, keys, 4, span, &e);
    if ((v == NULL) != (rc < 0))
        print_message("scan disagrees on '%.*s': parse %s, scan %d\n", (int)(len > 200 ? 200 : len),
                      buf, v ? "ok" : "error", rc);
    assert_int_equal(v == NULL, rc < 0);
    if (v != NULL)
        assert_int_equal(rc, json_is_object(v));
    for (int i = 0; rc == 1 && i < 4; i++) {
        json_t *want = json_object_get(v, keys[i]);
        assert_int_equal(want == NULL, span[i].p == NULL);
        if (want == NULL)
            continue;
        json_t *got =
            ig_json_parse(span[i].p, span[i].n, IG_JSON_DECODE_ANY | IG_JSON_ALLOW_DUPLICATES, &e);
        assert_true(json_equal(want, got));
        json_decref(got);
    }
    json_decref(v);
}

/* Parses buf with both; fails the test when they disagree. Returns 1 when
 * both accepted. */
static int same(const char *buf, size_t len)
{
    scan_agrees(buf, len);
    json_error_t je, oe;
    if (memchr(buf, '\0', len) != NULL) {
        /* A NUL byte is no JSON anywhere (in a string it must be \u0000,
         * which is refused too). jansson's loader lets one through right
         * after a number or a literal ("[1\0]"): there ours is stricter. */
        json_t *ours = ig_json_parse(buf, len, 0, &oe);
        assert_null(ours);
        return 0;
    }
    json_t *ref = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    json_t *ours = ig_json_parse(buf, len, 0, &oe);
    int agree = (ref == NULL) == (ours == NULL) && (ref == NULL || json_equal(ref, ours));
    if (!agree)
        print_message("disagree on %zu bytes '%.*s': jansson %s (%s), ours %s (%s)\n", len,
                      (int)(len > 200 ? 200 : len), buf, ref ? "ok" : "error", ref ? "" : je.text,
                      ours ? "ok" : "error", ours ? "" : oe.text);
    assert_true(agree);
    if (ours == NULL)
        assert_true(oe.text[0] != '\0'); /* a refusal says why */
    int ok = ours != NULL;
    json_decref(ref);
    json_decref(ours);
    return ok;
}

static void test_edge_cases(void **state)
{
    (void)state;
    static const char *const cases[] = {
        "{}",
        "[]",
        " \t\r\n{ } ",
        "{\"a\":1}",
        "[1,2,3]",
        "[1,]",
        "[,1]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{a:1}",
        "{\"a\":1}x",
        "{\"a\":1} {}",
        "",
        " ",
        "1",
        "\"s\"",
        "null",
        "[true,false,null]",
        "[tru]",
        "[nul]",
        "[True]",
        "[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"]",
        "[\"\\u00e9\\u4e2d\\ud83d\\ude00\"]",
        "[\"\\ud83d\"]",
        "[\"\\ude00\"]",
        "[\"\\ud83dx\"]",
        "[\"\\ud83d\\u0041\"]",
        "[\"\\u0000\"]",
        "[\"\\u00\"]",
        "[\"\\uZZZZ\"]",
        "[\"\\x\"]",
        "[\"\\",
        "[\"abc",
        "[\"a\tb\"]",
        "[\"\xc3\xa9\"]",
        "[\"\xc3\"]",
        "[\"\xed\xa0\x80\"]",
        "[\"\xef\xbf\xbf\"]",
        "[\"\\uffff\"]",
        "[\"\xf4\x90\x80\x80\"]",
        "[\"\xc0\xaf\"]",
        "[0]",
        "[-0]",
        "[01]",
        "[-]",
        "[1.]",
        "[.5]",
        "[+1]",
        "[1e5]",
        "[1E+5]",
        "[1e-5]",
        "[1e]",
        "[-1.5e-3]",
        "[9223372036854775807]",
        "[9223372036854775808]",
        "[-9223372036854775808]",
        "[-9223372036854775809]",
        "[1e308]",
        "[1e309]",
        "[-1e309]",
        "[1e-400]",
        "[123456789012345678901234567890.5]",
        "[0.1]",
        "[3.141592653589793238462643383279]",
        "{\"a\":1,\"a\":2}",
        "{\"a\":{\"b\":1,\"b\":2}}",
        "{\"\":1}",
        "{\"a\\u0062\":1,\"ab\":2}",
        "[\x01]",
        "[\"\x7f\"]",
        "\xef\xbb\xbf{}",
        "{\"k\":[{\"x\":[[],{}]}]}",
        "[1 2]",
        "{\"a\":1 \"b\":2}",
        "[\"\\/\"]",
        "[1\n,\n2\n]",
    };
    int accepted = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        accepted += same(cases[i], strlen(cases[i]));
    assert_true(accepted > 20); /* the valid ones are accepted, not just all refused */
    /* A NUL byte outside a string, and inside one. */
    assert_int_equal(same("[1]\0", 4), 0);
    assert_int_equal(same("[\"a\0b\"]", 7), 0);
}

static void test_depth(void **state)
{
    (void)state;
    for (int depth = IG_JSON_MAX_DEPTH - 1; depth <= IG_JSON_MAX_DEPTH + 1; depth++) {
        char *b = malloc((size_t)depth * 2 + 1);
        assert_non_null(b);
        memset(b, '[', (size_t)depth);
        memset(b + depth, ']', (size_t)depth);
        int ok = same(b, (size_t)depth * 2);
        assert_int_equal(ok, depth <= IG_JSON_MAX_DEPTH);
        free(b);
    }
}

/* ---- random documents ------------------------------------------------------ */

typedef struct {
    char *b;
    size_t n, cap;
} buf_t;

static void put(buf_t *o, const char *s, size_t n)
{
    if (o->n + n + 1 > o->cap) {
        o->cap = (o->n + n + 1) * 2;
        o->b = realloc(o->b, o->cap);
        assert_non_null(o->b);
    }
    memcpy(o->b + o->n, s, n);
    o->n += n;
    o->b[o->n] = '\0';
}

static void puts_(buf_t *o, const char *s)
{
    put(o, s, strlen(s));
}

static void ws(buf_t *o, uint64_t *rng)
{
    static const char *const w[] = {"", "", "", " ", "\n", "\t", "\r\n  "};
    puts_(o, w[ig_xs_next(rng) % 7]);
}

static void rand_string(buf_t *o, uint64_t *rng)
{
    static const char *const pieces[] = {
        "a",
        "Z",
        "0",
        " ",
        "\\n",
        "\\\"",
        "\\\\",
        "\\/",
        "\\t",
        "\\u00e9",
        "\\u4E2D",
        "\\ud83d\\ude00",
        "\xc3\xa9",
        "\xe4\xb8\xad",
        "\xf0\x9f\x98\x80",
        "key",
        "\\b",
        "\\f",
    };
    puts_(o, "\"");
    int n = (int)(ig_xs_next(rng) % 8);
    for (int i = 0; i < n; i++)
        puts_(o, pieces[ig_xs_next(rng) % (sizeof(pieces) / sizeof(pieces[0]))]);
    puts_(o, "\"");
}

static void rand_value(buf_t *o, uint64_t *rng, int depth)
{
    static const char *const atoms[] = {
        "0",
        "-0",
        "1",
        "-17",
        "42",
        "9223372036854775807",
        "-9223372036854775808",
        "3.5",
        "-0.25",
        "1e10",
        "2.5E-3",
        "6.02e23",
        "1e-300",
        "true",
        "false",
        "null",
    };
    unsigned k = (unsigned)(ig_xs_next(rng) % (depth < 5 ? 6 : 3));
    if (k == 0 || k == 1) {
        puts_(o, atoms[ig_xs_next(rng) % (sizeof(atoms) / sizeof(atoms[0]))]);
    } else if (k == 2) {
        rand_string(o, rng);
    } else {
        /* an object (k 3 or 4) or an array (k 5) of n members or elements */
        int obj = k != 5;
        int n = (int)(ig_xs_next(rng) % 5);
        puts_(o, obj ? "{" : "[");
        for (int i = 0; i < n; i++) {
            ws(o, rng);
            if (obj) {
                char key[16];
                /* distinct keys mostly; now and then a repeat (a duplicate) */
                snprintf(key, sizeof(key), "\"k%d\"", ig_xs_next(rng) % 40 == 0 ? 0 : i);
                puts_(o, key);
                ws(o, rng);
                puts_(o, ":");
                ws(o, rng);
            }
            rand_value(o, rng, depth + 1);
            ws(o, rng);
            if (i + 1 < n)
                puts_(o, ",");
        }
        puts_(o, obj ? "}" : "]");
    }
}

static void test_random_documents_and_mutations(void **state)
{
    (void)state;
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    int docs_ok = 0, mutants = 0, mutants_ok = 0;
    static const char bytes[] = "{}[]\",:\\-+.0123456789eEtfnu \x00\x80\xc3\xff\x1f";
    for (int d = 0; d < 3000; d++) {
        buf_t o = {0};
        puts_(&o, ig_xs_next(&rng) % 2 ? "{\"doc\":" : "[");
        rand_value(&o, &rng, 0);
        puts_(&o, o.b[0] == '{' ? "}" : "]");
        docs_ok += same(o.b, o.n);
        for (int m = 0; m < 6; m++) {
            char *c = malloc(o.n + 2);
            assert_non_null(c);
            memcpy(c, o.b, o.n);
            size_t n = o.n, at = (size_t)(ig_xs_next(&rng) % o.n);
            char x = bytes[ig_xs_next(&rng) % (sizeof(bytes) - 1)];
            switch (m % 3) {
            case 0: /* replace a byte */
                c[at] = x;
                break;
            case 1: /* insert one */
                memmove(c + at + 1, c + at, n - at);
                c[at] = x;
                n++;
                break;
            default: /* cut the document short */
                n = at;
                break;
            }
            mutants++;
            mutants_ok += same(c, n);
            free(c);
        }
        free(o.b);
    }
    print_message("random: %d documents, %d accepted by both (duplicates refused); %d mutants, "
                  "%d accepted by both\n",
                  3000, docs_ok, mutants, mutants_ok);
    assert_true(docs_ok > 2000);
    assert_true(mutants_ok > 0 && mutants_ok < mutants);
}

/* Strings longer than one 16- or 8-byte step of the string scan, with a
 * byte that ends or breaks the run (a quote, a backslash, control bytes,
 * UTF-8 good and bad) at every offset, and a key whose escape is its first
 * byte: both loaders agree, and the scan finds the member. */
static void test_long_strings(void **state)
{
    (void)state;
    static const char *const odd[] = {"\"",   "\\\"",     "\\n",  "\x01",         "\x1f", " ",
                                      "\x7f", "\xc3\xa9", "\xff", "\xe4\xb8\xad", "\\"};
    char doc[128];
    for (int len = 0; len <= 40; len++) {
        for (int at = 0; at <= len; at++) {
            for (size_t k = 0; k < sizeof(odd) / sizeof(odd[0]); k++) {
                size_t n = 0, olen = strlen(odd[k]);
                memcpy(doc + n, "{\"a\":\"", 6);
                n += 6;
                for (int i = 0; i <= len; i++) {
                    if (i == at) {
                        memcpy(doc + n, odd[k], olen);
                        n += olen;
                    }
                    if (i < len)
                        doc[n++] = (char)('a' + i % 26);
                }
                memcpy(doc + n, "\"}", 2);
                n += 2;
                same(doc, n);
            }
        }
    }
    static const char *const keys[] = {"model"};
    ig_json_span_t span[1];
    json_error_t e;
    const char *esc = "{\"\\u006dodel\":\"m\"}";
    assert_int_equal(ig_json_scan(esc, strlen(esc), 0, keys, 1, span, &e), 1);
    assert_memory_equal(span[0].p, "\"m\"", 3);
}

static void test_flags(void **state)
{
    (void)state;
    json_error_t e;
    json_t *v = ig_json_parse("42", 2, 0, &e);
    assert_null(v);
    v = ig_json_parse(" 42 ", 4, IG_JSON_DECODE_ANY, &e);
    assert_true(json_is_integer(v) && json_integer_value(v) == 42);
    json_decref(v);
    v = ig_json_parse("{\"a\":1} trailing", 16, IG_JSON_DISABLE_EOF_CHECK, &e);
    assert_true(json_is_object(v));
    json_decref(v);
    v = ig_json_parse("{\"a\":1,\"a\":2}", 13, IG_JSON_ALLOW_DUPLICATES, &e);
    assert_int_equal(json_integer_value(json_object_get(v, "a")), 2);
    json_decref(v);
    v = ig_json_parse("{\"a\":1,\n \"a\":2}", 15, 0, &e);
    assert_null(v);
    assert_non_null(strstr(e.text, "duplicate"));
    assert_int_equal(e.line, 2);
    assert_int_equal(e.column, 2);
    /* a scan refuses a repeat of a key it reads, anywhere else it lets one by */
    static const char *const keys[] = {"model"};
    ig_json_span_t span[1];
    const char *dup = "{\"x\":{\"y\":1,\"y\":2},\"x\":3,\"model\":\"m\"}";
    assert_int_equal(ig_json_scan(dup, strlen(dup), 0, keys, 1, span, &e), 1);
    assert_int_equal(span[0].n, 3);
    assert_memory_equal(span[0].p, "\"m\"", 3);
    dup = "{\"model\":\"m\",\"mod\\u0065l\":\"n\"}";
    assert_int_equal(ig_json_scan(dup, strlen(dup), 0, keys, 1, span, &e), -1);
    assert_non_null(strstr(e.text, "duplicate"));
    assert_int_equal(ig_json_scan(" 42 ", 4, IG_JSON_DECODE_ANY, keys, 1, span, &e), 0);
    assert_int_equal(ig_json_scan("42", 2, 0, keys, 1, span, &e), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_random_documents_and_mutations),
        cmocka_unit_test(test_long_strings),
        cmocka_unit_test(test_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
