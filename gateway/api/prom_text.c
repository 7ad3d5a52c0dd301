/*
 * Prometheus text exposition, read (include/infergate/prom_text.h).
 */
#include "infergate/prom_text.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The value after a sample's name and labels: p is just past the name.
 * 0 and *v, or -1. */
static int sample_value(const char *p, const char *end, double *v)
{
    if (p < end && *p == '{') {
        int quoted = 0; /* a label value may hold '}' */
        for (p++; p < end && (quoted || *p != '}'); p++) {
            if (*p == '\\' && quoted)
                p++;
            else if (*p == '"')
                quoted = !quoted;
        }
        if (p >= end)
            return -1;
        p++;
    }
    if (p >= end || (*p != ' ' && *p != '\t'))
        return -1;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    char buf[64];
    size_t n = 0;
    while (p < end && n + 1 < sizeof(buf) && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
        buf[n++] = *p++;
    buf[n] = '\0';
    char *stop;
    *v = strtod(buf, &stop);
    return n > 0 && *stop == '\0' && !isnan(*v) ? 0 : -1;
}

int ig_prom_sum(const char *text, size_t len, const char *name, double *sum)
{
    size_t nlen = strlen(name);
    const char *p = text, *end = text + len;
    int found = 0;
    double total = 0.0;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        double v;
        if ((size_t)(line_end - p) > nlen && memcmp(p, name, nlen) == 0 &&
            sample_value(p + nlen, line_end, &v) == 0) {
            total += v;
            found++;
        }
        p = eol ? eol + 1 : end;
    }
    if (found > 0)
        *sum = total;
    return found;
}
