/*
 * pools[].discover against a DNS server the test controls: dnsmasq (from
 * Debian) on a loopback port answers workers.test from a hosts file, and
 * real `infergate worker` processes listen on 127.0.0.2, .3 and .4 at one
 * port, as a headless Service's pods would. The gateway asks dnsmasq
 * directly (discover.resolver) every 200 ms. Under a load that never
 * stops, the pool follows the set: two workers, then three (the new one
 * serves once ready), then the first is removed (it drains, then its
 * process is stopped), then dnsmasq itself goes away (a failed resolution
 * keeps the last set). Not one request fails. Routing is round robin so
 * that every ready instance is seen serving within a phase. Without a
 * port, the name's SRV records give each instance's port (two workers on
 * two ports); without a resolver, the system's configuration answers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"
#include "peers.h"

#define NWORKERS 3

/* The last address has no worker: it is listed, probed, and never served. */
static const char *const ips[NWORKERS + 1] = {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"};
static char hosts_path[160];

static void write_hosts(const int *listed)
{
    char text[256] = "";
    size_t n = 0;
    for (int i = 0; i <= NWORKERS; i++) {
        if (listed[i])
            n += (size_t)snprintf(text + n, sizeof(text) - n, "%s workers.test\n", ips[i]);
    }
    assert_int_equal(ig_tf_replace(hosts_path, text, n), 0);
}

/* 1 when ip:port accepts a TCP connection. */
static int accepts(const char *ip, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* The pool's instances by address, from /status: how many are ready, and
 * the state and name of the one at ip (state "" when none holds it). */
static int pool_view(int port, const char *ip, char *state, size_t scap, char *name, size_t ncap)
{
    json_t *st = ig_gwf_get_json(port, "/status");
    if (st == NULL)
        return -1;
    json_t *insts = json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances");
    int ready = 0;
    size_t i;
    json_t *in;
    if (state != NULL)
        state[0] = '\0';
    json_array_foreach(insts, i, in)
    {
        const char *s = json_string_value(json_object_get(in, "state"));
        const char *dev = json_string_value(json_object_get(in, "device"));
        ready += s != NULL && strcmp(s, "ready") == 0;
        if (ip != NULL && dev != NULL && strcmp(dev, ip) == 0 && s && strcmp(s, "stopped") != 0) {
            snprintf(state, scap, "%s", s);
            snprintf(name, ncap, "%s", json_string_value(json_object_get(in, "name")));
        }
    }
    json_decref(st);
    return ready;
}

/* Waits until `ready` instances are ready and the one at ip (if given)
 * is in state want ("" = none holds it). */
static int wait_view(int port, int ready, const char *ip, const char *want, char *name, size_t ncap)
{
    long long end = ig_tc_now_ms() + 30000;
    char st[32], nm[96] = "";
    while (ig_tc_now_ms() < end) {
        int r = pool_view(port, ip, st, sizeof(st), nm, sizeof(nm));
        if (r == ready && (ip == NULL || strcmp(st, want) == 0)) {
            if (name != NULL)
                snprintf(name, ncap, "%s", nm);
            return 0;
        }
        usleep(50 * 1000);
    }
    fprintf(stderr, "pool view: %d ready (want %d), %s is '%s' (want '%s')\n",
            pool_view(port, ip, st, sizeof(st), nm, sizeof(nm)), ready, ip ? ip : "-", st, want);
    return -1;
}

static void need_dnsmasq(void)
{
    if (access(IG_DNSMASQ, X_OK) != 0) {
        fprintf(stderr, "dnsmasq not installed (scripts/deps.sh test)\n");
        exit(77);
    }
}

/* Stops the gateway (which must exit cleanly), the n workers and the DNS
 * server, and disposes of them. */
static void stop_all(ig_proc_t *gw, ig_proc_t *w, int n, ig_proc_t *dns)
{
    assert_int_equal(ig_proc_stop(gw, SIGTERM, 30000), 0);
    ig_proc_dispose(gw);
    for (int i = 0; i < n; i++) {
        ig_proc_stop(&w[i], SIGTERM, 10000);
        ig_proc_dispose(&w[i]);
    }
    ig_proc_stop(dns, SIGTERM, 10000);
    ig_proc_dispose(dns);
}

/* ---- the load --------------------------------------------------------------- */

#define MAX_NAMES 8
typedef struct {
    int port;
    volatile int stop;
    volatile int phase; /* the load's answers are counted per phase */
    int total, failed;
    char names[8][MAX_NAMES][32]; /* upstream names seen, per phase */
    int nnames[8];
    pthread_mutex_t mu;
} load_t;

static void *load_main(void *arg)
{
    load_t *l = arg;
    long long end = ig_tc_now_ms() + 120000;
    while (!l->stop && ig_tc_now_ms() < end) {
        ig_tc_response_t r;
        int ph = l->phase;
        int rc = ig_gwf_complete(l->port, 2, &r);
        pthread_mutex_lock(&l->mu);
        l->total++;
        if (rc != 0 || r.status != 200) {
            l->failed++;
            fprintf(stderr, "request failed in phase %d at %lld ms: %d %s\n", ph, ig_tc_now_ms(),
                    rc == 0 ? r.status : -1, rc == 0 && r.body ? r.body : "");
        } else if (ph == l->phase) { /* answered within one phase */
            const char *up = ig_tc_header(&r, "x-infergate-upstream");
            int seen = 0;
            for (int k = 0; up && k < l->nnames[ph] && !seen; k++)
                seen = strcmp(l->names[ph][k], up) == 0;
            if (up && !seen && l->nnames[ph] < MAX_NAMES)
                snprintf(l->names[ph][l->nnames[ph]++], 32, "%s", up);
        }
        pthread_mutex_unlock(&l->mu);
        if (rc == 0)
            ig_tc_response_free(&r);
    }
    return NULL;
}

/* The load's answers count in phase ph from now (its start time on stderr,
 * beside any failed request's, to read against the gateway's log). */
static void set_phase(load_t *l, int ph)
{
    fprintf(stderr, "phase %d from %lld ms\n", ph, ig_tc_now_ms());
    l->phase = ph;
}

static int seen_in(load_t *l, int phase, const char *name)
{
    pthread_mutex_lock(&l->mu);
    int seen = 0;
    for (int k = 0; k < l->nnames[phase] && !seen; k++)
        seen = strcmp(l->names[phase][k], name) == 0;
    pthread_mutex_unlock(&l->mu);
    return seen;
}

static int nseen(load_t *l, int phase)
{
    pthread_mutex_lock(&l->mu);
    int n = l->nnames[phase];
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* A gateway config of one pool "remote" discovering dns at port wport,
 * asking the resolver on dport every 200 ms. */
static void discover_config(char *buf, size_t cap, int gport, const char *dns, int wport, int dport)
{
    snprintf(buf, cap,
             "{\"region\":\"r1\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
             "\"models\":[{\"name\":\"tiny\"}],"
             "\"pools\":[{\"name\":\"remote\",\"model\":\"tiny\","
             "\"discover\":{\"dns\":\"%s\",\"port\":%d,\"interval_s\":0.2,"
             "\"resolver\":\"127.0.0.1:%d\"}}]}",
             gport, dns, wport, dport);
}

/* Starts a worker of model "tiny" (one thread) on ip:port. */
static void start_worker(ig_proc_t *w, const char *ip, int port)
{
    char listen[64];
    snprintf(listen, sizeof(listen), "%s:%d", ip, port);
    const char *args[] = {"worker", "--model", ig_gwf_model_dir, "--device",  "cpu", "--listen",
                          listen,   "--name",  "tiny",           "--threads", "1",   NULL};
    assert_int_equal(ig_proc_start_bin(w, "infergate", args, IG_PROC_QUIET), 0);
}

static void test_pool_follows_dns(void **state)
{
    (void)state;
    need_dnsmasq();
    int wport = ig_proc_free_port(), dport = ig_proc_free_port(), gport = ig_proc_free_port();
    snprintf(hosts_path, sizeof(hosts_path), "%s/hosts", ig_gwf_run_dir);

    /* The workers, each on its own loopback address, one port. */
    ig_proc_t workers[NWORKERS];
    for (int i = 0; i < NWORKERS; i++) {
        start_worker(&workers[i], ips[i], wport);
    }
    for (int i = 0; i < NWORKERS; i++) {
        long long end = ig_tc_now_ms() + 30000;
        while (!accepts(ips[i], wport) && ig_tc_now_ms() < end)
            usleep(50 * 1000);
        assert_true(accepts(ips[i], wport));
    }

    int listed[NWORKERS + 1] = {1, 1, 0, 0};
    write_hosts(listed);
    ig_proc_t dns;
    assert_int_equal(ig_dnsmasq_start(&dns, dport, hosts_path), 0);

    ig_proc_t gw;
    assert_int_equal(
        ig_gwf_serve_config(
            &gw, gport, "info", 0, 20000, 30000,
            "{\"region\":\"r1\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
            "\"routing\":{\"policy\":\"round_robin\"},\"models\":[{\"name\":\"tiny\"}],"
            "\"pools\":[{\"name\":\"remote\",\"model\":\"tiny\",\"max_instances\":8,"
            "\"discover\":{\"dns\":\"workers.test\",\"port\":%d,\"interval_s\":0.2,"
            "\"resolver\":\"127.0.0.1:%d\"}}]}",
            gport, wport, dport),
        0);

    char name2[96], name3[96], name4[96];
    assert_int_equal(wait_view(gport, 2, ips[0], "ready", name2, sizeof(name2)), 0);
    assert_int_equal(wait_view(gport, 2, ips[1], "ready", name3, sizeof(name3)), 0);

    load_t l;
    memset(&l, 0, sizeof(l));
    pthread_mutex_init(&l.mu, NULL);
    l.port = gport;
    l.phase = 1;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, load_main, &l), 0);

    /* Phase 1: two workers, both serve. */
    usleep(1500 * 1000);
    assert_true(seen_in(&l, 1, name2));
    assert_true(seen_in(&l, 1, name3));
    assert_int_equal(nseen(&l, 1), 2);

    /* Phase 2: a third appears; it serves once probed ready. A fourth
     * address answers nothing: it stays "starting" and gets no request. */
    listed[2] = listed[3] = 1;
    write_hosts(listed);
    assert_int_equal(kill(dns.pid, SIGHUP), 0); /* dnsmasq reads its hosts files again */
    assert_int_equal(wait_view(gport, 3, ips[2], "ready", name4, sizeof(name4)), 0);
    char name5[96];
    assert_int_equal(wait_view(gport, 3, ips[3], "starting", name5, sizeof(name5)), 0);
    set_phase(&l, 2);
    usleep(1500 * 1000);
    assert_true(seen_in(&l, 2, name2) && seen_in(&l, 2, name3) && seen_in(&l, 2, name4));
    assert_false(seen_in(&l, 2, name5));

    /* Phase 3: the first goes from DNS: it drains and leaves the pool; then
     * its process stops, and nothing notices. */
    listed[0] = listed[3] = 0;
    write_hosts(listed);
    assert_int_equal(kill(dns.pid, SIGHUP), 0);
    assert_int_equal(wait_view(gport, 2, ips[0], "", NULL, 0), 0);
    assert_int_equal(wait_view(gport, 2, ips[3], "", NULL, 0), 0);
    set_phase(&l, 3);
    assert_int_equal(ig_proc_stop(&workers[0], SIGTERM, 10000), 0);
    usleep(1500 * 1000);
    assert_false(seen_in(&l, 3, name2));
    assert_true(seen_in(&l, 3, name3) && seen_in(&l, 3, name4));

    /* Phase 4: the DNS server goes away: resolutions fail, the set stays. */
    assert_int_equal(ig_proc_stop(&dns, SIGTERM, 10000), 0);
    set_phase(&l, 4);
    usleep(3000 * 1000); /* past a 2 s query timeout, several tries */
    assert_int_equal(pool_view(gport, NULL, NULL, 0, NULL, 0), 2);
    assert_true(seen_in(&l, 4, name3) && seen_in(&l, 4, name4));

    l.stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    fprintf(stderr, "dns discovery under load: %d requests, %d failed\n", l.total, l.failed);
    assert_int_equal(l.failed, 0);
    assert_true(l.total > 50);

    assert_int_equal(ig_proc_stop(&gw, SIGTERM, 30000), 0);
    ig_proc_dispose(&gw);
    ig_proc_dispose(&dns);
    for (int i = 0; i < NWORKERS; i++) {
        ig_proc_stop(&workers[i], SIGTERM, 10000);
        ig_proc_dispose(&workers[i]);
    }
}

/* A request that arrives while the only listed instance is still starting
 * is held, and served as soon as that instance is ready (not at the hold's
 * timeout): a discovered pool's ready instance retries the held requests. */
static void test_held_until_discovered_ready(void **state)
{
    (void)state;
    need_dnsmasq();
    int wport = ig_proc_free_port(), dport = ig_proc_free_port(), gport = ig_proc_free_port();
    snprintf(hosts_path, sizeof(hosts_path), "%s/hosts", ig_gwf_run_dir);
    int listed[NWORKERS + 1] = {1, 0, 0, 0};
    write_hosts(listed);
    ig_proc_t dns;
    assert_int_equal(ig_dnsmasq_start(&dns, dport, hosts_path), 0);
    ig_proc_t gw;
    char cfg[1024];
    discover_config(cfg, sizeof(cfg), gport, "workers.test", wport, dport);
    assert_int_equal(ig_gwf_serve_config(&gw, gport, "warn", 0, 20000, 0, "%s", cfg), 0);
    char st[32], nm[96];
    long long end = ig_tc_now_ms() + 10000;
    while (ig_tc_now_ms() < end && (pool_view(gport, ips[0], st, sizeof(st), nm, sizeof(nm)) < 0 ||
                                    strcmp(st, "starting") != 0))
        usleep(50 * 1000);
    assert_string_equal(st, "starting");

    ig_tc_t *tc = ig_tc_connect(gport);
    assert_non_null(tc);
    assert_int_equal(ig_gwf_send_completion(tc), 0);
    usleep(500 * 1000); /* held: nothing serves yet */
    char listen[64];
    snprintf(listen, sizeof(listen), "%s:%d", ips[0], wport);
    const char *args[] = {"worker", "--model", ig_gwf_model_dir, "--device",  "cpu", "--listen",
                          listen,   "--name",  "tiny",           "--threads", "1",   NULL};
    ig_proc_t w;
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_proc_start_bin(&w, "infergate", args, IG_PROC_QUIET), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_read_response(tc, &r, 20000), 0);
    long long waited = ig_tc_now_ms() - t0;
    fprintf(stderr, "held request answered %lld ms after the worker started\n", waited);
    assert_int_equal(r.status, 200);
    assert_true(waited < 15000); /* the hold lasts 30 s: not its timeout */
    ig_tc_response_free(&r);
    ig_tc_close(tc);

    stop_all(&gw, &w, 1, &dns);
}

