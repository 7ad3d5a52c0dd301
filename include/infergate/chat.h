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

typedef struct ig_chat_msg_s {
    const char *role; /* "system", "user", "assistant" or "tool" */
    const char *content;
    size_t content_len;
} ig_chat_msg_t;

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
