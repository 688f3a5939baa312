/* util.cuh — helpers shared by the op-family kernels (select, softmax, loss, index, norm,
 * random, attention, conv): rows along one dim, stores into a dtype known at run time, block
 * reductions, temporary device buffers and the device-side error flag.
 *
 * Error flag: kernels that must validate data (indices, targets, probabilities) record the
 * lowest offending position with atomicMin into a small device buffer; the launcher copies it
 * back and raises the CPU kernel's message. That copy synchronises the stream: one of the few
 * places a sync is accepted, since the error must surface from the op that caused it. */
#ifndef KENG_CUDA_UTIL_CUH
#define KENG_CUDA_UTIL_CUH

#include "cuda.cuh"

#include <math.h>

/* ---- rows along one dim: x viewed as [kept dims..., dim] ---------------------------------- */

struct kg_cuda_rows {
  int nk;
  int64_t kshape[KG_MAX_DIMS], kstride[KG_MAX_DIMS];
  int64_t nout; /* number of rows */
  int64_t n, s; /* row length and element stride along the dim */
};

/* dim < 0: no dim (every element its own row of length 1) */
static inline kg_cuda_rows kg_cuda_rows_of(const kg_tensor *x, int dim) {
  kg_cuda_rows r;
  r.nk = 0;
  r.nout = 1;
  r.n = 1, r.s = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (d == dim) {
      r.n = x->shape[d], r.s = x->stride[d];
    } else {
      r.kshape[r.nk] = x->shape[d], r.kstride[r.nk++] = x->stride[d];
      r.nout *= x->shape[d];
    }
  }
  return r;
}

/* element offset of row o's first element */
__device__ __forceinline__ int64_t kg_row_offset(const kg_cuda_rows &r, int64_t o) {
  int64_t off = 0;
  for (int d = r.nk - 1; d >= 0; d--) {
    int64_t q = o / r.kshape[d];
    off += (o - q * r.kshape[d]) * r.kstride[d];
    o = q;
  }
  return off;
}

/* ---- stores into a dtype known at run time ----------------------------------------------- */

template <class A> __device__ __forceinline__ void kg_store(char *base, int dt, int64_t off, A v) {
  switch (dt) {
  case KG_F32: kg_put((float *)base + off, v); break;
  case KG_F64: kg_put((double *)base + off, v); break;
  case KG_BF16: kg_put((kg_bf16 *)base + off, v); break;
  case KG_F16: kg_put((kg_f16 *)base + off, v); break;
  case KG_I32: kg_put((int32_t *)base + off, v); break;
  case KG_I64: kg_put((int64_t *)base + off, v); break;
  case KG_BOOL: kg_put((kg_bool *)base + off, v); break;
  case KG_I8: kg_put((int8_t *)base + off, v); break;
  default: kg_put((uint8_t *)base + off, v); break;
  }
}

/* integer index (i32 or i64; other dtypes as values) */
__device__ __forceinline__ int64_t kg_load_index(const char *base, int dt, int64_t off) {
  if (dt == KG_I64) return ((const int64_t *)base)[off];
  if (dt == KG_I32) return ((const int32_t *)base)[off];
  return (int64_t)kg_load<double>(base, dt, off);
}

/* ---- block reductions (blockDim.x a multiple of 32, at most 1024) ------------------------- */

