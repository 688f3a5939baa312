/* test_threads.c — the adaptive thread count (engine/core/threads.c) fed fake readings: the
 * decision for each load, its band, the load from two readings, the /proc/stat and cgroup
 * cpu.max parsers. Which variable wins is checked on a real child in tests/lua/threads_spec.lua. */
#include "core/internal.h"

#include <math.h>
#include <stdio.h>

#include "check.h"
#define NEAR(a, b) (fabs((a) - (b)) < 1e-9)

/* one window of 0.25 s from a state */
static kg_threads_state at(int current) { return (kg_threads_state){current, 0, 0, KG_THREADS_PROBE_MIN_S}; }
static int step(kg_threads_state *st, int max, int ncpu, double others, double waiting) {
  kg_threads_step(st, max, ncpu, others, waiting, 0.25);
  return st->current;
}

static void choose(void) {
  /* 2 cores, 2 threads; (others busy cores, our threads' run-queue wait in cores) as measured
   * on the 2-core machine (docs/kernels.md, "Threads under load") */
  kg_threads_state st = at(2);
  CHECK(step(&st, 2, 2, 0.0, 0.0) == 2);  /* idle */
  CHECK(step(&st, 2, 2, 0.7, 0.3) == 2);  /* low-priority work filling our gaps: we still get the cores */
  CHECK(step(&st, 2, 2, 1.3, 0.9) == 1);  /* a busy loop at our priority: our threads queue */
  /* at 1 thread beside the loop: it holds its core (others 1.0), ours does not queue */
  for (int i = 0; i < 3; i++) CHECK(step(&st, 2, 2, 1.0, 0.05) == 1);
  /* after KG_THREADS_PROBE_MIN_S at 1 (4 windows), one window at 2 */
  CHECK(step(&st, 2, 2, 1.0, 0.05) == 2 && st.probing);
  CHECK(step(&st, 2, 2, 1.2, 0.9) == 1 && !st.probing); /* it queued: back, wait twice as long */
  CHECK(st.probe_every_s == 2 * KG_THREADS_PROBE_MIN_S);
  int windows = 0;
  while (step(&st, 2, 2, 1.0, 0.05) == 1 && windows < 100) windows++;
  CHECK(windows == 7); /* 2 s = 8 windows, the 8th raised it */
  CHECK(step(&st, 2, 2, 1.2, 0.9) == 1 && st.probe_every_s == 4 * KG_THREADS_PROBE_MIN_S);
  /* failed tries back off up to the cap */
  for (int i = 0; i < 2000; i++) step(&st, 2, 2, 1.2, st.current == 2 ? 0.9 : 0.05);
  CHECK(st.probe_every_s == KG_THREADS_PROBE_MAX_S);
  /* the loop stops: a whole idle core comes back at once, and the back-off is forgotten */
  st.current = 1, st.probing = 0;
  CHECK(step(&st, 2, 2, 0.1, 0.0) == 2 && !st.probing && st.probe_every_s == KG_THREADS_PROBE_MIN_S);
  /* a nice'd job soaking up the core we left: others look busy, a probe finds we get the core */
  st = at(1);
  for (int i = 0; i < 3; i++) CHECK(step(&st, 2, 2, 1.0, 0.0) == 1);
  CHECK(step(&st, 2, 2, 1.0, 0.0) == 2 && st.probing);
  CHECK(step(&st, 2, 2, 0.7, 0.2) == 2 && !st.probing); /* kept */
  CHECK(step(&st, 2, 2, 0.7, 0.2) == 2);
  /* a machine so busy that even our one thread queues: no probe */
  st = at(1);
  for (int i = 0; i < 40; i++) CHECK(step(&st, 2, 2, 1.8, 0.75) == 1);
  /* never below 1, never above max, no probe at max */
  st = at(1);
  for (int i = 0; i < 20; i++) CHECK(step(&st, 1, 2, 1.9, 3.0) == 1);
  st = at(2);
  CHECK(step(&st, 2, 2, 1.9, 5.0) == 1);
  st = at(4);
  for (int i = 0; i < 20; i++) CHECK(step(&st, 4, 8, 0.0, 0.0) == 4); /* a cgroup quota of 4 on 8 cores */
  /* more cores: drop about what was waited for, take what is idle */
  st = at(8);
  CHECK(step(&st, 8, 8, 2.5, 2.2) == 6);
  st = at(2);
  CHECK(step(&st, 8, 8, 0.0, 0.0) == 8);
  st = at(4);
  CHECK(step(&st, 8, 8, 3.5, 0.0) == 4); /* 4.5 cores ours or idle: half a core idle is not enough */
  CHECK(step(&st, 8, 8, 2.9, 0.0) == 5);
}

/* The monitor's timing, driven by kg_threads_window_ms: a busy loop of equal priority that starts
 * with ops (our threads queue at 2 threads, not at 1) is seen by the first reading, 50 ms in, and
 * the probes that check whether the core came back cost 50 ms each. */
static void windows(void) {
  kg_threads_state st = at(2);
  CHECK(kg_threads_window_ms(&st) == KG_THREADS_SHORT_MS); /* nothing measured yet */
  step(&st, 2, 2, 0.1, 0.0);
  CHECK(st.current == 2 && kg_threads_window_ms(&st) == KG_THREADS_WINDOW_MS); /* steady: the long window */
  CHECK(KG_THREADS_SHORT_MS <= 50 && KG_THREADS_WINDOW_MS <= 100);

  st = at(2);
  double t = 0, at2 = 0, first_drop = -1;
  while (t < 10.0) {
    double w = kg_threads_window_ms(&st) / 1000.0;
    int n = st.current;
    if (n == 2) at2 += w;
    kg_threads_step(&st, 2, 2, n == 2 ? 1.3 : 1.0, n == 2 ? 0.9 : 0.05, w);
    t += w;
    if (first_drop < 0 && st.current == 1) first_drop = t;
    if (st.current != n) CHECK(kg_threads_window_ms(&st) == KG_THREADS_SHORT_MS); /* a move is checked soon */
  }
  CHECK(NEAR(first_drop, 0.05));
  /* 10 s beside the loop: 50 ms before the drop, then probes 1, 2 and 4 s apart, 50 ms each */
  CHECK(at2 <= 0.2 + 1e-9);
  CHECK(st.probe_every_s == 8.0);

  /* a wrong drop on a quiet machine (one window of queueing) is undone by the next, short, window */
  st = at(2);
  step(&st, 2, 2, 0.2, 0.0);
  step(&st, 2, 2, 1.2, 0.6);
  CHECK(st.current == 1 && kg_threads_window_ms(&st) == KG_THREADS_SHORT_MS);
  step(&st, 2, 2, 0.1, 0.0);
  CHECK(st.current == 2);
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
  windows();
  others();
  proc_stat();
  cgroup();
  if (failures) fprintf(stderr, "test_threads: %d failures\n", failures);
  else printf("test_threads: ok\n");
  return failures != 0;
}
