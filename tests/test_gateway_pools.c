/*
 * Instance pools with real worker processes on a generated tiny model:
 * traffic after readiness, restart after SIGKILL under load with every
 * request accounted for, no orphans when the gateway itself is killed, and
 * two regions that spill over to each other.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"

/* A region with one CPU pool of `instances` workers for model "tiny", and
 * optionally a site. */
static void region_start_with(ig_proc_t *g, int port, const char *region, int instances,
                              int max_num_seqs, const char *site_url, const char *extra)
{
    char sites[512] = "";
    if (site_url != NULL)
        snprintf(sites, sizeof(sites),
                 ",\"sites\":[{\"name\":\"peer\",\"url\":\"%s\",\"models\":[\"tiny\"]}]", site_url);
    char top[1024];
    snprintf(top, sizeof(top), "%s%s", sites, extra ? extra : "");
    const char *path = ig_gwf_pool_config(region, port, ig_gwf_model_dir, instances, instances,
                                          instances, max_num_seqs, NULL, top);
    assert_non_null(path);
    assert_int_equal(ig_gwf_serve(g, path, port, "warn", 0, 20000, 60000), 0);
}

static void region_start(ig_proc_t *g, int port, const char *region, int instances,
                         int max_num_seqs, const char *site_url)
{
    region_start_with(g, port, region, instances, max_num_seqs, site_url, NULL);
}

/* Worker pids of the first pool, from /status. */
static int worker_pids(int port, int *pids, int max)
{
    json_t *st = ig_gwf_get_json(port, "/status");
    int n = 0;
    json_t *insts = json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances");
    size_t i;
    json_t *in;
    json_array_foreach(insts, i, in)
    {
        int pid = (int)json_integer_value(json_object_get(in, "pid"));
        if (pid > 0 && n < max)
            pids[n++] = pid;
    }
    json_decref(st);
    return n;
}

static void test_pool_serves_after_ready(void **state)
{
    ig_proc_t g;
    region_start(&g, ig_proc_free_port(), "solo", 2, 8, NULL);
    int seen[2] = {0};
    for (int i = 0; i < 8; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_complete(g.port, 4, &r), 0);
        assert_int_equal(r.status, 200);
        assert_non_null(strstr(r.body, "\"text_completion\""));
        const char *u = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(u);
        assert_true(strcmp(u, "cpu/0") == 0 || strcmp(u, "cpu/1") == 0);
        seen[u[4] - '0']++;
        ig_tc_response_free(&r);
    }
    assert_true(seen[0] + seen[1] == 8);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 20000), 0);
}

typedef struct {
    int port;
    int n;
    int ok, failed, hung;
} load_t;

static int finished; /* requests of the load run that ended, all threads */

