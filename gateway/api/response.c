/*
 * OpenAI response bodies and SSE chunks (text_completion, chat.completion,
 * chat.completion.chunk), the models list, and the two calls that answer a
 * request with JSON or an error (the gateway's and the worker's).
 */
#include "infergate/api.h"
#include "infergate/http.h"
#include "infergate/utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- strings -------------------------------------------------------------- */

/* A JSON string from bytes; invalid UTF-8 bytes (and NUL) become U+FFFD
 * because a JSON string cannot carry them (the token's raw bytes go in
 * "bytes" instead). Each bad byte is one U+FFFD, not each maximal subpart:
 * a token's text shows how many bytes it holds. */
static json_t *str_bytes(const char *s, size_t len)
{
    if (!s)
        return json_string("");
    /* NUL is valid UTF-8 but many JSON parsers (jansson by default, and so
     * this module's own request parser) refuse "\u0000": show it as U+FFFD
     * too, so that output can always be sent back as input. */
    if (ig_utf8_valid(s, len) && !memchr(s, 0, len))
        return json_stringn(s, len);
    char *buf = malloc(len * 3 + 1);
    if (!buf)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = s[i] ? ig_utf8_decode(s + i, len - i, NULL) : 0;
        if (n) {
            memcpy(buf + o, s + i, n);
            o += n;
            i += n;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

static json_t *bytes_array(const char *s, size_t len)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* A float logprob as JSON; -inf (impossible token) is not JSON, so it is
 * clamped the way vLLM does (-9999.0). */
static json_t *lp_json(float lp)
{
    if (isnan(lp))
        return json_null();
    if (!isfinite(lp) || lp < -9999.0f)
        lp = -9999.0f;
    return json_real(lp);
}

char *ig_api_dumps(const json_t *v, size_t *len)
{
    char *s = json_dumps(v, JSON_COMPACT);
    if (s && len)
        *len = strlen(s);
    return s;
}

/* ---- logprobs ------------------------------------------------------------- */

/* Completions: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const ig_api_choice_t *c)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    json_t *o = json_object();
    if (!tokens || !lps || !tops || !offs || !o)
        goto fail;
    for (int i = 0; i < c->nlp; i++) {
        const ig_api_token_logprob_t *t = &c->lp[i];
        json_array_append_new(tokens, str_bytes(t->token, t->len));
        json_array_append_new(lps, t->has_logprob ? lp_json(t->logprob) : json_null());
        if (!t->has_logprob) {
            json_array_append_new(tops, json_null());
        } else {
            json_t *top = json_object();
            for (int k = 0; top && k < t->ntop; k++) {
                json_t *key = str_bytes(t->top[k].token, t->top[k].len);
                if (!key)
                    continue;
                /* Two ids may decode to the same text: keep the likelier. */
                if (!json_object_get(top, json_string_value(key)))
                    json_object_set_new(top, json_string_value(key), lp_json(t->top[k].logprob));
                json_decref(key);
            }
            json_array_append_new(tops, top ? top : json_null());
        }
        json_array_append_new(offs, json_integer((json_int_t)t->text_offset));
    }
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
fail:
    json_decref(tokens);
    json_decref(lps);
    json_decref(tops);
    json_decref(offs);
    json_decref(o);
    return NULL;
}

/* Chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob,
 * bytes}]}]}. */
static json_t *chat_logprobs(const ig_api_choice_t *c)
{
    json_t *content = json_array();
    for (int i = 0; content && i < c->nlp; i++) {
        const ig_api_token_logprob_t *t = &c->lp[i];
        json_t *e = json_object(), *top = json_array();
        if (!e || !top) {
            json_decref(e);
            json_decref(top);
            json_decref(content);
            return NULL;
        }
        json_object_set_new(e, "token", str_bytes(t->token, t->len));
        json_object_set_new(e, "logprob", t->has_logprob ? lp_json(t->logprob) : json_null());
        json_object_set_new(e, "bytes", bytes_array(t->token, t->len));
        for (int k = 0; k < t->ntop; k++)
            json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token",
                                                 str_bytes(t->top[k].token, t->top[k].len),
                                                 "logprob", lp_json(t->top[k].logprob), "bytes",
                                                 bytes_array(t->top[k].token, t->top[k].len)));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(content, e);
    }
    if (!content)
        return NULL;
    return json_pack("{s:o}", "content", content);
}

