/*
 * base/utf8: the classic edge cases (after Markus Kuhn's UTF-8 decoder
 * stress test: boundaries, overlongs, surrogates, truncated sequences, the
 * largest code point and beyond), the streaming tail, encoding, and a
 * cross-check against Python's strict decoder on random bytes from a fixed
 * seed: the valid prefix and the U+FFFD replacement (ig_utf8_replace) must
 * agree byte for byte.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define S(lit) lit, sizeof(lit) - 1

static void expect_char(const char *s, size_t len, uint32_t want)
{
    uint32_t cp = 0xdeadbeef;
    assert_int_equal(ig_utf8_decode(s, len, &cp), len);
    assert_int_equal(cp, want);
    assert_true(ig_utf8_valid(s, len));
}

static void expect_bad(const char *s, size_t len, size_t prefix)
{
    assert_false(ig_utf8_valid(s, len));
    assert_int_equal(ig_utf8_valid_prefix(s, len), prefix);
}

static void test_boundaries(void **state)
{
    expect_char(S("\x00"), 0);
    expect_char(S("\x7f"), 0x7f);
    expect_char(S("\xc2\x80"), 0x80);
    expect_char(S("\xdf\xbf"), 0x7ff);
    expect_char(S("\xe0\xa0\x80"), 0x800);
    expect_char(S("\xef\xbf\xbf"), 0xffff);
    expect_char(S("\xed\x9f\xbf"), 0xd7ff); /* just below the surrogates */
    expect_char(S("\xee\x80\x80"), 0xe000); /* just above them */
    expect_char(S("\xef\xbf\xbd"), 0xfffd);
    expect_char(S("\xf0\x90\x80\x80"), 0x10000);
    expect_char(S("\xf4\x8f\xbf\xbf"), 0x10ffff); /* the largest code point */
    expect_char(S("\xf0\x9f\x98\x80"), 0x1f600);
    assert_true(ig_utf8_valid(S("")));
    assert_true(ig_utf8_valid(S("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80")));
    assert_int_equal(ig_utf8_decode("", 0, NULL), 0);
}

static void test_beyond_max(void **state)
{
    expect_bad(S("\xf4\x90\x80\x80"), 0);         /* U+110000 */
    expect_bad(S("\xf7\xbf\xbf\xbf"), 0);         /* U+1FFFFF */
    expect_bad(S("\xf8\x88\x80\x80\x80"), 0);     /* old 5-byte form */
    expect_bad(S("\xfc\x84\x80\x80\x80\x80"), 0); /* old 6-byte form */
    expect_bad(S("\xfe"), 0);
    expect_bad(S("\xff"), 0);
}

static void test_overlongs(void **state)
{
    expect_bad(S("\xc0\xaf"), 0);         /* '/' in 2 bytes */
    expect_bad(S("\xe0\x80\xaf"), 0);     /* in 3 */
    expect_bad(S("\xf0\x80\x80\xaf"), 0); /* in 4 */
    expect_bad(S("\xc1\xbf"), 0);         /* largest 2-byte overlong */
    expect_bad(S("\xe0\x9f\xbf"), 0);     /* largest 3-byte overlong */
    expect_bad(S("\xf0\x8f\xbf\xbf"), 0); /* largest 4-byte overlong */
    expect_bad(S("\xc0\x80"), 0);         /* overlong NUL */
    expect_bad(S("ab\xe0\x80\x80"), 2);
}

static void test_surrogates(void **state)
{
    expect_bad(S("\xed\xa0\x80"), 0);             /* U+D800 */
    expect_bad(S("\xed\xad\xbf"), 0);             /* U+DB7F */
    expect_bad(S("\xed\xbf\xbf"), 0);             /* U+DFFF */
    expect_bad(S("\xed\xa0\x80\xed\xb0\x80"), 0); /* a CESU-8 pair */
    expect_bad(S("x\xed\xb0\x80"), 1);
}

