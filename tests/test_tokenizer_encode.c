/* Known encodings on the hand-written fixtures of tests/cases/tokenizer/:
 * bytelevel/ (Llama-3 split, byte-level, unk) and spm/ (Llama-2 style,
 * byte fallback). Expected ids are worked out by hand in the comments. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX IG_SOURCE_DIR "/tests/cases/tokenizer/"

static ig_tokenizer_t *load(const char *name)
{
    char dir[512], err[512];
    ig_tokenizer_t *tok = NULL;
    int rc;
    snprintf(dir, sizeof dir, "%s%s", FIX, name);
    rc = ig_tokenizer_load(dir, &tok, err, sizeof err);
    if (rc != 0)
        print_error("load %s: %s\n", name, err);
    assert_int_equal(rc, 0);
    return tok;
}

static void expect_ids(ig_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                       const int32_t *want, size_t nwant)
{
    ig_tokvec_t v;
    ig_tokvec_init(&v);
    assert_int_equal(ig_tokenizer_encode(tok, text, len, flags, &v), 0);
    if (v.len != nwant || memcmp(v.ids, want, nwant * sizeof *want) != 0) {
        print_error("encode \"%s\": got", text);
        for (size_t i = 0; i < v.len; i++)
            print_error(" %d", (int)v.ids[i]);
        print_error("\n");
    }
    assert_int_equal(v.len, nwant);
    assert_memory_equal(v.ids, want, nwant * sizeof *want);
    ig_tokvec_dispose(&v);
}

#define EXPECT(tok, text, flags, ...)                                                              \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(tok, text, strlen(text), flags, want_, sizeof want_ / sizeof want_[0]);         \
    } while (0)

static char *decode(ig_tokenizer_t *tok, const int32_t *ids, size_t n, unsigned flags)
{
    char *out;
    size_t len;
    assert_int_equal(ig_tokenizer_decode(tok, ids, n, flags, &out, &len), 0);
    assert_int_equal(strlen(out), len);
    return out;
}

static void test_bytelevel_known(void **state)
{
    ig_tokenizer_t *tok = load("bytelevel");
    (void)state;
    assert_int_equal(ig_tokenizer_style(tok), IG_TOKENIZER_BYTE_LEVEL);
    assert_int_equal(ig_tokenizer_vocab_size(tok), 21);
    /* "abc": a b c -> (a,b) rank 0 -> ab c -> (ab,c) rank 1 -> abc = 6.
     * " ab": Ġ a b; (a,b) rank 0 beats (Ġ,a) rank 2 -> Ġ ab, no (Ġ,ab) merge -> 4 5.
     * " é": Ġ Ã © -> (Ã,©) "Ã ©" rank 4 -> 4 11.
     * "1234": \p{N}{1,3} splits "123" "4": (1,2) -> 12 3 -> 16 14; 4 -> 15.
     * "<|eot|>" is an added special token: 17. */
    EXPECT(tok,
           "abc ab \xC3\xA9"
           "1234<|eot|>",
           0, 6, 4, 5, 4, 11, 16, 14, 15, 17);
    /* BOS from tokenizer_config (add_bos_token true, bos "<|bos|>" = 19). */
    EXPECT(tok, "abc", IG_TOKENIZER_ADD_BOS, 19, 6);
    /* Added tokens: longest first ("<|eot|>!" = 20 over "<|eot|>"), as whole strings. */
    EXPECT(tok, "<|eot|>!<|eot|>", 0, 20, 17);
    /* Not special: "<x>" (18) is matched even with NO_SPECIAL; "<|eot|>" is then
     * text, and none of its bytes has a token: unk (0) for each of the 7. */
    EXPECT(tok, "<x><|eot|>", IG_TOKENIZER_NO_SPECIAL, 18, 0, 0, 0, 0, 0, 0, 0);
    /* Bytes without a token become unk: "z" -> 0. */
    EXPECT(tok, "z", 0, 0);
    ig_tokenizer_free(tok);
}

static void test_bytelevel_decode_and_config(void **state)
{
    ig_tokenizer_t *tok = load("bytelevel");
    const int32_t ids[] = {19, 6, 4, 5, 4, 11, 16, 14, 15, 17};
    const int32_t *eos;
    const ig_gen_defaults_t *g;
    const char *bytes;
    size_t blen;
    char *s;
    (void)state;
    s = decode(tok, ids, 10, 0);
    assert_string_equal(s, "<|bos|>abc ab \xC3\xA9"
                           "1234<|eot|>");
    free(s);
    s = decode(tok, ids, 10, IG_TOKENIZER_SKIP_SPECIAL);
    assert_string_equal(s, "abc ab \xC3\xA9"
                           "1234");
    free(s);
    assert_string_equal(ig_tokenizer_token_str(tok, 8), "\xC4\xA0"
                                                        "ab"); /* "Ġab" */
    assert_int_equal(ig_tokenizer_token_bytes(tok, 8, &bytes, &blen), 0);
    assert_int_equal(blen, 3);
    assert_memory_equal(bytes, " ab", 3);
    assert_int_equal(ig_tokenizer_token_id(tok, "\xC3\x83\xC2\xA9", 4), 11); /* "Ã©" */
    assert_int_equal(ig_tokenizer_token_id(tok, "nope", 4), -1);
    assert_null(ig_tokenizer_token_str(tok, 21));
    assert_null(ig_tokenizer_token_str(tok, -1));
    assert_int_equal(ig_tokenizer_bos_id(tok), 19);
    assert_int_equal(ig_tokenizer_adds_bos(tok), 1);
    /* eos_token (17) plus generation_config's list [17, 20], without duplicates. */
    assert_int_equal(ig_tokenizer_eos_id(tok), 17);
    assert_int_equal(ig_tokenizer_eos_ids(tok, &eos), 2);
    assert_int_equal(eos[0], 17);
    assert_int_equal(eos[1], 20);
    assert_true(ig_tokenizer_is_special(tok, 17));
    assert_false(ig_tokenizer_is_special(tok, 18));
    assert_false(ig_tokenizer_is_special(tok, 6));
    g = ig_tokenizer_gen_defaults(tok);
    assert_true(g->has_temperature && g->temperature == 0.6);
    assert_true(g->has_top_p && g->top_p == 0.9);
    assert_true(g->has_top_k && g->top_k == 40);
    assert_true(g->has_do_sample && g->do_sample == 1);
    assert_false(g->has_max_new_tokens);
    assert_non_null(strstr(ig_tokenizer_chat_template(tok), "<|start_header_id|>"));
    /* Out-of-range ids are refused. */
    {
        const int32_t bad[] = {6, 99};
        char *out;
        size_t len;
        assert_int_equal(ig_tokenizer_decode(tok, bad, 2, 0, &out, &len), IG_EINVAL);
    }
    ig_tokenizer_free(tok);
}