static void *load_thread(void *arg)
{
    load_t *l = arg;
    for (int i = 0; i < l->n; i++) {
        ig_tc_response_t r;
        int rc = ig_gwf_complete(l->port, 48, &r);
        if (rc != 0 || r.status == 0)
            l->hung++;
        else if (r.status == 200)
            l->ok++;
        else if (strstr(r.body, "\"error\"") != NULL)
            l->failed++; /* an explicit error in the OpenAI shape */
        else
            l->hung++;
        if (rc == 0)
            ig_tc_response_free(&r);
        __atomic_add_fetch(&finished, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* A worker killed with SIGKILL under load is restarted, and every request
 * of the run ends with its answer or an explicit error. */
static void test_worker_sigkill_under_load(void **state)
{
    ig_proc_t g;
    region_start(&g, ig_proc_free_port(), "solo", 2, 8, NULL);
    int pids[2];
    assert_int_equal(worker_pids(g.port, pids, 2), 2);

    enum { THREADS = 4, PER_THREAD = 15 };
    finished = 0;
    pthread_t th[THREADS];
    load_t loads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        loads[i] = (load_t){.port = g.port, .n = PER_THREAD};
        pthread_create(&th[i], NULL, load_thread, &loads[i]);
    }
    while (__atomic_load_n(&finished, __ATOMIC_SEQ_CST) < THREADS)
        usleep(1000);
    assert_int_equal(kill(pids[0], SIGKILL), 0);
    /* The kill lands with the run in progress. */
    assert_true(__atomic_load_n(&finished, __ATOMIC_SEQ_CST) < THREADS * PER_THREAD - THREADS);
    int ok = 0, failed = 0, hung = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        ok += loads[i].ok;
        failed += loads[i].failed;
        hung += loads[i].hung;
    }
    print_message("accepted %d = completed %d + failed %d; hung %d\n", THREADS * PER_THREAD, ok,
                  failed, hung);
    assert_int_equal(hung, 0);
    assert_int_equal(ok + failed, THREADS * PER_THREAD);
    assert_true(ok >= THREADS * PER_THREAD / 2);

    /* The killed worker comes back. */
    long long end = ig_tc_now_ms() + 30000;
    int restarted = 0;
    while (!restarted && ig_tc_now_ms() < end) {
        json_t *st = ig_gwf_get_json(g.port, "/status");
        json_t *in = json_array_get(
            json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances"), 0);
        restarted = json_integer_value(json_object_get(in, "restarts")) >= 1 &&
                    strcmp(json_string_value(json_object_get(in, "state")), "ready") == 0;
        json_decref(st);
        if (!restarted)
            usleep(100 * 1000);
    }
    assert_true(restarted);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 20000), 0);
}

/* Workers die with the gateway even when it is killed with SIGKILL. */
static void test_no_orphans_after_sigkill(void **state)
{
    ig_proc_t g;
    region_start(&g, ig_proc_free_port(), "solo", 2, 8, NULL);
    int pids[2];
    assert_int_equal(worker_pids(g.port, pids, 2), 2);
    assert_int_equal(ig_proc_stop(&g, SIGKILL, 5000), 128 + SIGKILL);
    long long end = ig_tc_now_ms() + 5000;
    int alive = 2;
    while (alive > 0 && ig_tc_now_ms() < end) {
        alive = 0;
        for (int i = 0; i < 2; i++) {
            /* Reparented to init (or a subreaper) and reaped there; a zombie
             * of ours would still answer kill(0), so look at /proc. */
            char path[64], st[256] = "";
            snprintf(path, sizeof(path), "/proc/%d/stat", pids[i]);
            FILE *f = fopen(path, "r");
            if (f != NULL) {
                if (fgets(st, sizeof(st), f) != NULL && strstr(st, ") Z ") == NULL)
                    alive++;
                fclose(f);
            }
        }
        if (alive)
            usleep(50 * 1000);
    }
    assert_int_equal(alive, 0);
}

typedef struct {
    int port;
    char upstream[64];
    int status;
} one_t;

static void *one_request(void *arg)
{
    one_t *o = arg;
    ig_tc_response_t r;
    if (ig_gwf_complete(o->port, 48, &r) == 0) {
        o->status = r.status;
        const char *u = ig_tc_header(&r, "x-infergate-upstream");
        snprintf(o->upstream, sizeof(o->upstream), "%s", u ? u : "");
        ig_tc_response_free(&r);
    }
    return NULL;
}

/* Starts faultproxy in front of 127.0.0.1:target with a delay each way, so
 * that a region on loopback is as far away as a real one. */
static int distance(ig_proc_t *p, int target, const char *delay_ms)
{
    int port = ig_proc_free_port();
    char to[64];
    snprintf(to, sizeof(to), "127.0.0.1:%d", target);
    const char *args[] = {"--target", to, "--delay-ms", delay_ms, "--quiet", NULL};
    assert_int_equal(ig_gwf_tool(p, "faultproxy", port, args, 10000), 0);
    return port;
}

