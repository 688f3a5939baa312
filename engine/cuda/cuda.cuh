/* cuda.cuh — shared pieces of the CUDA backend (the .cu files beside it): the per-device compute
 * stream, launch checks (KENG_SYNC), storage types and their conversions, the dtype dispatch
 * macro, and the strided iterator that kernels use to find each operand's element.
 *
 * Storage types: float, double, kg_bf16 / kg_f16 (uint16_t bits), int32_t, int64_t, kg_bool
 * and uint8_t. Kernels compute in float (double for f64 and integer operands, as the CPU
 * kernels do) with the formulas of keng/scalar.h, so both backends run the same arithmetic.
 */
#ifndef KENG_CUDA_CUH
#define KENG_CUDA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../core/internal.h"
}
#include <keng/scalar.h>

/* ---- runtime (runtime.cu) ------------------------------------------------------------------ */

/* Makes `device` current and returns its compute stream (created on first use). */
cudaStream_t kg_cuda_stream(int device);
/* After a launch: fails with the CUDA error naming `op`; with KENG_SYNC=1 also waits for the
 * kernel so that a fault is reported by the op that caused it. */
kg_status kg_cuda_check(const char *op, int device);
/* Turns a CUDA error into a kg_error naming op (KG_OK for cudaSuccess). */
kg_status kg_cuda_err(cudaError_t e, const char *op, const char *what);

/* The Philox key of a random kernel: (seed, offset) by value, or — while a CUDA Graph is being
 * captured — an offset relative to the capture's start plus a device buffer holding the
 * (seed, base offset) that each launch of the graph writes first, so replays draw new numbers. */
struct kg_cuda_rng {
  uint64_t seed, offset;
  const uint64_t *dev; /* NULL outside capture */
};
kg_cuda_rng kg_cuda_rng_key(kg_philox_state st, int device);
__device__ __forceinline__ void kg_rng_load(const kg_cuda_rng &r, uint64_t &seed, uint64_t &offset) {
  if (r.dev) {
    seed = r.dev[0];
    offset = r.dev[1] + r.offset;
  } else {
    seed = r.seed;
    offset = r.offset;
  }
}

/* grid-stride launch shape for n elements */
#define KG_CUDA_THREADS 256
static inline unsigned kg_cuda_blocks(int64_t n) {
  int64_t b = (n + KG_CUDA_THREADS - 1) / KG_CUDA_THREADS;
  return (unsigned)(b < 1 ? 1 : b > 262144 ? 262144 : b);
}
#define KG_CUDA_FOR(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- storage types ---------------------------------------------------------------------- */

struct kg_bf16 { uint16_t bits; };
struct kg_f16 { uint16_t bits; };
struct kg_bool { uint8_t v; };

/* value of one stored element, as its compute type (float, or double for wide types) */
__device__ __forceinline__ float kg_get(const float *p) { return *p; }
__device__ __forceinline__ double kg_get(const double *p) { return *p; }
__device__ __forceinline__ float kg_get(const kg_bf16 *p) { return kg_bf16_to_f32(p->bits); }
__device__ __forceinline__ float kg_get(const kg_f16 *p) { return kg_f16_to_f32(p->bits); }
__device__ __forceinline__ double kg_get(const int32_t *p) { return (double)*p; }
__device__ __forceinline__ double kg_get(const int64_t *p) { return (double)*p; }
__device__ __forceinline__ float kg_get(const kg_bool *p) { return (float)p->v; }
__device__ __forceinline__ float kg_get(const uint8_t *p) { return (float)*p; }
__device__ __forceinline__ float kg_get(const int8_t *p) { return (float)*p; }

/* stores v (float or double) rounded as the CPU stores do: bf16/f16 through f32, nearest even;
 * integers truncate toward zero; bool is v != 0 */