static void test_continuations_and_truncation(void **state)
{
    expect_bad(S("\x80"), 0);
    expect_bad(S("\xbf"), 0);
    expect_bad(S("a\x80\xbf"), 1);
    expect_bad(S("\xc2"), 0);
    expect_bad(S("\xe2\x82"), 0);
    expect_bad(S("\xf0\x9f\x98"), 0);
    expect_bad(S("ok\xf0\x9f"), 2);
    expect_bad(S("\xc2 "), 0); /* lead then a space */
    expect_bad(S("\xe2\x82 "), 0);
    expect_bad(S("\xc3\xa9\xc3"), 2);

    /* The maximal subparts a decoder replaces with one U+FFFD each. */
    int tr;
    assert_int_equal(ig_utf8_invalid_len(S("\xe2\x82"), &tr), 2);
    assert_true(tr);
    assert_int_equal(ig_utf8_invalid_len(S("\xe2\x82 "), &tr), 2);
    assert_false(tr);
    assert_int_equal(ig_utf8_invalid_len(S("\xf0\x9f\x98"), &tr), 3);
    assert_true(tr);
    assert_int_equal(ig_utf8_invalid_len(S("\xe0\x80\x80"), &tr), 1); /* overlong: byte by byte */
    assert_false(tr);
    assert_int_equal(ig_utf8_invalid_len(S("\xed\xa0\x80"), &tr), 1);
    assert_int_equal(ig_utf8_invalid_len(S("\x80"), &tr), 1);
    assert_int_equal(ig_utf8_invalid_len(S("\xff"), NULL), 1);
}

static void test_incomplete_tail(void **state)
{
    assert_int_equal(ig_utf8_incomplete_tail(S("")), 0);
    assert_int_equal(ig_utf8_incomplete_tail(S("abc")), 0);
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xc3")), 1);
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xe2\x82")), 2);
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xf0\x9f\x98")), 3);
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xf0\x9f\x98\x80")), 0);
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xe2\x82\xac")), 0);
    /* Never valid, so never held back: */
    assert_int_equal(ig_utf8_incomplete_tail(S("a\x80")), 0);
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xe0\x80")), 0); /* overlong */
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xed\xa0")), 0); /* surrogate */
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xf4\x90")), 0); /* > U+10FFFF */
    assert_int_equal(ig_utf8_incomplete_tail(S("a\xf8")), 0);
    assert_int_equal(ig_utf8_incomplete_tail(S("\x80\x80\x80")), 0);
}

static void test_encode(void **state)
{
    static const uint32_t cps[] = {0,      0x41,   0x7f,   0x80,   0x7ff,   0x800,
                                   0xd7ff, 0xe000, 0xfffd, 0xffff, 0x10000, 0x10ffff};
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        char buf[4];
        uint32_t back = 0xdeadbeef;
        size_t n = ig_utf8_encode(cps[i], buf);
        assert_true(n >= 1 && n <= 4);
        assert_int_equal(ig_utf8_decode(buf, n, &back), n);
        assert_int_equal(back, cps[i]);
    }
    char buf[4];
    assert_int_equal(ig_utf8_encode(0xd800, buf), 0);
    assert_int_equal(ig_utf8_encode(0xdfff, buf), 0);
    assert_int_equal(ig_utf8_encode(0x110000, buf), 0);
}

/* Every 3-byte sequence with a 3-byte lead: decode agrees with the rule. */
static void test_exhaustive_3byte(void **state)
{
    for (unsigned a = 0xe0; a <= 0xef; a++)
        for (unsigned b = 0; b < 256; b++)
            for (unsigned c = 0; c < 256; c++) {
                char s[3] = {(char)a, (char)b, (char)c};
                uint32_t cp = 0;
                size_t n = ig_utf8_decode(s, 3, &cp);
                int ok = (b & 0xc0) == 0x80 && (c & 0xc0) == 0x80;
                uint32_t want = (a & 0x0f) << 12 | (b & 0x3f) << 6 | (c & 0x3f);
                ok = ok && want >= 0x800 && !(want >= 0xd800 && want <= 0xdfff);
                assert_int_equal(n, ok ? 3 : 0);
                if (ok)
                    assert_int_equal(cp, want);
            }
}

