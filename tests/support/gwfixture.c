#include "gwfixture.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "infergate/tokgen.h"

int ig_gwf_model_make(char *run_dir, char *model_dir, size_t cap)
{
    if (ig_tf_mkdtemp(run_dir, cap) != 0)
        return -1;
    snprintf(model_dir, cap, "%s/tiny", run_dir);
    ig_proc_t p;
    const char *args[] = {"mkmodel", "--preset", "tiny", "--out", model_dir, NULL};
    if (ig_proc_start_bin(&p, "infergate", args, 0) != 0)
        return -1;
    int rc = ig_proc_stop(&p, 0, 60000);
    ig_proc_dispose(&p);
    if (rc != 0) {
        fprintf(stderr, "infergate mkmodel exited %d\n", rc);
        return -1;
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    if (access(path, R_OK) != 0) {
        char err[256];
        if (ig_tokgen_write(model_dir, 4096, IG_TOKGEN_SENTENCEPIECE, 1, err, sizeof(err)) != 0) {
            fprintf(stderr, "tokgen: %s\n", err);
            return -1;
        }
    }
    return 0;
}

int ig_gwf_model_make_seed(const char *dir, int seed)
{
    char sd[16];
    snprintf(sd, sizeof(sd), "%d", seed);
    ig_proc_t p;
    const char *args[] = {"mkmodel", "--preset", "tiny", "--seed", sd, "--out", dir, NULL};
    if (ig_proc_start_bin(&p, "infergate", args, 0) != 0)
        return -1;
    int rc = ig_proc_stop(&p, 0, 60000);
    ig_proc_dispose(&p);
    if (rc != 0)
        fprintf(stderr, "infergate mkmodel --seed %d exited %d\n", seed, rc);
    return rc == 0 ? 0 : -1;
}

char ig_gwf_run_dir[96];
char ig_gwf_model_dir[96];

int ig_gwf_model_setup(void **state)
{
    (void)state;
    return ig_gwf_model_make(ig_gwf_run_dir, ig_gwf_model_dir, sizeof(ig_gwf_model_dir));
}

int ig_gwf_model_teardown(void **state)
{
    (void)state;
    if (ig_gwf_run_dir[0] != '\0')
        ig_tf_rmtree(ig_gwf_run_dir);
    ig_gwf_run_dir[0] = '\0';
    return 0;
}

const char *ig_gwf_pool_config(const char *region, int port, const char *model_dir, int ndevices,
                               int min, int max, int max_num_seqs, const char *pool_extra,
                               const char *extra)
{
    char devices[256] = "";
    for (int i = 0; i < ndevices && i < 32; i++)
        strcat(devices, i ? ",\"cpu\"" : "\"cpu\"");
    /* Tests stop the gateway with SIGTERM: without a limits object of the
     * caller's, no drain grace, so that each stop does not wait 5 s. */
    const char *grace =
        extra && strstr(extra, "\"limits\"") ? "" : ",\"limits\":{\"drain_grace_ms\":0}";
    char cfg[4096];
    int n = snprintf(cfg, sizeof(cfg),
                     "{\"region\":\"%s\",\"listen\":\"127.0.0.1:%d\","
                     "\"models\":[{\"name\":\"tiny\",\"path\":\"%s\"}],"
                     "\"pools\":[{\"name\":\"cpu\",\"model\":\"tiny\",\"devices\":[%s],"
                     "\"threads\":1,\"min_instances\":%d,\"max_instances\":%d,"
                     "\"batching\":{\"max_num_seqs\":%d}%s}]%s%s}",
                     region, port, model_dir, devices, min, max, max_num_seqs,
                     pool_extra ? pool_extra : "", extra ? extra : "", grace);
    if (n < 0 || (size_t)n >= sizeof(cfg))
        return NULL;
    return ig_proc_temp_file(cfg, ".json");
}

int ig_gwf_solo_start(ig_proc_t *gw, const char *region, const char *extra)
{
    if (ig_gwf_model_setup(NULL) != 0)
        return -1;
    int port = ig_proc_free_port();
    const char *path = ig_gwf_pool_config(region, port, ig_gwf_model_dir, 1, 1, 1, 8, NULL, extra);
    if (path == NULL || ig_gwf_serve(gw, path, port, "warn", 0, 20000, 60000) != 0)
        return -1;
    return 0;
}

int ig_gwf_solo_stop(ig_proc_t *gw)
{
    int rc = ig_proc_stop(gw, SIGTERM, 20000);
    ig_proc_dispose(gw);
    ig_gwf_model_teardown(NULL);
    return rc == 0 ? 0 : -1;
}

int ig_gwf_serve(ig_proc_t *p, const char *config_path, int port, const char *level, int flags,
                 int listen_ms, int ready_ms)
{
    const char *args[] = {"serve", "--config", config_path, "--log-level", level, NULL};
    if (ig_proc_start_bin(p, "infergate", args, flags) != 0) {
        fprintf(stderr, "infergate serve: cannot start\n");
        return -1;
    }
    if (ig_proc_wait_listening(p, port, listen_ms) != 0) {
        fprintf(stderr, "infergate serve: not listening on port %d after %d ms\n", port, listen_ms);
        return -1;
    }
    if (ready_ms > 0 && ig_proc_wait_status(port, "/ready", 200, ready_ms) != 0) {
        fprintf(stderr, "infergate serve: /ready not 200 after %d ms\n", ready_ms);
        return -1;
    }
    return 0;
}

int ig_gwf_serve_config(ig_proc_t *p, int port, const char *level, int flags, int listen_ms,
                        int ready_ms, const char *fmt, ...)
{
    static char text[16384];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(text)) {
        fprintf(stderr, "infergate serve: config over %zu bytes\n", sizeof(text));
        return -1;
    }
    const char *path = ig_proc_temp_file(text, ".json");
    if (path == NULL)
        return -1;
    return ig_gwf_serve(p, path, port, level, flags, listen_ms, ready_ms);
}

