/* The vocabulary generator: exact sizes, determinism in the seed, real
 * merges that the loader accepts, argument errors, and its speed figure. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/tokenizer.h"
#include "infergate/tokgen.h"

#include "../gateway/engine/tokenizer/internal.h" /* ig__tokgen_write_corpus */

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char root_dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(root_dir, "/tmp/ig_tokgen_XXXXXX");
    return mkdtemp(root_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    (void)state;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void gen(const char *name, int vocab, int style, uint64_t seed, char *dir, size_t dlen)
{
    char err[256];
    double t0;
    int rc;
    snprintf(dir, dlen, "%s/%s", root_dir, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    t0 = now_s();
    rc = ig_tokgen_write(dir, vocab, style, seed, err, sizeof err);
    if (rc != 0)
        print_error("tokgen: %s\n", err);
    assert_int_equal(rc, 0);
    if (vocab >= 32000)
        print_message("tokgen vocab %d style %d: %.2f s\n", vocab, style, now_s() - t0);
}

static char *slurp(const char *dir, const char *file, size_t *len)
{
    char path[256];
    FILE *f;
    char *buf;
    long n;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static void check_vocab_size_only(const char *dir, int vocab)
{
    char err[512];
    ig_tokenizer_t *tok;
    int rc = ig_tokenizer_load(dir, &tok, err, sizeof err);
    if (rc != 0)
        print_error("load: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(ig_tokenizer_vocab_size(tok), (size_t)vocab);
    for (int id = 0; id < vocab; id++)
        assert_non_null(ig_tokenizer_token_str(tok, id));
    ig_tokenizer_free(tok);
}

/* Loads dir and checks the size, the merges and the special tokens. */
static void check_vocab(const char *dir, int vocab, int style)
{
    char err[512], path[256];
    ig_tokenizer_t *tok;
    json_t *j;
    json_error_t jerr;
    size_t base, n_special;
    assert_int_equal(ig_tokenizer_load(dir, &tok, err, sizeof err), 0);
    assert_int_equal(ig_tokenizer_vocab_size(tok), (size_t)vocab);
    /* Every id is used. */
    for (int id = 0; id < vocab; id++)
        assert_non_null(ig_tokenizer_token_str(tok, id));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    j = json_load_file(path, 0, &jerr);
    assert_non_null(j);
    if (style == IG_TOKGEN_SENTENCEPIECE) {
        /* <unk> <s> </s>, 256 byte tokens, the corpus alphabet: merges fill the rest. */
        assert_int_equal(ig_tokenizer_style(tok), IG_TOKENIZER_SENTENCEPIECE);
        assert_int_equal(ig_tokenizer_bos_id(tok), 1);
        assert_int_equal(ig_tokenizer_eos_id(tok), 2);
        assert_int_equal(ig_tokenizer_token_id(tok, "<0x0A>", 6), 3 + 10);
        n_special = 0;
        base = 3 + 256;
        /* Plus the corpus alphabet: the one-character pieces. */
        {
            const char *key;
            json_t *val;
            json_object_foreach(json_object_get(json_object_get(j, "model"), "vocab"), key, val)
            {
                uint32_t l = (uint32_t)strlen(key);
                if (l == 1 || (l == 3 && strcmp(key, "\xE2\x96\x81") == 0))
                    base++;
            }
        }
        /* Every learned token needs its merge (a merge may also reach a
         * token that exists already, hence >=). */
        assert_true(json_array_size(json_object_get(json_object_get(j, "model"), "merges")) >=
                    (size_t)vocab - base);
    } else {
        assert_int_equal(ig_tokenizer_style(tok), IG_TOKENIZER_BYTE_LEVEL);
        n_special = style == IG_TOKGEN_BYTE_LEVEL ? 5 : 3;
        base = 256;
        /* Every learned token needs its merge. */
        assert_true(json_array_size(json_object_get(json_object_get(j, "model"), "merges")) >=
                    (size_t)vocab - base - n_special);
        assert_int_equal(json_array_size(json_object_get(j, "added_tokens")), n_special);
    }
    if (style == IG_TOKGEN_BYTE_LEVEL) {
        assert_int_equal(ig_tokenizer_bos_id(tok),
                         ig_tokenizer_token_id(tok, "<|begin_of_text|>", 17));
        assert_true(ig_tokenizer_adds_bos(tok));
        assert_true(ig_tokenizer_token_id(tok, "<|eot_id|>", 10) >= 0);
        assert_non_null(strstr(ig_tokenizer_chat_template(tok), "<|start_header_id|>"));
    } else if (style == IG_TOKGEN_CHATML) {
        assert_false(ig_tokenizer_adds_bos(tok));
        assert_true(ig_tokenizer_token_id(tok, "<|im_end|>", 10) >= 0);
        assert_non_null(strstr(ig_tokenizer_chat_template(tok), "<|im_start|>"));
    } else {
        assert_non_null(strstr(ig_tokenizer_chat_template(tok), "[INST]"));
    }
    /* Learned merges compress English-like text well below a token per 2 bytes. */
    {
        const char *t = "The people of the world have been there before, and the answer was "
                        "that they would not do it again.";
        ig_tokvec_t v;
        ig_tokvec_init(&v);
        assert_int_equal(ig_tokenizer_encode(tok, t, strlen(t), 0, &v), 0);
        assert_true(v.len * 2 < strlen(t));
        ig_tokvec_dispose(&v);
    }
    json_decref(j);
    ig_tokenizer_free(tok);
}

static void test_exact_sizes(void **state)
{
    static const int sizes[] = {512, 1000, 4096, 5003};
    char dir[128], name[32];
    (void)state;
    for (int s = 1; s <= 3; s++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            snprintf(name, sizeof name, "size_%d_%d", s, sizes[k]);
            gen(name, sizes[k], s, 1, dir, sizeof dir);
            check_vocab(dir, sizes[k], s);
        }
}

static void test_large_sizes(void **state)
{
    char dir[128];
    (void)state;
    gen("small_l3", 32000, IG_TOKGEN_BYTE_LEVEL, 3, dir, sizeof dir);
    check_vocab(dir, 32000, IG_TOKGEN_BYTE_LEVEL);
    gen("small_sp", 32000, IG_TOKGEN_SENTENCEPIECE, 3, dir, sizeof dir);
    check_vocab(dir, 32000, IG_TOKGEN_SENTENCEPIECE);
    gen("big_l3", 128256, IG_TOKGEN_BYTE_LEVEL, 3, dir, sizeof dir);
    check_vocab(dir, 128256, IG_TOKGEN_BYTE_LEVEL);
}

static void test_deterministic_in_seed(void **state)
{
    char a[128], b[128], c[128], name[32];
    (void)state;
    for (int s = 1; s <= 3; s++) {
        size_t la, lb, lc, ca, cb;
        char *ja, *jb, *jc, *ka, *kb;
        snprintf(name, sizeof name, "seed_a_%d", s);
        gen(name, 2048, s, 42, a, sizeof a);
        snprintf(name, sizeof name, "seed_b_%d", s);
        gen(name, 2048, s, 42, b, sizeof b);
        snprintf(name, sizeof name, "seed_c_%d", s);
        gen(name, 2048, s, 43, c, sizeof c);
        ja = slurp(a, "tokenizer.json", &la);
        jb = slurp(b, "tokenizer.json", &lb);
        jc = slurp(c, "tokenizer.json", &lc);
        ka = slurp(a, "tokenizer_config.json", &ca);
        kb = slurp(b, "tokenizer_config.json", &cb);
        assert_int_equal(la, lb);
        assert_memory_equal(ja, jb, la);
        assert_int_equal(ca, cb);
        assert_memory_equal(ka, kb, ca);
        assert_true(la != lc || memcmp(ja, jc, la) != 0);
        free(ja);
        free(jb);
        free(jc);
        free(ka);
        free(kb);
    }
}

/* A corpus far too small for the vocabulary: the generator completes it by
 * joining tokens, still exact, valid (the loader checks every merge) and
 * deterministic. */
static void test_tiny_corpus_is_completed(void **state)
{
    char a[128], b[128], err[256];
    (void)state;
    for (int s = 1; s <= 3; s++) {
        size_t la, lb;
        char *ja, *jb;
        snprintf(a, sizeof a, "%s/tiny_a_%d", root_dir, s);
        snprintf(b, sizeof b, "%s/tiny_b_%d", root_dir, s);
        assert_int_equal(mkdir(a, 0755), 0);
        assert_int_equal(mkdir(b, 0755), 0);
        assert_int_equal(ig__tokgen_write_corpus(a, 3000, s, 9, 12, 40, err, sizeof err), 0);
        assert_int_equal(ig__tokgen_write_corpus(b, 3000, s, 9, 12, 40, err, sizeof err), 0);
        check_vocab_size_only(a, 3000);
        ja = slurp(a, "tokenizer.json", &la);
        jb = slurp(b, "tokenizer.json", &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(ja, jb, la);
        free(ja);
        free(jb);
    }
}

static void test_bad_arguments(void **state)
{
    char err[256];
    (void)state;
    err[0] = 0;
    assert_int_equal(ig_tokgen_write(root_dir, 100, IG_TOKGEN_BYTE_LEVEL, 1, err, sizeof err),
                     IG_EINVAL);
    assert_non_null(strstr(err, "vocab_size 100"));
    assert_int_equal(ig_tokgen_write(root_dir, 4096, 9, 1, err, sizeof err), IG_EINVAL);
    assert_non_null(strstr(err, "style 9"));
    assert_int_equal(
        ig_tokgen_write("/nonexistent/dir", 512, IG_TOKGEN_SENTENCEPIECE, 1, err, sizeof err),
        IG_EIO);
    assert_non_null(strstr(err, "cannot write"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_sizes),
        cmocka_unit_test(test_large_sizes),
        cmocka_unit_test(test_deterministic_in_seed),
        cmocka_unit_test(test_tiny_corpus_is_completed),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
