/*
 * A tokenizer from GGUF metadata. llama.cpp's two vocabulary kinds become
 * the Hugging Face tokenizer.json that the tokenizer already reads:
 *   - "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen2): tokens, merges, and the
 *     split regexes of the pre-tokenizer that tokenizer.ggml.pre names, as
 *     llama.cpp maps its names to them (every name it knows; "default" when
 *     the key is absent), each an Isolated Split of tokenizer.json;
 *   - "llama" (SentencePiece: Llama 2, Mistral): tokens with scores; a
 *     SentencePiece BPE merges the adjacent pair whose joined piece scores
 *     highest, which is BPE with the merges (a, b) of every piece a + b in
 *     the vocabulary ranked by the piece's score, so those merges are built
 *     here; byte fallback through the <0xNN> tokens, "▁" for spaces.
 * Control (3) and unknown (2) tokens become special added tokens (matched in
 * text only where special tokens are parsed), user-defined ones (4) plain
 * added tokens (matched everywhere), as llama.cpp's tokenizer does. The
 * JSON goes to a private temporary directory, is loaded with
 * ig_tokenizer_load_files() and removed; a message names the GGUF file and
 * the key.
 */
#include "gguf_vocab.h"

#include "infergate/error.h"
#include "infergate/gguf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_BYTE = 6 };

/* llama.cpp's split regexes (src/llama-vocab.cpp, llm_tokenizer_bpe), as
 * written there; each list runs as Isolated splits, one after the other. */
/* Copied verbatim: clang-format would cut the literals. */
/* clang-format off */
static const char *const RX_LLAMA3[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const RX_DEEPSEEK_LLM[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
    NULL,
};
static const char *const RX_DEEPSEEK3_LLM[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const RX_DEEPSEEK_CODER[] = {
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
    NULL,
};
static const char *const RX_FALCON[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
    NULL,
};
static const char *const RX_STARCODER[] = {
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    NULL,
};
static const char *const RX_GPT2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    NULL,
};
static const char *const RX_QWEN2[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const RX_PORO[] = {
    " ?[^(\\s|.,!?…。，、।۔،)]+",
    NULL,
};
static const char *const RX_VIKING[] = {
    " ?[^(\\s|.,!?…。，、।۔،)]+",
    "\\p{N}",
    NULL,
};
static const char *const RX_TEKKEN[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const RX_CHAMELEON[] = {
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    NULL,
};
static const char *const RX_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    NULL,
};
/* clang-format on */

/* Every tokenizer.ggml.pre name llama.cpp (Feb 2025) knows, with the regexes
 * its pre-tokenizer type uses and the defaults that type sets: add_bos_token
 * (llama3, tekken, chameleon), ignore_merges (llama3, tekken), and no BOS
 * token at all (chatglm-bpe). The keys of the file override add_bos. */
typedef struct {
    const char *name;
    const char *const *regex;
    int add_bos, ignore_merges, no_bos;
} pre_t;

static const pre_t pres[] = {
    {"default", RX_DEFAULT, 0, 0, 0},
    {"llama3", RX_LLAMA3, 1, 1, 0},
    {"llama-v3", RX_LLAMA3, 1, 1, 0},
    {"llama-bpe", RX_LLAMA3, 1, 1, 0},
    {"falcon3", RX_LLAMA3, 1, 1, 0},
    {"deepseek-llm", RX_DEEPSEEK_LLM, 0, 0, 0},
    {"deepseek-coder", RX_DEEPSEEK_CODER, 0, 0, 0},
    {"deepseek-v3", RX_DEEPSEEK3_LLM, 0, 0, 0},
    {"falcon", RX_FALCON, 0, 0, 0},
    {"mpt", RX_GPT2, 0, 0, 0},
    {"starcoder", RX_STARCODER, 0, 0, 0},
    {"gpt-2", RX_GPT2, 0, 0, 0},
    {"phi-2", RX_GPT2, 0, 0, 0},
    {"jina-es", RX_GPT2, 0, 0, 0},
    {"jina-de", RX_GPT2, 0, 0, 0},
    {"gigachat", RX_GPT2, 0, 0, 0},
    {"jina-v1-en", RX_GPT2, 0, 0, 0},
    {"jina-v2-es", RX_GPT2, 0, 0, 0},
    {"jina-v2-de", RX_GPT2, 0, 0, 0},
    {"jina-v2-code", RX_GPT2, 0, 0, 0},
    {"roberta-bpe", RX_GPT2, 0, 0, 0},
    {"refact", RX_STARCODER, 0, 0, 0},
    {"command-r", RX_STARCODER, 0, 0, 0},
    {"qwen2", RX_QWEN2, 0, 0, 0},
    {"deepseek-r1-qwen", RX_QWEN2, 0, 0, 0},
    {"stablelm2", RX_QWEN2, 0, 0, 0},
    {"olmo", RX_GPT2, 0, 0, 0},
    {"dbrx", RX_LLAMA3, 0, 0, 0},
    {"smaug-bpe", RX_LLAMA3, 0, 0, 0},
    {"poro-chat", RX_PORO, 0, 0, 0},
    {"chatglm-bpe", RX_LLAMA3, 0, 0, 1},
    {"viking", RX_VIKING, 0, 0, 0},
    {"jais", RX_GPT2, 0, 0, 0},
    {"tekken", RX_TEKKEN, 1, 1, 0},
    {"smollm", RX_STARCODER, 0, 0, 0},
    {"codeshell", RX_STARCODER, 0, 0, 0},
    {"bloom", RX_PORO, 0, 0, 0},
    {"gpt3-finnish", RX_PORO, 0, 0, 0},
    {"exaone", RX_STARCODER, 0, 0, 0},
    {"chameleon", RX_CHAMELEON, 1, 0, 0},
    {"minerva-7b", RX_STARCODER, 0, 0, 0},
    {"megrez", RX_QWEN2, 0, 0, 0},
};

/* The entry for a tokenizer.ggml.pre name; an absent key is "default", as
 * there (llama.cpp warns that quality suffers). NULL for an unknown name. */
static const pre_t *find_pre(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof(pres) / sizeof(pres[0]); i++)
        if (strlen(pres[i].name) == len && memcmp(pres[i].name, name, len) == 0)
            return &pres[i];
    return NULL;
}

typedef struct {
    float score;
    int id;
    int split; /* bytes of the left part */
} cand_t;

static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->split - y->split;
}

