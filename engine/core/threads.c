/* threads.c — how many threads kernels and BLAS use, and how that follows the machine's load.
 *
 * With no count given (KENG_NUM_THREADS, OMP_NUM_THREADS or kg_set_num_threads), keng starts with
 * one thread per core it may use (the affinity mask, capped by a cgroup CPU quota) and, every
 * KG_THREADS_WINDOW_MS, measures how many of those cores the rest of the machine kept busy:
 * the busy time /proc/stat counts on our cores minus this process's own CPU time. Cores that
 * other work holds are left to it. A static OpenMP split across a core that another process
 * also wants waits, every parallel region, for the thread the scheduler has parked (a slice is
 * milliseconds; a region tens of microseconds), and the waiting threads spin on top: on the
 * 2-core machine of docs/kernels.md, "Threads", one busy core made 2-thread rows 2-3x slower
 * while 1 thread ran at its idle speed. The decision is kg_threads_step, a plain function of
 * the readings (tests/c/test_threads.c feeds it fake ones); a thread of its own takes the readings
 * (monitor, below), so the op dispatch only compares two integers. */
#define _GNU_SOURCE 1 /* sched_getaffinity, cpu_set_t */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern void openblas_set_num_threads(int);

static struct {
  int current;          /* threads the next parallel region gets (0: not set up yet) */
  int max;              /* cores this process may use */
  _Atomic int adaptive; /* 1: current follows the load */
  _Atomic int want;     /* the count the measuring thread decided (adaptive only) */
  _Atomic int active;   /* ops ran since the measuring thread last looked */
  int monitor_started;
  const char *source;   /* where the count came from */
  _Atomic double waiting; /* last measured run-queue wait of our threads, in cores */
  _Atomic double others;  /* last measured busy cores of other processes (-1: none yet) */
  unsigned char cpus[KG_THREADS_MAX_CPUS];
  int ncpu;             /* cores in the affinity mask */
  kg_cpu_sample last;   /* start of the current window */
  int have_last;
  _Atomic int no_proc;  /* /proc/stat could not be read (or no thread to read it): no readings */
  kg_threads_state st;  /* the adaptive decision's memory */
} tp = {.others = -1, .st = {.probe_every_s = KG_THREADS_PROBE_MIN_S}};

static void apply(int n) {
  tp.current = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n); /* the OpenMP build of OpenBLAS shares this pool */
}

/* ---- plain functions (tested with fake readings) -------------------------------------- */

void kg_threads_step(kg_threads_state *st, int max, int ncpu, double others, double waiting, double window_s) {
  st->since_s += window_s;
  if (st->probing) { /* the window just measured ran one thread more: did that thread get a core? */
    st->probing = 0;
    st->since_s = 0;
    if (waiting >= KG_THREADS_WAIT_DOWN) {
      st->current--;
      st->probe_every_s = fmin(2 * st->probe_every_s, KG_THREADS_PROBE_MAX_S);
    } else {
      st->probe_every_s = KG_THREADS_PROBE_MIN_S;
    }
    return;
  }
  if (waiting >= KG_THREADS_WAIT_DOWN && st->current > 1) {
    /* our threads queued behind other work: give back about as many cores as they waited for */
    int drop = (int)floor(waiting + 0.5);
    st->current -= drop < 1 ? 1 : drop;
    if (st->current < 1) st->current = 1;
    st->since_s = 0;
    return;
  }
  /* a whole core the others left idle (their busy time counts what they got, not what they
   * wanted, so only idle time is proof): take it at once */
  double avail = ncpu - (others > 0 ? others : 0);
  if (st->current < max && avail >= st->current + 0.6) {
    int n = (int)floor(avail + 0.4);
    st->current = n > max ? max : n;
    st->since_s = 0;
    st->probe_every_s = KG_THREADS_PROBE_MIN_S;
    return;
  }
  /* others may be soaking up a core only because we left it (a nice'd background job does):
   * now and then run a thread more for one window and keep it if it did not queue (not while the
   * threads we have queue already) */
  if (st->current < max && st->since_s >= st->probe_every_s && waiting < KG_THREADS_WAIT_DOWN) {
    st->current++;
    st->probing = 1;
    st->since_s = 0;
  }
}

