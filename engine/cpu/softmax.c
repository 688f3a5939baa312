/* softmax.c (cpu) — softmax and log_softmax along one dim, and their fused backward passes.
 * Each row of N elements (any stride) is loaded into a per-thread buffer (float, or double for
 * f64), shifted by its max, exponentiated (float: kg_cpu_exp_f32, libm-free, <= 1 ulp) and
 * normalised; the sum of exponentials accumulates in double (float: runs of 8 lanes x 16
 * elements, each run's total added in double). The backward takes the saved output y and the gradient g, a row at a time:
 *   softmax      dx = y * (g - sum(g * y))
 *   log_softmax  dx = g - exp(y) * sum(g)
 * with the row sum in double (one pass to load and sum, one to write). */
#include "cpu.h"

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
#pragma omp parallel if (px.nout * n > KG_PAR_THRESHOLD && px.nout > 1)
  {
    if (x->dtype == KG_F64) SOFTMAX_ROWS(double, f64, kg_cpu_load_f64, kg_cpu_store_f64, log)
    else SOFTMAX_ROWS(float, f32, kg_cpu_load_f32, kg_cpu_store_f32, log)
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
#pragma omp parallel if (py.nout * n > KG_PAR_THRESHOLD && py.nout > 1)
  {
    if (dx->dtype == KG_F64) SOFTMAX_GRAD_ROWS(double, f64, kg_cpu_load_f64, kg_cpu_store_f64)
    else SOFTMAX_GRAD_ROWS(float, f32, kg_cpu_load_f32, kg_cpu_store_f32)
  }
  if (failed) return kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for a row of %lld", (long long)n);
  return KG_OK;
}

kg_status kg_cpu_softmax_backward(const kg_op_call *c) { return run_backward(c, false); }
kg_status kg_cpu_log_softmax_backward(const kg_op_call *c) { return run_backward(c, true); }
