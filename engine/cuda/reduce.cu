/* reduce.cu — sum over any set of dims, accumulating in double as engine/cpu/reduce.c does.
 *
 * x's dims split into kept (one output element each, row-major = the contiguous output's order)
 * and reduced; size-1 dims are dropped and dims contiguous with each other merged
 * (reduce_plan.h). Two forms, both two-stage so that few outputs still fill the GPU
 * (reduce_plan.h has the arithmetic, tests/c/test_cuda_launch.c checks it):
 *   block per output   the reduced elements lie along memory (a row sum, a full sum) or the
 *                      outputs are few: a block sums one range of one output's elements
 *                      (threads stride over it, then a warp-shuffle tree)
 *   thread per output  the outputs lie along memory (a column sum: a bias gradient dy [N, O]
 *                      summed over N): a block takes a tile of 256 neighbouring outputs and one
 *                      range of rows, each thread runs down its column, so every step of the
 *                      loop reads 256 neighbouring elements
 * Each (output, range) partial is a double; a second kernel adds an output's partials in range
 * order. No atomics: the same inputs give the same bits on every run. */
#include "util.cuh"
#include "reduce_plan.h"

struct reduce_plan {
  int nk, nr;
  int64_t kshape[KG_MAX_DIMS], kstride[KG_MAX_DIMS], rshape[KG_MAX_DIMS], rstride[KG_MAX_DIMS];
  int64_t nout, nred;
  const char *x;
  int xdt;
};

__device__ __forceinline__ int64_t plan_offset(int n, const int64_t *shape, const int64_t *stride, int64_t i) {
  if (n == 1) return i * stride[0]; /* the common case after merging: no division */
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    int64_t q = i / shape[d];
    off += (i - q * shape[d]) * stride[d];
    i = q;
  }
  return off;
}

/* stage 1, block per output: pair u = (output o, range k); the block's sum goes to its partial
 * or, with one range, straight to out[o] */
template <class S> __global__ void sum_rows_kernel(reduce_plan p, kg_split sp, S *out, double *part) {
  for (int64_t u = blockIdx.x; u < p.nout * sp.splits; u += gridDim.x) {
    int64_t o, k, lo, hi;
    kg_red_rows_pair(u, sp, &o, &k);
    kg_split_range(sp, p.nred, k, &lo, &hi);
    int64_t base = plan_offset(p.nk, p.kshape, p.kstride, o);
    double acc = 0;
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
      acc += kg_load<double>(p.x, p.xdt, base + plan_offset(p.nr, p.rshape, p.rstride, r));
    acc = kg_block_sum(acc);
    if (threadIdx.x == 0) {
      if (part) part[kg_red_part(true, sp, p.nout, o, k)] = acc;
      else kg_put(out + o, acc);
    }
  }
}

/* stage 1, thread per output (KG_RED_TILE threads): pair u = (tile, range k), neighbouring
 * blocks on neighbouring tiles; each thread sums its output o over the range, into its partial
 * (neighbouring threads, neighbouring slots) or, with one range, out[o] */
template <class S> __global__ void sum_cols_kernel(reduce_plan p, kg_split sp, int64_t tiles, S *out, double *part) {
  for (int64_t u = blockIdx.x; u < tiles * sp.splits; u += gridDim.x) {
    int64_t o, k, lo, hi;
    kg_red_cols_pair(u, tiles, threadIdx.x, &o, &k);
    if (o >= p.nout) continue;
    kg_split_range(sp, p.nred, k, &lo, &hi);
    int64_t base = plan_offset(p.nk, p.kshape, p.kstride, o);
    double acc = 0;
    for (int64_t r = lo; r < hi; r++)
      acc += kg_load<double>(p.x, p.xdt, base + plan_offset(p.nr, p.rshape, p.rstride, r));
    if (part)
      part[kg_red_part(false, sp, p.nout, o, k)] = acc;
    else
      kg_put(out + o, acc);
  }
}

/* stage 2: out[o] = the partials of output o added in range order */
template <class S> __global__ void sum_finish_kernel(const double *part, bool rows, kg_split sp, int64_t nout, S *out) {
  KG_CUDA_FOR(o, nout) {
    double acc = 0;
    for (int64_t k = 0; k < sp.splits; k++) acc += part[kg_red_part(rows, sp, nout, o, k)];
    kg_put(out + o, acc);
  }
}

/* the plan of x reduced over the dims in mask, merged */
static reduce_plan plan_of(const kg_tensor *x, uint32_t mask) {
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
  p.nk = kg_red_merge(p.nk, p.kshape, p.kstride);
  p.nr = kg_red_merge(p.nr, p.rshape, p.rstride);
  p.x = (const char *)kg_data(x);
  p.xdt = x->dtype;
  return p;
}

template <class S> static kg_status launch(const reduce_plan &p, S *out, int dev) {
  cudaStream_t s = kg_cuda_stream(dev);
  int64_t rin = p.nr ? p.rstride[p.nr - 1] : 0, kin = p.nk ? p.kstride[p.nk - 1] : 0;
  bool rows = kg_red_block_per_output(p.nout, p.nred, rin, kin);
  int64_t units = rows ? p.nout : (p.nout + KG_RED_TILE - 1) / KG_RED_TILE;
  kg_split sp = kg_split_plan(units, p.nred, rows ? KG_RED_MIN_CHUNK_ROWS : KG_RED_MIN_CHUNK_COLS);
  kg_cuda_buf part;
  if (sp.splits > 1) KG_TRY(part.alloc(sizeof(double) * (size_t)(p.nout * sp.splits), dev, "sum"));
  double *pp = (double *)part.p;
  if (rows)
    sum_rows_kernel<S><<<kg_red_grid(units * sp.splits), KG_CUDA_THREADS, 0, s>>>(p, sp, out, pp);
  else
    sum_cols_kernel<S><<<kg_red_grid(units * sp.splits), KG_RED_TILE, 0, s>>>(p, sp, units, out, pp);
  KG_TRY(kg_cuda_check("sum", dev));
  if (sp.splits == 1) return KG_OK;
  sum_finish_kernel<S><<<kg_cuda_blocks(p.nout), KG_CUDA_THREADS, 0, s>>>(pp, rows, sp, p.nout, out);
  return kg_cuda_check("sum", dev); /* the partials are freed after the kernel, in stream order */
}

extern "C" kg_status kg_cuda_sum(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *o = c->out[0];
  uint32_t mask = ((const kg_reduce_params *)c->params)->mask;
  reduce_plan p = plan_of(x, mask);
  if (p.nout == 0) return KG_OK;
  if (!kg_is_contiguous(o)) return kg_error(KG_ERR_VALUE, "sum", "output must be contiguous");
  KG_CUDA_DISPATCH("sum", o->dtype, S, return launch<S>(p, (S *)kg_data(o), o->device.index))
  return KG_OK;
}