/* ---- against Python ------------------------------------------------------ */

#define NCASE 3000
#define MAXLEN 24

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static unsigned next_byte(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    /* Biased towards the interesting bytes: leads, continuations, edges. */
    static const unsigned char edge[] = {0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2,
                                         0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 'a'};
    unsigned r = (unsigned)(rng >> 32);
    switch (r % 4) {
    case 0:
        return edge[(r >> 8) % sizeof edge];
    case 1:
        return 0x80 | ((r >> 8) & 0x3f);
    default:
        return (r >> 8) & 0xff;
    }
}

static void hex(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", (unsigned char)s[i]);
}

static const char PY_CHECK[] = "import sys\n"
                               "for line in open(sys.argv[1]):\n"
                               "    b = bytes.fromhex(line.strip())\n"
                               "    try:\n"
                               "        b.decode('utf-8'); p = len(b)\n"
                               "    except UnicodeDecodeError as e:\n"
                               "        p = e.start\n"
                               "    r = b.decode('utf-8', 'replace').encode('utf-8')\n"
                               "    print(p, r.hex())\n";

static void test_python_random(void **state)
{
    if (system("python3 -c 'import sys' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "# SKIP: no python3\n");
        skip();
    }
    char in[] = "/tmp/ig_utf8_inXXXXXX", script[] = "/tmp/ig_utf8_pyXXXXXX";
    int fd = mkstemp(in), sfd = mkstemp(script);
    assert_true(fd >= 0 && sfd >= 0);
    assert_int_equal(write(sfd, PY_CHECK, sizeof PY_CHECK - 1), (ssize_t)(sizeof PY_CHECK - 1));
    close(sfd);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);

    static char text[NCASE][MAXLEN];
    static size_t tlen[NCASE];
    for (int i = 0; i < NCASE; i++) {
        tlen[i] = i % MAXLEN + 1;
        for (size_t k = 0; k < tlen[i]; k++)
            text[i][k] = (char)next_byte();
        hex(f, text[i], tlen[i]);
        fputc('\n', f);
    }
    fclose(f);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "python3 %s %s", script, in);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[512], want[512], got[MAXLEN * 3], gothex[MAXLEN * 6 + 1];
    int n = 0, invalid = 0;
    while (n < NCASE && fgets(line, sizeof line, p)) {
        size_t prefix;
        assert_int_equal(sscanf(line, "%zu %511s", &prefix, want), 2);
        assert_int_equal(ig_utf8_valid_prefix(text[n], tlen[n]), prefix);
        assert_int_equal(ig_utf8_valid(text[n], tlen[n]), prefix == tlen[n]);
        invalid += prefix != tlen[n];
        size_t o = ig_utf8_replace(text[n], tlen[n], got);
        for (size_t k = 0; k < o; k++)
            snprintf(gothex + 2 * k, 3, "%02x", (unsigned char)got[k]);
        gothex[2 * o] = 0;
        if (strcmp(gothex, want) != 0)
            fprintf(stderr, "case %d: python %s, ours %s\n", n, want, gothex);
        assert_string_equal(gothex, want);
        n++;
    }
    assert_int_equal(pclose(p), 0);
    unlink(in);
    unlink(script);
    assert_int_equal(n, NCASE);
    /* The table exercises both outcomes. */
    assert_true(invalid > NCASE / 4 && invalid < NCASE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundaries),
        cmocka_unit_test(test_beyond_max),
        cmocka_unit_test(test_overlongs),
        cmocka_unit_test(test_surrogates),
        cmocka_unit_test(test_continuations_and_truncation),
        cmocka_unit_test(test_incomplete_tail),
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_exhaustive_3byte),
        cmocka_unit_test(test_python_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
