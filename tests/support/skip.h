/*
 * The exit status of a test program that cannot run here (no GPU, no numpy):
 * CMakeLists.txt gives every test SKIP_RETURN_CODE 77, so ctest prints
 * "Skipped", not "Passed".
 */
#ifndef IG_TESTS_SKIP_H
#define IG_TESTS_SKIP_H

#define IG_TEST_SKIP 77

#endif