/* Two regions naming each other, 20 ms apart: each serves its own traffic
 * locally, and one whose pool is saturated spills over to the other. */
static void test_two_regions_spill_over(void **state)
{
    int east_port = ig_proc_free_port(), west_port = ig_proc_free_port();
    ig_proc_t to_west, to_east;
    int via_west = distance(&to_west, west_port, "10");
    int via_east = distance(&to_east, east_port, "10");
    char east_url[64], west_url[64];
    snprintf(east_url, sizeof(east_url), "http://127.0.0.1:%d", via_east);
    snprintf(west_url, sizeof(west_url), "http://127.0.0.1:%d", via_west);
    ig_proc_t west, east;
    region_start(&west, west_port, "eu-west", 1, 8, east_url);
    region_start(&east, east_port, "us-east", 1, 1, west_url);
    /* Let each side probe the other once. */
    assert_int_equal(ig_proc_wait_status(via_west, "/ready", 200, 10000), 0);
    usleep(1500 * 1000);

    ig_tc_response_t r;
    assert_int_equal(ig_gwf_complete(east.port, 4, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "cpu/0");
    ig_tc_response_free(&r);

    enum { N = 8 };
    pthread_t th[N];
    one_t o[N];
    for (int i = 0; i < N; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        o[i].port = east.port;
        pthread_create(&th[i], NULL, one_request, &o[i]);
    }
    int local = 0, spilled = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(o[i].status, 200);
        if (strcmp(o[i].upstream, "peer") == 0)
            spilled++;
        else
            local++;
    }
    print_message("us-east: %d local, %d spilled to eu-west\n", local, spilled);
    assert_true(local >= 1);
    assert_true(spilled >= 1);
    assert_int_equal(ig_proc_stop(&east, SIGTERM, 20000), 0);
    assert_int_equal(ig_proc_stop(&west, SIGTERM, 20000), 0);
    ig_proc_stop(&to_west, SIGTERM, 5000);
    ig_proc_stop(&to_east, SIGTERM, 5000);
}

typedef struct {
    int port;
    int status;
    char retry_after[16];
} shot_t;

static void *long_request(void *arg)
{
    shot_t *o = arg;
    ig_tc_response_t r;
    if (ig_gwf_complete(o->port, 200, &r) == 0) {
        o->status = r.status;
        const char *ra = ig_tc_header(&r, "retry-after");
        snprintf(o->retry_after, sizeof(o->retry_after), "%s", ra ? ra : "");
        ig_tc_response_free(&r);
    }
    return NULL;
}

/* Every upstream saturated and the model's queue full: 429 with
 * Retry-After at once; the ones that were admitted still complete. */
static void test_saturated_queue_full_gets_429(void **state)
{
    ig_proc_t g;
    region_start_with(&g, ig_proc_free_port(), "solo", 1, 1, NULL,
                      ",\"routing\":{\"queue_size\":1}");
    enum { N = 8 };
    pthread_t th[N];
    shot_t o[N];
    for (int i = 0; i < N; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        o[i].port = g.port;
        pthread_create(&th[i], NULL, long_request, &o[i]);
    }
    int ok = 0, refused = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (o[i].status == 200)
            ok++;
        if (o[i].status == 429) {
            refused++;
            assert_true(o[i].retry_after[0] != '\0');
        }
        assert_true(o[i].status == 200 || o[i].status == 429);
    }
    print_message("%d completed, %d refused with 429\n", ok, refused);
    /* Two in flight (2 x 1 slot) and one held fit; the rest are refused. */
    assert_true(ok >= 3);
    assert_true(refused >= 1);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 20000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_serves_after_ready),
        cmocka_unit_test(test_worker_sigkill_under_load),
        cmocka_unit_test(test_no_orphans_after_sigkill),
        cmocka_unit_test(test_two_regions_spill_over),
        cmocka_unit_test(test_saturated_queue_full_gets_429),
    };
    return cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
}
