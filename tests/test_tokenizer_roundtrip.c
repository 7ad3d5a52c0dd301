/* Round trips on generated vocabularies of every style: multibyte text
 * (CJK, emoji, accents, combining marks, tabs, newlines, edge spaces), the
 * streaming decoder (never a split character, same text as decode), invalid
 * UTF-8 in the input, special tokens, and the 1 MB encoding figure. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/tokenizer.h"
#include "infergate/tokgen.h"

#include "../gateway/engine/tokenizer/internal.h" /* ig__nfc_needed */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const TEXTS[] = {
    "Hello, world! The model's answer is 42.",
    "  leading and trailing spaces  ",
    " one leading space",
    "tabs\tand\nnewlines\r\n\n\nmixed \t \n end",
    "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x85ngstr\xC3\xB6m",
    "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9"
    "\xE3\x83\x88",
    "emoji \xF0\x9F\x8E\x89\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and ZWJ "
    "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB!",
    "combining e\xCC\x81 a\xCC\x8A o\xCC\x88\xCC\x81 marks",
    "Numbers 1234567 3.14159 -0.5e10 and 2024-11-30",
    "Greek \xCE\xB1\xCE\xB2\xCE\xB3, Cyrillic \xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, "
    "Arabic \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",
    "I'm sure they'll say it's DON'T or we've",
    "\n",
    " ",
    "x",
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])
#define COMBINING 7 /* TEXTS[7], whose NFC form differs */
/* TEXTS[COMBINING] in NFC: what the Qwen2-style tokenizer (NFC normalizer) gives back. */
static const char COMBINING_NFC[] = "combining \xC3\xA9 \xC3\xA5 \xC3\xB6\xCC\x81 marks";

