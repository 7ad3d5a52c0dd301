#include "infergate/log.h"
#include "infergate/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static ig_log_level_t log_level = IG_LOG_INFO;
static ig_log_format_t log_format = IG_LOG_TEXT;
static const char *log_component = "infergate";

static const char *level_names[] = {"debug", "info", "warn", "error"};

void ig_log_setup(ig_log_level_t level, ig_log_format_t format)
{
    log_level = level;
    log_format = format;
}

ig_log_level_t ig_log_level(void)
{
    return log_level;
}

ig_log_format_t ig_log_format(void)
{
    return log_format;
}

void ig_log_set_component(const char *name)
{
    log_component = name;
}

int ig_log_level_parse(const char *s, ig_log_level_t *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (ig_log_level_t)i;
            return 0;
        }
    }
    return IG_EINVAL;
}

int ig_log_format_parse(const char *s, ig_log_format_t *out)
{
    if (strcmp(s, "text") == 0)
        *out = IG_LOG_TEXT;
    else if (strcmp(s, "json") == 0)
        *out = IG_LOG_JSON;
    else
        return IG_EINVAL;
    return 0;
}

/* ISO-8601 UTC timestamp with milliseconds. */
static void format_time(char *buf, size_t size)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%03dZ", (int)(tv.tv_usec / 1000));
}

/* Emits a JSON object as one line; steals obj. */
static void emit_json(json_t *obj)
{
    char *line = json_dumps(obj, JSON_COMPACT);
    if (line != NULL) {
        fprintf(stderr, "%s\n", line);
        free(line);
    }
    json_decref(obj);
}

void ig_logv(ig_log_level_t level, const char *fmt, va_list ap)
{
    if (level < log_level)
        return;
    char ts[40];
    char msg[2048];
    format_time(ts, sizeof(ts));
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (log_format == IG_LOG_JSON) {
        emit_json(json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", level_names[level],
                            "component", log_component, "msg", msg));
    } else {
        fprintf(stderr, "%s %-5s %s: %s\n", ts, level_names[level], log_component, msg);
    }
}

void ig_log(ig_log_level_t level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ig_logv(level, fmt, ap);
    va_end(ap);
}

void ig_log_access(const ig_access_log_t *a)
{
    if (log_level > IG_LOG_INFO)
        return;
    char ts[40];
    format_time(ts, sizeof(ts));
    if (log_format == IG_LOG_JSON) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:I, s:f}", "ts", ts, "level",
                              "info", "component", log_component, "method", a->method, "path",
                              a->path, "status", a->status, "bytes_in", (json_int_t)a->bytes_in,
                              "bytes_out", (json_int_t)a->bytes_out, "duration_s", a->duration_s);
        if (o == NULL)
            return;
        if (a->upstream != NULL)
            json_object_set_new(o, "upstream", json_string(a->upstream));
        if (a->peer != NULL)
            json_object_set_new(o, "peer", json_string(a->peer));
        if (a->timed) {
            json_object_set_new(o, "queue_s", json_real(a->queue_s));
            json_object_set_new(o, "ttft_s", json_real(a->ttft_s));
            json_object_set_new(o, "upstream_ttft_s", json_real(a->upstream_ttft_s));
        }
        emit_json(o);
    } else {
        char timing[96] = "";
        if (a->timed)
            snprintf(timing, sizeof(timing), " queue=%.6fs ttft=%.6fs upstream_ttft=%.6fs",
                     a->queue_s, a->ttft_s, a->upstream_ttft_s);
        fprintf(stderr,
                "%s info  %s: %s %s status=%d bytes_in=%llu bytes_out=%llu duration=%.6fs"
                "%s%s%s%s%s\n",
                ts, log_component, a->method, a->path, a->status, a->bytes_in, a->bytes_out,
                a->duration_s, a->upstream ? " upstream=" : "", a->upstream ? a->upstream : "",
                a->peer ? " peer=" : "", a->peer ? a->peer : "", timing);
    }
}
