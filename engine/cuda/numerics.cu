/* numerics.cu — the device half of the numerics guard (keng.debug.check_numerics, KENG_CHECK_NUMERICS):
 * counts the NaN and Inf values of a float tensor on cuda (any strides) and the flat index of the
 * first one, with one grid-stride pass and three atomics, then copies the three numbers back (a
 * synchronisation: the guard is a debugging aid). engine/core/dispatch.c calls it after every
 * cuda op while the guard is on, except during a CUDA Graph capture (nothing runs then). */
#include "util.cuh"

#include <limits.h>

/* 0 finite, 1 inf, 2 nan, from the bits (as engine/core/dispatch.c's nonfinite) */
__device__ __forceinline__ int classify(const char *base, int dt, int64_t off) {
  switch (dt) {
  case KG_F32: {
    uint32_t b = ((const uint32_t *)base)[off];
    return (b & 0x7F800000u) != 0x7F800000u ? 0 : (b & 0x007FFFFFu) ? 2 : 1;
  }
  case KG_F64: {
    unsigned long long b = ((const unsigned long long *)base)[off];
    return (b & 0x7FF0000000000000ull) != 0x7FF0000000000000ull ? 0 : (b & 0x000FFFFFFFFFFFFFull) ? 2 : 1;
  }
  case KG_BF16: {
    uint16_t b = ((const uint16_t *)base)[off];
    return (b & 0x7F80u) != 0x7F80u ? 0 : (b & 0x007Fu) ? 2 : 1;
  }
  case KG_F16: {
    uint16_t b = ((const uint16_t *)base)[off];
    return (b & 0x7C00u) != 0x7C00u ? 0 : (b & 0x03FFu) ? 2 : 1;
  }
  default: return 0;
  }
}

/* out[0] NaN count, out[1] Inf count, out[2] first bad flat index (LLONG_MAX when none) */
__global__ void scan_kernel(kg_cuda_iter it, int64_t n, unsigned long long *counts, long long *first) {
  unsigned long long nan = 0, inf = 0;
  long long lo = LLONG_MAX;
  KG_CUDA_FOR(i, n) {
    int64_t off[1];
    kg_cuda_offsets<1>(it, i, off);
    int c = classify(it.base[0], it.dt[0], off[0]);
    if (c) {
      if (c == 2) nan++;
      else inf++;
      if (i < lo) lo = i;
    }
  }
  if (nan) atomicAdd(&counts[0], nan);
  if (inf) atomicAdd(&counts[1], inf);
  if (lo != LLONG_MAX) atomicMin(first, lo);
}

extern "C" kg_status kg_cuda_scan_numerics(const kg_tensor *t, int64_t *nan, int64_t *inf, int64_t *first) {
  *nan = *inf = 0, *first = -1;
  int64_t n = kg_numel(t);
  if (!n || !kg_dtype_info[t->dtype].is_float) return KG_OK;
  int dev = t->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  kg_cuda_buf buf;
  KG_TRY(buf.alloc(3 * sizeof(long long), dev, "check_numerics"));
  unsigned long long *counts = (unsigned long long *)buf.p;
  long long *lo = (long long *)buf.p + 2;
  KG_TRY(kg_cuda_err(cudaMemsetAsync(counts, 0, 2 * sizeof(long long), s), "check_numerics", "memset"));
  KG_TRY(kg_cuda_err(cudaMemsetAsync(lo, 0x7F, sizeof(long long), s), "check_numerics", "memset"));
  kg_cuda_iter it;
  kg_cuda_iter_init(&it, 1, &t);
  scan_kernel<<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(it, n, counts, lo);
  KG_TRY(kg_cuda_check("check_numerics", dev));
  long long host[3];
  kg_device cpu = {KG_DEV_CPU, 0};
  KG_TRY(kg_cuda_memcpy(host, cpu, buf.p, t->device, sizeof host));
  *nan = host[0], *inf = host[1];
  if (host[0] || host[1]) *first = host[2];
  return KG_OK;
}
