/*
 * API keys: lookup in constant time, token buckets for requests and
 * tokens, the model allow-list (include/infergate/keys.h).
 */
#include "infergate/keys.h"
#include "infergate/error.h"
#include "infergate/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>

typedef struct {
    double rate;   /* per second */
    double cap;    /* bucket size */
    double level;  /* what it holds now */
    uint64_t last; /* ns of the last refill */
} bucket_t;

struct ig_key_s {
    const ig_config_key_t *policy;
    const char *secret;
    bucket_t requests; /* rate 0: no limit */
    bucket_t tokens;
    double spent;    /* USD in the budget period `period` */
    long long period; /* the period's number (ig_key_period()); -1: none yet */
};

struct ig_keys_s {
    ig_key_t *keys;
    size_t n;
};

static ig_metric_t *m_requests, *m_tokens, *m_limited, *m_spend;

/* The number of the calendar period (UTC) holding unix second t, and the
 * unix second it ends. */
static long long key_period(int kind, time_t t, time_t *end)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    if (kind == IG_BUDGET_HOUR) {
        *end = (t / 3600 + 1) * 3600;
        return (long long)(t / 3600);
    }
    if (kind == IG_BUDGET_DAY) {
        *end = (t / 86400 + 1) * 86400;
        return (long long)(t / 86400);
    }
    struct tm next = {.tm_year = tm.tm_mon == 11 ? tm.tm_year + 1 : tm.tm_year,
                      .tm_mon = (tm.tm_mon + 1) % 12,
                      .tm_mday = 1};
    *end = timegm(&next);
    return (long long)tm.tm_year * 12 + tm.tm_mon;
}

/* The key's spend in the current period (a new period starts at 0). */
static double key_spent(ig_key_t *key, time_t now, time_t *end)
{
    long long p = key_period(key->policy->budget_period, now, end);
    if (p != key->period) {
        key->period = p;
        key->spent = 0;
    }
    return key->spent;
}

void ig_key_charge(ig_key_t *key, double usd, time_t now)
{
    time_t end;
    if (!(usd > 0))
        return;
    key_spent(key, now, &end);
    key->spent += usd;
    if (m_spend != NULL)
        ig_metric_add(m_spend, usd, key->policy->name);
}

double ig_key_spent(ig_key_t *key, time_t now)
{
    time_t end;
    return key_spent(key, now, &end);
}

void ig_keys_carry_spend(ig_keys_t *to, const ig_keys_t *from)
{
    for (size_t i = 0; i < to->n; i++) {
        for (size_t j = 0; from != NULL && j < from->n; j++) {
            if (strcmp(to->keys[i].policy->name, from->keys[j].policy->name) == 0) {
                to->keys[i].spent = from->keys[j].spent;
                to->keys[i].period = from->keys[j].period;
            }
        }
    }
}

static void bucket_init(bucket_t *b, double rate, double cap)
{
    b->rate = rate;
    b->cap = cap;
    b->level = cap;
    b->last = 0;
}

static void bucket_refill(bucket_t *b, uint64_t now)
{
    if (b->last != 0 && now > b->last)
        b->level = fmin(b->cap, b->level + b->rate * (double)(now - b->last) / 1e9);
    b->last = now;
}

static void bucket_describe(const bucket_t *b, const char *which, ig_key_limit_t *out)
{
    out->which = which;
    out->limit = b->cap;
    out->remaining = b->level > 0 ? floor(b->level) : 0;
    out->reset_s = b->rate > 0 ? (b->cap - b->level) / b->rate : 0;
    out->retry_after = 0;
}

int ig_keys_new(ig_keys_t **out, const ig_config_t *cfg)
{
    *out = NULL;
    ig_keys_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return IG_ENOMEM;
    k->keys = calloc(cfg->napi_keys ? cfg->napi_keys : 1, sizeof(*k->keys));
    if (k->keys == NULL) {
        free(k);
        return IG_ENOMEM;
    }
    k->n = cfg->napi_keys;
    for (size_t i = 0; i < k->n; i++) {
        ig_key_t *key = &k->keys[i];
        const ig_config_key_t *p = &cfg->keys[i];
        key->policy = p;
        key->secret = cfg->api_keys[i];
        double burst = p->burst > 0 ? p->burst : fmax(1, p->requests_per_s);
        bucket_init(&key->requests, p->requests_per_s, burst);
        bucket_init(&key->tokens, p->tokens_per_min / 60.0, p->tokens_per_min);
        key->period = -1;
    }
    if (m_requests == NULL) {
        m_requests = ig_metrics_counter("infergate_key_requests_total",
                                        "Requests authenticated with each API key (by its "
                                        "name), by status.",
                                        "key,status");
        m_tokens =
            ig_metrics_counter("infergate_key_tokens_total",
                               "Prompt and generated tokens charged to each API key.", "key");
        m_limited = ig_metrics_counter("infergate_key_limited_total",
                                       "Requests refused by a key's limit (requests, tokens, "
                                       "budget, model).",
                                       "key,limit");
        m_spend = ig_metrics_counter("infergate_key_spend_usd_total",
                                     "Estimated cost of the answers charged to each API key, USD.",
                                     "key");
    }
    *out = k;
    return 0;
}

