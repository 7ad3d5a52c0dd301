/*
 * Generation requests of the worker: intake (an OpenAI request, parsed by
 * the api module, tokenized and submitted as one scheduler sequence per
 * prompt) and output (the scheduler's events into a JSON response or an SSE
 * stream, with logprobs and backpressure), plus the tokenizer adapter.
 *
 * Lifecycle of one generation request (wreq_t): parsed and tokenized on the
 * loop, one scheduler sequence per prompt (a choice), events fill the choices,
 * the HTTP request is finished once every choice has its final event (also
 * after a client abort: the sequences are cancelled and their final events
 * still come). Only then is the wreq freed, so no event can outlive it.
 */
#include "worker_internal.h"

#include "infergate/clock.h"
#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/prefix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- tokenizer layer (thin: the worker's only contact with it) ----------- */

int ig__worker_tok_piece(void *ctx, int token, char *buf, size_t cap)
{
    const ig_tokenizer_t *tok = ctx;
    if (ig_tokenizer_is_special(tok, token))
        return 0;
    const char *b;
    size_t len;
    if (ig_tokenizer_token_bytes(tok, token, &b, &len) < 0)
        return 0;
    if (len > cap)
        len = cap;
    memcpy(buf, b, len);
    return (int)len;
}

/* The bytes of a token as logprobs show it (special tokens by their name). */
static void tok_bytes(worker_t *w, int token, const char **b, size_t *len)
{
    if (ig_tokenizer_is_special(w->tok, token)) {
        const char *s = ig_tokenizer_token_str(w->tok, token);
        *b = s ? s : "";
        *len = strlen(*b);
        return;
    }
    if (ig_tokenizer_token_bytes(w->tok, token, b, len) < 0) {
        *b = "";
        *len = 0;
    }
}

/* The chat family, said once at load (a fallback as a warning: the model
 * may have been trained on another format), and its end-of-turn ids. */
void ig__worker_chat_setup(worker_t *w)
{
    const char *tpl = ig_tokenizer_chat_template(w->tok);
    int32_t ids[32];
    w->chat_style = ig_chat_detect_why(tpl, &w->chat_why);
    w->chat_source = tpl == NULL                    ? "default"
                     : ig_chat_detect_fallback(tpl) ? "fallback"
                                                    : "detected";
    if (strcmp(w->chat_source, "fallback") == 0)
        IG_WARN("chat template: %s (%s)", ig_chat_style_name(w->chat_style), w->chat_why);
    else
        IG_INFO("chat template: %s (%s)", ig_chat_style_name(w->chat_style), w->chat_why);
    w->chat_tools = ig_chat_detect_tools(w->chat_style, tpl);
    IG_INFO("chat tools: %s", ig_chat_tools_name(w->chat_tools));
    size_t n = ig_chat_stop_ids(w->chat_style, w->tok, ids, 32);
    for (size_t i = 0; i < n && i < 32; i++)
        w->chat_stop[w->nchat_stop++] = ids[i];
}

/* ---- generation requests: memory ----------------------------------------- */

static void choice_dispose(choice_t *c)
{
    free(c->prompt);
    free(c->prompt_text);
    free(c->text);
    for (int i = 0; i < c->nlp; i++)
        free((void *)c->lp[i].top);
    free(c->lp);
    free(c->call_ids);
    free(c->args_sent);
}

static void wreq_free(wreq_t *r)
{
    worker_t *w = r->w;
    if (r->prev)
        r->prev->next = r->next;
    else if (w->reqs == r)
        w->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    w->nreqs--;
    for (int i = 0; i < r->nchoices; i++)
        choice_dispose(&r->choices[i]);
    free(r->choices);
    free(r->pending);
    free(r->tool_names);
    ig_api_request_dispose(&r->api);
    free(r);
}

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return IG_ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* One logprob entry: token's bytes, its logprob and the top list. */
static int add_lp(worker_t *w, choice_t *c, const ig_sample_t *s, int has, int token, int ntop)
{
    if (c->nlp == c->cap_lp) {
        int cap = c->cap_lp ? c->cap_lp * 2 : 32;
        ig_api_token_logprob_t *lp = realloc(c->lp, sizeof(*lp) * (size_t)cap);
        if (!lp)
            return IG_ENOMEM;
        c->lp = lp;
        c->cap_lp = cap;
    }
    ig_api_token_logprob_t *e = &c->lp[c->nlp];
    memset(e, 0, sizeof(*e));
    tok_bytes(w, token, &e->token, &e->len);
    e->has_logprob = has;
    e->text_offset = c->lp_offset;
    /* Special tokens are listed by name but are not part of the text. */
    if (!ig_tokenizer_is_special(w->tok, token))
        c->lp_offset += e->len;
    if (has && s) {
        e->logprob = s->logprob;
        int n = s->ntop < ntop ? s->ntop : ntop;
        if (n > 0) {
            ig_api_top_logprob_t *top = calloc((size_t)n, sizeof(*top));
            if (!top)
                return IG_ENOMEM;
            for (int k = 0; k < n; k++) {
                tok_bytes(w, s->top_tokens[k], &top[k].token, &top[k].len);
                top[k].logprob = s->top_logprobs[k];
            }
            e->top = top;
            e->ntop = n;
        }
    }
    c->nlp++;
    return 0;
}

/* ---- generation requests: output ------------------------------------------ */

static void on_drain(ig_http_req_t *req, void *data);

/* Stops (or restarts) generation for a stream whose client reads slowly, so
 * that what is held back stays a token or so per choice. */
