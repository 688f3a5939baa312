/* pool.c — keng's own parallel-for: dynamic handout, so a busy machine costs a share, not a stall.
 *
 * An OpenMP region with a static split waits at its end for every thread of its team; when
 * another process holds one of the cores, the thread on that core is parked for a scheduler
 * slice (milliseconds) and every region (tens of microseconds) waits for it. Here the caller
 * publishes a loop of n chunks and takes chunks itself from one atomic counter, as do the
 * workers that wake; a worker that wakes late finds fewer chunks (or none) left, and the caller
 * waits only for chunks already being run. So the second thread contributes whatever share of
 * the busy core it gets (docs/kernels.md, "Threads under load").
 *
 * The counter packs the loop's generation (high 32 bits) with the next chunk (low 32): a worker
 * claims chunk i of loop g by a compare-and-swap from (g, i) to (g, i + 1), so a worker still
 * holding a finished loop's description can never claim anything of the next one. The loop's
 * fields are rewritten only after all its chunks are claimed and done; a worker reads them
 * between loading (g, i) and its swap, which then fails if they changed (a seqlock).
 *
 * Waiting: idle workers spin for KENG_POOL_SPIN_US (the gap between two ops' loops is often
 * shorter; a spin on a core another process wants costs that process only this much), then
 * sleep on a futex. The caller, out of chunks, spins KENG_POOL_WAIT_US for the ones others run
 * (its core is its own; asleep, it would queue behind whatever took the core when it woke), then
 * sleeps. A loop gets at most one thread per core of the process's affinity mask: a thread more
 * would share a core, and the chunk it holds while the other one runs would hold the loop up
 * (4 threads on the 2-core machine: 3-4x slower products).
 *
 * Placement: a worker woken by a futex from the caller's core is placed by Linux on the waker's
 * core when no core is idle (wake-affine), i.e. exactly when another process keeps a core busy:
 * the worker then only runs while the caller waits, and the caller waits for its chunks. So the
 * workers' affinity leaves out the core the caller runs on (set again when the caller moves;
 * with one core allowed nothing is changed). Measured on the 2-core machine with the other
 * sessions' load: worker chunks 0.25 ms instead of 0.57 ms on average (docs/kernels.md). */
#define _GNU_SOURCE 1
#include "pool.h"

#include "internal.h"

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define POOL_MAX_WORKERS 255

static struct {
  _Atomic uint64_t claim;      /* (generation << 32) | next chunk */
  _Atomic(kg_chunk_fn) fn;     /* the current loop (valid while its chunks are unclaimed) */
  _Atomic(void *) ctx;
  _Atomic int64_t n;
  _Atomic int nt;              /* workers with id < nt - 1 join */
  _Atomic uint32_t done;       /* chunks of the current loop finished (a futex word) */
  _Atomic int err;             /* first nonzero code of the current loop */
  _Atomic int caller_sleeping; /* the caller waits on `done` */
  _Atomic uint32_t wake;       /* bumped per loop: idle workers sleep on it (a futex word) */
  _Atomic int sleepers;        /* workers asleep on `wake` */
  pthread_mutex_t busy;        /* one loop at a time; others run inline */
  pthread_mutex_t grow;        /* starting workers */
  _Atomic int workers;         /* started */
  _Atomic pid_t tid[POOL_MAX_WORKERS];
  cpu_set_t mask; /* the process's affinity when the pool started */
  int have_mask, off_cpu;      /* off_cpu: the core the workers' affinity leaves out (-1: none) */
  long spin_ns, wait_ns;
  int ncpu;                    /* cores in the affinity mask: the most threads a loop gets */
  _Atomic int64_t parallel, inline_runs, worker_chunks, long_waits, long_wait_ns;
} P = {.busy = PTHREAD_MUTEX_INITIALIZER, .grow = PTHREAD_MUTEX_INITIALIZER, .off_cpu = -1};

static _Thread_local int in_chunk;  /* this thread runs a chunk (nested loops run inline) */
static _Thread_local int is_worker;

