/* API: the GET /load codec. A report survives encode + decode field by
 * field; missing fields stay unset, unknown ones are ignored; a field of
 * the wrong type is named and left out while the others are read; the
 * version is read, defaulted and checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/load.h"

#include <stdlib.h>
#include <string.h>

static int decode(const char *text, ig_load_t *l, char *err, size_t errlen)
{
    return ig_load_decode(text, strlen(text), l, err, errlen);
}

/* Encodes l, dumps it, and decodes the text into out. */
static void round_trip(const ig_load_t *l, ig_load_t *out)
{
    json_t *doc = ig_load_encode(l);
    assert_non_null(doc);
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    assert_non_null(text);
    char err[128];
    ig_load_init(out);
    assert_int_equal(decode(text, out, err, sizeof(err)), 0);
    assert_string_equal(err, "");
    free(text);
}

static void test_worker_round_trip(void **state)
{
    ig_load_t l, d;
    ig_load_init(&l);
    l.has = IG_LOAD_WORKER_FIELDS | IG_LOAD_CHAT_TEMPLATE;
    l.waiting = 3;
    l.running = 7;
    l.inflight = 10;
    l.est_wait_s = 0.25;
    l.prefill_tokens_per_s = 1234.5;
    l.decode_tokens_per_s = 88.0;
    l.max_num_seqs = 16;
    l.kv_blocks_used = 5;
    l.kv_blocks_total = 256;
    l.max_waiting = 128;
    l.max_batched_tokens = 2048;
    l.model = "tiny";
    l.state = "draining";
    l.ready = 0;
    l.chat_template = "chatml";
    round_trip(&l, &d);
    assert_int_equal(d.has, l.has);
    assert_int_equal(d.version, IG_LOAD_VERSION);
    assert_true(d.waiting == 3 && d.running == 7);
    assert_int_equal(d.inflight, 10);
    assert_true(d.est_wait_s == 0.25);
    assert_true(d.prefill_tokens_per_s == 1234.5);
    assert_true(d.decode_tokens_per_s == 88.0);
    assert_int_equal(d.max_num_seqs, 16);
    assert_int_equal(d.kv_blocks_used, 5);
    assert_int_equal(d.kv_blocks_total, 256);
    assert_int_equal(d.max_waiting, 128);
    assert_int_equal(d.max_batched_tokens, 2048);
    assert_string_equal(d.model, "tiny");
    assert_string_equal(d.state, "draining");
    assert_int_equal(d.ready, 0);
    assert_string_equal(d.chat_template, "chatml");
    ig_load_dispose(&d);
    assert_int_equal(d.has, 0);
    assert_null(d.model);
}

static void test_gateway_round_trip(void **state)
{
    ig_load_t l, d;
    ig_load_init(&l);
    l.has = IG_LOAD_GATEWAY_FIELDS;
    l.region = "eu-west";
    l.models[0] = "tiny";
    l.models[1] = "small";
    l.nmodels = 2;
    l.ready_instances = 2;
    l.waiting = 1.5; /* a gateway sums what its instances report */
    l.running = 4;
    l.ttft_s = 0.0125;
    l.max_num_seqs = 64;
    round_trip(&l, &d);
    assert_int_equal(d.has, IG_LOAD_GATEWAY_FIELDS);
    assert_string_equal(d.region, "eu-west");
    assert_int_equal(d.nmodels, 2);
    assert_string_equal(d.models[0], "tiny");
    assert_string_equal(d.models[1], "small");
    assert_int_equal(d.ready_instances, 2);
    assert_true(d.waiting == 1.5 && d.running == 4);
    assert_true(d.ttft_s == 0.0125);
    assert_int_equal(d.max_num_seqs, 64);
    /* Worker-only fields were not sent, so they are not there. */
    assert_false(d.has & (IG_LOAD_MODEL | IG_LOAD_STATE | IG_LOAD_KV_BLOCKS_TOTAL));
    ig_load_dispose(&d);
}

/* Only the fields in `has` go out, plus the version; whole counts are
 * integers on the wire, fractions reals. */
static void test_encode_writes_only_has(void **state)
{
    ig_load_t l;
    ig_load_init(&l);
    l.has = IG_LOAD_WAITING | IG_LOAD_EST_WAIT;
    l.waiting = 2;
    l.est_wait_s = 0.5;
    l.max_num_seqs = 99; /* not in has: not written */
    json_t *doc = ig_load_encode(&l);
    assert_non_null(doc);
    assert_int_equal(json_object_size(doc), 3);
    assert_int_equal(json_integer_value(json_object_get(doc, "version")), IG_LOAD_VERSION);
    assert_true(json_is_integer(json_object_get(doc, "waiting")));
    assert_int_equal(json_integer_value(json_object_get(doc, "waiting")), 2);
    assert_true(json_is_real(json_object_get(doc, "est_wait_s")));
    assert_null(json_object_get(doc, "max_num_seqs"));
    json_decref(doc);
}

