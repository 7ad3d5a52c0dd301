#ifndef INFERGATE_CONFIG_H
#define INFERGATE_CONFIG_H

/*
 * The configuration of one region: one JSON file, parsed and validated into a
 * plain struct. Every key is checked: unknown keys, wrong types, values out
 * of range and broken cross-references (a pool naming no model, duplicate
 * names) are errors. An error message names the file, the JSON path and the
 * problem, e.g.
 *
 *   config/us-east.json: pools[0].max_instances: must be >= min_instances (1)
 *
 * and JSON syntax errors name FILE:LINE:COLUMN. docs/config.md lists every
 * key with its type, default and meaning.
 *
 * Ownership: ig_config_t owns every string and array it points to;
 * ig_config_dispose() frees them. A struct that failed to load holds nothing
 * (it is safe, not required, to dispose it).
 */

#include <stddef.h>
#include <stdint.h>

#include "infergate/cost.h"  /* ig_price_t */
#include "infergate/dtype.h" /* ig_dtype_t */
#include "infergate/http.h"
#include "infergate/router.h" /* ig_route_policy_t */

/* Where an instance of a pool runs. */
typedef enum {
    IG_DEVICE_CPU = 0, /* "cpu" or "cpu:THREADS" */
    IG_DEVICE_CUDA,    /* "cuda:N" */
    IG_DEVICE_MIG,     /* "MIG-<uuid>": one MIG slice, CUDA_VISIBLE_DEVICES=spec */
} ig_device_kind_t;

typedef struct {
    ig_device_kind_t kind;
    int index;  /* CUDA ordinal (cuda:N); CPU threads (cpu:N, 0 = the pool's threads) */
    char *spec; /* as written: "cpu", "cpu:8", "cuda:0", "MIG-<uuid>" */
} ig_config_device_t;

typedef struct {
    char *name;   /* the "model" of API requests */
    char *path;   /* model directory (HF layout), expanded; NULL: only sites serve it */
    char *preset; /* mkmodel preset generated into path when path is missing; or NULL */
    /* A rollout: entries of one name are versions, each with its own path;
     * requests split by weight unless x-infergate-model-version pins one. */
    char *version;  /* NULL: the model has one entry */
    double weight;  /* share of the requests among its versions (default 1) */
    char *quantize; /* "q8_0": workers quantize the weights at load; NULL = as stored */
} ig_config_model_t;

/* Per-instance continuous-batching settings (the worker's scheduler). */
typedef struct {
    unsigned max_batched_tokens; /* tokens per forward pass (prefill chunks + decodes), at most */
    unsigned itl_target_ms;      /* stall-free batching's step budget while decoding; 0 = off */
    unsigned max_num_seqs;       /* sequences running together */
    unsigned kv_blocks;          /* KV cache blocks; 0 = sized from free memory */
    unsigned block_size;         /* tokens per KV block (power of two) */
    unsigned max_waiting;        /* queued requests before 429 */
    ig_dtype_t kv_dtype;         /* KV cache elements: F32 (default), F16 or BF16 ("kv_dtype") */
} ig_config_batching_t;

/* Queue-depth autoscaler of a pool (Knative-style stable/panic windows). */
typedef struct {
    double target_queue_depth;    /* desired in-flight + waiting per instance */
    double stable_window_s;       /* averaging window for normal decisions */
    double panic_window_s;        /* short window for bursts (<= stable_window_s) */
    double panic_threshold;       /* desired/ready ratio that enters panic mode */
    double max_scale_up_rate;     /* at most ready * rate instances after one step */
    double scale_down_delay_s;    /* demand must stay low this long to scale down */
    double scale_to_zero_after_s; /* idle time before the last instance goes (min 0) */
} ig_config_autoscale_t;

/* A pool whose instances are found in DNS (a Kubernetes headless Service):
 * every A/AAAA record of dns is an instance at that address and port. */
typedef struct {
    char *dns;         /* NULL: the pool starts local workers */
    int port;          /* the instances' HTTP port */
    double interval_s; /* re-resolved this often */
    char *resolver;    /* "IP:PORT" of a DNS server to ask directly; NULL: the
                          system's resolver (getaddrinfo through libuv) */
} ig_config_discover_t;

