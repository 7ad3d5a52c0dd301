#ifndef INFERGATE_TOKENIZER_H
#define INFERGATE_TOKENIZER_H

/*
 * Tokenizer of the execution core: loads a Hugging Face `tokenizer.json` (BPE,
 * byte-level like GPT-2 / Llama-3 / Qwen2, or sentencepiece-style like Llama-2 /
 * Mistral) with its `tokenizer_config.json` and `generation_config.json`,
 * encodes UTF-8 text into token ids and decodes ids back, also incrementally
 * for streaming. A loaded tokenizer is immutable, so one instance may be used
 * from many threads at once. See docs/tokenizer.md.
 */

#include <stddef.h>
#include <stdint.h>

typedef struct ig_tokenizer_s ig_tokenizer_t;

typedef enum {
    IG_TOKENIZER_BYTE_LEVEL = 1,   /* bytes mapped to printable chars, "Ġhello" */
    IG_TOKENIZER_SENTENCEPIECE = 2 /* "▁hello", byte fallback tokens "<0x0A>" */
} ig_tokenizer_style_t;

/* Flags of ig_tokenizer_encode(). */
#define IG_TOKENIZER_ADD_BOS 1u    /* prepend BOS when the tokenizer asks for it */
#define IG_TOKENIZER_NO_SPECIAL 2u /* text that spells a special token stays text */
/* Flag of ig_tokenizer_decode() and ig_tokdec_init(). */
#define IG_TOKENIZER_SKIP_SPECIAL 4u /* special tokens produce no text */

/* A growable vector of token ids; encode appends to it. */
typedef struct ig_tokvec_s {
    int32_t *ids;
    size_t len;
    size_t cap;
} ig_tokvec_t;

/* Sampling defaults read from generation_config.json; has_* says which were present. */
typedef struct ig_gen_defaults_s {
    int has_temperature, has_top_p, has_top_k, has_repetition_penalty, has_max_new_tokens;
    int has_do_sample;
    double temperature;
    double top_p;
    int top_k;
    double repetition_penalty;
    int max_new_tokens;
    int do_sample;
} ig_gen_defaults_t;

/* An empty vector (no allocation until the first id). */
void ig_tokvec_init(ig_tokvec_t *v);
/* Frees the ids and leaves an empty vector. */
void ig_tokvec_dispose(ig_tokvec_t *v);

/* Loads DIR/tokenizer.json plus DIR/tokenizer_config.json and
 * DIR/generation_config.json when they exist. On failure returns a negative
 * code (IG_ETOKENIZER for malformed or unsupported content, IG_ENOENT when
 * tokenizer.json is missing, IG_ENOMEM) and writes a message naming the file
 * and the field into err, e.g. `tokenizer.json: model.merges[12]: unknown token "ab"`.
 * The caller owns *out and releases it with ig_tokenizer_free(). */
int ig_tokenizer_load(const char *dir, ig_tokenizer_t **out, char *err, size_t errlen);

/* As ig_tokenizer_load() with explicit paths; config and gen_config may be NULL. */
int ig_tokenizer_load_files(const char *tokenizer_json, const char *config, const char *gen_config,
                            ig_tokenizer_t **out, char *err, size_t errlen);

/* Releases a tokenizer; NULL is allowed. */
void ig_tokenizer_free(ig_tokenizer_t *tok);

/* Byte-level or sentencepiece-style, as detected from the pre-tokenizer. */
ig_tokenizer_style_t ig_tokenizer_style(const ig_tokenizer_t *tok);

/* Number of ids: one more than the largest id of the vocabulary and added tokens. */
size_t ig_tokenizer_vocab_size(const ig_tokenizer_t *tok);

/* The vocabulary string of an id as tokenizer.json spells it ("Ġthe", "▁the",
 * "<0x0A>", "<|eot_id|>"); borrowed, NUL-terminated; NULL for an unused or
 * out-of-range id. */
const char *ig_tokenizer_token_str(const ig_tokenizer_t *tok, int32_t id);

/* The bytes a single token decodes to (borrowed; may be a partial UTF-8
 * sequence); 0, or IG_EINVAL for an unused or out-of-range id. */
int ig_tokenizer_token_bytes(const ig_tokenizer_t *tok, int32_t id, const char **bytes,
                             size_t *len);

/* The id of a vocabulary string (len bytes), or -1. */
int32_t ig_tokenizer_token_id(const ig_tokenizer_t *tok, const char *s, size_t len);

/* BOS id, or -1 when the tokenizer has none. */
int32_t ig_tokenizer_bos_id(const ig_tokenizer_t *tok);

/* The primary EOS id (tokenizer_config's eos_token, else the first of
 * generation_config's eos_token_id), or -1. */
