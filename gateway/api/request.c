/*
 * OpenAI request parsing and validation into one ig_api_request_t, errors,
 * and the canonical JSON a gateway forwards upstream.
 */
#include "infergate/api.h"
#include "infergate/error.h"
#include "infergate/jsonv.h"
#include "infergate/utf8.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- errors --------------------------------------------------------------- */

const char *ig_api_error_type(int status)
{
    switch (status) {
    case 400:
    case 413:
    case 422:
        return "invalid_request_error";
    case 401:
    case 403:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "unavailable_error";
    case 504:
        return "timeout_error";
    default:
        return "server_error";
    }
}

int ig_api_error(ig_api_error_t *err, int status, const char *param, const char *fmt, ...)
{
    err->status = status;
    err->type = ig_api_error_type(status);
    err->code = NULL;
    err->retry_after_s = 0;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return IG_EINVAL;
}

int ig_api_error_oom(ig_api_error_t *err)
{
    ig_api_error(err, 503, NULL, "out of memory");
    err->retry_after_s = 1;
    return IG_ENOMEM;
}

json_t *ig_api_error_json(const ig_api_error_t *err)
{
    json_t *e = json_object();
    if (!e)
        return NULL;
    json_object_set_new(e, "message", json_string(err->message));
    json_object_set_new(e, "type",
                        json_string(err->type ? err->type : ig_api_error_type(err->status)));
    json_object_set_new(e, "param", err->param[0] ? json_string(err->param) : json_null());
    json_object_set_new(e, "code", err->code ? json_string(err->code) : json_integer(err->status));
    json_t *root = json_object();
    if (!root) {
        json_decref(e);
        return NULL;
    }
    json_object_set_new(root, "error", e);
    return root;
}

/* ---- ids ------------------------------------------------------------------ */

void ig_api_make_id(char *buf, size_t cap, const char *prefix)
{
    /* Not a secret, only unique: a per-process random base and a counter,
     * mixed so that consecutive ids do not look sequential. */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t state, counter;
    pthread_mutex_lock(&mu);
    if (!state) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        state = ((uint64_t)ts.tv_sec * 1000000007ULL) ^ (uint64_t)ts.tv_nsec ^
                ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ULL;
    }
    uint64_t n = ++counter;
    pthread_mutex_unlock(&mu);
    uint64_t a = state + n * 0x9e3779b97f4a7c15ULL, b = a ^ (n << 17);
    for (int i = 0; i < 2; i++) {
        a = (a ^ (a >> 30)) * 0xbf58476d1ce4e5b9ULL;
        b = (b ^ (b >> 27)) * 0x94d049bb133111ebULL;
    }
    snprintf(buf, cap, "%s%016llx%08llx", prefix, (unsigned long long)(a ^ (a >> 31)),
             (unsigned long long)((b ^ (b >> 31)) & 0xffffffffULL));
}

/* ---- field readers -------------------------------------------------------- */

/* Each reader: absent or null leaves *out untouched and returns 0; a value of
 * the wrong type or range fills err (param = the field) and returns
 * IG_EINVAL. */

/* The api's sentences for what base/jsonv finds: param is the field's path. */
static int on_fault(ig_jsonv_t *v, const ig_jsonv_fault_t *f)
{
    ig_api_error_t *err = v->data;
    const char *p = f->path;
    if (f->kind == IG_JSONV_RANGE && f->want == IG_JSONV_INTEGER)
        return ig_api_error(err, 400, p, "'%s' must be between %lld and %lld, got %lld", p, f->lo,
                            f->hi, f->x);
    if (f->kind == IG_JSONV_RANGE)
        return ig_api_error(err, 400, p, "'%s' must be in %s%g, %g], got %g", p,
                            (f->flags & IG_JSONV_LO_OPEN) ? "(" : "[", f->dlo, f->dhi, f->dx);
    switch (f->want) {
    case IG_JSONV_INTEGER:
        return ig_api_error(err, 400, p, "'%s' must be an integer", p);
    case IG_JSONV_NUMBER:
        return ig_api_error(err, 400, p, "'%s' must be a number", p);
    case IG_JSONV_BOOLEAN:
        return ig_api_error(err, 400, p, "'%s' must be a boolean", p);
    default:
        return ig_api_error(err, 400, p, "'%s' is invalid", p);
    }
}

/* A request body's reader: null is absent, 16.0 is an integer. */
#define READER(name, err)                                                                          \
    ig_jsonv_t name = {IG_JSONV_NULL_ABSENT | IG_JSONV_INTEGRAL_REAL, on_fault, err}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                   ig_api_error_t *err)
{
    READER(v, err);
    return ig_jsonv_int(&v, o, "", key, 0, lo, hi, *out, out);
}

static int get_num(json_t *o, const char *key, double lo, double hi, int lo_open, double *out,
                   ig_api_error_t *err)
{
    READER(v, err);
    return ig_jsonv_number(&v, o, "", key, lo_open ? IG_JSONV_LO_OPEN : 0, lo, hi, *out, out);
}

static int get_bool(json_t *o, const char *key, int *out, ig_api_error_t *err)
{
    READER(v, err);
    return ig_jsonv_bool(&v, o, "", key, 0, *out, out);
}

static char *dup_utf8(json_t *s, size_t *len)
{
    size_t n = json_string_length(s);
    char *p = malloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, json_string_value(s), n);
    p[n] = 0;
    if (len)
        *len = n;
    return p;
}

/* A token-id list: non-empty, every entry a non-negative int. */
static int get_ids(json_t *arr, const char *param, int **ids, int *n, ig_api_error_t *err)
{
    size_t cnt = json_array_size(arr);
    if (cnt == 0)
        return ig_api_error(err, 400, param, "'%s' must not be empty", param);
    int *p = malloc(sizeof(int) * cnt);
    if (!p)
        return IG_ENOMEM;
    for (size_t i = 0; i < cnt; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > 0x7fffffff) {
            free(p);
            return ig_api_error(err, 400, param,
                                "'%s' token ids must be non-negative integers (entry %zu)", param,
                                i);
        }
        p[i] = (int)json_integer_value(v);
    }
    *ids = p;
    *n = (int)cnt;
    return 0;
}

