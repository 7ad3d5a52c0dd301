/*
 * Data-driven config cases: every tests/cases/config/<case>/ holds an
 * input.json and an expect file with either "ok" or the exact error message.
 * Each case is loaded from inside its folder, so messages name "input.json".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cases.h"
#include "infergate/config.h"
#include "infergate/error.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int run_case(const char *name, const char *dir, void *data)
{
    char err[1024] = "", cwd[PATH_MAX];
    char *expect = NULL;
    ig_config_t cfg;
    (void)data;
    if (getcwd(cwd, sizeof(cwd)) == NULL || chdir(dir) != 0) {
        print_error("case %s: cannot enter %s\n", name, dir);
        return 1;
    }
    int failed = 0;
    if ((expect = ig_case_expect(".")) == NULL) {
        print_error("case %s: no expect file\n", name);
        failed = 1;
        goto done;
    }
    int rc = ig_config_load_file(&cfg, "input.json", err, sizeof(err));
    if (strcmp(expect, "ok") == 0) {
        if (rc != 0) {
            print_error("case %s: expected ok, got %d: %s\n", name, rc, err);
            failed = 1;
        } else {
            ig_config_dispose(&cfg);
        }
    } else if (rc != IG_ECONFIG || strcmp(err, expect) != 0) {
        print_error("case %s:\n  expected: %s\n  got (%d): %s\n", name, expect, rc, err);
        failed = 1;
    } else if (cfg.region != NULL || cfg.models != NULL || cfg.source != NULL) {
        print_error("case %s: a failed load left memory in the struct\n", name);
        failed = 1;
    }
done:
    free(expect);
    if (chdir(cwd) != 0)
        failed = 1;
    return failed;
}

static void test_cases(void **state)
{
    (void)state;
    int n;
    int failures = ig_cases_foreach("config", run_case, NULL, &n);
    /* The suite must not silently shrink: every kind of error has cases. */
    assert_true(n >= 25);
    assert_int_equal(failures, 0);
}

int main(void)
{
    /* @cache paths must not depend on who runs the tests. */
    setenv("INFERGATE_CACHE_DIR", "/tmp/infergate-test-cache", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
