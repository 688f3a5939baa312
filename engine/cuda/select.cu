/* select.cu — max/min (values + i64 indices), argmax/argmin, cumsum and topk along one dim, as
 * engine/cpu/reduce.c computes them: values compared as doubles, the first extreme element of a
 * row wins (NaN counts as the extreme, the first NaN wins), cumsum runs in double, topk orders
 * a row by (value, index) with NaN above everything (largest) or below (smallest).
 *
 * Rows: x viewed as [kept dims..., dim]; the outputs are contiguous in the kept dims' order.
 * max/min: a block per row (a thread per row for short rows). cumsum: a thread per row, the
 * running sum sequential in double exactly as on the CPU. topk (topk_plan.h: the order and the
 * network, tested on the CPU): rows of up to 2048 elements are bitonic-sorted in shared memory, a
 * block per row (a total order, so the result equals the CPU's qsort); longer rows take k
 * selection passes (each finds the best element ranked after the previous pick, O(k·n)) for
 * k <= 64, else the same bitonic network in global memory, a launch per step. */
#include "util.cuh"

#include "topk_plan.h"

typedef kg_topk_item item;

/* does a come before b? (max: largest first, NaN first; min: smallest first, NaN last; ties by index) */
__device__ __forceinline__ bool before(const item &a, const item &b, bool largest) {
  return kg_topk_before(&a, &b, largest);
}

/* ---- max / min / argmax / argmin ------------------------------------------------------------ */

/* the first extreme: NaN beats numbers, then the larger (smaller), then the lower index; which is
 * exactly `before` */
__global__ void select_block_kernel(kg_cuda_rows r, const char *x, int xdt, bool largest, char *vo, int vdt,
                                    int64_t *io) {
  __shared__ item part[256];
  for (int64_t o = blockIdx.x; o < r.nout; o += gridDim.x) {
    int64_t base = kg_row_offset(r, o);
    item best = {0, -1};
    for (int64_t j = threadIdx.x; j < r.n; j += blockDim.x) {
      item e = {kg_load<double>(x, xdt, base + j * r.s), (long long)j};
      if (before(e, best, largest)) best = e;
    }
    part[threadIdx.x] = best;
    __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
      if (threadIdx.x < h && before(part[threadIdx.x + h], part[threadIdx.x], largest))
        part[threadIdx.x] = part[threadIdx.x + h];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      io[o] = part[0].i;
      if (vo) kg_store(vo, vdt, o, part[0].v);
    }
    __syncthreads();
  }
}

__global__ void select_thread_kernel(kg_cuda_rows r, const char *x, int xdt, bool largest, char *vo, int vdt,
                                     int64_t *io) {
  KG_CUDA_FOR(o, r.nout) {
    int64_t base = kg_row_offset(r, o);
    item best = {0, -1};
    for (int64_t j = 0; j < r.n; j++) {
      item e = {kg_load<double>(x, xdt, base + j * r.s), (long long)j};
      if (before(e, best, largest)) best = e;
    }
    io[o] = best.i;
    if (vo) kg_store(vo, vdt, o, best.v);
  }
}

static kg_status select_run(const kg_op_call *c, bool largest) {
  const kg_tensor *x = c->in[0];
  const kg_dim_params *dp = (const kg_dim_params *)c->params;
  bool with_values = c->nout == 2;
  kg_tensor *vo = with_values ? c->out[0] : NULL, *io = c->out[with_values ? 1 : 0];
  const char *name = kg_op_info[c->op].name;
  kg_cuda_rows r = kg_cuda_rows_of(x, dp->dim);
  if (r.nout == 0) return KG_OK;
  if (r.n == 0) return kg_error(KG_ERR_SHAPE, name, "dim %d has size 0", dp->dim + 1);
  int dev = io->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  char *vb = vo ? (char *)kg_data(vo) : NULL;
  int vdt = vo ? vo->dtype : 0;
  if (r.n <= 64 && r.nout >= 256)
    select_thread_kernel<<<kg_cuda_blocks(r.nout), KG_CUDA_THREADS, 0, s>>>(r, (const char *)kg_data(x), x->dtype,
                                                                           largest, vb, vdt, (int64_t *)kg_data(io));
  else
    select_block_kernel<<<kg_grid(r.nout), 256, 0, s>>>(r, (const char *)kg_data(x), x->dtype, largest, vb, vdt,
                                                        (int64_t *)kg_data(io));
  return kg_cuda_check(name, dev);
}
extern "C" kg_status kg_cuda_max(const kg_op_call *c) { return select_run(c, true); }
extern "C" kg_status kg_cuda_min(const kg_op_call *c) { return select_run(c, false); }
extern "C" kg_status kg_cuda_argmax(const kg_op_call *c) { return select_run(c, true); }
extern "C" kg_status kg_cuda_argmin(const kg_op_call *c) { return select_run(c, false); }