/* A string field of at most max bytes into *out (malloc'ed). */
static int get_string(json_t *o, const char *key, size_t max, char **out, ig_api_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return ig_api_error(err, 400, key, "'%s' must be a string", key);
    if (json_string_length(v) > max)
        return ig_api_error(err, 400, key, "'%s' is longer than %zu bytes", key, max);
    if (!(*out = dup_utf8(v, NULL)))
        return IG_ENOMEM;
    return 1;
}

/* One logit_bias entry: a token id (0..2^31-1) and a bias -100..100. */
static int add_logit_bias(ig_api_request_t *r, long long id, json_t *v, const char *key,
                          ig_api_error_t *err)
{
    if (id < 0 || id > 0x7fffffff)
        return ig_api_error(err, 400, "logit_bias",
                            "'logit_bias' keys must be token ids (non-negative integers), "
                            "got \"%.32s\"",
                            key);
    if (!json_is_number(v) || json_number_value(v) < -100.0 || json_number_value(v) > 100.0)
        return ig_api_error(err, 400, "logit_bias",
                            "'logit_bias' values must be numbers from -100 to 100 (token %lld)",
                            id);
    ig_logit_bias_t *b = &r->sampling.logit_bias[r->sampling.nlogit_bias++];
    b->token = (int)id;
    b->bias = (float)json_number_value(v);
    return 0;
}

/* logit_bias: {"<token id>": -100..100} as OpenAI writes it, or
 * [[<token id>, -100..100], ...] as llama.cpp's server also takes it; at
 * most IG_API_MAX_LOGIT_BIAS entries. The ids are checked against the
 * vocabulary by whoever has it. */
static int parse_logit_bias(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *lb = json_object_get(root, "logit_bias");
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb) && !json_is_array(lb))
        return ig_api_error(err, 400, "logit_bias",
                            "'logit_bias' must be an object of token ids to biases");
    size_t n = json_is_object(lb) ? json_object_size(lb) : json_array_size(lb);
    if (n > IG_API_MAX_LOGIT_BIAS)
        return ig_api_error(err, 400, "logit_bias", "'logit_bias' has %zu entries; at most %d", n,
                            IG_API_MAX_LOGIT_BIAS);
    const char *key;
    json_t *v;
    int rc;
    if (json_is_array(lb)) {
        size_t i;
        json_array_foreach(lb, i, v)
        {
            json_t *id = json_array_get(v, 0);
            if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(id))
                return ig_api_error(err, 400, "logit_bias",
                                    "'logit_bias' as a list holds [token id, bias] pairs");
            if ((rc = add_logit_bias(r, json_integer_value(id), json_array_get(v, 1), "", err)) < 0)
                return rc;
        }
        return 0;
    }
    json_object_foreach(lb, key, v)
    {
        size_t klen = strlen(key), digits = strspn(key, "0123456789");
        long long id = digits == klen && klen && klen <= 10 ? strtoll(key, NULL, 10) : -1;
        if ((rc = add_logit_bias(r, id, v, key, err)) < 0)
            return rc;
    }
    return 0;
}

/* ---- common fields -------------------------------------------------------- */

/* What a gateway acts on: the model, the answer's length, stream, n and
 * best_of. Whoever has the body looks these members up (admission_of, or
 * a scan's spans in ig_api_peek); parse_admission reads them. */
enum {
    ADM_MODEL,
    ADM_MAX_TOKENS,
    ADM_MAX_COMPLETION_TOKENS,
    ADM_STREAM,
    ADM_N,
    ADM_BEST_OF,
    ADM_KEYS
};

static const char *const admission_keys[ADM_KEYS] = {
    "model", "max_tokens", "max_completion_tokens", "stream", "n", "best_of",
};

static void admission_of(json_t *root, json_t *m[ADM_KEYS])
{
    for (int i = 0; i < ADM_KEYS; i++)
        m[i] = json_object_get(root, admission_keys[i]);
}

static int get_int_at(json_t *value, const char *key, long long lo, long long hi, long long *out,
                      ig_api_error_t *err)
{
    READER(v, err);
    return ig_jsonv_int_at(&v, value, "", key, 0, lo, hi, *out, out);
}

/* m: the members admission_keys name (borrowed; NULL where absent). */
static int parse_admission(json_t *const m[ADM_KEYS], ig_api_request_t *r, ig_api_error_t *err)
{
    int rc;
    long long i = 0;
    json_t *model = m[ADM_MODEL];
    if (model && !json_is_null(model)) {
        if (!json_is_string(model))
            return ig_api_error(err, 400, "model", "'model' must be a string");
        if (!(r->model = dup_utf8(model, NULL)))
            return IG_ENOMEM;
    }

    /* max_tokens: chat prefers max_completion_tokens (the newer name). */
    int mk = ADM_MAX_TOKENS;
    if (r->kind == IG_API_CHAT && m[ADM_MAX_COMPLETION_TOKENS] &&
        !json_is_null(m[ADM_MAX_COMPLETION_TOKENS]))
        mk = ADM_MAX_COMPLETION_TOKENS;
    const char *mt = admission_keys[mk];
    if ((rc = get_int_at(m[mk], mt, -(1LL << 40), 1LL << 40, &i, err)) < 0)
        return rc;
    if (rc) {
        if (i <= 0)
            return ig_api_error(err, 400, mt, "'%s' must be at least 1, got %lld", mt, i);
        r->max_tokens = i > 0x3fffffff ? 0x3fffffff : (int)i;
        r->max_tokens_given = 1;
    }

    READER(v, err);
    if ((rc = ig_jsonv_bool_at(&v, m[ADM_STREAM], "", "stream", 0, r->stream, &r->stream)) < 0)
        return rc;
    if ((rc = get_int_at(m[ADM_N], "n", 1, IG_API_MAX_CHOICES, &i, err)) < 0)
        return rc;
    if (rc)
        r->n = (int)i;
    if ((rc = get_int_at(m[ADM_BEST_OF], "best_of", 1, IG_API_MAX_CHOICES, &i, err)) < 0)
        return rc;
    r->best_of = rc ? (int)i : r->n;
    if (r->best_of < r->n)
        return ig_api_error(err, 400, "best_of", "'best_of' (%d) must be at least 'n' (%d)",
                            r->best_of, r->n);
    return 0;
}

