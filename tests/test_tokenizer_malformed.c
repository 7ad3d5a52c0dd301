/* Malformed tokenizer files: each case folder under
 * tests/cases/tokenizer/malformed/ holds tokenizer.json (and maybe
 * tokenizer_config.json / generation_config.json) and `expect`, the message
 * the loader must give. Also: random corruption never crashes the loader. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/error.h"
#include "infergate/tokenizer.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CASES IG_SOURCE_DIR "/tests/cases/tokenizer/malformed"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_each_case_gives_its_message(void **state)
{
    DIR *d = opendir(CASES);
    struct dirent *e;
    char *names[128];
    size_t n = 0;
    (void)state;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL && n < 128)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    /* The suite must not pass by finding nothing. */
    assert_true(n >= 30);
    for (size_t i = 0; i < n; i++) {
        char dir[1024], path[1100], err[512];
        char *expect;
        ig_tokenizer_t *tok = (void *)1;
        int rc;
        snprintf(dir, sizeof dir, "%s/%s", CASES, names[i]);
        snprintf(path, sizeof path, "%s/expect", dir);
        expect = slurp(path, NULL);
        assert_non_null(expect);
        expect[strcspn(expect, "\n")] = 0;
        rc = ig_tokenizer_load(dir, &tok, err, sizeof err);
        if (rc != IG_ETOKENIZER || strstr(err, expect) != err)
            print_error("case %s: rc %d, got \"%s\", want \"%s\"\n", names[i], rc, err, expect);
        assert_int_equal(rc, IG_ETOKENIZER);
        assert_null(tok);
        assert_ptr_equal(strstr(err, expect), err);
        free(expect);
        free(names[i]);
    }
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
    size_t len;
    char *orig = slurp(IG_SOURCE_DIR "/tests/cases/tokenizer/bytelevel/tokenizer.json", &len);
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
