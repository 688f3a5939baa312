/* loss.cu — cross_entropy forward and backward, as engine/cpu/loss.c: per row of C logits the
 * max (NaN wins, -inf rows shift by 0), sum of exp(x - max) in double (exponentials in float,
 * double for f64), lse = max + log(sum), loss = lse - x[target]; rows whose target is
 * ignore_index count for nothing; mean divides by the rows kept (NaN when none).
 *
 * Forward: one block per row writes lse, the row loss and whether it is kept; a second one-block
 * kernel reduces them in double for sum/mean (a fixed tree order: deterministic). A target out
 * of range sets the device flag; the launcher reads it back (a stream sync on every call, the
 * price of the CPU's error message) and raises the same error. Backward: one thread per logit,
 * dx = (exp(x - lse) - onehot) * g * scale with the kept count computed on the device (no sync).
 * Logits of any float dtype are read as they are (bf16 widened in registers, no f32 copy) with
 * float math for f32/bf16/f16 and double for f64; the gradient is stored in the logits' dtype.
 * Class weights w [C] and label smoothing ε as engine/cpu/loss.c: the row loss is
 * (1-ε)·w[t]·(lse - x[t]) + ε/C·Σc w[c]·(lse - x[c]), a row counts w[t] towards the mean's
 * divisor, and dx = (a·p - (1-ε)·w[t]·onehot - ε/C·w)·g·scale with a = (1-ε)·w[t] + ε/C·Σw. */
#include "util.cuh"

extern "C" kg_status kg_cuda_fill(const kg_op_call *c);
/* engine/ops/loss.c: the out-of-range target error, as the CPU kernel's */
extern "C" kg_status kg_cross_entropy_range_error(const kg_tensor *logits, const kg_tensor *targets, int64_t row,
                                                  long long value);

struct ce_args {
  kg_cuda_rows rx, rt, rg, rd;
  const char *x, *t, *g, *lse, *w; /* w: class weights [C] or NULL */
  int xdt, tdt, gdt, ldt, ddt, wdt;
  int64_t ws;                       /* the weights' stride */
  char *dx;
  int64_t ignore;
  double eps;                       /* label smoothing */
  bool has_ignore, per_row;
};

__device__ inline double ce_weight(const ce_args &a, int64_t j) { return a.w ? kg_load<double>(a.w, a.wdt, j * a.ws) : 1.0; }

template <class T>
__global__ void ce_forward_kernel(ce_args a, char *lse, int ldt, double *row_loss, char *loss, int lossdt, bool none,
                                  long long *flag) {
  for (int64_t o = blockIdx.x; o < a.rx.nout; o += gridDim.x) {
    int64_t xo = kg_row_offset(a.rx, o), C = a.rx.n;
    int64_t t = kg_load_index(a.t, a.tdt, kg_row_offset(a.rt, o));
    T mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) mx = kg_nanmax(mx, kg_load<T>(a.x, a.xdt, xo + j * a.rx.s));
    mx = kg_block_nanmax(mx);
    if (mx == -INFINITY) mx = 0;
    double sum = 0, dot = 0, W = 0; /* dot = Σ w·x and W = Σ w, for smoothing */
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      T v = kg_load<T>(a.x, a.xdt, xo + j * a.rx.s);
      sum += (double)exp(v - mx);
      if (a.eps > 0) {
        double wj = ce_weight(a, j);
        dot += wj * (double)v;
        W += wj;
      }
    }
    sum = kg_block_sum(sum);
    if (a.eps > 0) {
      dot = kg_block_sum(dot);
      W = kg_block_sum(W);
    }
    if (threadIdx.x == 0) {
      double l = (double)mx + log(sum), li = 0, kept = 0;
      kg_store(lse, ldt, o, l);
      if (!(a.has_ignore && t == a.ignore)) {
        if (t < 0 || t >= C) {
          kg_flag(flag, o);
        } else if (!a.w && a.eps == 0) {
          li = l - (double)kg_load<T>(a.x, a.xdt, xo + t * a.rx.s);
          kept = 1;
        } else {
          kept = ce_weight(a, t);
          li = (1 - a.eps) * kept * (l - (double)kg_load<T>(a.x, a.xdt, xo + t * a.rx.s)) +
               (a.eps > 0 ? a.eps / (double)C * (W * l - dot) : 0);
        }
      }
      if (none) kg_store(loss, lossdt, o, li);
      if (row_loss) row_loss[2 * o] = li, row_loss[2 * o + 1] = kept;
    }
  }
}