int kg_threads_window_ms(const kg_threads_state *st) {
  /* right after a move (or a probe, or its end) the next reading says soonest whether it was
   * right: a wrong drop on a quiet machine, or a probe beside a busy core, then costs 50 ms */
  return st->since_s == 0 ? KG_THREADS_SHORT_MS : KG_THREADS_WINDOW_MS;
}

double kg_threads_others(const kg_cpu_sample *a, const kg_cpu_sample *b) {
  double wall = b->wall_s - a->wall_s;
  if (wall <= 0) return 0;
  double others = ((b->busy_s - a->busy_s) - (b->own_s - a->own_s)) / wall;
  return others > 0 ? others : 0;
}

int kg_proc_stat_busy(const char *text, const unsigned char *cpus, int ncpus, double hz, double *busy_s) {
  double sum = 0;
  int found = 0;
  for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    int id, used;
    if (sscanf(line, "cpu%d%n", &id, &used) != 1 || id < 0 || id >= ncpus || !cpus[id]) continue;
    /* user nice system idle iowait irq softirq steal (guest time is inside user already):
     * busy is all but idle and iowait; steal is time the hypervisor gave our core to others */
    unsigned long long v[8] = {0};
    if (sscanf(line + used, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
               &v[6], &v[7]) < 4)
      continue;
    sum += (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
    found++;
  }
  *busy_s = sum / hz;
  return found;
}

int kg_cgroup_cpu_limit(const char *cpu_max) {
  char quota[32];
  double period;
  if (!cpu_max || sscanf(cpu_max, "%31s %lf", quota, &period) != 2 || !strcmp(quota, "max") || period <= 0) return 0;
  double q = atof(quota);
  return q > 0 ? (int)ceil(q / period - 1e-9) : 0;
}

/* ---- readings -------------------------------------------------------------------------- */

static double clock_s(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int read_file(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = 0;
  return n > 0;
}

/* seconds this process's threads sat runnable on a run queue while another task had the core:
 * the second field of each /proc/self/task/N/schedstat (exited threads drop out of the sum, which
 * only makes one window's difference low) */
static double run_delay_s(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  double sum = 0;
  struct dirent *e;
  char path[64], buf[128];
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%.20s/schedstat", e->d_name);
    unsigned long long run, wait;
    if (read_file(path, buf, sizeof buf) && sscanf(buf, "%llu %llu", &run, &wait) == 2) sum += 1e-9 * (double)wait;
  }
  closedir(d);
  return sum;
}

static int sample(kg_cpu_sample *s) {
  char buf[16384]; /* the per-core lines of /proc/stat come first: 16 KB covers ~150 cores */
  static double hz;
  if (!hz) hz = (double)sysconf(_SC_CLK_TCK);
  if (hz <= 0 || !read_file("/proc/stat", buf, sizeof buf)) return 0;
  s->wall_s = clock_s(CLOCK_MONOTONIC);
  s->own_s = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  s->delay_s = run_delay_s();
  return kg_proc_stat_busy(buf, tp.cpus, KG_THREADS_MAX_CPUS, hz, &s->busy_s) > 0;
}

/* ---- the policy ------------------------------------------------------------------------- */

static void setup(void) {
  cpu_set_t set;
  tp.ncpu = 0;
  if (!sched_getaffinity(0, sizeof set, &set)) {
    for (int i = 0; i < KG_THREADS_MAX_CPUS && i < CPU_SETSIZE; i++)
      if (CPU_ISSET(i, &set)) tp.cpus[i] = 1, tp.ncpu++;
  }
  int cores = tp.ncpu ? tp.ncpu : omp_get_num_procs();
  char buf[128];
  int quota = read_file("/sys/fs/cgroup/cpu.max", buf, sizeof buf) ? kg_cgroup_cpu_limit(buf) : 0;
  tp.max = quota > 0 && quota < cores ? quota : cores;

  /* the one place keng reads its thread count; OMP_NUM_THREADS (its first number, as libgomp
   * reads it) counts as a given count too, so either fixes the count and turns adaptation off */
  int n = (int)kg_env_int(KG_ENV_KENG_NUM_THREADS); /* the registry: engine/core/env.def */
  tp.source = "KENG_NUM_THREADS";
  const char *e;
  if (n <= 0 && (e = getenv("OMP_NUM_THREADS")) && atoi(e) > 0) {
    n = atoi(e);
    tp.source = "OMP_NUM_THREADS";
  }
  tp.adaptive = n <= 0 && tp.ncpu > 0;
  if (n <= 0) {
    n = tp.max;
    tp.source = "adaptive";
  }
  tp.want = n;
  apply(n);
}

