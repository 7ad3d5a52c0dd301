/*
 * The status page at GET /: plain HTML whose script fetches /status and
 * renders it. Headless Chromium (Debian's chromium) loads it from a real
 * gateway with a real worker and the rendered DOM must name the instance
 * from /status, the region, and draw the chart, and it must have polled
 * /status more than once (live refresh); on failure the test saves a
 * screenshot and prints its path.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"

static ig_proc_t gw;
static char profile[96];

static int group_setup(void **state)
{
    snprintf(profile, sizeof(profile), "/tmp/igchrome-XXXXXX");
    if (mkdtemp(profile) == NULL)
        return -1;
    return ig_gwf_solo_start(&gw, "pagetest", NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_tf_rmtree(profile);
    return ig_gwf_solo_stop(&gw);
}

static const char *chromium(void)
{
    static const char *const names[] = {"chromium", "chromium-browser", "google-chrome"};
    static char found[64];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", names[i]);
        if (system(cmd) == 0) {
            snprintf(found, sizeof(found), "%s", names[i]);
            return found;
        }
    }
    return NULL;
}

/* Runs headless Chromium on url with extra flags; its stdout, malloc'ed. */
static char *run_chromium(const char *url, const char *flags)
{
    const char *bin = chromium();
    if (bin == NULL)
        return NULL;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "timeout 60 %s --headless --no-sandbox --disable-gpu --no-first-run "
             "--user-data-dir=%s --virtual-time-budget=8000 %s '%s' 2>/dev/null",
             bin, profile, flags, url);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t n;
    while (out != NULL && (n = fread(out + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 4096) {
            char *nb = realloc(out, cap * 2);
            if (nb == NULL) {
                free(out);
                out = NULL;
                break;
            }
            out = nb;
            cap *= 2;
        }
    }
    pclose(f);
    if (out != NULL)
        out[len] = '\0';
    return out;
}

/* A screenshot of the page for whoever reads the failure. */
static void screenshot(const char *url)
{
    char path[128];
    snprintf(path, sizeof(path), "/tmp/infergate-status-page-%d.png", (int)getpid());
    char flags[256];
    snprintf(flags, sizeof(flags), "--window-size=1100,900 --screenshot=%s", path);
    free(run_chromium(url, flags));
    fprintf(stderr, "status page screenshot: %s\n", path);
}

static void test_page_is_html(void **state)
{
    (void)state;
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_get(gw.port, "/", &r), 0);
    assert_int_equal(r.status, 200);
    const char *ct = ig_tc_header(&r, "Content-Type");
    assert_non_null(ct);
    assert_non_null(strstr(ct, "text/html"));
    assert_non_null(strstr(r.body, "<script>"));
    /* Nothing from outside: no absolute URL is loaded. */
    assert_null(strstr(r.body, "src=\"http"));
    assert_null(strstr(r.body, "href=\"http"));
    ig_tc_response_free(&r);
}

static void test_chromium_renders_instances(void **state)
{
    (void)state;
    if (chromium() == NULL)
        fail_msg("chromium not found (apt-get install chromium; scripts/deps.sh test)");
    /* The names the page must show are the ones /status gives. */
    json_t *st = ig_gwf_get_json(gw.port, "/status");
    assert_non_null(st);
    json_t *insts = json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances");
    assert_true(json_array_size(insts) >= 1);
    assert_true(json_array_size(json_object_get(json_object_get(st, "history"), "samples")) >= 1);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/", gw.port);
    const char *polls = "infergate_http_requests_total{route=\"/status\",status=\"200\"} ";
    double before = ig_gwf_metric(gw.port, polls);
    char *dom = run_chromium(url, "--dump-dom");
    /* Live: the page polled /status again and again during its 8 s of
     * virtual time (one poll every 2 s), not once. */
    double after = ig_gwf_metric(gw.port, polls);
    if (after - (before < 0 ? 0 : before) < 2) {
        fprintf(stderr, "the page polled /status %.0f times\n", after - before);
        free(dom);
        dom = NULL;
    }
    int ok = dom != NULL;
    size_t i;
    json_t *in;
    json_array_foreach(insts, i, in)
    {
        char want[160];
        snprintf(want, sizeof(want), "data-instance=\"%s\"",
                 json_string_value(json_object_get(in, "name")));
        if (ok && strstr(dom, want) == NULL) {
            fprintf(stderr, "the rendered page lacks %s\n", want);
            ok = 0;
        }
    }
    if (ok && strstr(dom, "pagetest") == NULL) {
        fprintf(stderr, "the rendered page lacks the region\n");
        ok = 0;
    }
    if (ok && strstr(dom, "<polyline") == NULL) {
        fprintf(stderr, "the rendered page has no chart line\n");
        ok = 0;
    }
    if (!ok) {
        fprintf(stderr, "rendered DOM:\n%s\n", dom ? dom : "(none)");
        screenshot(url);
    }
    free(dom);
    json_decref(st);
    assert_true(ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_is_html),
        cmocka_unit_test(test_chromium_renders_instances),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