static void pause_choices(wreq_t *r, int paused)
{
    for (int i = 0; i < r->nchoices; i++)
        if (r->choices[i].submitted && !r->choices[i].finished)
            ig_sched_pause(r->w->sched, r->choices[i].seq_id, paused);
}

static void stream_write(wreq_t *r, const char *p, size_t n)
{
    if (r->aborted || r->http_done || n == 0)
        return;
    if (r->paused) {
        append(&r->pending, &r->pending_len, &r->pending_cap, p, n);
        return;
    }
    int rc = ig_http_stream_write(r->http, p, n);
    if (rc == IG_EBUSY) {
        /* Queued, but the client reads slower than we write: pause the
         * sequences and hold what is already on its way (bounded, see tick)
         * until the drain callback. */
        r->paused = 1;
        r->paused_since = ig_clock_ns();
        pause_choices(r, 1);
    }
}

static void on_drain(ig_http_req_t *req, void *data)
{
    wreq_t *r = data;
    if (!r->paused)
        return;
    r->paused = 0;
    if (r->pending_len) {
        size_t n = r->pending_len;
        r->pending_len = 0;
        stream_write(r, r->pending, n);
    }
    if (!r->paused)
        pause_choices(r, 0);
}

void ig__worker_cancel(wreq_t *r)
{
    if (r->cancelled)
        return;
    r->cancelled = 1;
    for (int i = 0; i < r->nchoices; i++)
        if (r->choices[i].submitted && !r->choices[i].finished)
            ig_sched_cancel(r->w->sched, r->choices[i].seq_id);
}

static const char *finish_reason(ig_finish_t f)
{
    return f == IG_FINISH_LENGTH ? "length" : "stop";
}

/* The first non-normal finish of any choice decides the error, if any. */
static int request_error(wreq_t *r, ig_api_error_t *e)
{
    for (int i = 0; i < r->nchoices; i++) {
        choice_t *c = &r->choices[i];
        if (c->finish == IG_FINISH_TIMEOUT) {
            ig_api_error(e, 504, NULL, "the request's deadline passed after %d tokens",
                         c->completion_tokens);
            return 1;
        }
        if (c->finish == IG_FINISH_ERROR && c->error == IG_EFULL) {
            ig_api_error(e, 429, NULL, "the worker's queue is full; retry later");
            return 1;
        }
        if (c->finish == IG_FINISH_ERROR || c->finish == IG_FINISH_CANCELLED) {
            ig_api_error(e, c->finish == IG_FINISH_CANCELLED ? 503 : 500, NULL, "%s: %s",
                         c->finish == IG_FINISH_CANCELLED ? "generation cancelled"
                                                          : "generation failed",
                         ig_strerror(c->error));
            return 1;
        }
    }
    return 0;
}

static void usage_of(wreq_t *r, ig_api_usage_t *u)
{
    /* A prompt is counted once, whatever its n (one prefill, shared). */
    u->prompt_tokens = u->completion_tokens = 0;
    for (int i = 0; i < r->nchoices; i++) {
        if (r->choices[i].sample == 0)
            u->prompt_tokens += r->choices[i].nprompt;
        u->completion_tokens += r->choices[i].completion_tokens;
    }
}

/* ---- tool calls ------------------------------------------------------------ */

static void tool_calls_free(ig_api_tool_call_t *t, int n)
{
    for (int i = 0; t && i < n; i++) {
        free(t[i].id);
        free(t[i].name);
        free(t[i].arguments);
    }
    free(t);
}

/* The tool calls in a finished choice's answer (the forced start of a call
 * included), each with a new id "call_..."; *content_len the bytes of text
 * before them. *n is 0 when the answer is no call. A call whose JSON is
 * whole is a call even when max_tokens ended the answer (as vLLM reads it);
 * a call cut in its middle is not JSON, so it is shown as the text it is. */
static int tool_calls_of(wreq_t *r, const choice_t *c, ig_api_tool_call_t **out, int *n,
                         size_t *content_len)
{
    *out = NULL;
    *n = 0;
    *content_len = c->text_len;
    if (!r->tools || (c->finish != IG_FINISH_STOP && c->finish != IG_FINISH_LENGTH))
        return 0;
    ig_chat_parsed_call_t *calls;
    size_t ncalls;
    int rc = ig_chat_parse_tool_calls(r->w->chat_tools, c->text ? c->text : "", c->text_len,
                                      r->tool_names, (size_t)r->ntool_names, &calls, &ncalls,
                                      content_len);
    if (rc < 0 || ncalls == 0)
        return rc;
    ig_api_tool_call_t *t = calloc(ncalls, sizeof(*t));
    if (!t) {
        ig_chat_parsed_calls_free(calls, ncalls);
        return IG_ENOMEM;
    }
    for (size_t k = 0; k < ncalls; k++) {
        t[k].id = malloc(48);
        if (t[k].id)
            ig_api_make_id(t[k].id, 48, "call_");
        t[k].name = calls[k].name;
        t[k].arguments = calls[k].arguments;
        calls[k].name = calls[k].arguments = NULL;
    }
    ig_chat_parsed_calls_free(calls, ncalls);
    for (size_t k = 0; k < ncalls; k++)
        if (!t[k].id) {
            tool_calls_free(t, (int)ncalls);
            return IG_ENOMEM;
        }
    *out = t;
    *n = (int)ncalls;
    return 0;
}

/* best_of > n: of each prompt's best_of samples, the n with the highest
 * sum of token logprobs (ties: the lower sample) go first, renumbered
 * prompt * n + rank, as vLLM returns them. ch(nchoices) is reordered in
 * place (the rest stays behind, to be freed); returns the choices to send
 * (all of them without best_of), or IG_ENOMEM. */
