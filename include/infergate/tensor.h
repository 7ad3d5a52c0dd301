#ifndef INFERGATE_TENSOR_H
#define INFERGATE_TENSOR_H

/*
 * The tensor view that model files hand to the kernels: base, so that
 * kernels/ needs no engine header (docs/DESIGN.md, "Dependencies").
 */

#include <stdint.h>

#include "infergate/dtype.h"

/* A view of one tensor inside a mapped file (or owned memory). Row-major;
 * shape[0] is the outermost dimension. */
typedef struct {
    ig_dtype_t dtype;
    const void *data; /* NULL when the tensor is absent (optional biases) */
    int ndim;
    int64_t shape[4];
} ig_tensor_t;

#endif
