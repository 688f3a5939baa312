/* softmax.c (cpu) — softmax and log_softmax along one dim, and their fused backward passes.
 *
 * Three paths, the same formulas:
 *   direct rows     every operand contiguous along the last (non-1) dim, f32 (bf16 / f16 via
 *                   one float row buffer): max, exp + sum per 256-element block, scale
 *   direct columns  f32, contiguous, dim not the last: 64 neighbouring columns at a time
 *   buffered        anything else (strided views, f64): each row (any stride) is loaded into a
 *                   per-thread buffer (float, or double for f64)
 * Rows are shifted by their max and exponentiated (float: kg_cpu_exp_f32, libm-free, <= 1 ulp);
 * the sum of exponentials accumulates in double (float: lanes per block, each block's total
 * added in double). The backward takes the saved output y and the gradient g, a row at a time:
 *   softmax      dx = y * (g - sum(g * y))
 *   log_softmax  dx = g - exp(y) * sum(g)
 * with the row sum in double (one pass to sum, one to write).
 * KENG_SOFTMAX_DIRECT=0 forces the buffered path (tests/lab/lab_rows.c compares them). */
#include "cpu.h"
#include "rows_simd.h"

#include <math.h>
#include <stdlib.h>

/* max of v[i], NaN when any is NaN: a branch-free max and a NaN flag (both vectorise; the
 * "NaN wins" compare in one loop did not) */
#define DEFINE_ROW_MAX(T, SFX)                                                                    \
  static T row_max_##SFX(const T *v, int64_t n) {                                                 \
    T mx = -INFINITY;                                                                             \
    int nan = 0;                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                             \
      mx = v[i] > mx ? v[i] : mx;                                                                 \
      nan |= v[i] != v[i];                                                                        \
    }                                                                                             \
    return nan ? (T)NAN : mx;                                                                     \
  }
DEFINE_ROW_MAX(float, f32)
DEFINE_ROW_MAX(double, f64)

/* sum of v[i] in double: float runs of 8 lanes x 16, each run's total added in double */
static double sum_f32(const float *v, int64_t n) {
  double s = 0;
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    float lane[8] = {0};
    for (int64_t j = 0; j < 128; j += 8)
      for (int k = 0; k < 8; k++) lane[k] += v[i + j + k];
    for (int k = 0; k < 8; k++) s += lane[k];
  }
  for (; i < n; i++) s += v[i];
  return s;
}
static double sum_f64(const double *v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  return s;
}
/* e[i] = exp(v[i] - mx): float through the libm-free kg_cpu_exp_f32 */
static void shifted_exp_f32(float *e, const float *v, float mx, int64_t n) {
  for (int64_t i = 0; i < n; i++) e[i] = v[i] - mx;
  kg_cpu_exp_f32(e, e, n);
}
static void shifted_exp_f64(double *e, const double *v, double mx, int64_t n) {
  for (int64_t i = 0; i < n; i++) e[i] = exp(v[i] - mx);
}

/* ---- direct rows: f32 input and output, contiguous along dim ----------------------------------
 * No row buffer and no per-row offset arithmetic (row o starts at o * n): max in one pass, then
 * blocks of ROWS_BLOCK elements are shifted and exponentiated into y (or, for log_softmax, a stack
 * block) and summed while they sit in L1, then one scale (or subtract) pass. Float lanes per
 * block, block totals in double, as sum_f32 (rows_simd.h: AVX2 with a runtime check, as
 * kg_cpu_exp_f32). */
static void softmax_row_f32(float *y, const float *x, int64_t n, bool log_form) {
  float mx = kg_row_max_f32(x, n);
  if (mx == -INFINITY) mx = 0; /* a row of -inf: exp gives 0s, the sum 0 */
  double sum = 0;
  float tmp[ROWS_BLOCK];
  for (int64_t i = 0; i < n; i += ROWS_BLOCK) {
    int64_t m = n - i < ROWS_BLOCK ? n - i : ROWS_BLOCK;
    float *e = log_form ? tmp : y + i;
    for (int64_t j = 0; j < m; j++) e[j] = x[i + j] - mx;
    kg_cpu_exp_f32(e, e, m);
    sum += kg_rows_block(e, NULL, 0, false, m);
  }
  if (log_form) {
    float lse = mx + (float)log(sum);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] - lse;
  } else {
    float inv = (float)(1 / sum);
    for (int64_t i = 0; i < n; i++) y[i] *= inv;
  }
}

