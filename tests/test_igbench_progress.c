/*
 * igbench's progress line: on a terminal (a pty from python3's pty module)
 * it is redrawn every second with sent, ok, errors, p50 and p99; with
 * stdout a pipe, or with --quiet on a terminal, there is none, and the
 * report is the same.
 */
#include "benchtools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static ig_proc_t up;

static int group_setup(void **state)
{
    (void)state;
    return tu_start(&up, "testupstream", "--quiet");
}

static int group_teardown(void **state)
{
    (void)state;
    tu_stop(&up);
    return 0;
}

/* igbench's stdout for a 2.5 s run; on a pty when tty. Malloc'ed. */
static char *run(int tty, const char *extra)
{
    char target[64], duration[] = "2.5";
    snprintf(target, sizeof(target), "127.0.0.1:%d", up.port);
    char *argv[24];
    int n = 0;
    if (tty) {
        argv[n++] = "/usr/bin/env";
        argv[n++] = "python3";
        argv[n++] = "-c";
        argv[n++] = "import pty, sys; sys.exit(pty.spawn(sys.argv[1:]) >> 8)";
    }
    argv[n++] = (char *)ig_proc_bin("igbench");
    argv[n++] = "--target";
    argv[n++] = target;
    argv[n++] = "--rate";
    argv[n++] = "40";
    argv[n++] = "--duration";
    argv[n++] = duration;
    argv[n++] = "--model";
    argv[n++] = "m";
    if (extra != NULL)
        argv[n++] = (char *)extra;
    argv[n] = NULL;
    ig_proc_t p;
    assert_int_equal(ig_proc_start(&p, argv, IG_PROC_PIPE_OUT), 0);
    assert_int_equal(ig_proc_wait_exit(&p, 30000), 0);
    while (ig_proc_pump(&p, 100) > 0) {
    }
    char *out = strdup(p.out ? p.out : "");
    ig_proc_dispose(&p);
    return out;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static void test_progress_on_a_terminal(void **state)
{
    (void)state;
    char *out = run(1, NULL);
    /* Two draws at 1 s and 2 s, each "\r... sent N  ok N  errors N  p50 ..  p99 ..". */
    if (count(out, "  sent ") < 2 || count(out, "\033[K") < 2 || strstr(out, "  p99 ") == NULL)
        fail_msg("no progress line on the pty:\n%s", out);
    assert_non_null(strstr(out, "errors 0"));
    assert_non_null(strstr(out, "\r"));
    /* The line is cleared before the report. */
    assert_non_null(strstr(out, "\r\033[Kigbench: open loop"));
    assert_non_null(strstr(out, "requests: "));
    free(out);
}

static void test_no_progress_on_a_pipe(void **state)
{
    (void)state;
    char *out = run(0, NULL);
    assert_null(strstr(out, "  sent "));
    assert_null(strstr(out, "\033[K"));
    assert_non_null(strstr(out, "requests: ")); /* the report still is */
    free(out);
}

static void test_quiet_on_a_terminal(void **state)
{
    (void)state;
    char *out = run(1, "--quiet");
    assert_null(strstr(out, "  sent "));
    assert_null(strstr(out, "requests: "));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_on_a_terminal),
        cmocka_unit_test(test_no_progress_on_a_pipe),
        cmocka_unit_test(test_quiet_on_a_terminal),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
