/*
 * The DNS wire format of the discovery client (ig_dns_query, ig_dns_parse
 * in gateway/fleet/discover.c): the query's bytes, answers with A and AAAA
 * records behind compressed names and a CNAME, NXDOMAIN as an empty
 * answer, and what must be refused: another id, a query instead of an
 * answer, SERVFAIL, a truncated answer, labels of a reserved type or past
 * the end, records cut anywhere. (Names are skipped, never followed: a
 * compression pointer ends a name, so pointers cannot loop.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "infergate/discover.h"

static void test_query_bytes(void **state)
{
    (void)state;
    uint8_t buf[512];
    int n = ig_dns_query(buf, sizeof(buf), 0xbeef, "w.svc.local", 28);
    static const uint8_t want[] = {0xbe, 0xef, 0x01, 0x00, 0, 1,   0,   0,   0, 0,
                                   0,    0,    1,    'w',  3, 's', 'v', 'c', 5, 'l',
                                   'o',  'c',  'a',  'l',  0, 0,   28,  0,   1};
    assert_int_equal(n, (int)sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
    /* A trailing dot is the same name. */
    assert_int_equal(ig_dns_query(buf, sizeof(buf), 1, "w.svc.local.", 1), (int)sizeof(want));
    /* Empty labels, a label over 63 bytes, no room: refused. */
    assert_int_equal(ig_dns_query(buf, sizeof(buf), 1, "a..b", 1), -1);
    assert_int_equal(ig_dns_query(buf, sizeof(buf), 1, "", 1), -1);
    char longl[80];
    memset(longl, 'x', 70);
    longl[70] = '\0';
    assert_int_equal(ig_dns_query(buf, sizeof(buf), 1, longl, 1), -1);
    assert_int_equal(ig_dns_query(buf, 20, 1, "w.svc.local", 1), -1);
}

/* An answer to the query for "w.test": header, question, then records. */
static int answer(uint8_t *m, uint16_t id, uint8_t rcode, int an)
{
    static const uint8_t q[] = {1, 'w', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1};
    uint8_t h[12] = {(uint8_t)(id >> 8),
                     (uint8_t)id,
                     0x81,
                     (uint8_t)(0x80 | rcode),
                     0,
                     1,
                     0,
                     (uint8_t)an,
                     0,
                     0,
                     0,
                     0};
    memcpy(m, h, 12);
    memcpy(m + 12, q, sizeof(q));
    return 12 + (int)sizeof(q);
}

/* A record: name as the pointer to offset 12 (the question's name). */
static int record(uint8_t *m, int off, uint16_t type, const uint8_t *rdata, int rdlen)
{
    uint8_t r[12] = {0xc0, 12, (uint8_t)(type >> 8),  (uint8_t)type, 0, 1, 0, 0,
                     0,    5,  (uint8_t)(rdlen >> 8), (uint8_t)rdlen};
    memcpy(m + off, r, 12);
    memcpy(m + off + 12, rdata, (size_t)rdlen);
    return off + 12 + rdlen;
}

static void test_parse_records(void **state)
{
    (void)state;
    uint8_t m[512];
    char addrs[8][46];
    int n = 0;
    static const uint8_t a1[] = {10, 0, 0, 7}, a2[] = {127, 0, 0, 3};
    static const uint8_t a6[] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7};
    static const uint8_t cname[] = {3, 'p', 'o', 'd', 0xc0, 12}; /* pod.w.test */
    int off = answer(m, 42, 0, 4);
    off = record(m, off, 5, cname, sizeof(cname));
    off = record(m, off, 1, a1, sizeof(a1));
    off = record(m, off, 28, a6, sizeof(a6));
    off = record(m, off, 1, a2, sizeof(a2));
    assert_int_equal(ig_dns_parse(m, off, 42, addrs, 8, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(addrs[0], "10.0.0.7");
    assert_string_equal(addrs[1], "fd00::7");
    assert_string_equal(addrs[2], "127.0.0.3");

    /* At most max addresses are taken. */
    n = 0;
    assert_int_equal(ig_dns_parse(m, off, 42, addrs, 1, &n), 0);
    assert_int_equal(n, 1);

    /* An A record of the wrong length is skipped, not read. */
    static const uint8_t odd[] = {1, 2, 3};
    off = answer(m, 42, 0, 1);
    off = record(m, off, 1, odd, sizeof(odd));
    n = 0;
    assert_int_equal(ig_dns_parse(m, off, 42, addrs, 8, &n), 0);
    assert_int_equal(n, 0);
}

static void test_parse_refusals(void **state)
{
    (void)state;
    uint8_t m[512];
    char addrs[8][46];
    int n = 0;
    static const uint8_t a1[] = {10, 0, 0, 7};

    /* NXDOMAIN: an answer, the empty set. */
    int off = answer(m, 7, 3, 0);
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), 1);
    /* SERVFAIL, REFUSED: failures. */
    off = answer(m, 7, 2, 0);
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), -1);
    off = answer(m, 7, 5, 0);
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), -1);

    off = answer(m, 7, 0, 1);
    off = record(m, off, 1, a1, sizeof(a1));
    /* Another id, a query (QR clear), a truncated answer (TC). */
    assert_int_equal(ig_dns_parse(m, off, 8, addrs, 8, &n), -1);
    m[2] &= 0x7f;
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), -1);
    m[2] |= 0x80 | 0x02;
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), -1);
    m[2] &= (uint8_t)~0x02;
    n = 0;
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), 0);
    assert_int_equal(n, 1);

    /* Cut anywhere inside the record: malformed, never read past the end. */
    for (int cut = 12; cut < off; cut++) {
        n = 0;
        int rc = ig_dns_parse(m, cut, 7, addrs, 8, &n);
        assert_true(rc == -1 || n == 0);
    }
    assert_int_equal(ig_dns_parse(m, 11, 7, addrs, 8, &n), -1);

    /* More answers announced than present. */
    m[7] = 3;
    assert_int_equal(ig_dns_parse(m, off, 7, addrs, 8, &n), -1);
    m[7] = 1;

    /* A label that runs past the end, a reserved label type (0x40). */
    static const uint8_t bad_label[] = {0x07, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    int o = answer(m, 7, 0, 1);
    memcpy(m + o, bad_label, sizeof(bad_label));
    assert_int_equal(ig_dns_parse(m, o + (int)sizeof(bad_label), 7, addrs, 8, &n), -1);
    m[o] = 0x41;
    assert_int_equal(ig_dns_parse(m, o + (int)sizeof(bad_label), 7, addrs, 8, &n), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_bytes),
        cmocka_unit_test(test_parse_records),
        cmocka_unit_test(test_parse_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
