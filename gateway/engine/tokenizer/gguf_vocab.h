#ifndef IG_ENGINE_TOKENIZER_GGUF_VOCAB_H
#define IG_ENGINE_TOKENIZER_GGUF_VOCAB_H

/* The tokenizer of a GGUF file, from its tokenizer.ggml.* metadata
 * (gguf_vocab.c); what ig_tokenizer_load() calls for a .gguf path. */

#include "infergate/tokenizer.h"

#include <stddef.h>

int ig__tokenizer_load_gguf(const char *path, ig_tokenizer_t **out, char *err, size_t errlen);

#endif
