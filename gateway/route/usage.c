/*
 * The region's token counters and inter-token latency
 * (include/infergate/usage.h): OpenAI answers read as they pass through
 * the proxy.
 */
#include "infergate/usage.h"

#include "infergate/jsonv.h"
#include "infergate/sse.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* An event larger than this is skipped, not buffered: token events are a
 * few hundred bytes. */
#define MAX_EVENT_BYTES (1u << 20)

void ig_usage_families_register(ig_usage_families_t *f)
{
    f->prompt = ig_metrics_counter("infergate_prompt_tokens_total",
                                   "Prompt tokens of the answers this region served", "model");
    f->generation =
        ig_metrics_counter("infergate_generation_tokens_total",
                           "Tokens generated in the answers this region served", "model");
    f->itl = ig_metrics_histogram("infergate_inter_token_latency_seconds",
                                  "Gap between two streamed tokens, as the gateway forwards them",
                                  "model", NULL, 0);
}

void ig_usage_init(ig_usage_meter_t *m)
{
    memset(m, 0, sizeof(*m));
    m->prompt = m->completion = -1;
}

/* A count of u under the Chat/Completions name or the Responses one. */
static void read_count(const json_t *u, const char *name, const char *responses_name,
                       long long *out)
{
    const json_t *v = json_object_get(u, name);
    if (v == NULL)
        v = json_object_get(u, responses_name);
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        *out = (long long)json_integer_value(v);
}

static void read_usage_object(ig_usage_meter_t *m, const json_t *u)
{
    read_count(u, "prompt_tokens", "input_tokens", &m->prompt);
    read_count(u, "completion_tokens", "output_tokens", &m->completion);
}

/* The usage of an answer: o.usage (completions, chat, embeddings, a whole
 * Response) or o.response.usage (the Responses stream's last event). */
static void read_usage(ig_usage_meter_t *m, const json_t *o)
{
    const json_t *u = json_object_get(o, "usage");
    if (!json_is_object(u))
        u = json_object_get(json_object_get(o, "response"), "usage");
    if (json_is_object(u))
        read_usage_object(m, u);
}

/* Content pieces in one payload: choices (any index) with text or
 * delta.content, or a Responses output-text delta. */
static int content_choices(const json_t *o)
{
    int n = 0;
    size_t i;
    json_t *c;
    const char *type = json_string_value(json_object_get(o, "type"));
    if (type != NULL)
        return strcmp(type, "response.output_text.delta") == 0 &&
               json_string_length(json_object_get(o, "delta")) > 0;
    json_array_foreach(json_object_get(o, "choices"), i, c)
    {
        const json_t *t = json_object_get(c, "text");
        const json_t *d = json_object_get(json_object_get(c, "delta"), "content");
        if ((json_is_string(t) && json_string_length(t) > 0) ||
            (json_is_string(d) && json_string_length(d) > 0))
            n++;
    }
    return n;
}

/* One complete event ev[0..n) (without its blank line). */
static void event(ig_usage_meter_t *m, const ig_usage_families_t *f, const char *model,
                  const char *ev, size_t n, uint64_t now_ns)
{
    char small[2048], *data;
    size_t dlen;
    if (ig_sse_event_data(ev, n, small, sizeof(small), &data, &dlen) != 0 || data == NULL)
        return;
    json_t *o = ig_json_parse(data, dlen, IG_JSON_ALLOW_DUPLICATES, NULL);
    if (data != small)
        free(data);
    if (json_is_object(o)) {
        read_usage(m, o);
        int k = content_choices(o);
        if (k > 0) {
            if (m->last_token_ns != 0 && now_ns >= m->last_token_ns)
                ig_metric_observe(f->itl, (double)(now_ns - m->last_token_ns) / 1e9, model);
            m->last_token_ns = now_ns;
            m->events += k;
        }
    }
    json_decref(o);
}

/* Appends to the event being read; past MAX_EVENT_BYTES (or out of
 * memory) the event is skipped up to its blank line. */
