/*
 * Instance pools: worker child processes, their readiness, restarts with
 * backoff, drain and stop (see include/infergate/pool.h).
 */
#include "infergate/pool.h"
#include "infergate/discover.h"
#include "infergate/kv_feed.h"
#include "infergate/error.h"
#include "infergate/load.h"
#include "infergate/log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

extern char **environ;

#define MAX_ARGS 40
#define HEALTHY_RESET_NS (60ULL * 1000000000ULL) /* ready this long: backoff forgotten */
/* A drain waits for the gateway's in-flight requests to end before SIGTERM;
 * past this the worker gets SIGTERM anyway (it then drains by itself, for
 * its own 60 s), and SIGKILL once KILL_AFTER_TERM_NS have passed. */
#define DRAIN_TIMEOUT_NS (120ULL * 1000000000ULL)
#define KILL_AFTER_TERM_NS (90ULL * 1000000000ULL)

struct ig_instance_s {
    ig_pool_t *pool;
    int index;
    char name[96];
    char device[96];
    char socket_path[256];
    char listen[300];
    ig_instance_state_t state;
    uv_process_t proc;
    int proc_alive; /* the process handle is open */
    int pid;
    int restarts;
    int stop_requested; /* drain or pool close: an exit is not a crash */
    int term_sent;      /* SIGTERM sent for a drain: it can no longer be undrained */
    int releasing;      /* exited after a stop: the slot frees when the handle closes */
    int threads;        /* --threads given to a plain "cpu" worker; 0 otherwise */
    uint64_t drain_ns;  /* when the drain began */
    uint64_t term_ns;   /* when SIGTERM went out */
    uint64_t backoff_ms;
    uint64_t started_ns;
    uint64_t ready_ns;
    uv_timer_t timer; /* readiness polls, /load polls, backoff, drain checks */
    ig_upstream_t *client;
    ig_upstream_req_t *poll; /* the /ready or /load request in flight */
    void *poll_data;         /* its poll_t, freed here when it is cancelled */
    uint64_t poll_sent_ns;
    ig_router_upstream_t route;
    ig_load_t load;        /* the last /load report */
    int in_use;            /* this device slot holds an instance */
    int remote;            /* a discovered instance: an address, no process */
    int remote_closing;    /* its client is closing; the slot frees after */
    ig_kv_feed_t *kv_feed; /* its GET /kv/events, while it is ready or draining */
};

struct ig_pool_s {
    uv_loop_t *loop;
    ig_pool_spec_t spec;
    char **devices;
    ig_instance_t *inst; /* spec.ndevices slots */
    ig_pool_event_cb cb;
    void *cb_data;
    int closing;
    int open_handles;
    uint64_t grace_ms;
    uv_timer_t kill_timer;
    void (*close_cb)(void *data);
    void *close_data;
    /* pools[].discover: the slots hold remote instances found in DNS */
    int remote;
    ig_discover_t *discover;
    ig_upstream_opts_t uo; /* for the clients of instances found later */
};

static const char *state_names[] = {"stopped", "starting", "ready", "draining", "backoff"};

const char *ig_instance_state_name(ig_instance_state_t s)
{
    return (unsigned)s < 5 ? state_names[s] : "unknown";
}

int ig_process_die_with_parent(int parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        return IG_EIO;
    /* The parent may have died before the call: then nobody will signal. */
    if (getppid() != parent)
        return IG_ESTATE;
    return 0;
}

static void set_state(ig_instance_t *in, ig_instance_state_t s)
{
    if (in->state == s)
        return;
    IG_INFO("instance %s: %s -> %s", in->name, ig_instance_state_name(in->state),
            ig_instance_state_name(s));
    in->state = s;
    in->route.ready = s == IG_INSTANCE_READY || s == IG_INSTANCE_DRAINING;
    in->route.draining = s == IG_INSTANCE_DRAINING;
    if (s == IG_INSTANCE_READY)
        in->ready_ns = uv_hrtime();
    ig_pool_t *p = in->pool;
    /* The exact prefix index lives exactly as long as the process: one that
     * stops or crashes takes its blocks out of routing at once. */
    if (in->route.ready && in->kv_feed == NULL && !p->closing &&
        ig_kv_feed_start(&in->kv_feed, p->loop, in->name, in->listen, &in->route) != 0)
        in->kv_feed = NULL;
    if (!in->route.ready && in->kv_feed != NULL) {
        ig_kv_feed_close(in->kv_feed);
        in->kv_feed = NULL;
    }
    if (p->cb != NULL)
        p->cb(p, in, p->cb_data);
}

static void instance_spawn(ig_instance_t *in);
static void schedule_poll(ig_instance_t *in, uint64_t ms);
static void poll_cancel(ig_instance_t *in);
static void remote_drain_tick(ig_instance_t *in);
static int remote_pool_start(ig_pool_t *p);

/* ---- polling /ready and /load -------------------------------------------- */

typedef struct {
    ig_instance_t *in;
    int status;
    char *body;
    size_t len;
} poll_t;

static void poll_on_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                            const char *const *values, void *data)
{
    ((poll_t *)data)->status = status;
}

static void poll_on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    poll_t *pl = data;
    if (pl->len + len > 64 * 1024)
        return; /* a /load report is small; ignore anything past this */
    char *n = realloc(pl->body, pl->len + len + 1);
    if (n == NULL)
        return;
    memcpy(n + pl->len, buf, len);
    pl->len += len;
    n[pl->len] = '\0';
    pl->body = n;
}