template <class T> __device__ __forceinline__ T kg_warp_sum(T v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
/* max where NaN wins (as the CPU's `v > m || v != v` scan) */
template <class T> __device__ __forceinline__ T kg_nanmax(T a, T b) { return a != a ? a : b != b ? b : a > b ? a : b; }
template <class T> __device__ __forceinline__ T kg_warp_nanmax(T v) {
  for (int m = 16; m > 0; m >>= 1) v = kg_nanmax(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

/* every thread gets the block's total; uses 32 T of shared scratch */
template <class T> __device__ T kg_block_sum(T v) {
  __shared__ T part[32];
  v = kg_warp_sum(v);
  __syncthreads(); /* part may still be read by a previous call */
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += part[w];
  return t;
}
template <class T> __device__ T kg_block_nanmax(T v) {
  __shared__ T part[32];
  v = kg_warp_nanmax(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T t = part[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) t = kg_nanmax(t, part[w]);
  return t;
}
__device__ __forceinline__ long long kg_block_min_ll(long long v) {
  __shared__ long long part[32];
  for (int m = 16; m > 0; m >>= 1) {
    long long o = __shfl_xor_sync(0xffffffffu, v, m);
    v = o < v ? o : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  long long t = part[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) t = part[w] < t ? part[w] : t;
  return t;
}

/* threads for a block that walks rows of n elements: a multiple of 32, at most 256 */
static inline unsigned kg_row_threads(int64_t n) { return n <= 32 ? 32 : n <= 64 ? 64 : n <= 128 ? 128 : 256; }
static inline unsigned kg_grid(int64_t n) { return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n); }

/* ---- temporary device buffers (stream-ordered: freed after the kernels that use them) ------ */

struct kg_cuda_buf {
  void *p;
  int dev;
  bool borrowed; /* p is not ours to free (the deferred-error slots) */
  kg_cuda_buf() : p(NULL), dev(0), borrowed(false) {}
  ~kg_cuda_buf() { if (p && !borrowed) kg_cuda_free(p, dev); }
  kg_status alloc(size_t n, int device, const char *op) {
    dev = device;
    p = kg_cuda_malloc(n ? n : 1, device);
    return p ? KG_OK : kg_error(KG_ERR_OOM, op, "out of device memory for %zu bytes of scratch", n);
  }
};

/* ---- the error flag: the lowest offending position, LLONG_MAX when none ------------------- */

#define KG_NO_ERROR 0x7fffffffffffffffLL
__device__ __forceinline__ void kg_flag(long long *flag, long long pos) { atomicMin(flag, pos); }

/* The device's deferred-error slots (KG_FLAG_SLOTS long longs, runtime.cu): while a CUDA Graph
 * is captured, or eager checks are deferred (kg_cuda_defer_checks), flags point there instead
 * and nothing is read back; after a replay or a deferred check, the next synchronisation
 * (kg_cuda_sync, a device-to-host copy) reads them and raises if one was set. */
#define KG_FLAG_SLOTS 8
long long *kg_cuda_deferred_flags(int dev);

/* allocates and clears a flag of `n` slots (n <= KG_FLAG_SLOTS) */
static inline kg_status kg_flag_init(kg_cuda_buf *b, int n, int dev, const char *op) {
  if (kg_cuda_capturing(dev) || kg_cuda_deferring(dev)) {
    b->dev = dev, b->borrowed = true;
    b->p = kg_cuda_deferred_flags(dev);
    return b->p ? KG_OK : kg_error(KG_ERR_DEVICE, op, "no deferred-error slots for cuda:%d", dev);
  }
  KG_TRY(b->alloc(sizeof(long long) * (size_t)n, dev, op));
  static const long long none[8] = {KG_NO_ERROR, KG_NO_ERROR, KG_NO_ERROR, KG_NO_ERROR,
                                    KG_NO_ERROR, KG_NO_ERROR, KG_NO_ERROR, KG_NO_ERROR};
  return kg_cuda_err(cudaMemcpyAsync(b->p, none, sizeof(long long) * (size_t)n, cudaMemcpyHostToDevice,
                                     kg_cuda_stream(dev)), op, "flag init");
}
/* copies the flag back (synchronising the stream) */
static inline kg_status kg_flag_read(const kg_cuda_buf *b, int n, long long *out, const char *op) {
  if (b->borrowed) { /* captured or deferred: checked at the next synchronisation */
    for (int i = 0; i < n; i++) out[i] = KG_NO_ERROR;
    return KG_OK;
  }
  cudaStream_t s = kg_cuda_stream(b->dev);
  KG_TRY(kg_cuda_err(cudaMemcpyAsync(out, b->p, sizeof(long long) * (size_t)n, cudaMemcpyDeviceToHost, s), op,
                     "flag read"));
  return kg_cuda_err(cudaStreamSynchronize(s), op, "kernel");
}
/* one element of a device tensor, as double (synchronises) */
static inline double kg_cuda_peek(const kg_tensor *t, int64_t off) {
  unsigned char tmp[8] = {0};
  size_t es = kg_elem_size(t);
  cudaStream_t s = kg_cuda_stream(t->device.index);
  cudaMemcpyAsync(tmp, (const char *)kg_data(t) + off * (int64_t)es, es, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  cudaGetLastError();
  return kg_load_as_double(tmp, t->dtype, 0);
}

/* the tensor as a dense tensor of dtype dt on its device: *out = x retained when it already is,
 * else a packed copy (through the copy kernel) */
static inline kg_status kg_cuda_dense(kg_tensor **out, const kg_tensor *x, kg_dtype dt) {
  if (x->dtype == dt && kg_is_contiguous(x)) {
    *out = kg_tensor_retain((kg_tensor *)x);
    return KG_OK;
  }
  KG_TRY(kg_tensor_empty(out, x->ndim, x->shape, dt, x->device));
  const kg_tensor *in = x;
  kg_status s = kg_op_dispatch(KG_OP_COPY, 1, out, 1, &in, NULL);
  if (s) kg_tensor_release(*out), *out = NULL;
  return s;
}

/* topk along dim (select.cu): the k first items of each row of x by (value, index) -> vo (may be
 * NULL) and io (i64, vo's layout) */
kg_status kg_cuda_topk_rows(const char *name, const kg_tensor *x, int dim, int64_t k, bool largest, kg_tensor *vo,
                            kg_tensor *io);

#endif