/* one block: total = Σ loss, kept = Σ kept over rows; stores the reduction */
__global__ void ce_total_kernel(const double *row_loss, int64_t rows, char *loss, int lossdt, bool mean) {
  double total = 0, kept = 0;
  for (int64_t o = threadIdx.x; o < rows; o += blockDim.x) total += row_loss[2 * o], kept += row_loss[2 * o + 1];
  total = kg_block_sum(total);
  kept = kg_block_sum(kept);
  if (threadIdx.x == 0) kg_store(loss, lossdt, 0, mean ? (kept != 0 ? total / kept : NAN) : total);
}

extern "C" kg_status kg_cuda_cross_entropy(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *tg = c->in[1];
  kg_tensor *loss = c->out[0], *lse = c->out[1];
  const kg_loss_params *p = (const kg_loss_params *)c->params;
  ce_args a = {};
  a.rx = kg_cuda_rows_of(x, x->ndim - 1);
  a.rt = kg_cuda_rows_of(tg, -1);
  a.x = (const char *)kg_data(x), a.t = (const char *)kg_data(tg);
  a.xdt = x->dtype, a.tdt = tg->dtype;
  a.ignore = p->ignore_index, a.has_ignore = p->has_ignore, a.eps = p->label_smoothing;
  if (c->nin > 2 && c->in[2]) a.w = (const char *)kg_data(c->in[2]), a.wdt = c->in[2]->dtype, a.ws = c->in[2]->stride[0];
  int64_t rows = a.rx.nout;
  int dev = loss->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  bool none = p->reduction == KG_REDUCE_NONE;
  if (rows == 0) {
    if (none) return KG_OK;
    kg_fill_params fp = {p->reduction == KG_REDUCE_MEAN ? NAN : 0.0};
    kg_op_call fc = {KG_OP_FILL, 0, 1, NULL, &loss, &fp};
    return kg_cuda_fill(&fc);
  }
  kg_cuda_buf flag, part;
  KG_TRY(kg_flag_init(&flag, 1, dev, "cross_entropy"));
  if (!none) KG_TRY(part.alloc(sizeof(double) * 2 * (size_t)rows, dev, "cross_entropy"));
  unsigned th = kg_row_threads(a.rx.n);
  if (x->dtype == KG_F64)
    ce_forward_kernel<double><<<kg_grid(rows), th, 0, s>>>(a, (char *)kg_data(lse), lse->dtype, (double *)part.p,
                                                          (char *)kg_data(loss), loss->dtype, none, (long long *)flag.p);
  else
    ce_forward_kernel<float><<<kg_grid(rows), th, 0, s>>>(a, (char *)kg_data(lse), lse->dtype, (double *)part.p,
                                                         (char *)kg_data(loss), loss->dtype, none, (long long *)flag.p);
  KG_TRY(kg_cuda_check("cross_entropy", dev));
  if (!none) {
    ce_total_kernel<<<1, 1024, 0, s>>>((const double *)part.p, rows, (char *)kg_data(loss), loss->dtype,
                                      p->reduction == KG_REDUCE_MEAN);
    KG_TRY(kg_cuda_check("cross_entropy", dev));
  }
  long long bad_row;
  KG_TRY(kg_flag_read(&flag, 1, &bad_row, "cross_entropy"));
  if (bad_row != KG_NO_ERROR) {
    kg_cuda_rows rt = a.rt;
    int64_t off = 0, o = bad_row; /* the target's element offset, as kg_row_offset on the host */
    for (int d = rt.nk - 1; d >= 0; d--) off += (o % rt.kshape[d]) * rt.kstride[d], o /= rt.kshape[d];
    return kg_cross_entropy_range_error(x, tg, bad_row, (long long)kg_cuda_peek(tg, off));
  }
  return KG_OK;
}

/* scale[0]: 1 / Σ w[t] over the kept rows (targets other than ignore_index; w = 1 without
 * weights) for the mean, else 1; scale[1]: Σ w over the classes */
