#ifndef INFERGATE_TOKENIZER_INTERNAL_H
#define INFERGATE_TOKENIZER_INTERNAL_H

/* Private layout of ig_tokenizer_t, shared by the files of tokenizer/ and tokgen.c. */

#include "infergate/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stddef.h>
#include <stdint.h>

/* Whether Unicode NFC could change s[0..n): false when every character is
 * below U+0300 or, by libutf8proc's data, a starter that neither decomposes
 * nor composes (most of CJK). A quick scan; most text needs no NFC. */
int ig__nfc_needed(const unsigned char *s, size_t n);

/* GPT-2's reversible byte -> code point mapping of the byte-level BPE, read
 * by the loader (tokenizer.c), the encoder (encode.c) and tokgen.c.
 * Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other
 * 68 bytes map, in byte order, to U+0100 upwards. */
static inline uint32_t ig__byte_to_cp(unsigned char b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    if (b <= 0x20)
        return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100u + 33 + (b - 0x7Fu);
    return 0x100u + 33 + 34; /* 0xAD */
}

/* The inverse; -1 when cp is not one of the 256 mapped code points. */
static inline int ig__cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(0x7F + cp - 0x121);
    if (cp == 0x143)
        return 0xAD;
    return -1;
}

/* Splits that are not regexes: cut before each "▁" (Metaspace with split),
 * or before each run of "▁" (sentencepiece text with no pre-tokenizer:
 * chosen at load only when no token holds "▁" after another character, so
 * that no merge could cross the cut and the result is unchanged). */
typedef enum { IG__CUT_NONE = 0, IG__CUT_METASPACE, IG__CUT_SPM_RUNS } ig__cut_t;

/* The behaviours of a tokenizer.json Split, named as there. */
typedef enum {
    IG__SPLIT_ISOLATED,
    IG__SPLIT_REMOVED,
    IG__SPLIT_MERGED_WITH_PREVIOUS,
    IG__SPLIT_MERGED_WITH_NEXT,
    IG__SPLIT_CONTIGUOUS
} ig__split_behavior_t;

/* One Split step of the pre-tokenizer (split.c). */
typedef struct {
    pcre2_code *re; /* PCRE2_UTF | PCRE2_UCP (a String pattern: PCRE2_LITERAL) */
    int jit;        /* pcre2_jit_compile() succeeded */
    ig__split_behavior_t behavior;
    int invert;
} ig__split_step_t;

/* Compiles pattern[0..len) (a regex, or a literal string when `literal`).
 * Returns 0, or IG_ETOKENIZER with PCRE2's message and the offset in msg. */
int ig__split_init(ig__split_step_t *s, const char *pattern, size_t len, int literal,
                   ig__split_behavior_t behavior, int invert, char *msg, size_t msglen);
void ig__split_dispose(ig__split_step_t *s);

/* Receives each non-empty piece in order; a non-zero return stops the split. */
typedef int (*ig__piece_cb)(void *ctx, const unsigned char *p, size_t n);

/* Splits t[0..n), which must be valid UTF-8, and calls cb for each piece.
 * md: match data with at least one pair (pcre2_match_data_create(1, NULL));
 * cb may use it for a split of its own. Returns 0, cb's code, or
 * IG_ETOKENIZER when PCRE2 gives up (a JIT stack or match limit). */
int ig__split_run(const ig__split_step_t *s, pcre2_match_data *md, const unsigned char *t, size_t n,
                  ig__piece_cb cb, void *ctx);

typedef enum { IG__NORM_PREPEND, IG__NORM_REPLACE, IG__NORM_NFC } ig__norm_kind_t;

typedef struct {
    ig__norm_kind_t kind;
    char *a; /* prepend: the prefix; replace: the pattern */
    size_t alen;
    char *b; /* replace: the content */
    size_t blen;
} ig__norm_t;

typedef struct {
    int32_t id;
    uint32_t len;
    char *content;
    int special;
    int lstrip, rstrip; /* the match also takes the whitespace before / after it */
    int single_word;    /* matches only where no word character touches it */
} ig__added_t;

struct ig_tokenizer_s {
    ig_tokenizer_style_t style;
    size_t n_ids;
    char **str;             /* (n_ids) vocabulary strings, NULL for unused ids */
    uint32_t *str_len;      /* (n_ids) */
    char **bytes;           /* (n_ids) decoded bytes of each token */
    uint32_t *bytes_len;    /* (n_ids) */
    unsigned char *special; /* (n_ids) 1 for added special tokens, 2 for other added */

    /* string -> id, open addressing over ids, -1 empty */
    int32_t *vh;
    size_t vh_mask;

    /* (left, right) -> rank and result, open addressing */
    uint64_t *mh_key; /* left << 32 | right, UINT64_MAX empty */
    int32_t *mh_rank;
    int32_t *mh_out;
    size_t mh_mask;
    size_t n_merges;

    ig__added_t *added; /* sorted by length, longest first */
    size_t n_added;
    uint8_t added_first[256]; /* 1 when some added token starts with this byte */

    ig__norm_t *norms;
    size_t n_norms;
    ig__split_step_t *splits; /* (n_splits) Split steps, in pre-tokenizer order */
    size_t n_splits;
    ig__cut_t cut;           /* after the splits (they are never both used) */
    int add_prefix_space;    /* byte-level: prepend " " to a segment not starting with one */
    int meta_prepend;        /* metaspace: 0 never, 1 always, 2 first segment only */
    int metaspace;           /* a Metaspace pre-tokenizer: " " -> "▁" and maybe a prefix */
    int strip_leading_space; /* the decoder drops one leading space of the output */
    int byte_fallback;
    int ignore_merges;
    int fuse_unk;
    int32_t unk_id;
    int32_t byte_id[256];  /* byte-level: id of the char of each byte */
    int32_t fb_id[256];    /* byte fallback: id of "<0xHH>" */
    int32_t ascii_id[128]; /* sentencepiece: id of each ASCII char, or -1 */

    int32_t bos_id;
    int32_t eos_id;
    int32_t *eos_ids;
    size_t n_eos;
    int add_bos;
    char *chat_template;
    ig_gen_defaults_t gen;
};

uint64_t ig__hash_bytes(const char *s, size_t n);

/* Mixes a (left, right) id pair into a hash whose low bits depend on every
 * input bit (a plain multiply leaves them to `right` alone). */
static inline uint64_t ig__hash_pair(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xFF51AFD7ED558CCDull;
    key ^= key >> 33;
    key *= 0xC4CEB9FE1A85EC53ull;
    return key ^ (key >> 33);
}

/* ig_tokgen_write() with the corpus size given: lexicon_words distinct words
 * and running_words words of sentences. Tests use a tiny corpus to reach the
 * path that completes the vocabulary once the corpus has no pairs left. */
int ig__tokgen_write_corpus(const char *dir, int vocab_size, int style, uint64_t seed,
                            size_t lexicon_words, size_t running_words, char *err, size_t errlen);

#endif
