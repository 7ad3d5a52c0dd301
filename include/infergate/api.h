#ifndef INFERGATE_API_H
#define INFERGATE_API_H

/*
 * The OpenAI-compatible API, shared by the gateway and the worker: one parser
 * that validates a request body into ONE request struct, one set of error
 * messages, and the JSON builders of responses and SSE chunks. The worker
 * hands the parsed request to its scheduler; the gateway reads what routing
 * needs from it and forwards the client's body upstream.
 *
 * Validation rule: unknown field names are ignored (OpenAI clients send
 * extras), but a known field with the wrong type or out of range is a 400
 * whose `param` names the field. The parser never refuses a field because
 * some backend does not implement it (n, best_of, tools, response_format,
 * suffix, logit_bias...): it records it, and the backend that serves the
 * request honours it or refuses it by name (a worker: docs/worker.md).
 *
 * Ownership: a parsed request owns its strings and arrays (malloc) until
 * ig_api_request_dispose(). Builders return new references (json_t *) or
 * malloc'ed strings the caller frees; they copy what they are given.
 */

#include "infergate/http.h"
#include "infergate/sampling.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define IG_API_MAX_STOP 16      /* stop strings per request */
#define IG_API_MAX_STOP_IDS 64  /* stop_token_ids per request */
#define IG_API_MAX_PROMPTS 64   /* prompts in one completions batch */
#define IG_API_MAX_LOGPROBS 20  /* logprobs / top_logprobs upper bound */
#define IG_API_MAX_STOP_LEN 256 /* bytes of one stop string */
#define IG_API_MAX_CHOICES 128  /* n and best_of */

typedef enum {
    IG_API_COMPLETION = 0, /* POST /v1/completions */
    IG_API_CHAT,           /* POST /v1/chat/completions */
} ig_api_kind_t;

/* One completions prompt: text, or token ids used exactly as given. */
typedef struct {
    char *text; /* NUL-terminated UTF-8, or NULL when ids are given */
    size_t text_len;
    int *ids; /* (nids) when text is NULL */
    int nids;
} ig_api_prompt_t;

/* Bounds of the lists a request may carry; each is named in its 400. */
#define IG_API_MAX_TOOLS 128      /* tools per request */
#define IG_API_MAX_TOOL_CALLS 128 /* tool_calls of one assistant message */
#define IG_API_MAX_LOGIT_BIAS 300 /* logit_bias entries (IG_SAMPLER_MAX_BIAS) */
#define IG_API_MAX_NAME 256       /* bytes of a function or tool-call name/id */

/* One tool call of an assistant message in the history (chat). */
typedef struct {
    char *id;        /* "" when the client sent none */
    char *name;      /* function name */
    char *arguments; /* the arguments as the client sent them: JSON text */
} ig_api_tool_call_t;

/* One chat message; content parts of type text are joined. */
typedef struct {
    char *role;                     /* "system", "user", "assistant", "tool", "developer" */
    char *content;                  /* never NULL ("" for a null content) */
    ig_api_tool_call_t *tool_calls; /* (ntool_calls) assistant only */
    int ntool_calls;
    char *tool_call_id; /* tool messages: the call answered; NULL when absent */
    char *name;         /* the optional `name` of a message; NULL when absent */
} ig_api_message_t;

/* One entry of `tools`: {type: "function", function: {name, description?,
 * parameters?}}. */
typedef struct {
    char *type; /* "function"; other types are recorded with name NULL */
    char *name;
    char *description; /* NULL when absent */
    char *parameters;  /* JSON text of the schema object, NULL when absent */
} ig_api_tool_t;

typedef enum {
    IG_API_TOOL_CHOICE_AUTO = 0, /* the default when tools are given */
    IG_API_TOOL_CHOICE_NONE,     /* "none": tools are not rendered */
    IG_API_TOOL_CHOICE_REQUIRED, /* "required": some tool must be called */
    IG_API_TOOL_CHOICE_FUNCTION, /* {type: function, function: {name}}: that one */
} ig_api_tool_choice_t;

