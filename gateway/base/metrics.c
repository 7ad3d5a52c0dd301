/*
 * The process-wide Prometheus registry (include/infergate/metrics.h).
 *
 * One lock guards everything: updates are a hash lookup and an add, far
 * cheaper than the syscalls around them, so finer locking would buy nothing
 * measurable. It is a test-and-set lock, not a mutex: a proxied request
 * makes about twenty updates, and a mutex's lock and unlock cost more than
 * the update itself; a thread that finds it taken (by a render, the one
 * long holder) yields. Each family keeps its series in a chained hash table
 * keyed by the label values; rendering sorts families by name and series by
 * label values, so that two scrapes of the same state are byte-identical.
 */
#include "infergate/metrics.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Series per family past which new label combinations are dropped: a bug
 * that puts client input into a label must not eat the process's memory. */
#define MAX_SERIES 10000
#define MAX_BUCKETS 64

typedef enum { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind_t;

static const char *const kind_names[] = {"counter", "gauge", "histogram"};

typedef struct series_s {
    struct series_s *next; /* hash chain */
    uint64_t hash;
    char *values[IG_METRICS_MAX_LABELS];
    double value;      /* counter, gauge */
    double sum;        /* histogram */
    uint64_t count;    /* histogram: observations (the +Inf bucket) */
    uint64_t *buckets; /* histogram: per-bucket counts, not cumulative (nbounds) */
} series_t;

struct ig_metric_s {
    ig_metric_t *next; /* registry list */
    char *name;
    char *help;
    kind_t kind;
    int nlabels;
    char *labels[IG_METRICS_MAX_LABELS];
    double *bounds; /* histogram upper bounds, ascending */
    size_t nbounds;
    double (*fn)(void *data);       /* gauge read at render time */
    ig_metrics_collect_fn *collect; /* labelled gauge read at render time */
    void *source;                   /* fn's or collect's data */
    int detached;                   /* the source is gone: no samples */
    series_t **table;
    size_t tsize;
    size_t nseries;
    series_t *last; /* the series updated last: a request updates the same
                       upstream's and model's series again and again */
};

static atomic_flag lock = ATOMIC_FLAG_INIT;

static void lock_take(void)
{
    while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire))
        sched_yield();
}

static void lock_give(void)
{
    atomic_flag_clear_explicit(&lock, memory_order_release);
}
static ig_metric_t *families;

/* 1 ms to 60 s: from a cached health check to a long generation. */
static const double default_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5,   1,      2.5,   5,    10,    30,   60};

/* ---- registration ------------------------------------------------------- */

static int valid_name(const char *s, int label)
{
    if (s == NULL || s[0] == '\0' || (s[0] >= '0' && s[0] <= '9'))
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || (!label && c == ':');
        if (!ok)
            return 0;
    }
    /* Label names starting with __ are reserved for Prometheus itself. */
    return !(label && s[0] == '_' && s[1] == '_');
}

/* Splits "a, b" into trimmed names; -1 when malformed or too many. */
static int split_labels(const char *list, char out[][64])
{
    int n = 0;
    const char *p = list;
    if (list == NULL || list[0] == '\0')
        return 0;
    for (;;) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        if (n == IG_METRICS_MAX_LABELS || len == 0 || len >= 64)
            return -1;
        memcpy(out[n], p, len);
        out[n][len] = '\0';
        if (!valid_name(out[n], 1))
            return -1;
        for (int i = 0; i < n; i++) {
            if (strcmp(out[i], out[n]) == 0)
                return -1;
        }
        n++;
        p += len;
        while (*p == ' ')
            p++;
        if (*p == '\0')
            return n;
        if (*p != ',')
            return -1;
        p++;
    }
}

static ig_metric_t *find_family(const char *name)
{
    for (ig_metric_t *m = families; m != NULL; m = m->next) {
        if (strcmp(m->name, name) == 0)
            return m;
    }
    return NULL;
}

static void free_series(series_t *s, int nlabels)
{
    for (int i = 0; i < nlabels; i++)
        free(s->values[i]);
    free(s->buckets);
    free(s);
}