/* A reload that points the pool at another DNS name replaces it under
 * load: the new pool's instance (found under the new name) takes over once
 * ready, the old one drains, and no request fails, even when the old
 * worker is stopped right after. */
static void test_reload_moves_discovered_pool(void **state)
{
    (void)state;
    need_dnsmasq();
    int wport = ig_proc_free_port(), dport = ig_proc_free_port(), gport = ig_proc_free_port();
    snprintf(hosts_path, sizeof(hosts_path), "%s/hosts", ig_gwf_run_dir);
    char text[128];
    snprintf(text, sizeof(text), "%s workers.test\n%s workers2.test\n", ips[0], ips[1]);
    assert_int_equal(ig_tf_write(hosts_path, text, strlen(text)), 0);
    ig_proc_t dns;
    assert_int_equal(ig_dnsmasq_start(&dns, dport, hosts_path), 0);
    ig_proc_t w[2];
    for (int i = 0; i < 2; i++) {
        start_worker(&w[i], ips[i], wport);
    }
    char cfg_path[256], cfg0[1024], cfg1[1024];
    snprintf(cfg_path, sizeof(cfg_path), "%s/gw.json", ig_gwf_run_dir);
    discover_config(cfg0, sizeof(cfg0), gport, "workers.test", wport, dport);
    discover_config(cfg1, sizeof(cfg1), gport, "workers2.test", wport, dport);
    assert_int_equal(ig_tf_write(cfg_path, cfg0, strlen(cfg0)), 0);

    ig_proc_t gw;
    assert_int_equal(ig_gwf_serve(&gw, cfg_path, gport, "info", 0, 20000, 30000), 0);
    assert_int_equal(wait_view(gport, 1, ips[0], "ready", NULL, 0), 0);

    load_t l;
    memset(&l, 0, sizeof(l));
    pthread_mutex_init(&l.mu, NULL);
    l.port = gport;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, load_main, &l), 0);
    usleep(800 * 1000);

    assert_int_equal(ig_tf_replace(cfg_path, cfg1, strlen(cfg1)), 0);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(gport, "/admin/reload", "{}", &r, 10000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "replacing pool remote"));
    ig_tc_response_free(&r);
    assert_int_equal(ig_gwf_wait_reloads(gport, "applied", 1, 30000), 0);
    /* Only the new name's worker is in the pool now; the old one can go. */
    assert_int_equal(wait_view(gport, 1, ips[1], "ready", NULL, 0), 0);
    assert_int_equal(wait_view(gport, 1, ips[0], "", NULL, 0), 0);
    assert_int_equal(ig_proc_stop(&w[0], SIGTERM, 10000), 0);
    usleep(800 * 1000);
    l.stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    fprintf(stderr, "reload of a discovered pool under load: %d requests, %d failed\n", l.total,
            l.failed);
    assert_int_equal(l.failed, 0);
    assert_true(l.total > 20);

    stop_all(&gw, w, 2, &dns);
}

