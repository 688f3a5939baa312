/* nccl.cu — collectives on cuda tensors through NCCL, on keng's compute stream of the tensor's
 * device (so they order with kernels). One communicator per device, made by kg_dist_setup (data_parallel
 * and tensor_parallel call it when they are set up) or else by the first collective, but never during
 * a CUDA graph capture (ncclCommInitRank cannot be captured: kg_dist_comm_rule): rank 0's
 * ncclUniqueId reaches the others over MPI (kg_dist_bcast_bytes). Each collective enqueued
 * outside a CUDA Graph capture is watched (watchdog.c): an event recorded after it, polled by the
 * watchdog thread; past KENG_DIST_TIMEOUT (or on NCCL's asynchronous error) the communicator is
 * aborted and the process ends. Compiles in every CUDA build; not run on a GPU yet
 * (docs/distributed.md). */
#include "../cuda/cuda.cuh"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dist.h"
}

static ncclComm_t comms[128];

static kg_status nccl_err(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return KG_OK;
  return kg_error(KG_ERR_DEVICE, "distributed", "%s: %s", what, ncclGetErrorString(r));
}

static kg_status comm_for(const char *op, int device, ncclComm_t *out) {
  if (device < 0 || device >= 128) return kg_error(KG_ERR_DEVICE, op, "cuda:%d out of range", device);
  if (!comms[device]) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(kg_cuda_stream(device), &cs) != cudaSuccess) cs = cudaStreamCaptureStatusNone;
    KG_TRY(kg_dist_comm_rule(op, device, false, cs != cudaStreamCaptureStatusNone));
    ncclUniqueId id;
    if (kg_dist_rank() == 0) KG_TRY(nccl_err(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    KG_TRY(kg_dist_bcast_bytes(&id, sizeof id, 0));
    kg_cuda_stream(device); /* makes the device current */
    KG_TRY(nccl_err(ncclCommInitRank(&comms[device], kg_dist_world_size(), id, kg_dist_rank()), "ncclCommInitRank"));
  }
  *out = comms[device];
  return KG_OK;
}

static bool nccl_type(kg_dtype dt, ncclDataType_t *t) {
  switch (dt) {
    case KG_F32: *t = ncclFloat32; return true;
    case KG_F64: *t = ncclFloat64; return true;
    case KG_BF16: *t = ncclBfloat16; return true;
    case KG_F16: *t = ncclFloat16; return true;
    case KG_I32: *t = ncclInt32; return true;
    case KG_I64: *t = ncclInt64; return true;
    case KG_U8: *t = ncclUint8; return true;
    default: return false;
  }
}

extern "C" bool kg_nccl_available(void) { return true; }

extern "C" kg_status kg_nccl_setup(int device) {
  ncclComm_t comm;
  return comm_for("setup", device, &comm);
}

/* ---- the watchdog's view of one collective: an event after it on the stream */

struct watched {
  cudaEvent_t ev;
  ncclComm_t comm;
  int device;
};

/* the event's device made current for a call, the caller's restored after (the watchdog thread
 * and keng's own thread both poll) */
static int use_device(int device) {
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != device) cudaSetDevice(device);
  return prev;
}
static void restore_device(int prev, int device) {
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
}

static int watched_poll(void *ctx, char *why, size_t n) {
  watched *w = (watched *)ctx;
  int prev = use_device(w->device);
  cudaError_t e = cudaEventQuery(w->ev);
  int st = 0;
  ncclResult_t ae = ncclSuccess;
  if (e == cudaSuccess) {
    st = 1;
  } else if (e != cudaErrorNotReady) {
    snprintf(why, n, "%s", cudaGetErrorString(e));
    st = -1;
  } else if (ncclCommGetAsyncError(w->comm, &ae) == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) {
    snprintf(why, n, "%s", ncclGetErrorString(ae));
    st = -1;
  }
  restore_device(prev, w->device);
  return st;
}

/* ends the communicator's kernels (the stream can then drain); the process ends right after */
static void watched_abort(void *ctx) { ncclCommAbort(((watched *)ctx)->comm); }

static void watched_release(void *ctx) {
  watched *w = (watched *)ctx;
  int prev = use_device(w->device);
  cudaEventDestroy(w->ev);
  restore_device(prev, w->device);
  free(w);
}

static kg_watch *watch;

/* after a collective is enqueued on s: watch it (not while s is being captured: a captured
 * collective runs at each replay, where no event of ours follows it) */
static kg_status watch_collective(const char *op, int device, ncclComm_t comm, cudaStream_t s) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return KG_OK;
  if (!watch) {
    watch = kg_watch_new(kg_dist_timeout_s(), NULL, NULL);
    if (!watch) return kg_error(KG_ERR_OOM, "distributed", "no memory for the collective watchdog");
    double every = kg_dist_timeout_s() / 10;
    KG_TRY(kg_watch_start(watch, every < 1 ? every : 1));
  }
  kg_watch_poll(watch); /* retires the finished ones: the table stays short */
  watched *w = (watched *)malloc(sizeof *w);
  if (!w) return kg_error(KG_ERR_OOM, "distributed", "no memory to watch a collective");
  w->comm = comm, w->device = device;
  cudaError_t e = cudaEventCreateWithFlags(&w->ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(w->ev, s);
  if (e != cudaSuccess) {
    free(w);
    return kg_error(KG_ERR_DEVICE, "distributed", "watching an NCCL %s: %s", op, cudaGetErrorString(e));
  }
  kg_watch_entry entry;
  memset(&entry, 0, sizeof entry);
  entry.op = op, entry.device = device, entry.poll = watched_poll, entry.abort = watched_abort;
  entry.release = watched_release, entry.ctx = w;
  return kg_watch_add(watch, &entry);
}

extern "C" kg_status kg_nccl_run(kg_nccl_kind kind, kg_tensor *out, const kg_tensor *in, kg_dist_op op, int root) {
  ncclDataType_t type;
  if (!nccl_type(in->dtype, &type))
    return kg_error(KG_ERR_TYPE, "distributed", "NCCL has no %s type", kg_dtype_info[in->dtype].name);
  ncclRedOp_t rop = op == KG_DIST_AVG ? ncclAvg : op == KG_DIST_MAX ? ncclMax : op == KG_DIST_MIN ? ncclMin : ncclSum;
  int dev = in->device.index;
  static const char *const names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter"};
  const char *name = names[kind];
  ncclComm_t comm = NULL;
  KG_TRY(comm_for(name, dev, &comm));
  cudaStream_t s = kg_cuda_stream(dev);
  void *src = kg_data(in), *dst = kg_data(out);
  size_t n = (size_t)kg_numel(in);
  ncclResult_t r;
  switch (kind) {
    case KG_NCCL_ALL_REDUCE: r = ncclAllReduce(src, dst, n, type, rop, comm, s); break;
    case KG_NCCL_BROADCAST: r = ncclBroadcast(src, dst, n, type, root, comm, s); break;
    case KG_NCCL_ALL_GATHER: r = ncclAllGather(src, dst, n, type, comm, s); break;
    default: r = ncclReduceScatter(src, dst, (size_t)kg_numel(out), type, rop, comm, s); break;
  }
  KG_TRY(nccl_err(r, "NCCL collective"));
  return watch_collective(name, dev, comm, s);
}