/* Reads the worker's /load report into the router's view of it. A report
 * with a field of the wrong type still gives the others. */
static void apply_load(ig_instance_t *in, const char *text, size_t len, uint64_t now)
{
    ig_load_t next;
    ig_load_init(&next);
    if (ig_load_decode(text, len, &next, NULL, 0) == IG_EPARSE)
        return; /* the last good report stays */
    ig_load_dispose(&in->load);
    in->load = next;
    ig_kv_feed_take_load(&in->route, &in->load, now);
}

static void poll_on_done(ig_upstream_req_t *r, int err, void *data)
{
    poll_t *pl = data;
    ig_instance_t *in = pl->in;
    uint64_t now = uv_hrtime();
    in->poll = NULL;
    in->poll_data = NULL;
    if (in->state == IG_INSTANCE_STARTING) {
        if (err == 0 && pl->status == 200) {
            set_state(in, IG_INSTANCE_READY);
            ig_router_observe_probe_rtt(in->pool->spec.router, &in->route,
                                        (double)(now - in->poll_sent_ns) / 1e9, now);
            schedule_poll(in, 0);
        } else if (!in->remote &&
                   (now - in->started_ns) / 1000000ULL > in->pool->spec.ready_timeout_ms) {
            IG_WARN("instance %s: not ready after %llu ms; restarting", in->name,
                    (unsigned long long)in->pool->spec.ready_timeout_ms);
            uv_process_kill(&in->proc, SIGKILL);
        } else {
            schedule_poll(in, 100);
        }
    } else if (in->state == IG_INSTANCE_READY ||
               (in->state == IG_INSTANCE_DRAINING && !in->term_sent)) {
        if (err == 0 && pl->status == 200 && pl->body != NULL) {
            ig_router_observe_probe_rtt(in->pool->spec.router, &in->route,
                                        (double)(now - in->poll_sent_ns) / 1e9, now);
            apply_load(in, pl->body, pl->len, now);
        }
        schedule_poll(in, in->pool->spec.load_poll_ms);
    }
    free(pl->body);
    free(pl);
}

static void poll_send(ig_instance_t *in)
{
    static const ig_upstream_cbs_t cbs = {poll_on_headers, poll_on_body, poll_on_done};
    poll_t *pl = calloc(1, sizeof(*pl));
    if (pl == NULL) {
        schedule_poll(in, 1000);
        return;
    }
    pl->in = in;
    in->poll_sent_ns = uv_hrtime();
    const char *path = in->state == IG_INSTANCE_STARTING ? "/ready" : "/load";
    if (ig_upstream_request(in->client, "GET", path, NULL, NULL, 0, &cbs, pl, &in->poll) != 0) {
        free(pl);
        schedule_poll(in, 1000);
        return;
    }
    in->poll_data = pl;
}

/* A cancelled request's callbacks never fire: its poll_t is freed here. */
static void poll_cancel(ig_instance_t *in)
{
    if (in->poll == NULL)
        return;
    ig_upstream_cancel(in->poll);
    in->poll = NULL;
    poll_t *pl = in->poll_data;
    in->poll_data = NULL;
    if (pl != NULL) {
        free(pl->body);
        free(pl);
    }
}

static void on_instance_timer(uv_timer_t *t)
{
    ig_instance_t *in = t->data;
    switch (in->state) {
    case IG_INSTANCE_BACKOFF:
        instance_spawn(in);
        break;
    case IG_INSTANCE_DRAINING: {
        uint64_t now = uv_hrtime();
        if (in->remote) {
            remote_drain_tick(in);
            break;
        }
        if (!in->proc_alive || in->releasing)
            break; /* exited: the close callback frees the slot */
        if (in->term_sent) {
            if (now - in->term_ns > KILL_AFTER_TERM_NS) {
                IG_WARN("instance %s: still running %llu s after SIGTERM; killing", in->name,
                        (unsigned long long)(KILL_AFTER_TERM_NS / 1000000000ULL));
                uv_process_kill(&in->proc, SIGKILL);
            } else {
                uv_timer_start(&in->timer, on_instance_timer, 500, 0);
            }
            break;
        }
        if (in->route.inflight == 0 || now - in->drain_ns > DRAIN_TIMEOUT_NS) {
            if (in->route.inflight == 0)
                IG_INFO("instance %s: drained; stopping", in->name);
            else
                IG_WARN("instance %s: %d requests still in flight after the drain timeout; "
                        "stopping (the worker drains them)",
                        in->name, in->route.inflight);
            in->term_sent = 1;
            in->term_ns = now;
            poll_cancel(in);
            uv_process_kill(&in->proc, SIGTERM);
            uv_timer_start(&in->timer, on_instance_timer, 500, 0);
            break;
        }
        /* Keep polling /load while draining. */
        if (in->poll == NULL)
            poll_send(in);
        else
            schedule_poll(in, 100);
        break;
    }
    case IG_INSTANCE_STARTING:
    case IG_INSTANCE_READY:
        if (in->poll == NULL)
            poll_send(in);
        else
            schedule_poll(in, 100);
        break;
    case IG_INSTANCE_STOPPED:
        break;
    }
}