static int best_of_select(wreq_t *r, ig_api_choice_t *ch)
{
    int m = r->per_prompt, n = r->api.n;
    if (m <= n)
        return r->nchoices;
    int nprompts = r->nchoices / m;
    ig_api_choice_t *tmp = malloc(sizeof(*tmp) * (size_t)r->nchoices);
    int *order = malloc(sizeof(int) * (size_t)m);
    if (!tmp || !order) {
        free(tmp);
        free(order);
        return IG_ENOMEM;
    }
    int out = 0, rest = nprompts * n;
    for (int p = 0; p < nprompts; p++) {
        for (int j = 0; j < m; j++) {
            int k = j;
            while (k > 0 && r->choices[p * m + order[k - 1]].cum_logprob <
                                r->choices[p * m + j].cum_logprob) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = j;
        }
        for (int j = 0; j < m; j++) {
            ig_api_choice_t c = ch[p * m + order[j]];
            if (j < n) {
                c.index = p * n + j;
                tmp[out++] = c;
            } else {
                tmp[rest++] = c;
            }
        }
    }
    memcpy(ch, tmp, sizeof(*tmp) * (size_t)r->nchoices);
    free(tmp);
    free(order);
    return nprompts * n;
}

static void finish_whole(wreq_t *r)
{
    ig_api_error_t e;
    if (r->aborted) {
        ig_http_respond(r->http, 499, "text/plain", "", 0);
        return;
    }
    if (request_error(r, &e)) {
        ig_api_respond_error(r->http, &e);
        return;
    }
    ig_api_choice_t *ch = calloc((size_t)r->nchoices, sizeof(*ch));
    char **texts = calloc((size_t)r->nchoices, sizeof(char *));
    if (!ch || !texts) {
        free(ch);
        free(texts);
        ig_api_respond_oom(r->http);
        return;
    }
    int oom = 0;
    for (int i = 0; i < r->nchoices; i++) {
        choice_t *c = &r->choices[i];
        ch[i].index = c->index;
        if (r->api.echo) {
            size_t n = c->prompt_text_len + c->text_len;
            texts[i] = malloc(n + 1);
            if (texts[i]) {
                memcpy(texts[i], c->prompt_text, c->prompt_text_len);
                if (c->text_len)
                    memcpy(texts[i] + c->prompt_text_len, c->text, c->text_len);
                texts[i][n] = 0;
                ch[i].text = texts[i];
                ch[i].len = n;
            }
        } else {
            ch[i].text = c->text ? c->text : "";
            ch[i].len = c->text_len;
        }
        ch[i].finish_reason = finish_reason(c->finish);
        ch[i].has_logprobs = r->api.logprobs >= 0;
        ch[i].lp = c->lp;
        ch[i].nlp = c->nlp;
        ig_api_tool_call_t *calls;
        int ncalls;
        size_t content_len;
        if (tool_calls_of(r, c, &calls, &ncalls, &content_len) < 0)
            oom = 1;
        if (ncalls) {
            ch[i].len = content_len;
            ch[i].tool_calls = calls;
            ch[i].ntool_calls = ncalls;
            ch[i].finish_reason = "tool_calls";
        }
    }
    ig_api_usage_t u;
    usage_of(r, &u);
    int nout = best_of_select(r, ch);
    if (oom || nout < 0)
        ig_api_respond_oom(r->http);
    else
        ig_api_respond_json(
            r->http, 200,
            ig_api_response_json(r->api.kind, r->id, r->created, r->w->model_name, ch, nout, &u));
    for (int i = 0; i < r->nchoices; i++) {
        free(texts[i]);
        tool_calls_free((ig_api_tool_call_t *)ch[i].tool_calls, ch[i].ntool_calls);
    }
    free(texts);
    free(ch);
}

/* Sends one chunk for choice c: text and the logprob entries not yet sent. */
static void send_chunk(wreq_t *r, choice_t *c, const char *text, size_t len, const char *finish,
                       int lp_upto)
{
    ig_api_choice_t ch = {.index = c->index,
                          .text = text,
                          .len = len,
                          .finish_reason = finish,
                          .has_logprobs = r->api.logprobs >= 0,
                          .lp = c->lp + c->lp_sent,
                          .nlp = lp_upto - c->lp_sent};
    if (!finish && len == 0 && ch.nlp == 0)
        return; /* nothing to say yet (text held back) */
    size_t n;
    char *s = ig_api_chunk_sse(r->api.kind, r->id, r->created, r->w->model_name, &ch, 0,
                               r->api.include_usage, &n);
    c->lp_sent = lp_upto;
    if (s)
        stream_write(r, s, n);
    free(s);
}

/* One delta of call k of choice c: its head (id, type, name and empty
 * arguments) when name is not NULL, else a piece of its arguments. */
static void send_call_delta(wreq_t *r, choice_t *c, int k, const char *name, size_t name_len,
                            const char *args, size_t args_len)
{
    char *nm = name ? strndup(name, name_len) : NULL;
    char *ag = strndup(args ? args : "", args ? args_len : 0);
    ig_api_tool_call_t t = {name ? c->call_ids[k] : NULL, nm, ag};
    ig_api_choice_t ch = {
        .index = c->index, .text = "", .tool_calls = &t, .ntool_calls = 1, .tool_call_index = k};
    size_t n;
    char *s = (name && !nm) || !ag
                  ? NULL
                  : ig_api_chunk_sse(r->api.kind, r->id, r->created, r->w->model_name, &ch, 0,
                                     r->api.include_usage, &n);
    if (s)
        stream_write(r, s, n);
    free(s);
    free(nm);
    free(ag);
}