/* No port in the config: SRV records (dnsmasq's srv-host) name two
 * targets at two ports, each target's A record its address; both workers
 * become instances named by address and port, and both serve. */
static void test_srv_records(void **state)
{
    (void)state;
    need_dnsmasq();
    int wport[2] = {ig_proc_free_port(), ig_proc_free_port()};
    int dport = ig_proc_free_port(), gport = ig_proc_free_port();
    char conf[200], text[256];
    snprintf(hosts_path, sizeof(hosts_path), "%s/hosts", ig_gwf_run_dir);
    snprintf(conf, sizeof(conf), "%s/dnsmasq.conf", ig_gwf_run_dir);
    const char *hosts = "127.0.0.2 w1.test\n127.0.0.3 w2.test\n";
    assert_int_equal(ig_tf_replace(hosts_path, hosts, strlen(hosts)), 0);
    int n = snprintf(text, sizeof(text),
                     "srv-host=_http._tcp.workers.test,w1.test,%d\n"
                     "srv-host=_http._tcp.workers.test,w2.test,%d\n",
                     wport[0], wport[1]);
    assert_int_equal(ig_tf_replace(conf, text, (size_t)n), 0);
    ig_proc_t w[2], dns, gw;
    for (int i = 0; i < 2; i++)
        start_worker(&w[i], ips[i], wport[i]);
    assert_int_equal(ig_dnsmasq_start_conf(&dns, dport, hosts_path, conf), 0);
    assert_int_equal(
        ig_gwf_serve_config(
            &gw, gport, "warn", 0, 20000, 30000,
            "{\"region\":\"r1\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
            "\"routing\":{\"policy\":\"round_robin\"},\"models\":[{\"name\":\"tiny\"}],"
            "\"pools\":[{\"name\":\"remote\",\"model\":\"tiny\","
            "\"discover\":{\"dns\":\"_http._tcp.workers.test\",\"interval_s\":0.2,"
            "\"resolver\":\"127.0.0.1:%d\"}}]}",
            gport, dport),
        0);
    char dev[2][64], name[2][96];
    for (int i = 0; i < 2; i++) {
        snprintf(dev[i], sizeof(dev[i]), "%s:%d", ips[i], wport[i]);
        assert_int_equal(wait_view(gport, 2, dev[i], "ready", name[i], sizeof(name[i])), 0);
    }
    int served[2] = {0, 0};
    for (int k = 0; k < 4; k++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_complete(gport, 2, &r), 0);
        assert_int_equal(r.status, 200);
        const char *up = ig_tc_header(&r, "x-infergate-upstream");
        for (int i = 0; i < 2; i++)
            served[i] += up != NULL && strcmp(up, name[i]) == 0;
        ig_tc_response_free(&r);
    }
    assert_true(served[0] >= 1 && served[1] >= 1);
    stop_all(&gw, w, 2, &dns);
}