typedef struct {
    ig_api_kind_t kind;
    char *model; /* NULL when the body names none */

    ig_api_prompt_t *prompts; /* (nprompts) completions only */
    int nprompts;
    ig_api_message_t *messages; /* (nmessages) chat only */
    int nmessages;

    int max_tokens; /* > 0; 0 = not given in chat: up to the context */
    ig_sampling_params_t sampling;
    int has_seed;
    uint64_t seed;
    char **stop; /* (nstop) non-empty strings */
    int nstop;
    int *stop_ids; /* (nstop_ids) vLLM's stop_token_ids */
    int nstop_ids;
    int ignore_eos;

    int stream;
    int include_usage; /* stream_options.include_usage */
    int logprobs;      /* -1: none; else the top N to return (0..20) */
    int echo;          /* completions: prompt (and its logprobs) in the reply */

    /* Recorded for whoever serves the request: the gateway forwards the
     * client's body, a worker honours each field or refuses it by name. */
    int n;                /* choices per prompt (1 when not given) */
    int best_of;          /* candidates per prompt the server ranks (n when not given) */
    int max_tokens_given; /* max_tokens or max_completion_tokens was sent */
    ig_api_tool_t *tools; /* (ntools) */
    int ntools;
    ig_api_tool_choice_t tool_choice;
    char *tool_choice_name;  /* IG_API_TOOL_CHOICE_FUNCTION: the function */
    int parallel_tool_calls; /* -1 absent, else 0 / 1 */
    char *response_format;   /* its `type` ("text", "json_object", "json_schema"), NULL absent */
    char *suffix;            /* completions; NULL when absent */
    char *user;              /* NULL when absent */
} ig_api_request_t;

/* An error as the client sees it. */
typedef struct {
    int status;       /* HTTP status: 400, 404, 429, 500, 503 */
    const char *type; /* "invalid_request_error", ... (static) */
    const char *code; /* NULL or a static code ("context_length_exceeded") */
    char param[64];   /* "" when no single field is at fault */
    char message[512];
    int retry_after_s; /* 429 and 503: the Retry-After to send (0: 1 s) */
} ig_api_error_t;

/* Fills err; returns IG_EINVAL so that callers can `return ig_api_error(...)`.
 * type NULL picks the type from the status. param may be NULL. */