/* Announces call number c->heads (a new id, its name): 0 or IG_ENOMEM. */
static int announce(wreq_t *r, choice_t *c, const char *name, size_t name_len)
{
    if (c->heads == c->cap_heads) {
        int cap = c->cap_heads ? c->cap_heads * 2 : 4;
        char(*ids)[48] = realloc(c->call_ids, sizeof(*ids) * (size_t)cap);
        if (ids)
            c->call_ids = ids;
        size_t *sent = realloc(c->args_sent, sizeof(size_t) * (size_t)cap);
        if (sent)
            c->args_sent = sent;
        if (!ids || !sent)
            return IG_ENOMEM;
        c->cap_heads = cap;
    }
    int k = c->heads++;
    ig_api_make_id(c->call_ids[k], sizeof(c->call_ids[k]), "call_");
    c->args_sent[k] = 0;
    send_call_delta(r, c, k, name, name_len, NULL, 0);
    return 0;
}

/* The calls of the answer so far: each announced once its name is known,
 * its arguments sent as they come (an object's text as the model writes
 * it; arguments given as a JSON string wait for the end, to be unquoted). */
static void stream_calls(wreq_t *r, choice_t *c, const char *text, size_t len,
                         ig_chat_call_span_t *sp, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if ((int)k >= c->heads && announce(r, c, text + sp[k].name_off, sp[k].name_len) < 0)
            return;
        if (sp[k].args_string || sp[k].args_len <= c->args_sent[k])
            continue;
        send_call_delta(r, c, (int)k, NULL, 0, text + sp[k].args_off + c->args_sent[k],
                        sp[k].args_len - c->args_sent[k]);
        c->args_sent[k] = sp[k].args_len;
    }
    (void)len;
}

/* Tools, stream: text is sent as content while it cannot be the start of
 * a call; calls go out as OpenAI streams them: per call a delta with its
 * index, id, type and name (and empty arguments) once the name is whole,
 * then the arguments in pieces as the model writes them, and a last chunk
 * with finish_reason "tool_calls". The end decides: the whole answer is
 * read with ig_chat_parse_tool_calls, and one that is no call after all is
 * sent as content (after calls were announced, only when the model broke
 * the call's JSON at its very end). */
static void send_tools_chunk(wreq_t *r, choice_t *c, int lp_upto)
{
    int normal = c->finish == IG_FINISH_STOP || c->finish == IG_FINISH_LENGTH;
    const char *text = c->text ? c->text : "";
    ig_chat_call_span_t sp[IG_API_MAX_TOOL_CALLS];
    size_t nsp = ig_chat_tools_scan(r->w->chat_tools, text, c->text_len, r->tool_names,
                                    (size_t)r->ntool_names, sp, IG_API_MAX_TOOL_CALLS);
    if (!c->finished || !normal) {
        int in_call = 0;
        size_t safe = r->forced_len ? 0
                                    : ig_chat_tools_content_prefix(r->w->chat_tools, text,
                                                                   c->text_len, &in_call);
        if (c->finished)
            safe = c->sent; /* an error ends it: what was held is not an answer */
        send_chunk(r, c, text + c->sent, safe > c->sent ? safe - c->sent : 0, NULL, lp_upto);
        if (safe > c->sent)
            c->sent = safe;
        if (!c->finished)
            stream_calls(r, c, text, c->text_len, sp, nsp);
        return;
    }
    ig_api_tool_call_t *calls;
    int ncalls;
    size_t content_len;
    if (tool_calls_of(r, c, &calls, &ncalls, &content_len) < 0 || ncalls == 0) {
        send_chunk(r, c, text + c->sent, c->text_len - c->sent, finish_reason(c->finish), lp_upto);
        c->sent = c->text_len;
        return;
    }
    send_chunk(r, c, text + c->sent, content_len > c->sent ? content_len - c->sent : 0, NULL,
               lp_upto);
    c->sent = c->text_len;
    /* The spans the final text gives, where they name the calls read:
     * arguments continue from what was sent; else the parsed arguments. */
    for (int k = 0; k < ncalls; k++) {
        int span = (size_t)k < nsp && !sp[k].args_string && sp[k].args_len > 0 && sp[k].args_done;
        if (k >= c->heads && announce(r, c, calls[k].name, strlen(calls[k].name)) < 0)
            break;
        if (span && sp[k].args_len > c->args_sent[k])
            send_call_delta(r, c, k, NULL, 0, text + sp[k].args_off + c->args_sent[k],
                            sp[k].args_len - c->args_sent[k]);
        else if (!span && c->args_sent[k] == 0)
            send_call_delta(r, c, k, NULL, 0, calls[k].arguments, strlen(calls[k].arguments));
    }
    ig_api_choice_t fin = {.index = c->index, .text = "", .finish_reason = "tool_calls"};
    size_t n;
    char *s = ig_api_chunk_sse(r->api.kind, r->id, r->created, r->w->model_name, &fin, 0,
                               r->api.include_usage, &n);
    if (s)
        stream_write(r, s, n);
    free(s);
    tool_calls_free(calls, ncalls);
}

