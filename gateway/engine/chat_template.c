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

static int render(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n, const char *bos,
                  const char *eos, int add_generation_prompt, out_t *op, char *err, size_t errlen)
{
    out_t o = {0};
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (!role_ok(m[i].role))
            return err_set(err, errlen,
                           "messages[%zu].role: must be \"system\", \"user\", \"assistant\" or "
                           "\"tool\"",
                           i);
        if (!m[i].content && m[i].content_len)
            return err_set(err, errlen, "messages[%zu].content: missing", i);
    }
    put(&o, "", 0); /* an empty conversation still yields a string */
    switch (style) {
    case IG_CHAT_LLAMA2:
        rc = render_llama2(&o, m, n, bos, eos, err, errlen);
        break;
    case IG_CHAT_LLAMA3:
        mark(&o, bos);
        for (size_t i = 0; i < n; i++) {
            mark(&o, "<|start_header_id|>");
            /* Llama 3.1 names the turn of a tool's output "ipython". */
            mark(&o, strcmp(m[i].role, "tool") == 0 ? "ipython" : m[i].role);
            mark(&o, "<|end_header_id|>\n\n");
            put_trim(&o, m[i].content, m[i].content_len, 1, 1);
            mark(&o, "<|eot_id|>");
        }
        if (add_generation_prompt)
            mark(&o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    default:
        for (size_t i = 0; i < n; i++) {
            mark(&o, "<|im_start|>");
            mark(&o, m[i].role);
            mark(&o, "\n");
            put(&o, m[i].content, m[i].content_len);
            mark(&o, "<|im_end|>\n");
        }
        if (add_generation_prompt)
            mark(&o, "<|im_start|>assistant\n");
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
    out_t o;
    *out = NULL;
    *outlen = 0;
    if (marks) {
        *marks = NULL;
        *nmarks = 0;
    }
    int rc = render(style, m, n, bos, eos, add_generation_prompt, &o, err, errlen);
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
    int32_t bos = ig_tokenizer_bos_id(tok), eos = ig_tokenizer_eos_id(tok);
    char *text;
    size_t len, nmarks;
    ig_tokspan_t *marks;
    int rc =
        ig_chat_render_marked(style, m, n, bos >= 0 ? ig_tokenizer_token_str(tok, bos) : NULL,
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
