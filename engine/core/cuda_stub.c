/* cuda_stub.c — the CUDA runtime entry points when keng is built without CUDA. */
#include "internal.h"
#include "../ops/sdpa_route.h"

bool kg_cuda_available(void) { return false; }
int kg_cuda_device_count(void) { return 0; }
void *kg_cuda_malloc(size_t nbytes, int device) {
  (void)nbytes;
  (void)device;
  kg_error(KG_ERR_DEVICE, "cuda", "keng was built without CUDA");
  return NULL;
}
kg_status kg_cuda_alloc(void **out, size_t nbytes, int device) {
  (void)nbytes;
  (void)device;
  *out = NULL;
  return kg_error(KG_ERR_DEVICE, "cuda", "keng was built without CUDA");
}
kg_memory_stats kg_cuda_memory_stats(int device) {
  (void)device;
  return (kg_memory_stats){0};
}
void kg_cuda_empty_cache(int device) { (void)device; }
void kg_cuda_reset_peak(int device) { (void)device; }
void kg_cuda_free(void *p, int device) {
  (void)p;
  (void)device;
}
kg_status kg_cuda_memcpy(void *dst, kg_device ddev, const void *src, kg_device sdev, size_t n) {
  (void)dst; (void)ddev; (void)src; (void)sdev; (void)n;
  return kg_error(KG_ERR_DEVICE, "cuda", "keng was built without CUDA");
}
kg_status kg_cuda_sync(int device) {
  (void)device;
  return KG_OK;
}
kg_status kg_cuda_graph_begin(int device) {
  (void)device;
  return kg_error(KG_ERR_DEVICE, "cuda.graph", "keng was built without CUDA");
}
kg_status kg_cuda_graph_end(int device, kg_cuda_graph **out) {
  (void)device;
  *out = NULL;
  return kg_error(KG_ERR_DEVICE, "cuda.graph", "keng was built without CUDA");
}
kg_status kg_cuda_graph_launch(kg_cuda_graph *g) {
  (void)g;
  return kg_error(KG_ERR_DEVICE, "cuda.graph", "keng was built without CUDA");
}
void kg_cuda_graph_free(kg_cuda_graph *g) { (void)g; }
bool kg_cuda_capturing(int device) {
  (void)device;
  return false;
}
bool kg_cuda_deferring(int device) {
  (void)device;
  return false;
}
kg_status kg_cuda_defer_checks(int device, bool on, bool *was) {
  (void)device;
  (void)on;
  if (was) *was = false;
  return KG_OK;
}
void kg_cuda_sdpa_caps(int device, int *sm, int *cudnn_version, int64_t *smem) {
  (void)device;
  *sm = 0, *cudnn_version = 0, *smem = 0;
}
