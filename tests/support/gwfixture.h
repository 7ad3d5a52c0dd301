#ifndef IG_TEST_GWFIXTURE_H
#define IG_TEST_GWFIXTURE_H

/*
 * Fixtures of the gateway integration tests: a tiny model made by the real
 * `infergate mkmodel`, `infergate serve` started on a config and awaited
 * until it is ready, and the requests these tests send (GET as JSON or
 * text, JSON POSTs, completions). All requests use Connection: close and a
 * bounded wait.
 */

#include <jansson.h>
#include <stddef.h>

#include "proc.h"
#include "testclient.h"
#include "testserver.h"

/* Makes the tiny model with `infergate mkmodel --preset tiny` in a fresh
 * directory (ig_tf_mkdtemp, into run_dir) at run_dir/tiny (into
 * model_dir); a generated tokenizer is added if mkmodel wrote none. Waits
 * up to 60 s. 0, or -1 (reason on stderr). The caller removes run_dir with
 * ig_tf_rmtree when it wants it gone. */
int ig_gwf_model_make(char *run_dir, char *model_dir, size_t cap);

/* Another tiny model at dir: `infergate mkmodel --preset tiny --seed
 * seed` (its own weights and tokenizer), up to 60 s. 0 or -1. */
int ig_gwf_model_make_seed(const char *dir, int seed);

/* The tiny model of one test program: ig_gwf_model_setup makes it
 * (ig_gwf_model_make into these two) and ig_gwf_model_teardown removes the
 * run directory, so that the tests leave nothing in /tmp. They have the
 * signature of a cmocka group setup and teardown. 96 bytes: the run
 * directory also holds Unix sockets, whose paths must stay short. */
extern char ig_gwf_run_dir[96];
extern char ig_gwf_model_dir[96];
int ig_gwf_model_setup(void **state);
int ig_gwf_model_teardown(void **state);

/* Writes a serve config to a temporary file: region, listen
 * 127.0.0.1:port, model "tiny" at model_dir, and one pool "cpu" of that
 * model on ndevices CPU devices (threads 1, min_instances, max_instances,
 * batching.max_num_seqs). pool_extra is spliced into the pool object and
 * extra into the top one (each NULL or starting with ','). Unless extra
 * has a "limits" object, the config sets limits.drain_grace_ms to 0, so a
 * SIGTERM stop does not wait the default grace. Returns the path as
 * ig_proc_temp_file does, or NULL. */
const char *ig_gwf_pool_config(const char *region, int port, const char *model_dir, int ndevices,
                               int min, int max, int max_num_seqs, const char *pool_extra,
                               const char *extra);

/* A cmocka group's gateway in one call: the tiny model (ig_gwf_model_setup),
 * a config of one pool with one instance (ig_gwf_pool_config, region,
 * batching.max_num_seqs 8, extra spliced into the top object), and serve
 * started and ready (up to 60 s). ig_gwf_solo_stop stops it with SIGTERM,
 * disposes of it and removes the model. 0, or -1. */
int ig_gwf_solo_start(ig_proc_t *gw, const char *region, const char *extra);
int ig_gwf_solo_stop(ig_proc_t *gw);

/* Starts `infergate serve --config config_path --log-level level` (flags as
 * for ig_proc_start), waits up to listen_ms until port accepts connections
 * and then, if ready_ms > 0, up to ready_ms until GET /ready answers 200.
 * 0 with p->port set, or -1 (which step failed on stderr); either way p
 * is the caller's to stop. */
int ig_gwf_serve(ig_proc_t *p, const char *config_path, int port, const char *level, int flags,
                 int listen_ms, int ready_ms);

/* As ig_gwf_serve, on a config written from fmt and what follows it
 * (printf) to a temporary file (ig_proc_temp_file, at most 16 KiB); -1 too
 * when it cannot be written. */