/* ---- cumsum ---------------------------------------------------------------------------------- */

__global__ void cumsum_kernel(kg_cuda_rows rx, kg_cuda_rows ry, const char *x, int xdt, char *y, int ydt) {
  KG_CUDA_FOR(o, rx.nout) {
    int64_t xo = kg_row_offset(rx, o), yo = kg_row_offset(ry, o);
    double acc = 0;
    for (int64_t j = 0; j < rx.n; j++) {
      acc += kg_load<double>(x, xdt, xo + j * rx.s);
      kg_store(y, ydt, yo + j * ry.s, acc);
    }
  }
}

extern "C" kg_status kg_cuda_cumsum(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  int dim = ((const kg_dim_params *)c->params)->dim;
  kg_cuda_rows rx = kg_cuda_rows_of(x, dim), ry = kg_cuda_rows_of(y, dim);
  if (rx.nout == 0 || rx.n == 0) return KG_OK;
  int dev = y->device.index;
  cumsum_kernel<<<kg_cuda_blocks(rx.nout), 128, 0, kg_cuda_stream(dev)>>>(rx, ry, (const char *)kg_data(x), x->dtype,
                                                                          (char *)kg_data(y), y->dtype);
  return kg_cuda_check("cumsum", dev);
}

/* ---- topk ------------------------------------------------------------------------------------ */

#define SORT_MAX KG_TOPK_SORT_MAX
#define SORT_THREADS 512

/* a block sorts one row of n <= npad (a power of two) items in shared memory */
__global__ void topk_sort_kernel(kg_cuda_rows rx, kg_cuda_rows ro, const char *x, int xdt, int64_t k, bool largest,
                                 int npad, char *vo, int vdt, int64_t *io) {
  extern __shared__ item it[];
  for (int64_t o = blockIdx.x; o < rx.nout; o += gridDim.x) {
    int64_t xo = kg_row_offset(rx, o), oo = kg_row_offset(ro, o);
    for (int j = threadIdx.x; j < npad; j += blockDim.x) {
      item e = {0, -1};
      if (j < rx.n) e.v = kg_load<double>(x, xdt, xo + j * rx.s), e.i = j;
      it[j] = e;
    }
    __syncthreads();
    for (int size = 2; size <= npad; size <<= 1)
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int t = threadIdx.x; t < npad / 2; t += blockDim.x) kg_bitonic_exchange(it, t, size, stride, largest);
        __syncthreads();
      }
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      if (vo) kg_store(vo, vdt, oo + j * ro.s, it[j].v);
      io[oo + j * ro.s] = it[j].i;
    }
    __syncthreads();
  }
}

/* long rows, many picks: every row padded to npad items in global memory (buf [nout, npad]) and
 * bitonic-sorted there, one launch per step; then the first k of each row stored */
__global__ void topk_load_kernel(kg_cuda_rows rx, const char *x, int xdt, int64_t npad, item *buf) {
  KG_CUDA_FOR(e, rx.nout * npad) {
    int64_t o = e / npad, j = e - o * npad;
    item it = {0, -1};
    if (j < rx.n) it.v = kg_load<double>(x, xdt, kg_row_offset(rx, o) + j * rx.s), it.i = j;
    buf[e] = it;
  }
}

__global__ void topk_step_kernel(item *buf, int64_t nout, int64_t npad, int64_t size, int64_t stride, bool largest) {
  int64_t half = npad / 2;
  KG_CUDA_FOR(e, nout * half) {
    int64_t o = e / half;
    kg_bitonic_exchange(buf + o * npad, e - o * half, size, stride, largest);
  }
}

__global__ void topk_store_kernel(kg_cuda_rows ro, const item *buf, int64_t nout, int64_t npad, int64_t k, char *vo,
                                  int vdt, int64_t *io) {
  KG_CUDA_FOR(e, nout * k) {
    int64_t o = e / k, j = e - o * k, oo = kg_row_offset(ro, o) + j * ro.s;
    const item &it = buf[o * npad + j];
    if (vo) kg_store(vo, vdt, oo, it.v);
    io[oo] = it.i;
  }
}