/* The sampling parameters and the seed: ranges only; whoever samples
 * decides what it honours. */
static int parse_sampling(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    int rc;
    long long i = 0;
    double d = 0;

    if ((rc = get_num(root, "temperature", 0.0, 100.0, 0, &d, err)) < 0)
        return rc;
    if (rc)
        r->sampling.temperature = (float)d;
    if ((rc = get_num(root, "top_p", 0.0, 1.0, 1, &d, err)) < 0)
        return rc;
    if (rc)
        r->sampling.top_p = (float)d;
    if ((rc = get_int(root, "top_k", -1, 1 << 30, &i, err)) < 0)
        return rc;
    if (rc)
        r->sampling.top_k = i < 0 ? 0 : (int)i;
    if ((rc = get_num(root, "min_p", 0.0, 1.0, 0, &d, err)) < 0)
        return rc;
    if (rc)
        r->sampling.min_p = (float)d;
    if ((rc = get_num(root, "repetition_penalty", 0.0, 100.0, 1, &d, err)) < 0)
        return rc;
    if (rc)
        r->sampling.repetition_penalty = (float)d;
    /* The OpenAI penalties (applied by the sampler, over generated tokens). */
    if ((rc = get_num(root, "frequency_penalty", -2.0, 2.0, 0, &d, err)) < 0)
        return rc;
    if (rc)
        r->sampling.frequency_penalty = (float)d;
    if ((rc = get_num(root, "presence_penalty", -2.0, 2.0, 0, &d, err)) < 0)
        return rc;
    if (rc)
        r->sampling.presence_penalty = (float)d;

    json_t *seed = json_object_get(root, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed))
            return ig_api_error(err, 400, "seed", "'seed' must be an integer");
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    return 0;
}

/* stop: one string or a list of at most IG_API_MAX_STOP, each 1 to
 * IG_API_MAX_STOP_LEN bytes. */
static int parse_stop(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *stop = json_object_get(root, "stop");
    if (!stop || json_is_null(stop))
        return 0;
    size_t n = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
    if (!json_is_string(stop) && !json_is_array(stop))
        return ig_api_error(err, 400, "stop", "'stop' must be a string or a list of strings");
    if (n > IG_API_MAX_STOP)
        return ig_api_error(err, 400, "stop", "'stop' has %zu entries; at most %d", n,
                            IG_API_MAX_STOP);
    if (n) {
        r->stop = calloc(n, sizeof(char *));
        if (!r->stop)
            return IG_ENOMEM;
    }
    for (size_t k = 0; k < n; k++) {
        json_t *s = json_is_string(stop) ? stop : json_array_get(stop, k);
        if (!json_is_string(s))
            return ig_api_error(err, 400, "stop", "'stop' entries must be strings");
        size_t len = json_string_length(s);
        if (len == 0 || len > IG_API_MAX_STOP_LEN)
            return ig_api_error(err, 400, "stop", "'stop' strings must be 1 to %d bytes long",
                                IG_API_MAX_STOP_LEN);
        if (!(r->stop[r->nstop] = dup_utf8(s, NULL)))
            return IG_ENOMEM;
        r->nstop++;
    }
    return 0;
}

static int parse_stop_token_ids(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *sids = json_object_get(root, "stop_token_ids");
    if (!sids || json_is_null(sids))
        return 0;
    if (!json_is_array(sids) || json_array_size(sids) > IG_API_MAX_STOP_IDS)
        return ig_api_error(err, 400, "stop_token_ids",
                            "'stop_token_ids' must be a list of at most %d token ids",
                            IG_API_MAX_STOP_IDS);
    if (json_array_size(sids) == 0)
        return 0;
    return get_ids(sids, "stop_token_ids", &r->stop_ids, &r->nstop_ids, err);
}

/* stream_options is only for a stream; include_usage is all it holds that
 * anyone reads. */
static int parse_stream_options(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *so = json_object_get(root, "stream_options");
    if (!so || json_is_null(so))
        return 0;
    if (!json_is_object(so))
        return ig_api_error(err, 400, "stream_options", "'stream_options' must be an object");
    if (!r->stream)
        return ig_api_error(err, 400, "stream_options",
                            "'stream_options' is only allowed when 'stream' is true");
    READER(v, err);
    return ig_jsonv_bool(&v, so, "stream_options", "include_usage", 0, r->include_usage,
                         &r->include_usage);
}

/* response_format: only its type is kept, so that a worker can refuse it
 * by name. */
static int parse_response_format(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *rf = json_object_get(root, "response_format");
    if (!rf || json_is_null(rf))
        return 0;
    json_t *type = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(type))
        return ig_api_error(err, 400, "response_format",
                            "'response_format' must be an object with a string 'type'");
    if (!(r->response_format = dup_utf8(type, NULL)))
        return IG_ENOMEM;
    return 0;
}

/* The fields completions and chat share, checked in this order (the first
 * bad one is the one the 400 names). */
static int parse_common(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    int rc;
    json_t *adm[ADM_KEYS];
    admission_of(root, adm);
    if ((rc = parse_admission(adm, r, err)) < 0 || (rc = parse_sampling(root, r, err)) < 0 ||
        (rc = parse_stop(root, r, err)) < 0 || (rc = parse_stop_token_ids(root, r, err)) < 0 ||
        (rc = get_bool(root, "ignore_eos", &r->ignore_eos, err)) < 0 ||
        (rc = parse_stream_options(root, r, err)) < 0 ||
        (rc = parse_logit_bias(root, r, err)) < 0 ||
        (rc = get_string(root, "user", 1 << 16, &r->user, err)) < 0 ||
        (rc = parse_response_format(root, r, err)) < 0)
        return rc;
    return 0;
}