static void stream_end(wreq_t *r)
{
    ig_api_error_t e;
    if (!r->aborted) {
        if (request_error(r, &e) && !r->cancelled) {
            size_t n;
            char *s = ig_api_error_sse(&e, &n);
            if (s)
                stream_write(r, s, n);
            free(s);
        } else if (r->api.include_usage) {
            ig_api_usage_t u;
            usage_of(r, &u);
            size_t n;
            char *s = ig_api_usage_sse(r->api.kind, r->id, r->created, r->w->model_name, &u, &n);
            if (s)
                stream_write(r, s, n);
            free(s);
        }
        stream_write(r, IG_API_SSE_DONE, strlen(IG_API_SSE_DONE));
        if (r->paused && r->pending_len) {
            /* Hand the rest to the server's queue: ending the stream is the
             * last write, and the connection owns its bytes from here. */
            r->paused = 0;
            size_t n = r->pending_len;
            r->pending_len = 0;
            ig_http_stream_write(r->http, r->pending, n);
        }
    }
    ig_http_stream_end(r->http);
}

/* Every choice has its final event: answer (or end the stream) and free r. */
static void finish_request(wreq_t *r)
{
    if (r->api.stream)
        stream_end(r);
    else
        finish_whole(r);
    r->http_done = 1;
    wreq_free(r);
}

static int submit_choice(worker_t *w, wreq_t *r, choice_t *c);

/* Ends a choice that never ran (its leader failed, or the request went). */
static void finish_unrun(wreq_t *r, choice_t *c, ig_finish_t why, int error)
{
    c->deferred = 0;
    c->finished = 1;
    c->finish = why;
    c->error = error;
    r->nfinished++;
}

/* n > 1: the leader (sample 0) of a prompt has its prefill done (its first
 * token, or its end), so its full prompt blocks are in the prefix cache:
 * the other samples of that prompt are submitted now and find them there. */
static void release_followers(worker_t *w, wreq_t *r, const choice_t *lead)
{
    int n = r->per_prompt;
    for (int j = 1; j < n; j++) {
        choice_t *f = &r->choices[lead->index + j];
        if (!f->deferred)
            continue;
        f->deferred = 0;
        int bad =
            lead->finished && lead->finish != IG_FINISH_STOP && lead->finish != IG_FINISH_LENGTH;
        if (r->cancelled || bad) {
            finish_unrun(r, f, r->cancelled ? IG_FINISH_CANCELLED : lead->finish, lead->error);
            continue;
        }
        int rc = submit_choice(w, r, f);
        if (rc < 0) {
            finish_unrun(r, f, IG_FINISH_ERROR, rc);
            continue;
        }
        if (r->paused)
            ig_sched_pause(w->sched, f->seq_id, 1);
    }
}

static void on_event(const ig_sched_event_t *ev, void *data)
{
    choice_t *c = ev->user;
    wreq_t *r = c->r;
    worker_t *w = data;
    int want_lp = r->api.logprobs >= 0;
    int ntop = want_lp ? r->api.logprobs : 0;

    /* Echo: prompt entries, the first with a null logprob. */
    if (r->api.echo && want_lp) {
        if (!c->prompt_lp_done) {
            add_lp(w, c, NULL, 0, c->prompt[0], 0);
            c->prompt_lp_done = 1;
        }
        for (int i = 0; i < ev->nprompt_lp; i++) {
            int pos = ev->prompt_lp_from + i;
            if (pos == c->prompt_lp_done && pos < c->nprompt) {
                add_lp(w, c, &ev->prompt_lp[i], 1, c->prompt[pos], ntop);
                c->prompt_lp_done++;
            }
        }
    }
    if (r->api.echo && c->lp_offset < c->prompt_text_len && (ev->ntokens || ev->finish))
        c->lp_offset = c->prompt_text_len; /* generated offsets follow the echoed text */
    int lp_prompt_end = c->nlp;
    for (int i = 0; i < ev->ntokens; i++) {
        c->cum_logprob += ev->tokens[i].logprob;
        if (want_lp)
            add_lp(w, c, &ev->tokens[i], 1, ev->tokens[i].token, ntop);
    }
    if (ev->finish != IG_FINISH_NONE) {
        c->finished = 1;
        c->finish = ev->finish;
        c->error = ev->error;
        c->completion_tokens = ev->completion_tokens;
        r->nfinished++;
    }

    if (r->tools && ev->text_len)
        append(&c->text, &c->text_len, &c->text_cap, ev->text, ev->text_len);
    if (r->api.stream && r->tools) {
        if (!r->http_done)
            send_tools_chunk(r, c, c->nlp);
    } else if (r->api.stream) {
        if (!r->http_done) {
            if (r->api.echo && !c->echo_sent && (ev->ntokens || ev->finish)) {
                send_chunk(r, c, c->prompt_text ? c->prompt_text : "", c->prompt_text_len, NULL,
                           lp_prompt_end);
                c->echo_sent = 1;
            }
            int normal = ev->finish == IG_FINISH_STOP || ev->finish == IG_FINISH_LENGTH;
            send_chunk(r, c, ev->text, ev->text_len, normal ? finish_reason(ev->finish) : NULL,
                       c->nlp);
        }
    } else if (ev->text_len && !r->tools) {
        append(&c->text, &c->text_len, &c->text_cap, ev->text, ev->text_len);
    }

    if (c->sample == 0 && r->per_prompt > 1 && (ev->ntokens || c->finished))
        release_followers(w, r, c);

    if (r->nfinished == r->nchoices && !r->http_done)
        finish_request(r);
}

void ig__worker_on_async(uv_async_t *h)
{
    worker_t *w = h->data;
    /* The KV events first: a gateway then hears that blocks are stored
     * before the answer that stored them, and routes the next request by
     * them. */
    ig__worker_kv_pump(w);
    if (w->sched)
        ig_sched_drain(w->sched, on_event, w);
    ig__worker_kv_pump(w);
    ig__worker_kv_load(w);
}

