/* softmax.cu — softmax and log_softmax along one dim, as engine/cpu/softmax.c: a row is shifted
 * by its max (NaN wins; a row of -inf shifts by 0), exponentiated in float (double for f64), the
 * sum of exponentials accumulates in double, then softmax = e * (T)(1 / sum) and
 * log_softmax = x - (max + (T)log(sum)). One block per row, warp-shuffle reductions; the
 * exponentials are recomputed in the last pass instead of being kept.
 * Backward (fused, from the saved output y and the gradient g, as the CPU):
 *   softmax dx = y * (g - sum(g * y)),  log_softmax dx = g - exp(y) * sum(g),
 * the row sum in double, one block per row. */
#include "util.cuh"

template <class T>
__global__ void softmax_kernel(kg_cuda_rows rx, kg_cuda_rows ry, const char *x, int xdt, char *y, int ydt,
                               bool log_form) {
  for (int64_t o = blockIdx.x; o < rx.nout; o += gridDim.x) {
    int64_t xo = kg_row_offset(rx, o), yo = kg_row_offset(ry, o);
    T mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < rx.n; j += blockDim.x) mx = kg_nanmax(mx, kg_load<T>(x, xdt, xo + j * rx.s));
    mx = kg_block_nanmax(mx);
    if (mx == -INFINITY) mx = 0;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < rx.n; j += blockDim.x) sum += (double)exp(kg_load<T>(x, xdt, xo + j * rx.s) - mx);
    sum = kg_block_sum(sum);
    if (log_form) {
      T lse = mx + (T)log(sum);
      for (int64_t j = threadIdx.x; j < rx.n; j += blockDim.x)
        kg_store(y, ydt, yo + j * ry.s, kg_load<T>(x, xdt, xo + j * rx.s) - lse);
    } else {
      T inv = (T)(1 / sum);
      for (int64_t j = threadIdx.x; j < rx.n; j += blockDim.x)
        kg_store(y, ydt, yo + j * ry.s, exp(kg_load<T>(x, xdt, xo + j * rx.s) - mx) * inv);
    }
  }
}

static kg_status run(const kg_op_call *c, bool log_form) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  int dim = ((const kg_dim_params *)c->params)->dim;
  kg_cuda_rows rx = kg_cuda_rows_of(x, dim), ry = kg_cuda_rows_of(y, dim);
  if (rx.nout == 0 || rx.n == 0) return KG_OK;
  int dev = y->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  unsigned th = kg_row_threads(rx.n);
  const char *xb = (const char *)kg_data(x);
  if (x->dtype == KG_F64)
    softmax_kernel<double><<<kg_grid(rx.nout), th, 0, s>>>(rx, ry, xb, x->dtype, (char *)kg_data(y), y->dtype, log_form);
  else
    softmax_kernel<float><<<kg_grid(rx.nout), th, 0, s>>>(rx, ry, xb, x->dtype, (char *)kg_data(y), y->dtype, log_form);
  return kg_cuda_check(kg_op_info[c->op].name, dev);
}

extern "C" kg_status kg_cuda_softmax(const kg_op_call *c) { return run(c, false); }
extern "C" kg_status kg_cuda_log_softmax(const kg_op_call *c) { return run(c, true); }

template <class T>
__global__ void softmax_backward_kernel(kg_cuda_rows rg, kg_cuda_rows ry, kg_cuda_rows rd, const char *g, int gdt,
                                        const char *y, int ydt, char *dx, int ddt, bool log_form) {
  for (int64_t o = blockIdx.x; o < ry.nout; o += gridDim.x) {
    int64_t go = kg_row_offset(rg, o), yo = kg_row_offset(ry, o), dxo = kg_row_offset(rd, o);
    double sum = 0;
    for (int64_t j = threadIdx.x; j < ry.n; j += blockDim.x) {
      T gv = kg_load<T>(g, gdt, go + j * rg.s);
      sum += log_form ? (double)gv : (double)(gv * kg_load<T>(y, ydt, yo + j * ry.s));
    }
    T s = (T)kg_block_sum(sum);
    for (int64_t j = threadIdx.x; j < ry.n; j += blockDim.x) {
      T gv = kg_load<T>(g, gdt, go + j * rg.s), yv = kg_load<T>(y, ydt, yo + j * ry.s);
      kg_store(dx, ddt, dxo + j * rd.s, log_form ? gv - exp(yv) * s : yv * (gv - s));
    }
  }
}

/* in {g, y} -> out {dx} */
static kg_status run_backward(const kg_op_call *c, bool log_form) {
  const kg_tensor *g = c->in[0], *y = c->in[1];
  kg_tensor *dx = c->out[0];
  int dim = ((const kg_dim_params *)c->params)->dim;
  kg_cuda_rows rg = kg_cuda_rows_of(g, dim), ry = kg_cuda_rows_of(y, dim), rd = kg_cuda_rows_of(dx, dim);
  if (ry.nout == 0 || ry.n == 0) return KG_OK;
  int dev = dx->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  unsigned th = kg_row_threads(ry.n);
  const char *gb = (const char *)kg_data(g), *yb = (const char *)kg_data(y);
  char *db = (char *)kg_data(dx);
  if (dx->dtype == KG_F64)
    softmax_backward_kernel<double><<<kg_grid(ry.nout), th, 0, s>>>(rg, ry, rd, gb, g->dtype, yb, y->dtype, db,
                                                                     dx->dtype, log_form);
  else
    softmax_backward_kernel<float><<<kg_grid(ry.nout), th, 0, s>>>(rg, ry, rd, gb, g->dtype, yb, y->dtype, db,
                                                                    dx->dtype, log_form);
  return kg_cuda_check(kg_op_info[c->op].name, dev);
}

extern "C" kg_status kg_cuda_softmax_backward(const kg_op_call *c) { return run_backward(c, false); }
extern "C" kg_status kg_cuda_log_softmax_backward(const kg_op_call *c) { return run_backward(c, true); }
