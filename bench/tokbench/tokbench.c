/* tokbench: encodes a corpus with one tokenizer and reports the speed.
 *
 *   build/tokbench [--repeat N] [--ids OUT] TOKENIZER_DIR CORPUS.jsonl
 *
 * CORPUS.jsonl holds one JSON string per line (bench/lib/tokcorpus.py writes
 * it). Each text is encoded with ig_tokenizer_encode(), no BOS, on one
 * thread; the best of N passes is reported as one JSON line
 * {"texts", "bytes", "tokens", "seconds", "load_seconds"}. --ids writes the
 * ids of an untimed pass, one line of space-separated ids per text, the
 * format of bench/lib/tokpeer.js, so the two can be compared with cmp. */

#include "infergate/error.h"
#include "infergate/tokenizer.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    char *p;
    size_t len;
} text_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int usage(void)
{
    fprintf(stderr, "usage: tokbench [--repeat N] [--ids OUT] TOKENIZER_DIR CORPUS.jsonl\n");
    return 2;
}

static int read_corpus(const char *path, text_t **out, size_t *n)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0, count = 0, room = 0;
    ssize_t got;
    text_t *t = NULL;
    if (!f) {
        perror(path);
        return -1;
    }
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *s = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!json_is_string(s)) {
            fprintf(stderr, "%s:%zu: expected a JSON string\n", path, count + 1);
            json_decref(s);
            goto fail;
        }
        if (count == room) {
            text_t *nt = realloc(t, (room = room ? room * 2 : 1024) * sizeof *t);
            if (!nt) {
                json_decref(s);
                goto fail;
            }
            t = nt;
        }
        t[count].len = json_string_length(s);
        if (!(t[count].p = malloc(t[count].len + 1))) {
            json_decref(s);
            goto fail;
        }
        memcpy(t[count].p, json_string_value(s), t[count].len + 1);
        count++;
        json_decref(s);
    }
    free(line);
    fclose(f);
    *out = t;
    *n = count;
    return 0;
fail:
    for (size_t i = 0; i < count; i++)
        free(t[i].p);
    free(t);
    free(line);
    fclose(f);
    return -1;
}

/* Encodes each text in turn; with ids, writes each one's ids as a line of
 * space-separated numbers. 0 and the total count in *tokens, or -1 after
 * the message. */
static int encode_all(ig_tokenizer_t *tok, const text_t *texts, size_t n, FILE *ids, size_t *tokens)
{
    ig_tokvec_t v = {0};
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        v.len = 0;
        if (ig_tokenizer_encode(tok, texts[i].p, texts[i].len, 0, &v) != 0) {
            fprintf(stderr, "tokbench: text %zu: encode failed\n", i + 1);
            ig_tokvec_dispose(&v);
            return -1;
        }
        count += v.len;
        for (size_t k = 0; ids && k < v.len; k++)
            fprintf(ids, k ? " %d" : "%d", (int)v.ids[k]);
        if (ids)
            fputc('\n', ids);
    }
    ig_tokvec_dispose(&v);
    *tokens = count;
    return 0;
}

int main(int argc, char **argv)
{
    const char *ids_path = NULL, *dir, *corpus;
    int repeat = 1, ai = 1, rc = 1;
    char err[512];
    ig_tokenizer_t *tok = NULL;
    text_t *texts = NULL;
    size_t n = 0, bytes = 0, tokens = 0;
    double t0, load_s, best = 1e300;
    FILE *ids = NULL;

    for (; ai < argc && argv[ai][0] == '-'; ai++) {
        if (strcmp(argv[ai], "--help") == 0) {
            printf("usage: tokbench [--repeat N] [--ids OUT] TOKENIZER_DIR CORPUS.jsonl\n");
            return 0;
        }
        if (strcmp(argv[ai], "--repeat") == 0 && ai + 1 < argc)
            repeat = atoi(argv[++ai]);
        else if (strcmp(argv[ai], "--ids") == 0 && ai + 1 < argc)
            ids_path = argv[++ai];
        else
            return usage();
    }
    if (argc - ai != 2 || repeat < 1)
        return usage();
    dir = argv[ai];
    corpus = argv[ai + 1];

    t0 = now_s();
    if (ig_tokenizer_load(dir, &tok, err, sizeof err) != 0) {
        fprintf(stderr, "tokbench: %s\n", err);
        return 1;
    }
    load_s = now_s() - t0;
    if (read_corpus(corpus, &texts, &n) != 0)
        goto out;
    if (ids_path && !(ids = fopen(ids_path, "w"))) {
        perror(ids_path);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        bytes += texts[i].len;

    if (ids && encode_all(tok, texts, n, ids, &tokens) != 0) /* an untimed pass */
        goto out;
    for (int r = 0; r < repeat; r++) {
        double dt;
        t0 = now_s();
        if (encode_all(tok, texts, n, NULL, &tokens) != 0)
            goto out;
        dt = now_s() - t0;
        if (dt < best)
            best = dt;
    }
    printf("{\"texts\":%zu,\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"load_seconds\":%.3f}\n",
           n, bytes, tokens, best, load_s);
    rc = 0;
out:
    if (ids)
        fclose(ids);
    for (size_t i = 0; i < n; i++)
        free(texts[i].p);
    free(texts);
    ig_tokenizer_free(tok);
    return rc;
}
