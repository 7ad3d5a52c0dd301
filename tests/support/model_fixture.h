#ifndef INFERGATE_TESTS_MODEL_FIXTURE_H
#define INFERGATE_TESTS_MODEL_FIXTURE_H

/*
 * Test support: random-weight Llama-family models in Hugging Face layout
 * (config.json + model.safetensors) for the engine tests.
 *
 * ig_fixture_model_dir() prefers the real `infergate mkmodel` binary (found
 * through IG_BIN_DIR, which ctest sets); without it, and for shapes mkmodel
 * has no preset for (llama3 rope scaling at a test size), it writes the model
 * itself with the shapes below.
 */

#include "infergate/dtype.h"
#include "infergate/model.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *architecture;
    int dim, hidden, layers, heads, kv_heads, head_dim, vocab, max_pos;
    float rope_theta, eps;
    const char *rope_scaling; /* "none", "linear", "llama3" */
    float rope_factor, rope_low, rope_high;
    int rope_orig_max;
    int tie, bias;
    ig_dtype_t dtype;
    uint64_t seed;
} ig_fixture_spec_t;

/* Fills spec with a named shape: "tiny" (tied, MHA), "gqa" (4 heads over 2
 * KV heads, untied, rope_theta 500000, q/k/v biases), "llama3" (gqa with
 * llama3 rope scaling), "linear" (Mistral, tied, linear rope scaling 4),
 * "small" (stories15M's shape). IG_EINVAL if unknown. */
int ig_fixture_preset(const char *name, ig_fixture_spec_t *spec);

/* Writes config.json and model.safetensors of spec into the existing dir. */
int ig_fixture_write(const ig_fixture_spec_t *spec, const char *dir);

/*
 * Puts a model of preset `name` in `dtype` into a fresh temporary dir
 * (ig_tf_mkdtemp, written to buf; the caller removes it with ig_tf_rmtree):
 * with `infergate mkmodel --preset name --seed 1` when IG_BIN_DIR's binary
 * has that preset, else with ig_fixture_write. *real says which (may be
 * NULL).
 */
int ig_fixture_model_dir(const char *name, ig_dtype_t dtype, char *buf, size_t len, int *real);

#endif
