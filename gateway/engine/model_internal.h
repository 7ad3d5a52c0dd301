/* Private helpers shared by safetensors.c, model.c and mkmodel.c. */
#ifndef IG_ENGINE_MODEL_INTERNAL_H
#define IG_ENGINE_MODEL_INTERNAL_H

#include <stddef.h>

/* snprintf into a caller's error buffer; err may be NULL or errlen 0. */
void ig__model_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
