/* Private helpers shared by safetensors.c, model.c and ../mkmodel/mkmodel.c. */
#ifndef IG_ENGINE_MODEL_INTERNAL_H
#define IG_ENGINE_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* snprintf into a caller's error buffer; err may be NULL or errlen 0. */
void ig__model_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Formats a shape as "[2, 3]" into buf (truncated to len) and returns buf. */
const char *ig__shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

#endif