template <class A> __device__ __forceinline__ void kg_put(float *p, A v) { *p = (float)v; }
template <class A> __device__ __forceinline__ void kg_put(double *p, A v) { *p = (double)v; }
template <class A> __device__ __forceinline__ void kg_put(kg_bf16 *p, A v) { p->bits = kg_f32_to_bf16((float)v); }
template <class A> __device__ __forceinline__ void kg_put(kg_f16 *p, A v) { p->bits = kg_f32_to_f16((float)v); }
template <class A> __device__ __forceinline__ void kg_put(int32_t *p, A v) { *p = (int32_t)v; }
template <class A> __device__ __forceinline__ void kg_put(int64_t *p, A v) { *p = (int64_t)v; }
template <class A> __device__ __forceinline__ void kg_put(kg_bool *p, A v) { p->v = v != 0; }
template <class A> __device__ __forceinline__ void kg_put(uint8_t *p, A v) { *p = (uint8_t)v; }
template <class A> __device__ __forceinline__ void kg_put(int8_t *p, A v) { *p = (int8_t)(int)v; }

/* element `off` of an operand whose dtype is only known at run time, as compute type A */
template <class A> __device__ __forceinline__ A kg_load(const char *base, int dt, int64_t off) {
  switch (dt) {
  case KG_F32: return (A)((const float *)base)[off];
  case KG_F64: return (A)((const double *)base)[off];
  case KG_BF16: return (A)kg_bf16_to_f32(((const uint16_t *)base)[off]);
  case KG_F16: return (A)kg_f16_to_f32(((const uint16_t *)base)[off]);
  case KG_I32: return (A)((const int32_t *)base)[off];
  case KG_I64: return (A)((const int64_t *)base)[off];
  case KG_I8: return (A)((const int8_t *)base)[off];
  default: return (A)((const uint8_t *)base)[off]; /* bool, u8 */
  }
}

/* Compute in double for f64 and integers (exact to 2^53), float otherwise (as cpu.h). */
static inline bool kg_cuda_wide(kg_dtype dt) { return dt == KG_F64 || dt == KG_I64 || dt == KG_I32; }

/* The one dispatch: runs the statements with S typedef'd to dt's storage type. */
#define KG_CUDA_DISPATCH(op, dt, S, ...)                                                      \
  switch (dt) {                                                                               \
  case KG_F32: { typedef float S; __VA_ARGS__; } break;                                       \
  case KG_F64: { typedef double S; __VA_ARGS__; } break;                                      \
  case KG_BF16: { typedef kg_bf16 S; __VA_ARGS__; } break;                                    \
  case KG_F16: { typedef kg_f16 S; __VA_ARGS__; } break;                                      \
  case KG_I32: { typedef int32_t S; __VA_ARGS__; } break;                                     \
  case KG_I64: { typedef int64_t S; __VA_ARGS__; } break;                                     \
  case KG_BOOL: { typedef kg_bool S; __VA_ARGS__; } break;                                    \
  case KG_U8: { typedef uint8_t S; __VA_ARGS__; } break;                                      \
  case KG_I8: { typedef int8_t S; __VA_ARGS__; } break;                                       \
  default: return kg_error(KG_ERR_TYPE, op, "dtype %d not supported on cuda", (int)(dt));    \
  }

/* ---- strided iterator: operand 0 (the output) defines the shape, others broadcast --------- */

#define KG_CUDA_MAX_OPS 4
struct kg_cuda_iter {
  int ndim, nops;
  bool contig; /* every operand is dense in the output's order: offset = linear index */
  int64_t shape[KG_MAX_DIMS];
  int64_t stride[KG_CUDA_MAX_OPS][KG_MAX_DIMS];
  char *base[KG_CUDA_MAX_OPS];
  int dt[KG_CUDA_MAX_OPS];
};

/* Drops size-1 dims and merges dims that are contiguous in every operand; the linear index
 * of the result still walks the output in row-major order. */
