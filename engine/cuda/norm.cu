/* norm.cu — layer_norm, rms_norm, group_norm and their backward kernels, with engine/cpu/norm.c's
 * layout and formulas: `rows` rows of M contiguous elements, one mean/rstd each; element i of
 * row r belongs to channel (r % G) * cpg + i / S.
 *
 *   forward   y = (x - mean) * (w[c] * rstd) + b[c]     (rms: mean = 0, no b; w -> 1 + w if unit_offset)
 *   backward  xhat = (x - mean) * rstd
 *             dx = rstd * (dy * w[c] - mean(dy * w) - xhat * mean(dy * w * xhat))   (rms: no mean(dy*w))
 *             dw[c] = Σ dy * xhat, db[c] = Σ dy   (over rows and spatial positions)
 *
 * Compute in float (double for f64) with row sums in double. Forward and dx: one block per row.
 * dw/db, reduced in double with no atomics (deterministic), in reduce_plan.h's two-stage forms
 * (the count of ranges per channel chosen to fill the GPU; partials in double, then a thread
 * per channel adds its partials in range order):
 *   S == 1 (layer_norm, rms_norm: x is [N, C] with C contiguous): thread per channel, a block
 *            takes 256 neighbouring channels and a range of rows, each thread runs down its
 *            channel (every step reads 256 neighbouring elements)
 *   S > 1  (group_norm): block per channel and range, its threads along the contiguous
 *            spatial run. */
#include "util.cuh"
#include "reduce_plan.h"

struct norm_plan {
  int64_t rows, M, S, cpg, G;
  bool center, unit_offset;
  double eps;
  const char *w, *b;
  int wdt, bdt;
};

static norm_plan plan_of(const kg_tensor *x, const kg_norm_params *p, bool group, bool center) {
  norm_plan q = {};
  q.center = center, q.unit_offset = p->unit_offset, q.eps = p->eps;
  int nd = x->ndim;
  q.S = 1;
  if (group) {
    q.G = p->groups;
    q.cpg = x->shape[1] / q.G;
    for (int d = 2; d < nd; d++) q.S *= x->shape[d];
    q.rows = x->shape[0] * q.G;
  } else {
    q.G = 1;
    q.cpg = x->shape[nd - 1];
    q.rows = 1;
    for (int d = 0; d < nd - 1; d++) q.rows *= x->shape[d];
  }
  q.M = q.cpg * q.S;
  return q;
}

template <class T> __device__ __forceinline__ T weight(const norm_plan &q, int64_t c) {
  return q.w ? kg_load<T>(q.w, q.wdt, c) + (T)(q.unit_offset ? 1 : 0) : (T)1;
}
template <class T> __device__ __forceinline__ T bias(const norm_plan &q, int64_t c) {
  return q.b ? kg_load<T>(q.b, q.bdt, c) : (T)0;
}

template <class T>
__global__ void norm_forward_kernel(norm_plan q, const char *x, int xdt, char *y, int ydt, char *smean, char *srstd,
                                    int sdt) {
  for (int64_t r = blockIdx.x; r < q.rows; r += gridDim.x) {
    int64_t base = r * q.M, c0 = (r % q.G) * q.cpg;
    T mean = 0;
    if (q.center) {
      double sum = 0;
      for (int64_t i = threadIdx.x; i < q.M; i += blockDim.x) sum += (double)kg_load<T>(x, xdt, base + i);
      mean = (T)(kg_block_sum(sum) / (double)q.M);
    }
    double ss = 0;
    for (int64_t i = threadIdx.x; i < q.M; i += blockDim.x) {
      T d = kg_load<T>(x, xdt, base + i) - mean;
      ss += (double)d * d;
    }
    ss = kg_block_sum(ss);
    T rstd = (T)(1.0 / sqrt(ss / (double)q.M + q.eps));
    for (int64_t i = threadIdx.x; i < q.M; i += blockDim.x) {
      int64_t ch = c0 + i / q.S;
      T sc = weight<T>(q, ch) * rstd, sh = bias<T>(q, ch);
      kg_store(y, ydt, base + i, (kg_load<T>(x, xdt, base + i) - mean) * sc + sh);
    }
    if (threadIdx.x == 0) {
      if (smean) kg_store(smean, sdt, r, mean);
      kg_store(srstd, sdt, r, rstd);
    }
  }
}