/* softmax: dx = y (g - sum(g y)); log_softmax: dx = g - exp(y) sum(g) */
static void softmax_grad_row_f32(float *dx, const float *g, const float *y, int64_t n, bool log_form) {
  double sum = 0;
  for (int64_t i = 0; i < n; i += ROWS_BLOCK) {
    int64_t m = n - i < ROWS_BLOCK ? n - i : ROWS_BLOCK;
    sum += kg_rows_block(g + i, log_form ? NULL : y + i, 0, false, m);
  }
  float s = (float)sum;
  if (!log_form) {
    for (int64_t i = 0; i < n; i++) dx[i] = y[i] * (g[i] - s);
    return;
  }
  float e[ROWS_BLOCK];
  for (int64_t i = 0; i < n; i += ROWS_BLOCK) {
    int64_t m = n - i < ROWS_BLOCK ? n - i : ROWS_BLOCK;
    kg_cpu_exp_f32(e, y + i, m);
    for (int64_t j = 0; j < m; j++) dx[i + j] = g[i + j] - e[j] * s;
  }
}

/* ---- direct columns: f32, contiguous, dim not the last -------------------------------------
 * x is [outer, n, inner] with the softmax along n: the buffered path would gather each row with
 * a stride of inner. Instead COLS neighbouring columns go together: their max, exponentials
 * and sums are element-wise loops over contiguous runs of COLS floats (the compiler vectorises
 * them), the sums in double per column. */
#define COLS 64

static void softmax_cols_f32(float *y, const float *x, int64_t n, int64_t inner, bool log_form) {
  for (int64_t j0 = 0; j0 < inner; j0 += COLS) {
    int64_t m = inner - j0 < COLS ? inner - j0 : COLS;
    float mx[COLS], e[COLS];
    double sum[COLS];
    int nan[COLS];
    for (int64_t j = 0; j < m; j++) mx[j] = -INFINITY, sum[j] = 0, nan[j] = 0;
    for (int64_t k = 0; k < n; k++) {
      const float *r = x + k * inner + j0;
      for (int64_t j = 0; j < m; j++) {
        mx[j] = r[j] > mx[j] ? r[j] : mx[j];
        nan[j] |= r[j] != r[j];
      }
    }
    for (int64_t j = 0; j < m; j++) mx[j] = nan[j] ? NAN : mx[j] == -INFINITY ? 0 : mx[j];
    for (int64_t k = 0; k < n; k++) {
      const float *r = x + k * inner + j0;
      float *t = log_form ? e : y + k * inner + j0;
      for (int64_t j = 0; j < m; j++) t[j] = r[j] - mx[j];
      kg_cpu_exp_f32(t, t, m);
      for (int64_t j = 0; j < m; j++) sum[j] += t[j];
    }
    for (int64_t j = 0; j < m; j++) e[j] = log_form ? mx[j] + (float)log(sum[j]) : (float)(1 / sum[j]);
    for (int64_t k = 0; k < n; k++) {
      const float *r = x + k * inner + j0;
      float *o = y + k * inner + j0;
      if (log_form)
        for (int64_t j = 0; j < m; j++) o[j] = r[j] - e[j];
      else
        for (int64_t j = 0; j < m; j++) o[j] *= e[j];
    }
  }
}

