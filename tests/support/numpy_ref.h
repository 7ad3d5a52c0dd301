#ifndef INFERGATE_TEST_NUMPY_REF_H
#define INFERGATE_TEST_NUMPY_REF_H

/*
 * Test support: tests/reference/llama_ref.py, the independent NumPy forward
 * pass (Debian's python3-numpy), run on a model directory.
 */

/* 1 when /usr/bin/python3 imports numpy. */
int ig_ref_have_numpy(void);

/*
 * The reference's logits of every position of nprompts prompts (prompt p is
 * lens[p] token ids at prompts + p * stride), prompts in order: a malloc'd
 * (sum of lens) x vocab array. The prompts and the output pass through
 * files in dir. Fails the calling cmocka test when the script fails.
 */
float *ig_ref_logits(const char *dir, const int *prompts, int stride, const int *lens, int nprompts,
                     int vocab);

#endif