/* Without a resolver the system's configuration answers (c-ares reads
 * /etc/hosts): "localhost", with a worker on 127.0.0.1. */
static void test_system_resolver(void **state)
{
    (void)state;
    int wport = ig_proc_free_port(), gport = ig_proc_free_port();
    ig_proc_t w;
    start_worker(&w, "127.0.0.1", wport);
    ig_proc_t gw;
    assert_int_equal(
        ig_gwf_serve_config(
            &gw, gport, "warn", 0, 20000, 30000,
            "{\"region\":\"r1\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
            "\"models\":[{\"name\":\"tiny\"}],"
            "\"pools\":[{\"name\":\"remote\",\"model\":\"tiny\","
            "\"discover\":{\"dns\":\"localhost\",\"port\":%d,\"interval_s\":0.5}}]}",
            gport, wport),
        0);
    char st[32], nm[96];
    assert_true(pool_view(gport, "127.0.0.1", st, sizeof(st), nm, sizeof(nm)) >= 1);
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_complete(gport, 2, &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    assert_int_equal(ig_proc_stop(&gw, SIGTERM, 30000), 0);
    ig_proc_dispose(&gw);
    ig_proc_stop(&w, SIGTERM, 10000);
    ig_proc_dispose(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_follows_dns),
        cmocka_unit_test(test_held_until_discovered_ready),
        cmocka_unit_test(test_reload_moves_discovered_pool),
        cmocka_unit_test(test_srv_records),
        cmocka_unit_test(test_system_resolver),
    };
    return cmocka_run_group_tests(tests, ig_gwf_model_setup, ig_gwf_model_teardown);
}