template <class T>
__global__ void norm_dx_kernel(norm_plan q, const char *g, int gdt, const char *x, int xdt, const char *smean,
                               const char *srstd, int sdt, char *dx, int ddt) {
  for (int64_t r = blockIdx.x; r < q.rows; r += gridDim.x) {
    int64_t base = r * q.M, c0 = (r % q.G) * q.cpg;
    T mean = smean ? kg_load<T>(smean, sdt, r) : (T)0, rstd = kg_load<T>(srstd, sdt, r);
    double sa = 0, sb = 0; /* Σ dy * w, Σ dy * w * xhat */
    for (int64_t i = threadIdx.x; i < q.M; i += blockDim.x) {
      T wc = weight<T>(q, c0 + i / q.S), gv = kg_load<T>(g, gdt, base + i);
      T xh = (kg_load<T>(x, xdt, base + i) - mean) * rstd;
      sa += (double)gv * wc;
      sb += (double)gv * xh * wc;
    }
    sa = kg_block_sum(sa);
    sb = kg_block_sum(sb);
    T A = q.center ? (T)(sa / (double)q.M) : (T)0, B = (T)(sb / (double)q.M);
    for (int64_t i = threadIdx.x; i < q.M; i += blockDim.x) {
      T wc = weight<T>(q, c0 + i / q.S), gv = kg_load<T>(g, gdt, base + i);
      T xh = (kg_load<T>(x, xdt, base + i) - mean) * rstd;
      kg_store(dx, ddt, base + i, rstd * (gv * wc - A - xh * B));
    }
  }
}

/* dw[c] = Σ dy * xhat, db[c] = Σ dy over the rows of channel c's group and its spatial run, in
 * reduce_plan.h's two forms. Each (channel, range) pair's two sums go to partials
 * (kg_red_part2) or, with one range, straight into dw and db. */
__device__ __forceinline__ void dwdb_put(double aw, double ab, bool rows, kg_split sp, int64_t C, int64_t c, int64_t k,
                                         double *part, char *dw, int dwdt, char *db, int dbdt) {
  if (part) {
    part[kg_red_part2(rows, sp, C, c, k, 0)] = aw;
    part[kg_red_part2(rows, sp, C, c, k, 1)] = ab;
  } else {
    kg_store(dw, dwdt, c, aw);
    if (db) kg_store(db, dbdt, c, ab);
  }
}

/* S > 1 (group_norm), block per output: pair u = (channel c, range k of its N·S elements, taken
 * as (batch b, spatial s) with s fastest: threads along the contiguous spatial run) */
template <class T>
__global__ void norm_dwdb_kernel(norm_plan q, kg_split sp, const char *g, int gdt, const char *x, int xdt,
                                 const char *smean, const char *srstd, int sdt, double *part, char *dw, int dwdt,
                                 char *db, int dbdt) {
  int64_t C = q.cpg * q.G, count = q.rows / q.G * q.S;
  for (int64_t u = blockIdx.x; u < C * sp.splits; u += gridDim.x) {
    int64_t c, k, lo, hi;
    kg_red_rows_pair(u, sp, &c, &k);
    kg_split_range(sp, count, k, &lo, &hi);
    int64_t grp = c / q.cpg, kc = c % q.cpg;
    double aw = 0, ab = 0;
    for (int64_t e = lo + threadIdx.x; e < hi; e += blockDim.x) {
      int64_t b = e / q.S, s = e - b * q.S, r = b * q.G + grp, off = r * q.M + kc * q.S + s;
      T mean = smean ? kg_load<T>(smean, sdt, r) : (T)0, rstd = kg_load<T>(srstd, sdt, r);
      T gv = kg_load<T>(g, gdt, off), xh = (kg_load<T>(x, xdt, off) - mean) * rstd;
      aw += (double)gv * xh;
      ab += (double)gv;
    }
    aw = kg_block_sum(aw);
    ab = kg_block_sum(ab);
    if (threadIdx.x == 0) dwdb_put(aw, ab, true, sp, C, c, k, part, dw, dwdt, db, dbdt);
  }
}

/* S == 1 (layer_norm, rms_norm), thread per output (KG_RED_TILE threads): dy and x as [N, C]
 * (N = rows / G); pair u = (channel tile, row range k); each thread runs down its channel c */