int ig_gwf_serve_empty(ig_proc_t *p, const char *level)
{
    int port = ig_proc_free_port();
    char text[256];
    snprintf(text, sizeof(text), "{\"listen\": \"127.0.0.1:%d\", \"log\": {\"level\": \"%s\"}}",
             port, level);
    const char *cfg = ig_proc_temp_file(text, ".json");
    if (cfg == NULL)
        return -1;
    const char *args[] = {"serve", "--config", cfg, NULL};
    if (ig_proc_start_bin(p, "infergate", args, IG_PROC_PIPE_ERR) != 0)
        return -1;
    if (ig_proc_wait_listening(p, port, 10000) != 0) {
        fprintf(stderr, "serve did not start:\n%s\n", p->err ? p->err : "");
        return -1;
    }
    return 0;
}

int ig_gwf_tool(ig_proc_t *p, const char *tool, int port, const char *const *args, int timeout_ms)
{
    const char *argv[40];
    char listen[64];
    int n = 0;
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    argv[n++] = "--listen";
    argv[n++] = listen;
    for (int i = 0; args != NULL && args[i] != NULL && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    if (ig_proc_start_bin(p, tool, argv, IG_PROC_QUIET) != 0)
        return -1;
    return ig_proc_wait_listening(p, port, timeout_ms);
}

int ig_gwf_upstream(ig_proc_t *u, ...)
{
    const char *args[32];
    int n = 0;
    args[n++] = "--quiet";
    va_list ap;
    va_start(ap, u);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 31)
        args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    return ig_gwf_tool(u, "testupstream", ig_proc_free_port(), args, 10000);
}

int ig_gwf_sites_serve(ig_proc_t *g, const ig_proc_t *ups, int n, int expect_up,
                       const char *routing_extra, const char *top_extra)
{
    return ig_gwf_sites_serve_ex(g, ups, n, expect_up, routing_extra, top_extra, "warn", 0);
}