static json_t *jstr(const char *s, size_t n)
{
    return json_stringn(s, n);
}

/* SentencePiece merges from the scores (see the top of the file). */
static int spm_merges(const ig_gguf_t *g, const ig_gguf_kv_t *toks, const ig_gguf_kv_t *scores,
                      const ig_gguf_kv_t *types, json_t *vocab, json_t *merges)
{
    cand_t *c = NULL;
    size_t n = 0, cap = 0;
    for (uint64_t id = 0; id < toks->n; id++) {
        if (types && ig_gguf_num_at(types, id) != TT_NORMAL)
            continue;
        const char *s;
        size_t len;
        if (ig_gguf_str_at(g, toks, id, &s, &len) != 0)
            return IG_ENOMEM;
        char buf[1024];
        if (len >= sizeof(buf))
            continue;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80)
                continue; /* inside a UTF-8 sequence */
            memcpy(buf, s, k);
            buf[k] = '\0';
            if (json_object_get(vocab, buf) == NULL)
                continue;
            memcpy(buf, s + k, len - k);
            buf[len - k] = '\0';
            if (json_object_get(vocab, buf) == NULL)
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 4096;
                cand_t *nc = realloc(c, cap * sizeof(*c));
                if (nc == NULL) {
                    free(c);
                    return IG_ENOMEM;
                }
                c = nc;
            }
            c[n++] = (cand_t){(float)ig_gguf_num_at(scores, id), (int)id, (int)k};
        }
    }
    qsort(c, n, sizeof(*c), cand_cmp);
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        ig_gguf_str_at(g, toks, (uint64_t)c[i].id, &s, &len);
        json_array_append_new(merges, json_pack("[o, o]", jstr(s, (size_t)c[i].split),
                                                jstr(s + c[i].split, len - (size_t)c[i].split)));
    }
    free(c);
    return 0;
}