void ig__worker_on_sched_notify(void *data)
{
    uv_async_send(data);
}

static void on_abort(ig_http_req_t *req, void *data)
{
    wreq_t *r = data;
    r->aborted = 1;
    ig__worker_cancel(r);
}

/* ---- generation requests: intake ------------------------------------------ */

/* The fields this worker does not implement are refused by name (400,
 * param = the field), never dropped: a client that asks for structured
 * output or a suffix must not get free text that looks like an answer. */
static int check_fields(worker_t *w, wreq_t *r, ig_api_error_t *e)
{
    const ig_api_request_t *a = &r->api;
    if (a->response_format && strcmp(a->response_format, "text") != 0)
        return ig_api_error(e, 400, "response_format",
                            "'response_format' of type '%s' is not supported by this worker "
                            "(no constrained decoding); only \"text\"",
                            a->response_format);
    if (a->suffix && a->suffix[0])
        return ig_api_error(e, 400, "suffix",
                            "'suffix' (fill-in-the-middle) is not supported by this worker");
    if (a->best_of > a->n && a->stream)
        return ig_api_error(e, 400, "best_of",
                            "'best_of' greater than 'n' cannot be streamed (the best are known "
                            "only at the end)");
    for (int i = 0; i < a->sampling.nlogit_bias; i++)
        if (a->sampling.logit_bias[i].token >= w->vocab)
            return ig_api_error(e, 400, "logit_bias",
                                "'logit_bias' token id %d is outside the vocabulary (size %d)",
                                a->sampling.logit_bias[i].token, w->vocab);
    if (a->kind == IG_API_CHAT && a->ntools && a->tool_choice != IG_API_TOOL_CHOICE_NONE) {
        for (int i = 0; i < a->ntools; i++)
            if (!a->tools[i].name)
                return ig_api_error(e, 400, "tools",
                                    "tools[%d] has type '%s'; this worker serves function tools "
                                    "only",
                                    i, a->tools[i].type);
        if (w->chat_tools == IG_CHAT_TOOLS_NONE)
            return ig_api_error(e, 400, "tools",
                                "this model's chat template (%s) has no tool convention, so "
                                "'tools' cannot be given to it; send \"tool_choice\": \"none\" "
                                "or no tools",
                                ig_chat_style_name(w->chat_style));
        r->tool_names = calloc((size_t)a->ntools, sizeof(char *));
        if (!r->tool_names)
            return ig_api_error_oom(e);
        for (int i = 0; i < a->ntools; i++)
            r->tool_names[r->ntool_names++] = a->tools[i].name;
        r->tools = 1;
        const char *force = a->tool_choice == IG_API_TOOL_CHOICE_REQUIRED   ? ""
                            : a->tool_choice == IG_API_TOOL_CHOICE_FUNCTION ? a->tool_choice_name
                                                                            : NULL;
        r->forced_len =
            ig_chat_tools_forced_prefix(w->chat_tools, force, r->forced, sizeof(r->forced));
    }
    int nprompts = a->kind == IG_API_CHAT ? 1 : a->nprompts;
    r->per_prompt = a->best_of > a->n ? a->best_of : a->n;
    if (nprompts * r->per_prompt > w->o.max_waiting)
        return ig_api_error(e, 400, a->best_of > a->n ? "best_of" : "n",
                            "%d prompts x %d samples = %d sequences; this worker queues at most "
                            "%d",
                            nprompts, r->per_prompt, nprompts * r->per_prompt, w->o.max_waiting);
    return 0;
}

/* Tokens of prompt p into its leader (choice p * n); the other samples of
 * the prompt get copies. */
static int prepare_prompt(worker_t *w, wreq_t *r, int p, choice_t *c, ig_api_error_t *e)
{
    ig_api_request_t *a = &r->api;
    int rc;
    if (a->kind == IG_API_CHAT) {
        char err[256] = "";
        rc = ig_prefix_prompt_tokens(w->tok, w->chat_style, a, 0, &c->prompt, &c->nprompt, err,
                                     sizeof(err));
        if (rc == IG_EINVAL)
            return ig_api_error(e, 400, "messages", "%s",
                                err[0] ? err : "the messages cannot be rendered");
    } else if (a->prompts[p].text) {
        const ig_api_prompt_t *pr = &a->prompts[p];
        size_t bad = 0;
        if (ig_tokenizer_utf8_check(pr->text, pr->text_len, &bad) < 0)
            return ig_api_error(e, 400, "prompt", "'prompt' is not valid UTF-8 (byte %zu)", bad);
        rc = ig_prefix_prompt_tokens(w->tok, w->chat_style, a, p, &c->prompt, &c->nprompt, NULL, 0);
        if (rc == 0 && a->echo) {
            c->prompt_text = strdup(pr->text);
            c->prompt_text_len = pr->text_len;
        }
    } else {
        const ig_api_prompt_t *pr = &a->prompts[p];
        for (int k = 0; k < pr->nids; k++)
            if (pr->ids[k] >= w->vocab)
                return ig_api_error(e, 400, "prompt",
                                    "token id %d at position %d is outside the vocabulary "
                                    "(size %d)",
                                    pr->ids[k], k, w->vocab);
        c->prompt = malloc(sizeof(int) * (size_t)pr->nids);
        rc = c->prompt ? 0 : IG_ENOMEM;
        if (rc == 0) {
            memcpy(c->prompt, pr->ids, sizeof(int) * (size_t)pr->nids);
            c->nprompt = pr->nids;
        }
        if (rc == 0 && a->echo) {
            int32_t *ids32 = malloc(sizeof(int32_t) * (size_t)pr->nids);
            char *txt = NULL;
            size_t tl = 0;
            for (int k = 0; ids32 && k < pr->nids; k++)
                ids32[k] = pr->ids[k];
            if (ids32 && ig_tokenizer_decode(w->tok, ids32, (size_t)pr->nids,
                                             IG_TOKENIZER_SKIP_SPECIAL, &txt, &tl) == 0) {
                c->prompt_text = txt;
                c->prompt_text_len = tl;
            }
            free(ids32);
        }
    }
    if (rc == IG_ENOMEM)
        return ig_api_error_oom(e);
    if (rc < 0)
        return ig_api_error(e, 400, a->kind == IG_API_CHAT ? "messages" : "prompt",
                            "the prompt cannot be tokenized: %s", ig_strerror(rc));
    if (ig_api_check_prompt_limit(a, c->nprompt, w->o.max_prompt_tokens, e) < 0 ||
        ig_api_check_context(a, c->nprompt, w->context, e) < 0)
        return IG_EINVAL;
    return 0;
}

