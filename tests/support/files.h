#ifndef IG_TEST_FILES_H
#define IG_TEST_FILES_H

/*
 * Scratch directories and whole files, for tests: one way to make a
 * temporary directory and to remove it with all in it, one way to read a
 * file whole and to write or replace one. Nothing here fails a test by itself; callers assert.
 */

#include <stddef.h>

/* Makes a fresh directory $TMPDIR/igtest-XXXXXX (/tmp without TMPDIR) and
 * writes its path into buf. 0, or -1 (buf too small or mkdtemp failed). */
int ig_tf_mkdtemp(char *buf, size_t cap);

/* Removes dir and everything below it (links are removed, not followed).
 * Refuses, doing nothing, a path that is not absolute or is "/". NULL is
 * accepted and does nothing. */
void ig_tf_rmtree(const char *dir);

/* Reads the file whole: a malloc'ed buffer with a NUL after the last byte
 * (the caller frees it), its size in *len (len may be NULL). NULL when the
 * file cannot be read. */
char *ig_tf_read(const char *path, size_t *len);

/* Writes len bytes to path, creating or truncating it. 0 or -1. */
int ig_tf_write(const char *path, const void *data, size_t len);

/* Replaces path with len bytes: written beside it (path + ".next") and
 * renamed over it, so that a process reading path (a config on reload, a
 * site's list) never reads half a file. 0 or -1. */
int ig_tf_replace(const char *path, const void *data, size_t len);

/* As ig_tf_replace with the bytes of the file src, which is then removed
 * (a config written to a temporary file, moved over the one a gateway
 * reloads). 0 or -1. */
int ig_tf_replace_from(const char *path, const char *src);

#endif