static inline void kg_cuda_iter_init(kg_cuda_iter *it, int nops, const kg_tensor *const *ts) {
  const kg_tensor *o = ts[0];
  int64_t bs[KG_CUDA_MAX_OPS][KG_MAX_DIMS];
  it->nops = nops;
  it->ndim = 0;
  for (int k = 0; k < nops; k++) {
    const kg_tensor *t = ts[k];
    for (int i = 0; i < o->ndim; i++) {
      int j = i - (o->ndim - t->ndim);
      bs[k][i] = (j < 0 || t->shape[j] == 1) ? 0 : t->stride[j];
    }
    it->base[k] = (char *)kg_data(t);
    it->dt[k] = t->dtype;
  }
  for (int d = 0; d < o->ndim; d++) {
    if (o->shape[d] == 1) continue;
    int n = it->ndim;
    bool merge = n > 0;
    for (int k = 0; merge && k < nops; k++) merge = it->stride[k][n - 1] == bs[k][d] * o->shape[d];
    if (merge) {
      it->shape[n - 1] *= o->shape[d];
      for (int k = 0; k < nops; k++) it->stride[k][n - 1] = bs[k][d];
    } else {
      it->shape[n] = o->shape[d];
      for (int k = 0; k < nops; k++) it->stride[k][n] = bs[k][d];
      it->ndim++;
    }
  }
  it->contig = it->ndim <= 1;
  for (int k = 0; it->contig && k < nops; k++) it->contig = it->ndim == 0 || it->stride[k][0] == 1;
}

/* element offsets of linear index i for the first N operands */
template <int N> __device__ __forceinline__ void kg_cuda_offsets(const kg_cuda_iter &it, int64_t i, int64_t *off) {
#pragma unroll
  for (int k = 0; k < N; k++) off[k] = it.contig ? i : 0;
  if (it.contig) return;
  for (int d = it.ndim - 1; d >= 0; d--) {
    int64_t q = i / it.shape[d], r = i - q * it.shape[d];
    i = q;
#pragma unroll
    for (int k = 0; k < N; k++) off[k] += r * it.stride[k][d];
  }
}

/* ---- fused linear (matmul.cu): y = x wᵀ + b (+ GELU, tanh form) through a cuBLASLt epilogue;
 * KG_ERR_VALUE when layout or dtype does not fit (then run matmul + add). The linear op's kernel
 * (kg_cuda_linear) uses the same epilogue. */
kg_status kg_cuda_linear_fused(kg_tensor *y, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b, bool gelu);

/* ---- cuDNN fused attention (sdpa_cudnn.cu): runs the SDPA forward into out and lse when cuDNN
 * takes the call (*done = true); otherwise *done = false and nothing was queued (the caller runs
 * keng's flash kernel). Never fails for an unsupported call. */
extern "C" kg_status kg_cudnn_sdpa_forward(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v,
                                           const kg_tensor *mask, const kg_sdpa_params *p, kg_tensor *out,
                                           kg_tensor *lse, bool *done);

/* ---- the generic elementwise launcher (elementwise.cu) ----------------------------------- */

enum kg_cuda_ew_kind { KG_EW_FILL, KG_EW_COPY, KG_EW_UNARY, KG_EW_BINARY, KG_EW_WHERE, KG_EW_CLAMP, KG_EW_UGRAD, KG_EW_TRI };
struct kg_cuda_ew_args {
  int kind;
  int op;          /* the kg_op for UNARY/BINARY/UGRAD */
  double lo, hi;   /* clamp bounds (NaN = none); fill value in lo */
  int64_t k;       /* tril/triu diagonal; lower in `op` (1 tril, 0 triu) */
  int64_t rows, cols; /* tril/triu matrix shape */
};
/* out = f(in...) elementwise over out's shape (inputs broadcast); any strides and dtypes. */
kg_status kg_cuda_ew(const char *name, const kg_cuda_ew_args &a, kg_tensor *out, int nin, const kg_tensor *const *in);

#endif