/* A follower's copy of its leader's prompt (ids and echo text). */
static int copy_prompt(choice_t *to, const choice_t *from)
{
    to->prompt = malloc(sizeof(int) * (size_t)from->nprompt);
    if (!to->prompt)
        return IG_ENOMEM;
    memcpy(to->prompt, from->prompt, sizeof(int) * (size_t)from->nprompt);
    to->nprompt = from->nprompt;
    if (from->prompt_text) {
        if (!(to->prompt_text = malloc(from->prompt_text_len + 1)))
            return IG_ENOMEM;
        memcpy(to->prompt_text, from->prompt_text, from->prompt_text_len + 1);
        to->prompt_text_len = from->prompt_text_len;
    }
    return 0;
}

static int prepare_prompts(worker_t *w, wreq_t *r, ig_api_error_t *e)
{
    ig_api_request_t *a = &r->api;
    int nprompts = a->kind == IG_API_CHAT ? 1 : a->nprompts, n = r->per_prompt;
    r->choices = calloc((size_t)(nprompts * n), sizeof(choice_t));
    if (!r->choices)
        return ig_api_error_oom(e);
    r->nchoices = nprompts * n;
    for (int p = 0; p < nprompts; p++) {
        choice_t *lead = &r->choices[p * n];
        for (int j = 0; j < n; j++) {
            choice_t *c = &r->choices[p * n + j];
            c->r = r;
            c->index = p * n + j;
            c->sample = j;
        }
        int rc = prepare_prompt(w, r, p, lead, e);
        if (rc < 0)
            return rc;
        for (int j = 1; j < n; j++)
            if (copy_prompt(&r->choices[p * n + j], lead) < 0)
                return ig_api_error_oom(e);
        /* A forced tool choice: the answer starts with the prompt's last
         * words (the start of a call), read back with the rest. */
        for (int j = 0; j < n && r->forced_len; j++) {
            choice_t *c = &r->choices[p * n + j];
            if (append(&c->text, &c->text_len, &c->text_cap, r->forced, r->forced_len) < 0)
                return ig_api_error_oom(e);
        }
    }
    return 0;
}

/* Queues one choice's sequence. Each choice has its own seed stream,
 * seed + its index (prompt i of a batch with n = 1 keeps seed + i). */
static int submit_choice(worker_t *w, wreq_t *r, choice_t *c)
{
    ig_api_request_t *a = &r->api;
    ig_sched_req_t sr;
    memset(&sr, 0, sizeof(sr));
    sr.prompt = c->prompt;
    sr.nprompt = c->nprompt;
    sr.sampling = a->sampling;
    sr.has_seed = a->has_seed;
    sr.seed = a->seed + (uint64_t)c->index;
    if (a->max_tokens > 0) {
        sr.max_tokens = a->max_tokens;
    } else { /* chat without a limit: up to the context, and what the KV cache holds */
        int room = w->context < w->kv_tokens ? w->context : w->kv_tokens;
        sr.max_tokens = room - c->nprompt > 1 ? room - c->nprompt : 1;
    }
    sr.ignore_eos = a->ignore_eos;
    int ids[IG_API_MAX_STOP_IDS + 32];
    int nids = 0;
    for (int k = 0; k < a->nstop_ids; k++)
        ids[nids++] = a->stop_ids[k];
    /* The template's end-of-turn tokens are EOS-like: ignore_eos (what
     * benchmarks send to get the asked length) runs through them too, as
     * vLLM does with generation_config's EOS ids. */
    if (a->kind == IG_API_CHAT && !a->ignore_eos)
        for (int k = 0; k < w->nchat_stop; k++)
            ids[nids++] = w->chat_stop[k];
    sr.stop_ids = ids;
    sr.nstop_ids = nids;
    const char *stops[IG_API_MAX_STOP + 1];
    int nstops = 0;
    for (int k = 0; k < a->nstop; k++)
        stops[nstops++] = a->stop[k];
    /* parallel_tool_calls false: the answer ends with its first call. */
    if (r->tools && a->parallel_tool_calls == 0 && w->chat_tools == IG_CHAT_TOOLS_HERMES)
        stops[nstops++] = "</tool_call>";
    sr.stop = stops;
    sr.nstop = nstops;
    /* best_of ranks by the sampled tokens' logprobs: computed even when
     * the client shows none. */
    sr.logprobs = a->logprobs < 0 && r->per_prompt > a->n ? 0 : a->logprobs;
    sr.prompt_logprobs = a->echo && a->logprobs >= 0;
    sr.deadline_ns = r->deadline_ns;
    sr.user = c;
    int rc = ig_sched_submit(w->sched, &sr, &c->seq_id);
    if (rc == 0)
        c->submitted = 1;
    return rc;
}