static void schedule_poll(ig_instance_t *in, uint64_t ms)
{
    if (in->pool->closing)
        return;
    if (in->state == IG_INSTANCE_DRAINING && ms > 100)
        ms = 100; /* drain checks run often */
    uv_timer_start(&in->timer, on_instance_timer, ms, 0);
}

/* ---- processes ----------------------------------------------------------- */

static void pool_maybe_closed(ig_pool_t *p);

/* The slot holds no process any more: its device is free. */
static void release_slot(ig_instance_t *in)
{
    in->in_use = 0;
    in->releasing = 0;
    if (in->state != IG_INSTANCE_STOPPED) {
        set_state(in, IG_INSTANCE_STOPPED);
    } else if (in->pool->cb != NULL && !in->pool->closing) {
        in->pool->cb(in->pool, in, in->pool->cb_data); /* the slot is free now */
    }
}

static void on_proc_closed(uv_handle_t *h)
{
    ig_instance_t *in = h->data;
    ig_pool_t *p = in->pool;
    in->proc_alive = 0;
    /* Only now may the slot be spawned into again: the handle's memory is
     * the next process's. */
    if (in->releasing && !p->closing)
        release_slot(in);
    pool_maybe_closed(p);
}

static void on_worker_exit(uv_process_t *proc, int64_t status, int term_signal)
{
    ig_instance_t *in = proc->data;
    ig_pool_t *p = in->pool;
    poll_cancel(in);
    uv_close((uv_handle_t *)proc, on_proc_closed);
    uint64_t now = uv_hrtime();
    if (in->stop_requested || p->closing) {
        IG_INFO("instance %s: exited (status %lld, signal %d)", in->name, (long long)status,
                term_signal);
        uv_timer_stop(&in->timer);
        if (p->closing) {
            in->in_use = 0;
            in->state = IG_INSTANCE_STOPPED;
        } else {
            in->releasing = 1; /* STOPPED once the handle is closed */
        }
        return;
    }
    if (in->ready_ns != 0 && now - in->ready_ns > HEALTHY_RESET_NS)
        in->backoff_ms = 0; /* it ran well for a while: start the backoff over */
    in->backoff_ms = in->backoff_ms == 0 ? p->spec.backoff_base_ms : in->backoff_ms * 2;
    if (in->backoff_ms > p->spec.backoff_max_ms)
        in->backoff_ms = p->spec.backoff_max_ms;
    in->restarts++;
    IG_WARN("instance %s: crashed (status %lld, signal %d); restart %d in %llu ms", in->name,
            (long long)status, term_signal, in->restarts, (unsigned long long)in->backoff_ms);
    set_state(in, IG_INSTANCE_BACKOFF);
    uv_timer_start(&in->timer, on_instance_timer, in->backoff_ms, 0);
}

static char *fmt_int(char *buf, size_t n, int v)
{
    snprintf(buf, n, "%d", v);
    return buf;
}

