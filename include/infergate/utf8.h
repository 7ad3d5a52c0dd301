#ifndef INFERGATE_UTF8_H
#define INFERGATE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/*
 * UTF-8, strictly (RFC 3629, Unicode 3.9 table 3-7): no overlong forms, no
 * surrogates (U+D800..U+DFFF), nothing above U+10FFFF. The one validator and
 * decoder of the project: base/ sits below every other folder, so the api
 * module, the scheduler and the tokenizer all use these (docs/DESIGN.md).
 * NUL is a valid character here; callers that cannot carry it check for it.
 */

/* Decodes the character at s[0..len). Returns its length (1..4) and sets *cp
 * when s starts with a complete valid character; returns 0 (*cp untouched)
 * when it does not, or when len is 0. cp may be NULL. */
size_t ig_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* Where ig_utf8_decode returned 0 (len > 0): the length (1..3) of the
 * "maximal subpart" at s, the bytes that one U+FFFD replaces in a decoder
 * that follows Unicode's recommended practice (Python's errors="replace"
 * does). *truncated (may be NULL) is 1 when those bytes are a proper prefix
 * of a valid character cut off by the end of the input, 0 otherwise. */
size_t ig_utf8_invalid_len(const char *s, size_t len, int *truncated);

/* Copies s[0..len) to out with each maximal invalid subpart (as
 * ig_utf8_invalid_len counts it) replaced by one U+FFFD, as Python's
 * errors="replace" does. out has room for 3 * len bytes. Returns the bytes
 * written. */
size_t ig_utf8_replace(const char *s, size_t len, char *out);

/* The length of the longest prefix of s[0..len) that is valid UTF-8. */
size_t ig_utf8_valid_prefix(const char *s, size_t len);

/* 1 when all of s[0..len) is valid UTF-8, else 0. */
int ig_utf8_valid(const char *s, size_t len);

/* The bytes (0..3) at the end of s[0..len) that begin a valid character the
 * input has not finished yet: what a streaming writer holds back until the
 * next piece arrives. Bytes that can never become valid are not held. */
size_t ig_utf8_incomplete_tail(const char *s, size_t len);

/* Writes the UTF-8 form of cp (a scalar value: at most U+10FFFF, not a
 * surrogate) to out, which has room for 4 bytes. Returns its length (1..4),
 * or 0 when cp is not a scalar value. */
size_t ig_utf8_encode(uint32_t cp, char *out);

#endif
