/* dist.h — engine/dist's private half: the byte broadcast NCCL's bootstrap uses and the NCCL
 * entry points (nccl.cu, or nccl_stub.c in builds without it). The public API, what
 * lua_bindings/distributed.c calls, is <keng/dist.h>. */
#ifndef KENG_DIST_H
#define KENG_DIST_H

#include <keng/dist.h>

/* A started all-reduce (data-parallel buckets overlap it with the rest of backward). t: any
 * float tensor; no shape check across ranks (the caller's plan is the same on every rank), and
 * every rank must start its works in the same order, as MPI's non-blocking collectives need.
 * The result is in t once kg_dist_wait returned; kg_dist_test lets MPI progress and says whether
 * it is done; kg_dist_wait frees the work (on error too). On cuda the all-reduce is enqueued on
 * the compute stream at the start (stream order is its completion). */
typedef struct kg_dist_work kg_dist_work;
kg_status kg_dist_all_reduce_start(kg_tensor *t, kg_dist_op op, kg_dist_work **work);
kg_status kg_dist_test(kg_dist_work *work, bool *done);
kg_status kg_dist_wait(kg_dist_work *work);

/* Broadcasts n bytes of host memory from root (NCCL's bootstrap uses it). */
kg_status kg_dist_bcast_bytes(void *buf, size_t n, int root);

/* NCCL (nccl.cu, or nccl_stub.c in builds without it). The collective kinds: */
typedef enum { KG_NCCL_ALL_REDUCE, KG_NCCL_BROADCAST, KG_NCCL_ALL_GATHER, KG_NCCL_REDUCE_SCATTER } kg_nccl_kind;
/* in and out contiguous on the same cuda device; runs on keng's compute stream of that device. */
kg_status kg_nccl_run(kg_nccl_kind kind, kg_tensor *out, const kg_tensor *in, kg_dist_op op, int root);

#endif
