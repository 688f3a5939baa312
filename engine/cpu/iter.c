/* iter.c — dtype conversion of element runs and the strided N-operand iterator. */
#include "cpu.h"

#include <keng/scalar.h>
#include <omp.h>
#include <string.h>

#define LOAD_CASES(T, dst, src, stride, n)                                                          \
  switch (dt) {                                                                                     \
  case KG_F32: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const float *)src)[i * stride]; break;  \
  case KG_F64: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const double *)src)[i * stride]; break; \
  case KG_BF16:                                                                                     \
    for (int64_t i = 0; i < n; i++) dst[i] = (T)kg_bf16_to_f32(((const uint16_t *)src)[i * stride]); \
    break;                                                                                          \
  case KG_F16:                                                                                      \
    for (int64_t i = 0; i < n; i++) dst[i] = (T)kg_f16_to_f32(((const uint16_t *)src)[i * stride]); \
    break;                                                                                          \
  case KG_I32: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const int32_t *)src)[i * stride]; break; \
  case KG_I64: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const int64_t *)src)[i * stride]; break; \
  case KG_BOOL:                                                                                     \
  case KG_U8: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const uint8_t *)src)[i * stride]; break; \
  default: break;                                                                                   \
  }

void kg_cpu_load_f32(float *dst, const void *src, kg_dtype dt, int64_t stride, int64_t n) {
  if (dt == KG_F32 && stride == 1) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
  LOAD_CASES(float, dst, src, stride, n)
}

void kg_cpu_load_f64(double *dst, const void *src, kg_dtype dt, int64_t stride, int64_t n) {
  LOAD_CASES(double, dst, src, stride, n)
}

/* integer stores truncate toward zero like a C cast (PyTorch does the same); bool is != 0 */
#define STORE_CASES(T, dst, src, stride, n)                                                          \
  switch (dt) {                                                                                      \
  case KG_F32: for (int64_t i = 0; i < n; i++) ((float *)dst)[i * stride] = (float)src[i]; break;     \
  case KG_F64: for (int64_t i = 0; i < n; i++) ((double *)dst)[i * stride] = (double)src[i]; break;   \
  case KG_BF16:                                                                                      \
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = kg_f32_to_bf16((float)src[i]);   \
    break;                                                                                           \
  case KG_F16:                                                                                       \
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = kg_f32_to_f16((float)src[i]);    \
    break;                                                                                           \
  case KG_I32: for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i * stride] = (int32_t)src[i]; break; \
  case KG_I64: for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i * stride] = (int64_t)src[i]; break; \
  case KG_BOOL: for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i * stride] = src[i] != 0; break;    \
  case KG_U8: for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i * stride] = (uint8_t)src[i]; break;  \
  default: break;                                                                                    \
  }

void kg_cpu_store_f32(void *dst, kg_dtype dt, int64_t stride, const float *src, int64_t n) {
  if (dt == KG_F32 && stride == 1) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
  STORE_CASES(float, dst, src, stride, n)
}

void kg_cpu_store_f64(void *dst, kg_dtype dt, int64_t stride, const double *src, int64_t n) {
  STORE_CASES(double, dst, src, stride, n)
}

void kg_broadcast_strides(const kg_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - t->ndim);
    stride[i] = (j < 0 || t->shape[j] == 1) && shape[i] != 1 ? 0 : (j < 0 ? 0 : t->stride[j]);
  }
}

void kg_iter_init(kg_iter *it, int nops, const kg_tensor *const *ts) {
  const kg_tensor *o = ts[0];
  it->nops = nops;
  int nd = 0;
  /* drop size-1 dims, then merge dims that are contiguous in every operand */
  int64_t shape[KG_MAX_DIMS], stride[KG_ITER_MAX][KG_MAX_DIMS], bs[KG_ITER_MAX][KG_MAX_DIMS];
  for (int k = 0; k < nops; k++) {
    kg_broadcast_strides(ts[k], o->ndim, o->shape, bs[k]);
    it->base[k] = (char *)kg_data(ts[k]);
    it->elsize[k] = kg_dtype_info[ts[k]->dtype].size;
  }
  for (int d = 0; d < o->ndim; d++) {
    if (o->shape[d] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int k = 0; k < nops; k++)
        if (stride[k][nd - 1] != bs[k][d] * o->shape[d]) merge = false;
      if (merge) {
        shape[nd - 1] *= o->shape[d];
        for (int k = 0; k < nops; k++) stride[k][nd - 1] = bs[k][d];
        continue;
      }
    }
    shape[nd] = o->shape[d];
    for (int k = 0; k < nops; k++) stride[k][nd] = bs[k][d];
    nd++;
  }
  if (nd == 0) { /* scalar or all size-1 */
    shape[0] = kg_numel(o);
    for (int k = 0; k < nops; k++) stride[k][0] = 1;
    nd = 1;
  }
  it->ndim = nd;
  memcpy(it->shape, shape, sizeof(int64_t) * (size_t)nd);
  for (int k = 0; k < nops; k++) memcpy(it->stride[k], stride[k], sizeof(int64_t) * (size_t)nd);
}

/* runs elements [begin, end) of the flattened iteration space */
static void run_range(const kg_iter *it, kg_iter_fn fn, void *ctx, int64_t begin, int64_t end) {
  int nd = it->ndim, last = nd - 1;
  int64_t idx[KG_MAX_DIMS], rem = begin;
  for (int d = last; d >= 0; d--) {
    idx[d] = rem % it->shape[d];
    rem /= it->shape[d];
  }
  int64_t inner[KG_ITER_MAX];
  for (int k = 0; k < it->nops; k++) inner[k] = it->stride[k][last];
  int64_t pos = begin;
  while (pos < end) {
    char *ptr[KG_ITER_MAX];
    for (int k = 0; k < it->nops; k++) {
      int64_t off = 0;
      for (int d = 0; d < nd; d++) off += idx[d] * it->stride[k][d];
      ptr[k] = it->base[k] + off * it->elsize[k];
    }
    int64_t n = it->shape[last] - idx[last];
    if (n > end - pos) n = end - pos;
    fn(ctx, ptr, inner, n);
    pos += n;
    idx[last] += n;
    for (int d = last; d > 0 && idx[d] >= it->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

void kg_iter_run(const kg_iter *it, kg_iter_fn fn, void *ctx) {
  int64_t total = 1;
  for (int d = 0; d < it->ndim; d++) total *= it->shape[d];
  if (total == 0) return;
  int nt = total >= KG_PAR_THRESHOLD ? kg_num_threads() : 1;
  if (nt <= 1) {
    run_range(it, fn, ctx, 0, total);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t b = total * t / n, e = total * (t + 1) / n;
    run_range(it, fn, ctx, b, e);
  }
}
