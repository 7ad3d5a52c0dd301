/*
 * `infergate devices [--json]` as a user runs it: the real binary, its exit
 * status and output. On a machine with or without a GPU it must succeed and
 * either list a usable CUDA device or say, in one line, why there is none.
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

#include "proc.h"

/* Runs `infergate devices ARGS`, returns the exit status and the stdout.
 * The binary is found through $IG_BIN_DIR when set (ctest sets it; so does
 * bench/gpu-check.sh --prebuilt for a bundle built elsewhere). */
static int run(const char *args, char *out, size_t len)
{
    char cmd[8192];
    const char *bin = getenv("IG_BIN_DIR") ? getenv("IG_BIN_DIR") : IG_BIN_DIR;
    snprintf(cmd, sizeof(cmd), "'%s/infergate' devices %s 2>/dev/null", bin, args);
    return ig_proc_capture(cmd, out, len);
}

static void test_devices_json(void **state)
{
    static char out[1 << 16];
    assert_int_equal(run("--json", out, sizeof(out)), 0);
    json_error_t je;
    json_t *root = json_loads(out, 0, &je);
    if (!root)
        fail_msg("not JSON (%s): %s", je.text, out);
    json_t *cpu = json_object_get(root, "cpu");
    assert_true(json_integer_value(json_object_get(cpu, "cores")) >= 1);
    assert_true(strlen(json_string_value(json_object_get(cpu, "model"))) > 0);
    assert_true(json_is_array(json_object_get(root, "gpus")));
    json_t *cuda = json_object_get(root, "cuda_devices");
    assert_true(json_is_array(cuda));
    int usable = json_is_true(json_object_get(root, "usable_gpu"));
    if (usable) {
        assert_true(json_array_size(cuda) > 0);
        json_t *d = json_array_get(cuda, 0);
        assert_true(json_integer_value(json_object_get(d, "memory_total")) > 0);
        assert_non_null(strstr(json_string_value(json_object_get(d, "uuid")), "-"));
    } else {
        const char *why = json_string_value(json_object_get(root, "reason"));
        assert_non_null(why);
        assert_true(strlen(why) > 0);
    }
    json_decref(root);
}

static void test_devices_text(void **state)
{
    static char out[1 << 16];
    assert_int_equal(run("", out, sizeof(out)), 0);
    assert_true(strncmp(out, "cpu: ", 5) == 0);
    /* Either a CUDA device line or the one-line reason. */
    const char *why = strstr(out, "no usable GPU: ");
    if (why) {
        assert_true(why == out || why[-1] == '\n');
        assert_non_null(strchr(why, '\n'));
    } else {
        assert_non_null(strstr(out, "cuda:0: "));
    }
}

static void test_devices_usage(void **state)
{
    static char out[1 << 16];
    assert_int_equal(run("--help", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "CUDA_VISIBLE_DEVICES=MIG-"));
    assert_int_equal(run("--bogus", out, sizeof(out)), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices_json),
        cmocka_unit_test(test_devices_text),
        cmocka_unit_test(test_devices_usage),
    };
    return cmocka_run_group_tests_name("cuda_devices", tests, NULL, NULL);
}