static json_t *choice_logprobs(ig_api_kind_t kind, const ig_api_choice_t *c)
{
    if (!c->has_logprobs)
        return json_null();
    json_t *l = kind == IG_API_CHAT ? chat_logprobs(c) : completion_logprobs(c);
    return l ? l : json_null();
}

static json_t *finish_json(const char *reason)
{
    return reason ? json_string(reason) : json_null();
}

/* ---- whole responses ------------------------------------------------------ */

static json_t *usage_json(const ig_api_usage_t *u)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens);
}

static json_t *envelope(const char *object, const char *id, long long created, const char *model)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", object, "created",
                     (json_int_t)created, "model", model ? model : "");
}

/* [{index?, id, type, function: {name, arguments}}]: what OpenAI sends in
 * message.tool_calls (no index) and delta.tool_calls (with index; a NULL id
 * or name is left out). */
static json_t *tool_calls_json(const ig_api_choice_t *c, int with_index)
{
    json_t *arr = json_array();
    for (int k = 0; arr && k < c->ntool_calls; k++) {
        const ig_api_tool_call_t *t = &c->tool_calls[k];
        json_t *o = json_object(), *fn = json_object();
        if (!o || !fn) {
            json_decref(o);
            json_decref(fn);
            json_decref(arr);
            return NULL;
        }
        if (with_index)
            json_object_set_new(o, "index", json_integer(c->tool_call_index + k));
        if (t->id) {
            json_object_set_new(o, "id", json_string(t->id));
            json_object_set_new(o, "type", json_string("function"));
        }
        if (t->name)
            json_object_set_new(fn, "name", json_string(t->name));
        json_object_set_new(
            fn, "arguments",
            str_bytes(t->arguments ? t->arguments : "", t->arguments ? strlen(t->arguments) : 0));
        json_object_set_new(o, "function", fn);
        json_array_append_new(arr, o);
    }
    return arr;
}

json_t *ig_api_response_json(ig_api_kind_t kind, const char *id, long long created,
                             const char *model, const ig_api_choice_t *choices, int nchoices,
                             const ig_api_usage_t *usage)
{
    json_t *o =
        envelope(kind == IG_API_CHAT ? "chat.completion" : "text_completion", id, created, model);
    json_t *arr = json_array();
    if (!o || !arr)
        goto fail;
    for (int i = 0; i < nchoices; i++) {
        const ig_api_choice_t *c = &choices[i];
        json_t *ch = json_object();
        if (!ch)
            goto fail;
        json_object_set_new(ch, "index", json_integer(c->index));
        if (kind == IG_API_CHAT && c->ntool_calls)
            json_object_set_new(ch, "message",
                                json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                                          c->len ? str_bytes(c->text, c->len) : json_null(),
                                          "tool_calls", tool_calls_json(c, 0)));
        else if (kind == IG_API_CHAT)
            json_object_set_new(ch, "message",
                                json_pack("{s:s, s:o}", "role", "assistant", "content",
                                          str_bytes(c->text, c->len)));
        else
            json_object_set_new(ch, "text", str_bytes(c->text, c->len));
        json_object_set_new(ch, "logprobs", choice_logprobs(kind, c));
        json_object_set_new(ch, "finish_reason", finish_json(c->finish_reason));
        json_array_append_new(arr, ch);
    }
    json_object_set_new(o, "choices", arr);
    arr = NULL;
    if (usage)
        json_object_set_new(o, "usage", usage_json(usage));
    return o;
fail:
    json_decref(arr);
    json_decref(o);
    return NULL;
}

/* ---- SSE -------------------------------------------------------------------- */

