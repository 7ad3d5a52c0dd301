/*
 * The GET /load codec (see include/infergate/load.h): one table of fields
 * drives both the encoder and the decoder, so the two cannot drift.
 */
#include "infergate/load.h"
#include "infergate/error.h"
#include "infergate/jsonv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum { F_NUMBER, F_INT, F_BOOL, F_STRING, F_MODELS } ftype_t;

typedef struct {
    const char *name;
    unsigned bit;
    ftype_t type;
    size_t off;
} field_t;

#define F(name, bit, type, member)                                                                 \
    {                                                                                              \
        name, bit, type, offsetof(ig_load_t, member)                                               \
    }

/* The wire order: what both writers sent before the codec existed. */
static const field_t fields[] = {
    F("region", IG_LOAD_REGION, F_STRING, region),
    F("models", IG_LOAD_MODELS, F_MODELS, models),
    F("ready_instances", IG_LOAD_READY_INSTANCES, F_INT, ready_instances),
    F("waiting", IG_LOAD_WAITING, F_NUMBER, waiting),
    F("running", IG_LOAD_RUNNING, F_NUMBER, running),
    F("kv_blocks_used", IG_LOAD_KV_BLOCKS_USED, F_INT, kv_blocks_used),
    F("kv_blocks_total", IG_LOAD_KV_BLOCKS_TOTAL, F_INT, kv_blocks_total),
    F("inflight", IG_LOAD_INFLIGHT, F_INT, inflight),
    F("est_wait_s", IG_LOAD_EST_WAIT, F_NUMBER, est_wait_s),
    F("prefill_tokens_per_s", IG_LOAD_PREFILL_TPS, F_NUMBER, prefill_tokens_per_s),
    F("decode_tokens_per_s", IG_LOAD_DECODE_TPS, F_NUMBER, decode_tokens_per_s),
    F("max_waiting", IG_LOAD_MAX_WAITING, F_INT, max_waiting),
    F("model", IG_LOAD_MODEL, F_STRING, model),
    F("state", IG_LOAD_STATE, F_STRING, state),
    F("ready", IG_LOAD_READY, F_BOOL, ready),
    F("max_num_seqs", IG_LOAD_MAX_NUM_SEQS, F_INT, max_num_seqs),
    F("max_batched_tokens", IG_LOAD_MAX_BATCHED_TOKENS, F_INT, max_batched_tokens),
    F("chat_template", IG_LOAD_CHAT_TEMPLATE, F_STRING, chat_template),
    F("ttft_s", IG_LOAD_TTFT, F_NUMBER, ttft_s),
};

#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

void ig_load_init(ig_load_t *l)
{
    memset(l, 0, sizeof(*l));
    l->version = IG_LOAD_VERSION;
}

void ig_load_dispose(ig_load_t *l)
{
    json_decref(l->doc_);
    ig_load_init(l);
}

/* ---- encoding ------------------------------------------------------------ */

/* A whole count goes out as an integer, anything else as a real. */
static json_t *number(double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0)
        return json_integer((json_int_t)v);
    return json_real(isfinite(v) ? v : 0.0);
}

static json_t *encode_field(const ig_load_t *l, const field_t *f)
{
    const char *p = (const char *)l + f->off;
    switch (f->type) {
    case F_NUMBER:
        return number(*(const double *)p);
    case F_INT:
        return json_integer(*(const int *)p);
    case F_BOOL:
        return json_boolean(*(const int *)p);
    case F_STRING:
        return json_string(*(const char *const *)p ? *(const char *const *)p : "");
    case F_MODELS: {
        json_t *arr = json_array();
        for (int i = 0; arr && i < l->nmodels && i < IG_LOAD_MAX_MODELS; i++) {
            if (l->models[i] != NULL &&
                json_array_append_new(arr, json_string(l->models[i])) != 0) {
                json_decref(arr);
                return NULL;
            }
        }
        return arr;
    }
    }
    return NULL;
}

json_t *ig_load_encode(const ig_load_t *l)
{
    json_t *o = json_object();
    if (o == NULL || json_object_set_new(o, "version", json_integer(IG_LOAD_VERSION)) != 0)
        goto fail;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (!(l->has & fields[i].bit))
            continue;
        json_t *v = encode_field(l, &fields[i]);
        if (v == NULL || json_object_set_new(o, fields[i].name, v) != 0)
            goto fail;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

/* ---- decoding ------------------------------------------------------------ */

static const char *type_name(ftype_t t)
{
    switch (t) {
    case F_NUMBER:
        return "a number";
    case F_INT:
        return "an integer";
    case F_BOOL:
        return "a boolean";
    case F_STRING:
        return "a string";
    case F_MODELS:
        return "an array";
    }
    return "?";
}

/* 1 when v had the field's type and was stored. */
static int decode_field(ig_load_t *l, const field_t *f, json_t *v)
{
    char *p = (char *)l + f->off;
    switch (f->type) {
    case F_NUMBER:
        if (!json_is_number(v))
            return 0;
        *(double *)p = json_number_value(v);
        return 1;
    case F_INT:
        if (!json_is_integer(v) || json_integer_value(v) < -2147483647 ||
            json_integer_value(v) > 2147483647)
            return 0;
        *(int *)p = (int)json_integer_value(v);
        return 1;
    case F_BOOL:
        if (!json_is_boolean(v))
            return 0;
        *(int *)p = json_is_true(v);
        return 1;
    case F_STRING:
        if (!json_is_string(v))
            return 0;
        *(const char **)p = json_string_value(v);
        return 1;
    case F_MODELS: {
        if (!json_is_array(v))
            return 0;
        size_t i;
        json_t *m;
        l->nmodels = 0;
        json_array_foreach(v, i, m)
        {
            const char *id = json_is_string(m) ? json_string_value(m)
                                               : json_string_value(json_object_get(m, "id"));
            if (id != NULL && l->nmodels < IG_LOAD_MAX_MODELS)
                l->models[l->nmodels++] = id;
        }
        return 1;
    }
    }
    return 0;
}

int ig_load_decode(const char *text, size_t len, ig_load_t *out, char *err, size_t errlen)
{
    ig_load_dispose(out);
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    json_error_t jerr;
    /* Duplicate keys are rejected, as in every document the project reads. */
    json_t *doc = text ? ig_jsonv_loadb(text, len, &jerr) : NULL;
    if (!json_is_object(doc)) {
        if (err != NULL)
            snprintf(err, errlen, "$: %s", doc ? "expected an object" : "not JSON");
        json_decref(doc);
        return IG_EPARSE;
    }
    out->doc_ = doc;
    int rc = 0;
    json_t *v = json_object_get(doc, "version");
    if (v != NULL) {
        if (json_is_integer(v) && json_integer_value(v) >= 1 &&
            json_integer_value(v) <= 2147483647) {
            out->version = (int)json_integer_value(v);
        } else {
            if (err != NULL)
                snprintf(err, errlen, "$.version: expected an integer >= 1");
            rc = IG_EINVAL;
        }
    }
    for (size_t i = 0; i < NFIELDS; i++) {
        if ((v = json_object_get(doc, fields[i].name)) == NULL)
            continue;
        if (decode_field(out, &fields[i], v)) {
            out->has |= fields[i].bit;
        } else if (rc == 0) {
            if (err != NULL)
                snprintf(err, errlen, "$.%s: expected %s", fields[i].name,
                         type_name(fields[i].type));
            rc = IG_EINVAL;
        }
    }
    return rc;
}
