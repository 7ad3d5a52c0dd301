/*
 * The pool's scale operations against real workers (tiny model), driven
 * directly on a libuv loop: the races of a scale event. A drain chosen while
 * the instance is still starting; a draining instance taken back by a
 * scale-up (same process, no cold start); a draining instance that crashes
 * frees its device (no restart); a device is free for a new instance only
 * once the old process has been reaped.
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
#include <unistd.h>
#include <uv.h>

#include "infergate/error.h"
#include "infergate/pool.h"
#include "infergate/router.h"
#include "gwfixture.h"

typedef struct {
    int events;
    int freed; /* events for a stopped slot without a device */
} seen_t;

static void on_event(ig_pool_t *pool, ig_instance_t *in, void *data)
{
    seen_t *s = data;
    s->events++;
    if (ig_instance_state(in) == IG_INSTANCE_STOPPED && !ig_instance_holds_device(in))
        s->freed++;
}

static uv_loop_t loop;
static ig_router_t router;

/* Runs the loop until pred(pool, arg) holds or timeout_ms passes. */
static int run_until(ig_pool_t *pool, int (*pred)(ig_pool_t *, int), int arg, int timeout_ms)
{
    long long end = ig_tc_now_ms() + timeout_ms;
    while (!pred(pool, arg)) {
        if (ig_tc_now_ms() > end)
            return -1;
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
    return 0;
}

static int state_is(ig_pool_t *pool, int want)
{
    /* arg packs (instance << 8) | state */
    return ig_instance_state(ig_pool_instance(pool, want >> 8)) ==
           (ig_instance_state_t)(want & 255);
}
#define ST(i, s) (((i) << 8) | (s))

static ig_pool_t *start_pool(int ndevices, int min, seen_t *seen)
{
    const char *devices[4] = {"cpu", "cpu", "cpu", "cpu"};
    ig_pool_spec_t s;
    memset(&s, 0, sizeof(s));
    s.name = "p";
    s.model = "tiny";
    s.model_dir = ig_gwf_model_dir;
    s.exe = ig_proc_bin("infergate");
    s.run_dir = ig_gwf_run_dir;
    s.devices = devices;
    s.ndevices = ndevices;
    s.threads = 1;
    s.min_instances = min;
    s.max_instances = ndevices;
    s.load_poll_ms = 100;
    s.router = &router;
    ig_pool_t *pool = NULL;
    assert_int_equal(ig_pool_start(&pool, &loop, &s, on_event, seen), 0);
    return pool;
}

static int closed;
static void on_closed(void *data)
{
    closed = 1;
}

static void close_pool(ig_pool_t *pool)
{
    closed = 0;
    ig_pool_close(pool, 5000, on_closed, NULL);
    long long end = ig_tc_now_ms() + 10000;
    while (!closed && ig_tc_now_ms() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
    assert_true(closed);
}

static void test_drain_while_starting(void **state)
{
    seen_t seen = {0, 0};
    ig_pool_t *pool = start_pool(1, 1, &seen);
    assert_int_equal(ig_instance_state(ig_pool_instance(pool, 0)), IG_INSTANCE_STARTING);
    assert_int_equal(ig_pool_free_devices(pool), 0);
    /* Chosen for a drain before /ready: stopped, never served. */
    assert_int_equal(ig_pool_drain(pool, 0), 0);
    assert_int_equal(ig_instance_state(ig_pool_instance(pool, 0)), IG_INSTANCE_DRAINING);
    /* Not undrainable: it never was ready. The device is still held. */
    assert_int_equal(ig_pool_available(pool), 0);
    assert_int_equal(ig_pool_scale_up(pool), IG_EBUSY);
    assert_int_equal(run_until(pool, state_is, ST(0, IG_INSTANCE_STOPPED), 20000), 0);
    assert_int_equal(ig_pool_in_use(pool), 0);
    assert_int_equal(ig_pool_free_devices(pool), 1);
    assert_true(seen.freed >= 1);
    assert_int_equal(ig_instance_restarts(ig_pool_instance(pool, 0)), 0);
    /* The slot takes a new instance, which comes up ready. */
    assert_int_equal(ig_pool_scale_up(pool), 0);
    assert_int_equal(run_until(pool, state_is, ST(0, IG_INSTANCE_READY), 30000), 0);
    close_pool(pool);
}

static void test_undrain_and_crash_while_draining(void **state)
{
    seen_t seen = {0, 0};
    ig_pool_t *pool = start_pool(2, 1, &seen);
    assert_int_equal(run_until(pool, state_is, ST(0, IG_INSTANCE_READY), 30000), 0);
    ig_instance_t *in = ig_pool_instance(pool, 0);
    int pid = ig_instance_pid(in);
    assert_true(pid > 0);
    /* A request still in flight keeps the drain from sending SIGTERM. */
    ig_instance_route(in)->inflight = 1;
    assert_int_equal(ig_pool_drain(pool, 0), 0);
    assert_int_equal(ig_instance_state(in), IG_INSTANCE_DRAINING);
    assert_int_equal(ig_router_eligible(ig_instance_route(in), uv_hrtime()), 0);
    for (int i = 0; i < 50; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
    assert_int_equal(ig_instance_state(in), IG_INSTANCE_DRAINING);
    /* Demand is back: scale-up takes it back (same process) rather than
     * starting the free device. */
    assert_int_equal(ig_pool_available(pool), 2);
    assert_int_equal(ig_pool_scale_up(pool), 0);
    assert_int_equal(ig_instance_state(in), IG_INSTANCE_READY);
    assert_int_equal(ig_instance_pid(in), pid);
    assert_int_equal(ig_instance_state(ig_pool_instance(pool, 1)), IG_INSTANCE_STOPPED);

    /* Drained again, and it crashes mid-drain: its device is freed, it is
     * not restarted. */
    assert_int_equal(ig_pool_drain(pool, 0), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(run_until(pool, state_is, ST(0, IG_INSTANCE_STOPPED), 10000), 0);
    ig_instance_route(in)->inflight = 0;
    assert_int_equal(ig_pool_in_use(pool), 0);
    assert_int_equal(ig_instance_restarts(in), 0);
    for (int i = 0; i < 100; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
    assert_int_equal(ig_instance_state(in), IG_INSTANCE_STOPPED);
    close_pool(pool);
}

int main(void)
{
    /* The libuv clients in this process write to peers that may have
     * closed: that must cost an EPIPE, not the test (as serve.c does). */
    signal(SIGPIPE, SIG_IGN);
    uv_loop_init(&loop);
    ig_router_opts_t ro;
    ig_router_opts_default(&ro);
    ig_router_init(&router, &ro);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drain_while_starting),
        cmocka_unit_test(test_undrain_and_crash_while_draining),
    };
    int rc = cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
    uv_run(&loop, UV_RUN_NOWAIT);
    return rc;
}