int ig_gwf_sites_serve_ex(ig_proc_t *g, const ig_proc_t *ups, int n, int expect_up,
                          const char *routing_extra, const char *top_extra, const char *level,
                          int flags)
{
    char cfg[4096];
    int port = ig_proc_free_port();
    size_t off = (size_t)snprintf(cfg, sizeof(cfg),
                                  "{\"region\":\"test\",\"listen\":\"127.0.0.1:%d\","
                                  "\"models\":[{\"name\":\"m\"}],\"sites\":[",
                                  port);
    for (int i = 0; i < n && off < sizeof(cfg); i++)
        off += (size_t)snprintf(
            cfg + off, sizeof(cfg) - off,
            "%s{\"name\":\"s%d\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}", i ? "," : "",
            i, ups[i].port);
    const char *grace =
        top_extra && strstr(top_extra, "\"limits\"") ? "" : ",\"limits\":{\"drain_grace_ms\":0}";
    /* A policy in routing_extra takes the place of "latency" (its leading
     * comma then goes). */
    int policy = routing_extra && strstr(routing_extra, "\"policy\"");
    if (off < sizeof(cfg))
        off += (size_t)snprintf(cfg + off, sizeof(cfg) - off, "],\"routing\":{%s%s}%s%s}",
                                policy ? "" : "\"policy\":\"latency\"",
                                routing_extra ? routing_extra + policy : "",
                                top_extra ? top_extra : "", grace);
    if (off >= sizeof(cfg)) {
        fprintf(stderr, "ig_gwf_sites_serve: config too long\n");
        return -1;
    }
    const char *path = ig_proc_temp_file(cfg, ".json");
    if (path == NULL || ig_gwf_serve(g, path, port, level, flags, 15000, 15000) != 0)
        return -1;
    /* Ready means one site is up; the tests want every healthy one probed. */
    long long end = ig_tc_now_ms() + 10000;
    int up = ig_gwf_sites_up(g->port, NULL, 0);
    while (up < expect_up && ig_tc_now_ms() < end)
        up = ig_gwf_sites_up(g->port, NULL, 0);
    if (up != expect_up) {
        fprintf(stderr, "ig_gwf_sites_serve: %d sites up, expected %d\n", up, expect_up);
        return -1;
    }
    return 0;
}

int ig_gwf_serve_site(ig_proc_t *p, int site_port, const char *limits_json)
{
    char text[1024];
    int n =
        snprintf(text, sizeof(text),
                 "{\"listen\": \"127.0.0.1:0\", \"models\": [{\"name\": \"tiny\"}],"
                 " \"sites\": [{\"name\": \"up\", \"url\": \"http://127.0.0.1:%d\","
                 " \"models\": [\"tiny\"]}]%s%s}",
                 site_port, limits_json ? ", \"limits\": " : "", limits_json ? limits_json : "");
    const char *config =
        n > 0 && (size_t)n < sizeof(text) ? ig_proc_temp_file(text, ".json") : NULL;
    if (config == NULL)
        return -1;
    const char *args[] = {"serve", "--config", config, NULL};
    if (ig_proc_start_bin(p, "infergate", args, IG_PROC_PIPES) != 0)
        return -1;
    if (ig_proc_wait_announce(p, 1, 10000) != 0) {
        fprintf(stderr, "serve did not start:\n%s\n", p->err ? p->err : "");
        return -1;
    }
    if (ig_proc_wait_status(p->port, "/ready", 200, 10000) != 0) {
        ig_proc_pump(p, 0);
        fprintf(stderr, "serve never ready:\n%s\n", p->err ? p->err : "");
        return -1;
    }
    return 0;
}

int ig_gwf_send_completion(ig_tc_t *tc)
{
    static const char body[] = "{\"model\": \"tiny\", \"prompt\": \"hi\", \"max_tokens\": 1}";
    char text[512];
    snprintf(text, sizeof(text),
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             sizeof(body) - 1, body);
    return ig_tc_sends(tc, text);
}

ig_tc_t *ig_gwf_inflight(int port, ig_ts_site_t *site, int n)
{
    ig_tc_t *tc = ig_tc_connect(port);
    if (tc != NULL && (ig_gwf_send_completion(tc) != 0 || !ig_ts_site_wait(site, n, 5000))) {
        ig_tc_close(tc);
        tc = NULL;
    }
    return tc;
}

int ig_gwf_sites_up(int port, int *up, int n)
{
    json_t *doc = ig_gwf_get_json(port, "/status");
    json_t *sites = json_object_get(doc, "sites");
    if (!json_is_array(sites)) {
        json_decref(doc);
        return -1;
    }
    int count = 0;
    for (int i = 0; up != NULL && i < n; i++)
        up[i] = 0;
    size_t i;
    json_t *site;
    json_array_foreach(sites, i, site)
    {
        int is_up = json_is_true(json_object_get(site, "up"));
        count += is_up;
        if (up != NULL && i < (size_t)n)
            up[i] = is_up;
    }
    json_decref(doc);
    return count;
}