static json_t *seq(const char *key, json_t *items)
{
    return json_pack("{s:s, s:o}", "type", "Sequence", key, items);
}

static int build(const ig_gguf_t *g, json_t **tok_out, json_t **cfg_out, char *err, size_t errlen)
{
    const char *file = ig_gguf_file_name(g);
    const char *model;
    size_t mlen;
    int rc = ig_gguf_get_str(g, "tokenizer.ggml.model", &model, &mlen, err, errlen);
    if (rc == IG_ENOENT) {
        ig_errf(err, errlen, "%s: tokenizer.ggml.model: missing (no vocabulary in the file)", file);
        return IG_ETOKENIZER;
    }
    if (rc != 0)
        return IG_ETOKENIZER;
    int spm = mlen == 5 && memcmp(model, "llama", 5) == 0;
    if (!spm && !(mlen == 4 && memcmp(model, "gpt2", 4) == 0)) {
        ig_errf(err, errlen, "%s: tokenizer.ggml.model: \"%.*s\" is not supported (gpt2, llama)",
                file, (int)(mlen < 32 ? mlen : 32), model);
        return IG_ETOKENIZER;
    }
    const ig_gguf_kv_t *toks, *types = NULL, *scores = NULL, *mk = NULL;
    if ((rc = ig_gguf_get_array(g, "tokenizer.ggml.tokens", IG_GGUF_STRING, &toks, err, errlen)) !=
        0) {
        if (rc == IG_ENOENT)
            ig_errf(err, errlen, "%s: tokenizer.ggml.tokens: missing", file);
        return IG_ETOKENIZER;
    }
    rc = ig_gguf_get_array(g, "tokenizer.ggml.token_type", IG_GGUF_I32, &types, err, errlen);
    if (rc != 0 && rc != IG_ENOENT)
        return IG_ETOKENIZER;
    if (types != NULL && types->n != toks->n) {
        ig_errf(err, errlen, "%s: tokenizer.ggml.token_type: %llu entries for %llu tokens", file,
                (unsigned long long)types->n, (unsigned long long)toks->n);
        return IG_ETOKENIZER;
    }
    if (spm) {
        rc = ig_gguf_get_array(g, "tokenizer.ggml.scores", IG_GGUF_F32, &scores, err, errlen);
        if (rc != 0 || scores->n != toks->n) {
            if (rc == IG_ENOENT || rc == 0)
                ig_errf(err, errlen, "%s: tokenizer.ggml.scores: %s", file,
                        rc ? "missing (a llama vocabulary needs scores)"
                           : "not one score per token");
            return IG_ETOKENIZER;
        }
    } else {
        rc = ig_gguf_get_array(g, "tokenizer.ggml.merges", IG_GGUF_STRING, &mk, err, errlen);
        if (rc != 0) {
            if (rc == IG_ENOENT)
                ig_errf(err, errlen,
                        "%s: tokenizer.ggml.merges: missing (a gpt2 vocabulary "
                        "needs merges)",
                        file);
            return IG_ETOKENIZER;
        }
    }
    const pre_t *pre = NULL;
    if (!spm) {
        const char *name = "default";
        size_t nlen = 7;
        rc = ig_gguf_get_str(g, "tokenizer.ggml.pre", &name, &nlen, err, errlen);
        if (rc != 0 && rc != IG_ENOENT)
            return IG_ETOKENIZER;
        if (rc == IG_ENOENT)
            name = "default", nlen = 7;
        if ((pre = find_pre(name, nlen)) == NULL) {
            ig_errf(err, errlen,
                    "%s: tokenizer.ggml.pre: \"%.*s\" is not a pre-tokenizer llama.cpp knows%s",
                    file, (int)(nlen < 32 ? nlen : 32), name,
                    nlen == 4 && memcmp(name, "gpt2", 4) == 0 ? " (GPT-2's is \"gpt-2\")" : "");
            return IG_ETOKENIZER;
        }
    }
    int64_t unk = -1, bos = -1, eos = -1, hi = (int64_t)toks->n - 1;
    rc = ig_gguf_get_int(g, "tokenizer.ggml.unknown_token_id", 0, hi, &unk, err, errlen);
    if (rc != 0 && rc != IG_ENOENT)
        return IG_ETOKENIZER;
    rc = ig_gguf_get_int(g, "tokenizer.ggml.bos_token_id", 0, hi, &bos, err, errlen);
    if (rc != 0 && rc != IG_ENOENT)
        return IG_ETOKENIZER;
    rc = ig_gguf_get_int(g, "tokenizer.ggml.eos_token_id", 0, hi, &eos, err, errlen);
    if (rc != 0 && rc != IG_ENOENT)
        return IG_ETOKENIZER;
    if (pre != NULL && pre->no_bos)
        bos = -1;
    /* llama.cpp's defaults: SentencePiece adds BOS, BPE as its pre-tokenizer
     * says; add_space_prefix is read for SentencePiece only (BPE never adds
     * a space there either). */
    int add_bos = spm ? bos >= 0 : pre->add_bos && bos >= 0, add_eos = 0, add_space = spm;
    if (((rc = ig_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, err, errlen)) &&
         rc != IG_ENOENT) ||
        ((rc = ig_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos, err, errlen)) &&
         rc != IG_ENOENT) ||
        ((rc = ig_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space, err, errlen)) &&
         rc != IG_ENOENT))
        return IG_ETOKENIZER;

    json_t *vocab = json_object(), *added = json_array(), *merges = json_array();
    for (uint64_t id = 0; id < toks->n; id++) {
        const char *s;
        size_t len;
        if (ig_gguf_str_at(g, toks, id, &s, &len) != 0)
            return IG_ENOMEM;
        int t = types ? (int)ig_gguf_num_at(types, id) : TT_NORMAL;
        json_t *str = jstr(s, len);
        if (str == NULL) {
            ig_errf(err, errlen, "%s: tokenizer.ggml.tokens[%llu]: not UTF-8", file,
                    (unsigned long long)id);
            json_decref(vocab), json_decref(added), json_decref(merges);
            return IG_ETOKENIZER;
        }
        if (json_object_get(vocab, json_string_value(str)) == NULL)
            json_object_set_new(vocab, json_string_value(str), json_integer((json_int_t)id));
        if (t == TT_CONTROL || t == TT_USER || t == TT_UNKNOWN || (int64_t)id == unk)
            json_array_append_new(added, json_pack("{s:I, s:O, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (json_int_t)id, "content", str, "single_word", 0,
                                                   "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", t != TT_USER));
        json_decref(str);
    }
    json_t *tj = json_object();
    json_object_set_new(tj, "version", json_string("1.0"));
    json_object_set_new(tj, "added_tokens", added);
    json_t *m = json_pack("{s:s, s:b, s:b, s:o}", "type", "BPE", "byte_fallback", spm, "fuse_unk",
                          spm, "vocab", vocab);
    if (spm) {
        if ((rc = spm_merges(g, toks, scores, types, vocab, merges)) != 0) {
            json_decref(tj), json_decref(m), json_decref(merges);
            ig_errf(err, errlen, "%s: out of memory", file);
            return rc;
        }
        if (unk >= 0) {
            const char *s;
            size_t len;
            ig_gguf_str_at(g, toks, (uint64_t)unk, &s, &len);
            json_object_set_new(m, "unk_token", jstr(s, len));
        }
        json_t *norm = json_array();
        if (add_space)
            json_array_append_new(
                norm, json_pack("{s:s, s:s}", "type", "Prepend", "prepend", "\xe2\x96\x81"));
        json_array_append_new(norm, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern",
                                              "String", " ", "content", "\xe2\x96\x81"));
        json_object_set_new(tj, "normalizer", seq("normalizers", norm));
        json_object_set_new(tj, "pre_tokenizer", json_null());
        json_t *dec = json_array();
        json_array_append_new(dec, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern",
                                             "String", "\xe2\x96\x81", "content", " "));
        json_array_append_new(dec, json_pack("{s:s}", "type", "ByteFallback"));
        json_array_append_new(dec, json_pack("{s:s}", "type", "Fuse"));
        if (add_space)
            json_array_append_new(dec, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content",
                                                 " ", "start", 1, "stop", 0));
        json_object_set_new(tj, "decoder", seq("decoders", dec));
    } else {
        for (uint64_t i = 0; i < mk->n; i++) {
            const char *s;
            size_t len;
            ig_gguf_str_at(g, mk, i, &s, &len);
            json_array_append_new(merges, jstr(s, len));
        }
        json_t *pts = json_array();
        for (const char *const *rx = pre->regex; *rx != NULL; rx++)
            json_array_append_new(pts,
                                  json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern",
                                            "Regex", *rx, "behavior", "Isolated", "invert", 0));
        json_object_set_new(m, "ignore_merges", json_boolean(pre->ignore_merges));
        json_array_append_new(pts,
                              json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                        "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0));
        json_object_set_new(tj, "normalizer", json_null());
        json_object_set_new(tj, "pre_tokenizer", seq("pretokenizers", pts));
        json_object_set_new(tj, "decoder",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                      "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0));
    }
    json_object_set_new(m, "merges", merges);
    json_object_set_new(tj, "model", m);

    json_t *cfg = json_pack("{s:b, s:b}", "add_bos_token", add_bos, "add_eos_token", add_eos);
    const int64_t ids[2] = {bos, eos};
    const char *names[2] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        const char *s;
        size_t len;
        if (ids[k] >= 0 && ig_gguf_str_at(g, toks, (uint64_t)ids[k], &s, &len) == 0)
            json_object_set_new(cfg, names[k], jstr(s, len));
        else
            json_object_set_new(cfg, names[k], json_null());
    }
    const char *tpl;
    size_t tlen;
    if (ig_gguf_get_str(g, "tokenizer.chat_template", &tpl, &tlen, err, errlen) == 0)
        json_object_set_new(cfg, "chat_template", jstr(tpl, tlen));
    *tok_out = tj;
    *cfg_out = cfg;
    return 0;
}

