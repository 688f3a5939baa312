/* watchdog.c — the timeout of collectives the host does not wait for (NCCL's, enqueued on a
 * stream: a rank that never joins leaves the others' kernels spinning, and the host hangs in its
 * next synchronisation, outside keng.distributed). A table of those in flight, polled by the
 * caller (each new NCCL collective retires the finished ones) and by a thread; one that has not
 * finished after the timeout (KENG_DIST_TIMEOUT), or reports an error, is expired: its abort
 * callback runs (ncclCommAbort, which ends the kernels) and then the fatal callback, which by
 * default prints the reason and ends the process, so the launcher ends the job — the end the
 * cpu collectives' timeout also leads to. Plain C with injected clock and callbacks:
 * tests/c/test_dist_watchdog.c drives it with fake collectives. */
#include "dist.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kg_watch {
  pthread_mutex_t mu;
  kg_watch_entry *e;
  int n, cap;
  double timeout_s;
  double (*clock)(void);
  void (*fatal)(const char *msg);
  pthread_t thread;
  bool running, stop;
  double interval_s;
};

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The default end: the reason on stderr, then _exit — not exit(): this may run on the watchdog
 * thread, and exit handlers (MPI_Finalize) must not run there nor wait for the hung stream. */
static void end_process(const char *msg) {
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
  _exit(1);
}

kg_watch *kg_watch_new(double timeout_s, double (*clock)(void), void (*fatal)(const char *msg)) {
  kg_watch *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  pthread_mutex_init(&w->mu, NULL);
  w->timeout_s = timeout_s;
  w->clock = clock ? clock : monotonic_s;
  w->fatal = fatal ? fatal : end_process;
  return w;
}

kg_status kg_watch_add(kg_watch *w, const kg_watch_entry *entry) {
  pthread_mutex_lock(&w->mu);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    kg_watch_entry *e = realloc(w->e, sizeof *e * (size_t)cap);
    if (!e) {
      pthread_mutex_unlock(&w->mu);
      return kg_error(KG_ERR_OOM, "distributed", "no memory for the collective watchdog's table");
    }
    w->e = e, w->cap = cap;
  }
  w->e[w->n] = *entry;
  w->e[w->n].start = w->clock();
  w->n++;
  pthread_mutex_unlock(&w->mu);
  return KG_OK;
}

int kg_watch_poll(kg_watch *w) {
  int expired = 0;
  pthread_mutex_lock(&w->mu);
  double now = w->clock();
  int kept = 0;
  for (int i = 0; i < w->n; i++) {
    kg_watch_entry *e = &w->e[i];
    char why[256] = "";
    int st = e->poll ? e->poll(e->ctx, why, sizeof why) : 1;
    if (st == 0 && now - e->start <= w->timeout_s) {
      w->e[kept++] = *e;
      continue;
    }
    char msg[512];
    if (st == 1) {
      msg[0] = 0;
    } else {
      if (e->abort) e->abort(e->ctx);
      if (st < 0)
        snprintf(msg, sizeof msg, "keng.distributed: rank %d: NCCL %s on cuda:%d failed: %s; communicator aborted",
                 kg_dist_rank(), e->op, e->device, why[0] ? why : "unknown error");
      else
        snprintf(msg, sizeof msg,
                 "keng.distributed: rank %d: NCCL %s on cuda:%d did not finish within %g s (KENG_DIST_TIMEOUT); "
                 "communicator aborted",
                 kg_dist_rank(), e->op, e->device, w->timeout_s);
      expired++;
    }
    if (e->release) e->release(e->ctx);
    if (msg[0]) w->fatal(msg); /* by default does not return */
  }
  w->n = kept;
  pthread_mutex_unlock(&w->mu);
  return expired;
}

int kg_watch_pending(kg_watch *w) {
  pthread_mutex_lock(&w->mu);
  int n = w->n;
  pthread_mutex_unlock(&w->mu);
  return n;
}

static void *watch_thread(void *arg) {
  kg_watch *w = arg;
  long ns = (long)(w->interval_s * 1e9);
  for (;;) {
    pthread_mutex_lock(&w->mu);
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    if (stop) return NULL;
    kg_watch_poll(w);
    nanosleep(&(struct timespec){ns / 1000000000L, ns % 1000000000L}, NULL);
  }
}

kg_status kg_watch_start(kg_watch *w, double interval_s) {
  if (w->running) return KG_OK;
  w->interval_s = interval_s > 0 ? interval_s : 0.1;
  if (pthread_create(&w->thread, NULL, watch_thread, w) != 0)
    return kg_error(KG_ERR_VALUE, "distributed", "could not start the collective watchdog thread");
  w->running = true;
  return KG_OK;
}

void kg_watch_free(kg_watch *w) {
  if (!w) return;
  if (w->running) {
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
  }
  for (int i = 0; i < w->n; i++)
    if (w->e[i].release) w->e[i].release(w->e[i].ctx);
  free(w->e);
  pthread_mutex_destroy(&w->mu);
  free(w);
}
