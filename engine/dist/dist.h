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

#endif