int ig_gwf_serve_config(ig_proc_t *p, int port, const char *level, int flags, int listen_ms,
                        int ready_ms, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* Starts `infergate serve` with nothing to serve on a free port, its log
 * at level (and no access lines below warn) on a captured stderr
 * (IG_PROC_PIPE_ERR), and waits up to 10 s until the port accepts
 * connections: for tests of the HTTP server behind the real binary. 0 with
 * p->port set, or -1 (the log on stderr); either way p is the caller's to
 * stop. */
int ig_gwf_serve_empty(ig_proc_t *p, const char *level);

/* Starts the bench tool `tool` of the build ("testupstream", "faultproxy")
 * with --listen 127.0.0.1:port and then args (NULL-terminated, may be
 * NULL), its stderr to /dev/null, and waits up to timeout_ms until the port
 * accepts connections. 0 with p->port set, or -1; either way p is the
 * caller's to stop. */
int ig_gwf_tool(ig_proc_t *p, const char *tool, int port, const char *const *args, int timeout_ms);

/* Starts the test upstream (build/testupstream --quiet) on a free port
 * with extra flags (NULL-terminated) and waits up to 10 s until it accepts
 * connections. 0 with u->port set, or -1; either way u is the caller's to
 * stop. */
int ig_gwf_upstream(ig_proc_t *u, ...) __attribute__((sentinel));

/* Starts `infergate serve` (log level warn) on a free port with the n
 * upstreams as sites s0, s1, ... of one model "m" and routing policy
 * "latency" unless routing_extra names another: routing_extra is spliced
 * into the routing object and top_extra into the top one (each NULL or
 * starting with ','). Unless
 * top_extra has a "limits" object, limits.drain_grace_ms is 0 (as in
 * ig_gwf_pool_config). Waits for /ready and then up to 10 s until
 * expect_up sites are probed up. 0 with g->port set, or -1 (which step
 * failed on stderr); either way g is the caller's to stop. */
int ig_gwf_sites_serve(ig_proc_t *g, const ig_proc_t *ups, int n, int expect_up,
                       const char *routing_extra, const char *top_extra);

/* ig_gwf_sites_serve at log level `level` with ig_proc_start's flags
 * (IG_PROC_PIPES: its access log in g->err). */
int ig_gwf_sites_serve_ex(ig_proc_t *g, const ig_proc_t *ups, int n, int expect_up,
                          const char *routing_extra, const char *top_extra, const char *level,
                          int flags);

/* The routing_extra of the hedging tests: hedge on, a budget of 0.1 per
 * request, a copy sent after the 0.95 quantile of the first-token delay. */
#define IG_GWF_HEDGE ",\"hedge\":{\"enabled\":true,\"budget\":0.1,\"delay_quantile\":0.95}"

/* Starts `infergate serve` with stdout and stderr captured (IG_PROC_PIPES)
 * on 127.0.0.1:0 with one site "up" at 127.0.0.1:site_port serving model
 * "tiny" (a site of ig_ts_site_start) and limits_json as its "limits"
 * object (NULL: none); waits up to 10 s for its "listening on" line and up
 * to 10 s more for /ready 200 (the site's probe came through). 0 with
 * p->port set, or -1 (the reason on stderr, p->err has the log); either way
 * p is the caller's to stop and dispose. */
int ig_gwf_serve_site(ig_proc_t *p, int site_port, const char *limits_json);

/* Sends POST /v1/completions for model "tiny" (prompt "hi", max_tokens 1)
 * on tc and returns without reading the answer. 0 or -1. */
int ig_gwf_send_completion(ig_tc_t *tc);

/* A completion in flight through a gateway on port to site: connects,
 * sends it (ig_gwf_send_completion) and waits up to 5 s until site has
 * received n completions (ig_ts_site_wait). The connection, its answer
 * unread; NULL on failure. */
ig_tc_t *ig_gwf_inflight(int port, ig_ts_site_t *site, int n);

/* GET /status of a gateway: how many of its sites are up, and, when up is
 * not NULL, whether each of the first n is (in config order). -1 when
 * /status did not answer 200 with JSON. */
int ig_gwf_sites_up(int port, int *up, int n);

/* The number on the first line of GET /metrics that starts with series
 * (the name with its labels, e.g. "x_total{a=\"b\"} "), or -1 when there
 * is none or /metrics did not answer. */
double ig_gwf_metric(int port, const char *series);

/* The count of infergate_config_reloads_total{outcome} ("applied",
 * "invalid", "busy", "failed") on /metrics; 0 when the series is absent. */
double ig_gwf_reloads(int port, const char *outcome);

/* Polls until that count reaches n, up to timeout_ms. 0, or -1 on timeout. */
int ig_gwf_wait_reloads(int port, const char *outcome, double n, int timeout_ms);

/* GET /_control/<what> of a test upstream ("stall?ms=3000",
 * "error-rate?p=1"): the answer's status, or -1 when none came in 5 s. */
int ig_gwf_control(int port, const char *what);

/* GET path (5 s at most); the caller frees r. 0 or -1 (no answer). */
int ig_gwf_get(int port, const char *path, ig_tc_response_t *r);

/* GET path: the JSON body of a 200 answer (new reference), else NULL. */
json_t *ig_gwf_get_json(int port, const char *path);

/* The site named name in GET /status (new reference), else NULL. */
json_t *ig_gwf_site_status(int port, const char *name);

/* A count of a test upstream's GET /_control/stats ("completions" taken
 * in, "busy" slots, "max_inside", ...), or -1. */
int ig_gwf_upstream_stat(int port, const char *key);

/* GET path: the body of a 200 answer (malloc'ed, caller frees), else NULL. */
char *ig_gwf_get_text(int port, const char *path);

/* POSTs a JSON body to path, waiting up to timeout_ms for the whole
 * answer; the caller frees r. 0 or -1 (no answer). */
int ig_gwf_post(int port, const char *path, const char *body, ig_tc_response_t *r, int timeout_ms);
/* ig_gwf_post with extra header lines ("Name: value\r\n" each, or ""). */
int ig_gwf_post_headers(int port, const char *path, const char *headers, const char *body,
                        ig_tc_response_t *r, int timeout_ms);

/* POST /v1/completions for model "tiny": prompt "once upon a time",
 * max_tokens, temperature 0, up to 60 s. As ig_gwf_post. */
int ig_gwf_complete(int port, int max_tokens, ig_tc_response_t *r);

#endif