static void instance_spawn(ig_instance_t *in)
{
    ig_pool_t *p = in->pool;
    if (in->proc_alive) {
        /* The previous process's handle is still closing (a restart right
         * after an exit): its memory is not ours to reuse yet. */
        in->in_use = 1;
        uv_timer_start(&in->timer, on_instance_timer, 10, 0);
        return;
    }
    const ig_pool_spec_t *s = &p->spec;
    char *args[MAX_ARGS];
    int na = 0;
    char threads[16], kv[16], bs[16], mbt[16], itl[16], mns[16], mw[16], mpt[16];
    args[na++] = (char *)s->exe;
    args[na++] = "worker";
    args[na++] = "--model";
    args[na++] = (char *)s->model_dir;
    args[na++] = "--device";
    /* A MIG slice is device 0 of a process that sees only it. */
    int mig = strncmp(in->device, "MIG-", 4) == 0;
    args[na++] = in->device;
    args[na++] = "--listen";
    args[na++] = in->listen;
    args[na++] = "--name"; /* the model name clients use */
    args[na++] = (char *)s->model;
    if (strncmp(in->device, "cpu", 3) == 0 && strchr(in->device, ':') == NULL) {
        int t = s->threads;
        if (t <= 0) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            int n = s->max_instances > 0 ? s->max_instances : 1;
            t = cores > n ? (int)(cores / n) : 1;
        }
        args[na++] = "--threads";
        args[na++] = fmt_int(threads, sizeof(threads), t);
        in->threads = t;
    }
    if (s->kv_blocks > 0) {
        args[na++] = "--kv-blocks";
        args[na++] = fmt_int(kv, sizeof(kv), s->kv_blocks);
    }
    if (s->block_size > 0) {
        args[na++] = "--block-size";
        args[na++] = fmt_int(bs, sizeof(bs), s->block_size);
    }
    if (s->max_batched_tokens > 0) {
        args[na++] = "--max-batched-tokens";
        args[na++] = fmt_int(mbt, sizeof(mbt), s->max_batched_tokens);
    }
    if (s->itl_target_ms != 0) {
        args[na++] = "--itl-target-ms";
        args[na++] = fmt_int(itl, sizeof(itl), s->itl_target_ms > 0 ? s->itl_target_ms : 0);
    }
    if (s->max_num_seqs > 0) {
        args[na++] = "--max-num-seqs";
        args[na++] = fmt_int(mns, sizeof(mns), s->max_num_seqs);
    }
    if (s->max_waiting > 0) {
        args[na++] = "--max-waiting";
        args[na++] = fmt_int(mw, sizeof(mw), s->max_waiting);
    }
    if (s->max_prompt_tokens > 0) {
        args[na++] = "--max-prompt-tokens";
        args[na++] = fmt_int(mpt, sizeof(mpt), s->max_prompt_tokens);
    }
    if (s->log_level != NULL) {
        args[na++] = "--log-level";
        args[na++] = (char *)s->log_level;
    }
    if (s->quantize != NULL) {
        args[na++] = "--quantize";
        args[na++] = (char *)s->quantize;
    }
    if (s->kv_dtype != NULL) {
        args[na++] = "--kv-dtype";
        args[na++] = (char *)s->kv_dtype;
    }
    args[na] = NULL;

    /* The environment: ours, plus the parent pid the child checks with
     * PR_SET_PDEATHSIG, plus the MIG slice. */
    size_t nenv = 0;
    while (environ[nenv] != NULL)
        nenv++;
    char **env = calloc(nenv + 3, sizeof(char *));
    char parent[48], cvd[160];
    if (env == NULL)
        goto fail;
    size_t ne = 0;
    for (size_t i = 0; i < nenv; i++) {
        if (strncmp(environ[i], "IG_PARENT_PID=", 14) == 0 ||
            (mig && strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) == 0))
            continue;
        env[ne++] = environ[i];
    }
    snprintf(parent, sizeof(parent), "IG_PARENT_PID=%d", (int)getpid());
    env[ne++] = parent;
    if (mig) {
        snprintf(cvd, sizeof(cvd), "CUDA_VISIBLE_DEVICES=%s", in->device);
        env[ne++] = cvd;
    }
    env[ne] = NULL;

    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = 2; /* worker logs go where ours go */
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    uv_process_options_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.file = s->exe;
    opts.args = args;
    opts.env = env;
    opts.exit_cb = on_worker_exit;
    opts.stdio = stdio;
    opts.stdio_count = 3;
    unlink(in->socket_path); /* a crashed worker leaves its socket behind */
    in->proc.data = in;
    int rc = uv_spawn(p->loop, &in->proc, &opts);
    free(env);
    if (rc != 0) {
        IG_ERROR("instance %s: cannot start %s: %s", in->name, s->exe, uv_strerror(rc));
        /* uv_spawn failures still need the handle closed. */
        in->proc_alive = 1;
        uv_close((uv_handle_t *)&in->proc, on_proc_closed);
        goto fail;
    }
    in->proc_alive = 1;
    in->pid = in->proc.pid;
    in->route.kv_epoch++; /* a new process: its prefix cache is empty */
    in->started_ns = uv_hrtime();
    in->ready_ns = 0;
    in->stop_requested = 0;
    in->term_sent = 0;
    in->releasing = 0;
    in->in_use = 1;
    IG_INFO("instance %s: started pid %d on %s", in->name, in->pid, in->device);
    set_state(in, IG_INSTANCE_STARTING);
    schedule_poll(in, 50);
    return;
fail:
    in->backoff_ms = in->backoff_ms == 0 ? s->backoff_base_ms : in->backoff_ms * 2;
    if (in->backoff_ms > s->backoff_max_ms)
        in->backoff_ms = s->backoff_max_ms;
    in->in_use = 1;
    set_state(in, IG_INSTANCE_BACKOFF);
    uv_timer_start(&in->timer, on_instance_timer, in->backoff_ms, 0);
}

/* ---- the pool ------------------------------------------------------------ */

static void copy_str(const char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
}

/* p->spec holds its own copies of the spec's strings; spec_free frees
 * them. */
static void spec_copy_strings(ig_pool_t *p, const ig_pool_spec_t *spec)
{
    copy_str(&p->spec.name, spec->name);
    copy_str(&p->spec.model, spec->model);
    copy_str(&p->spec.model_dir, spec->model_dir);
    copy_str(&p->spec.exe, spec->exe);
    copy_str(&p->spec.run_dir, spec->run_dir);
    copy_str(&p->spec.log_level, spec->log_level);
    copy_str(&p->spec.discover_dns, spec->discover_dns);
    copy_str(&p->spec.discover_resolver, spec->discover_resolver);
    copy_str(&p->spec.quantize, spec->quantize);
    copy_str(&p->spec.kv_dtype, spec->kv_dtype);
}

static void spec_free(ig_pool_t *p)
{
    free((char *)p->spec.name);
    free((char *)p->spec.model);
    free((char *)p->spec.model_dir);
    free((char *)p->spec.exe);
    free((char *)p->spec.run_dir);
    free((char *)p->spec.log_level);
    free((char *)p->spec.discover_dns);
    free((char *)p->spec.discover_resolver);
    free((char *)p->spec.quantize);
    free((char *)p->spec.kv_dtype);
    for (int i = 0; i < p->spec.ndevices; i++)
        free(p->devices[i]);
    free(p->devices);
}

static void pool_free(ig_pool_t *p)
{
    if (p->inst != NULL) {
        for (int i = 0; i < p->spec.ndevices; i++)
            ig_load_dispose(&p->inst[i].load);
    }
    free(p->inst);
    spec_free(p);
    free(p);
}

