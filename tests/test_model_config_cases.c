/* config.json cases as data: tests/cases/model/<case>/config.json is loaded
 * from a directory with no weights, and the load must fail with the message
 * in <case>/expect. For configs shaped like real checkpoints (Llama-3.2,
 * Qwen2.5, Mistral) that message is the missing model.safetensors: the
 * config itself was accepted. */
#include "cases.h"
#include "model_testutil.h"

static int run_case(const char *name, const char *case_dir, void *data)
{
    (void)data;
    char *cfg = tu_path(case_dir, "config.json");
    size_t clen;
    unsigned char *config = tu_read(cfg, &clen);
    char *expect = ig_case_expect(case_dir);
    assert_non_null(expect);

    char *dir = tu_mkdtemp();
    char *out = tu_path(dir, "config.json");
    tu_write(out, config, clen);
    ig_model_t *m = NULL;
    char err[512] = "";
    int rc = ig_model_load(&m, dir, err, sizeof(err));
    tu_rmtree(dir);
    int failed = rc != IG_EMODEL || strstr(err, expect) == NULL || m != NULL;
    if (failed)
        print_error("case %s: got %s \"%s\", expected IG_EMODEL \"%s\"\n", name, ig_err_name(rc),
                    err, expect);
    free(out);
    free(config);
    free(expect);
    free(cfg);
    return failed;
}

static void test_cases(void **state)
{
    (void)state;
    int n;
    int failures = ig_cases_foreach("model", run_case, NULL, &n);
    assert_true(n >= 10);
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