template <class T>
__global__ void norm_dwdb_cols_kernel(norm_plan q, kg_split sp, int64_t tiles, const char *g, int gdt, const char *x,
                                      int xdt, const char *smean, const char *srstd, int sdt, double *part, char *dw,
                                      int dwdt, char *db, int dbdt) {
  int64_t C = q.cpg * q.G, N = q.rows / q.G;
  for (int64_t u = blockIdx.x; u < tiles * sp.splits; u += gridDim.x) {
    int64_t c, k, lo, hi;
    kg_red_cols_pair(u, tiles, threadIdx.x, &c, &k);
    if (c >= C) continue;
    kg_split_range(sp, N, k, &lo, &hi);
    int64_t grp = c / q.cpg;
    double aw = 0, ab = 0;
    for (int64_t n = lo; n < hi; n++) {
      int64_t r = n * q.G + grp, off = n * C + c;
      T mean = smean ? kg_load<T>(smean, sdt, r) : (T)0, rstd = kg_load<T>(srstd, sdt, r);
      T gv = kg_load<T>(g, gdt, off), xh = (kg_load<T>(x, xdt, off) - mean) * rstd;
      aw += (double)gv * xh;
      ab += (double)gv;
    }
    dwdb_put(aw, ab, false, sp, C, c, k, part, dw, dwdt, db, dbdt);
  }
}

/* stage 2: a thread per channel adds its partials in range order */
__global__ void norm_dwdb_finish_kernel(const double *part, bool rows, kg_split sp, int64_t C, char *dw, int dwdt,
                                        char *db, int dbdt) {
  KG_CUDA_FOR(c, C) {
    double aw = 0, ab = 0;
    for (int64_t k = 0; k < sp.splits; k++) {
      aw += part[kg_red_part2(rows, sp, C, c, k, 0)];
      ab += part[kg_red_part2(rows, sp, C, c, k, 1)];
    }
    kg_store(dw, dwdt, c, aw);
    if (db) kg_store(db, dbdt, c, ab);
  }
}

/* dw/db: thread per channel for S == 1 (channels along memory), block per channel otherwise */
static kg_status dwdb(const norm_plan &q, bool f64, const char *gb, int gdt, const char *xb, int xdt, const char *smb,
                      const char *srb, int sdt, char *dw, int dwdt, char *db, int dbdt, int dev, const char *op) {
  cudaStream_t s = kg_cuda_stream(dev);
  bool rows = q.S > 1;
  int64_t C = q.cpg * q.G, n = q.rows / q.G * q.S, units = rows ? C : (C + KG_RED_TILE - 1) / KG_RED_TILE;
  kg_split sp = kg_split_plan(units, n, rows ? KG_RED_MIN_CHUNK_ROWS : KG_RED_MIN_CHUNK_COLS);
  kg_cuda_buf part;
  if (sp.splits > 1) KG_TRY(part.alloc(sizeof(double) * 2 * (size_t)(C * sp.splits), dev, op));
  double *pp = (double *)part.p;
  unsigned grid = kg_red_grid(units * sp.splits);
  if (rows) {
    unsigned th = kg_row_threads(sp.chunk);
    if (f64)
      norm_dwdb_kernel<double><<<grid, th, 0, s>>>(q, sp, gb, gdt, xb, xdt, smb, srb, sdt, pp, dw, dwdt, db, dbdt);
    else
      norm_dwdb_kernel<float><<<grid, th, 0, s>>>(q, sp, gb, gdt, xb, xdt, smb, srb, sdt, pp, dw, dwdt, db, dbdt);
  } else if (f64) {
    norm_dwdb_cols_kernel<double><<<grid, KG_RED_TILE, 0, s>>>(q, sp, units, gb, gdt, xb, xdt, smb, srb, sdt, pp, dw,
                                                                dwdt, db, dbdt);
  } else {
    norm_dwdb_cols_kernel<float><<<grid, KG_RED_TILE, 0, s>>>(q, sp, units, gb, gdt, xb, xdt, smb, srb, sdt, pp, dw,
                                                               dwdt, db, dbdt);
  }
  KG_TRY(kg_cuda_check(op, dev));
  if (sp.splits == 1) return KG_OK;
  norm_dwdb_finish_kernel<<<kg_cuda_blocks(C), KG_CUDA_THREADS, 0, s>>>(pp, rows, sp, C, dw, dwdt, db, dbdt);
  return kg_cuda_check(op, dev); /* the partials are freed after the kernel, in stream order */
}

static const kg_tensor *in_or_null(const kg_op_call *c, int i) { return c->nin > i ? c->in[i] : NULL; }

