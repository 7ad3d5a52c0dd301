#ifndef INFERGATE_CHAT_H
#define INFERGATE_CHAT_H

/*
 * Chat templates: renders OpenAI `messages` into the prompt text of one of the
 * three common families, detected from tokenizer_config.json's chat_template
 * by its markers (anything unrecognised renders as ChatML; docs/tokenizer.md).
 * The rendered prompt already holds BOS where the family's template writes
 * it, so the worker encodes it without IG_TOKENIZER_ADD_BOS.
 */

#include "infergate/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    IG_CHAT_CHATML = 1, /* <|im_start|>role\n...<|im_end|>\n */
    IG_CHAT_LLAMA2 = 2, /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
    IG_CHAT_LLAMA3 = 3  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
} ig_chat_style_t;

/* One tool call of an assistant turn in the history. */
typedef struct {
    const char *id;        /* may be NULL or "" */
    const char *name;      /* the function */
    const char *arguments; /* JSON text, written as given */
} ig_chat_call_t;

typedef struct ig_chat_msg_s {
    const char *role; /* "system", "user", "assistant" or "tool" */
    const char *content;
    size_t content_len;
    const ig_chat_call_t *tool_calls; /* (ntool_calls) assistant turns; may be NULL */
    size_t ntool_calls;
    const char *tool_call_id; /* tool turns; may be NULL */
} ig_chat_msg_t;

/*
 * Tool conventions: how a template writes tool definitions into the prompt
 * and how the model calls them. A template has one when its Jinja source
 * speaks of tools in a family this module renders; without one, a request
 * with tools is refused (the worker's 400 names `tools`).
 */
typedef enum {
    IG_CHAT_TOOLS_NONE = 0, /* no tool convention */
    IG_CHAT_TOOLS_HERMES,   /* ChatML (Qwen2.5, Hermes): <tools>{json}</tools> in the
                               system turn; calls <tool_call>{"name","arguments"}</tool_call>;
                               results in a user turn as <tool_response>...</tool_response> */
    IG_CHAT_TOOLS_LLAMA3,   /* Llama 3.1+: "Environment: ipython" system turn, the
                               functions as JSON in the first user turn; a call is
                               {"name": ..., "parameters": {...}}; results in ipython turns */
} ig_chat_tools_t;

/* One function the model may call. */
typedef struct {
    const char *name;
    const char *description; /* NULL: none */
    const char *parameters;  /* JSON text of the schema; NULL: none */
} ig_chat_tool_t;

/* What a request asks of tools, for the renderer. */
typedef struct {
    ig_chat_tools_t convention;
    const ig_chat_tool_t *tools; /* (ntools) rendered when ntools > 0 */
    size_t ntools;
    /* NULL: the model chooses; "": it must call some tool (tool_choice
     * "required"); a name: it must call that one. The generation prompt then
     * ends with the start of a call (ig_chat_tools_forced_prefix), which the
     * model's output continues. */
    const char *force;
} ig_chat_tools_opts_t;

/* The convention of a template of family style (NONE when the source has
 * no tool markers: <tool_call> for ChatML, tools / ipython for Llama 3). */
ig_chat_tools_t ig_chat_detect_tools(ig_chat_style_t style, const char *chat_template);

/* "none", "hermes", "llama3_json". */
const char *ig_chat_tools_name(ig_chat_tools_t t);

/* Picks the family of a Jinja chat template by its markers; NULL or an
 * unrecognised template gives IG_CHAT_CHATML. */
ig_chat_style_t ig_chat_detect(const char *chat_template);

/* As ig_chat_detect(), and *why (when not NULL) gets a static sentence
 * saying why: "its chat_template has <|im_start|>", or that ChatML is the
 * default (no template) or the fallback (a template of no known family),
 * for the load log line and /v1/models. */
ig_chat_style_t ig_chat_detect_why(const char *chat_template, const char **why);

/* 1 when a template is present but of no known family (ChatML by fallback). */
int ig_chat_detect_fallback(const char *chat_template);

/* "chatml", "llama2" or "llama3". */
const char *ig_chat_style_name(ig_chat_style_t style);

/* Renders n messages into a new NUL-terminated prompt (*out, caller frees).
 * bos and eos are the texts of those tokens (Llama-2 and Llama-3 write them;
 * NULL means none). With add_generation_prompt the prompt ends where the
 * assistant's answer starts. A "tool" message is a `tool` turn in ChatML and
 * an `ipython` turn in Llama-3. Returns 0, IG_EINVAL with a message in err
 * for an unknown role or a conversation the family cannot express (Llama-2
 * needs user and assistant turns to alternate and has no tool turn), or
 * IG_ENOMEM. The text alone loses which parts are markers: a prompt is
 * encoded with ig_chat_encode(), never from this text. */
int ig_chat_render(ig_chat_style_t style, const ig_chat_msg_t *msgs, size_t n, const char *bos,
                   const char *eos, int add_generation_prompt, char **out, size_t *outlen,
                   char *err, size_t errlen);

