/*
 * ig_tokenizer_load: a model's tokenizer from its directory (tokenizer.json
 * and its two config files, tokenizer.c) or from a GGUF file's vocabulary
 * (gguf_vocab.c, which itself ends in tokenizer.c's loader). The one entry
 * above both loaders, so neither calls back into the other.
 */
#include "gguf_vocab.h"

#include "infergate/error.h"
#include "infergate/gguf.h"
#include "infergate/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ig_tokenizer_load(const char *dir, ig_tokenizer_t **out, char *err, size_t errlen)
{
    if (ig_gguf_is_gguf(dir)) /* a GGUF file: its vocabulary (gguf_vocab.c) */
        return ig__tokenizer_load_gguf(dir, out, err, errlen);
    size_t n = strlen(dir) + 32;
    char *a = malloc(n), *b = malloc(n), *g = malloc(n);
    int rc;
    if (!a || !b || !g) {
        free(a);
        free(b);
        free(g);
        if (err && errlen)
            snprintf(err, errlen, "tokenizer: out of memory");
        return IG_ENOMEM;
    }
    snprintf(a, n, "%s/tokenizer.json", dir);
    snprintf(b, n, "%s/tokenizer_config.json", dir);
    snprintf(g, n, "%s/generation_config.json", dir);
    rc = ig_tokenizer_load_files(a, b, g, out, err, errlen);
    free(a);
    free(b);
    free(g);
    return rc;
}
