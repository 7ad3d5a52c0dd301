/*
 * The probe table tests/cases/http_probes/probes.tsv against the real
 * `infergate serve`: each raw request alone on a fresh connection must get
 * the status of the table's infergate column (Host as an RFC 3986
 * authority, bounded chunk extensions, framing). The nginx column is the
 * reference the table was checked against (tests/peers/http_probe.py sends
 * the same probes to both); docs/http.md says why they differ where they do.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"
#include "proc.h"
#include "testclient.h"

#define TABLE IG_SOURCE_DIR "/tests/cases/http_probes/probes.tsv"

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static void put(buf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = realloc(b->data, b->cap);
        assert_non_null(b->data);
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

/* {N*text} repeats text; the innermost group first, until none is left. */
static char *expand_repeats(const char *in)
{
    char *s = strdup(in);
    assert_non_null(s);
    for (;;) {
        char *open = NULL;
        for (char *p = s; *p; p++) {
            if (*p == '{')
                open = p;
            else if (*p == '}' && open != NULL)
                break;
        }
        char *star = open != NULL ? strchr(open, '*') : NULL;
        char *close = open != NULL ? strchr(open, '}') : NULL;
        if (open == NULL || star == NULL || close == NULL || star > close)
            return s;
        long n = strtol(open + 1, NULL, 10);
        buf_t b = {0};
        put(&b, s, (size_t)(open - s));
        for (long i = 0; i < n; i++)
            put(&b, star + 1, (size_t)(close - star - 1));
        put(&b, close + 1, strlen(close + 1));
        free(s);
        s = b.data;
    }
}

/* \r \n \t \\ \xHH */
static size_t unescape(const char *in, char *out)
{
    size_t n = 0;
    for (const char *p = in; *p; p++) {
        if (*p != '\\' || p[1] == '\0') {
            out[n++] = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'r':
            out[n++] = '\r';
            break;
        case 'n':
            out[n++] = '\n';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'x': {
            char hex[3] = {p[1], p[2], '\0'};
            out[n++] = (char)strtol(hex, NULL, 16);
            p += 2;
            break;
        }
        default:
            out[n++] = *p;
            break;
        }
    }
    return n;
}

static void test_probes(void **state)
{
    ig_proc_t p;
    assert_int_equal(ig_gwf_serve_empty(&p, "error"), 0);
    int port = p.port;

    FILE *fp = fopen(TABLE, "r");
    assert_non_null(fp);
    static char line[1 << 20];
    int cases = 0, failed = 0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *name = strtok(line, "\t");
        char *ours = strtok(NULL, "\t");
        char *nginx = strtok(NULL, "\t");
        char *raw = strtok(NULL, ""); /* the rest: the request may hold \t escapes only */
        assert_non_null(raw);
        char *expanded = expand_repeats(raw);
        char *req = malloc(strlen(expanded) + 1);
        size_t len = unescape(expanded, req);
        int want = atoi(ours);
        ig_tc_t *tc = ig_tc_connect(port);
        assert_non_null(tc);
        ig_tc_send(tc, req, len); /* may fail once the server answered and closed */
        ig_tc_response_t r;
        memset(&r, 0, sizeof(r));
        int got = ig_tc_read_response(tc, &r, 5000) == 0 ? r.status : 0;
        if (got != want) {
            print_error("probe %s: status %d, want %d (nginx: %s)\n", name, got, want, nginx);
            failed++;
        }
        /* a rejected request closes the connection */
        if (got >= 400 && ig_tc_wait_closed(tc, 3000) != 1) {
            print_error("probe %s: connection stays open after %d\n", name, got);
            failed++;
        }
        ig_tc_response_free(&r);
        ig_tc_close(tc);
        free(req);
        free(expanded);
        cases++;
        ig_proc_pump(&p, 0);
    }
    fclose(fp);
    fprintf(stderr, "%d probes, %d failed\n", cases, failed);
    assert_true(cases >= 50);
    assert_int_equal(failed, 0);
    kill(p.pid, SIGTERM);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 0);
    ig_proc_dispose(&p);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