int ig_pool_start(ig_pool_t **out, uv_loop_t *loop, const ig_pool_spec_t *spec, ig_pool_event_cb cb,
                  void *data)
{
    if (spec->discover_dns != NULL)
        return ig__pool_start_discovered(out, loop, spec, cb, data);
    if (spec->ndevices <= 0 || spec->min_instances < 0 || spec->min_instances > spec->ndevices)
        return IG_EINVAL;
    ig_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return IG_ENOMEM;
    p->loop = loop;
    p->spec = *spec;
    spec_copy_strings(p, spec);
    p->devices = calloc(spec->ndevices, sizeof(char *));
    p->inst = calloc(spec->ndevices, sizeof(ig_instance_t));
    int rc = IG_ENOMEM;
    if (p->devices == NULL || p->inst == NULL)
        goto fail;
    for (int i = 0; i < spec->ndevices; i++) {
        if ((p->devices[i] = strdup(spec->devices[i])) == NULL)
            goto fail;
    }
    p->spec.devices = (const char *const *)p->devices;
    p->spec.upstream = NULL; /* borrowed for the start only: copied into each client */
    if (p->spec.ready_timeout_ms == 0)
        p->spec.ready_timeout_ms = 120000;
    if (p->spec.load_poll_ms == 0)
        p->spec.load_poll_ms = 500;
    if (p->spec.backoff_base_ms == 0)
        p->spec.backoff_base_ms = 200;
    if (p->spec.backoff_max_ms == 0)
        p->spec.backoff_max_ms = 30000;
    if (p->spec.max_instances <= 0 || p->spec.max_instances > spec->ndevices)
        p->spec.max_instances = spec->ndevices;
    p->cb = cb;
    p->cb_data = data;
    for (int i = 0; i < spec->ndevices; i++) {
        ig_instance_t *in = &p->inst[i];
        in->pool = p;
        in->index = i;
        snprintf(in->name, sizeof(in->name), "%s/%d", spec->name, i);
        snprintf(in->device, sizeof(in->device), "%s", spec->devices[i]);
        if (spec->generation > 0) /* a reload's pool beside its namesake */
            snprintf(in->socket_path, sizeof(in->socket_path), "%s/%s.%u-%d.sock", spec->run_dir,
                     spec->name, spec->generation, i);
        else
            snprintf(in->socket_path, sizeof(in->socket_path), "%s/%s-%d.sock", spec->run_dir,
                     spec->name, i);
        snprintf(in->listen, sizeof(in->listen), "unix:%s", in->socket_path);
        ig_router_upstream_init(&in->route, in->name, IG_ROUTER_LOCAL);
        ig_load_init(&in->load);
        /* The sequences a worker runs at once: what we told it, else its
         * default. The router counts in-flight work against this. */
        in->route.slots = spec->max_num_seqs > 0 ? spec->max_num_seqs : 256;
        ig_upstream_opts_t uo;
        if (spec->upstream != NULL)
            uo = *spec->upstream;
        else
            ig_upstream_opts_default(&uo);
        if ((rc = ig_upstream_start(&in->client, loop, in->name, in->listen, &uo)) != 0)
            goto fail;
    }
    /* Handles last: nothing above needs closing through the loop. */
    for (int i = 0; i < spec->ndevices; i++) {
        uv_timer_init(loop, &p->inst[i].timer);
        p->inst[i].timer.data = &p->inst[i];
        p->open_handles++;
    }
    for (int i = 0; i < p->spec.min_instances; i++)
        instance_spawn(&p->inst[i]);
    *out = p;
    return 0;
fail:
    /* Upstream clients without connections close synchronously. */
    for (int i = 0; i < spec->ndevices && p->inst != NULL; i++) {
        if (p->inst[i].client != NULL)
            ig_upstream_close(p->inst[i].client, NULL, NULL);
    }
    pool_free(p);
    return rc;
}

static void pool_maybe_closed(ig_pool_t *p)
{
    if (!p->closing || p->open_handles > 0)
        return;
    for (int i = 0; i < p->spec.ndevices; i++) {
        if (p->inst[i].proc_alive)
            return;
    }
    void (*cb)(void *) = p->close_cb;
    void *data = p->close_data;
    pool_free(p);
    if (cb != NULL)
        cb(data);
}

static void on_pool_handle_closed(uv_handle_t *h)
{
    ig_pool_t *p = h->data;
    p->open_handles--;
    pool_maybe_closed(p);
}

static void on_timer_closed(uv_handle_t *h)
{
    ig_instance_t *in = h->data;
    in->pool->open_handles--;
    pool_maybe_closed(in->pool);
}

static void on_client_closed(void *data)
{
    ig_pool_t *p = data;
    p->open_handles--;
    pool_maybe_closed(p);
}

static void on_kill_timer(uv_timer_t *t)
{
    ig_pool_t *p = t->data;
    for (int i = 0; i < p->spec.ndevices; i++) {
        if (p->inst[i].proc_alive)
            uv_process_kill(&p->inst[i].proc, SIGKILL);
    }
    uv_close((uv_handle_t *)t, on_pool_handle_closed);
}

