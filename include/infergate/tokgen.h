#ifndef INFERGATE_TOKGEN_H
#define INFERGATE_TOKGEN_H

/*
 * Vocabulary generator for `infergate mkmodel`: learns a real BPE vocabulary
 * by training on a procedurally generated English-like corpus (deterministic
 * in the seed) and writes a Hugging Face tokenizer.json and
 * tokenizer_config.json that ig_tokenizer_load() reads. See docs/tokenizer.md.
 */

#include <stddef.h>
#include <stdint.h>

/* Styles of ig_tokgen_write(). */
#define IG_TOKGEN_BYTE_LEVEL 1    /* Llama-3: byte-level BPE, Llama-3 split, Llama-3 chat */
#define IG_TOKGEN_SENTENCEPIECE 2 /* Llama-2: "▁" pieces, byte fallback, [INST] chat */
#define IG_TOKGEN_CHATML 3        /* Qwen2: byte-level BPE, digit split, ChatML chat */

/* Smallest vocabulary the generator accepts (the byte alphabet plus room to learn). */
#define IG_TOKGEN_MIN_VOCAB 512
/* Largest vocabulary the generator accepts. */
#define IG_TOKGEN_MAX_VOCAB (1 << 20)

/* Writes DIR/tokenizer.json and DIR/tokenizer_config.json (DIR must exist)
 * for a vocabulary of exactly vocab_size ids, special tokens included. The
 * same (vocab_size, style, seed) always gives the same bytes. Returns 0,
 * IG_EINVAL for a bad size or style, IG_EIO when a file cannot be written, or
 * IG_ENOMEM; err gets a message. Takes about a second for 32000 ids. */
int ig_tokgen_write(const char *dir, int vocab_size, int style, uint64_t seed, char *err,
                    size_t errlen);

#endif
