/*
 * The region's token meter (route/usage.c) on SSE bytes split at every
 * possible place, with LF and CRLF line ends: the same tokens, the same
 * number of ITL gaps, usage preferred over counted events, and a whole
 * answer's usage read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infergate/metrics.h"
#include "infergate/usage.h"

static double metric(const char *series)
{
    size_t len;
    char *text = ig_metrics_render(&len);
    assert_non_null(text);
    double v = -1;
    size_t sl = strlen(series);
    for (char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, series, sl) == 0)
            v = strtod(p + sl, NULL);
    }
    free(text);
    return v;
}

static const char *const lf_stream =
    "data: {\"choices\":[{\"index\":0,\"text\":\"Once\"}]}\n\n"
    ": a comment\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\" upon\"}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" a\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
    "data: [DONE]\n\n";

/* Feeds text in two pieces split at cut, at times 1 s apart per piece. */
static void feed(const ig_usage_families_t *f, const char *model, const char *text, size_t cut,
                 int prompt_estimate)
{
    ig_usage_meter_t m;
    ig_usage_init(&m);
    size_t n = strlen(text);
    ig_usage_stream(&m, f, model, text, cut, 1000000000ull);
    ig_usage_stream(&m, f, model, text + cut, n - cut, 2000000000ull);
    ig_usage_end(&m, f, model, prompt_estimate);
}

/* The index of the last byte of the first blank line ("\n" or "\r\n")
 * after position from. */
static size_t event_end(const char *text, ptrdiff_t from)
{
    size_t ls = (size_t)from;
    for (size_t i = (size_t)from; text[i]; i++) {
        if (text[i] != '\n')
            continue;
        size_t line = i - ls;
        if (ls > (size_t)from && (line == 0 || (line == 1 && text[ls] == '\r')))
            return i;
        ls = i + 1;
    }
    return strlen(text);
}

static char *crlf(const char *s)
{
    char *out = malloc(strlen(s) * 2 + 1);
    char *o = out;
    for (; *s; s++) {
        if (*s == '\n')
            *o++ = '\r';
        *o++ = *s;
    }
    *o = '\0';
    return out;
}

static void check_every_split(const char *text, const char *model)
{
    ig_usage_families_t f;
    ig_usage_families_register(&f);
    char gen[128], itl[128], prompt[128];
    snprintf(gen, sizeof(gen), "infergate_generation_tokens_total{model=\"%s\"} ", model);
    snprintf(itl, sizeof(itl), "infergate_inter_token_latency_seconds_count{model=\"%s\"} ", model);
    snprintf(prompt, sizeof(prompt), "infergate_prompt_tokens_total{model=\"%s\"} ", model);
    char sum[128];
    snprintf(sum, sizeof(sum), "infergate_inter_token_latency_seconds_sum{model=\"%s\"} ", model);
    /* An event counts when the last byte of its blank line arrives. */
    size_t fe = event_end(text, strstr(text, "Once") - text);
    size_t le = event_end(text, strstr(text, "\" a\"") - text);
    size_t n = strlen(text);
    for (size_t cut = 0; cut <= n; cut++) {
        double g0 = metric(gen), i0 = metric(itl), p0 = metric(prompt), s0 = metric(sum);
        feed(&f, model, text, cut, 7);
        double g1 = metric(gen), i1 = metric(itl), p1 = metric(prompt), s1 = metric(sum);
        /* Piece one arrives at 1 s, piece two at 2 s. */
        double want = (le < cut ? 1 : 2) - (fe < cut ? 1 : 2);
        if (g1 - (g0 < 0 ? 0 : g0) != 3 || i1 - (i0 < 0 ? 0 : i0) != 2 ||
            p1 - (p0 < 0 ? 0 : p0) != 7 || s1 - (s0 < 0 ? 0 : s0) != want)
            fail_msg("split at %zu: %g tokens, %g gaps (%g s, want %g), %g prompt", cut, g1 - g0,
                     i1 - i0, s1 - s0, want, p1 - p0);
    }
}

