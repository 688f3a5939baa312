/* softmax.c (cpu) — softmax and log_softmax along one dim. Each row of N elements (any
 * stride) is loaded into a per-thread buffer (float, or double for f64), shifted by its max,
 * exponentiated and normalised; the sum of exponentials accumulates in double. */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>

#define SOFTMAX_ROWS(T, LOAD, STORE, EXP, LOG)                                                     \
  {                                                                                                \
    T *buf = malloc(sizeof(T) * (size_t)(n ? n : 1));                                              \
    if (!buf) failed = true;                                                                       \
    _Pragma("omp for schedule(static)") for (int64_t o = 0; o < px.nout; o++) {                    \
      if (!buf) continue;                                                                          \
      LOAD(buf, xb + kg_cpu_reduce_row_offset(&px, o) * xe, x->dtype, xs, n);                      \
      T mx = -INFINITY;                                                                            \
      for (int64_t i = 0; i < n; i++)                                                              \
        if (buf[i] > mx || buf[i] != buf[i]) mx = buf[i];                                          \
      if (mx == -INFINITY) mx = 0; /* a row of -inf: exp gives 0s, the sum 0 */                   \
      double sum = 0;                                                                              \
      if (log_form) {                                                                              \
        for (int64_t i = 0; i < n; i++) sum += EXP(buf[i] - mx);                                   \
        T lse = mx + (T)LOG(sum);                                                                  \
        for (int64_t i = 0; i < n; i++) buf[i] -= lse;                                             \
      } else {                                                                                     \
        for (int64_t i = 0; i < n; i++) sum += buf[i] = EXP(buf[i] - mx);                          \
        T inv = (T)(1 / sum);                                                                      \
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
    if (x->dtype == KG_F64) SOFTMAX_ROWS(double, kg_cpu_load_f64, kg_cpu_store_f64, exp, log)
    else SOFTMAX_ROWS(float, kg_cpu_load_f32, kg_cpu_store_f32, expf, log)
  }
  if (failed) return kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for a row of %lld", (long long)n);
  return KG_OK;
}

kg_status kg_cpu_softmax(const kg_op_call *c) { return run(c, false); }
kg_status kg_cpu_log_softmax(const kg_op_call *c) { return run(c, true); }
