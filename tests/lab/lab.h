/* lab.h — the clocks and the sort order shared by the kernel labs (tests/lab/lab_*.c). */
#ifndef KENG_LAB_H
#define KENG_LAB_H

#include <time.h>

/* process CPU time in seconds: on a shared machine wall time moves by 2x between runs, CPU time
 * much less (with more than one thread it sums them) */
static inline double lab_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* wall-clock seconds (monotonic) */
static inline double lab_wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort order of doubles, ascending */
static inline int lab_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#endif