void ig__worker_generate(worker_t *w, ig_http_req_t *req, ig_api_kind_t kind)
{
    ig_api_error_t e;
    if (w->state == W_LOADING) {
        ig__worker_respond_loading(req);
        return;
    }
    if (w->state != W_READY) {
        ig_api_error(&e, 503, NULL,
                     w->state == W_DRAINING ? "the worker is shutting down"
                                            : "the model failed "
                                              "to load");
        ig_api_respond_error(req, &e);
        return;
    }
    wreq_t *r = calloc(1, sizeof(*r));
    if (!r) {
        ig_api_respond_oom(req);
        return;
    }
    r->w = w;
    r->http = req;
    r->next = w->reqs;
    if (w->reqs)
        w->reqs->prev = r;
    w->reqs = r;
    w->nreqs++;

    size_t len;
    const char *body = ig_http_req_body(req, &len);
    if (ig_api_parse(kind, body, len, &r->api, &e) < 0)
        goto fail;
    if (r->api.model && strcmp(r->api.model, w->model_name) != 0) {
        ig_api_error(&e, 404, "model", "The model `%s` does not exist.", r->api.model);
        e.code = "model_not_found";
        goto fail;
    }
    if (check_fields(w, r, &e) < 0 || prepare_prompts(w, r, &e) < 0)
        goto fail;

    /* Queue room for every choice first: no half-submitted batch. Only this
     * thread submits, so the check cannot go stale before the submits. */
    ig_sched_stats_t st;
    ig_sched_stats(w->sched, &st);
    if (st.waiting + r->nchoices > st.max_waiting) {
        ig_api_error(&e, 429, NULL, "the worker's queue is full (%d waiting); retry later",
                     st.waiting);
        e.retry_after_s = (int)ceil(st.est_wait_s > 1 ? st.est_wait_s : 1);
        ig_api_respond_error(req, &e);
        wreq_free(r);
        return;
    }

    ig_api_make_id(r->id, sizeof(r->id), kind == IG_API_CHAT ? "chatcmpl-" : "cmpl-");
    r->created = (long long)time(NULL);
    double tmo = w->o.request_timeout_s;
    const char *h = ig_http_req_header(req, "x-infergate-timeout-ms");
    if (h && atof(h) > 0 && (tmo <= 0 || atof(h) / 1000.0 < tmo))
        tmo = atof(h) / 1000.0;
    if (tmo > 0)
        r->deadline_ns = ig_http_req_start_ns(req) + (uint64_t)(tmo * 1e9);

    /* n > 1 with the prefix cache on: the first sample of each prompt goes
     * now, the others once its prefill is done (release_followers), so the
     * prompt is prefilled once and its KV blocks shared. */
    int defer = r->per_prompt > 1 && w->o.prefix_cache;
    for (int i = 0; i < r->nchoices; i++) {
        choice_t *c = &r->choices[i];
        if (c->sample > 0 && defer) {
            c->deferred = 1;
            continue;
        }
        if (c->finished)
            continue; /* a follower of a leader that could not be queued */
        int rc = submit_choice(w, r, c);
        if (rc < 0) {
            if (i == 0) {
                if (rc == IG_EFULL)
                    ig_api_error(&e, 429, NULL, "the worker's queue is full; retry later");
                else if (rc == IG_ETOOLONG)
                    ig_api_error(&e, 400, kind == IG_API_CHAT ? "messages" : "prompt",
                                 "the prompt (%d tokens) and max_tokens do not fit in this "
                                 "worker's KV cache",
                                 c->nprompt);
                else if (rc == IG_ENOMEM)
                    ig_api_error_oom(&e);
                else
                    ig_api_error(&e, 500, NULL, "cannot queue the request: %s", ig_strerror(rc));
                goto fail;
            }
            /* Later choices: the earlier ones are running, so finish this
             * one (and its deferred samples) as failed; the response
             * reports it. */
            finish_unrun(r, c, IG_FINISH_ERROR, rc);
            for (int j = 1; c->sample == 0 && j < r->per_prompt; j++)
                if (r->choices[i + j].deferred || !r->choices[i + j].submitted)
                    finish_unrun(r, &r->choices[i + j], IG_FINISH_ERROR, rc);
            continue;
        }
    }
    ig_http_req_set_data(req, r);
    ig_http_req_on_abort(req, on_abort, r);
    if (r->api.stream) {
        ig_http_req_on_drain(req, on_drain, r);
        ig_http_add_header(req, "Cache-Control", "no-cache");
        ig_http_stream_start(req, 200, "text/event-stream");
        r->stream_started = 1;
        if (kind == IG_API_CHAT) {
            for (int i = 0; i < r->nchoices; i++) {
                ig_api_choice_t ch = {.index = r->choices[i].index, .text = "", .len = 0};
                size_t n;
                char *s = ig_api_chunk_sse(kind, r->id, r->created, w->model_name, &ch, 1,
                                           r->api.include_usage, &n);
                if (s)
                    stream_write(r, s, n);
                free(s);
            }
        }
    }
    if (r->nfinished == r->nchoices) /* every submit failed after the first */
        finish_request(r);
    else
        ig__worker_kv_load(w); /* the gateways hear of it before its prefill */
    return;
fail:
    ig_api_respond_error(req, &e);
    /* Submitted choices (none when the first failed) cannot exist here. */
    wreq_free(r);
}
