/* Private helpers shared by safetensors.c, model.c and ../mkmodel/mkmodel.c. */
#ifndef IG_ENGINE_MODEL_INTERNAL_H
#define IG_ENGINE_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Formats a shape as "[2, 3]" into buf (truncated to len) and returns buf. */
const char *ig__shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

#endif
