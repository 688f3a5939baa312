/* test_threads.c — the adaptive thread count (engine/core/threads.c) fed fake readings: the
 * decision for each load, its band, the load from two readings, the /proc/stat and cgroup
 * cpu.max parsers. Which variable wins is checked on a real child in tests/lua/threads_spec.lua. */
#include "core/internal.h"

#include <math.h>
#include <stdio.h>

static int failures;
#define CHECK(cond)                                                                                                    \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                         \
      failures++;                                                                                                      \
    }                                                                                                                  \
  } while (0)
#define NEAR(a, b) (fabs((a) - (b)) < 1e-9)

static void choose(void) {
  /* 2 cores, both threads running (current, max, ncpu, others busy cores) */
  CHECK(kg_threads_choose(2, 2, 2, 0.0) == 2);  /* idle machine */
  CHECK(kg_threads_choose(2, 2, 2, 0.3) == 2);  /* light background: keep both */
  CHECK(kg_threads_choose(2, 2, 2, 0.67) == 1); /* a busy loop's fair share beside our 2 threads */
  CHECK(kg_threads_choose(2, 2, 2, 1.9) == 1);
  CHECK(kg_threads_choose(2, 2, 2, 7.0) == 1); /* never below 1 */
  CHECK(kg_threads_choose(2, 2, 2, -1.0) == 2);
  /* one thread: back up only when a whole core is free */
  CHECK(kg_threads_choose(1, 2, 2, 1.0) == 1);  /* the busy loop holds its core */
  CHECK(kg_threads_choose(1, 2, 2, 0.45) == 1); /* inside the band: no flip */
  CHECK(kg_threads_choose(1, 2, 2, 0.39) == 2);
  CHECK(kg_threads_choose(1, 2, 2, 0.0) == 2);
  /* the band on both sides of 2 -> 1 -> 2 does not overlap: a reading never moves it both ways */
  for (double o = 0; o <= 2.0; o += 0.01) {
    int down = kg_threads_choose(2, 2, 2, o), up = kg_threads_choose(1, 2, 2, o);
    CHECK(!(down == 1 && up == 2));
  }
  /* more cores: steps by what is free, capped by max */
  CHECK(kg_threads_choose(8, 8, 8, 0.0) == 8);
  CHECK(kg_threads_choose(8, 8, 8, 2.0) == 6);
  CHECK(kg_threads_choose(8, 8, 8, 7.2) == 1);
  CHECK(kg_threads_choose(2, 8, 8, 0.0) == 8);
  CHECK(kg_threads_choose(2, 4, 8, 0.0) == 4); /* a cgroup quota of 4 on 8 cores */
  CHECK(kg_threads_choose(4, 4, 4, 1.0) == 3);
  CHECK(kg_threads_choose(3, 4, 4, 1.0) == 3);
}

static void others(void) {
  /* 0.5 s, 1.5 busy core-seconds, 0.5 of them ours: others held 2 cores' worth per second */
  kg_cpu_sample a = {10.0, 100.0, 3.0}, b = {10.5, 101.5, 3.5};
  CHECK(NEAR(kg_threads_others(&a, &b), 2.0));
  kg_cpu_sample c = {10.5, 100.5, 3.6}; /* tick rounding made ours exceed the busy count */
  CHECK(kg_threads_others(&a, &c) == 0);
  CHECK(kg_threads_others(&a, &a) == 0); /* no time passed */
}

static void proc_stat(void) {
  const char *text = "cpu  1000 10 200 5000 50 5 5 30 0 0\n"
                     "cpu0 400 0 100 2500 25 2 3 10 0 0\n"
                     "cpu1 600 10 100 2500 25 3 2 20 0 0\n"
                     "cpu2 7 7 7 7\n"
                     "intr 12345 1 2 3\n"
                     "ctxt 999\n";
  unsigned char both[4] = {1, 1, 0, 0}, one[4] = {0, 1, 0, 0}, far[4] = {0, 0, 0, 1};
  double busy = -1;
  /* cpu0: 400 + 0 + 100 + 2 + 3 + 10 = 515; cpu1: 600 + 10 + 100 + 3 + 2 + 20 = 735 (idle, iowait out) */
  CHECK(kg_proc_stat_busy(text, both, 4, 100.0, &busy) == 2 && NEAR(busy, 12.5));
  CHECK(kg_proc_stat_busy(text, one, 4, 100.0, &busy) == 1 && NEAR(busy, 7.35));
  CHECK(kg_proc_stat_busy(text, far, 4, 100.0, &busy) == 0 && busy == 0); /* cpu3 not listed */
  unsigned char three[4] = {0, 0, 1, 0};
  CHECK(kg_proc_stat_busy(text, three, 4, 1.0, &busy) == 1 && NEAR(busy, 21)); /* a short line: 4 fields */
  CHECK(kg_proc_stat_busy("", both, 4, 100.0, &busy) == 0);
}

static void cgroup(void) {
  CHECK(kg_cgroup_cpu_limit("max 100000\n") == 0);
  CHECK(kg_cgroup_cpu_limit("150000 100000\n") == 2);
  CHECK(kg_cgroup_cpu_limit("100000 100000\n") == 1);
  CHECK(kg_cgroup_cpu_limit("50000 100000\n") == 1);
  CHECK(kg_cgroup_cpu_limit("400000 100000") == 4);
  CHECK(kg_cgroup_cpu_limit("junk") == 0);
  CHECK(kg_cgroup_cpu_limit(NULL) == 0);
}

int main(void) {
  choose();
  others();
  proc_stat();
  cgroup();
  if (failures) fprintf(stderr, "test_threads: %d failures\n", failures);
  else printf("test_threads: ok\n");
  return failures != 0;
}
