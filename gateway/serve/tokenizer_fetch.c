/*
 * A model's tokenizer from its workers, for a gateway without the model
 * files (docs/routing.md, "Text prompts without model files"): when an
 * instance of a pool whose model has no path is ready, the gateway asks it
 * for GET /v1/tokenizer/{tokenizer.json, tokenizer_config.json,
 * generation_config.json}, writes them under its run directory and loads
 * them on libuv's thread pool, so that text prompts are hashed as the
 * workers cache them. One fetch at a time; a model whose worker serves no
 * tokenizer (a GGUF model: 404), or one that does not load, is left to
 * token-id prompts until the next reload; a failed connection is tried
 * again when an instance is next ready.
 */
#include "gateway_internal.h"

#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/pool.h"
#include "infergate/upstream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NFILES 3
#define FILE_MAX (64u << 20) /* as the worker serves at most */

static const char *const files[NFILES] = {"tokenizer.json", "tokenizer_config.json",
                                          "generation_config.json"};

struct ig__tok_fetch_s {
    ig_gateway_t *gw; /* NULL once the gateway closed: the fetch only cleans up */
    char model[128];
    char instance[64];
    ig_upstream_t *up;
    ig_upstream_req_t *req;
    int file; /* the one being fetched */
    int status;
    char *body[NFILES];
    size_t len[NFILES];
    int too_big;
    uv_work_t work;
    char dir[600];
    ig_tokenizer_t *tok;
    char err[800];
};

static void fetch_next(ig__tok_fetch_t *f);

static void fetch_free(ig__tok_fetch_t *f)
{
    for (int i = 0; i < NFILES; i++)
        free(f->body[i]);
    ig_tokenizer_free(f->tok);
    free(f);
}

/* The model's entry that still wants a tokenizer from its workers, or NULL
 * (a reload may have given it a path, or dropped it). */
static gw_prefix_model_t *wanting(ig_gateway_t *gw, const char *model)
{
    for (int i = 0; i < gw->npmodels; i++) {
        gw_prefix_model_t *pm = &gw->pmodels[i];
        if (strcmp(pm->model, model) == 0 && pm->tok == NULL && pm->path == NULL &&
            !pm->remote_failed)
            return pm;
    }
    return NULL;
}

/* The fetch ended without a tokenizer: the model stays on token-id prompts,
 * for good (until a reload) when the worker answered but served none that
 * loads, or until an instance is next ready when the connection failed. */
static void fetch_ended(ig__tok_fetch_t *f, const char *why, int for_good)
{
    ig_gateway_t *gw = f->gw;
    if (gw != NULL) {
        gw_prefix_model_t *pm = wanting(gw, f->model);
        if (pm != NULL && for_good) {
            pm->remote_failed = 1;
            IG_WARN("model %s: no tokenizer from instance %s (%s): prefix-aware routing for "
                    "token-id prompts only",
                    f->model, f->instance, why);
        } else if (pm != NULL) {
            IG_INFO("model %s: no tokenizer from instance %s yet (%s): tried again when an "
                    "instance is next ready",
                    f->model, f->instance, why);
        }
        gw->tok_fetch = NULL;
        if (for_good)
            ig__gateway_tokenizer_kick(gw); /* another model may want one */
    }
    fetch_free(f);
}

static void fetch_failed(ig__tok_fetch_t *f, const char *why)
{
    fetch_ended(f, why, 1);
}

/* ---- loading, on the thread pool -------------------------------------------- */

static void load_work(uv_work_t *w)
{
    ig__tok_fetch_t *f = w->data;
    char path[NFILES][700];
    int wrote = 0;
    for (int i = 0; i < NFILES; i++) {
        snprintf(path[i], sizeof(path[i]), "%s/%s", f->dir, files[i]);
        FILE *fp = f->body[i] != NULL ? fopen(path[i], "wb") : NULL;
        if (fp != NULL) {
            int ok = fwrite(f->body[i], 1, f->len[i], fp) == f->len[i];
            ok &= fclose(fp) == 0;
            wrote |= ok << i;
        }
    }
    if (!(wrote & 1))
        snprintf(f->err, sizeof(f->err), "cannot write %s under %s", files[0], f->dir);
    else
        ig_tokenizer_load_files(path[0], (wrote & 2) ? path[1] : NULL, (wrote & 4) ? path[2] : NULL,
                                &f->tok, f->err, sizeof(f->err));
    for (int i = 0; i < NFILES; i++)
        unlink(path[i]);
    rmdir(f->dir);
}

static void load_done(uv_work_t *w, int status)
{
    ig__tok_fetch_t *f = w->data;
    ig_gateway_t *gw = f->gw;
    if (status != 0 || f->tok == NULL) {
        fetch_failed(f, status != 0 ? "cancelled" : f->err);
        return;
    }
    gw_prefix_model_t *pm = gw != NULL ? wanting(gw, f->model) : NULL;
    if (pm != NULL) {
        pm->tok = f->tok;
        f->tok = NULL;
        pm->style = ig_chat_detect(ig_tokenizer_chat_template(pm->tok));
        IG_INFO("model %s: tokenizer from instance %s (%zu bytes): prefix-aware routing for text "
                "prompts too",
                f->model, f->instance, f->len[0]);
    }
    if (gw != NULL) {
        gw->tok_fetch = NULL;
        ig__gateway_tokenizer_kick(gw);
    }
    fetch_free(f);
}