static void free_family(ig_metric_t *m)
{
    for (size_t i = 0; i < m->tsize; i++) {
        series_t *s = m->table[i];
        while (s != NULL) {
            series_t *next = s->next;
            free_series(s, m->nlabels);
            s = next;
        }
    }
    free(m->table);
    for (int i = 0; i < m->nlabels; i++)
        free(m->labels[i]);
    free(m->bounds);
    free(m->name);
    free(m->help);
    free(m);
}

static ig_metric_t *family(kind_t kind, const char *name, const char *help, const char *label_names,
                           const double *bounds, size_t nbounds)
{
    char labels[IG_METRICS_MAX_LABELS][64];
    int nlabels = split_labels(label_names, labels);
    ig_metric_t *m = NULL;
    if (!valid_name(name, 0) || nlabels < 0 || nbounds > MAX_BUCKETS)
        return NULL;
    for (int i = 0; i < nlabels; i++) {
        if (kind == KIND_HISTOGRAM && strcmp(labels[i], "le") == 0)
            return NULL; /* le is the bucket label */
    }
    for (size_t i = 0; i < nbounds; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return NULL;
    }

    lock_take();
    m = find_family(name);
    if (m != NULL) {
        int same = m->kind == kind && m->nlabels == nlabels && m->fn == NULL && m->collect == NULL;
        for (int i = 0; same && i < nlabels; i++)
            same = strcmp(m->labels[i], labels[i]) == 0;
        lock_give();
        return same ? m : NULL;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL)
        goto fail;
    m->kind = kind;
    m->name = strdup(name);
    m->help = strdup(help ? help : "");
    m->tsize = 16;
    m->table = calloc(m->tsize, sizeof(*m->table));
    if (m->name == NULL || m->help == NULL || m->table == NULL)
        goto fail;
    for (int i = 0; i < nlabels; i++) {
        m->labels[i] = strdup(labels[i]);
        m->nlabels = i + 1;
        if (m->labels[i] == NULL)
            goto fail;
    }
    if (kind == KIND_HISTOGRAM && nbounds > 0) {
        m->bounds = malloc(nbounds * sizeof(double));
        if (m->bounds == NULL)
            goto fail;
        memcpy(m->bounds, bounds, nbounds * sizeof(double));
        m->nbounds = nbounds;
    }
    m->next = families;
    families = m;
    lock_give();
    return m;
fail:
    lock_give();
    if (m != NULL)
        free_family(m);
    return NULL;
}

ig_metric_t *ig_metrics_counter(const char *name, const char *help, const char *label_names)
{
    return family(KIND_COUNTER, name, help, label_names, NULL, 0);
}

ig_metric_t *ig_metrics_gauge(const char *name, const char *help, const char *label_names)
{
    return family(KIND_GAUGE, name, help, label_names, NULL, 0);
}

ig_metric_t *ig_metrics_histogram(const char *name, const char *help, const char *label_names,
                                  const double *buckets, size_t nbuckets)
{
    if (buckets == NULL) {
        buckets = default_buckets;
        nbuckets = sizeof(default_buckets) / sizeof(default_buckets[0]);
    }
    return family(KIND_HISTOGRAM, name, help, label_names, buckets, nbuckets);
}

/* Points the source family `name` at fn or collect over data, registered
 * first when new. Registered again (a restarted component), it moves to
 * the new source; a plain family of that name keeps its own values. */
static void attach_source(const char *name, const char *help, const char *label_names,
                          double (*fn)(void *data), ig_metrics_collect_fn *collect, void *data)
{
    lock_take();
    ig_metric_t *m = find_family(name);
    lock_give();
    int fresh = m == NULL;
    if (fresh && (m = family(KIND_GAUGE, name, help, label_names, NULL, 0)) == NULL)
        return;
    lock_take();
    if (fresh || m->fn != NULL || m->collect != NULL) {
        m->fn = fn;
        m->collect = collect;
        m->source = data;
        m->detached = 0;
    }
    lock_give();
}

