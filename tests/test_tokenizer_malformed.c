/* Malformed tokenizer files: each case folder under
 * tests/cases/tokenizer/malformed/ holds tokenizer.json (and maybe
 * tokenizer_config.json / generation_config.json) and `expect`, the message
 * the loader must give. Also: random corruption never crashes the loader. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "cases.h"
#include "files.h"
#include "infergate/error.h"
#include "infergate/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int check_case(const char *name, const char *dir, void *data)
{
    char err[512];
    ig_tokenizer_t *tok = (void *)1;
    (void)data;
    char *expect = ig_case_expect(dir);
    if (expect == NULL) {
        print_error("case %s: no expect file\n", name);
        return 1;
    }
    int rc = ig_tokenizer_load(dir, &tok, err, sizeof err);
    int failed = rc != IG_ETOKENIZER || tok != NULL || strstr(err, expect) != err;
    if (failed)
        print_error("case %s: rc %d, got \"%s\", want \"%s\"\n", name, rc, err, expect);
    if (rc == 0 && tok != NULL && tok != (void *)1)
        ig_tokenizer_free(tok);
    free(expect);
    return failed;
}

static void test_each_case_gives_its_message(void **state)
{
    int n;
    (void)state;
    int failures = ig_cases_foreach("tokenizer/malformed", check_case, NULL, &n);
    /* The suite must not pass by finding nothing. */
    assert_true(n >= 30);
    assert_int_equal(failures, 0);
}

static void test_missing_file(void **state)
{
    char err[256];
    ig_tokenizer_t *tok;
    (void)state;
    assert_int_equal(
        ig_tokenizer_load(IG_SOURCE_DIR "/tests/cases/tokenizer/nowhere", &tok, err, sizeof err),
        IG_ENOENT);
    assert_non_null(strstr(err, "tokenizer.json: cannot open"));
}

/* Flips, deletes and duplicates bytes of a valid file: the loader either
 * accepts the result or rejects it with a message, and never crashes. */
static void test_corruption_never_crashes(void **state)
{
    size_t len = 0;
    char *orig = ig_tf_read(IG_SOURCE_DIR "/tests/cases/tokenizer/bytelevel/tokenizer.json", &len);
    char dir[] = "/tmp/ig_tok_corrupt_XXXXXX";
    char path[64];
    uint64_t rng = 12345;
    int rejected = 0;
    (void)state;
    assert_non_null(orig);
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (int iter = 0; iter < 400; iter++) {
        char *buf = malloc(len * 2 + 1), err[512];
        size_t n = len;
        ig_tokenizer_t *tok = NULL;
        FILE *f;
        int rc;
        memcpy(buf, orig, len);
        for (int k = 0; k < 1 + iter % 4; k++) {
            size_t pos;
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            pos = (size_t)(rng >> 33) % n;
            switch ((rng >> 20) % 3) {
            case 0:
                buf[pos] = (char)(rng >> 40);
                break;
            case 1:
                memmove(buf + pos, buf + pos + 1, n - pos - 1);
                n--;
                break;
            default:
                memmove(buf + pos + 1, buf + pos, n - pos);
                n++;
            }
        }
        f = fopen(path, "wb");
        assert_non_null(f);
        fwrite(buf, 1, n, f);
        fclose(f);
        rc = ig_tokenizer_load_files(path, NULL, NULL, &tok, err, sizeof err);
        if (rc == 0) {
            ig_tokvec_t v;
            ig_tokvec_init(&v);
            assert_int_equal(ig_tokenizer_encode(tok, "abc <|eot|> \xff\xfe z", 16, 0, &v) <= 0, 1);
            ig_tokvec_dispose(&v);
            ig_tokenizer_free(tok);
        } else {
            assert_true(rc < 0);
            assert_true(strncmp(err, "tokenizer.json: ", 16) == 0);
            rejected++;
        }
        free(buf);
    }
    assert_true(rejected > 0);
    unlink(path);
    rmdir(dir);
    free(orig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_case_gives_its_message),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_corruption_never_crashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