void ig_pool_close(ig_pool_t *p, uint64_t grace_ms, void (*cb)(void *data), void *data)
{
    p->closing = 1;
    p->close_cb = cb;
    p->close_data = data;
    int alive = 0;
    for (int i = 0; i < p->spec.ndevices; i++) {
        ig_instance_t *in = &p->inst[i];
        in->stop_requested = 1;
        poll_cancel(in);
        ig_kv_feed_close(in->kv_feed);
        in->kv_feed = NULL;
        uv_timer_stop(&in->timer);
        uv_close((uv_handle_t *)&in->timer, on_timer_closed);
        if (in->proc_alive) {
            uv_process_kill(&in->proc, SIGTERM);
            alive = 1;
        }
        if (in->client != NULL) { /* a remote slot without an address has none */
            p->open_handles++;
            ig_upstream_close(in->client, on_client_closed, p);
            in->client = NULL;
        }
    }
    ig_discover_close(p->discover);
    p->discover = NULL;
    if (alive) {
        uv_timer_init(p->loop, &p->kill_timer);
        p->kill_timer.data = p;
        p->open_handles++;
        uv_timer_start(&p->kill_timer, on_kill_timer, grace_ms, 0);
    }
    pool_maybe_closed(p);
}

const char *ig_pool_name(const ig_pool_t *p)
{
    return p->spec.name;
}

const char *ig_pool_model(const ig_pool_t *p)
{
    return p->spec.model;
}

int ig_pool_size(const ig_pool_t *p)
{
    return p->spec.ndevices;
}

ig_instance_t *ig_pool_instance(ig_pool_t *p, int i)
{
    return i >= 0 && i < p->spec.ndevices ? &p->inst[i] : NULL;
}

int ig_pool_count(const ig_pool_t *p, ig_instance_state_t state)
{
    int n = 0;
    for (int i = 0; i < p->spec.ndevices; i++)
        n += p->inst[i].state == state && (state != IG_INSTANCE_STOPPED || !p->inst[i].in_use);
    return n;
}

int ig_pool_in_use(const ig_pool_t *p)
{
    int n = 0;
    for (int i = 0; i < p->spec.ndevices; i++)
        n += p->inst[i].in_use;
    return n;
}

int ig_pool_free_devices(const ig_pool_t *p)
{
    if (p->remote)
        return 0; /* its instances are found, not started */
    int used = ig_pool_in_use(p);
    int cap = p->spec.max_instances < p->spec.ndevices ? p->spec.max_instances : p->spec.ndevices;
    return cap > used ? cap - used : 0;
}

/* A draining instance that has not been sent SIGTERM can serve again at
 * once: cheaper than a cold start on another device. Only one that was
 * ready before its drain: a drained starting one never passed /ready. */
static ig_instance_t *undrainable(ig_pool_t *p)
{
    for (int i = 0; i < p->spec.ndevices; i++) {
        ig_instance_t *in = &p->inst[i];
        if (in->state == IG_INSTANCE_DRAINING && !in->term_sent && !in->releasing &&
            in->proc_alive && in->ready_ns != 0)
            return in;
    }
    return NULL;
}

int ig_pool_available(const ig_pool_t *p)
{
    return ig_pool_free_devices(p) + (undrainable((ig_pool_t *)p) != NULL);
}

int ig_pool_stopping(const ig_pool_t *p)
{
    int n = 0;
    for (int i = 0; i < p->spec.ndevices; i++)
        n +=
            p->inst[i].in_use && (p->inst[i].state == IG_INSTANCE_DRAINING || p->inst[i].releasing);
    return n;
}

int ig_pool_live(const ig_pool_t *p)
{
    return ig_pool_count(p, IG_INSTANCE_STARTING) + ig_pool_count(p, IG_INSTANCE_READY) +
           ig_pool_count(p, IG_INSTANCE_BACKOFF);
}

int ig_pool_scale_up(ig_pool_t *p)
{
    if (p->closing || p->remote)
        return IG_EBUSY;
    ig_instance_t *back = undrainable(p);
    if (back != NULL) {
        IG_INFO("instance %s: drain cancelled; serving again", back->name);
        back->stop_requested = 0;
        set_state(back, IG_INSTANCE_READY);
        schedule_poll(back, 0);
        return 0;
    }
    if (ig_pool_free_devices(p) == 0)
        return IG_EBUSY;
    for (int i = 0; i < p->spec.ndevices; i++) {
        ig_instance_t *in = &p->inst[i];
        if (!in->in_use && !in->proc_alive) {
            in->backoff_ms = 0;
            instance_spawn(in);
            return 0;
        }
    }
    return IG_EBUSY; /* a slot is free by count but its old handle still closes */
}

int ig_pool_drain(ig_pool_t *p, int i)
{
    ig_instance_t *in = ig_pool_instance(p, i);
    if (in == NULL)
        return IG_EINVAL;
    if (p->closing)
        return IG_ESTATE;
    if (in->state != IG_INSTANCE_READY && in->state != IG_INSTANCE_STARTING &&
        in->state != IG_INSTANCE_BACKOFF)
        return IG_ESTATE;
    in->stop_requested = 1;
    if (in->state == IG_INSTANCE_BACKOFF) {
        /* Crashed and waiting to restart: nothing runs, nothing to drain. */
        uv_timer_stop(&in->timer);
        if (in->proc_alive) {
            in->releasing = 1; /* the exited process's handle still closes */
            set_state(in, IG_INSTANCE_DRAINING);
        } else {
            release_slot(in);
        }
        return 0;
    }
    in->drain_ns = uv_hrtime();
    in->term_sent = 0;
    set_state(in, IG_INSTANCE_DRAINING);
    uv_timer_stop(&in->timer);
    schedule_poll(in, 0);
    return 0;
}

ig_instance_state_t ig_instance_state(const ig_instance_t *in)
{
    return in->state;
}

const char *ig_instance_name(const ig_instance_t *in)
{
    return in->name;
}