void ig_keys_free(ig_keys_t *k)
{
    if (k == NULL)
        return;
    free(k->keys);
    free(k);
}

size_t ig_keys_count(const ig_keys_t *k)
{
    return k->n;
}

/* Compares in time independent of where the strings differ (the length
 * of the given one shows; the configured ones' do not). */
static int same_secret(const char *given, size_t glen, const char *key)
{
    size_t klen = strlen(key);
    unsigned char diff = (unsigned char)(glen != klen);
    for (size_t i = 0; i < glen; i++)
        diff |= (unsigned char)(given[i] ^ key[i % (klen ? klen : 1)]);
    return diff == 0;
}

ig_key_t *ig_keys_find(ig_keys_t *k, const char *h)
{
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    size_t len = strlen(h);
    while (len > 0 && (h[len - 1] == ' ' || h[len - 1] == '\t'))
        len--;
    ig_key_t *found = NULL;
    /* No early exit: every key costs the same whether or not it matched. */
    for (size_t i = 0; i < k->n; i++) {
        int same = same_secret(h, len, k->keys[i].secret);
        if (same && found == NULL)
            found = &k->keys[i];
    }
    return found;
}

const ig_config_key_t *ig_key_policy(const ig_key_t *key)
{
    return key->policy;
}

int ig_key_allows_model(const ig_key_t *key, const char *model)
{
    const ig_config_key_t *p = key->policy;
    if (p->nmodels == 0)
        return 1;
    for (size_t i = 0; i < p->nmodels; i++) {
        if (strcmp(p->models[i], model) == 0)
            return 1;
    }
    if (m_limited != NULL)
        ig_metric_add(m_limited, 1, p->name, "model");
    return 0;
}

int ig_key_admit(ig_key_t *key, uint64_t now, ig_key_limit_t *req, ig_key_limit_t *why)
{
    bucket_t *b = &key->requests;
    memset(req, 0, sizeof(*req));
    if (key->policy->budget_usd > 0) {
        time_t t = time(NULL), end;
        if (key_spent(key, t, &end) >= key->policy->budget_usd) {
            memset(why, 0, sizeof(*why));
            why->which = "budget";
            why->limit = key->policy->budget_usd;
            why->remaining = 0;
            why->reset_s = why->retry_after = (double)(end - t);
            if (m_limited != NULL)
                ig_metric_add(m_limited, 1, key->policy->name, "budget");
            return IG_EFULL;
        }
    }
    if (b->rate <= 0)
        return 0;
    bucket_refill(b, now);
    if (b->level < 1) {
        bucket_describe(b, "requests", req);
        *why = *req;
        why->retry_after = (1 - b->level) / b->rate;
        if (m_limited != NULL)
            ig_metric_add(m_limited, 1, key->policy->name, "requests");
        return IG_EFULL;
    }
    b->level -= 1;
    bucket_describe(b, "requests", req);
    return 0;
}

int ig_key_reserve(ig_key_t *key, uint64_t now, int prompt, int max_tokens, ig_key_limit_t *tok,
                   ig_key_limit_t *why)
{
    bucket_t *b = &key->tokens;
    memset(tok, 0, sizeof(*tok));
    if (b->rate <= 0)
        return max_tokens;
    bucket_refill(b, now);
    double need = (double)prompt + (max_tokens > 0 ? 1 : 0);
    if (b->level < need || b->level <= 0) {
        bucket_describe(b, "tokens", tok);
        *why = *tok;
        /* Past the bucket's size it never passes: say a full refill. */
        why->retry_after = need > b->cap ? b->cap / b->rate : (need - b->level) / b->rate;
        if (m_limited != NULL)
            ig_metric_add(m_limited, 1, key->policy->name, "tokens");
        return IG_EFULL;
    }
    double room = floor(b->level - (double)prompt);
    int allowed = room < (double)max_tokens ? (int)room : max_tokens;
    b->level -= (double)prompt + allowed;
    bucket_describe(b, "tokens", tok);
    return allowed;
}

void ig_key_settle(ig_key_t *key, uint64_t now, double reserved, double used)
{
    bucket_t *b = &key->tokens;
    if (m_tokens != NULL && used > 0)
        ig_metric_add(m_tokens, used, key->policy->name);
    if (b->rate <= 0)
        return;
    bucket_refill(b, now);
    b->level = fmin(b->cap, b->level + reserved - used);
}

void ig_key_count(ig_key_t *key, int status)
{
    char st[16];
    snprintf(st, sizeof(st), "%d", status);
    if (m_requests != NULL)
        ig_metric_add(m_requests, 1, key->policy->name, st);
}

