/* elementwise.c (cpu) — unary, binary, clamp, where and the fused unary backward.
 * Each run of elements is loaded into a float (double when any operand is f64 or integer)
 * buffer, computed with the formulas of keng/scalar.h, and stored in the output dtype. */
#include "cpu.h"

#include <keng/scalar.h>
#include <tgmath.h>

typedef struct {
  kg_op op;
  kg_dtype dt[KG_ITER_MAX];
  int nops;
  bool wide;
  const void *params;
} ew_ctx;

#define UNARY_BODY(T, op, y, x, n)                                                      \
  switch (op) {                                                                         \
  case KG_OP_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;                  \
  case KG_OP_EXP: for (int64_t i = 0; i < n; i++) y[i] = exp(x[i]); break;             \
  case KG_OP_LOG: for (int64_t i = 0; i < n; i++) y[i] = log(x[i]); break;             \
  case KG_OP_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrt(x[i]); break;           \
  case KG_OP_RSQRT: for (int64_t i = 0; i < n; i++) y[i] = (T)1 / sqrt(x[i]); break;   \
  case KG_OP_ABS: for (int64_t i = 0; i < n; i++) y[i] = fabs(x[i]); break;            \
  case KG_OP_SIN: for (int64_t i = 0; i < n; i++) y[i] = sin(x[i]); break;             \
  case KG_OP_COS: for (int64_t i = 0; i < n; i++) y[i] = cos(x[i]); break;             \
  case KG_OP_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanh(x[i]); break;           \
  case KG_OP_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = KG_SIGMOID(T, x[i]); break; \
  case KG_OP_RELU: for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : (T)0; break; \
  case KG_OP_SILU: for (int64_t i = 0; i < n; i++) y[i] = KG_SILU(T, x[i]); break;     \
  case KG_OP_GELU: for (int64_t i = 0; i < n; i++) y[i] = KG_GELU(T, x[i]); break;     \
  case KG_OP_GELU_TANH: for (int64_t i = 0; i < n; i++) y[i] = KG_GELU_TANH(T, x[i]); break; \
  case KG_OP_QUICK_GELU: for (int64_t i = 0; i < n; i++) y[i] = KG_QUICK_GELU(T, x[i]); break; \
  case KG_OP_LOGICAL_NOT: for (int64_t i = 0; i < n; i++) y[i] = x[i] == 0; break;     \
  default: break;                                                                       \
  }

#define BINARY_BODY(T, op, y, a, b, n)                                                            \
  switch (op) {                                                                                   \
  case KG_OP_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;                      \
  case KG_OP_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;                      \
  case KG_OP_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;                      \
  case KG_OP_DIV: for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;                      \
  case KG_OP_POW: for (int64_t i = 0; i < n; i++) y[i] = pow(a[i], b[i]); break;                  \
  case KG_OP_MAXIMUM: for (int64_t i = 0; i < n; i++) y[i] = (a[i] > b[i] || a[i] != a[i]) ? a[i] : b[i]; break; \
  case KG_OP_MINIMUM: for (int64_t i = 0; i < n; i++) y[i] = (a[i] < b[i] || a[i] != a[i]) ? a[i] : b[i]; break; \
  case KG_OP_EQ: for (int64_t i = 0; i < n; i++) y[i] = a[i] == b[i]; break;                      \
  case KG_OP_NE: for (int64_t i = 0; i < n; i++) y[i] = a[i] != b[i]; break;                      \
  case KG_OP_LT: for (int64_t i = 0; i < n; i++) y[i] = a[i] < b[i]; break;                       \
  case KG_OP_LE: for (int64_t i = 0; i < n; i++) y[i] = a[i] <= b[i]; break;                      \
  case KG_OP_GT: for (int64_t i = 0; i < n; i++) y[i] = a[i] > b[i]; break;                       \
  case KG_OP_GE: for (int64_t i = 0; i < n; i++) y[i] = a[i] >= b[i]; break;                      \
  default: break;                                                                                 \
  }

/* dx = g * f'(x) where s is the saved input x or output y (see the ops.def saves column) */
#define UNARY_GRAD_BODY(T, op, dx, g, s, n, lo, hi)                                                    \
  switch (op) {                                                                                        \
  case KG_OP_EXP: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * s[i]; break;                          \
  case KG_OP_LOG: for (int64_t i = 0; i < n; i++) dx[i] = g[i] / s[i]; break;                          \
  case KG_OP_SQRT: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * (T)0.5 / s[i]; break;                \
  case KG_OP_RSQRT: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * (T)-0.5 * s[i] * s[i] * s[i]; break; \
  case KG_OP_ABS: for (int64_t i = 0; i < n; i++) dx[i] = s[i] > 0 ? g[i] : s[i] < 0 ? -g[i] : (T)0; break; \
  case KG_OP_SIN: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * cos(s[i]); break;                     \
  case KG_OP_COS: for (int64_t i = 0; i < n; i++) dx[i] = -g[i] * sin(s[i]); break;                    \
  case KG_OP_TANH: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * ((T)1 - s[i] * s[i]); break;          \
  case KG_OP_SIGMOID: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * s[i] * ((T)1 - s[i]); break;       \
  case KG_OP_RELU: for (int64_t i = 0; i < n; i++) dx[i] = s[i] > 0 ? g[i] : (T)0; break;              \
  case KG_OP_SILU: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * KG_SILU_GRAD(T, s[i]); break;        \
  case KG_OP_GELU: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * KG_GELU_GRAD(T, s[i]); break;        \
  case KG_OP_GELU_TANH: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * KG_GELU_TANH_GRAD(T, s[i]); break; \
  case KG_OP_QUICK_GELU: for (int64_t i = 0; i < n; i++) dx[i] = g[i] * KG_QUICK_GELU_GRAD(T, s[i]); break; \
  case KG_OP_CLAMP:                                                                                    \
    for (int64_t i = 0; i < n; i++)                                                                    \
      dx[i] = ((lo != lo || s[i] >= lo) && (hi != hi || s[i] <= hi)) ? g[i] : (T)0;                    \
    break;                                                                                             \
  default: break;                                                                                      \
  }