/* ---- completions ---------------------------------------------------------- */

static int add_text_prompt(ig_api_request_t *r, json_t *s, const char *param, ig_api_error_t *err)
{
    ig_api_prompt_t *p = &r->prompts[r->nprompts];
    size_t len = json_string_length(s);
    /* jansson already refuses invalid UTF-8 in a body; this keeps the rule
     * explicit for callers that build requests some other way. */
    if (!ig_utf8_valid(json_string_value(s), len))
        return ig_api_error(err, 400, param, "'%s' is not valid UTF-8", param);
    if (!(p->text = dup_utf8(s, &p->text_len)))
        return IG_ENOMEM;
    r->nprompts++;
    return 0;
}

static int parse_prompt(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *pr = json_object_get(root, "prompt");
    if (!pr || json_is_null(pr))
        return ig_api_error(err, 400, "prompt", "'prompt' is required");
    size_t n;
    int ids_list = 0;
    if (json_is_string(pr)) {
        n = 1;
    } else if (json_is_array(pr)) {
        n = json_array_size(pr);
        if (n == 0)
            return ig_api_error(err, 400, "prompt", "'prompt' must not be empty");
        /* A list of integers is one token-id prompt; otherwise each entry is
         * a prompt of its own (a string or a token-id list). */
        if (json_is_integer(json_array_get(pr, 0))) {
            ids_list = 1;
            n = 1;
        }
    } else {
        return ig_api_error(err, 400, "prompt",
                            "'prompt' must be a string, a list of strings, a list of token ids "
                            "or a list of token-id lists");
    }
    if (n > IG_API_MAX_PROMPTS)
        return ig_api_error(err, 400, "prompt", "'prompt' has %zu prompts; at most %d", n,
                            IG_API_MAX_PROMPTS);
    r->prompts = calloc(n, sizeof(*r->prompts));
    if (!r->prompts)
        return IG_ENOMEM;
    if (json_is_string(pr))
        return add_text_prompt(r, pr, "prompt", err);
    if (ids_list) {
        int rc = get_ids(pr, "prompt", &r->prompts[0].ids, &r->prompts[0].nids, err);
        if (rc == 0)
            r->nprompts = 1;
        return rc;
    }
    for (size_t k = 0; k < n; k++) {
        json_t *e = json_array_get(pr, k);
        int rc;
        if (json_is_string(e)) {
            rc = add_text_prompt(r, e, "prompt", err);
        } else if (json_is_array(e)) {
            rc = get_ids(e, "prompt", &r->prompts[k].ids, &r->prompts[k].nids, err);
            if (rc == 0)
                r->nprompts++;
        } else {
            rc = ig_api_error(err, 400, "prompt",
                              "'prompt' entries must be all strings or all token-id lists");
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void request_init(ig_api_request_t *r, ig_api_kind_t kind)
{
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    ig_sampling_params_default(&r->sampling);
    r->max_tokens = kind == IG_API_COMPLETION ? 16 : 0;
    r->logprobs = -1;
    r->n = r->best_of = 1;
    r->parallel_tool_calls = -1;
}

static int invalid_json(ig_api_error_t *err, const json_error_t *je)
{
    return ig_api_error(err, 400, NULL, "invalid JSON body: %s (line %d, column %d)", je->text,
                        je->line, je->column);
}

static int not_an_object(ig_api_error_t *err)
{
    return ig_api_error(err, 400, NULL, "the request body must be a JSON object");
}

json_t *ig_api_load_object(const char *body, size_t len, ig_api_error_t *err)
{
    json_error_t je;
    json_t *root = ig_jsonv_loadb(body, len, &je);
    if (!root) {
        invalid_json(err, &je);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        not_an_object(err);
        return NULL;
    }
    return root;
}

static int parse_completion(json_t *root, ig_api_request_t *req, ig_api_error_t *err)
{
    int rc;
    long long i = 0;
    if ((rc = parse_prompt(root, req, err)) < 0 || (rc = parse_common(root, req, err)) < 0 ||
        (rc = get_int(root, "logprobs", 0, IG_API_MAX_LOGPROBS, &i, err)) < 0)
        return rc;
    if (rc)
        req->logprobs = (int)i;
    if ((rc = get_bool(root, "echo", &req->echo, err)) < 0)
        return rc;
    json_t *sfx = json_object_get(root, "suffix");
    if (sfx && !json_is_null(sfx)) {
        if (!json_is_string(sfx))
            return ig_api_error(err, 400, "suffix", "'suffix' must be a string");
        if (!(req->suffix = dup_utf8(sfx, NULL)))
            return IG_ENOMEM;
    }
    return 0;
}

/* ---- chat ----------------------------------------------------------------- */

static int parse_content(json_t *c, char **out, size_t idx, ig_api_error_t *err)
{
    if (!c || json_is_null(c)) {
        *out = strdup("");
        return *out ? 0 : IG_ENOMEM;
    }
    if (json_is_string(c)) {
        *out = dup_utf8(c, NULL);
        return *out ? 0 : IG_ENOMEM;
    }
    if (!json_is_array(c))
        return ig_api_error(err, 400, "messages",
                            "messages[%zu].content must be a string or a list of parts", idx);
    size_t total = 0, n = json_array_size(c);
    for (size_t k = 0; k < n; k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return ig_api_error(err, 400, "messages",
                                "messages[%zu].content[%zu] must be an object with a 'type'", idx,
                                k);
        if (strcmp(json_string_value(type), "text") != 0)
            return ig_api_error(err, 400, "messages",
                                "messages[%zu].content[%zu]: content type '%s' is not supported "
                                "(text only)",
                                idx, k, json_string_value(type));
        if (!json_is_string(text))
            return ig_api_error(err, 400, "messages",
                                "messages[%zu].content[%zu].text must be a string", idx, k);
        total += json_string_length(text);
    }
    char *p = malloc(total + 1);
    if (!p)
        return IG_ENOMEM;
    size_t off = 0;
    for (size_t k = 0; k < n; k++) {
        json_t *text = json_object_get(json_array_get(c, k), "text");
        memcpy(p + off, json_string_value(text), json_string_length(text));
        off += json_string_length(text);
    }
    p[off] = 0;
    *out = p;
    return 0;
}

/* A bounded name (function name, call id): a non-empty string. */
static int get_name(json_t *v, char **out, ig_api_error_t *err, const char *param, const char *what)
{
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > IG_API_MAX_NAME)
        return ig_api_error(err, 400, param, "%s must be a string of 1 to %d bytes", what,
                            IG_API_MAX_NAME);
    *out = dup_utf8(v, NULL);
    return *out ? 0 : IG_ENOMEM;
}

/* JSON text of v (compact, keys in the client's order); NULL when out of
 * memory. */
static char *dump_json(json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* An assistant message's tool_calls: [{id, type: "function", function:
 * {name, arguments}}], arguments a string (JSON text) as OpenAI sends it,
 * or an object, which is kept as its JSON text. */
static int parse_tool_calls(json_t *tc, ig_api_message_t *msg, size_t idx, ig_api_error_t *err)
{
    if (!tc || json_is_null(tc))
        return 0;
    if (!json_is_array(tc))
        return ig_api_error(err, 400, "messages", "messages[%zu].tool_calls must be a list", idx);
    size_t n = json_array_size(tc);
    if (n > IG_API_MAX_TOOL_CALLS)
        return ig_api_error(err, 400, "messages",
                            "messages[%zu].tool_calls has %zu entries; at most %d", idx, n,
                            IG_API_MAX_TOOL_CALLS);
    if (n == 0)
        return 0;
    if (!(msg->tool_calls = calloc(n, sizeof(*msg->tool_calls))))
        return IG_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(tc, k);
        json_t *fn = json_object_get(c, "function");
        json_t *id = json_object_get(c, "id");
        json_t *type = json_object_get(c, "type");
        char what[96];
        snprintf(what, sizeof(what), "messages[%zu].tool_calls[%zu]", idx, k);
        if (!json_is_object(c) || !json_is_object(fn))
            return ig_api_error(err, 400, "messages", "%s must be an object with a 'function'",
                                what);
        if (type && !json_is_null(type) &&
            (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0))
            return ig_api_error(err, 400, "messages", "%s.type must be \"function\"", what);
        ig_api_tool_call_t *t = &msg->tool_calls[msg->ntool_calls++];
        int rc;
        snprintf(what, sizeof(what), "messages[%zu].tool_calls[%zu].function.name", idx, k);
        if ((rc = get_name(json_object_get(fn, "name"), &t->name, err, "messages", what)) < 0)
            return rc;
        if (id && !json_is_null(id)) {
            snprintf(what, sizeof(what), "messages[%zu].tool_calls[%zu].id", idx, k);
            if ((rc = get_name(id, &t->id, err, "messages", what)) < 0)
                return rc;
        } else if (!(t->id = strdup(""))) {
            return IG_ENOMEM;
        }
        json_t *args = json_object_get(fn, "arguments");
        if (json_is_string(args))
            t->arguments = dup_utf8(args, NULL);
        else if (!args || json_is_null(args))
            t->arguments = strdup("{}");
        else if (json_is_object(args))
            t->arguments = dump_json(args);
        else
            return ig_api_error(err, 400, "messages",
                                "messages[%zu].tool_calls[%zu].function.arguments must be a "
                                "string of JSON",
                                idx, k);
        if (!t->arguments)
            return IG_ENOMEM;
    }
    return 0;
}