typedef struct {
    char *name;
    char *model;        /* a models[].name */
    size_t model_index; /* index of that model in ig_config_t.models */
    ig_config_device_t *devices;
    size_t ndevices;  /* one instance per entry at most */
    unsigned threads; /* CPU threads per CPU instance; 0 = all cores */
    unsigned min_instances;
    unsigned max_instances;
    ig_config_batching_t batching;
    ig_config_autoscale_t autoscale;
    char *version; /* the models[].version it serves; NULL when the model has none */
    ig_config_discover_t discover;
    ig_price_t price; /* per instance; IG_PRICE_NONE: unpriced */
} ig_config_pool_t;

/* A remote site: another region's gateway or any OpenAI-compatible server. */
typedef struct {
    char *name;
    char *url;     /* as written, without a trailing '/' */
    char *host;    /* from the url; brackets of an IPv6 literal removed */
    int port;      /* from the url (80 when absent) */
    char *base;    /* path prefix from the url ("" or "/prefix") */
    char *region;  /* "" when not given */
    char **models; /* models[].name entries this site serves */
    size_t nmodels;
    int https;     /* the url is https:// (port 443 when absent) */
    char *api_key; /* sent as Authorization: Bearer; NULL: none */
    struct {
        char *ca_file;     /* verify against it; NULL: the system's CAs */
        char *server_name; /* the name the certificate must carry; NULL: the url's host */
        int insecure;      /* no verification (tests only) */
    } tls;
    ig_price_t price; /* the whole site's; IG_PRICE_NONE: unpriced */
} ig_config_site_t;

typedef struct {
    ig_route_policy_t policy;
    int objective_cost;  /* routing.objective "cost" (0: "latency") */
    double slo_ttft_ms;  /* the TTFT the cost objective must keep (0: none) */
    double retry_budget;  /* retries allowed as a fraction of requests (0..1) */
    unsigned max_retries; /* per request */
    struct {
        int enabled;
        double budget;         /* hedged copies as a fraction of requests (0..1) */
        double delay_quantile; /* hedge after this TTFT quantile of the upstream */
    } hedge;
    struct {
        unsigned consecutive_failures; /* failures in a row that eject an upstream */
        double base_ejection_s;        /* first ejection; doubles on each repeat */
    } eject;
    uint64_t connect_timeout_ms;
    uint64_t first_token_timeout_ms;
    uint64_t idle_timeout_ms;  /* pooled upstream connections */
    uint64_t total_timeout_ms; /* whole request */
    unsigned queue_size;       /* requests the gateway holds while no upstream is ready */
    uint64_t queue_timeout_ms; /* the longest one is held (a cold start must fit) */
    /* The adaptive concurrency limit per upstream (docs/routing.md);
     * defaults from ig_router_opts_default(). */
    struct {
        int enabled;      /* 0: no limit (the router's limit_max 0) */
        unsigned initial; /* after calibration, before the first window */
        unsigned min;     /* never below */
        unsigned max;     /* never above */
    } concurrency_limit;
    uint64_t rtt_probe_ms; /* the cheap RTT probe of an idle plain site; 0 = off */
    double explore_ratio;  /* decisions that may explore a stale idle upstream; 0 = off */
    double tail_weight;    /* standard deviations of the TTFT the latency pick adds; 0 = off */
} ig_config_routing_t;

typedef struct {
    ig_http_limits_t http;      /* the HTTP server's limits */
    uint64_t drain_grace_ms;    /* after SIGTERM: still accepting, /ready 503 (for probes) */
    uint64_t drain_timeout_ms;  /* then: the listener is closed, in-flight work has this long */
    unsigned max_prompt_tokens; /* 0 = the model's context length */
    /* Admission by predicted wait, per IG_PRIORITY_*: a request whose best
     * predicted wait is longer gets 429 at once (0: no such limit). */
    uint64_t max_queue_wait_ms[3];
} ig_config_limits_t;

/* The listener's TLS (docs/security.md). */
typedef struct {
    char *cert_file; /* PEM: the certificate, then its chain */
    char *key_file;  /* PEM private key */
    uint64_t handshake_timeout_ms;
} ig_config_tls_t;

enum { IG_PRIORITY_CRITICAL = 0, IG_PRIORITY_STANDARD, IG_PRIORITY_SHEDDABLE };

