/* reduce.cu — sum over any set of dims, accumulating in double as engine/cpu/reduce.c does.
 *
 * x's dims split into kept (one output element each, row-major = the contiguous output's order)
 * and reduced. When the reduced elements lie along memory (innermost reduced stride 1) or the
 * outputs are few, a block sums one output (threads stride over its elements, then a warp-
 * shuffle tree); otherwise one thread sums one output, so neighbouring threads read
 * neighbouring kept elements. */
#include "cuda.cuh"

struct reduce_plan {
  int nk, nr;
  int64_t kshape[KG_MAX_DIMS], kstride[KG_MAX_DIMS], rshape[KG_MAX_DIMS], rstride[KG_MAX_DIMS];
  int64_t nout, nred;
  const char *x;
  int xdt;
};

__device__ __forceinline__ int64_t plan_offset(int n, const int64_t *shape, const int64_t *stride, int64_t i) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    int64_t q = i / shape[d];
    off += (i - q * shape[d]) * stride[d];
    i = q;
  }
  return off;
}

template <class S> __global__ void sum_rows_kernel(reduce_plan p, S *out) {
  __shared__ double part[32];
  for (int64_t o = blockIdx.x; o < p.nout; o += gridDim.x) {
    int64_t base = plan_offset(p.nk, p.kshape, p.kstride, o);
    double acc = 0;
    for (int64_t r = threadIdx.x; r < p.nred; r += blockDim.x)
      acc += kg_load<double>(p.x, p.xdt, base + plan_offset(p.nr, p.rshape, p.rstride, r));
    for (int m = 16; m > 0; m >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, m);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
      acc = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0;
      for (int m = 16; m > 0; m >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, m);
      if (threadIdx.x == 0) kg_put(out + o, acc);
    }
    __syncthreads();
  }
}

template <class S> __global__ void sum_cols_kernel(reduce_plan p, S *out) {
  KG_CUDA_FOR(o, p.nout) {
    int64_t base = plan_offset(p.nk, p.kshape, p.kstride, o);
    double acc = 0;
    for (int64_t r = 0; r < p.nred; r++) acc += kg_load<double>(p.x, p.xdt, base + plan_offset(p.nr, p.rshape, p.rstride, r));
    kg_put(out + o, acc);
  }
}

extern "C" kg_status kg_cuda_sum(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *o = c->out[0];
  uint32_t mask = ((const kg_reduce_params *)c->params)->mask;
  reduce_plan p;
  p.nk = p.nr = 0;
  p.nout = p.nred = 1;
  for (int d = 0; d < x->ndim; d++) {
    if (mask & (1u << d)) {
      p.rshape[p.nr] = x->shape[d], p.rstride[p.nr++] = x->stride[d];
      p.nred *= x->shape[d];
    } else {
      p.kshape[p.nk] = x->shape[d], p.kstride[p.nk++] = x->stride[d];
      p.nout *= x->shape[d];
    }
  }
  p.x = (const char *)kg_data(x);
  p.xdt = x->dtype;
  if (p.nout == 0) return KG_OK;
  if (!kg_is_contiguous(o)) return kg_error(KG_ERR_VALUE, "sum", "output must be contiguous");
  cudaStream_t s = kg_cuda_stream(o->device.index);
  bool rows = p.nred > 1 && (p.nout < 1024 || (p.rstride[p.nr - 1] == 1 && p.nred >= 64));
  if (rows) {
    unsigned blocks = (unsigned)(p.nout < 65536 ? p.nout : 65536);
    KG_CUDA_DISPATCH("sum", o->dtype, S, sum_rows_kernel<S><<<blocks, KG_CUDA_THREADS, 0, s>>>(p, (S *)kg_data(o)))
  } else {
    KG_CUDA_DISPATCH("sum", o->dtype, S,
                     sum_cols_kernel<S><<<kg_cuda_blocks(p.nout), KG_CUDA_THREADS, 0, s>>>(p, (S *)kg_data(o)))
  }
  return kg_cuda_check("sum", o->device.index);
}