static void futex_wait(_Atomic uint32_t *w, uint32_t v) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *w, int n) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0); }

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* claims and runs chunks of loop `gen` until none is left; returns the number run */
static int64_t run_chunks(uint32_t gen) {
  int64_t ran = 0;
  for (;;) {
    uint64_t c = atomic_load_explicit(&P.claim, memory_order_acquire);
    if ((uint32_t)(c >> 32) != gen) return ran;
    kg_chunk_fn fn = atomic_load_explicit(&P.fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&P.ctx, memory_order_relaxed);
    int64_t n = atomic_load_explicit(&P.n, memory_order_relaxed);
    int64_t i = (int64_t)(uint32_t)c;
    if (i >= n) return ran;
    if (!atomic_compare_exchange_weak_explicit(&P.claim, &c, c + 1, memory_order_acq_rel, memory_order_relaxed))
      continue;
    /* chunk i is ours: the loop cannot finish (nor its fields change) until it is done */
    if (!atomic_load_explicit(&P.err, memory_order_relaxed)) {
      in_chunk = 1;
      int e = fn(ctx, i);
      in_chunk = 0;
      int zero = 0;
      if (e) atomic_compare_exchange_strong(&P.err, &zero, e);
    }
    ran++;
    /* seq_cst against the caller's store of caller_sleeping and load of done */
    if (atomic_fetch_add(&P.done, 1) + 1 == (uint32_t)n && atomic_load(&P.caller_sleeping)) futex_wake(&P.done, 1);
  }
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  is_worker = 1;
  omp_set_num_threads(1); /* an OpenMP region inside a chunk stays on this thread */
  atomic_store(&P.tid[id], (pid_t)syscall(SYS_gettid));
  uint32_t seen = 0; /* the `wake` value of the last loop looked at */
  for (;;) {
    uint32_t w = atomic_load(&P.wake);
    if (w == seen) {
      /* no new loop: spin a while, then sleep until the next one is published */
      long until = now_ns() + P.spin_ns;
      int k = 0;
      while ((w = atomic_load_explicit(&P.wake, memory_order_acquire)) == seen) {
        cpu_relax();
        if (++k % 64 == 0 && now_ns() >= until) break;
      }
      if (w == seen) {
        atomic_fetch_add(&P.sleepers, 1);
        if (atomic_load(&P.wake) == seen) futex_wait(&P.wake, seen);
        atomic_fetch_sub(&P.sleepers, 1);
        continue;
      }
    }
    seen = w;
    if (id >= atomic_load_explicit(&P.nt, memory_order_relaxed) - 1) continue; /* not wanted this loop */
    uint64_t c = atomic_load_explicit(&P.claim, memory_order_acquire);
    int64_t ran = run_chunks((uint32_t)(c >> 32));
    if (ran) atomic_fetch_add_explicit(&P.worker_chunks, ran, memory_order_relaxed);
  }
  return NULL;
}

/* the settings, once (under P.busy) */
static void init(void) {
  P.spin_ns = (long)(kg_env_float(KG_ENV_KENG_POOL_SPIN_US) * 1e3);
  P.wait_ns = (long)(kg_env_float(KG_ENV_KENG_POOL_WAIT_US) * 1e3);
  P.have_mask = !sched_getaffinity(0, sizeof P.mask, &P.mask);
  P.ncpu = P.have_mask ? CPU_COUNT(&P.mask) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (P.ncpu < 1) P.ncpu = 1;
}

/* starts workers up to `want` (fewer if the system refuses threads); under P.busy */
static int ensure_workers(int want) {
  if (want > POOL_MAX_WORKERS) want = POOL_MAX_WORKERS;
  int have = atomic_load(&P.workers);
  if (have >= want) return have;
  pthread_mutex_lock(&P.grow);
  while ((have = atomic_load(&P.workers)) < want) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    /* signals stay with the threads that were there: none is delivered to a worker */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&t, &a, worker, (void *)(intptr_t)have);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    if (e) break;
    while (!atomic_load(&P.tid[have])) cpu_relax(); /* its id, for the affinity below */
    atomic_store(&P.workers, have + 1);
    P.off_cpu = -1; /* the new worker's affinity is set with the next loop */
  }
  pthread_mutex_unlock(&P.grow);
  return atomic_load(&P.workers);
}

