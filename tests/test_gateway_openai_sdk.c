/*
 * The official OpenAI SDK (npm `openai` 6.x, tests/peers/openai_sdk.cjs)
 * against a real gateway and its pool worker: completions and chat, plain
 * and streamed (the SDK's own SSE parser reads our chunks), usage, typed
 * errors for an unknown model and a bad parameter, and models.list. Then
 * the same SDK against a gateway in front of a full OpenAI-compatible site
 * (tests/peers/recording_site.py, tests/peers/openai_sdk_site.cjs): tool
 * calls plain and streamed with n 2, embeddings, and the Responses API
 * plain and streamed. Skips
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
#include "peers.h"

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

/* The SDK's check script against base (a /v1 URL) for model; returns how
 * many "ok" lines it printed, after asserting that it exited 0. */
static int run_sdk(const char *script, int port, const char *model)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "IG_NPM_MODULES='%s' node '%s/tests/peers/%s' 'http://127.0.0.1:%d/v1' %s 2>&1",
             modules, IG_SOURCE_DIR, script, port, model);
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
    return oks;
}

static void test_openai_sdk(void **state)
{
    (void)state;
    assert_int_equal(run_sdk("openai_sdk.cjs", gw.port, "tiny"), 12); /* every check ran */
}

static void test_openai_sdk_site(void **state)
{
    (void)state;
    ig_proc_t site, g;
    assert_int_equal(ig_peer_start(&site, "recording_site.py", NULL, 10000), 0);
    int port = ig_proc_free_port();
    assert_int_equal(ig_gwf_serve_config(&g, port, "warn", 0, 10000, 15000,
                                         "{\"region\":\"sdk\",\"listen\":\"127.0.0.1:%d\","
                                         "\"limits\":{\"drain_grace_ms\":0},\"sites\":[{"
                                         "\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\","
                                         "\"models\":[\"m\"]}]}",
                                         port, site.port),
                     0);
    int oks = run_sdk("openai_sdk_site.cjs", g.port, "m");
    ig_proc_stop(&g, SIGTERM, 10000);
    ig_proc_dispose(&g);
    ig_proc_stop(&site, SIGTERM, 5000);
    ig_proc_dispose(&site);
    assert_int_equal(oks, 7); /* every check of the script ran */
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_openai_sdk),
                                       cmocka_unit_test(test_openai_sdk_site)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