int32_t ig_tokenizer_eos_id(const ig_tokenizer_t *tok);

/* All ids that end generation (eos_token and every generation_config
 * eos_token_id, without duplicates); *ids is borrowed. Returns the count. */
size_t ig_tokenizer_eos_ids(const ig_tokenizer_t *tok, const int32_t **ids);

/* Whether a text prompt gets BOS (tokenizer_config's add_bos_token, else the
 * post-processor template of tokenizer.json). */
int ig_tokenizer_adds_bos(const ig_tokenizer_t *tok);

/* Whether an id is an added token marked special. */
int ig_tokenizer_is_special(const ig_tokenizer_t *tok, int32_t id);

/* tokenizer_config.json's chat_template (the "default" one when it is a
 * list), or NULL; borrowed. */
const char *ig_tokenizer_chat_template(const ig_tokenizer_t *tok);

/* Sampling defaults from generation_config.json (all has_* 0 when absent). */
const ig_gen_defaults_t *ig_tokenizer_gen_defaults(const ig_tokenizer_t *tok);

/* Checks that s[0..len) is well-formed UTF-8 (no overlongs, surrogates or
 * code points above U+10FFFF). Returns 0, or IG_EPARSE with the offset of the
 * first bad byte in *bad_offset (when not NULL). The worker calls this to
 * reject bad prompts with a clear error; encode itself accepts any bytes. */
int ig_tokenizer_utf8_check(const char *s, size_t len, size_t *bad_offset);

/* Encodes len bytes of text and appends the ids to out. Added tokens are
 * matched first (longest first); invalid UTF-8 is encoded through byte
 * tokens. Returns 0, IG_ENOMEM, or IG_ETOKENIZER when a character can be
 * represented neither by the vocabulary, byte fallback nor an unk token. */
int ig_tokenizer_encode(const ig_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                        ig_tokvec_t *out);

/* A byte range [off, off + len) of a text. */
typedef struct ig_tokspan_s {
    size_t off;
    size_t len;
} ig_tokspan_t;

/* As ig_tokenizer_encode(), but special tokens are matched only wholly
 * inside the nmarks spans of marks (sorted, disjoint): a chat template's
 * markers. Elsewhere, in message content, text that spells a special token
 * stays text (as with IG_TOKENIZER_NO_SPECIAL), so a user cannot type a
 * control token. The text between tokens is encoded as by
 * ig_tokenizer_encode(): without special-token text outside the marks, the
 * ids are the same. IG_EINVAL for spans out of order or past len. */
int ig_tokenizer_encode_marked(const ig_tokenizer_t *tok, const char *text, size_t len,
                               unsigned flags, const ig_tokspan_t *marks, size_t nmarks,
                               ig_tokvec_t *out);

/* Decodes n ids into a new NUL-terminated UTF-8 string (*out, owned by the
 * caller, free()); byte sequences that are not valid UTF-8 become U+FFFD.
 * Returns 0, IG_EINVAL for an out-of-range id, or IG_ENOMEM. */
int ig_tokenizer_decode(const ig_tokenizer_t *tok, const int32_t *ids, size_t n, unsigned flags,
                        char **out, size_t *outlen);

/* Incremental decoder for streaming: each push returns the text that became
 * complete, never a split multibyte character; incomplete trailing bytes are
 * held back until a later token completes them (or flush turns them into
 * U+FFFD). The concatenation of all pushes and the flush equals
 * ig_tokenizer_decode() of the same ids. */
typedef struct ig_tokdec_s {
    const ig_tokenizer_t *tok;
    unsigned flags;
    int started;           /* some text has been produced (for the leading-space strip) */
    unsigned char pend[4]; /* an incomplete UTF-8 sequence held back */
    size_t npend;
    char *buf; /* output of the last push, owned */
    size_t cap;
} ig_tokdec_t;

/* Starts a stream over tok (borrowed: it must outlive d); flags may hold
 * IG_TOKENIZER_SKIP_SPECIAL. */
void ig_tokdec_init(ig_tokdec_t *d, const ig_tokenizer_t *tok, unsigned flags);
/* Frees the output buffer; held-back bytes are dropped (flush first). */
void ig_tokdec_dispose(ig_tokdec_t *d);

/* Feeds one id; *text (borrowed, valid until the next call) and *len get the
 * newly complete text, possibly empty. Returns 0, IG_EINVAL or IG_ENOMEM. */
int ig_tokdec_push(ig_tokdec_t *d, int32_t id, const char **text, size_t *len);

/* Ends the stream: returns held-back bytes as U+FFFD characters. */
int ig_tokdec_flush(ig_tokdec_t *d, const char **text, size_t *len);

#endif