/* As ig_chat_render(), and, when marks is not NULL, *marks (caller frees,
 * *nmarks entries, sorted, disjoint) gets the spans the template wrote
 * (markers, role headers, BOS/EOS); the rest is message content. */
int ig_chat_render_marked(ig_chat_style_t style, const ig_chat_msg_t *msgs, size_t n,
                          const char *bos, const char *eos, int add_generation_prompt, char **out,
                          size_t *outlen, ig_tokspan_t **marks, size_t *nmarks, char *err,
                          size_t errlen);

/* As ig_chat_render_marked(), with tools (NULL: none) rendered by their
 * convention and assistant tool_calls written as the convention's calls.
 * IG_EINVAL (err says why) when the conversation has tool calls or tools
 * and the convention is NONE, or the convention cannot express it (Llama 3
 * has one call per turn and puts the tools in the first user turn). */
int ig_chat_render_tools(ig_chat_style_t style, const ig_chat_msg_t *msgs, size_t n,
                         const ig_chat_tools_opts_t *tools, const char *bos, const char *eos,
                         int add_generation_prompt, char **out, size_t *outlen,
                         ig_tokspan_t **marks, size_t *nmarks, char *err, size_t errlen);

/* As ig_chat_encode(), with tools (NULL: none) as ig_chat_render_tools(). */
int ig_chat_encode_tools(ig_chat_style_t style, const ig_tokenizer_t *tok,
                         const ig_chat_msg_t *msgs, size_t n, const ig_chat_tools_opts_t *tools,
                         int add_generation_prompt, ig_tokvec_t *ids, char *err, size_t errlen);

/* The start of a call that a forced tool choice appends to the generation
 * prompt (force "" or a name; NULL gives ""), NUL-terminated in buf; returns
 * its length (0 when nothing is forced). The model's text continues it. */
size_t ig_chat_tools_forced_prefix(ig_chat_tools_t conv, const char *force, char *buf, size_t cap);

/* A tool call the model made. */
typedef struct {
    char *name;
    char *arguments; /* JSON text of an object */
} ig_chat_parsed_call_t;

/*
 * Reads a model's answer as the convention's tool calls. text(len) is the
 * whole answer (with any forced prefix in front). names(nnames) are the
 * declared functions: a call to another name is not a call. On success with
 * calls: *calls (free with ig_chat_parsed_calls_free), *ncalls > 0, and
 * *content_len the bytes of text before the first call that are the
 * answer's content (trailing whitespace left out). With no call (or text
 * that only looks like one), *ncalls is 0. Returns 0 or IG_ENOMEM.
 */
int ig_chat_parse_tool_calls(ig_chat_tools_t conv, const char *text, size_t len,
                             const char *const *names, size_t nnames, ig_chat_parsed_call_t **calls,
                             size_t *ncalls, size_t *content_len);

void ig_chat_parsed_calls_free(ig_chat_parsed_call_t *calls, size_t n);

/* Streaming: one call of a partial answer, as far as it has come. */
typedef struct {
    size_t name_off, name_len; /* the function's name in the text */
    size_t args_off, args_len; /* its arguments' JSON text so far (0: not begun) */
    int args_done;             /* the arguments' value (or the call) is complete */
    int args_string;           /* the arguments are a JSON string, not an object */
} ig_chat_call_span_t;

/* The calls of a partial answer whose names are complete and declared, in
 * order, at most cap: a call's arguments can be streamed as they come. It
 * stops at the first call it cannot read yet (or at all); the whole answer
 * is still judged by ig_chat_parse_tool_calls at the end. */
size_t ig_chat_tools_scan(ig_chat_tools_t conv, const char *text, size_t len,
                          const char *const *names, size_t nnames, ig_chat_call_span_t *spans,
                          size_t cap);

/* Streaming: how many leading bytes of a partial answer are content for
 * sure (never part of a call); *in_call is set once a call has begun (what
 * follows is held until the end and parsed). */
size_t ig_chat_tools_content_prefix(ig_chat_tools_t conv, const char *text, size_t len,
                                    int *in_call);

/* Renders with tok's BOS/EOS and appends the prompt's ids to ids: the
 * template's markers become their special tokens, message content is
 * encoded as plain text (a "<|im_end|>" typed by a user stays characters;
 * ig_tokenizer_encode_marked). BOS comes from the template, not ADD_BOS.
 * Returns as ig_chat_render(), or the encoder's error with err set. */
int ig_chat_encode(ig_chat_style_t style, const ig_tokenizer_t *tok, const ig_chat_msg_t *msgs,
                   size_t n, int add_generation_prompt, ig_tokvec_t *ids, char *err, size_t errlen);

/* Fills ids (room for cap) with the tokens that end an assistant turn for
 * this family and tokenizer (<|im_end|>, <|eot_id|>, </s>, ..., plus the
 * tokenizer's EOS ids), without duplicates; returns the count. */
size_t ig_chat_stop_ids(ig_chat_style_t style, const ig_tokenizer_t *tok, int32_t *ids, size_t cap);

#endif
