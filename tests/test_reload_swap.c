/*
 * Config reload of a running gateway with real workers: a load runs
 * across a reload (SIGHUP, then POST /admin/reload) that swaps the pool's
 * model for another one made with `infergate mkmodel --seed`, and not one
 * request fails; each client sees the old model's answer until the switch
 * and the new one's after it, never back. An invalid config is refused
 * with its message while the old one keeps serving, and every outcome is
 * counted in infergate_config_reloads_total.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"

#define CLIENTS 3
#define MAX_ANSWERS 4000

static char model_b[128]; /* the second model, beside ig_gwf_model_dir */

static int group_setup(void **state)
{
    if (ig_gwf_model_setup(state) != 0)
        return -1;
    snprintf(model_b, sizeof(model_b), "%s/tiny-b", ig_gwf_run_dir);
    /* Its own weights and tokenizer (both from the seed): random tied
     * weights tend to repeat the prompt's last token, and a different
     * tokenization of the prompt is what makes the answers differ. */
    return ig_gwf_model_make_seed(model_b, 77);
}

/* The config of one pool "cpu" (one instance) on model_dir, written over
 * path (a fresh temporary file when *path is empty). */
static void write_config(char *path, size_t cap, int port, const char *model_dir)
{
    const char *tmp = ig_gwf_pool_config("r1", port, model_dir, 1, 1, 1, 4, NULL, NULL);
    assert_non_null(tmp);
    if (path[0] == '\0') {
        snprintf(path, cap, "%s", tmp);
        return;
    }
    assert_int_equal(ig_tf_replace_from(path, tmp), 0);
}

/* The text of one completion (temperature 0: the same for one model). */
static int complete_text(int port, char *text, size_t cap)
{
    ig_tc_response_t r;
    if (ig_gwf_complete(port, 6, &r) != 0)
        return -1;
    int status = r.status;
    json_t *doc = status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    const char *t = json_string_value(
        json_object_get(json_array_get(json_object_get(doc, "choices"), 0), "text"));
    snprintf(text, cap, "%s", t ? t : "");
    if (status != 200)
        fprintf(stderr, "completion: %d %s\n", status, r.body ? r.body : "");
    json_decref(doc);
    ig_tc_response_free(&r);
    return t ? status : (status == 200 ? -1 : status);
}

typedef struct {
    int port;
    volatile int *stop;
    int n, failed;
    char *answers[MAX_ANSWERS];
} client_t;

static void *client_main(void *arg)
{
    client_t *c = arg;
    long long end = ig_tc_now_ms() + 180000; /* bounded whatever happens */
    while (!*c->stop && c->n < MAX_ANSWERS && ig_tc_now_ms() < end) {
        char text[512];
        int st = complete_text(c->port, text, sizeof(text));
        if (st != 200) {
            c->failed++;
            continue;
        }
        c->answers[c->n++] = strdup(text);
    }
    return NULL;
}

/* Runs CLIENTS clients while `swap` reloads; checks that no request failed
 * and that each client's answers go from `from` to `to` once. An empty
 * `to` is learned: the first other answer (one text for all clients). */
static void load_across(int port, const char *from, char *to, size_t tocap, void (*swap)(int port),
                        double applied_before)
{
    volatile int stop = 0;
    client_t cl[CLIENTS];
    pthread_t th[CLIENTS];
    memset(cl, 0, sizeof(cl));
    for (int i = 0; i < CLIENTS; i++) {
        cl[i].port = port;
        cl[i].stop = &stop;
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &cl[i]), 0);
    }
    usleep(1000 * 1000);
    swap(port);
    int applied = ig_gwf_wait_reloads(port, "applied", applied_before + 1, 120000);
    usleep(1000 * 1000); /* answers after the old instances stopped */
    stop = 1;
    int total = 0, failed = 0, seen_to = 0;
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < CLIENTS; i++) {
        total += cl[i].n;
        failed += cl[i].failed;
        int switched = 0;
        for (int k = 0; k < cl[i].n; k++) {
            const char *a = cl[i].answers[k];
            if (to[0] == '\0' && strcmp(a, from) != 0)
                snprintf(to, tocap, "%s", a);
            if (strcmp(a, to) == 0) {
                switched = 1;
                seen_to++;
            } else if (strcmp(a, from) != 0 || switched) {
                fail_msg("client %d answer %d: '%s' (old '%s', new '%s', switched %d)", i, k, a,
                         from, to, switched);
            }
        }
        assert_true(switched); /* its last answers came from the new model */
    }
    for (int i = 0; i < CLIENTS; i++)
        for (int k = 0; k < cl[i].n; k++)
            free(cl[i].answers[k]);
    fprintf(stderr, "reload under load: %d requests, %d failed, %d from the new model\n", total,
            failed, seen_to);
    assert_int_equal(applied, 0);
    assert_int_equal(failed, 0);
    assert_true(total > seen_to); /* some ran before the switch */
}