static void softmax_grad_cols_f32(float *dx, const float *g, const float *y, int64_t n, int64_t inner, bool log_form) {
  for (int64_t j0 = 0; j0 < inner; j0 += COLS) {
    int64_t m = inner - j0 < COLS ? inner - j0 : COLS;
    double sum[COLS] = {0};
    float s[COLS], e[COLS];
    for (int64_t k = 0; k < n; k++) {
      const float *gr = g + k * inner + j0, *yr = y + k * inner + j0;
      if (log_form)
        for (int64_t j = 0; j < m; j++) sum[j] += gr[j];
      else
        for (int64_t j = 0; j < m; j++) sum[j] += gr[j] * yr[j];
    }
    for (int64_t j = 0; j < m; j++) s[j] = (float)sum[j];
    for (int64_t k = 0; k < n; k++) {
      const float *gr = g + k * inner + j0, *yr = y + k * inner + j0;
      float *o = dx + k * inner + j0;
      if (log_form) {
        kg_cpu_exp_f32(e, yr, m);
        for (int64_t j = 0; j < m; j++) o[j] = gr[j] - e[j] * s[j];
      } else {
        for (int64_t j = 0; j < m; j++) o[j] = yr[j] * (gr[j] - s[j]);
      }
    }
  }
}

/* all f32 and contiguous with dim not the last non-1 dim: *inner = the elements after dim */
static bool direct_cols(const kg_tensor *const *ts, int nt, int dim, int64_t *inner) {
  for (int k = 0; k < nt; k++)
    if (ts[k]->dtype != KG_F32 || !kg_is_contiguous(ts[k])) return false;
  *inner = 1;
  for (int d = dim + 1; d < ts[0]->ndim; d++) *inner *= ts[0]->shape[d];
  return *inner > 1;
}

/* rows of n contiguous elements along the last (size > 1) dim of every operand, all f32, bf16
 * or f16 (the half types converted a row at a time into a float buffer: one copy, not the
 * buffered path's offset walk and scalar passes) */
static bool direct_rows(const kg_tensor *const *ts, int nt, int dim) {
  kg_dtype dt = ts[0]->dtype;
  if (dt != KG_F32 && dt != KG_BF16 && dt != KG_F16) return false;
  for (int k = 0; k < nt; k++) {
    const kg_tensor *t = ts[k];
    if (t->dtype != dt || !kg_is_contiguous(t)) return false;
    for (int d = dim + 1; d < t->ndim; d++)
      if (t->shape[d] != 1) return false;
  }
  return true;
}

/* KENG_SOFTMAX_DIRECT=0 forces the buffered path (the kernel lab compares both) */
static bool direct_enabled(void) { return kg_env_bool(KG_ENV_KENG_SOFTMAX_DIRECT); }

