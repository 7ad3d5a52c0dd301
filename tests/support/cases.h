#ifndef IG_TEST_CASES_H
#define IG_TEST_CASES_H

/*
 * Data-driven cases: tests/cases/<suite>/<case>/ holds a case's input
 * files and its `expect` file. One walker visits the case folders of a
 * suite in name order, so that every data-driven test reads its cases the
 * same way and a failed case is named.
 */

#include <stddef.h>

/* Checks one case: name is the folder's name, dir its full path. Returns 0
 * when the case passed, else non-zero (after printing why). */
typedef int (*ig_case_cb)(const char *name, const char *dir, void *data);

/* The folder of a suite ("config", "model", "tokenizer/malformed"), under
 * $IG_SOURCE_DIR (else the source tree the tests were built from). Static
 * buffer. */
const char *ig_cases_dir(const char *suite);

/* Calls cb for every case folder of suite (names starting with '.' are
 * skipped), in strcmp order, and prints "<n> <suite> cases, <f> failed".
 * Returns how many cases failed, or -1 when the suite cannot be read; the
 * number of cases goes to *ncases (may be NULL), so that a test can
 * assert the suite did not silently shrink. */
int ig_cases_foreach(const char *suite, ig_case_cb cb, void *data, int *ncases);

/* The first line of the case's `expect` file without its line ending,
 * malloc'ed (the caller frees it); NULL when there is none. */
char *ig_case_expect(const char *dir);

#endif
