/*
 * Chat templates of the three common families, written as code rather than
 * run through a Jinja engine: the families are few and fixed, and a Jinja
 * interpreter in the server would be a large attack surface for a small gain.
 *
 * What the template writes (markers, role headers, BOS/EOS) is recorded as
 * marked spans of the output; message content is not. The encoder matches
 * special tokens only inside the marks, so a user who types "<|im_end|>"
 * sends those characters, not the control token.
 */
#include "infergate/chat.h"

#include "infergate/error.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
    ig_tokspan_t *marks; /* (nmarks) what the template wrote, in order */
    size_t nmarks, cap_marks;
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    if (o->oom)
        return;
    if (o->len + n + 1 > o->cap) {
        size_t c = o->cap ? o->cap : 256;
        char *np;
        while (c < o->len + n + 1)
            c *= 2;
        if (!(np = realloc(o->p, c))) {
            o->oom = 1;
            return;
        }
        o->p = np;
        o->cap = c;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = 0;
}

/* Template text: appended and marked (adjacent marks merge into one). */
static void mark(out_t *o, const char *s)
{
    size_t off = o->len, n = s ? strlen(s) : 0;
    if (n == 0 || o->oom)
        return;
    put(o, s, n);
    if (o->oom)
        return;
    if (o->nmarks > 0 && o->marks[o->nmarks - 1].off + o->marks[o->nmarks - 1].len == off) {
        o->marks[o->nmarks - 1].len += n;
        return;
    }
    if (o->nmarks == o->cap_marks) {
        size_t c = o->cap_marks ? o->cap_marks * 2 : 16;
        ig_tokspan_t *nm = realloc(o->marks, c * sizeof(*nm));
        if (!nm) {
            o->oom = 1;
            return;
        }
        o->marks = nm;
        o->cap_marks = c;
    }
    o->marks[o->nmarks].off = off;
    o->marks[o->nmarks].len = n;
    o->nmarks++;
}

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Jinja's `trim` / Python's strip() on ASCII whitespace. */
static void put_trim(out_t *o, const char *s, size_t n, int left, int right)
{
    while (left && n && is_ws((unsigned char)s[0])) {
        s++;
        n--;
    }
    while (right && n && is_ws((unsigned char)s[n - 1]))
        n--;
    put(o, s, n);
}

static int err_set(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return IG_EINVAL;
}

ig_chat_style_t ig_chat_detect_why(const char *t, const char **why)
{
    const char *unused;
    if (!why)
        why = &unused;
    if (!t) {
        *why = "the tokenizer has no chat_template: ChatML is the default";
        return IG_CHAT_CHATML;
    }
    if (strstr(t, "<|start_header_id|>")) {
        *why = "its chat_template has <|start_header_id|>";
        return IG_CHAT_LLAMA3;
    }
    if (strstr(t, "<|im_start|>")) {
        *why = "its chat_template has <|im_start|>";
        return IG_CHAT_CHATML;
    }
    if (strstr(t, "[INST]")) {
        *why = "its chat_template has [INST]";
        return IG_CHAT_LLAMA2;
    }
    *why = "its chat_template has none of <|start_header_id|>, <|im_start|>, [INST]: "
           "ChatML is the fallback";
    return IG_CHAT_CHATML;
}

ig_chat_style_t ig_chat_detect(const char *t)
{
    return ig_chat_detect_why(t, NULL);
}

int ig_chat_detect_fallback(const char *t)
{
    return t != NULL && !strstr(t, "<|start_header_id|>") && !strstr(t, "<|im_start|>") &&
           !strstr(t, "[INST]");
}

const char *ig_chat_style_name(ig_chat_style_t style)
{
    switch (style) {
    case IG_CHAT_LLAMA2:
        return "llama2";
    case IG_CHAT_LLAMA3:
        return "llama3";
    default:
        return "chatml";
    }
}

static int role_ok(const char *r)
{
    return r && (strcmp(r, "system") == 0 || strcmp(r, "user") == 0 ||
                 strcmp(r, "assistant") == 0 || strcmp(r, "tool") == 0);
}