static void test_spm_known(void **state)
{
    ig_tokenizer_t *tok = load("spm");
    char *s;
    (void)state;
    assert_int_equal(ig_tokenizer_style(tok), IG_TOKENIZER_SENTENCEPIECE);
    assert_int_equal(ig_tokenizer_vocab_size(tok), 271);
    /* "hello hello" -> "▁hello▁hello"; merges in rank order, leftmost first:
     * (▁,h) (l,l) (▁h,e) (ll,o) (▁he,llo) -> ▁hello ▁hello = 268 268, after BOS 1. */
    EXPECT(tok, "hello hello", IG_TOKENIZER_ADD_BOS, 1, 268, 268);
    /* "hi": ▁ h i -> ▁h (264); 'i' is not in the vocabulary -> <0x69> = 3 + 0x69. */
    EXPECT(tok, "hi", 0, 264, 3 + 0x69);
    /* "é" is in the vocabulary (270); "世" falls back to its three bytes. */
    EXPECT(tok, "\xC3\xA9", 0, 259, 270);
    EXPECT(tok, "\xE4\xB8\x96", 0, 259, 3 + 0xE4, 3 + 0xB8, 3 + 0x96);
    /* A newline is a byte token; the Prepend normalizer adds "▁" to each
     * stretch of text between added tokens. */
    EXPECT(tok, "h\n</s>h", 0, 264, 3 + 0x0A, 2, 264);
    /* Invalid UTF-8 goes through byte fallback too. */
    EXPECT(tok, "\xFF", 0, 259, 3 + 0xFF);
    {
        const int32_t ids[] = {1, 268, 268, 3 + 0x0A, 259, 270};
        s = decode(tok, ids, 6, IG_TOKENIZER_SKIP_SPECIAL);
        /* Strip drops the one leading space; "▁" becomes " ". */
        assert_string_equal(s, "hello hello\n \xC3\xA9");
        free(s);
    }
    ig_tokenizer_free(tok);
}

/* added_options/: "<L>" lstrip (5), "<R>" rstrip (6), "ab" single_word (7);
 * GPT-2 split, no merges, so every other byte is its own token. */
static void test_added_token_options(void **state)
{
    ig_tokenizer_t *tok = load("added_options");
    (void)state;
    EXPECT(tok, "a <L>", 0, 1, 5);                /* the space before <L> goes with it */
    EXPECT(tok, "<R> a", 0, 6, 1);                /* the space after <R> goes with it */
    EXPECT(tok, "a\t <L><R>\n b", 0, 1, 5, 6, 4); /* any whitespace run */
    EXPECT(tok, "ab", 0, 7);                      /* a whole word */
    EXPECT(tok, "_ab", 0, 3, 1, 4);               /* '_' is a word character */
    EXPECT(tok, "a ab b", 0, 1, 2, 7, 2, 4);      /* "a", " ", ab, " b" */
    EXPECT(tok, "abab", 0, 1, 4, 1, 4);           /* never inside a word */
    ig_tokenizer_free(tok);
}

static void test_utf8_check(void **state)
{
    size_t off = 99;
    (void)state;
    assert_int_equal(ig_tokenizer_utf8_check("abc \xC3\xA9 \xF0\x9F\x8E\x89", 11, &off), 0);
    assert_int_equal(ig_tokenizer_utf8_check("ab\xC3", 3, &off), IG_EPARSE);
    assert_int_equal(off, 2);
    assert_int_equal(ig_tokenizer_utf8_check("a\xC0\xAF", 3, &off), IG_EPARSE); /* overlong */
    assert_int_equal(off, 1);
    assert_int_equal(ig_tokenizer_utf8_check("\xED\xA0\x80", 3, &off), IG_EPARSE); /* surrogate */
    assert_int_equal(off, 0);
    assert_int_equal(ig_tokenizer_utf8_check("\xF4\x90\x80\x80", 4, &off), IG_EPARSE);
    assert_int_equal(ig_tokenizer_utf8_check("x\xFF", 2, NULL), IG_EPARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytelevel_known), cmocka_unit_test(test_bytelevel_decode_and_config),
        cmocka_unit_test(test_spm_known),       cmocka_unit_test(test_added_token_options),
        cmocka_unit_test(test_utf8_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