/* The policy of one API key (docs/security.md). Limits of 0 are none. */
typedef struct {
    char *name;            /* metrics and logs say this, never the key ("key-N" by default) */
    int peer;              /* a peer gateway: its x-infergate-forwarded counts */
    double requests_per_s; /* token bucket refill */
    double burst;          /* bucket size in requests (0: max(1, requests_per_s)) */
    double tokens_per_min; /* prompt plus generated tokens */
    char **models;         /* allow-list; empty: every model */
    size_t nmodels;
    int priority; /* IG_PRIORITY_* */
    int admin;    /* may read /status, /load and /metrics */
    double budget_usd; /* spend allowed per budget_period (0: none) */
    int budget_period; /* IG_BUDGET_* */
} ig_config_key_t;

enum { IG_BUDGET_HOUR = 0, IG_BUDGET_DAY, IG_BUDGET_MONTH }; /* calendar periods, UTC */

typedef struct {
    char *source; /* file name (or the name given to ig_config_load_string) */
    char *region;
    char *listen; /* "HOST:PORT" or "unix:PATH" */
    ig_config_model_t *models;
    size_t nmodels;
    ig_config_pool_t *pools;
    size_t npools;
    ig_config_site_t *sites;
    size_t nsites;
    ig_config_routing_t routing;
    ig_config_limits_t limits;
    char **api_keys; /* empty: no authentication */
    size_t napi_keys;
    struct {
        int level;  /* ig_log_level_t */
        int format; /* ig_log_format_t */
    } log;
    ig_config_tls_t tls;   /* cert_file NULL: the listener speaks plain HTTP */
    ig_config_key_t *keys; /* the policy of api_keys[i] is keys[i] (napi_keys of them) */
    int admin_open;        /* no key has admin: /status, /load, /metrics stay open */
} ig_config_t;

/*
 * Loads and validates a config file. On failure returns IG_ECONFIG (invalid
 * content), IG_ENOENT/IG_EIO (unreadable) or IG_ENOMEM, writes one line
 * (without a newline) into err, and leaves cfg empty.
 */
int ig_config_load_file(ig_config_t *cfg, const char *path, char *err, size_t errlen);

/* The same from a string; `name` stands for the file name in messages, and
 * relative model paths are relative to the working directory. */
int ig_config_load_string(ig_config_t *cfg, const char *json, const char *name, char *err,
                          size_t errlen);

/* Loads the embedded default config (ig_config_default_json). */
int ig_config_load_default(ig_config_t *cfg, char *err, size_t errlen);

/* Frees what cfg owns and zeroes it. */
void ig_config_dispose(ig_config_t *cfg);

/* The CPU threads of one plain "cpu" instance under cfg's pools:
 * ig_devices_cpu_threads (include/infergate/devices.h) over cfg->pools, 1
 * when out of memory (gateway/serve/devices_cmd.c). */
int ig_devices_cpu_share(const ig_config_t *cfg, long cores);

/* Checks a listen address ("HOST:PORT" with an IPv4 or [IPv6] literal, or
 * "unix:PATH"). 0 or IG_EINVAL with the problem in err. */
int ig_config_check_listen(const char *listen, char *err, size_t errlen);

/* Index of a model by name, or -1. */
int ig_config_find_model(const ig_config_t *cfg, const char *name);

/* The cache directory generated models go to ("@cache" in model paths):
 * $INFERGATE_CACHE_DIR, else $XDG_CACHE_HOME/infergate, else
 * $HOME/.cache/infergate. Writes it into buf; IG_ENOENT when none is set,
 * IG_ERANGE when buf is too small. */
int ig_config_cache_dir(char *buf, size_t size);

/* What a reload must do about a pool of config a that pools[] of config b
 * names alike: nothing, only hand the autoscaler new parameters, or start
 * new instances (model path or quantize, devices, threads, instance bounds,
 * batching, discover, limits.max_prompt_tokens differ). */
enum { IG_CONFIG_POOL_SAME = 0, IG_CONFIG_POOL_AUTOSCALE = 1, IG_CONFIG_POOL_RESTART = 2 };
int ig_config_pool_diff(const ig_config_t *a, const ig_config_pool_t *pa, const ig_config_t *b,
                        const ig_config_pool_t *pb);

/* 1 when two sites are the same (name, url, region and models). */
int ig_config_site_same(const ig_config_site_t *a, const ig_config_site_t *b);

/* The embedded default config (gateway/serve/config_default.c). */
extern const char ig_config_default_json[];

#endif
