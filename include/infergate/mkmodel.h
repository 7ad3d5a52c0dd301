#ifndef INFERGATE_MKMODEL_H
#define INFERGATE_MKMODEL_H

/*
 * Random-weight Llama-family models in Hugging Face layout, for tests,
 * benchmarks and the embedded default of `infergate serve`. A preset fixes
 * the shape; a seed fixes every byte: the same preset, seed, dtype and shard
 * count always give identical files, and the values of one seed are the same
 * in every dtype (up to rounding). Weights are streamed to disk tensor by
 * tensor, so memory stays small even for the 2.5 GB `1b` preset.
 * See docs/model.md.
 */

#include "infergate/dtype.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *preset; /* tiny, small, gqa, 1b */
    uint64_t seed;
    int has_dtype; /* 0: the preset's dtype */
    ig_dtype_t dtype;
    int shards;       /* 0: the preset's count; > 1 writes model-0000K-of-0000N + index */
    int no_tokenizer; /* skip tokenizer.json / tokenizer_config.json (they take
                         most of the time for the larger vocabularies) */
} ig_mkmodel_opts_t;

void ig_mkmodel_opts_default(ig_mkmodel_opts_t *opts);

/*
 * Writes config.json, generation_config.json, the weights and the tokenizer
 * into dir (created when missing; existing model files are replaced).
 * Returns 0, IG_EINVAL (unknown preset, bad shard count), IG_EIO or
 * IG_ENOMEM, with a message in err.
 */
int ig_mkmodel_write(const char *dir, const ig_mkmodel_opts_t *opts, char *err, size_t errlen);

/*
 * Writes the Hugging Face model in hf_dir (config.json, safetensors,
 * tokenizer.json, tokenizer_config.json) as one GGUF file at path, the
 * matrices as `quant` when it is IG_DTYPE_Q8_0 or IG_DTYPE_Q4_0, or mixed
 * as llama.cpp's Q4_K_M (Q4_K and Q6_K) for IG_DTYPE_Q4_K (quantized as
 * ig_dtype_from_f32 does; IG_DTYPE_F32: as stored; docs/model.md,
 * "GGUF"). 0, IG_EINVAL (another architecture or quant), IG_EMODEL,
 * IG_EIO, IG_ENOMEM.
 */
int ig_mkmodel_to_gguf(const char *hf_dir, const char *path, ig_dtype_t quant, char *err,
                       size_t errlen);

/* The i-th preset's name and a one-line summary; NULL past the last one. */
const char *ig_mkmodel_preset_name(size_t i);
const char *ig_mkmodel_preset_summary(size_t i);

#endif