__global__ void ce_count_kernel(ce_args a, double *scale, bool mean) {
  double kept = 0, W = 0;
  for (int64_t o = threadIdx.x; o < a.rx.nout; o += blockDim.x) {
    int64_t t = kg_load_index(a.t, a.tdt, kg_row_offset(a.rt, o));
    if (!(a.has_ignore && t == a.ignore)) kept += ce_weight(a, t);
  }
  for (int64_t j = threadIdx.x; j < a.rx.n; j += blockDim.x) W += ce_weight(a, j);
  kept = kg_block_sum(kept);
  W = kg_block_sum(W);
  if (threadIdx.x == 0) scale[0] = mean ? (kept != 0 ? 1.0 / kept : 0) : 1.0, scale[1] = W;
}

/* T: the math type, float for f32/bf16/f16 logits (read in their dtype, the gradient stored in
 * the logits' dtype, as the CPU), double for f64 */
template <class T>
__global__ void ce_backward_kernel(ce_args a, const double *scale) {
  int64_t C = a.rx.n;
  KG_CUDA_FOR(i, a.rx.nout * C) {
    int64_t o = i / C, j = i - o * C;
    int64_t t = kg_load_index(a.t, a.tdt, kg_row_offset(a.rt, o));
    double g = a.per_row ? kg_load<double>(a.g, a.gdt, kg_row_offset(a.rg, o)) : kg_load<double>(a.g, a.gdt, 0);
    double w = (a.has_ignore && t == a.ignore) ? 0 : (scale ? scale[0] : 1.0) * g;
    T l = kg_load<T>(a.lse, a.ldt, o);
    double p = w == 0 ? 0 : (double)exp(kg_load<T>(a.x, a.xdt, kg_row_offset(a.rx, o) + j * a.rx.s) - l);
    double v;
    if (!a.w && a.eps == 0) {
      v = w == 0 ? 0 : (p - (j == t)) * w;
    } else {
      double wt = w == 0 ? 0 : ce_weight(a, t), am = (1 - a.eps) * wt + a.eps * scale[1] / (double)C;
      v = w == 0 ? 0 : (am * p - (j == t ? (1 - a.eps) * wt : 0) - a.eps / (double)C * ce_weight(a, j)) * w;
    }
    kg_store(a.dx, a.ddt, kg_row_offset(a.rd, o) + j * a.rd.s, v);
  }
}

/* in: logits, targets, lse, g; out: dlogits */
extern "C" kg_status kg_cuda_cross_entropy_backward(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *tg = c->in[1], *lse = c->in[2], *g = c->in[3];
  kg_tensor *dx = c->out[0];
  const kg_loss_params *p = (const kg_loss_params *)c->params;
  ce_args a = {};
  a.rx = kg_cuda_rows_of(x, x->ndim - 1);
  a.rd = kg_cuda_rows_of(dx, dx->ndim - 1);
  a.rt = kg_cuda_rows_of(tg, -1);
  a.rg = kg_cuda_rows_of(g, -1);
  a.x = (const char *)kg_data(x), a.t = (const char *)kg_data(tg), a.g = (const char *)kg_data(g);
  a.lse = (const char *)kg_data(lse);
  a.xdt = x->dtype, a.tdt = tg->dtype, a.gdt = g->dtype, a.ldt = lse->dtype, a.ddt = dx->dtype;
  a.dx = (char *)kg_data(dx);
  a.ignore = p->ignore_index, a.has_ignore = p->has_ignore, a.per_row = p->reduction == KG_REDUCE_NONE;
  a.eps = p->label_smoothing;
  if (c->nin > 4 && c->in[4]) a.w = (const char *)kg_data(c->in[4]), a.wdt = c->in[4]->dtype, a.ws = c->in[4]->stride[0];
  int64_t n = a.rx.nout * a.rx.n;
  if (n == 0) return KG_OK;
  int dev = dx->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  kg_cuda_buf scale;
  if (p->reduction == KG_REDUCE_MEAN || a.w || a.eps > 0) {
    KG_TRY(scale.alloc(2 * sizeof(double), dev, "cross_entropy_backward"));
    ce_count_kernel<<<1, 1024, 0, s>>>(a, (double *)scale.p, p->reduction == KG_REDUCE_MEAN);
  }
  if (x->dtype == KG_F64)
    ce_backward_kernel<double><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(a, (const double *)scale.p);
  else
    ce_backward_kernel<float><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(a, (const double *)scale.p);
  return kg_cuda_check("cross_entropy_backward", dev);
}