static int parse_messages(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    static const char *roles[] = {"system", "user", "assistant", "tool", "developer", NULL};
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs || json_is_null(msgs))
        return ig_api_error(err, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return ig_api_error(err, 400, "messages", "'messages' must be a non-empty list");
    size_t n = json_array_size(msgs);
    r->messages = calloc(n, sizeof(*r->messages));
    if (!r->messages)
        return IG_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        json_t *m = json_array_get(msgs, k);
        if (!json_is_object(m))
            return ig_api_error(err, 400, "messages", "messages[%zu] must be an object", k);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            return ig_api_error(err, 400, "messages", "messages[%zu].role must be a string", k);
        int known = 0;
        for (int j = 0; roles[j]; j++)
            known |= strcmp(roles[j], json_string_value(role)) == 0;
        if (!known)
            return ig_api_error(err, 400, "messages",
                                "messages[%zu].role '%s' is not one of "
                                "system, user, assistant, tool, developer",
                                k, json_string_value(role));
        ig_api_message_t *msg = &r->messages[r->nmessages];
        if (!(msg->role = dup_utf8(role, NULL)))
            return IG_ENOMEM;
        r->nmessages++;
        int rc = parse_content(json_object_get(m, "content"), &msg->content, k, err);
        if (rc < 0)
            return rc;
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_null(tc) && strcmp(msg->role, "assistant") != 0)
            return ig_api_error(err, 400, "messages",
                                "messages[%zu].tool_calls is only allowed on assistant messages",
                                k);
        if ((rc = parse_tool_calls(tc, msg, k, err)) < 0)
            return rc;
        json_t *tcid = json_object_get(m, "tool_call_id");
        if (tcid && !json_is_null(tcid)) {
            char what[64];
            snprintf(what, sizeof(what), "messages[%zu].tool_call_id", k);
            if ((rc = get_name(tcid, &msg->tool_call_id, err, "messages", what)) < 0)
                return rc;
        }
        json_t *name = json_object_get(m, "name");
        if (name && !json_is_null(name)) {
            char what[64];
            snprintf(what, sizeof(what), "messages[%zu].name", k);
            if ((rc = get_name(name, &msg->name, err, "messages", what)) < 0)
                return rc;
        }
    }
    return 0;
}

