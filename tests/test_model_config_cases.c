/* config.json cases as data: tests/cases/model/<case>/config.json is loaded
 * from a directory with no weights, and the load must fail with the message
 * in <case>/expect. For configs shaped like real checkpoints (Llama-3.2,
 * Qwen2.5, Mistral) that message is the missing model.safetensors: the
 * config itself was accepted. */
#include "model_testutil.h"

#include <dirent.h>

static void run_case(const char *case_dir, const char *name)
{
    char *cfg = tu_path(case_dir, "config.json");
    char *exp = tu_path(case_dir, "expect");
    size_t clen, elen;
    unsigned char *config = tu_read(cfg, &clen);
    unsigned char *expect = tu_read(exp, &elen);
    while (elen > 0 && (expect[elen - 1] == '\n' || expect[elen - 1] == '\r'))
        elen--;
    expect[elen] = '\0';

    char *dir = tu_mkdtemp();
    char *out = tu_path(dir, "config.json");
    tu_write(out, config, clen);
    ig_model_t *m = NULL;
    char err[512] = "";
    int rc = ig_model_load(&m, dir, err, sizeof(err));
    tu_rmtree(dir);
    if (rc != IG_EMODEL || strstr(err, (const char *)expect) == NULL)
        fail_msg("case %s: got %s \"%s\", expected IG_EMODEL \"%s\"", name, ig_err_name(rc), err,
                 (const char *)expect);
    assert_null(m);
    free(out);
    free(config);
    free(expect);
    free(cfg);
    free(exp);
}

static void test_cases(void **state)
{
    (void)state;
    const char *src = getenv("IG_SOURCE_DIR") ? getenv("IG_SOURCE_DIR") : IG_SOURCE_DIR;
    char root[1024];
    snprintf(root, sizeof(root), "%s/tests/cases/model", src);
    DIR *d = opendir(root);
    assert_non_null(d);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.')
            continue;
        char *case_dir = tu_path(root, ent->d_name);
        run_case(case_dir, ent->d_name);
        free(case_dir);
        n++;
    }
    closedir(d);
    assert_true(n >= 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