int kg_num_threads(void) {
  if (!tp.current) setup();
  return tp.current;
}

void kg_set_num_threads(int n) {
  if (!tp.current) setup();
  tp.adaptive = 0;
  tp.source = "set_num_threads";
  apply(n < 1 ? 1 : n);
}

/* The measuring runs on a thread of its own, so that no op pays for the /proc reads. The first
 * reading is taken as soon as ops run and the first decision KG_THREADS_SHORT_MS later (a row of
 * a benchmark, or a short script, is over within a second: a 250 ms wait for the first of two
 * readings left the whole of it at a count the load had already made wrong); after that, every
 * kg_threads_window_ms while ops run. A window in which no op started and this process used
 * under a tenth of a core is not measured: the thread sleeps until the next op wakes it, and the
 * next window starts afresh. The op dispatch only applies the count decided (omp_set_num_threads
 * sets the calling thread's own count). */
static sem_t wake;         /* posted by kg_threads_poll when ops start after a pause */
static _Atomic int parked; /* 1: the measuring thread waits on `wake` */

static void *monitor(void *arg) {
  (void)arg;
  for (;;) {
    kg_cpu_sample s;
    if (!sample(&s)) {
      atomic_store(&tp.adaptive, 0); /* no /proc/stat: keep the count we have */
      tp.no_proc = 1;
      return NULL;
    }
    int ran = atomic_exchange(&tp.active, 0);
    if (tp.have_last) {
      double wall = s.wall_s - tp.last.wall_s, own = wall > 0 ? (s.own_s - tp.last.own_s) / wall : 0;
      /* a window counts if an op started in it or one ran through it (one op can outlast several
       * windows): this process used a tenth of a core or more, which a busy machine that leaves
       * our threads a fraction of a core still shows and a process waiting for input does not;
       * otherwise sleep until the next op */
      if (!ran && own < 0.1) {
        tp.have_last = 0;
        atomic_store(&parked, 1);
        if (!atomic_load(&tp.active)) /* an op between the two loads posts `wake` */
          while (sem_wait(&wake) && errno == EINTR) {
          }
        atomic_store(&parked, 0);
        continue; /* the next reading starts a window */
      }
      double others = kg_threads_others(&tp.last, &s), waiting = wall > 0 ? (s.delay_s - tp.last.delay_s) / wall : 0;
      if (waiting < 0) waiting = 0; /* a thread that exited took its count along */
      atomic_store(&tp.others, others);
      atomic_store(&tp.waiting, waiting);
      if (atomic_load(&tp.adaptive)) {
        tp.st.current = atomic_load(&tp.want);
        kg_threads_step(&tp.st, tp.max, tp.ncpu, others, waiting, wall);
        atomic_store(&tp.want, tp.st.current);
      }
    }
    long ms = tp.have_last ? kg_threads_window_ms(&tp.st) : KG_THREADS_SHORT_MS;
    tp.last = s;
    tp.have_last = 1;
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
  }
  return NULL;
}

void kg_threads_poll(void) {
  if (!tp.current) setup();
  if (tp.no_proc) return;
  if (!atomic_load_explicit(&tp.active, memory_order_relaxed)) {
    atomic_store(&tp.active, 1);
    if (atomic_exchange(&parked, 0)) sem_post(&wake);
  }
  if (!tp.monitor_started) {
    /* a fixed count is measured too (keng.thread_policy reports the load), just never moved;
     * signals stay with the threads that were there */
    tp.monitor_started = 1;
    pthread_t t;
    pthread_attr_t a;
    sigset_t all, old;
    sem_init(&wake, 0, 0);
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&t, &a, monitor, NULL)) tp.no_proc = 1;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
  }
  int want = atomic_load_explicit(&tp.want, memory_order_relaxed);
  if (atomic_load_explicit(&tp.adaptive, memory_order_relaxed) && want != tp.current && !omp_in_parallel()) apply(want);
}

kg_thread_policy kg_get_thread_policy(void) {
  if (!tp.current) setup();
  return (kg_thread_policy){tp.current, tp.max, atomic_load(&tp.adaptive), atomic_load(&tp.others), tp.source,
                            atomic_load(&tp.waiting)};
}