double ig_gwf_metric(int port, const char *series)
{
    char *text = ig_gwf_get_text(port, "/metrics");
    if (text == NULL)
        return -1;
    double v = -1;
    const char *p = strstr(text, series);
    if (p != NULL)
        v = strtod(p + strlen(series), NULL);
    free(text);
    return v;
}

double ig_gwf_reloads(int port, const char *outcome)
{
    char series[128];
    snprintf(series, sizeof(series), "infergate_config_reloads_total{outcome=\"%s\"} ", outcome);
    double v = ig_gwf_metric(port, series);
    return v < 0 ? 0 : v;
}

int ig_gwf_wait_reloads(int port, const char *outcome, double n, int timeout_ms)
{
    long long end = ig_tc_now_ms() + timeout_ms;
    while (ig_tc_now_ms() < end) {
        if (ig_gwf_reloads(port, outcome) >= n)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}

int ig_gwf_control(int port, const char *what)
{
    char raw[512];
    snprintf(raw, sizeof(raw), "GET /_control/%s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
             what);
    ig_tc_response_t r;
    memset(&r, 0, sizeof(r));
    if (ig_tc_request(port, raw, &r, 5000) != 0)
        return -1;
    int status = r.status;
    ig_tc_response_free(&r);
    return status;
}

int ig_gwf_get(int port, const char *path, ig_tc_response_t *r)
{
    char raw[512];
    snprintf(raw, sizeof(raw), "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    memset(r, 0, sizeof(*r));
    return ig_tc_request(port, raw, r, 5000) == 0 ? 0 : -1;
}

json_t *ig_gwf_get_json(int port, const char *path)
{
    ig_tc_response_t r;
    if (ig_gwf_get(port, path, &r) != 0)
        return NULL;
    json_t *doc = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    ig_tc_response_free(&r);
    return doc;
}

json_t *ig_gwf_site_status(int port, const char *name)
{
    json_t *doc = ig_gwf_get_json(port, "/status"), *site = NULL, *v;
    size_t i;
    json_array_foreach(json_object_get(doc, "sites"), i, v)
    {
        const char *n = json_string_value(json_object_get(v, "name"));
        if (site == NULL && n != NULL && strcmp(n, name) == 0)
            site = json_incref(v);
    }
    json_decref(doc);
    return site;
}

int ig_gwf_upstream_stat(int port, const char *key)
{
    json_t *st = ig_gwf_get_json(port, "/_control/stats");
    int n = st != NULL ? (int)json_integer_value(json_object_get(st, key)) : -1;
    json_decref(st);
    return n;
}

char *ig_gwf_get_text(int port, const char *path)
{
    ig_tc_response_t r;
    if (ig_gwf_get(port, path, &r) != 0)
        return NULL;
    char *text = r.status == 200 ? strdup(r.body) : NULL;
    ig_tc_response_free(&r);
    return text;
}

int ig_gwf_post_headers(int port, const char *path, const char *headers, const char *body,
                        ig_tc_response_t *r, int timeout_ms)
{
    size_t blen = strlen(body);
    size_t cap = blen + strlen(headers) + 512;
    char *raw = malloc(cap);
    if (raw == NULL)
        return -1;
    snprintf(raw, cap,
             "POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             path, headers, blen, body);
    memset(r, 0, sizeof(*r));
    int rc = ig_tc_request(port, raw, r, timeout_ms);
    free(raw);
    return rc == 0 ? 0 : -1;
}

int ig_gwf_post(int port, const char *path, const char *body, ig_tc_response_t *r, int timeout_ms)
{
    return ig_gwf_post_headers(port, path, "", body, r, timeout_ms);
}

int ig_gwf_complete(int port, int max_tokens, ig_tc_response_t *r)
{
    char body[256];
    snprintf(body, sizeof(body),
             "{\"model\":\"tiny\",\"prompt\":\"once upon a time\",\"max_tokens\":%d,"
             "\"temperature\":0}",
             max_tokens);
    return ig_gwf_post(port, "/v1/completions", body, r, 60000);
}