/* ---- one request's use -------------------------------------------------- */

/* Matches a fixed pattern across writes, then (num) reads the number after
 * it. The patterns have no prefix that repeats inside them, so one index
 * is a correct matcher. */
typedef struct {
    const char *pat;
    int len, m;
    int num;    /* reading digits */
    long value; /* last number read; -1: never seen */
} match_t;

struct ig_key_use_s {
    ig_key_t *key;
    double reserved;
    int prompt;
    long events;
    /* usage as Chat/Completions name it, and as the Responses API does */
    match_t event, prompt_tokens, completion_tokens, input_tokens, output_tokens;
};

static void match_init(match_t *m, const char *pat)
{
    m->pat = pat;
    m->len = (int)strlen(pat);
    m->m = 0;
    m->num = 0;
    m->value = -1;
}

/* 1 when the pattern completed at ch. */
static int match_step(match_t *m, char ch, int with_number)
{
    if (m->num) {
        if (ch >= '0' && ch <= '9') {
            m->value = m->value * 10 + (ch - '0');
            return 0;
        }
        if (ch == ' ' && m->value == 0)
            return 0;
        m->num = 0;
    }
    if (ch == m->pat[m->m]) {
        if (++m->m == m->len) {
            m->m = 0;
            if (with_number) {
                m->num = 1;
                m->value = 0;
            }
            return 1;
        }
        return 0;
    }
    m->m = ch == m->pat[0] ? 1 : 0;
    return 0;
}

static void on_body(ig_http_req_t *req, void *data, const char *bytes, size_t len)
{
    ig_key_use_t *u = data;
    if (bytes != NULL) {
        for (size_t i = 0; i < len; i++) {
            u->events += match_step(&u->event, bytes[i], 0);
            match_step(&u->prompt_tokens, bytes[i], 1);
            match_step(&u->completion_tokens, bytes[i], 1);
            match_step(&u->input_tokens, bytes[i], 1);
            match_step(&u->output_tokens, bytes[i], 1);
        }
        return;
    }
    int status = ig_http_req_status(req);
    if (u->completion_tokens.value < 0 && u->output_tokens.value >= 0) {
        u->completion_tokens.value = u->output_tokens.value;
        u->prompt_tokens.value = u->input_tokens.value;
    }
    double used;
    if (u->completion_tokens.value >= 0)
        used = (double)u->completion_tokens.value +
               (double)(u->prompt_tokens.value >= 0 ? u->prompt_tokens.value : u->prompt);
    else if (status >= 200 && status < 300)
        used = (double)u->prompt + (double)u->events;
    else
        used = 0;
    if (u->reserved > 0 || used > 0)
        ig_key_settle(u->key, uv_hrtime(), u->reserved, used);
    ig_key_count(u->key, status != 0 ? status : 499);
}

ig_key_use_t *ig_key_track(ig_key_t *key, ig_http_req_t *req)
{
    ig_key_use_t *u = ig_http_req_alloc(req, sizeof(*u));
    if (u == NULL)
        return NULL;
    memset(u, 0, sizeof(*u));
    u->key = key;
    match_init(&u->event, "data: {");
    match_init(&u->prompt_tokens, "\"prompt_tokens\":");
    match_init(&u->completion_tokens, "\"completion_tokens\":");
    match_init(&u->input_tokens, "\"input_tokens\":");
    match_init(&u->output_tokens, "\"output_tokens\":");
    ig_http_req_set_data(req, u);
    ig_http_req_on_body(req, on_body, u);
    return u;
}

ig_key_t *ig_key_use_key(const ig_key_use_t *u)
{
    return u->key;
}

int ig_key_use_reserve(ig_key_use_t *u, uint64_t now, int prompt, int max_tokens,
                       ig_key_limit_t *tok, ig_key_limit_t *why)
{
    int allowed = ig_key_reserve(u->key, now, prompt, max_tokens, tok, why);
    if (allowed >= 0 && u->key->tokens.rate > 0) {
        u->reserved = (double)prompt + allowed;
        u->prompt = prompt;
    } else {
        u->prompt = prompt;
    }
    return allowed;
}

void ig_key_limit_headers(ig_http_req_t *req, const ig_key_limit_t *lim)
{
    char name[64], v[32];
    if (lim->which == NULL || lim->limit <= 0)
        return;
    snprintf(name, sizeof(name), "x-ratelimit-limit-%s", lim->which);
    snprintf(v, sizeof(v), "%.0f", lim->limit);
    ig_http_add_header(req, name, v);
    snprintf(name, sizeof(name), "x-ratelimit-remaining-%s", lim->which);
    snprintf(v, sizeof(v), "%.0f", lim->remaining);
    ig_http_add_header(req, name, v);
    snprintf(name, sizeof(name), "x-ratelimit-reset-%s", lim->which);
    snprintf(v, sizeof(v), "%.3fs", lim->reset_s);
    ig_http_add_header(req, name, v);
}