typedef struct {
    char dir[64];
    ig_tokenizer_t *tok[3];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    char err[512];
    strcpy(f->dir, "/tmp/ig_tok_rt_XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    for (int s = 1; s <= 3; s++) {
        char sub[128];
        snprintf(sub, sizeof sub, "%s/%d", f->dir, s);
        if (mkdir(sub, 0755) != 0 || ig_tokgen_write(sub, 4096, s, 7, err, sizeof err) != 0 ||
            ig_tokenizer_load(sub, &f->tok[s - 1], err, sizeof err) != 0) {
            fprintf(stderr, "setup: %s\n", err);
            return -1;
        }
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    char cmd[256];
    for (int s = 0; s < 3; s++)
        ig_tokenizer_free(f->tok[s]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

/* Encodes text, decodes it (at once and streamed) and expects want. */
static void roundtrip_to(ig_tokenizer_t *tok, const char *text, size_t len, const char *want,
                         size_t wlen)
{
    ig_tokvec_t v;
    char *out;
    size_t olen;
    ig_tokdec_t d;
    char *acc = malloc(len * 3 + 16);
    size_t alen = 0;
    ig_tokvec_init(&v);
    assert_int_equal(ig_tokenizer_encode(tok, text, len, 0, &v), 0);
    assert_true(v.len > 0);
    assert_int_equal(ig_tokenizer_decode(tok, v.ids, v.len, 0, &out, &olen), 0);
    if (olen != wlen || memcmp(out, want, wlen) != 0)
        print_error("round trip of \"%s\" gave \"%s\"\n", text, out);
    assert_int_equal(olen, wlen);
    assert_memory_equal(out, want, wlen);
    /* Streaming: every piece is whole UTF-8, and the pieces add up. */
    ig_tokdec_init(&d, tok, 0);
    for (size_t i = 0; i < v.len; i++) {
        const char *piece;
        size_t plen;
        assert_int_equal(ig_tokdec_push(&d, v.ids[i], &piece, &plen), 0);
        assert_int_equal(ig_tokenizer_utf8_check(piece, plen, NULL), 0);
        memcpy(acc + alen, piece, plen);
        alen += plen;
    }
    {
        const char *piece;
        size_t plen;
        assert_int_equal(ig_tokdec_flush(&d, &piece, &plen), 0);
        memcpy(acc + alen, piece, plen);
        alen += plen;
    }
    assert_int_equal(alen, olen);
    assert_memory_equal(acc, out, olen);
    ig_tokdec_dispose(&d);
    free(acc);
    free(out);
    ig_tokvec_dispose(&v);
}

static void roundtrip(ig_tokenizer_t *tok, const char *text, size_t len)
{
    roundtrip_to(tok, text, len, text, len);
}

static void test_roundtrip_all_styles(void **state)
{
    fixture_t *f = *state;
    for (int s = 0; s < 3; s++)
        for (size_t i = 0; i < N_TEXTS; i++)
            if (s == 2 && i == COMBINING)
                roundtrip_to(f->tok[s], TEXTS[i], strlen(TEXTS[i]), COMBINING_NFC,
                             strlen(COMBINING_NFC));
            else
                roundtrip(f->tok[s], TEXTS[i], strlen(TEXTS[i]));
}

/* Byte-level: any bytes, even invalid UTF-8, encode and their tokens' bytes
 * give the input back exactly; decode shows the bad bytes as U+FFFD. */
static void test_invalid_utf8_input(void **state)
{
    fixture_t *f = *state;
    static const char bad[] = "ok \xFF\xFE tail \xE4\xB8 end \xC0\xAF";
    size_t n = sizeof bad - 1;
    for (int s = 0; s < 3; s++) {
        ig_tokenizer_t *tok = f->tok[s];
        ig_tokvec_t v;
        char *joined = malloc(n + 64), *out;
        size_t jl = 0, olen;
        ig_tokvec_init(&v);
        assert_int_equal(ig_tokenizer_encode(tok, bad, n, 0, &v), 0);
        for (size_t i = 0; i < v.len; i++) {
            const char *b;
            size_t bl;
            assert_int_equal(ig_tokenizer_token_bytes(tok, v.ids[i], &b, &bl), 0);
            memcpy(joined + jl, b, bl);
            jl += bl;
        }
        if (ig_tokenizer_style(tok) == IG_TOKENIZER_BYTE_LEVEL) {
            assert_int_equal(jl, n);
            assert_memory_equal(joined, bad, n);
        } else {
            /* Sentencepiece: the normalizer's "▁" prefix is one extra space. */
            assert_int_equal(jl, n + 1);
            assert_memory_equal(joined + 1, bad, n);
        }
        assert_int_equal(ig_tokenizer_decode(tok, v.ids, v.len, 0, &out, &olen), 0);
        assert_int_equal(ig_tokenizer_utf8_check(out, olen, NULL), 0);
        assert_string_equal(out, "ok \xEF\xBF\xBD\xEF\xBF\xBD tail \xEF\xBF\xBD end "
                                 "\xEF\xBF\xBD\xEF\xBF\xBD");
        free(out);
        free(joined);
        ig_tokvec_dispose(&v);
    }
}

/* Random bytes (mostly not UTF-8): encoding never fails; in byte-level mode
 * the tokens' bytes are the input exactly, and valid UTF-8 input round-trips
 * in every mode that does not normalize it. */
static void test_random_bytes(void **state)
{
    fixture_t *f = *state;
    uint64_t rng = 4242;
    for (int iter = 0; iter < 2000; iter++) {
        unsigned char buf[64];
        size_t n = 1 + (size_t)iter % 64;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            /* Bias towards bytes that build (or almost build) multibyte characters. */
            buf[i] =
                (unsigned char)((rng >> 56) % 4 == 0 ? 0x80 + (rng >> 40) % 0x40 : (rng >> 33));
        }
        for (int s = 0; s < 3; s++) {
            ig_tokenizer_t *tok = f->tok[s];
            ig_tokvec_t v;
            char joined[64 * 8];
            size_t jl = 0;
            ig_tokvec_init(&v);
            assert_int_equal(ig_tokenizer_encode(tok, (const char *)buf, n, 0, &v), 0);
            for (size_t i = 0; i < v.len; i++) {
                const char *b;
                size_t bl;
                assert_int_equal(ig_tokenizer_token_bytes(tok, v.ids[i], &b, &bl), 0);
                assert_true(jl + bl <= sizeof joined);
                memcpy(joined + jl, b, bl);
                jl += bl;
            }
            if (s != 1) { /* byte-level styles */
                if (s == 0 || !ig__nfc_needed(buf, n)) {
                    assert_int_equal(jl, n);
                    assert_memory_equal(joined, buf, n);
                }
            } else {
                assert_int_equal(jl, n + 1); /* "▁" prefix */
                assert_int_equal(joined[0], ' ');
                assert_memory_equal(joined + 1, buf, n);
            }
            ig_tokvec_dispose(&v);
        }
    }
}

/* Feeding the four byte-fallback tokens of an emoji one by one: nothing comes
 * out until the character is whole; a byte that can never be completed
 * comes out as U+FFFD at once; an incomplete tail comes out at flush. */
static void test_stream_holds_partial_characters(void **state)
{
    fixture_t *f = *state;
    ig_tokenizer_t *tok = f->tok[1]; /* sentencepiece */
    ig_tokdec_t d;
    const char *p;
    size_t n;
    const char *emoji = "\xF0\x9F\x8E\x89";
    int32_t word = ig_tokenizer_token_id(tok, "\xE2\x96\x81the", 6);
    assert_true(word >= 0);
    ig_tokdec_init(&d, tok, IG_TOKENIZER_SKIP_SPECIAL);
    assert_int_equal(ig_tokdec_push(&d, ig_tokenizer_bos_id(tok), &p, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ig_tokdec_push(&d, word, &p, &n), 0);
    assert_string_equal(p, "the"); /* leading space stripped once */
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", (unsigned char)emoji[i]);
        assert_int_equal(ig_tokdec_push(&d, ig_tokenizer_token_id(tok, name, 6), &p, &n), 0);
        if (i < 3)
            assert_int_equal(n, 0);
        else
            assert_string_equal(p, emoji);
    }
    assert_int_equal(ig_tokdec_push(&d, word, &p, &n), 0);
    assert_string_equal(p, " the");
    assert_int_equal(ig_tokdec_push(&d, ig_tokenizer_token_id(tok, "<0xFF>", 6), &p, &n), 0);
    assert_string_equal(p, "\xEF\xBF\xBD");
    assert_int_equal(ig_tokdec_push(&d, ig_tokenizer_token_id(tok, "<0xE4>", 6), &p, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ig_tokdec_push(&d, ig_tokenizer_token_id(tok, "<0xB8>", 6), &p, &n), 0);
    assert_int_equal(n, 0);
    /* A plain character breaks the sequence: the held bytes become one U+FFFD. */
    assert_int_equal(ig_tokdec_push(&d, word, &p, &n), 0);
    assert_string_equal(p, "\xEF\xBF\xBD the");
    assert_int_equal(ig_tokdec_push(&d, ig_tokenizer_token_id(tok, "<0xE4>", 6), &p, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ig_tokdec_flush(&d, &p, &n), 0);
    assert_string_equal(p, "\xEF\xBF\xBD");
    assert_int_equal(ig_tokdec_push(&d, -5, &p, &n), IG_EINVAL);
    ig_tokdec_dispose(&d);
}

/* Random id sequences (byte tokens in any order, so plenty of broken
 * UTF-8): every streamed piece is valid UTF-8 and the pieces plus the flush
 * equal decode() of the same ids. */
static void test_stream_random_ids(void **state)
{
    fixture_t *f = *state;
    uint64_t rng = 99;
    for (int s = 0; s < 3; s++) {
        ig_tokenizer_t *tok = f->tok[s];
        size_t vs = ig_tokenizer_vocab_size(tok);
        for (int iter = 0; iter < 300; iter++) {
            int32_t ids[24];
            size_t n = 1 + (size_t)iter % 24, alen = 0, olen, plen;
            char acc[24 * 256 * 3 + 16], *out;
            const char *piece;
            ig_tokdec_t d;
            unsigned flags = iter % 2 ? IG_TOKENIZER_SKIP_SPECIAL : 0;
            for (size_t i = 0; i < n; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                /* Half the draws among the first 300 ids: bytes and short pieces. */
                ids[i] = (int32_t)((rng >> 33) % ((rng >> 20) % 2 ? 300 : vs));
            }
            ig_tokdec_init(&d, tok, flags);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(ig_tokdec_push(&d, ids[i], &piece, &plen), 0);
                assert_int_equal(ig_tokenizer_utf8_check(piece, plen, NULL), 0);
                assert_true(alen + plen < sizeof acc);
                memcpy(acc + alen, piece, plen);
                alen += plen;
            }
            assert_int_equal(ig_tokdec_flush(&d, &piece, &plen), 0);
            assert_int_equal(ig_tokenizer_utf8_check(piece, plen, NULL), 0);
            memcpy(acc + alen, piece, plen);
            alen += plen;
            ig_tokdec_dispose(&d);
            assert_int_equal(ig_tokenizer_decode(tok, ids, n, flags, &out, &olen), 0);
            assert_int_equal(alen, olen);
            assert_memory_equal(acc, out, olen);
            free(out);
        }
    }
}

static void test_special_tokens(void **state)
{
    fixture_t *f = *state;
    ig_tokenizer_t *l3 = f->tok[0], *sp = f->tok[1], *cm = f->tok[2];
    ig_tokvec_t v;
    const char *text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
    int32_t sh = ig_tokenizer_token_id(l3, "<|start_header_id|>", 19);
    int32_t eh = ig_tokenizer_token_id(l3, "<|end_header_id|>", 17);
    int32_t eot = ig_tokenizer_token_id(l3, "<|eot_id|>", 10);
    char *out;
    size_t olen;
    ig_tokvec_init(&v);
    assert_true(sh >= 0 && eh >= 0 && eot >= 0);
    assert_true(ig_tokenizer_is_special(l3, sh));
    assert_int_equal(ig_tokenizer_encode(l3, text, strlen(text), IG_TOKENIZER_ADD_BOS, &v), 0);
    assert_int_equal(v.ids[0], ig_tokenizer_bos_id(l3));
    assert_int_equal(v.ids[1], sh);
    assert_int_equal(v.ids[v.len - 1], eot);
    for (size_t i = 2; i + 1 < v.len; i++)
        if (v.ids[i] == eh)
            goto found;
    fail_msg("no <|end_header_id|>");
found:
    assert_int_equal(ig_tokenizer_decode(l3, v.ids, v.len, IG_TOKENIZER_SKIP_SPECIAL, &out, &olen),
                     0);
    assert_string_equal(out, "user\n\nhi");
    free(out);
    /* NO_SPECIAL: the same text is plain text, no special id appears. */
    v.len = 0;
    assert_int_equal(ig_tokenizer_encode(l3, text, strlen(text), IG_TOKENIZER_NO_SPECIAL, &v), 0);
    for (size_t i = 0; i < v.len; i++)
        assert_false(ig_tokenizer_is_special(l3, v.ids[i]));
    assert_int_equal(ig_tokenizer_decode(l3, v.ids, v.len, 0, &out, &olen), 0);
    assert_string_equal(out, text);
    free(out);
    /* Sentencepiece: <s> and </s>; ChatML: <|im_start|> and no BOS. */
    v.len = 0;
    assert_int_equal(ig_tokenizer_encode(sp, "a</s>", 5, IG_TOKENIZER_ADD_BOS, &v), 0);
    assert_int_equal(v.ids[0], 1);
    assert_int_equal(v.ids[v.len - 1], 2);
    assert_int_equal(ig_tokenizer_eos_id(sp), 2);
    v.len = 0;
    assert_int_equal(ig_tokenizer_encode(cm, "<|im_start|>x", 13, IG_TOKENIZER_ADD_BOS, &v), 0);
    assert_int_equal(v.ids[0], ig_tokenizer_token_id(cm, "<|im_start|>", 12));
    assert_int_equal(ig_tokenizer_adds_bos(cm), 0);
    assert_int_equal(ig_tokenizer_bos_id(cm), -1);
    ig_tokvec_dispose(&v);
}

/* The Qwen2-style tokenizer declares an NFC normalizer: decomposed input
 * encodes as its composed form; other styles keep the bytes. */
static void test_nfc_normalizer(void **state)
{
    fixture_t *f = *state;
    static const struct {
        const char *in, *nfc;
    } cases[] = {
        {"\xE2\x84\xAB", "\xC3\x85"},                             /* ANGSTROM SIGN -> Å */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* jamo -> 각 */
        /* a + dot below (class 220) + acute (230) -> "ạ" (U+1EA1) + acute */
        {"a\xCC\xA3\xCC\x81", "\xE1\xBA\xA1\xCC\x81"},
        {"e\xCC\x81", "\xC3\xA9"},
        {"plain text", "plain text"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *want = cases[i].nfc;
        roundtrip_to(f->tok[2], cases[i].in, strlen(cases[i].in), want, strlen(want));
        roundtrip(f->tok[0], cases[i].in, strlen(cases[i].in));
    }
    /* Marks out of canonical order are reordered before composing. */
    roundtrip_to(f->tok[2], "a\xCC\x81\xCC\xA3", 5, "\xE1\xBA\xA1\xCC\x81", 5);
}

/* Long inputs go through a per-call word cache: the ids must be those of
 * encoding each stretch between special tokens on its own (short, uncached). */
static void test_long_input_matches_pieces(void **state)
{
    fixture_t *f = *state;
    static const char *const special[] = {"<|eot_id|>", "</s>", "<|im_end|>"};
    for (int s = 0; s < 3; s++) {
        ig_tokenizer_t *tok = f->tok[s];
        int32_t sid = ig_tokenizer_token_id(tok, special[s], strlen(special[s]));
        char piece[2048], *full;
        size_t pl = 0, fl = 0, reps = 200;
        ig_tokvec_t vp, vf;
        assert_true(sid >= 0);
        for (size_t i = 0; i < N_TEXTS; i++) {
            size_t l = strlen(TEXTS[i]);
            memcpy(piece + pl, TEXTS[i], l);
            pl += l;
        }
        full = malloc((pl + 16) * reps);
        for (size_t r = 0; r < reps; r++) {
            memcpy(full + fl, piece, pl);
            fl += pl;
            memcpy(full + fl, special[s], strlen(special[s]));
            fl += strlen(special[s]);
        }
        assert_true(pl < 4096 && fl >= 4096);
        ig_tokvec_init(&vp);
        ig_tokvec_init(&vf);
        assert_int_equal(ig_tokenizer_encode(tok, piece, pl, 0, &vp), 0);
        assert_int_equal(ig_tokenizer_encode(tok, full, fl, 0, &vf), 0);
        assert_int_equal(vf.len, (vp.len + 1) * reps);
        for (size_t r = 0; r < reps; r++) {
            assert_memory_equal(vf.ids + r * (vp.len + 1), vp.ids, vp.len * sizeof *vp.ids);
            assert_int_equal(vf.ids[r * (vp.len + 1) + vp.len], sid);
        }
        ig_tokvec_dispose(&vp);
        ig_tokvec_dispose(&vf);
        free(full);
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Encodes 1 MiB of mixed text once per style and prints the time: the figure
 * for docs/tokenizer.md. Not asserted (timing belongs to bench/), but the
 * result must round-trip. */
static void test_one_megabyte(void **state)
{
    fixture_t *f = *state;
    size_t n = 1 << 20, o = 0, k = 0;
    char *big = malloc(n + 64);
    /* Without the decomposed text, so that every style gives the input back. */
    while (o < n) {
        const char *t = TEXTS[k++ % N_TEXTS];
        if (t == TEXTS[COMBINING])
            continue;
        size_t l = strlen(t);
        memcpy(big + o, t, l);
        o += l;
        big[o++] = ' ';
    }
    for (int s = 0; s < 3; s++) {
        ig_tokvec_t v;
        char *out;
        size_t olen;
        double t0, t1;
        ig_tokvec_init(&v);
        t0 = now_s();
        assert_int_equal(ig_tokenizer_encode(f->tok[s], big, o, 0, &v), 0);
        t1 = now_s();
        print_message("encode %zu bytes, style %d: %zu tokens in %.3f s (%.1f MB/s)\n", o, s + 1,
                      v.len, t1 - t0, (double)o / (t1 - t0) / 1e6);
        assert_int_equal(ig_tokenizer_decode(f->tok[s], v.ids, v.len, 0, &out, &olen), 0);
        assert_int_equal(olen, o);
        assert_memory_equal(out, big, o);
        free(out);
        ig_tokvec_dispose(&v);
    }
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_styles),
        cmocka_unit_test(test_invalid_utf8_input),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_stream_holds_partial_characters),
        cmocka_unit_test(test_stream_random_ids),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_nfc_normalizer),
        cmocka_unit_test(test_long_input_matches_pieces),
        cmocka_unit_test(test_one_megabyte),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
