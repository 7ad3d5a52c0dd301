#ifndef INFERGATE_LOG_H
#define INFERGATE_LOG_H

#include <stdarg.h>

/*
 * Logging to stderr, one line per event, as text or as JSON objects.
 * The level and format are process-wide and set once at start-up.
 */
typedef enum {
    IG_LOG_DEBUG = 0,
    IG_LOG_INFO,
    IG_LOG_WARN,
    IG_LOG_ERROR,
} ig_log_level_t;

typedef enum {
    IG_LOG_TEXT = 0,
    IG_LOG_JSON,
} ig_log_format_t;

void ig_log_setup(ig_log_level_t level, ig_log_format_t format);
ig_log_level_t ig_log_level(void);
ig_log_format_t ig_log_format(void);

/* Parses "debug", "info", "warn", "error" / "text", "json". 0 or IG_EINVAL. */
int ig_log_level_parse(const char *s, ig_log_level_t *out);
int ig_log_format_parse(const char *s, ig_log_format_t *out);

/* Sets the component name printed on every line ("serve", "worker", ...). */
void ig_log_set_component(const char *name);

/* Writes one line at the given level: "TIME LEVEL component: message" as
 * text, or {"ts","level","component","msg"} as JSON. */
void ig_log(ig_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ig_logv(ig_log_level_t level, const char *fmt, va_list ap);

/* One access-log line per request. upstream may be NULL. In JSON format the
 * fields are separate keys; in text format they are key=value pairs. A
 * proxied answer also gives its timing (timed): queue_s from the request's
 * arrival to its first attempt's send, ttft_s to its first content token
 * (a whole answer: its end), upstream_ttft_s from the answering attempt's
 * send to that token. */
typedef struct {
    const char *method;
    const char *path;
    int status;
    unsigned long long bytes_in;
    unsigned long long bytes_out;
    double duration_s;
    const char *upstream;
    const char *peer;
    int timed;
    double queue_s, ttft_s, upstream_ttft_s;
} ig_access_log_t;

void ig_log_access(const ig_access_log_t *a);

#define IG_DEBUG(...)                                                                              \
    do {                                                                                           \
        if (ig_log_level() <= IG_LOG_DEBUG)                                                        \
            ig_log(IG_LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)
#define IG_INFO(...) ig_log(IG_LOG_INFO, __VA_ARGS__)
#define IG_WARN(...) ig_log(IG_LOG_WARN, __VA_ARGS__)
#define IG_ERROR(...) ig_log(IG_LOG_ERROR, __VA_ARGS__)

#endif