/* Llama-2: an optional system message folds into the first user turn; user
 * and assistant turns must alternate, user first. */
static int render_llama2(out_t *o, const ig_chat_msg_t *m, size_t n, const char *bos,
                         const char *eos, char *err, size_t errlen)
{
    size_t first = 0;
    const ig_chat_msg_t *sys = NULL;
    if (n && strcmp(m[0].role, "system") == 0) {
        sys = &m[0];
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        int want_user = (i - first) % 2 == 0;
        /* Meta's Llama-2 template has no tool turn; folding one into a user
         * turn would make the model take tool output for the user's words. */
        if (strcmp(m[i].role, "tool") == 0)
            return err_set(err, errlen,
                           "messages[%zu].role: \"tool\" messages are not supported by this "
                           "model's chat template (Llama-2 has no tool turn)",
                           i);
        if ((strcmp(m[i].role, "user") == 0) != want_user || strcmp(m[i].role, "system") == 0)
            return err_set(err, errlen,
                           "messages[%zu].role: Llama-2 chat needs user and assistant turns to "
                           "alternate, user first, after an optional leading system message",
                           i);
        if (want_user) {
            mark(o, bos);
            mark(o, "[INST] ");
            if (i == first && sys) {
                mark(o, "<<SYS>>\n");
                put(o, sys->content, sys->content_len);
                mark(o, "\n<</SYS>>\n\n");
                put_trim(o, m[i].content, m[i].content_len, 0, 1);
            } else {
                put_trim(o, m[i].content, m[i].content_len, 1, 1);
            }
            mark(o, " [/INST]");
        } else {
            mark(o, " ");
            put_trim(o, m[i].content, m[i].content_len, 1, 1);
            mark(o, " ");
            mark(o, eos);
        }
    }
    return 0;
}

/* ---- tools ----------------------------------------------------------------- */

ig_chat_tools_t ig_chat_detect_tools(ig_chat_style_t style, const char *t)
{
    if (!t)
        return IG_CHAT_TOOLS_NONE;
    if (style == IG_CHAT_CHATML && strstr(t, "<tool_call>"))
        return IG_CHAT_TOOLS_HERMES;
    /* Llama 3.0's template has no tools; 3.1+ writes "Environment: ipython"
     * and loops over `tools`. */
    if (style == IG_CHAT_LLAMA3 && (strstr(t, "ipython") || strstr(t, "tools")))
        return IG_CHAT_TOOLS_LLAMA3;
    return IG_CHAT_TOOLS_NONE;
}

const char *ig_chat_tools_name(ig_chat_tools_t t)
{
    return t == IG_CHAT_TOOLS_HERMES   ? "hermes"
           : t == IG_CHAT_TOOLS_LLAMA3 ? "llama3_json"
                                       : "none";
}

/* A tool as its template writes it: {"type": "function", "function": {name,
 * description, parameters}} with Python's json.dumps separators (", ", ": ")
 * on one line (Hermes) or indented by 4 (Llama 3's tojson(indent=4)). It is
 * the client's text, so it is content, never markers. */
static int put_tool(out_t *o, const ig_chat_tool_t *t, int indent, char *err, size_t errlen)
{
    json_t *fn = json_object(), *root = json_object();
    int rc = 0;
    if (!fn || !root) {
        rc = IG_ENOMEM;
        goto done;
    }
    json_object_set_new(fn, "name", json_string(t->name ? t->name : ""));
    if (t->description)
        json_object_set_new(fn, "description", json_string(t->description));
    if (t->parameters) {
        json_t *p = json_loads(t->parameters, 0, NULL);
        if (!p) {
            rc = err_set(err, errlen, "tools: the parameters of '%s' are not JSON",
                         t->name ? t->name : "");
            goto done;
        }
        json_object_set_new(fn, "parameters", p);
    }
    json_object_set_new(root, "type", json_string("function"));
    json_object_set(root, "function", fn);
    char *txt = json_dumps(root, indent ? JSON_INDENT(indent) : 0);
    if (!txt) {
        rc = IG_ENOMEM;
        goto done;
    }
    put(o, txt, strlen(txt));
    free(txt);
done:
    json_decref(fn);
    json_decref(root);
    return rc;
}