int ig_api_error(ig_api_error_t *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Fills err with the one answer to running out of memory: 503 "out of memory"
 * (a transient server condition: the client, or a gateway, may retry, after
 * Retry-After: 1). Returns IG_ENOMEM. */
int ig_api_error_oom(ig_api_error_t *err);

/* The type string for a status: 400 invalid_request_error, 401
 * authentication_error, 404 not_found_error, 429 rate_limit_error, 503
 * unavailable_error, else server_error. */
const char *ig_api_error_type(int status);

/* {"error":{"message","type","param","code"}}; new reference. */
json_t *ig_api_error_json(const ig_api_error_t *err);

/*
 * Parses and validates a body. On success returns 0 and fills req (dispose
 * it). On failure returns IG_EINVAL with a 400 in err (or IG_ENOMEM with
 * ig_api_error_oom's 503) and leaves nothing to dispose.
 */
int ig_api_parse_completion(const char *body, size_t len, ig_api_request_t *req,
                            ig_api_error_t *err);
int ig_api_parse_chat(const char *body, size_t len, ig_api_request_t *req, ig_api_error_t *err);
int ig_api_parse(ig_api_kind_t kind, const char *body, size_t len, ig_api_request_t *req,
                 ig_api_error_t *err);
void ig_api_request_dispose(ig_api_request_t *req);

/*
 * What a gateway that forwards the body reads of it, at a fraction of a
 * parse's cost: the whole body's JSON syntax is checked (ig_json_scan),
 * and of its fields only those the gateway acts on are validated, as
 * ig_api_parse validates them: model, max_tokens (max_completion_tokens),
 * stream, n and best_of, and that the prompt (completions) or messages
 * (chat) are there. The rest is the site's to judge. *prompt_bytes: the
 * size of the prompt's or the messages' JSON. Returns 0 with those fields
 * in req (no prompts or messages); 1 when the prompt is a list (token ids,
 * or several prompts), which only ig_api_parse reads; IG_EINVAL or
 * IG_ENOMEM with err as ig_api_parse. Dispose req after 0 or 1.
 */
int ig_api_peek(ig_api_kind_t kind, const char *body, size_t len, ig_api_request_t *req,
                size_t *prompt_bytes, ig_api_error_t *err);

/* A request body as a JSON object (new reference), or NULL with the 400 for
 * bad JSON or a body that is not an object in err. */
json_t *ig_api_load_object(const char *body, size_t len, ig_api_error_t *err);

/* A canonical body of a parsed request's prompt and sampling fields, n and
 * best_of (the parser's round trip, for tests and the fuzzer). It is not
 * what a gateway forwards: that is the client's body, whose tools,
 * logit_bias and other recorded fields this leaves out. New reference, or
 * NULL when out of memory. */
json_t *ig_api_request_to_json(const ig_api_request_t *req);

/*
 * The checks that need the tokenizer, in one place so that the gateway and
 * the worker word them the same: a prompt of ntok tokens against a context of
 * ctx tokens with max_tokens to generate. Returns 0 or IG_ETOOLONG with a 400
 * naming the lengths (code context_length_exceeded).
 */
int ig_api_check_context(const ig_api_request_t *req, int ntok, int ctx, ig_api_error_t *err);

/* The operator's prompt limit (limits.max_prompt_tokens, the worker's
 * --max-prompt-tokens): a prompt of ntok tokens over limit is IG_ETOOLONG
 * with a 400 naming both numbers (code context_length_exceeded); limit 0
 * means none here (the context check still applies). */
int ig_api_check_prompt_limit(const ig_api_request_t *req, int ntok, int limit,
                              ig_api_error_t *err);

/* Writes "<prefix><24 random hex digits>" into buf (at least 48 bytes). */
void ig_api_make_id(char *buf, size_t cap, const char *prefix);

/* ---- responses ---------------------------------------------------------- */

typedef struct {
    const char *token; /* the candidate's text (bytes, may be partial UTF-8) */
    size_t len;
    float logprob;
} ig_api_top_logprob_t;

/* One position of logprobs. */
typedef struct {
    const char *token; /* the token's text (bytes) */
    size_t len;
    int has_logprob; /* 0 for the first echoed prompt position: null */
    float logprob;
    const ig_api_top_logprob_t *top; /* (ntop) most likely first */
    int ntop;
    size_t text_offset; /* byte offset of the token in the choice's text */
} ig_api_token_logprob_t;

typedef struct {
    int index;
    const char *text; /* completion text (with the prompt first when echo) */
    size_t len;
    const char *finish_reason;        /* NULL: null (a stream chunk) */
    int has_logprobs;                 /* emit logprobs (else null) */
    const ig_api_token_logprob_t *lp; /* (nlp) */
    int nlp;
    /* Chat: the message's tool calls (message.tool_calls, content null when
     * there is no text), or a stream chunk's (delta.tool_calls numbered from
     * tool_call_index; a NULL id or name is left out, as in the chunks that
     * carry only more arguments of a call). */
    const ig_api_tool_call_t *tool_calls; /* (ntool_calls) */
    int ntool_calls;
    int tool_call_index;
} ig_api_choice_t;

typedef struct {
    int prompt_tokens;
    int completion_tokens;
} ig_api_usage_t;

/*
 * A whole (non-streamed) response: text_completion or chat.completion with
 * choices and usage. New reference, NULL when out of memory. Texts that are
 * not valid UTF-8 are repaired with U+FFFD (JSON strings must be UTF-8).
 */
json_t *ig_api_response_json(ig_api_kind_t kind, const char *id, long long created,
                             const char *model, const ig_api_choice_t *choices, int nchoices,
                             const ig_api_usage_t *usage);

/*
 * One SSE event "data: {json}\n\n" (malloc'ed, *len set when len is not
 * NULL). A completion chunk carries choices[{index,text,logprobs,
 * finish_reason}]; a chat chunk carries choices[{index,delta,logprobs,
 * finish_reason}], where delta is {"role":"assistant","content":""} when
 * role_delta is set, {"content":text} when text is not empty, else {}, plus
 * "tool_calls" when the choice carries some.
 * usage_null adds "usage": null (set when the client asked for usage).
 */
char *ig_api_chunk_sse(ig_api_kind_t kind, const char *id, long long created, const char *model,
                       const ig_api_choice_t *choice, int role_delta, int usage_null, size_t *len);

/* The last usage event: empty choices and usage. */
char *ig_api_usage_sse(ig_api_kind_t kind, const char *id, long long created, const char *model,
                       const ig_api_usage_t *usage, size_t *len);

/* An error inside a stream: data: {"error":{...}}\n\n. */
char *ig_api_error_sse(const ig_api_error_t *err, size_t *len);

#define IG_API_SSE_DONE "data: [DONE]\n\n"

/* GET /v1/models: {"object":"list","data":[{"id","object":"model","created",
 * "owned_by"}]}; new reference. */
json_t *ig_api_models_json(const char *const *ids, int n, long long created, const char *owner);

/* Serialises compactly into a malloc'ed string. */
char *ig_api_dumps(const json_t *v, size_t *len);

/* ---- answering a request --------------------------------------------------
 * The one place the gateway and the worker turn JSON and errors into HTTP
 * responses, so that both answer the same way. Each finishes req. */

/* Sends doc (stolen; NULL means a builder ran out of memory) as
 * application/json with status. Out of memory: as ig_api_error_oom(). */
void ig_api_respond_json(ig_http_req_t *req, int status, json_t *doc);

/* Sends err as {"error":{"message","type","param","code"}} with its status;
 * 429 and 503 carry Retry-After (err->retry_after_s, at least 1 s). */
void ig_api_respond_error(ig_http_req_t *req, const ig_api_error_t *err);

/* Sends ig_api_error_oom()'s 503 + Retry-After. */
void ig_api_respond_oom(ig_http_req_t *req);

/* ---- routed endpoints -------------------------------------------------------
 * POST /v1/embeddings and POST /v1/responses: the gateway routes them whole
 * to an upstream that serves them (no local worker does). Parsing reads
 * only what routing needs and checks those fields' types; the body goes
 * upstream as the client sent it (gateway/api/routed.c). */

typedef enum {
    IG_API_EMBEDDINGS = 0, /* POST /v1/embeddings */
    IG_API_RESPONSES,      /* POST /v1/responses */
} ig_api_routed_kind_t;

typedef struct {
    ig_api_routed_kind_t kind;
    char *model;      /* malloc'ed; never NULL after a successful parse */
    int stream;       /* responses: the answer is an SSE stream */
    int ninputs;      /* embeddings: inputs in the list (1 for one input) */
    int input_tokens; /* an estimate: text bytes / 4, or the ids counted */
    int max_tokens;   /* responses' max_output_tokens; 0: not given */
} ig_api_routed_t;

/* Parses body for kind into out (dispose it). 0, or IG_EINVAL with a 400 in
 * err (IG_ENOMEM with ig_api_error_oom's 503); nothing to dispose then. */
int ig_api_parse_routed(ig_api_routed_kind_t kind, const char *body, size_t len,
                        ig_api_routed_t *out, ig_api_error_t *err);
void ig_api_routed_dispose(ig_api_routed_t *r);

/* The path of kind: "/v1/embeddings" or "/v1/responses" (static). */
const char *ig_api_routed_path(ig_api_routed_kind_t kind);

/* The body with each of fields[0..nfields) that it holds capped at cap, or
 * fields[0] added at the end when it holds none; every other field, and the
 * order, unchanged. *out is malloc'ed, the caller frees. 0, IG_EINVAL (not a
 * JSON object) or IG_ENOMEM. The gateway's one edit of a forwarded body: a
 * key's token limit capping what may be generated (docs/routing.md, "What
 * the gateway changes in a forwarded body"). */
int ig_api_body_cap(const char *body, size_t len, const char *const *fields, int nfields,
                    long long cap, char **out, size_t *out_len);

#endif