#define CLAMP_BODY(T, y, x, n, lo, hi)                                  \
  for (int64_t i = 0; i < n; i++) {                                     \
    T v = x[i];                                                         \
    if (lo == lo && v < (T)lo) v = (T)lo;                               \
    if (hi == hi && v > (T)hi) v = (T)hi;                               \
    y[i] = v;                                                           \
  }

#define WHERE_BODY(y, c, a, b, n) \
  for (int64_t i = 0; i < n; i++) y[i] = c[i] != 0 ? a[i] : b[i];

/* one chunked run; T is float or double, LOAD/STORE the matching converters */
#define EW_RUN(T, LOAD, STORE)                                                                   \
  {                                                                                              \
    T buf[KG_ITER_MAX][KG_CHUNK];                                                                \
    for (int64_t i = 0; i < n; i += KG_CHUNK) {                                                  \
      int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;                                           \
      for (int k = 1; k < c->nops; k++)                                                          \
        LOAD(buf[k], ptr[k] + i * stride[k] * kg_dtype_info[c->dt[k]].size, c->dt[k], stride[k], m); \
      T *y = buf[0], *a = buf[1], *b = buf[2], *w = buf[3];                                      \
      (void)b;                                                                                   \
      (void)w;                                                                                   \
      switch (c->op) {                                                                           \
      case KG_OP_UNARY_BACKWARD: {                                                               \
        const kg_unary_backward_params *p = c->params;                                           \
        double lo = p->lo, hi = p->hi;                                                           \
        UNARY_GRAD_BODY(T, p->op, y, a, b, m, lo, hi)                                            \
      } break;                                                                                   \
      case KG_OP_CLAMP: {                                                                        \
        const kg_clamp_params *p = c->params;                                                    \
        CLAMP_BODY(T, y, a, m, p->lo, p->hi)                                                     \
      } break;                                                                                   \
      case KG_OP_WHERE: WHERE_BODY(y, a, b, w, m) break;                                         \
      default:                                                                                   \
        if (c->nops == 2) {                                                                      \
          UNARY_BODY(T, c->op, y, a, m)                                                          \
        } else {                                                                                 \
          BINARY_BODY(T, c->op, y, a, b, m)                                                      \
        }                                                                                        \
      }                                                                                          \
      STORE(ptr[0] + i * stride[0] * kg_dtype_info[c->dt[0]].size, c->dt[0], stride[0], y, m);   \
    }                                                                                            \
  }

static void ew_run(void *ctx, char *const *ptr, const int64_t *stride, int64_t n) {
  const ew_ctx *c = ctx;
  if (c->wide) EW_RUN(double, kg_cpu_load_f64, kg_cpu_store_f64)
  else EW_RUN(float, kg_cpu_load_f32, kg_cpu_store_f32)
}

static kg_status run(const kg_op_call *call) {
  ew_ctx c = {call->op, {0}, 1 + call->nin, false, call->params};
  const kg_tensor *ts[KG_ITER_MAX] = {call->out[0]};
  c.dt[0] = call->out[0]->dtype;
  c.wide = kg_cpu_wide(c.dt[0]);
  for (int k = 0; k < call->nin; k++) {
    ts[k + 1] = call->in[k];
    c.dt[k + 1] = call->in[k]->dtype;
    if (kg_cpu_wide(c.dt[k + 1])) c.wide = true;
  }
  kg_iter it;
  kg_iter_init(&it, c.nops, ts);
  kg_iter_run(&it, ew_run, &c);
  return KG_OK;
}

#define KERNEL(name) \
  kg_status kg_cpu_##name(const kg_op_call *c) { return run(c); }
KERNEL(neg) KERNEL(exp) KERNEL(log) KERNEL(sqrt) KERNEL(rsqrt) KERNEL(abs) KERNEL(sin) KERNEL(cos)
KERNEL(tanh) KERNEL(sigmoid) KERNEL(relu) KERNEL(silu) KERNEL(gelu) KERNEL(gelu_tanh) KERNEL(quick_gelu)
KERNEL(logical_not) KERNEL(clamp) KERNEL(unary_backward)
KERNEL(add) KERNEL(sub) KERNEL(mul) KERNEL(div) KERNEL(pow) KERNEL(maximum) KERNEL(minimum)
KERNEL(eq) KERNEL(ne) KERNEL(lt) KERNEL(le) KERNEL(gt) KERNEL(ge) KERNEL(where)