/* buf holds the row, tmp n more elements for the log form's exponentials */
#define SOFTMAX_ROWS(T, SFX, LOAD, STORE, LOG)                                                     \
  {                                                                                                \
    T *buf = malloc(sizeof(T) * (size_t)(n > 0 ? 2 * n : 1)), *tmp = buf + n;                      \
    if (!buf) failed = true;                                                                       \
    _Pragma("omp for schedule(static)") for (int64_t o = 0; o < px.nout; o++) {                    \
      if (!buf) continue;                                                                          \
      LOAD(buf, xb + kg_cpu_reduce_row_offset(&px, o) * xe, x->dtype, xs, n);                      \
      T mx = row_max_##SFX(buf, n);                                                                \
      if (mx == -INFINITY) mx = 0; /* a row of -inf: exp gives 0s, the sum 0 */                   \
      if (log_form) {                                                                              \
        shifted_exp_##SFX(tmp, buf, mx, n);                                                        \
        T lse = mx + (T)LOG(sum_##SFX(tmp, n));                                                    \
        for (int64_t i = 0; i < n; i++) buf[i] -= lse;                                             \
      } else {                                                                                     \
        shifted_exp_##SFX(buf, buf, mx, n);                                                        \
        T inv = (T)(1 / sum_##SFX(buf, n));                                                        \
        for (int64_t i = 0; i < n; i++) buf[i] *= inv;                                             \
      }                                                                                            \
      STORE(yb + kg_cpu_reduce_row_offset(&py, o) * ye, y->dtype, ys, buf, n);                     \
    }                                                                                              \
    free(buf);                                                                                     \
  }

static kg_status run(const kg_op_call *c, bool log_form) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  const kg_dim_params *dp = c->params;
  kg_cpu_reduce_plan px, py;
  kg_cpu_reduce_layout(x, 1u << dp->dim, &px);
  kg_cpu_reduce_layout(y, 1u << dp->dim, &py);
  int64_t n = px.rshape[0], xs = px.rstride[0], ys = py.rstride[0];
  int xe = (int)kg_elem_size(x), ye = (int)kg_elem_size(y);
  const char *xb = kg_data(x);
  char *yb = kg_data(y);
  bool failed = false;
  int64_t inner = 1;
  if (direct_enabled() && direct_rows((const kg_tensor *[]){x, y}, 2, dp->dim)) {
    bool conv = x->dtype != KG_F32;
#pragma omp parallel if (px.nout * n > KG_PAR_THRESHOLD && px.nout > 1)
    {
      float *buf = conv ? malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)) : NULL;
      if (conv && !buf) failed = true;
#pragma omp for schedule(static)
      for (int64_t o = 0; o < px.nout; o++) {
        if (!conv) {
          softmax_row_f32((float *)yb + o * n, (const float *)xb + o * n, n, log_form);
        } else if (buf) {
          kg_cpu_load_f32(buf, xb + o * n * xe, x->dtype, 1, n);
          softmax_row_f32(buf, buf, n, log_form);
          kg_cpu_store_f32(yb + o * n * ye, y->dtype, 1, buf, n);
        }
      }
      free(buf);
    }
  } else if (direct_enabled() && direct_cols((const kg_tensor *[]){x, y}, 2, dp->dim, &inner)) {
    int64_t outer = px.nout / inner;
#pragma omp parallel for if (px.nout * n > KG_PAR_THRESHOLD && outer > 1) schedule(static)
    for (int64_t o = 0; o < outer; o++)
      softmax_cols_f32((float *)yb + o * n * inner, (const float *)xb + o * n * inner, n, inner, log_form);
  } else {
#pragma omp parallel if (px.nout * n > KG_PAR_THRESHOLD && px.nout > 1)
    {
      if (x->dtype == KG_F64) SOFTMAX_ROWS(double, f64, kg_cpu_load_f64, kg_cpu_store_f64, log)
      else SOFTMAX_ROWS(float, f32, kg_cpu_load_f32, kg_cpu_store_f32, log)
    }
  }
  if (failed) return kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for a row of %lld", (long long)n);
  return KG_OK;
}

kg_status kg_cpu_softmax(const kg_op_call *c) { return run(c, false); }
kg_status kg_cpu_log_softmax(const kg_op_call *c) { return run(c, true); }

/* ---- backward: in {g, y} -> out {dx}, all of y's shape, reduced along dim ------------------- */

#define SOFTMAX_GRAD_ROWS(T, SFX, LOAD, STORE)                                                    \
  {                                                                                               \
    T *gb = malloc(sizeof(T) * (size_t)(n > 0 ? 2 * n : 1)), *yb = gb + n;                        \
    if (!gb) failed = true;                                                                       \
    _Pragma("omp for schedule(static)") for (int64_t o = 0; o < pg.nout; o++) {                   \
      if (!gb) continue;                                                                          \
      LOAD(gb, gbase + kg_cpu_reduce_row_offset(&pg, o) * ge, g->dtype, gs, n);                   \
      LOAD(yb, ybase + kg_cpu_reduce_row_offset(&py, o) * ye, y->dtype, ys, n);                   \
      if (log_form) {                                                                             \
        T s = (T)sum_##SFX(gb, n);                                                                \
        shifted_exp_##SFX(yb, yb, 0, n);                                                          \
        for (int64_t i = 0; i < n; i++) gb[i] -= yb[i] * s;                                       \
      } else {                                                                                    \
        double sum = 0;                                                                           \
        for (int64_t i = 0; i < n; i++) sum += (double)(gb[i] * yb[i]);                           \
        T s = (T)sum;                                                                             \
        for (int64_t i = 0; i < n; i++) gb[i] = yb[i] * (gb[i] - s);                              \
      }                                                                                           \
      STORE(dbase + kg_cpu_reduce_row_offset(&pd, o) * de, dx->dtype, ds, gb, n);                 \
    }                                                                                             \
    free(gb);                                                                                     \
  }

