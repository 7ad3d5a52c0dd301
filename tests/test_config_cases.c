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

#include "infergate/config.h"
#include "infergate/error.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CASES_DIR IG_SOURCE_DIR "/tests/cases/config"

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads the first line of a file without its newline. */
static int read_line(const char *path, char *buf, size_t size)
{
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return -1;
    if (fgets(buf, (int)size, fp) == NULL)
        buf[0] = '\0';
    fclose(fp);
    buf[strcspn(buf, "\r\n")] = '\0';
    return 0;
}

static int run_case(const char *name)
{
    char dir[PATH_MAX], expect[1024], err[1024] = "", cwd[PATH_MAX];
    ig_config_t cfg;
    snprintf(dir, sizeof(dir), "%s/%s", CASES_DIR, name);
    if (getcwd(cwd, sizeof(cwd)) == NULL || chdir(dir) != 0) {
        print_error("case %s: cannot enter %s\n", name, dir);
        return 1;
    }
    int failed = 0;
    if (read_line("expect", expect, sizeof(expect)) != 0) {
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
    if (chdir(cwd) != 0)
        failed = 1;
    return failed;
}

static void test_cases(void **state)
{
    (void)state;
    DIR *d = opendir(CASES_DIR);
    assert_non_null(d);
    char *names[512];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 512) {
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), cmp_names);
    /* The suite must not silently shrink: every kind of error has cases. */
    assert_true(n >= 25);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        failures += run_case(names[i]);
        free(names[i]);
    }
    print_message("%zu config cases, %d failed\n", n, failures);
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