const char *ig_instance_device(const ig_instance_t *in)
{
    return in->device;
}

int ig_instance_pid(const ig_instance_t *in)
{
    return in->proc_alive ? in->pid : 0;
}

int ig_instance_threads(const ig_instance_t *in)
{
    return in->threads;
}

int ig_instance_holds_device(const ig_instance_t *in)
{
    return in->in_use;
}

int ig_pool_min_instances(const ig_pool_t *p)
{
    return p->spec.min_instances;
}

int ig_pool_max_instances(const ig_pool_t *p)
{
    return p->spec.max_instances;
}

const ig_kv_feed_t *ig_instance_kv_feed(const ig_instance_t *in)
{
    return in->kv_feed;
}

int ig_instance_restarts(const ig_instance_t *in)
{
    return in->restarts;
}

ig_upstream_t *ig_instance_upstream(ig_instance_t *in)
{
    return in->client;
}

ig_router_upstream_t *ig_instance_route(ig_instance_t *in)
{
    return &in->route;
}

const ig_load_t *ig_instance_load(const ig_instance_t *in)
{
    return &in->load;
}

/* ---- remote instances: pools[].discover ------------------------------------
 *
 * A discovered pool's slots hold no processes: each is an address from the
 * pool's DNS name (gateway/fleet/discover.c), an upstream over TCP probed
 * and routed like a local worker. An address that appears takes a free
 * slot in state starting, and gets traffic once its /ready answers 200
 * (probed every 100 ms for as long as it is listed); one that disappears
 * drains: no new requests, and its client is closed once the gateway's
 * requests on it have ended (or after the drain timeout), which frees the
 * slot. An address listed again while it drains serves again at once.
 */

static void on_remote_client_closed(void *data)
{
    ig_instance_t *in = data;
    ig_pool_t *p = in->pool;
    in->remote_closing = 0;
    in->in_use = 0;
    p->open_handles--;
    if (!p->closing && p->cb != NULL)
        p->cb(p, in, p->cb_data); /* the slot is free */
    pool_maybe_closed(p);
}

static void remote_release(ig_instance_t *in)
{
    ig_pool_t *p = in->pool;
    poll_cancel(in);
    uv_timer_stop(&in->timer);
    set_state(in, IG_INSTANCE_STOPPED);
    ig_upstream_t *c = in->client;
    in->client = NULL;
    if (c == NULL) {
        in->in_use = 0;
        return;
    }
    in->remote_closing = 1;
    p->open_handles++;
    ig_upstream_close(c, on_remote_client_closed, in);
}

static void remote_drain_tick(ig_instance_t *in)
{
    uint64_t now = uv_hrtime();
    if (in->route.inflight == 0 || now - in->drain_ns > DRAIN_TIMEOUT_NS) {
        if (in->route.inflight == 0)
            IG_INFO("instance %s (%s): drained; released", in->name, in->device);
        else
            IG_WARN("instance %s (%s): %d requests still in flight after the drain timeout; "
                    "released",
                    in->name, in->device, in->route.inflight);
        remote_release(in);
        return;
    }
    uv_timer_start(&in->timer, on_instance_timer, 100, 0);
}

/* a as a host:port to connect to ("[v6]:port" for IPv6). */
static void remote_listen(const ig_discover_addr_t *a, char *buf, size_t cap)
{
    snprintf(buf, cap, strchr(a->addr, ':') != NULL ? "[%s]:%d" : "%s:%d", a->addr, a->port);
}

/* The device name of the instance at a: its address when the pool names
 * the port, else (the port from SRV records) its host:port. */
static void remote_device(const ig_pool_t *p, const ig_discover_addr_t *a, char *buf, size_t cap)
{
    if (p->spec.discover_port > 0)
        snprintf(buf, cap, "%s", a->addr);
    else
        remote_listen(a, buf, cap);
}

static int remote_attach(ig_pool_t *p, const ig_discover_addr_t *a)
{
    ig_instance_t *in = NULL;
    for (int i = 0; i < p->spec.ndevices && in == NULL; i++) {
        if (!p->inst[i].in_use && !p->inst[i].remote_closing)
            in = &p->inst[i];
    }
    if (in == NULL)
        return IG_EFULL;
    remote_device(p, a, in->device, sizeof(in->device));
    remote_listen(a, in->listen, sizeof(in->listen));
    int rc = ig_upstream_start(&in->client, p->loop, in->name, in->listen, &p->uo);
    if (rc != 0)
        return rc;
    ig_router_upstream_init(&in->route, in->name, IG_ROUTER_LOCAL);
    in->route.slots = p->spec.max_num_seqs > 0 ? p->spec.max_num_seqs : 256;
    ig_load_dispose(&in->load);
    ig_load_init(&in->load);
    in->in_use = 1;
    in->started_ns = uv_hrtime();
    in->ready_ns = 0;
    in->stop_requested = 0;
    in->term_sent = 0;
    IG_INFO("instance %s: discovered at %s; probing /ready", in->name, in->listen);
    set_state(in, IG_INSTANCE_STARTING);
    schedule_poll(in, 0);
    return 0;
}

static ig_instance_t *remote_find(ig_pool_t *p, const char *device)
{
    for (int i = 0; i < p->spec.ndevices; i++) {
        ig_instance_t *in = &p->inst[i];
        if (in->in_use && !in->remote_closing && in->state != IG_INSTANCE_STOPPED &&
            strcmp(in->device, device) == 0)
            return in;
    }
    return NULL;
}