/* the workers' affinity: every core the process may use but the caller's (see the top) */
static void keep_off_caller_core(void) {
  int cpu = sched_getcpu(); /* a few ns (vDSO) */
  if (cpu == P.off_cpu || cpu < 0 || cpu >= CPU_SETSIZE || !P.have_mask) return;
  P.off_cpu = cpu;
  cpu_set_t m = P.mask;
  CPU_CLR(cpu, &m);
  if (!CPU_COUNT(&m)) m = P.mask;
  for (int i = 0; i < atomic_load(&P.workers); i++) sched_setaffinity(atomic_load(&P.tid[i]), sizeof m, &m);
}

static int run_inline(int64_t n, kg_chunk_fn fn, void *ctx) {
  atomic_fetch_add_explicit(&P.inline_runs, 1, memory_order_relaxed);
  int saved = in_chunk;
  in_chunk = 1;
  int e = 0;
  for (int64_t i = 0; i < n && !e; i++) e = fn(ctx, i);
  in_chunk = saved;
  return e;
}

int kg_pool_nested(void) { return in_chunk || omp_in_parallel(); }

int kg_parallel_for(int64_t n, int nt, kg_chunk_fn fn, void *ctx) {
  if (n <= 0) return 0;
  if (nt <= 0) nt = kg_num_threads();
  if (nt > n) nt = (int)n;
  if (n > UINT32_MAX - 1 || nt <= 1 || in_chunk || is_worker || omp_in_parallel()) return run_inline(n, fn, ctx);
  if (pthread_mutex_trylock(&P.busy)) return run_inline(n, fn, ctx); /* another thread's loop */
  if (!P.ncpu) init();
  if (nt > P.ncpu) nt = P.ncpu;
  int have = nt > 1 ? ensure_workers(nt - 1) : 0;
  if (have < nt - 1) nt = have + 1;
  if (nt <= 1) {
    pthread_mutex_unlock(&P.busy);
    return run_inline(n, fn, ctx);
  }
  atomic_fetch_add_explicit(&P.parallel, 1, memory_order_relaxed);
  keep_off_caller_core();

  /* publish: the fields, then the new generation with chunk 0 (release), then wake the sleepers */
  uint32_t gen = (uint32_t)(atomic_load_explicit(&P.claim, memory_order_relaxed) >> 32) + 1;
  atomic_store_explicit(&P.fn, fn, memory_order_relaxed);
  atomic_store_explicit(&P.ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&P.n, n, memory_order_relaxed);
  atomic_store_explicit(&P.nt, nt, memory_order_relaxed);
  atomic_store_explicit(&P.done, 0, memory_order_relaxed);
  atomic_store_explicit(&P.err, 0, memory_order_relaxed);
  atomic_store_explicit(&P.claim, (uint64_t)gen << 32, memory_order_release);
  atomic_fetch_add(&P.wake, 1);
  if (atomic_load(&P.sleepers) > 0) futex_wake(&P.wake, INT_MAX);

  run_chunks(gen);

  /* the chunks others still run: spin a while, then sleep */
  long t0 = now_ns(), until = t0 + P.wait_ns;
  int k = 0;
  while (atomic_load_explicit(&P.done, memory_order_acquire) < (uint32_t)n) {
    if (++k % 64 == 0 && now_ns() >= until) {
      uint32_t d;
      atomic_store(&P.caller_sleeping, 1);
      while ((d = atomic_load(&P.done)) < (uint32_t)n) futex_wait(&P.done, d);
      atomic_store(&P.caller_sleeping, 0);
      break;
    }
    cpu_relax();
  }
  long waited = now_ns() - t0;
  if (waited > 100000) {
    atomic_fetch_add_explicit(&P.long_waits, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&P.long_wait_ns, waited, memory_order_relaxed);
  }
  atomic_thread_fence(memory_order_acquire); /* the chunks' writes */
  int e = atomic_load(&P.err);
  pthread_mutex_unlock(&P.busy);
  return e;
}

kg_pool_stats kg_pool_get_stats(void) {
  return (kg_pool_stats){atomic_load(&P.parallel),  atomic_load(&P.inline_runs), atomic_load(&P.worker_chunks),
                         atomic_load(&P.workers),   atomic_load(&P.long_waits),  atomic_load(&P.long_wait_ns)};
}
