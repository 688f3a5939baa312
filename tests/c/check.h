/* check.h — the CHECK of the plain C unit tests: on a false condition it prints the file, the
 * line and the condition and counts a failure; main returns failures != 0. Header-only: each
 * test is one executable that includes it once (the fuzz-style tests use mutate.h's CHECK). */
#ifndef KENG_TESTS_CHECK_H
#define KENG_TESTS_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond)                                                                                                    \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                         \
      failures++;                                                                                                      \
    }                                                                                                                  \
  } while (0)

#endif
