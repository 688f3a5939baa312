/* dist.h — keng.distributed's engine side (engine/dist): processes through MPI, collectives on
 * tensors (MPI for cpu tensors, NCCL for cuda tensors). One process per device; ranks are
 * 0-based, as MPI's. Without a launcher (no mpirun/srun environment) the process is world size
 * 1, MPI is never initialised and every collective is a local copy. */
#ifndef KENG_DIST_PUBLIC_H
#define KENG_DIST_PUBLIC_H

#include <keng/keng.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KG_DIST_SUM, KG_DIST_AVG, KG_DIST_MAX, KG_DIST_MIN } kg_dist_op;

/* Joins the job (MPI_Init when a launcher's variables are present); idempotent. */
kg_status kg_dist_init(void);
bool kg_dist_using_mpi(void); /* true once MPI was initialised by kg_dist_init */
bool kg_dist_mpi_built(void); /* built with MPI (cmake KENG_MPI, libopenmpi-dev) */
int kg_dist_rank(void);
int kg_dist_world_size(void);
int kg_dist_local_rank(void); /* rank among the processes of this node */
kg_status kg_dist_barrier(void);

/* In place on t (any layout: a non-contiguous t goes through a contiguous copy). Every rank's t
 * must have the same shape and dtype: checked first, the error lists each rank's shape. */
kg_status kg_dist_all_reduce(kg_tensor *t, kg_dist_op op);
kg_status kg_dist_broadcast(kg_tensor *t, int root);
/* out: [world_size, ...t.shape], rank r's t at out[r] */
kg_status kg_dist_all_gather(kg_tensor **out, const kg_tensor *t);
/* t: [world_size * n, ...]; out: [n, ...], rank r gets block r of the reduction */
kg_status kg_dist_reduce_scatter(kg_tensor **out, const kg_tensor *t, kg_dist_op op);

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

/* Built with NCCL (cuda collectives go through it; engine/dist/nccl.cu). */
bool kg_nccl_available(void);

/* Makes the job ready for collectives on dev now rather than at the first one: for a cuda device
 * its NCCL communicator, which cannot be made while a CUDA graph is being captured; cpu and meta:
 * nothing. Idempotent. Every rank calls it (each with its own device), as it is a collective. */
kg_status kg_dist_setup(kg_device dev);

#ifdef __cplusplus
}
#endif

#endif