/* in = {x, w, b}; out = {y, mean, rstd} (centred) or {y, rstd} */
static kg_status forward(const kg_op_call *c, bool group, bool center) {
  const kg_tensor *x = c->in[0], *w = in_or_null(c, 1), *b = in_or_null(c, 2);
  norm_plan q = plan_of(x, (const kg_norm_params *)c->params, group, center);
  q.w = w ? (const char *)kg_data(w) : NULL, q.wdt = w ? w->dtype : 0;
  q.b = b ? (const char *)kg_data(b) : NULL, q.bdt = b ? b->dtype : 0;
  kg_tensor *y = c->out[0], *sm = center ? c->out[1] : NULL, *sr = c->out[center ? 2 : 1];
  if (q.rows == 0) return KG_OK;
  int dev = y->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  unsigned th = kg_row_threads(q.M);
  char *smb = sm ? (char *)kg_data(sm) : NULL;
  if (x->dtype == KG_F64)
    norm_forward_kernel<double><<<kg_grid(q.rows), th, 0, s>>>(q, (const char *)kg_data(x), x->dtype, (char *)kg_data(y),
                                                               y->dtype, smb, (char *)kg_data(sr), sr->dtype);
  else
    norm_forward_kernel<float><<<kg_grid(q.rows), th, 0, s>>>(q, (const char *)kg_data(x), x->dtype, (char *)kg_data(y),
                                                              y->dtype, smb, (char *)kg_data(sr), sr->dtype);
  return kg_cuda_check(kg_op_info[c->op].name, dev);
}

/* in = {dy, x, w, mean, rstd} (centred) or {dy, x, w, rstd}; out = {dx, dw[, db]} */
static kg_status backward(const kg_op_call *c, bool group, bool center) {
  const kg_tensor *g = c->in[0], *x = c->in[1], *w = c->in[2];
  const kg_tensor *sm = center ? c->in[3] : NULL, *sr = c->in[center ? 4 : 3];
  norm_plan q = plan_of(x, (const kg_norm_params *)c->params, group, center);
  q.w = w ? (const char *)kg_data(w) : NULL, q.wdt = w ? w->dtype : 0;
  kg_tensor *dx = c->out[0], *dw = c->nout > 1 ? c->out[1] : NULL, *db = c->nout > 2 ? c->out[2] : NULL;
  int64_t C = q.cpg * q.G;
  int dev = dx->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  const char *gb = (const char *)kg_data(g), *xb = (const char *)kg_data(x);
  const char *smb = sm ? (const char *)kg_data(sm) : NULL, *srb = (const char *)kg_data(sr);
  if (q.rows > 0) {
    unsigned th = kg_row_threads(q.M);
    if (x->dtype == KG_F64)
      norm_dx_kernel<double><<<kg_grid(q.rows), th, 0, s>>>(q, gb, g->dtype, xb, x->dtype, smb, srb, sr->dtype,
                                                            (char *)kg_data(dx), dx->dtype);
    else
      norm_dx_kernel<float><<<kg_grid(q.rows), th, 0, s>>>(q, gb, g->dtype, xb, x->dtype, smb, srb, sr->dtype,
                                                           (char *)kg_data(dx), dx->dtype);
    KG_TRY(kg_cuda_check(kg_op_info[c->op].name, dev));
  }
  if (dw && C > 0) {
    char *dbb = db ? (char *)kg_data(db) : NULL;
    int dbdt = db ? db->dtype : 0;
    if (q.rows == 0 || q.S == 0) { /* nothing summed: zeros */
      kg_cuda_ew_args a = {KG_EW_FILL, 0, 0, NAN, 0, 0, 0};
      KG_TRY(kg_cuda_ew("norm_backward", a, dw, 0, NULL));
      if (db) KG_TRY(kg_cuda_ew("norm_backward", a, db, 0, NULL));
      return KG_OK;
    }
    return dwdb(q, x->dtype == KG_F64, gb, g->dtype, xb, x->dtype, smb, srb, sr->dtype, (char *)kg_data(dw),
                dw->dtype, dbb, dbdt, dev, kg_op_info[c->op].name);
  }
  return KG_OK;
}

extern "C" kg_status kg_cuda_layer_norm(const kg_op_call *c) { return forward(c, false, true); }
extern "C" kg_status kg_cuda_rms_norm(const kg_op_call *c) { return forward(c, false, false); }
extern "C" kg_status kg_cuda_group_norm(const kg_op_call *c) { return forward(c, true, true); }
extern "C" kg_status kg_cuda_layer_norm_backward(const kg_op_call *c) { return backward(c, false, true); }
extern "C" kg_status kg_cuda_rms_norm_backward(const kg_op_call *c) { return backward(c, false, false); }
extern "C" kg_status kg_cuda_group_norm_backward(const kg_op_call *c) { return backward(c, true, true); }