/* One authoritative answer for the pool's name: the whole set. */
static void on_discovered(void *data, const ig_discover_addr_t *addrs, int n)
{
    ig_pool_t *p = data;
    if (p->closing)
        return;
    char dev[sizeof(p->inst[0].device)];
    for (int i = 0; i < p->spec.ndevices; i++) {
        ig_instance_t *in = &p->inst[i];
        if (!in->in_use || in->remote_closing || in->state == IG_INSTANCE_STOPPED ||
            in->state == IG_INSTANCE_DRAINING)
            continue;
        int listed = 0;
        for (int k = 0; k < n && !listed; k++) {
            remote_device(p, &addrs[k], dev, sizeof(dev));
            listed = strcmp(dev, in->device) == 0;
        }
        if (!listed) {
            IG_INFO("instance %s: %s is no longer in %s; draining", in->name, in->device,
                    p->spec.discover_dns);
            ig_pool_drain(p, i);
        }
    }
    for (int k = 0; k < n; k++) {
        remote_device(p, &addrs[k], dev, sizeof(dev));
        ig_instance_t *in = remote_find(p, dev);
        if (in != NULL && in->state == IG_INSTANCE_DRAINING && in->ready_ns != 0) {
            IG_INFO("instance %s: %s is listed again; serving again", in->name, in->device);
            set_state(in, IG_INSTANCE_READY);
            schedule_poll(in, 0);
            continue;
        }
        if (in != NULL)
            continue;
        int rc = remote_attach(p, &addrs[k]);
        if (rc == IG_EFULL)
            IG_WARN("pool %s: %s has more addresses than max_instances (%d); %s left out",
                    p->spec.name, p->spec.discover_dns, p->spec.ndevices, dev);
        else if (rc != 0)
            IG_WARN("pool %s: %s: %s", p->spec.name, dev, ig_strerror(rc));
    }
}

int ig__pool_start_discovered(ig_pool_t **out, uv_loop_t *loop, const ig_pool_spec_t *spec,
                              ig_pool_event_cb cb, void *data)
{
    int slots = spec->max_instances > 0 ? spec->max_instances : 64;
    if (spec->discover_port < 0 || spec->discover_port > 65535)
        return IG_EINVAL;
    ig_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return IG_ENOMEM;
    p->loop = loop;
    p->remote = 1;
    p->spec = *spec;
    p->spec.ndevices = slots;
    p->spec.min_instances = 0;
    p->spec.max_instances = slots;
    spec_copy_strings(p, spec);
    if (spec->upstream != NULL)
        p->uo = *spec->upstream;
    else
        ig_upstream_opts_default(&p->uo);
    p->spec.upstream = NULL;
    if (p->spec.load_poll_ms == 0)
        p->spec.load_poll_ms = 500;
    p->devices = calloc((size_t)slots, sizeof(char *));
    p->inst = calloc((size_t)slots, sizeof(ig_instance_t));
    int rc = IG_ENOMEM;
    if (p->devices == NULL || p->inst == NULL || p->spec.discover_dns == NULL)
        goto fail;
    for (int i = 0; i < slots; i++) {
        if ((p->devices[i] = strdup("dns")) == NULL)
            goto fail;
    }
    p->spec.devices = (const char *const *)p->devices;
    p->cb = cb;
    p->cb_data = data;
    for (int i = 0; i < slots; i++) {
        ig_instance_t *in = &p->inst[i];
        in->pool = p;
        in->index = i;
        in->remote = 1;
        snprintf(in->name, sizeof(in->name), "%s/%d", spec->name, i);
        snprintf(in->device, sizeof(in->device), "dns:%s", spec->discover_dns);
        ig_router_upstream_init(&in->route, in->name, IG_ROUTER_LOCAL);
        ig_load_init(&in->load);
    }
    for (int i = 0; i < slots; i++) {
        uv_timer_init(loop, &p->inst[i].timer);
        p->inst[i].timer.data = &p->inst[i];
        p->open_handles++;
    }
    if ((rc = remote_pool_start(p)) != 0) {
        ig_pool_close(p, 0, NULL, NULL);
        return rc;
    }
    *out = p;
    return 0;
fail:
    pool_free(p);
    return rc;
}

static int remote_pool_start(ig_pool_t *p)
{
    ig_discover_spec_t ds;
    memset(&ds, 0, sizeof(ds));
    ds.name = p->spec.discover_dns;
    ds.port = p->spec.discover_port;
    ds.interval_ms = p->spec.discover_interval_ms;
    ds.resolver = p->spec.discover_resolver;
    int rc = ig_discover_start(&p->discover, p->loop, &ds, on_discovered, p);
    char port[32] = "ports from SRV records";
    if (ds.port > 0)
        snprintf(port, sizeof(port), "port %d", ds.port);
    if (rc == 0)
        IG_INFO("pool %s: instances from DNS %s%s%s, %s, every %llu ms", p->spec.name, ds.name,
                ds.resolver ? " at " : "", ds.resolver ? ds.resolver : "", port,
                (unsigned long long)ds.interval_ms);
    return rc;
}

void ig_pool_discover_stop(ig_pool_t *p)
{
    ig_discover_close(p->discover);
    p->discover = NULL;
}

int ig_pool_discovered(const ig_pool_t *p)
{
    return p->remote;
}