/* tools: [{type: "function", function: {name, description?, parameters?}}],
 * at most IG_API_MAX_TOOLS. Tools of another type are recorded by type only
 * (a worker refuses them; a site may know them). */
static int parse_tools(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    json_t *tools = json_object_get(root, "tools");
    if (!tools || json_is_null(tools))
        return 0;
    if (!json_is_array(tools))
        return ig_api_error(err, 400, "tools", "'tools' must be a list");
    size_t n = json_array_size(tools);
    if (n > IG_API_MAX_TOOLS)
        return ig_api_error(err, 400, "tools", "'tools' has %zu entries; at most %d", n,
                            IG_API_MAX_TOOLS);
    if (n && !(r->tools = calloc(n, sizeof(*r->tools))))
        return IG_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        json_t *t = json_array_get(tools, k);
        json_t *type = json_object_get(t, "type");
        if (!json_is_object(t) || !json_is_string(type))
            return ig_api_error(err, 400, "tools", "tools[%zu] must be an object with a 'type'", k);
        ig_api_tool_t *tool = &r->tools[r->ntools++];
        if (!(tool->type = dup_utf8(type, NULL)))
            return IG_ENOMEM;
        if (strcmp(tool->type, "function") != 0)
            continue;
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn))
            return ig_api_error(err, 400, "tools", "tools[%zu].function must be an object", k);
        char what[64];
        snprintf(what, sizeof(what), "tools[%zu].function.name", k);
        int rc = get_name(json_object_get(fn, "name"), &tool->name, err, "tools", what);
        if (rc < 0)
            return rc;
        json_t *d = json_object_get(fn, "description");
        if (d && !json_is_null(d)) {
            if (!json_is_string(d))
                return ig_api_error(err, 400, "tools",
                                    "tools[%zu].function.description must be a string", k);
            if (!(tool->description = dup_utf8(d, NULL)))
                return IG_ENOMEM;
        }
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params)) {
            if (!json_is_object(params))
                return ig_api_error(err, 400, "tools",
                                    "tools[%zu].function.parameters must be an object", k);
            if (!(tool->parameters = dump_json(params)))
                return IG_ENOMEM;
        }
    }
    return 0;
}

/* tool_choice: "none" | "auto" | "required" | {type: "function", function:
 * {name}} naming one of the tools; parallel_tool_calls: a boolean. */
