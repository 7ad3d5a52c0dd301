/*
 * The Kubernetes manifests of deploy/kubernetes: they parse (python3-yaml)
 * and tests/deploy/check_manifests.py finds nothing wrong with their kinds,
 * probes, resources, shutdown timing, headless Services against the region
 * config's discovered pools, KEDA ScaledObjects, and region configs (each
 * passes `infergate serve --check-config`). Then the same check on copies
 * broken one way each must fail, naming the problem: the check can fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "proc.h"

#ifndef IG_SOURCE_DIR
#error "IG_SOURCE_DIR must name the source tree"
#endif

#define MANIFESTS IG_SOURCE_DIR "/deploy/kubernetes"

/* Runs the check on dir; its exit status, its report in out. */
static int check(const char *dir, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "python3 %s/tests/deploy/check_manifests.py %s %s 2>&1",
             IG_SOURCE_DIR, dir, ig_proc_bin("infergate"));
    return ig_proc_capture(cmd, out, cap);
}

static int group_setup(void **state)
{
    (void)state;
    if (system("python3 -c 'import yaml' 2>/dev/null") != 0) {
        fprintf(stderr, "python3-yaml is missing (scripts/deps.sh test)\n");
        exit(77);
    }
    return 0;
}

static void test_manifests_pass(void **state)
{
    (void)state;
    char out[8192];
    int rc = check(MANIFESTS, out, sizeof(out));
    if (rc != 0)
        fprintf(stderr, "%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "0 problems"));
}

/* A copy of the manifests with `from` replaced by `to` in file; the check
 * must fail and its report contain `want`. */
static void broken(const char *file, const char *from, const char *to, const char *want)
{
    char dir[256], cmd[1024], path[512], out[8192];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    snprintf(cmd, sizeof(cmd), "cp -r %s/. %s/", MANIFESTS, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    size_t len;
    char *text = ig_tf_read(path, &len);
    assert_non_null(text);
    char *at = strstr(text, from);
    assert_non_null(at); /* the manifest still has what this case breaks */
    size_t flen = strlen(from), tlen = strlen(to);
    char *next = malloc(len - flen + tlen + 1);
    assert_non_null(next);
    memcpy(next, text, (size_t)(at - text));
    memcpy(next + (at - text), to, tlen);
    memcpy(next + (at - text) + tlen, at + flen, len - (size_t)(at - text) - flen + 1);
    assert_int_equal(ig_tf_write(path, next, strlen(next)), 0);
    free(text);
    free(next);
    int rc = check(dir, out, sizeof(out));
    if (rc == 0 || strstr(out, want) == NULL)
        fprintf(stderr, "%s: '%s' -> '%s': rc %d, report:\n%s", file, from, to, rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, want));
    ig_tf_rmtree(dir);
}

/* One broken manifest a row: the file, the text replaced, its replacement
 * and what the report must say. */
static const struct {
    const char *file, *from, *to, *want;
} broken_cases[] = {
    {"gateway-deployment.yaml", "path: /ready", "path: /readyz", "readinessProbe: path"},
    {"gateway-deployment.yaml", "seconds: 5", "seconds: 40", "terminationGracePeriodSeconds"},
    {"worker-chat.yaml", "nvidia.com/gpu: 1\n            limits", "\n            limits",
     "requests None != limits"},
    {"worker-small.yaml", "nvidia.com/mig-1g.18gb: 1\n            limits:", "\n            limits:",
     "nvidia.com/mig-1g.18gb requests None"},
    {"worker-chat.yaml", "clusterIP: None", "clusterIP: 10.0.0.9", "headless Services"},
    {"gateway-configmap.yaml", "\"interval_s\": 5", "\"interval_s\": 0", "fails --check-config"},
    {"gateway-configmap.yaml", "_http._tcp.infergate-worker-chat", "_grpc._tcp.infergate-worker-chat",
     "has no TCP port named 'grpc'"},
    {"gateway-configmap.yaml", "infergate-worker-small.infergate", "workers-small.infergate",
     "no pool of the region config discovers"},
    {"keda-scaledobjects.yaml", "name: infergate-worker-small\n  minReplicaCount",
     "name: infergate-worker-smal\n  minReplicaCount", "is not a worker Deployment"},
    {"two-region/eu-west/region.json", "\"region\": \"us-east\"", "\"region\": \"us-west\"",
     "region eu-west has no site for"},
    {"kustomization.yaml", "  - worker-small.yaml\n", "", "worker-small.yaml is not listed"},
};

static void test_broken_manifests_fail(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(broken_cases) / sizeof(broken_cases[0]); i++)
        broken(broken_cases[i].file, broken_cases[i].from, broken_cases[i].to,
               broken_cases[i].want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifests_pass),
        cmocka_unit_test(test_broken_manifests_fail),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
