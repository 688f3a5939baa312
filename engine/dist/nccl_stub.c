/* nccl_stub.c — builds without NCCL (no CUDA): cuda collectives report that NCCL is missing. */
#include "dist.h"

bool kg_nccl_available(void) { return false; }

kg_status kg_nccl_run(kg_nccl_kind kind, kg_tensor *out, const kg_tensor *in, kg_dist_op op, int root) {
  (void)kind, (void)out, (void)in, (void)op, (void)root;
  return kg_error(KG_ERR_DEVICE, "distributed", "this keng was built without NCCL");
}

kg_status kg_nccl_setup(int device) {
  (void)device;
  return kg_error(KG_ERR_DEVICE, "setup", "this keng was built without NCCL");
}
