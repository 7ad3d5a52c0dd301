#ifndef INFERGATE_TOKENIZER_INTERNAL_H
#define INFERGATE_TOKENIZER_INTERNAL_H

/* Private layout of ig_tokenizer_t, shared by tokenizer*.c and tokgen.c. */

#include "infergate/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t lo, hi;
} ig__urange_t;

typedef struct {
    uint32_t lo, hi;
    uint32_t ccc;
} ig__ccc_t;

typedef struct {
    uint32_t cp;
    uint32_t off, len; /* into ig__decomp_cps */
} ig__decomp_t;

typedef struct {
    uint32_t first, second, composite;
} ig__comp_t;

/* Generated tables (tokenizer_unicode.c), each sorted. */
extern const ig__ccc_t ig__ccc_runs[];
extern const size_t ig__n_ccc_runs;
extern const uint32_t ig__decomp_cps[];
extern const ig__decomp_t ig__decomps[];
extern const size_t ig__n_decomps;
extern const ig__comp_t ig__comps[];
extern const size_t ig__n_comps;
extern const ig__urange_t ig__nfc_unsafe[];
extern const size_t ig__n_nfc_unsafe;

int ig__uni_in_ranges(const ig__urange_t *r, size_t n, uint32_t cp);
int ig__uni_is_letter(uint32_t cp);
int ig__uni_is_number(uint32_t cp);
int ig__uni_is_space(uint32_t cp);

/* Whether Unicode NFC could change s[0..n) (a fast scan; most text is not). */
int ig__nfc_needed(const unsigned char *s, size_t n);

/* Writes the NFC form of s[0..n) into *buf (grown as needed, capacity *cap)
 * and its length into *outlen. Invalid UTF-8 bytes pass through unchanged.
 * Returns 0 or IG_ENOMEM. */
int ig__nfc(const unsigned char *s, size_t n, char **buf, size_t *cap, size_t *outlen);

/* Decodes one UTF-8 character at s[0..n); returns its length (1..4) and the
 * code point, or 0 when the bytes there are not a valid character. */
size_t ig__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 into out (4 bytes room); returns the length. */
size_t ig__utf8_encode(uint32_t cp, char *out);

/* GPT-2's reversible byte -> code point mapping of the byte-level BPE. */
uint32_t ig__byte_to_cp(unsigned char b);
/* The inverse; -1 when cp is not one of the 256 mapped code points. */
int ig__cp_to_byte(uint32_t cp);

/* The split rules of the pre-tokenizer, written by hand from the regexes. */
typedef enum {
    IG__SPLIT_NONE = 0,
    IG__SPLIT_GPT2,   /* 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    IG__SPLIT_LLAMA3, /* case-insensitive contractions, \p{N}{1,3}, newline runs */
    IG__SPLIT_QWEN2,  /* as Llama-3 with single digits */
    IG__SPLIT_METASPACE,
    /* Sentencepiece text with no pre-tokenizer, cut before each run of "▁":
     * chosen at load only when no token holds "▁" after another character,
     * so that no merge could cross the cut and the result is unchanged. */
    IG__SPLIT_SPM_RUNS
} ig__split_t;

/* Returns the length of the next pre-token of s[i..n) under rule (n > i). */
size_t ig__split_next(ig__split_t rule, const unsigned char *s, size_t n, size_t i);

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
    ig__split_t split;
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