static const char HERMES_PRE[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char HERMES_POST[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
static const char LLAMA3_SYS[] = "Environment: ipython\nCutting Knowledge Date: December 2023\n"
                                 "Today Date: 26 Jul 2024\n\n";
static const char LLAMA3_USER[] =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";

size_t ig_chat_tools_forced_prefix(ig_chat_tools_t conv, const char *force, char *buf, size_t cap)
{
    int n = 0;
    if (cap)
        buf[0] = 0;
    if (!force || conv == IG_CHAT_TOOLS_NONE || cap == 0)
        return 0;
    /* A named call stops after the name: the model goes on with its
     * arguments (or closes the object: a call without arguments). */
    if (conv == IG_CHAT_TOOLS_HERMES)
        n = force[0] ? snprintf(buf, cap, "<tool_call>\n{\"name\": \"%s\"", force)
                     : snprintf(buf, cap, "<tool_call>\n");
    else
        n = force[0] ? snprintf(buf, cap, "{\"name\": \"%s\"", force)
                     : snprintf(buf, cap, "{\"name\": \"");
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* The forced start of a call after the generation prompt, with the name
 * (the client's) as content. */
static void put_forced(out_t *o, ig_chat_tools_t conv, const char *force)
{
    if (!force || conv == IG_CHAT_TOOLS_NONE)
        return;
    if (conv == IG_CHAT_TOOLS_HERMES) {
        mark(o, "<tool_call>\n");
        if (force[0]) {
            mark(o, "{\"name\": \"");
            put(o, force, strlen(force));
            mark(o, "\"");
        }
    } else {
        mark(o, "{\"name\": \"");
        if (force[0]) {
            put(o, force, strlen(force));
            mark(o, "\"");
        }
    }
}

static int is_role(const ig_chat_msg_t *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

/* ChatML, and the Hermes convention when the template has it (Qwen2.5's
 * template: tools in the system turn, calls in <tool_call> tags, tool
 * results grouped into one user turn of <tool_response> tags). */
static int render_chatml(out_t *o, const ig_chat_msg_t *m, size_t n, ig_chat_tools_t conv,
                         const ig_chat_tools_opts_t *t, int add_generation_prompt, char *err,
                         size_t errlen)
{
    int hermes = conv == IG_CHAT_TOOLS_HERMES;
    size_t first = 0;
    if (t && t->ntools) {
        mark(o, "<|im_start|>system\n");
        if (n && is_role(&m[0], "system")) {
            put(o, m[0].content, m[0].content_len);
            mark(o, "\n\n");
            first = 1;
        }
        mark(o, HERMES_PRE);
        for (size_t k = 0; k < t->ntools; k++) {
            mark(o, "\n");
            int rc = put_tool(o, &t->tools[k], 0, err, errlen);
            if (rc)
                return rc;
        }
        mark(o, HERMES_POST);
        mark(o, "<|im_end|>\n");
    }
    for (size_t i = first; i < n; i++) {
        if (hermes && is_role(&m[i], "assistant") && m[i].ntool_calls) {
            mark(o, "<|im_start|>assistant\n");
            put(o, m[i].content, m[i].content_len);
            for (size_t k = 0; k < m[i].ntool_calls; k++) {
                const ig_chat_call_t *c = &m[i].tool_calls[k];
                if (k > 0 || m[i].content_len)
                    mark(o, "\n");
                mark(o, "<tool_call>\n{\"name\": \"");
                put(o, c->name, strlen(c->name));
                mark(o, "\", \"arguments\": ");
                put(o, c->arguments, strlen(c->arguments));
                mark(o, "}\n</tool_call>");
            }
            mark(o, "<|im_end|>\n");
            continue;
        }
        if (hermes && is_role(&m[i], "tool")) {
            if (i == first || !is_role(&m[i - 1], "tool"))
                mark(o, "<|im_start|>user");
            mark(o, "\n<tool_response>\n");
            put(o, m[i].content, m[i].content_len);
            mark(o, "\n</tool_response>");
            if (i + 1 == n || !is_role(&m[i + 1], "tool"))
                mark(o, "<|im_end|>\n");
            continue;
        }
        mark(o, "<|im_start|>");
        mark(o, m[i].role);
        mark(o, "\n");
        put(o, m[i].content, m[i].content_len);
        mark(o, "<|im_end|>\n");
    }
    if (add_generation_prompt) {
        mark(o, "<|im_start|>assistant\n");
        put_forced(o, conv, t ? t->force : NULL);
    }
    return 0;
}

/* Llama 3, and Llama 3.1's JSON tool calling when the template has it:
 * "Environment: ipython" in the system turn, the functions in the first
 * user turn (Meta's tools_in_user_message default), one call per assistant
 * turn as {"name", "parameters"}, results in ipython turns. */
static int render_llama3(out_t *o, const ig_chat_msg_t *m, size_t n, const char *bos,
                         ig_chat_tools_t conv, const ig_chat_tools_opts_t *t,
                         int add_generation_prompt, char *err, size_t errlen)
{
    size_t first = 0;
    int tools_pending = t && t->ntools;
    mark(o, bos);
    if (tools_pending) {
        mark(o, "<|start_header_id|>system<|end_header_id|>\n\n");
        mark(o, LLAMA3_SYS);
        if (n && is_role(&m[0], "system")) {
            put_trim(o, m[0].content, m[0].content_len, 1, 1);
            first = 1;
        }
        mark(o, "<|eot_id|>");
        if (first >= n || !is_role(&m[first], "user"))
            return err_set(err, errlen,
                           "messages[%zu]: Llama 3 puts the tools in the first user message, "
                           "and the conversation has none there",
                           first);
    }
    for (size_t i = first; i < n; i++) {
        if (m[i].ntool_calls && conv == IG_CHAT_TOOLS_LLAMA3) {
            if (m[i].ntool_calls > 1)
                return err_set(err, errlen,
                               "messages[%zu].tool_calls: this model's template (Llama 3) "
                               "takes one tool call per assistant message, not %zu",
                               i, m[i].ntool_calls);
            const ig_chat_call_t *c = &m[i].tool_calls[0];
            mark(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            mark(o, "{\"name\": \"");
            put(o, c->name, strlen(c->name));
            mark(o, "\", \"parameters\": ");
            put(o, c->arguments, strlen(c->arguments));
            mark(o, "}");
            mark(o, "<|eot_id|>");
            continue;
        }
        mark(o, "<|start_header_id|>");
        /* Llama 3.1 names the turn of a tool's output "ipython". */
        mark(o, is_role(&m[i], "tool") ? "ipython" : m[i].role);
        mark(o, "<|end_header_id|>\n\n");
        if (tools_pending) {
            mark(o, LLAMA3_USER);
            for (size_t k = 0; k < t->ntools; k++) {
                int rc = put_tool(o, &t->tools[k], 4, err, errlen);
                if (rc)
                    return rc;
                mark(o, "\n\n");
            }
            tools_pending = 0;
        }
        put_trim(o, m[i].content, m[i].content_len, 1, 1);
        mark(o, "<|eot_id|>");
    }
    if (add_generation_prompt) {
        mark(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        put_forced(o, conv, t ? t->force : NULL);
    }
    return 0;
}

static int render(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n,
                  const ig_chat_tools_opts_t *t, const char *bos, const char *eos,
                  int add_generation_prompt, out_t *op, char *err, size_t errlen)
{
    out_t o = {0};
    int rc = 0;
    ig_chat_tools_t conv = t ? t->convention : IG_CHAT_TOOLS_NONE;
    if (t && t->ntools == 0 && !t->force)
        t = NULL; /* the convention still writes the history's calls */
    if (t && conv == IG_CHAT_TOOLS_NONE)
        return err_set(err, errlen, "tools: this model's chat template has no tool convention");
    for (size_t i = 0; i < n; i++) {
        if (!role_ok(m[i].role))
            return err_set(err, errlen,
                           "messages[%zu].role: must be \"system\", \"user\", \"assistant\" or "
                           "\"tool\"",
                           i);
        if (!m[i].content && m[i].content_len)
            return err_set(err, errlen, "messages[%zu].content: missing", i);
        if (m[i].ntool_calls && conv == IG_CHAT_TOOLS_NONE)
            return err_set(err, errlen,
                           "messages[%zu].tool_calls: this model's chat template has no tool "
                           "convention to write them in",
                           i);
        for (size_t k = 0; k < m[i].ntool_calls; k++)
            if (!m[i].tool_calls[k].name || !m[i].tool_calls[k].arguments)
                return err_set(err, errlen, "messages[%zu].tool_calls[%zu]: missing name", i, k);
    }
    put(&o, "", 0); /* an empty conversation still yields a string */
    switch (style) {
    case IG_CHAT_LLAMA2:
        rc = render_llama2(&o, m, n, bos, eos, err, errlen);
        break;
    case IG_CHAT_LLAMA3:
        rc = render_llama3(&o, m, n, bos, conv, t, add_generation_prompt, err, errlen);
        break;
    default:
        rc = render_chatml(&o, m, n, conv, t, add_generation_prompt, err, errlen);
    }
    if (rc == 0 && o.oom) {
        rc = IG_ENOMEM;
        err_set(err, errlen, "chat template: out of memory");
    }
    if (rc != 0) {
        free(o.p);
        free(o.marks);
        return rc;
    }
    *op = o;
    return 0;
}

int ig_chat_render(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n, const char *bos,
                   const char *eos, int add_generation_prompt, char **out, size_t *outlen,
                   char *err, size_t errlen)
{
    return ig_chat_render_marked(style, m, n, bos, eos, add_generation_prompt, out, outlen, NULL,
                                 NULL, err, errlen);
}

int ig_chat_render_marked(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n, const char *bos,
                          const char *eos, int add_generation_prompt, char **out, size_t *outlen,
                          ig_tokspan_t **marks, size_t *nmarks, char *err, size_t errlen)
{
    return ig_chat_render_tools(style, m, n, NULL, bos, eos, add_generation_prompt, out, outlen,
                                marks, nmarks, err, errlen);
}

int ig_chat_render_tools(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n,
                         const ig_chat_tools_opts_t *tools, const char *bos, const char *eos,
                         int add_generation_prompt, char **out, size_t *outlen,
                         ig_tokspan_t **marks, size_t *nmarks, char *err, size_t errlen)
{
    out_t o = {0};
    *out = NULL;
    *outlen = 0;
    if (marks) {
        *marks = NULL;
        *nmarks = 0;
    }
    int rc = render(style, m, n, tools, bos, eos, add_generation_prompt, &o, err, errlen);
    if (rc != 0)
        return rc;
    *out = o.p;
    *outlen = o.len;
    if (marks) {
        *marks = o.marks;
        *nmarks = o.nmarks;
    } else {
        free(o.marks);
    }
    return 0;
}

int ig_chat_encode(ig_chat_style_t style, const ig_tokenizer_t *tok, const ig_chat_msg_t *m,
                   size_t n, int add_generation_prompt, ig_tokvec_t *ids, char *err, size_t errlen)
{
    return ig_chat_encode_tools(style, tok, m, n, NULL, add_generation_prompt, ids, err, errlen);
}

int ig_chat_encode_tools(ig_chat_style_t style, const ig_tokenizer_t *tok, const ig_chat_msg_t *m,
                         size_t n, const ig_chat_tools_opts_t *tools, int add_generation_prompt,
                         ig_tokvec_t *ids, char *err, size_t errlen)
{
    int32_t bos = ig_tokenizer_bos_id(tok), eos = ig_tokenizer_eos_id(tok);
    char *text;
    size_t len, nmarks;
    ig_tokspan_t *marks;
    int rc =
        ig_chat_render_tools(style, m, n, tools, bos >= 0 ? ig_tokenizer_token_str(tok, bos) : NULL,
                             eos >= 0 ? ig_tokenizer_token_str(tok, eos) : NULL,
                             add_generation_prompt, &text, &len, &marks, &nmarks, err, errlen);
    if (rc != 0)
        return rc;
    /* The template wrote BOS where the family wants it: no ADD_BOS. */
    rc = ig_tokenizer_encode_marked(tok, text, len, 0, marks, nmarks, ids);
    if (rc != 0)
        err_set(err, errlen, "the messages cannot be tokenized: %s", ig_strerror(rc));
    free(text);
    free(marks);
    return rc;
}

/* ---- reading tool calls back ---------------------------------------------- */

static const char TC_OPEN[] = "<tool_call>", TC_CLOSE[] = "</tool_call>";

static const char *find(const char *h, size_t hl, const char *n)
{
    size_t nl = strlen(n);
    for (size_t i = 0; i + nl <= hl; i++)
        if (memcmp(h + i, n, nl) == 0)
            return h + i;
    return NULL;
}

void ig_chat_parsed_calls_free(ig_chat_parsed_call_t *calls, size_t n)
{
    for (size_t i = 0; calls && i < n; i++) {
        free(calls[i].name);
        free(calls[i].arguments);
    }
    free(calls);
}

/* One call object {"name", args_key: {...}} into c; 1 when it is a call to
 * a declared function, 0 when not, IG_ENOMEM. */
static int read_call(const char *s, size_t len, const char *const *names, size_t nnames,
                     ig_chat_parsed_call_t *c)
{
    while (len && is_ws((unsigned char)*s)) {
        s++;
        len--;
    }
    while (len && is_ws((unsigned char)s[len - 1]))
        len--;
    json_t *o = json_loadb(s, len, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return 0;
    }
    json_t *name = json_object_get(o, "name");
    json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    int known = 0;
    for (size_t i = 0; json_is_string(name) && i < nnames; i++)
        known |= strcmp(names[i], json_string_value(name)) == 0;
    if (!known || (args && !json_is_object(args) && !json_is_string(args))) {
        json_decref(o);
        return 0;
    }
    c->name = strdup(json_string_value(name));
    if (!args)
        c->arguments = strdup("{}");
    else if (json_is_string(args))
        c->arguments = strdup(json_string_value(args));
    else
        c->arguments = json_dumps(args, JSON_COMPACT);
    json_decref(o);
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return IG_ENOMEM;
    }
    return 1;
}

int ig_chat_parse_tool_calls(ig_chat_tools_t conv, const char *text, size_t len,
                             const char *const *names, size_t nnames, ig_chat_parsed_call_t **calls,
                             size_t *ncalls, size_t *content_len)
{
    *calls = NULL;
    *ncalls = 0;
    *content_len = len;
    if (conv == IG_CHAT_TOOLS_NONE || !text)
        return 0;
    /* At most one call per <tool_call> tag: bounded by the text. */
    size_t cap = 0;
    for (const char *p = text; (p = find(p, len - (size_t)(p - text), TC_OPEN)); p++)
        cap++;
    if (cap == 0)
        cap = 1;
    ig_chat_parsed_call_t *out = calloc(cap, sizeof(*out));
    if (!out)
        return IG_ENOMEM;
    size_t n = 0, before = 0;
    int rc = 0;
    if (conv == IG_CHAT_TOOLS_HERMES) {
        const char *p = find(text, len, TC_OPEN);
        if (!p)
            goto none;
        before = (size_t)(p - text);
        while (p && n < cap) {
            const char *q = p + strlen(TC_OPEN), *end = text + len;
            const char *close = find(q, (size_t)(end - q), TC_CLOSE);
            rc = read_call(q, (size_t)((close ? close : end) - q), names, nnames, &out[n]);
            if (rc <= 0)
                goto none; /* text that only looks like a call is content */
            n++;
            if (!close)
                break;
            const char *after = close + strlen(TC_CLOSE);
            p = find(after, (size_t)(end - after), TC_OPEN);
            /* Only whitespace may sit between and after the calls. */
            for (const char *k = after; k < (p ? p : end); k++)
                if (!is_ws((unsigned char)*k))
                    goto none;
        }
    } else {
        size_t i = 0;
        while (i < len && is_ws((unsigned char)text[i]))
            i++;
        if (i == len || text[i] != '{')
            goto none;
        rc = read_call(text + i, len - i, names, nnames, &out[0]);
        if (rc <= 0)
            goto none;
        n = 1;
    }
    while (before && is_ws((unsigned char)text[before - 1]))
        before--;
    *calls = out;
    *ncalls = n;
    *content_len = before;
    return 0;
none:
    ig_chat_parsed_calls_free(out, n);
    return rc < 0 ? rc : 0;
}

/* The length of the JSON value at s[0..len): > 0 when it is complete, 0
 * while it may still grow, -1 when it is no JSON value. Structure only
 * (strings, escapes, nesting): the final parse checks the rest. */
static long value_len(const char *s, size_t len)
{
    size_t i = 0;
    int depth = 0, in_str = 0;
    if (len == 0)
        return 0;
    if (s[0] != '{' && s[0] != '[' && s[0] != '"') {
        while (i < len && !strchr(",}] \t\r\n", s[i]))
            i++;
        return i == 0 ? -1 : i < len ? (long)i : 0;
    }
    for (; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"' && --in_str == 0 && depth == 0)
                return (long)i + 1;
            continue;
        }
        if (c == '"')
            in_str = 1;
        else if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (--depth == 0)
                return (long)i + 1;
            if (depth < 0)
                return -1;
        }
    }
    return 0;
}

static size_t skip_ws(const char *s, size_t i, size_t len)
{
    while (i < len && is_ws((unsigned char)s[i]))
        i++;
    return i;
}

/* s[*i..len) starts with lit: 1 (and *i moves past it), 0 when the text
 * ends inside it, -1 when it is something else. */
static int expect(const char *s, size_t *i, size_t len, const char *lit)
{
    size_t n = strlen(lit), have = len - *i < n ? len - *i : n;
    if (memcmp(s + *i, lit, have) != 0)
        return -1;
    if (have < n)
        return 0;
    *i += n;
    return 1;
}

/* One call object from s[i..len): {"name": "N"[, "arguments": VALUE]}. 1 when
 * the name is known (sp filled; *end past the call when it is complete, else
 * 0), 0 when more text is needed, -1 when it is not a call of this shape. */
static int scan_call(const char *s, size_t i, size_t len, const char *const *names, size_t nnames,
                     ig_chat_call_span_t *sp, size_t *end)
{
    int rc;
    *end = 0;
    memset(sp, 0, sizeof(*sp));
    i = skip_ws(s, i, len);
    if ((rc = expect(s, &i, len, "{")) <= 0)
        return rc;
    i = skip_ws(s, i, len);
    if ((rc = expect(s, &i, len, "\"name\"")) <= 0)
        return rc;
    i = skip_ws(s, i, len);
    if ((rc = expect(s, &i, len, ":")) <= 0)
        return rc;
    i = skip_ws(s, i, len);
    if ((rc = expect(s, &i, len, "\"")) <= 0)
        return rc;
    size_t name = i;
    while (i < len && s[i] != '"' && s[i] != '\\')
        i++;
    if (i == len)
        return 0;
    if (s[i] == '\\')
        return -1; /* an escaped name: left to the final parse */
    int known = 0;
    for (size_t k = 0; k < nnames; k++)
        known |= strlen(names[k]) == i - name && memcmp(names[k], s + name, i - name) == 0;
    if (!known)
        return -1;
    sp->name_off = name;
    sp->name_len = i - name;
    i = skip_ws(s, i + 1, len);
    if (i == len)
        return 1;
    if (s[i] == '}') { /* a call without arguments */
        sp->args_done = 1;
        *end = i + 1;
        return 1;
    }
    if ((rc = expect(s, &i, len, ",")) < 0)
        return -1;
    i = skip_ws(s, i, len);
    if (rc == 0 || i == len)
        return 1;
    size_t at = i;
    if ((rc = expect(s, &i, len, "\"arguments\"")) < 0) {
        i = at;
        rc = expect(s, &i, len, "\"parameters\"");
    }
    if (rc < 0)
        return -1;
    i = skip_ws(s, i, len);
    if (rc == 0 || i == len)
        return 1;
    if ((rc = expect(s, &i, len, ":")) < 0)
        return -1;
    i = skip_ws(s, i, len);
    if (rc == 0 || i == len)
        return 1;
    long v = value_len(s + i, len - i);
    if (v < 0)
        return -1;
    sp->args_off = i;
    sp->args_string = s[i] == '"';
    sp->args_len = v > 0 ? (size_t)v : len - i;
    if (v > 0) {
        sp->args_done = 1;
        size_t j = skip_ws(s, i + (size_t)v, len);
        if (j < len && s[j] == '}')
            *end = j + 1;
    }
    return 1;
}

size_t ig_chat_tools_scan(ig_chat_tools_t conv, const char *text, size_t len,
                          const char *const *names, size_t nnames, ig_chat_call_span_t *spans,
                          size_t cap)
{
    size_t n = 0, end;
    if (conv == IG_CHAT_TOOLS_LLAMA3) {
        if (cap && scan_call(text, 0, len, names, nnames, &spans[0], &end) == 1)
            n = 1;
        return n;
    }
    if (conv != IG_CHAT_TOOLS_HERMES)
        return 0;
    const char *p = find(text, len, TC_OPEN);
    while (p && n < cap) {
        size_t at = (size_t)(p - text) + strlen(TC_OPEN);
        if (scan_call(text, at, len, names, nnames, &spans[n], &end) != 1)
            break;
        n++;
        if (!end)
            break; /* this call is still being written */
        p = find(text + end, len - end, TC_OPEN);
    }
    return n;
}

size_t ig_chat_tools_content_prefix(ig_chat_tools_t conv, const char *text, size_t len,
                                    int *in_call)
{
    *in_call = 0;
    if (conv == IG_CHAT_TOOLS_HERMES) {
        const char *p = find(text, len, TC_OPEN);
        if (p) {
            *in_call = 1;
            return (size_t)(p - text);
        }
        /* Hold a tail that could still become "<tool_call>". */
        size_t ol = strlen(TC_OPEN);
        for (size_t k = ol - 1; k > 0; k--)
            if (k <= len && memcmp(text + len - k, TC_OPEN, k) == 0)
                return len - k;
        return len;
    }
    if (conv == IG_CHAT_TOOLS_LLAMA3) {
        size_t i = 0;
        while (i < len && is_ws((unsigned char)text[i]))
            i++;
        if (i == len)
            return 0; /* only whitespace yet: a call may follow */
        if (text[i] == '{') {
            *in_call = 1;
            return 0;
        }
        return len;
    }
    return len;
}

static size_t add_id(int32_t *ids, size_t n, size_t cap, int32_t id)
{
    if (id < 0 || n >= cap)
        return n;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return n;
    ids[n] = id;
    return n + 1;
}

size_t ig_chat_stop_ids(ig_chat_style_t style, const ig_tokenizer_t *tok, int32_t *ids, size_t cap)
{
    static const char *const CHATML[] = {"<|im_end|>", "<|endoftext|>", NULL};
    static const char *const LLAMA3[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", NULL};
    static const char *const LLAMA2[] = {"</s>", NULL};
    const char *const *names = style == IG_CHAT_LLAMA3   ? LLAMA3
                               : style == IG_CHAT_LLAMA2 ? LLAMA2
                                                         : CHATML;
    const int32_t *eos;
    size_t n = 0, ne = ig_tokenizer_eos_ids(tok, &eos);
    for (size_t i = 0; names[i]; i++)
        n = add_id(ids, n, cap, ig_tokenizer_token_id(tok, names[i], strlen(names[i])));
    for (size_t i = 0; i < ne; i++)
        n = add_id(ids, n, cap, eos[i]);
    return n;
}