static void test_missing_and_extra_fields(void **state)
{
    ig_load_t d;
    char err[128];
    ig_load_init(&d);
    /* An empty object: nothing set, version 1, no error. */
    assert_int_equal(decode("{}", &d, err, sizeof(err)), 0);
    assert_int_equal(d.has, 0);
    assert_int_equal(d.version, 1);
    /* Unknown fields (a newer writer, another server) are ignored. */
    assert_int_equal(decode("{\"waiting\":4,\"busy\":9,\"gpu\":{\"util\":0.5},\"slots\":[1]}", &d,
                            err, sizeof(err)),
                     0);
    assert_int_equal(d.has, IG_LOAD_WAITING);
    assert_true(d.waiting == 4);
    /* models as {"id": ...} objects (an OpenAI-shaped list) are read too. */
    assert_int_equal(
        decode("{\"models\":[{\"id\":\"a\"},\"b\",{\"name\":\"x\"},3]}", &d, err, sizeof(err)), 0);
    assert_int_equal(d.nmodels, 2);
    assert_string_equal(d.models[0], "a");
    assert_string_equal(d.models[1], "b");
    /* Not NUL-terminated: len decides. */
    const char text[] = "{\"inflight\":5}garbage";
    assert_int_equal(ig_load_decode(text, 14, &d, NULL, 0), 0);
    assert_int_equal(d.inflight, 5);
    ig_load_dispose(&d);
}

static void test_wrong_types(void **state)
{
    ig_load_t d;
    char err[128];
    ig_load_init(&d);
    /* The bad field is named and left out; the good ones still count. */
    assert_int_equal(
        decode("{\"waiting\":\"3\",\"est_wait_s\":0.5,\"max_num_seqs\":8}", &d, err, sizeof(err)),
        IG_EINVAL);
    assert_string_equal(err, "$.waiting: expected a number");
    assert_int_equal(d.has, IG_LOAD_EST_WAIT | IG_LOAD_MAX_NUM_SEQS);
    assert_true(d.est_wait_s == 0.5);
    assert_int_equal(d.max_num_seqs, 8);
    /* An integer field takes no fraction (slots are whole). */
    assert_int_equal(decode("{\"max_num_seqs\":8.5}", &d, err, sizeof(err)), IG_EINVAL);
    assert_string_equal(err, "$.max_num_seqs: expected an integer");
    assert_false(d.has & IG_LOAD_MAX_NUM_SEQS);
    assert_int_equal(decode("{\"max_num_seqs\":99999999999}", &d, err, sizeof(err)), IG_EINVAL);
    assert_int_equal(decode("{\"ready\":1}", &d, err, sizeof(err)), IG_EINVAL);
    assert_string_equal(err, "$.ready: expected a boolean");
    assert_int_equal(decode("{\"model\":null}", &d, err, sizeof(err)), IG_EINVAL);
    assert_string_equal(err, "$.model: expected a string");
    assert_int_equal(decode("{\"models\":\"tiny\"}", &d, err, sizeof(err)), IG_EINVAL);
    assert_string_equal(err, "$.models: expected an array");
    assert_int_equal(d.has, 0);
    /* The first bad field is the one named. */
    assert_int_equal(decode("{\"running\":[],\"ttft_s\":{}}", &d, err, sizeof(err)), IG_EINVAL);
    assert_string_equal(err, "$.running: expected a number");
    /* Not an object at all: nothing is read. */
    assert_int_equal(decode("[1,2]", &d, err, sizeof(err)), IG_EPARSE);
    assert_string_equal(err, "$: expected an object");
    assert_int_equal(decode("{\"waiting\":", &d, err, sizeof(err)), IG_EPARSE);
    assert_string_equal(err, "$: not JSON");
    assert_int_equal(d.has, 0);
    assert_int_equal(ig_load_decode(NULL, 0, &d, NULL, 0), IG_EPARSE);
    ig_load_dispose(&d);
}

static void test_versions(void **state)
{
    ig_load_t d;
    char err[128];
    ig_load_init(&d);
    assert_int_equal(decode("{\"version\":1,\"waiting\":2}", &d, err, sizeof(err)), 0);
    assert_int_equal(d.version, 1);
    /* A newer version only adds fields: the known ones read as they are. */
    assert_int_equal(
        decode("{\"version\":7,\"waiting\":2,\"new_field\":true}", &d, err, sizeof(err)), 0);
    assert_int_equal(d.version, 7);
    assert_int_equal(d.has, IG_LOAD_WAITING);
    /* A version that is no version is an error, the fields still read. */
    assert_int_equal(decode("{\"version\":0,\"waiting\":2}", &d, err, sizeof(err)), IG_EINVAL);
    assert_string_equal(err, "$.version: expected an integer >= 1");
    assert_int_equal(d.has, IG_LOAD_WAITING);
    assert_int_equal(decode("{\"version\":\"1\"}", &d, err, sizeof(err)), IG_EINVAL);
    assert_int_equal(decode("{\"version\":1.5}", &d, err, sizeof(err)), IG_EINVAL);
    /* The encoder always writes the current version. */
    ig_load_t l;
    ig_load_init(&l);
    l.version = 42;
    json_t *doc = ig_load_encode(&l);
    assert_int_equal(json_integer_value(json_object_get(doc, "version")), IG_LOAD_VERSION);
    json_decref(doc);
    ig_load_dispose(&d);
}

/* Decoding into a struct that holds a report replaces it (no leak under
 * ASan, no stale field). */
static void test_decode_replaces(void **state)
{
    ig_load_t d;
    ig_load_init(&d);
    assert_int_equal(ig_load_decode("{\"model\":\"a\",\"waiting\":1}", 25, &d, NULL, 0), 0);
    assert_int_equal(d.has, IG_LOAD_MODEL | IG_LOAD_WAITING);
    assert_int_equal(ig_load_decode("{\"running\":2}", 13, &d, NULL, 0), 0);
    assert_int_equal(d.has, IG_LOAD_RUNNING);
    assert_null(d.model);
    assert_true(d.waiting == 0);
    ig_load_dispose(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_round_trip),
        cmocka_unit_test(test_gateway_round_trip),
        cmocka_unit_test(test_encode_writes_only_has),
        cmocka_unit_test(test_missing_and_extra_fields),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_decode_replaces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