static void test_lf_every_split(void **state)
{
    (void)state;
    check_every_split(lf_stream, "lf");
}

static void test_crlf_every_split(void **state)
{
    (void)state;
    char *s = crlf(lf_stream);
    check_every_split(s, "crlf");
    free(s);
}

static void test_usage_wins_over_events(void **state)
{
    (void)state;
    ig_usage_families_t f;
    ig_usage_families_register(&f);
    const char *s = "data: {\"choices\":[{\"index\":0,\"text\":\"ab\"}]}\n\n"
                    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,"
                    "\"completion_tokens\":5,\"total_tokens\":16}}\n\n"
                    "data: [DONE]\n\n";
    feed(&f, "u", s, 10, 2);
    assert_true(metric("infergate_generation_tokens_total{model=\"u\"} ") == 5);
    assert_true(metric("infergate_prompt_tokens_total{model=\"u\"} ") == 11);
}

static void test_whole_answer(void **state)
{
    (void)state;
    ig_usage_families_t f;
    ig_usage_families_register(&f);
    const char *body = "{\"object\":\"text_completion\",\"choices\":[{\"text\":\"x\"}],"
                       "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":9}}";
    ig_usage_meter_t m;
    ig_usage_init(&m);
    ig_usage_body(&m, body, strlen(body));
    ig_usage_end(&m, &f, "w", 100);
    assert_true(metric("infergate_generation_tokens_total{model=\"w\"} ") == 9);
    assert_true(metric("infergate_prompt_tokens_total{model=\"w\"} ") == 4);
    /* An error answer (no usage) counts nothing, not the estimate. */
    ig_usage_init(&m);
    ig_usage_body(&m, "{\"error\":{}}", 12);
    ig_usage_end(&m, &f, "w", 100);
    assert_true(metric("infergate_prompt_tokens_total{model=\"w\"} ") == 4);
}

/* The usage object of a whole answer is found without parsing the rest:
 * an escaped "usage" inside a string is not it, a Responses answer names
 * its counts input/output_tokens, and an embeddings answer has no
 * completion. */
static void test_whole_answer_shapes(void **state)
{
    (void)state;
    ig_usage_families_t f;
    ig_usage_families_register(&f);
    static const struct {
        const char *body;
        long long prompt, completion;
    } cases[] = {
        {"{\"choices\":[{\"text\":\"say \\\"usage\\\":{\\\"prompt_tokens\\\":99}\"}],"
         "\"usage\" : {\"prompt_tokens\":3,\"completion_tokens\":5,"
         "\"prompt_tokens_details\":{\"cached_tokens\":1}}}",
         3, 5},
        {"{\"choices\":[{\"text\":\"no usage here \\\"usage\\\":{\\\"prompt_tokens\\\":7}\"}]}", -1,
         -1},
        {"{\"object\":\"response\",\"output\":[],\"usage\":{\"input_tokens\":6,"
         "\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":0}}}",
         6, 3},
        {"{\"data\":[{\"embedding\":[0.5]}],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":12}}", 12,
         -1},
        {"{\"usage\":", -1, -1},
        {"\"usage\"", -1, -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_usage_meter_t m;
        ig_usage_init(&m);
        ig_usage_body(&m, cases[i].body, strlen(cases[i].body));
        print_message("%s -> %lld %lld\n", cases[i].body, m.prompt, m.completion);
        assert_true(m.prompt == cases[i].prompt);
        assert_true(m.completion == cases[i].completion);
        ig_usage_end(&m, &f, "shapes", 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lf_every_split),
        cmocka_unit_test(test_crlf_every_split),
        cmocka_unit_test(test_usage_wins_over_events),
        cmocka_unit_test(test_whole_answer),
        cmocka_unit_test(test_whole_answer_shapes),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ig_metrics_reset();
    return rc;
}