int ig__tokenizer_load_gguf(const char *path, ig_tokenizer_t **out, char *err, size_t errlen)
{
    ig_gguf_t *g = NULL;
    json_t *tj = NULL, *cfg = NULL;
    char dir[] = "/tmp/ig-gguf-tok-XXXXXX", a[64], b[64];
    int made = 0;
    *out = NULL;
    int rc = ig_gguf_open(&g, path, err, errlen);
    if (rc != 0)
        return rc == IG_EMODEL ? IG_ETOKENIZER : rc;
    if ((rc = build(g, &tj, &cfg, err, errlen)) != 0)
        goto out;
    if (mkdtemp(dir) == NULL) {
        ig_errf(err, errlen, "%s: cannot make a scratch directory for the vocabulary",
                ig_gguf_file_name(g));
        rc = IG_EIO;
        goto out;
    }
    made = 1;
    snprintf(a, sizeof(a), "%s/tokenizer.json", dir);
    snprintf(b, sizeof(b), "%s/tokenizer_config.json", dir);
    if (json_dump_file(tj, a, JSON_COMPACT) != 0 || json_dump_file(cfg, b, JSON_COMPACT) != 0) {
        ig_errf(err, errlen, "%s: cannot write the vocabulary to %s", ig_gguf_file_name(g), dir);
        rc = IG_EIO;
        goto out;
    }
    char inner[400] = "";
    rc = ig_tokenizer_load_files(a, b, NULL, out, inner, sizeof(inner));
    if (rc != 0)
        ig_errf(err, errlen, "%s: tokenizer.ggml.*: %s", ig_gguf_file_name(g), inner);
out:
    if (made) {
        unlink(a);
        unlink(b);
        rmdir(dir);
    }
    json_decref(tj);
    json_decref(cfg);
    ig_gguf_close(g);
    return rc;
}
