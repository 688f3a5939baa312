/* nccl.cu — collectives on cuda tensors through NCCL, on keng's compute stream of the tensor's
 * device (so they order with kernels). One communicator per device, made on first use: rank 0's
 * ncclUniqueId reaches the others over MPI (kg_dist_bcast_bytes). Compiles in every CUDA build;
 * not run on a GPU yet (docs/distributed.md). */
#include "../cuda/cuda.cuh"

#include <nccl.h>

extern "C" {
#include "dist.h"
}

static ncclComm_t comms[128];

static kg_status nccl_err(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return KG_OK;
  return kg_error(KG_ERR_DEVICE, "distributed", "%s: %s", what, ncclGetErrorString(r));
}

static kg_status comm_for(int device, ncclComm_t *out) {
  if (device < 0 || device >= 128) return kg_error(KG_ERR_DEVICE, "distributed", "cuda:%d out of range", device);
  if (!comms[device]) {
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

extern "C" kg_status kg_nccl_run(kg_nccl_kind kind, kg_tensor *out, const kg_tensor *in, kg_dist_op op, int root) {
  ncclDataType_t type;
  if (!nccl_type(in->dtype, &type))
    return kg_error(KG_ERR_TYPE, "distributed", "NCCL has no %s type", kg_dtype_info[in->dtype].name);
  ncclRedOp_t rop = op == KG_DIST_AVG ? ncclAvg : op == KG_DIST_MAX ? ncclMax : op == KG_DIST_MIN ? ncclMin : ncclSum;
  int dev = in->device.index;
  ncclComm_t comm = NULL;
  KG_TRY(comm_for(dev, &comm));
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
  return nccl_err(r, "NCCL collective");
}