static int parse_tool_choice(json_t *root, ig_api_request_t *r, ig_api_error_t *err)
{
    int rc;
    if ((rc = get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err)) < 0)
        return rc;
    json_t *tc = json_object_get(root, "tool_choice");
    if (!tc || json_is_null(tc))
        return 0;
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (strcmp(v, "none") == 0)
            r->tool_choice = IG_API_TOOL_CHOICE_NONE;
        else if (strcmp(v, "auto") == 0)
            r->tool_choice = IG_API_TOOL_CHOICE_AUTO;
        else if (strcmp(v, "required") == 0)
            r->tool_choice = IG_API_TOOL_CHOICE_REQUIRED;
        else
            return ig_api_error(err, 400, "tool_choice",
                                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else {
        json_t *type = json_object_get(tc, "type");
        json_t *fn = json_object_get(tc, "function");
        if (!json_is_object(tc) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function") != 0 || !json_is_object(fn))
            return ig_api_error(err, 400, "tool_choice",
                                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if ((rc = get_name(json_object_get(fn, "name"), &r->tool_choice_name, err, "tool_choice",
                           "tool_choice.function.name")) < 0)
            return rc;
        r->tool_choice = IG_API_TOOL_CHOICE_FUNCTION;
        int found = 0;
        for (int i = 0; i < r->ntools && !found; i++)
            found = r->tools[i].name && strcmp(r->tools[i].name, r->tool_choice_name) == 0;
        if (!found)
            return ig_api_error(err, 400, "tool_choice",
                                "'tool_choice' names the function '%s', which is not in 'tools'",
                                r->tool_choice_name);
    }
    if (r->ntools == 0 && (r->tool_choice == IG_API_TOOL_CHOICE_REQUIRED))
        return ig_api_error(err, 400, "tool_choice",
                            "'tool_choice' \"required\" needs a non-empty 'tools'");
    return 0;
}

static int parse_chat(json_t *root, ig_api_request_t *req, ig_api_error_t *err)
{
    int rc, lp = 0;
    long long i = 0;
    if ((rc = parse_messages(root, req, err)) < 0 || (rc = parse_common(root, req, err)) < 0 ||
        (rc = parse_tools(root, req, err)) < 0 || (rc = parse_tool_choice(root, req, err)) < 0 ||
        (rc = get_bool(root, "logprobs", &lp, err)) < 0 ||
        (rc = get_int(root, "top_logprobs", 0, IG_API_MAX_LOGPROBS, &i, err)) < 0)
        return rc;
    if (rc && !lp)
        return ig_api_error(err, 400, "top_logprobs",
                            "'top_logprobs' requires 'logprobs' to be true");
    if (lp)
        req->logprobs = rc ? (int)i : 0;
    return 0;
}

int ig_api_parse(ig_api_kind_t kind, const char *body, size_t len, ig_api_request_t *req,
                 ig_api_error_t *err)
{
    request_init(req, kind);
    json_t *root = ig_api_load_object(body, len, err);
    if (!root)
        return IG_EINVAL;
    int rc = kind == IG_API_CHAT ? parse_chat(root, req, err) : parse_completion(root, req, err);
    json_decref(root);
    if (rc < 0) {
        if (rc == IG_ENOMEM)
            ig_api_error_oom(err);
        ig_api_request_dispose(req);
        return rc;
    }
    return 0;
}

int ig_api_parse_completion(const char *body, size_t len, ig_api_request_t *req,
                            ig_api_error_t *err)
{
    return ig_api_parse(IG_API_COMPLETION, body, len, req, err);
}

int ig_api_parse_chat(const char *body, size_t len, ig_api_request_t *req, ig_api_error_t *err)
{
    return ig_api_parse(IG_API_CHAT, body, len, req, err);
}

/* The members ig_api_peek reads: parse_admission's (admission_keys, in
 * their order), then the prompt. */
static const char *const peek_keys[] = {
    "model", "max_tokens", "max_completion_tokens", "stream", "n", "best_of", "prompt", "messages",
};
enum { PEEK_PROMPT = ADM_KEYS, PEEK_MESSAGES, PEEK_KEYS };

/* A scanned member that is an integer literal in [lo, hi]: 1 with *out. */
static int span_int(const ig_json_span_t *v, long long lo, long long hi, long long *out)
{
    return ig_json_span_int(v, out) && *out >= lo && *out <= hi;
}

/* parse_admission's result for the common members that need no parse: a
 * model string without escapes (the scan checked its UTF-8), integers in
 * range, stream true or false. 1 when r is filled; 0 when anything else
 * (null, a real, an escape, a value out of range) leaves the verdict and
 * its error to parse_admission. */
static int peek_admission_plain(const ig_json_span_t *span, ig_api_request_t *r)
{
    const ig_json_span_t *model = &span[ADM_MODEL], *stream = &span[ADM_STREAM];
    if (model->p != NULL && (model->p[0] != '"' || memchr(model->p, '\\', model->n) != NULL))
        return 0;
    int mk = r->kind == IG_API_CHAT && span[ADM_MAX_COMPLETION_TOKENS].p != NULL
                 ? ADM_MAX_COMPLETION_TOKENS
                 : ADM_MAX_TOKENS;
    long long max_tokens = 0, n = 1, best_of = 0;
    if ((span[mk].p != NULL && !span_int(&span[mk], 1, 1LL << 40, &max_tokens)) ||
        (span[ADM_N].p != NULL && !span_int(&span[ADM_N], 1, IG_API_MAX_CHOICES, &n)) ||
        (span[ADM_BEST_OF].p != NULL &&
         !span_int(&span[ADM_BEST_OF], n, IG_API_MAX_CHOICES, &best_of)))
        return 0;
    int st = r->stream;
    if (stream->p != NULL) {
        if (stream->n == 4 && memcmp(stream->p, "true", 4) == 0)
            st = 1;
        else if (stream->n == 5 && memcmp(stream->p, "false", 5) == 0)
            st = 0;
        else
            return 0;
    }
    if (model->p != NULL) {
        if ((r->model = malloc(model->n - 1)) == NULL)
            return 0;
        memcpy(r->model, model->p + 1, model->n - 2);
        r->model[model->n - 2] = '\0';
    }
    if (span[mk].p != NULL) {
        r->max_tokens = max_tokens > 0x3fffffff ? 0x3fffffff : (int)max_tokens;
        r->max_tokens_given = 1;
    }
    r->stream = st;
    r->n = (int)n;
    r->best_of = best_of > 0 ? (int)best_of : r->n;
    return 1;
}

/* parse_admission on the members a scan found, each parsed alone: no
 * object is built for them. */
static int peek_admission(const ig_json_span_t *span, ig_api_request_t *r, ig_api_error_t *err)
{
    if (peek_admission_plain(span, r))
        return 0;
    json_t *m[ADM_KEYS] = {NULL};
    int rc = 0;
    for (int i = 0; i < ADM_KEYS && rc == 0; i++) {
        if (span[i].p == NULL)
            continue;
        /* scanned already: only memory can fail here */
        m[i] = ig_json_parse(span[i].p, span[i].n, IG_JSON_DECODE_ANY, NULL);
        if (m[i] == NULL)
            rc = IG_ENOMEM;
    }
    if (rc == 0)
        rc = parse_admission(m, r, err);
    for (int i = 0; i < ADM_KEYS; i++)
        json_decref(m[i]);
    return rc;
}

int ig_api_peek(ig_api_kind_t kind, const char *body, size_t len, ig_api_request_t *req,
                size_t *prompt_bytes, ig_api_error_t *err)
{
    request_init(req, kind);
    *prompt_bytes = 0;
    ig_json_span_t span[PEEK_KEYS];
    json_error_t je;
    int rc = ig_json_scan(body, len, 0, peek_keys, PEEK_KEYS, span, &je);
    if (rc <= 0)
        return rc < 0 ? invalid_json(err, &je) : not_an_object(err);
    if ((rc = peek_admission(span, req, err)) < 0) {
        if (rc == IG_ENOMEM)
            ig_api_error_oom(err);
        ig_api_request_dispose(req);
        return rc;
    }
    const ig_json_span_t *p = &span[kind == IG_API_CHAT ? PEEK_MESSAGES : PEEK_PROMPT];
    const char *name = kind == IG_API_CHAT ? "messages" : "prompt";
    if (p->p == NULL || (p->n == 4 && memcmp(p->p, "null", 4) == 0)) {
        ig_api_request_dispose(req);
        return ig_api_error(err, 400, name, "'%s' is required", name);
    }
    *prompt_bytes = p->n;
    size_t inner = 1; /* a list's first byte after '[' that is not white space */
    while (inner < p->n && strchr(" \t\r\n", p->p[inner]) != NULL)
        inner++;
    if (kind == IG_API_CHAT && (p->p[0] != '[' || p->p[inner] == ']')) {
        ig_api_request_dispose(req);
        return ig_api_error(err, 400, name, "'messages' must be a non-empty list");
    }
    if (kind == IG_API_CHAT)
        return 0;
    if (p->p[0] == '[')
        return 1; /* token ids, or several prompts: the whole parse counts them */
    if (p->p[0] != '"') {
        ig_api_request_dispose(req);
        return ig_api_error(err, 400, name,
                            "'prompt' must be a string, a list of strings, a list of token ids "
                            "or a list of token-id lists");
    }
    return 0;
}

void ig_api_request_dispose(ig_api_request_t *r)
{
    free(r->model);
    for (int i = 0; i < r->nprompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int i = 0; i < r->nmessages; i++) {
        ig_api_message_t *m = &r->messages[i];
        free(m->role);
        free(m->content);
        for (int k = 0; k < m->ntool_calls; k++) {
            free(m->tool_calls[k].id);
            free(m->tool_calls[k].name);
            free(m->tool_calls[k].arguments);
        }
        free(m->tool_calls);
        free(m->tool_call_id);
        free(m->name);
    }
    free(r->messages);
    for (int i = 0; i < r->ntools; i++) {
        free(r->tools[i].type);
        free(r->tools[i].name);
        free(r->tools[i].description);
        free(r->tools[i].parameters);
    }
    free(r->tools);
    free(r->tool_choice_name);
    free(r->response_format);
    free(r->suffix);
    free(r->user);
    for (int i = 0; i < r->nstop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    memset(r, 0, sizeof(*r));
}

/* ---- checks that need the tokenizer --------------------------------------- */

int ig_api_check_context(const ig_api_request_t *req, int ntok, int ctx, ig_api_error_t *err)
{
    const char *param = req->kind == IG_API_CHAT ? "messages" : "prompt";
    if (ntok <= 0) {
        ig_api_error(err, 400, param, "the prompt is empty after tokenization");
        return IG_EINVAL;
    }
    long long want = (long long)ntok + (req->max_tokens > 0 ? req->max_tokens : 0);
    if (ntok >= ctx || want > ctx) {
        if (req->max_tokens > 0)
            ig_api_error(err, 400, param,
                         "This model's maximum context length is %d tokens. However, you "
                         "requested %lld tokens (%d in the %s, %d for the completion). Please "
                         "reduce the length of the %s or completion.",
                         ctx, want, ntok, req->kind == IG_API_CHAT ? "messages" : "prompt",
                         req->max_tokens, param);
        else
            ig_api_error(err, 400, param,
                         "This model's maximum context length is %d tokens. However, your "
                         "messages resulted in %d tokens. Please reduce the length of the "
                         "messages.",
                         ctx, ntok);
        err->code = "context_length_exceeded";
        return IG_ETOOLONG;
    }
    return 0;
}

int ig_api_check_prompt_limit(const ig_api_request_t *req, int ntok, int limit, ig_api_error_t *err)
{
    if (limit <= 0 || ntok <= limit)
        return 0;
    const char *what = req->kind == IG_API_CHAT ? "messages" : "prompt";
    ig_api_error(err, 400, what,
                 "This server's maximum prompt length is %d tokens. However, your %s resulted "
                 "in %d tokens. Please reduce the length of the %s.",
                 limit, what, ntok, what);
    err->code = "context_length_exceeded";
    return IG_ETOOLONG;
}

/* ---- canonical form ------------------------------------------------------- */

static json_t *ids_json(const int *ids, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

json_t *ig_api_request_to_json(const ig_api_request_t *r)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (r->model)
        json_object_set_new(o, "model", json_string(r->model));
    if (r->kind == IG_API_COMPLETION) {
        json_t *p;
        if (r->nprompts == 1 && r->prompts[0].text) {
            p = json_stringn(r->prompts[0].text, r->prompts[0].text_len);
        } else if (r->nprompts == 1) {
            p = ids_json(r->prompts[0].ids, r->prompts[0].nids);
        } else {
            p = json_array();
            for (int i = 0; p && i < r->nprompts; i++)
                json_array_append_new(
                    p, r->prompts[i].text ? json_stringn(r->prompts[i].text, r->prompts[i].text_len)
                                          : ids_json(r->prompts[i].ids, r->prompts[i].nids));
        }
        json_object_set_new(o, "prompt", p);
        if (r->logprobs >= 0)
            json_object_set_new(o, "logprobs", json_integer(r->logprobs));
        if (r->echo)
            json_object_set_new(o, "echo", json_true());
    } else {
        json_t *ms = json_array();
        for (int i = 0; ms && i < r->nmessages; i++)
            json_array_append_new(ms, json_pack("{s:s, s:s}", "role", r->messages[i].role,
                                                "content", r->messages[i].content));
        json_object_set_new(o, "messages", ms);
        if (r->logprobs >= 0) {
            json_object_set_new(o, "logprobs", json_true());
            json_object_set_new(o, "top_logprobs", json_integer(r->logprobs));
        }
    }
    if (r->max_tokens > 0)
        json_object_set_new(o, "max_tokens", json_integer(r->max_tokens));
    json_object_set_new(o, "temperature", json_real(r->sampling.temperature));
    json_object_set_new(o, "top_p", json_real(r->sampling.top_p));
    if (r->sampling.top_k > 0)
        json_object_set_new(o, "top_k", json_integer(r->sampling.top_k));
    if (r->sampling.min_p > 0)
        json_object_set_new(o, "min_p", json_real(r->sampling.min_p));
    if (r->sampling.repetition_penalty != 1.0f)
        json_object_set_new(o, "repetition_penalty", json_real(r->sampling.repetition_penalty));
    if (r->sampling.presence_penalty != 0.0f)
        json_object_set_new(o, "presence_penalty", json_real(r->sampling.presence_penalty));
    if (r->sampling.frequency_penalty != 0.0f)
        json_object_set_new(o, "frequency_penalty", json_real(r->sampling.frequency_penalty));
    if (r->has_seed)
        json_object_set_new(o, "seed", json_integer((json_int_t)r->seed));
    if (r->nstop) {
        json_t *s = json_array();
        for (int i = 0; s && i < r->nstop; i++)
            json_array_append_new(s, json_string(r->stop[i]));
        json_object_set_new(o, "stop", s);
    }
    if (r->nstop_ids)
        json_object_set_new(o, "stop_token_ids", ids_json(r->stop_ids, r->nstop_ids));
    if (r->ignore_eos)
        json_object_set_new(o, "ignore_eos", json_true());
    if (r->n != 1)
        json_object_set_new(o, "n", json_integer(r->n));
    if (r->best_of != r->n)
        json_object_set_new(o, "best_of", json_integer(r->best_of));
    if (r->stream) {
        json_object_set_new(o, "stream", json_true());
        if (r->include_usage)
            json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    return o;
}