static kg_status run_backward(const kg_op_call *c, bool log_form) {
  const kg_tensor *g = c->in[0], *y = c->in[1];
  kg_tensor *dx = c->out[0];
  uint32_t mask = 1u << ((const kg_dim_params *)c->params)->dim;
  kg_cpu_reduce_plan pg, py, pd;
  kg_cpu_reduce_layout(g, mask, &pg);
  kg_cpu_reduce_layout(y, mask, &py);
  kg_cpu_reduce_layout(dx, mask, &pd);
  int64_t n = py.rshape[0], gs = pg.rstride[0], ys = py.rstride[0], ds = pd.rstride[0];
  int ge = (int)kg_elem_size(g), ye = (int)kg_elem_size(y), de = (int)kg_elem_size(dx);
  const char *gbase = kg_data(g), *ybase = kg_data(y);
  char *dbase = kg_data(dx);
  bool failed = false;
  int64_t inner = 1;
  if (direct_enabled() && direct_rows((const kg_tensor *[]){g, y, dx}, 3, ((const kg_dim_params *)c->params)->dim)) {
    bool conv = y->dtype != KG_F32;
#pragma omp parallel if (py.nout * n > KG_PAR_THRESHOLD && py.nout > 1)
    {
      float *gb = conv ? malloc(sizeof(float) * (size_t)(n > 0 ? 2 * n : 1)) : NULL, *yb = gb ? gb + n : NULL;
      if (conv && !gb) failed = true;
#pragma omp for schedule(static)
      for (int64_t o = 0; o < py.nout; o++) {
        if (!conv) {
          softmax_grad_row_f32((float *)dbase + o * n, (const float *)gbase + o * n, (const float *)ybase + o * n, n,
                               log_form);
        } else if (gb) {
          kg_cpu_load_f32(gb, gbase + o * n * ge, g->dtype, 1, n);
          kg_cpu_load_f32(yb, ybase + o * n * ye, y->dtype, 1, n);
          softmax_grad_row_f32(gb, gb, yb, n, log_form);
          kg_cpu_store_f32(dbase + o * n * de, dx->dtype, 1, gb, n);
        }
      }
      free(gb);
    }
  } else if (direct_enabled() && direct_cols((const kg_tensor *[]){g, y, dx}, 3, ((const kg_dim_params *)c->params)->dim, &inner)) {
    int64_t outer = py.nout / inner;
#pragma omp parallel for if (py.nout * n > KG_PAR_THRESHOLD && outer > 1) schedule(static)
    for (int64_t o = 0; o < outer; o++)
      softmax_grad_cols_f32((float *)dbase + o * n * inner, (const float *)gbase + o * n * inner,
                            (const float *)ybase + o * n * inner, n, inner, log_form);
  } else {
#pragma omp parallel if (py.nout * n > KG_PAR_THRESHOLD && py.nout > 1)
    {
      if (dx->dtype == KG_F64) SOFTMAX_GRAD_ROWS(double, f64, kg_cpu_load_f64, kg_cpu_store_f64)
      else SOFTMAX_GRAD_ROWS(float, f32, kg_cpu_load_f32, kg_cpu_store_f32)
    }
  }
  if (failed) return kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for a row of %lld", (long long)n);
  return KG_OK;
}

kg_status kg_cpu_softmax_backward(const kg_op_call *c) { return run_backward(c, false); }
kg_status kg_cpu_log_softmax_backward(const kg_op_call *c) { return run_backward(c, true); }