void ig_metrics_gauge_fn(const char *name, const char *help, double (*fn)(void *data), void *data)
{
    attach_source(name, help, NULL, fn, NULL, data);
}

void ig_metrics_gauge_collect(const char *name, const char *help, const char *label_names,
                              ig_metrics_collect_fn *collect, void *data)
{
    attach_source(name, help, label_names, NULL, collect, data);
}

void ig_metrics_detach(const void *data)
{
    lock_take();
    for (ig_metric_t *m = families; m != NULL; m = m->next) {
        if ((m->fn != NULL || m->collect != NULL) && m->source == data)
            m->detached = 1;
    }
    lock_give();
}

/* ---- updates ------------------------------------------------------------ */

static uint64_t hash_values(const char *const *values, int n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < n; i++) {
        for (const unsigned char *p = (const unsigned char *)values[i]; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull; /* separator: ("ab","c") != ("a","bc") */
    }
    return h;
}

static void grow(ig_metric_t *m)
{
    size_t nsize = m->tsize * 2;
    series_t **nt = calloc(nsize, sizeof(*nt));
    if (nt == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < m->tsize; i++) {
        series_t *s = m->table[i];
        while (s != NULL) {
            series_t *next = s->next;
            s->next = nt[s->hash & (nsize - 1)];
            nt[s->hash & (nsize - 1)] = s;
            s = next;
        }
    }
    free(m->table);
    m->table = nt;
    m->tsize = nsize;
}

/* The series for these label values, created on first use; NULL when out
 * of memory or over MAX_SERIES. Called with the lock held. */
static series_t *lookup_hashed(ig_metric_t *m, const char *const *values)
{
    uint64_t h = hash_values(values, m->nlabels);
    for (series_t *s = m->table[h & (m->tsize - 1)]; s != NULL; s = s->next) {
        int same = s->hash == h;
        for (int i = 0; same && i < m->nlabels; i++)
            same = strcmp(s->values[i], values[i]) == 0;
        if (same)
            return s;
    }
    if (m->nseries >= MAX_SERIES)
        return NULL;
    series_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->hash = h;
    for (int i = 0; i < m->nlabels; i++) {
        s->values[i] = strdup(values[i]);
        if (s->values[i] == NULL)
            goto fail;
    }
    if (m->kind == KIND_HISTOGRAM && m->nbounds > 0) {
        s->buckets = calloc(m->nbounds, sizeof(uint64_t));
        if (s->buckets == NULL)
            goto fail;
    }
    if (m->nseries + 1 > m->tsize * 2)
        grow(m);
    s->next = m->table[h & (m->tsize - 1)];
    m->table[h & (m->tsize - 1)] = s;
    m->nseries++;
    return s;
fail:
    free_series(s, m->nlabels);
    return NULL;
}

/* lookup_hashed, the last series first. */
static series_t *lookup(ig_metric_t *m, const char *const *values)
{
    int same = m->last != NULL;
    for (int i = 0; same && i < m->nlabels; i++)
        same = strcmp(m->last->values[i], values[i]) == 0;
    if (same)
        return m->last;
    m->last = lookup_hashed(m, values);
    return m->last;
}

typedef enum { OP_ADD, OP_SET, OP_OBSERVE } op_t;

static void update(ig_metric_t *m, op_t op, double v, va_list ap)
{
    const char *values[IG_METRICS_MAX_LABELS];
    if (m == NULL || isnan(v))
        return;
    if ((op == OP_ADD && m->kind == KIND_HISTOGRAM) ||
        (op == OP_ADD && m->kind == KIND_COUNTER && v < 0) ||
        (op == OP_SET && m->kind != KIND_GAUGE) || (op == OP_OBSERVE && m->kind != KIND_HISTOGRAM))
        return; /* a misuse, not worth a crash: the sample is dropped */
    for (int i = 0; i < m->nlabels; i++) {
        values[i] = va_arg(ap, const char *);
        if (values[i] == NULL)
            values[i] = "";
    }
    lock_take();
    series_t *s = m->fn == NULL && m->collect == NULL ? lookup(m, values) : NULL;
    if (s != NULL) {
        if (op == OP_ADD)
            s->value += v;
        else if (op == OP_SET)
            s->value = v;
        else {
            /* Non-cumulative here; render accumulates. The first bound >= v. */
            size_t lo = 0, hi = m->nbounds;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (m->bounds[mid] < v)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < m->nbounds)
                s->buckets[lo]++;
            s->count++;
            s->sum += v;
        }
    }
    lock_give();
}

