/*
 * faultproxy's faults switched at run time: through the control socket
 * (delay, refuse, drop, reset-after, status) and with SIGUSR1/SIGUSR2.
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>

typedef struct {
    ig_proc_t up, fp;
    char sock[128];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    snprintf(f->sock, sizeof(f->sock), "/tmp/faultproxy-test-%d.sock", (int)getpid());
    if (tu_start(&f->up, "testupstream", "--quiet") != 0)
        return -1;
    if (tu_start(&f->fp, "faultproxy", "--quiet --target 127.0.0.1:%d --control unix:%s",
                 f->up.port, f->sock) != 0)
        return -1;
    char line[256];
    if (ig_proc_read_line(&f->fp, line, sizeof(line), 5000) != 0 || !strstr(line, "control on"))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    tu_stop(&f->fp);
    tu_stop(&f->up);
    unlink(f->sock);
    free(f);
    return 0;
}

static void ctl_ok(fixture_t *f, const char *cmd)
{
    char out[1024];
    assert_int_equal(tu_control(f->sock, cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "ok\n");
}

static json_t *status(fixture_t *f)
{
    char out[2048];
    json_error_t err;
    assert_int_equal(tu_control(f->sock, "status", out, sizeof(out)), 0);
    json_t *s = json_loads(out, 0, &err);
    assert_non_null(s);
    return s;
}

static double p50_rtt(fixture_t *f)
{
    double v[3];
    for (int i = 0; i < 3; i++) {
        json_t *r = tu_igbench("--target 127.0.0.1:%d --concurrency 1 --requests 20 --raw GET "
                               "/health",
                               f->fp.port);
        assert_non_null(r);
        assert_int_equal((int)TU_NUM(r, "requests", "errors"), 0);
        v[i] = TU_NUM(r, "latency_ms", "e2e", "p50");
        json_decref(r);
    }
    return tu_median(v, 3);
}

/* Errors of each kind seen by a short igbench run through the proxy. */
static json_t *run(fixture_t *f, const char *extra)
{
    json_t *r =
        tu_igbench("--target 127.0.0.1:%d --concurrency 1 --requests 5 %s", f->fp.port, extra);
    assert_non_null(r);
    return r;
}

static void test_delay_switch(void **state)
{
    fixture_t *f = *state;
    double base = p50_rtt(f);
    ctl_ok(f, "delay s2c 25");
    json_t *s = status(f);
    assert_true(TU_NUM(s, "delay_ms", "s2c") == 25.0);
    assert_true(TU_NUM(s, "delay_ms", "c2s") == 0.0);
    json_decref(s);
    double slow = p50_rtt(f);
    print_message("delay s2c 25: %.3f -> %.3f ms (added %.3f)\n", base, slow, slow - base);
    assert_true(fabs(slow - base - 25.0) <= 2.0);
    ctl_ok(f, "delay 0");
    double back = p50_rtt(f);
    assert_true(fabs(back - base) <= 2.0);
    /* A malformed command changes nothing and says so. */
    char out[256];
    assert_int_equal(tu_control(f->sock, "delay sideways 3", out, sizeof(out)), 0);
    assert_true(strncmp(out, "error", 5) == 0);
}

static void test_refuse_and_drop(void **state)
{
    fixture_t *f = *state;
    /* Each switch, then a run whose 5 requests all end as it says. */
    static const struct {
        const char *ctl, *args, *section, *key;
    } steps[] = {
        {"refuse on", "", "errors", "connect"},
        {"refuse unlisten", "", "errors", "connect"},
        {"refuse off", "", "requests", "ok"},
        {"drop on", "--timeout 0.2", "errors", "timeout"},
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        ctl_ok(f, steps[i].ctl);
        json_t *r = run(f, steps[i].args);
        assert_int_equal((int)TU_NUM(r, steps[i].section, steps[i].key), 5);
        json_decref(r);
    }
    ctl_ok(f, "drop off");
    json_t *s = status(f);
    assert_true(TU_NUM(s, "connections", "refused") >= 5);
    assert_true(TU_NUM(s, "connections", "dropped") >= 5);
    json_decref(s);
}

static void test_signals(void **state)
{
    fixture_t *f = *state;
    kill(f->fp.pid, SIGUSR1); /* refuse on */
    json_t *s = NULL;
    for (int i = 0; i < 100; i++) {
        json_decref(s);
        s = status(f);
        if (strcmp(json_string_value(json_object_get(s, "refuse")), "close") == 0)
            break;
        usleep(10000);
    }
    assert_string_equal(json_string_value(json_object_get(s, "refuse")), "close");
    json_decref(s);
    json_t *r = run(f, "");
    assert_int_equal((int)TU_NUM(r, "errors", "connect"), 5);
    json_decref(r);
    kill(f->fp.pid, SIGUSR1); /* refuse off */
    for (int i = 0; i < 100; i++) {
        s = status(f);
        int off = strcmp(json_string_value(json_object_get(s, "refuse")), "off") == 0;
        json_decref(s);
        if (off)
            break;
        usleep(10000);
    }
    r = run(f, "");
    assert_int_equal((int)TU_NUM(r, "requests", "ok"), 5);
    json_decref(r);
}

/* reset-after cuts a streamed answer; igbench counts a broken stream. */
static void test_reset_after(void **state)
{
    fixture_t *f = *state;
    ctl_ok(f, "reset-after 1000");
    json_t *r = run(f, "--stream --max-tokens 100");
    assert_int_equal((int)TU_NUM(r, "errors", "broken_stream"), 5);
    assert_int_equal((int)TU_NUM(r, "requests", "ok"), 0);
    json_decref(r);
    json_t *s = status(f);
    assert_true(TU_NUM(s, "connections", "reset") >= 5);
    json_decref(s);
    ctl_ok(f, "reset-after 0");
    r = run(f, "--stream --max-tokens 100");
    assert_int_equal((int)TU_NUM(r, "requests", "ok"), 5);
    assert_int_equal((int)TU_NUM(r, "output_tokens"), 500);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_delay_switch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuse_and_drop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_signals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reset_after, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
