/*
 * The official OpenAI SDK (npm `openai` 6.x, tests/peers/openai_sdk.cjs)
 * against a real gateway and its pool worker: completions and chat, plain
 * and streamed (the SDK's own SSE parser reads our chunks), usage, typed
 * errors for an unknown model and a bad parameter, and models.list. Skips
 * (77) without node or the SDK, which bench/lib/tokpeers.sh installs into
 * ~/.cache/infergate-npm (make test does).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gwfixture.h"

static ig_proc_t gw;
static char modules[1024];

static int setup(void **state)
{
    (void)state;
    return ig_gwf_solo_start(&gw, "sdk", NULL);
}

static int teardown(void **state)
{
    (void)state;
    return ig_gwf_solo_stop(&gw);
}

static void test_openai_sdk(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "IG_NPM_MODULES='%s' node '%s/tests/peers/openai_sdk.cjs' "
             "'http://127.0.0.1:%d/v1' tiny 2>&1",
             modules, IG_SOURCE_DIR, gw.port);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    int oks = 0;
    while (fgets(line, sizeof(line), p) != NULL) {
        print_message("sdk: %s", line);
        oks += strncmp(line, "ok ", 3) == 0;
    }
    int st = pclose(p);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(oks, 12); /* every check of the script ran */
}

/* The SDK's node_modules, or NULL when it (or node) is not installed. */
static const char *find_modules(void)
{
    const char *dir = getenv("IG_NPM_DIR"), *home = getenv("HOME");
    char pkg[1100];
    struct stat sb;
    if (dir != NULL && *dir)
        snprintf(modules, sizeof(modules), "%s/node_modules", dir);
    else if (home != NULL)
        snprintf(modules, sizeof(modules), "%s/.cache/infergate-npm/node_modules", home);
    else
        return NULL;
    snprintf(pkg, sizeof(pkg), "%s/openai/package.json", modules);
    if (stat(pkg, &sb) != 0 || system("node --version >/dev/null 2>&1") != 0)
        return NULL;
    return modules;
}

int main(void)
{
    if (find_modules() == NULL) {
        fprintf(stderr, "skipped: node or the npm openai SDK is not installed "
                        "(bench/lib/tokpeers.sh installs it)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_openai_sdk)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
