/*
 * `infergate serve` start-up: flags, --help, and config errors, which must
 * exit 2 with the config's message before anything listens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gwfixture.h"

/* Runs the binary to its exit; returns the exit status. Its output stays
 * in p until ig_proc_dispose. */
static int run(ig_proc_t *p, const char *const *args)
{
    assert_int_equal(ig_proc_start_bin(p, "infergate", args, IG_PROC_PIPES), 0);
    int rc = ig_proc_wait_exit(p, 10000);
    ig_proc_stop(p, SIGKILL, 10000);
    return rc;
}

/* Binds (without listening) a loopback port, so that a server that tried
 * to listen there would fail with "cannot listen". */
static int hold_port(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_config_error_exits_2_before_listening(void **state)
{
    int port = 0, fd = hold_port(&port);
    assert_true(fd >= 0);
    char text[512];
    snprintf(text, sizeof(text),
             "{\"listen\": \"127.0.0.1:%d\",\n"
             " \"models\": [{\"name\": \"tiny\", \"path\": \"/m\"}],\n"
             " \"pools\": [{\"name\": \"p\", \"model\": \"tiny\", \"min_instances\": 1,"
             " \"max_instances\": 0}]}\n",
             port);
    const char *path = ig_proc_temp_file(text, ".json");
    assert_non_null(path);
    const char *args[] = {"serve", "--config", path, NULL};
    ig_proc_t p;
    assert_int_equal(run(&p, args), 2);
    char want[512];
    snprintf(want, sizeof(want), "%s: pools[0].max_instances: must be >= min_instances (1)\n",
             path);
    assert_string_equal(p.err, want);
    assert_null(strstr(p.err, "listen"));
    ig_proc_dispose(&p);
    unlink(path);

    /* A syntax error names line and column. */
    path = ig_proc_temp_file("{\n  \"region\": \"x\",\n}\n", ".json");
    const char *args2[] = {"serve", "--config", path, "--listen", "127.0.0.1:0", NULL};
    assert_int_equal(run(&p, args2), 2);
    snprintf(want, sizeof(want), "%s:3:1: ", path);
    assert_true(strncmp(p.err, want, strlen(want)) == 0);
    ig_proc_dispose(&p);
    unlink(path);

    /* A missing file is a config error too. */
    const char *args3[] = {"serve", "--config", "/nonexistent/x.json", NULL};
    assert_int_equal(run(&p, args3), 2);
    assert_string_equal(p.err, "/nonexistent/x.json: cannot open: No such file or directory\n");
    ig_proc_dispose(&p);
    close(fd);
}

static void test_bad_flags_exit_2(void **state)
{
    static const char *const cases[][4] = {
        {"serve", "--listen", "localhost:80", NULL},
        {"serve", "--listen", NULL, NULL},
        {"serve", "--log-level", "loud", NULL},
        {"serve", "--log-format=xml", NULL, NULL},
        {"serve", "--bogus", NULL, NULL},
        {"serve", "extra", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_proc_t p;
        assert_int_equal(run(&p, cases[i]), 2);
        assert_true(strncmp(p.err, "infergate serve: ", 17) == 0);
        assert_null(strstr(p.err, "listening"));
        ig_proc_dispose(&p);
    }
}

static void test_help(void **state)
{
    const char *args[] = {"serve", "--help", NULL};
    ig_proc_t p;
    assert_int_equal(run(&p, args), 0);
    static const char *const flags[] = {"--config FILE", "--listen", "--log-level",
                                        "--log-format",  "--help",   "drain_timeout_ms"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
        assert_non_null(strstr(p.out, flags[i]));
    assert_string_equal(p.err, "");
    ig_proc_dispose(&p);
}

static void test_port_in_use_exits_1(void **state)
{
    int port = 0, fd = hold_port(&port);
    assert_true(fd >= 0);
    assert_int_equal(listen(fd, 1), 0);
    char listen_arg[64];
    snprintf(listen_arg, sizeof(listen_arg), "127.0.0.1:%d", port);
    const char *args[] = {"serve", "--listen", listen_arg, NULL};
    ig_proc_t p;
    assert_int_equal(run(&p, args), 1);
    assert_non_null(strstr(p.err, "cannot listen on"));
    ig_proc_dispose(&p);
    close(fd);
}

static void test_json_log_and_overrides(void **state)
{
    /* --listen overrides the config's port; --log-format json makes JSON lines. */
    const char *path =
        ig_proc_temp_file("{\"listen\": \"127.0.0.1:1\", \"log\": {\"level\": \"error\"},"
                          " \"region\": \"jr\", \"limits\": {\"drain_grace_ms\": 0}}",
                          ".json");
    const char *args[] = {"serve",       "--config", path,           "--listen", "127.0.0.1:0",
                          "--log-level", "info",     "--log-format", "json",     NULL};
    ig_proc_t p;
    assert_int_equal(ig_proc_start_bin(&p, "infergate", args, IG_PROC_PIPES), 0);
    assert_int_equal(ig_proc_wait_announce(&p, 1, 10000), 0);
    assert_true(p.port != 1);
    assert_true(strncmp(p.err, "{", 1) == 0);
    assert_non_null(strstr(p.err, "\"level\":\"info\""));
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 0);
    ig_proc_dispose(&p);
    unlink(path);
}

int main(void)
{
    setenv("INFERGATE_CACHE_DIR", "/tmp/infergate-test-cache", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_error_exits_2_before_listening),
        cmocka_unit_test(test_bad_flags_exit_2),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_port_in_use_exits_1),
        cmocka_unit_test(test_json_log_and_overrides),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