static char *sse_wrap(json_t *o, size_t *len)
{
    if (!o)
        return NULL;
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!body)
        return NULL;
    size_t n = strlen(body);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, body, n);
        memcpy(s + 6 + n, "\n\n", 3);
        if (len)
            *len = n + 8;
    }
    free(body);
    return s;
}

char *ig_api_chunk_sse(ig_api_kind_t kind, const char *id, long long created, const char *model,
                       const ig_api_choice_t *c, int role_delta, int usage_null, size_t *len)
{
    json_t *o = envelope(kind == IG_API_CHAT ? "chat.completion.chunk" : "text_completion", id,
                         created, model);
    json_t *ch = json_object();
    if (!o || !ch) {
        json_decref(o);
        json_decref(ch);
        return NULL;
    }
    json_object_set_new(ch, "index", json_integer(c->index));
    if (kind == IG_API_CHAT) {
        json_t *delta = json_object();
        if (role_delta) {
            json_object_set_new(delta, "role", json_string("assistant"));
            json_object_set_new(delta, "content", str_bytes(c->text, c->len));
        } else if (c->len) {
            json_object_set_new(delta, "content", str_bytes(c->text, c->len));
        }
        if (c->ntool_calls)
            json_object_set_new(delta, "tool_calls", tool_calls_json(c, 1));
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", str_bytes(c->text, c->len));
    }
    json_object_set_new(ch, "logprobs", choice_logprobs(kind, c));
    json_object_set_new(ch, "finish_reason", finish_json(c->finish_reason));
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    if (usage_null)
        json_object_set_new(o, "usage", json_null());
    return sse_wrap(o, len);
}

char *ig_api_usage_sse(ig_api_kind_t kind, const char *id, long long created, const char *model,
                       const ig_api_usage_t *usage, size_t *len)
{
    json_t *o = envelope(kind == IG_API_CHAT ? "chat.completion.chunk" : "text_completion", id,
                         created, model);
    if (!o)
        return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_json(usage));
    return sse_wrap(o, len);
}

char *ig_api_error_sse(const ig_api_error_t *err, size_t *len)
{
    return sse_wrap(ig_api_error_json(err), len);
}

json_t *ig_api_models_json(const char *const *ids, int n, long long created, const char *owner)
{
    json_t *data = json_array();
    for (int i = 0; data && i < n; i++)
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", ids[i], "object",
                                              "model", "created", (json_int_t)created, "owned_by",
                                              owner ? owner : "infergate"));
    if (!data)
        return NULL;
    return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

/* ---- answering a request -------------------------------------------------- */

void ig_api_respond_error(ig_http_req_t *req, const ig_api_error_t *err)
{
    if (err->status == 429 || err->status == 503) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", err->retry_after_s > 1 ? err->retry_after_s : 1);
        ig_http_add_header(req, "Retry-After", ra);
    }
    size_t len = 0;
    json_t *doc = ig_api_error_json(err);
    char *s = doc ? ig_api_dumps(doc, &len) : NULL;
    json_decref(doc);
    if (s == NULL) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"unavailable_error\",\"param\":null,\"code\":503}}";
        if (err->status != 429 && err->status != 503)
            ig_http_add_header(req, "Retry-After", "1");
        ig_http_respond(req, 503, "application/json", oom, sizeof(oom) - 1);
        return;
    }
    ig_http_respond(req, err->status, "application/json", s, len);
    free(s);
}

void ig_api_respond_json(ig_http_req_t *req, int status, json_t *doc)
{
    size_t len = 0;
    char *s = doc ? ig_api_dumps(doc, &len) : NULL;
    json_decref(doc);
    if (s == NULL) {
        ig_api_respond_oom(req);
        return;
    }
    ig_http_respond(req, status, "application/json", s, len);
    free(s);
}

void ig_api_respond_oom(ig_http_req_t *req)
{
    ig_api_error_t e;
    ig_api_error_oom(&e);
    ig_api_respond_error(req, &e);
}