static void tail_append(ig_usage_meter_t *m, const char *p, size_t n)
{
    if (m->overflow)
        return;
    if (m->tlen + n > MAX_EVENT_BYTES) {
        m->overflow = 1;
        m->tlen = 0;
        return;
    }
    if (m->tlen + n > m->tcap) {
        size_t cap = m->tcap ? m->tcap * 2 : 1024;
        while (cap < m->tlen + n)
            cap *= 2;
        char *nb = realloc(m->tail, cap);
        if (nb == NULL) {
            m->overflow = 1;
            m->tlen = 0;
            return;
        }
        m->tail = nb;
        m->tcap = cap;
    }
    memcpy(m->tail + m->tlen, p, n);
    m->tlen += n;
}

void ig_usage_stream(ig_usage_meter_t *m, const ig_usage_families_t *f, const char *model,
                     const char *buf, size_t len, uint64_t now_ns)
{
    size_t off = 0;
    while (off < len) {
        const char *nl = memchr(buf + off, '\n', len - off);
        size_t upto = nl != NULL ? (size_t)(nl - buf) + 1 : len;
        if (m->line_len == 0)
            m->line_first = buf[off];
        m->line_len += upto - off;
        tail_append(m, buf + off, upto - off);
        off = upto;
        if (nl == NULL)
            break; /* the line goes on in the next piece */
        /* A blank line ("\n" or "\r\n", perhaps split over pieces) ends the event. */
        int blank = m->line_len == 1 || (m->line_len == 2 && m->line_first == '\r');
        m->line_len = 0;
        if (blank) {
            if (!m->overflow && m->tlen > 0)
                event(m, f, model, m->tail, m->tlen, now_ns);
            m->tlen = 0;
            m->overflow = 0;
        }
    }
}

/* A count read from its JSON: a non-negative integer, else left as it is
 * (read_count's rule). */
static void span_count(const ig_json_span_t *s, long long *out)
{
    long long v;
    if (ig_json_span_int(s, &v) && v >= 0)
        *out = v;
}

/* The value after the last "usage" key of a JSON text, or NULL: a quote
 * not escaped, the name, optional space and a colon. Usage comes last in
 * every OpenAI answer, and the same name inside a string is escaped. */
static const char *last_usage_value(const char *body, size_t len)
{
    static const char key[] = "\"usage\"";
    const size_t kl = sizeof(key) - 1;
    for (size_t i = len; i > 0;) {
        const char *q = memrchr(body, '"', i); /* the quotes only, from the end */
        if (q == NULL)
            break;
        i = (size_t)(q - body);
        if (len - i < kl || memcmp(body + i, key, kl) != 0 || (i > 0 && body[i - 1] == '\\'))
            continue;
        const char *p = body + i + kl, *end = body + len;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
            p++;
        if (p == end || *p != ':')
            continue;
        return p + 1;
    }
    return NULL;
}

void ig_usage_body(ig_usage_meter_t *m, const char *body, size_t len)
{
    /* Only the usage object is parsed, not the whole answer (choices,
     * vectors): the proxy reads every answer that passes. */
    static const char *const keys[] = {"prompt_tokens", "input_tokens", "completion_tokens",
                                       "output_tokens"};
    ig_json_span_t span[4];
    const char *v = last_usage_value(body, len);
    if (v == NULL || ig_json_scan(v, len - (size_t)(v - body),
                                  IG_JSON_DISABLE_EOF_CHECK | IG_JSON_ALLOW_DUPLICATES, keys, 4,
                                  span, NULL) != 1)
        return;
    span_count(&span[span[0].p != NULL ? 0 : 1], &m->prompt);
    span_count(&span[span[2].p != NULL ? 2 : 3], &m->completion);
}

void ig_usage_end(ig_usage_meter_t *m, const ig_usage_families_t *f, const char *model,
                  int prompt_estimate)
{
    long long gen = m->completion >= 0 ? m->completion : m->events;
    long long prompt = m->prompt;
    if (prompt < 0 && m->events > 0)
        prompt = prompt_estimate > 0 ? prompt_estimate : 0;
    if (prompt > 0)
        ig_metric_add(f->prompt, (double)prompt, model);
    if (gen > 0)
        ig_metric_add(f->generation, (double)gen, model);
    free(m->tail);
    ig_usage_init(m);
}
