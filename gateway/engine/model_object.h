/*
 * The model object, for the loader's two halves: model.c (the Hugging Face
 * directory, and the public accessors) and gguf_model.c (a model from one
 * GGUF file, which model.c calls). The struct and the small setters
 * gguf_model.c fills it through live here, below both, so gguf_model.c
 * never calls back into model.c.
 */
#ifndef IG_ENGINE_MODEL_OBJECT_H
#define IG_ENGINE_MODEL_OBJECT_H

#include "infergate/error.h"
#include "infergate/gguf.h"
#include "infergate/model.h"
#include "infergate/safetensors.h"

#include <stddef.h>
#include <stdlib.h>

struct ig_model_s {
    char *dir;
    ig_model_config_t cfg;
    ig_safetensors_t **files;
    size_t nfiles;
    const char *weights_label; /* file name used in messages about missing tensors */
    ig_tensor_t embed;
    ig_tensor_t final_norm;
    ig_tensor_t lm_head;
    ig_layer_weights_t *layers;
    size_t weight_bytes;
    void **owned; /* tensors made at load (ig_model_quantize), freed with the model */
    size_t nowned;
    ig_gguf_t *gguf; /* a model loaded from one GGUF file (gguf_model.c) */
};

/* gguf_model.c: the GGUF side of the loader. */
int ig__model_load_gguf(ig_model_t *m, ig_gguf_t *g, char *err, size_t errlen);

/* The loader's insides, for gguf_model.c. */
static inline ig_model_config_t *ig__model_cfg(ig_model_t *m)
{
    return &m->cfg;
}

static inline ig_tensor_t *ig__model_tensor(ig_model_t *m, int which)
{
    return which == 0 ? &m->embed : which == 1 ? &m->final_norm : &m->lm_head;
}

static inline int ig__model_alloc_layers(ig_model_t *m, int n)
{
    m->layers = calloc((size_t)n, sizeof(*m->layers));
    return m->layers ? 0 : IG_ENOMEM;
}

static inline ig_layer_weights_t *ig__model_layer_mut(ig_model_t *m, int l)
{
    return &m->layers[l];
}

static inline void ig__model_add_bytes(ig_model_t *m, size_t n)
{
    m->weight_bytes += n;
}

static inline int ig__model_own(ig_model_t *m, void *p)
{
    void **owned = realloc(m->owned, (m->nowned + 1) * sizeof(*owned));
    if (owned == NULL)
        return IG_ENOMEM;
    m->owned = owned;
    m->owned[m->nowned++] = p;
    return 0;
}

#endif