static ig_proc_t gw_proc;
static char config_path[1024];

static void sighup_gateway(int port)
{
    (void)port;
    assert_int_equal(kill(gw_proc.pid, SIGHUP), 0);
}

static void post_reload(int port)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "replacing pool cpu"));
    ig_tc_response_free(&r);
    /* A second one while the first is under way is refused, not queued. */
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.body, "reload_in_progress"));
    ig_tc_response_free(&r);
}

static void gateway_start(int port)
{
    config_path[0] = '\0';
    write_config(config_path, sizeof(config_path), port, ig_gwf_model_dir);
    assert_int_equal(ig_gwf_serve(&gw_proc, config_path, port, "info", 0, 20000, 60000), 0);
}

static void gateway_stop(void)
{
    assert_int_equal(ig_proc_stop(&gw_proc, SIGTERM, 30000), 0);
    ig_proc_dispose(&gw_proc);
    unlink(config_path);
}

static void test_model_swap_under_load(void **state)
{
    (void)state;
    int port = ig_proc_free_port();
    gateway_start(port);
    char text_a[512], text_b[512] = "";
    assert_int_equal(complete_text(port, text_a, sizeof(text_a)), 200);

    /* A -> B by SIGHUP: B's answer is learned as the one that follows. */
    write_config(config_path, sizeof(config_path), port, model_b);
    load_across(port, text_a, text_b, sizeof(text_b), sighup_gateway, 0);
    assert_string_not_equal(text_a, text_b);

    /* B -> A by POST /admin/reload: now both answers are known. */
    write_config(config_path, sizeof(config_path), port, ig_gwf_model_dir);
    load_across(port, text_b, text_a, sizeof(text_a), post_reload, 1);
    assert_true(ig_gwf_reloads(port, "busy") >= 1);
    assert_true(ig_gwf_reloads(port, "failed") == 0);

    /* The old instances are gone: one worker runs, in state ready. */
    json_t *st = ig_gwf_get_json(port, "/status");
    json_t *insts = json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances");
    assert_int_equal(json_array_size(insts), 1);
    json_decref(st);
    gateway_stop();
}

/* An invalid config is refused with its message, by POST and by SIGHUP,
 * and the running config keeps serving the same answers. */
static void test_invalid_config_refused(void **state)
{
    (void)state;
    int port = ig_proc_free_port();
    gateway_start(port);
    char before[512], after[512];
    assert_int_equal(complete_text(port, before, sizeof(before)), 200);
    /* The series exist before any reload, at 0 (increase() sees the first). */
    assert_true(ig_gwf_metric(port, "infergate_config_reloads_total{outcome=\"invalid\"} ") == 0);

    static const char broken[] = "{\"region\":\"r1\",\"listen\":\"127.0.0.1:1\",\"pools\":"
                                 "[{\"name\":\"cpu\",\"model\":\"nope\"}]}";
    assert_int_equal(ig_tf_write(config_path, broken, sizeof(broken) - 1), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "invalid_config"));
    assert_non_null(strstr(r.body, "pools[0].model: unknown model 'nope'"));
    ig_tc_response_free(&r);

    /* Valid, but its model directory holds no model: refused by the
     * gateway before anything starts, the running config restored. */
    write_config(config_path, sizeof(config_path), port, "/nonexistent/model");
    assert_int_equal(ig_gwf_post(port, "/admin/reload", "{}", &r, 10000), 0);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "has no config.json"));
    ig_tc_response_free(&r);

    static const char syntax[] = "{\"region\": ";
    assert_int_equal(ig_tf_write(config_path, syntax, sizeof(syntax) - 1), 0);
    assert_int_equal(kill(gw_proc.pid, SIGHUP), 0);
    assert_int_equal(ig_gwf_wait_reloads(port, "invalid", 3, 10000), 0);

    assert_int_equal(complete_text(port, after, sizeof(after)), 200);
    assert_string_equal(before, after);
    assert_true(ig_gwf_reloads(port, "applied") == 0);
    assert_int_equal(ig_proc_wait_status(port, "/ready", 200, 1000), 0);
    gateway_stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_config_refused),
        cmocka_unit_test(test_model_swap_under_load),
    };
    return cmocka_run_group_tests(tests, group_setup, ig_gwf_model_teardown);
}