/* k passes per row; pass j picks the best item ranked after pass j-1's pick */
__global__ void topk_select_kernel(kg_cuda_rows rx, kg_cuda_rows ro, const char *x, int xdt, int64_t k, bool largest,
                                   char *vo, int vdt, int64_t *io) {
  __shared__ item part[256];
  __shared__ item prev;
  for (int64_t o = blockIdx.x; o < rx.nout; o += gridDim.x) {
    int64_t xo = kg_row_offset(rx, o), oo = kg_row_offset(ro, o);
    for (int64_t pick = 0; pick < k; pick++) {
      item best = {0, -1};
      for (int64_t j = threadIdx.x; j < rx.n; j += blockDim.x) {
        item e = {kg_load<double>(x, xdt, xo + j * rx.s), (long long)j};
        if ((pick == 0 || before(prev, e, largest)) && before(e, best, largest)) best = e;
      }
      part[threadIdx.x] = best;
      __syncthreads();
      for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h && before(part[threadIdx.x + h], part[threadIdx.x], largest))
          part[threadIdx.x] = part[threadIdx.x + h];
        __syncthreads();
      }
      if (threadIdx.x == 0) {
        prev = part[0];
        if (vo) kg_store(vo, vdt, oo + pick * ro.s, part[0].v);
        io[oo + pick * ro.s] = part[0].i;
      }
      __syncthreads();
    }
  }
}

/* the k first items of every row of x along dim -> vo (may be NULL), io: i64 (vo's layout) */
kg_status kg_cuda_topk_rows(const char *name, const kg_tensor *x, int dim, int64_t k, bool largest, kg_tensor *vo,
                            kg_tensor *io) {
  kg_cuda_rows rx = kg_cuda_rows_of(x, dim), ro = kg_cuda_rows_of(io, dim);
  if (rx.nout == 0 || k == 0) return KG_OK;
  int dev = io->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  char *vb = vo ? (char *)kg_data(vo) : NULL;
  int vdt = vo ? vo->dtype : 0;
  const char *xb = (const char *)kg_data(x);
  if (rx.n <= SORT_MAX) {
    int npad = (int)kg_topk_pad(rx.n);
    topk_sort_kernel<<<kg_grid(rx.nout), SORT_THREADS, sizeof(item) * (size_t)npad, s>>>(
        rx, ro, xb, x->dtype, k, largest, npad, vb, vdt, (int64_t *)kg_data(io));
  } else if (kg_topk_global_sort(rx.n, k)) {
    int64_t npad = kg_topk_pad(rx.n);
    kg_cuda_buf buf; /* stream-ordered: freed after the launches below */
    KG_TRY(buf.alloc(sizeof(item) * (size_t)(rx.nout * npad), dev, name));
    item *b = (item *)buf.p;
    topk_load_kernel<<<kg_cuda_blocks(rx.nout * npad), KG_CUDA_THREADS, 0, s>>>(rx, xb, x->dtype, npad, b);
    KG_TRY(kg_cuda_check(name, dev));
    unsigned g = kg_cuda_blocks(rx.nout * npad / 2);
    for (int64_t size = 2; size <= npad; size <<= 1)
      for (int64_t stride = size >> 1; stride > 0; stride >>= 1)
        topk_step_kernel<<<g, KG_CUDA_THREADS, 0, s>>>(b, rx.nout, npad, size, stride, largest);
    KG_TRY(kg_cuda_check(name, dev));
    topk_store_kernel<<<kg_cuda_blocks(rx.nout * k), KG_CUDA_THREADS, 0, s>>>(ro, b, rx.nout, npad, k, vb, vdt,
                                                                             (int64_t *)kg_data(io));
  } else {
    topk_select_kernel<<<kg_grid(rx.nout), 256, 0, s>>>(rx, ro, xb, x->dtype, k, largest, vb, vdt,
                                                        (int64_t *)kg_data(io));
  }
  return kg_cuda_check(name, dev);
}

extern "C" kg_status kg_cuda_topk(const kg_op_call *c) {
  const kg_topk_params *tp = (const kg_topk_params *)c->params;
  return kg_cuda_topk_rows("topk", c->in[0], tp->dim, tp->k, tp->largest, c->out[0], c->out[1]);
}