static void load_start(ig__tok_fetch_t *f)
{
    snprintf(f->dir, sizeof(f->dir), "%s/tokenizer-XXXXXX", f->gw->run_dir);
    if (mkdtemp(f->dir) == NULL) {
        fetch_failed(f, "cannot make a directory under the run directory");
        return;
    }
    f->work.data = f;
    if (uv_queue_work(f->gw->loop, &f->work, load_work, load_done) != 0) {
        rmdir(f->dir);
        fetch_failed(f, "cannot queue the load");
    }
}

/* ---- the three GETs ------------------------------------------------------------ */

static void on_headers(ig_upstream_req_t *r, int status, int n, const char *const *names,
                       const char *const *values, void *data)
{
    (void)r, (void)n, (void)names, (void)values;
    ((ig__tok_fetch_t *)data)->status = status;
}

static void on_body(ig_upstream_req_t *r, const char *buf, size_t len, void *data)
{
    ig__tok_fetch_t *f = data;
    int i = f->file;
    if (f->status != 200 || f->too_big)
        return;
    (void)r;
    char *n = f->len[i] + len <= FILE_MAX ? realloc(f->body[i], f->len[i] + len) : NULL;
    if (n == NULL) {
        f->too_big = 1; /* the rest is read and dropped; on_done fails the fetch */
        return;
    }
    memcpy(n + f->len[i], buf, len);
    f->body[i] = n;
    f->len[i] += len;
}

static void on_done(ig_upstream_req_t *r, int err, void *data)
{
    ig__tok_fetch_t *f = data;
    (void)r;
    f->req = NULL;
    char why[160];
    if (f->too_big) {
        snprintf(why, sizeof(why), "%s: over %u MiB or out of memory", files[f->file],
                 FILE_MAX >> 20);
    } else if (err != 0) {
        snprintf(why, sizeof(why), "%s: %s", files[f->file], ig_strerror(err));
        fetch_ended(f, why, 0);
        return;
    } else if (f->status == 200 || (f->file > 0 && f->status == 404)) {
        if (f->status != 200) { /* the two configs are optional */
            free(f->body[f->file]);
            f->body[f->file] = NULL;
        }
        f->file++;
        fetch_next(f);
        return;
    } else {
        snprintf(why, sizeof(why), "%s: HTTP %d", files[f->file], f->status);
    }
    fetch_failed(f, why);
}

static void fetch_next(ig__tok_fetch_t *f)
{
    static const ig_upstream_cbs_t cbs = {on_headers, on_body, on_done};
    if (f->gw == NULL) {
        fetch_free(f);
        return;
    }
    if (f->file == NFILES) {
        load_start(f);
        return;
    }
    char path[80];
    snprintf(path, sizeof(path), "/v1/tokenizer/%s", files[f->file]);
    f->status = 0;
    if (ig_upstream_request(f->up, "GET", path, NULL, NULL, 0, &cbs, f, &f->req) != 0)
        fetch_failed(f, "cannot send the request");
}

/* ---- when, and the end ---------------------------------------------------------- */

/* A ready instance of a routed pool that serves model, or NULL. */
static ig_instance_t *ready_instance(ig_gateway_t *gw, const char *model)
{
    for (int p = 0; p < gw->npools; p++) {
        if (strcmp(ig_pool_model(gw->pools[p]), model) != 0)
            continue;
        for (int i = 0; i < ig_pool_size(gw->pools[p]); i++) {
            ig_instance_t *in = ig_pool_instance(gw->pools[p], i);
            if (ig_instance_state(in) == IG_INSTANCE_READY)
                return in;
        }
    }
    return NULL;
}

void ig__gateway_tokenizer_kick(ig_gateway_t *gw)
{
    if (gw->tok_fetch != NULL || gw->tok_fetch_off)
        return; /* one at a time; nothing once the gateway closes */
    for (int m = 0; m < gw->npmodels; m++) {
        const gw_prefix_model_t *pm = &gw->pmodels[m];
        ig_instance_t *in = wanting(gw, pm->model) ? ready_instance(gw, pm->model) : NULL;
        if (in == NULL)
            continue;
        ig__tok_fetch_t *f = calloc(1, sizeof(*f));
        if (f == NULL)
            return;
        f->gw = gw;
        f->up = ig_instance_upstream(in);
        snprintf(f->model, sizeof(f->model), "%s", pm->model);
        snprintf(f->instance, sizeof(f->instance), "%s", ig_instance_name(in));
        gw->tok_fetch = f;
        fetch_next(f);
        return;
    }
}

void ig__gateway_tokenizer_close(ig_gateway_t *gw)
{
    ig__tok_fetch_t *f = gw->tok_fetch;
    gw->tok_fetch_off = 1;
    if (f == NULL)
        return;
    gw->tok_fetch = NULL;
    f->gw = NULL;
    if (f->req != NULL) { /* no callback after this: free it here */
        ig_upstream_cancel(f->req);
        fetch_free(f);
    } /* else its load runs on the thread pool, and load_done frees it */
}