void ig_metric_add(ig_metric_t *m, double v, ...)
{
    va_list ap;
    va_start(ap, v);
    update(m, OP_ADD, v, ap);
    va_end(ap);
}

void ig_metric_set(ig_metric_t *m, double v, ...)
{
    va_list ap;
    va_start(ap, v);
    update(m, OP_SET, v, ap);
    va_end(ap);
}

void ig_metric_observe(ig_metric_t *m, double v, ...)
{
    va_list ap;
    va_start(ap, v);
    update(m, OP_OBSERVE, v, ap);
    va_end(ap);
}

/* ---- rendering ---------------------------------------------------------- */

/* HELP text escapes \ and newline; label values also escape ". */
void ig_metrics_put_escaped(ig_strbuf_t *b, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            ig_strbuf_put(b, "\\\\", 2);
        else if (*s == '\n')
            ig_strbuf_put(b, "\\n", 2);
        else if (quote && *s == '"')
            ig_strbuf_put(b, "\\\"", 2);
        else
            ig_strbuf_put(b, s, 1);
    }
}

/* The shortest text that reads back as the same double. */
static void format_double(char *out, size_t size, double v)
{
    if (isnan(v))
        snprintf(out, size, "NaN");
    else if (isinf(v))
        snprintf(out, size, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        snprintf(out, size, "%.0f", v);
    else {
        snprintf(out, size, "%.15g", v);
        if (strtod(out, NULL) != v)
            snprintf(out, size, "%.17g", v);
    }
}

static void sb_double(ig_strbuf_t *b, double v)
{
    char num[40];
    format_double(num, sizeof(num), v);
    ig_strbuf_puts(b, num);
}

/* name{a="x",b="y",le="0.1"} value */
static void sample(ig_strbuf_t *b, const ig_metric_t *m, const char *suffix, const series_t *s,
                   const char *le, double v)
{
    ig_strbuf_puts(b, m->name);
    ig_strbuf_puts(b, suffix);
    if (m->nlabels > 0 || le != NULL) {
        ig_strbuf_put(b, "{", 1);
        for (int i = 0; i < m->nlabels; i++) {
            if (i > 0)
                ig_strbuf_put(b, ",", 1);
            ig_strbuf_puts(b, m->labels[i]);
            ig_strbuf_put(b, "=\"", 2);
            ig_metrics_put_escaped(b, s ? s->values[i] : "", 1);
            ig_strbuf_put(b, "\"", 1);
        }
        if (le != NULL) {
            if (m->nlabels > 0)
                ig_strbuf_put(b, ",", 1);
            ig_strbuf_puts(b, "le=\"");
            ig_strbuf_puts(b, le);
            ig_strbuf_put(b, "\"", 1);
        }
        ig_strbuf_put(b, "}", 1);
    }
    ig_strbuf_put(b, " ", 1);
    sb_double(b, v);
    ig_strbuf_put(b, "\n", 1);
}

static void render_series(ig_strbuf_t *b, const ig_metric_t *m, const series_t *s)
{
    if (m->kind != KIND_HISTOGRAM) {
        sample(b, m, "", s, NULL, s ? s->value : 0);
        return;
    }
    uint64_t cum = 0;
    char le[40];
    for (size_t i = 0; i < m->nbounds; i++) {
        cum += s ? s->buckets[i] : 0;
        format_double(le, sizeof(le), m->bounds[i]);
        sample(b, m, "_bucket", s, le, (double)cum);
    }
    sample(b, m, "_bucket", s, "+Inf", s ? (double)s->count : 0);
    sample(b, m, "_sum", s, NULL, s ? s->sum : 0);
    sample(b, m, "_count", s, NULL, s ? (double)s->count : 0);
}

/* A collected family's render: its samples, as its source emits them. */
typedef struct {
    ig_strbuf_t *b;
    const ig_metric_t *m;
} collected_t;

static void emit_collected(void *ctx, const char *const *values, double v)
{
    collected_t *c = ctx;
    series_t s = {0};
    for (int i = 0; i < c->m->nlabels; i++)
        s.values[i] = (char *)(values[i] != NULL ? values[i] : "");
    sample(c->b, c->m, "", &s, NULL, v);
}

static int nlabels_for_sort;

static int cmp_series(const void *a, const void *b)
{
    const series_t *x = *(const series_t *const *)a, *y = *(const series_t *const *)b;
    for (int i = 0; i < nlabels_for_sort; i++) {
        int c = strcmp(x->values[i], y->values[i]);
        if (c != 0)
            return c;
    }
    return 0;
}

static int cmp_family(const void *a, const void *b)
{
    return strcmp((*(ig_metric_t *const *)a)->name, (*(ig_metric_t *const *)b)->name);
}

static void render_family(ig_strbuf_t *b, ig_metric_t *m)
{
    ig_strbuf_puts(b, "# HELP ");
    ig_strbuf_puts(b, m->name);
    ig_strbuf_put(b, " ", 1);
    ig_metrics_put_escaped(b, m->help, 0);
    ig_strbuf_puts(b, "\n# TYPE ");
    ig_strbuf_puts(b, m->name);
    ig_strbuf_put(b, " ", 1);
    ig_strbuf_puts(b, kind_names[m->kind]);
    ig_strbuf_put(b, "\n", 1);
    if (m->fn != NULL || m->collect != NULL) {
        collected_t c = {b, m};
        if (!m->detached && m->fn != NULL)
            sample(b, m, "", NULL, NULL, m->fn(m->source));
        else if (!m->detached)
            m->collect(m->source, emit_collected, &c);
        return;
    }
    /* A family without labels always has its one series, zero until used. */
    if (m->nseries == 0) {
        if (m->nlabels == 0)
            render_series(b, m, NULL);
        return;
    }
    series_t **all = malloc(m->nseries * sizeof(*all));
    if (all == NULL) {
        b->oom = 1;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < m->tsize; i++) {
        for (series_t *s = m->table[i]; s != NULL; s = s->next)
            all[n++] = s;
    }
    nlabels_for_sort = m->nlabels; /* qsort has no context; the lock makes this safe */
    qsort(all, n, sizeof(*all), cmp_series);
    for (size_t i = 0; i < n; i++)
        render_series(b, m, all[i]);
    free(all);
}

char *ig_metrics_render(size_t *len)
{
    ig_strbuf_t b = {0};
    ig_metric_t **sorted = NULL;
    size_t n = 0;
    lock_take();
    for (ig_metric_t *m = families; m != NULL; m = m->next)
        n++;
    if (n > 0) {
        sorted = malloc(n * sizeof(*sorted));
        if (sorted == NULL)
            b.oom = 1;
    }
    if (sorted != NULL) {
        size_t i = 0;
        for (ig_metric_t *m = families; m != NULL; m = m->next)
            sorted[i++] = m;
        qsort(sorted, n, sizeof(*sorted), cmp_family);
        for (i = 0; i < n; i++)
            render_family(&b, sorted[i]);
    }
    lock_give();
    free(sorted);
    ig_strbuf_put(&b, "", 0); /* an empty registry still renders "" */
    if (b.oom || b.buf == NULL) {
        free(b.buf);
        return NULL;
    }
    if (len != NULL)
        *len = b.len;
    return b.buf;
}

void ig_metrics_reset(void)
{
    lock_take();
    ig_metric_t *m = families;
    families = NULL;
    lock_give();
    while (m != NULL) {
        ig_metric_t *next = m->next;
        free_family(m);
        m = next;
    }
}
