/* Private helpers shared by safetensors.c, model.c and ../mkmodel/mkmodel.c. */
#ifndef IG_ENGINE_MODEL_INTERNAL_H
#define IG_ENGINE_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Formats a shape as "[2, 3]" into buf (truncated to len) and returns buf. */
const char *ig__shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* The loader's insides, for gguf_model.c (a model from one GGUF file). */
#include "infergate/model.h"
ig_model_config_t *ig__model_cfg(ig_model_t *m);
ig_tensor_t *ig__model_tensor(ig_model_t *m, int which); /* 0 embed, 1 final norm, 2 lm_head */
int ig__model_alloc_layers(ig_model_t *m, int n);
ig_layer_weights_t *ig__model_layer_mut(ig_model_t *m, int l);
void ig__model_add_bytes(ig_model_t *m, size_t n);
/* Memory the model frees with itself; IG_ENOMEM (p not taken) on failure. */
int ig__model_own(ig_model_t *m, void *p);

#endif
