/* dist.h — engine/dist's private half: the byte broadcast NCCL's bootstrap uses and the NCCL
 * entry points (nccl.cu, or nccl_stub.c in builds without it). The public API, what
 * lua_bindings/distributed.c calls, is <keng/dist.h>. */
#ifndef KENG_DIST_H
#define KENG_DIST_H

#include <keng/dist.h>

/* Broadcasts n bytes of host memory from root (NCCL's bootstrap uses it). */
kg_status kg_dist_bcast_bytes(void *buf, size_t n, int root);

/* NCCL (nccl.cu, or nccl_stub.c in builds without it). The collective kinds: */
typedef enum { KG_NCCL_ALL_REDUCE, KG_NCCL_BROADCAST, KG_NCCL_ALL_GATHER, KG_NCCL_REDUCE_SCATTER } kg_nccl_kind;
/* in and out contiguous on the same cuda device; runs on keng's compute stream of that device. */
kg_status kg_nccl_run(kg_nccl_kind kind, kg_tensor *out, const kg_tensor *in, kg_dist_op op, int root);
/* The communicator of a cuda device, made now if it is not yet (kg_dist_setup). */
kg_status kg_nccl_setup(int device);
/* May `op` on cuda:device go ahead? Making a missing communicator (ncclCommInitRank, a collective
 * of its own, outside any stream) cannot happen while the device's stream is being captured into
 * a CUDA graph: then an error that says to call setup first. Plain C, so the CPU tests check it. */
kg_status kg_dist_comm_rule(const char *op, int device, bool have_comm, bool capturing);

/* Seconds a collective may wait for the other ranks (KENG_DIST_TIMEOUT, default 1800). */
double kg_dist_timeout_s(void);

/* The watchdog of collectives in flight on a stream (watchdog.c): one entry per collective. */
typedef struct {
  const char *op; /* "all_reduce", ... (a static string) */
  int device;
  double start; /* set by kg_watch_add, on the watch's clock */
  /* 1: finished; 0: still running; -1: failed (why: the reason) */
  int (*poll)(void *ctx, char *why, size_t n);
  void (*abort)(void *ctx);   /* on expiry, before fatal (NULL: nothing to abort) */
  void (*release)(void *ctx); /* when the entry leaves the table (NULL: nothing) */
  void *ctx;
} kg_watch_entry;
typedef struct kg_watch kg_watch;
/* clock NULL: CLOCK_MONOTONIC seconds; fatal NULL: print the message and _exit(1) */
kg_watch *kg_watch_new(double timeout_s, double (*clock)(void), void (*fatal)(const char *msg));
kg_status kg_watch_add(kg_watch *w, const kg_watch_entry *entry);
/* Retires the finished entries; expires those running longer than the timeout or failed (abort,
 * then fatal with the reason). Returns how many expired. */
int kg_watch_poll(kg_watch *w);
int kg_watch_pending(kg_watch *w);
/* A thread that polls every interval_s seconds (until kg_watch_free). */
kg_status kg_watch_start(kg_watch *w, double interval_s);
void kg_watch_free(kg_watch *w);

#endif
