/* optim.c (cpu) — the fused SGD and Adam updates (formulas in engine/ops/optim.c).
 *
 * Operands p, g and the state tensors share one shape; the strided iterator walks them together
 * (any strides) and splits large tensors across threads. Each run is loaded into float buffers
 * (double when p is f64), updated, and stored back in each tensor's own dtype.
 */
#include "cpu.h"

#include <tgmath.h>

typedef struct {
  kg_dtype dt[KG_ITER_MAX];
  int nops;
  bool wide;
  const void *params;
  double alpha; /* Adam: lr · sqrt(1 − β2^t) / (1 − β1^t) */
} optim_ctx;

#define LOAD_OPS(T, LOAD)                                                                    \
  for (int k = 0; k < c->nops; k++)                                                          \
    LOAD(buf[k], ptr[k] + i * stride[k] * kg_dtype_info[c->dt[k]].size, c->dt[k], stride[k], m);
#define STORE_OP(STORE, k) \
  STORE(ptr[k] + i * stride[k] * kg_dtype_info[c->dt[k]].size, c->dt[k], stride[k], buf[k], m)

/* operands {p, g[, buf]} */
#define SGD_RUN(T, LOAD, STORE)                                                              \
  {                                                                                          \
    const kg_sgd_params *q = c->params;                                                      \
    T buf[3][KG_CHUNK];                                                                      \
    T lr = (T)q->lr, wd = (T)q->weight_decay, mu = (T)q->momentum, damp = (T)(1 - q->dampening); \
    T decay = (T)(q->lr * q->weight_decay);                                                  \
    bool l2 = q->weight_decay != 0 && !q->decoupled, dec = q->weight_decay != 0 && q->decoupled; \
    bool mom = c->nops == 3, first = q->step == 1;                                           \
    for (int64_t i = 0; i < n; i += KG_CHUNK) {                                              \
      int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;                                       \
      LOAD_OPS(T, LOAD)                                                                      \
      T *P = buf[0], *G = buf[1], *B = buf[2];                                               \
      for (int64_t j = 0; j < m; j++) {                                                      \
        T p = P[j], g = G[j];                                                                \
        if (l2) g += wd * p;                                                                 \
        if (dec) p -= decay * p;                                                             \
        if (mom) {                                                                           \
          T b = first ? g : mu * B[j] + damp * g;                                            \
          B[j] = b;                                                                          \
          g = q->nesterov ? g + mu * b : b;                                                  \
        }                                                                                    \
        P[j] = p - lr * g;                                                                   \
      }                                                                                      \
      STORE_OP(STORE, 0);                                                                    \
      if (mom) STORE_OP(STORE, 2);                                                           \
    }                                                                                        \
  }

/* operands {p, g, m, v} */
#define ADAM_RUN(T, LOAD, STORE)                                                             \
  {                                                                                          \
    const kg_adam_params *q = c->params;                                                     \
    T buf[4][KG_CHUNK];                                                                      \
    T wd = (T)q->weight_decay, decay = (T)(q->weight_decay * q->lr), alpha = (T)c->alpha;    \
    T omb1 = (T)(1 - q->beta1), omb2 = (T)(1 - q->beta2), eps = (T)q->eps;                   \
    bool l2 = q->weight_decay != 0 && !q->decoupled, dec = q->weight_decay != 0 && q->decoupled; \
    for (int64_t i = 0; i < n; i += KG_CHUNK) {                                              \
      int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;                                       \
      LOAD_OPS(T, LOAD)                                                                      \
      T *P = buf[0], *G = buf[1], *M = buf[2], *V = buf[3];                                  \
      for (int64_t j = 0; j < m; j++) {                                                      \
        T p = P[j], g = G[j];                                                                \
        if (l2) g += wd * p;                                                                 \
        if (dec) p -= p * decay;                                                             \
        T mj = M[j] + (g - M[j]) * omb1, vj = V[j] + (g * g - V[j]) * omb2;                  \
        M[j] = mj;                                                                           \
        V[j] = vj;                                                                           \
        P[j] = p - alpha * mj / (sqrt(vj) + eps);                                            \
      }                                                                                      \
      STORE_OP(STORE, 0);                                                                    \
      STORE_OP(STORE, 2);                                                                    \
      STORE_OP(STORE, 3);                                                                    \
    }                                                                                        \
  }

static void sgd_run(void *ctx, char *const *ptr, const int64_t *stride, int64_t n) {
  const optim_ctx *c = ctx;
  if (c->wide) SGD_RUN(double, kg_cpu_load_f64, kg_cpu_store_f64)
  else SGD_RUN(float, kg_cpu_load_f32, kg_cpu_store_f32)
}

static void adam_run(void *ctx, char *const *ptr, const int64_t *stride, int64_t n) {
  const optim_ctx *c = ctx;
  if (c->wide) ADAM_RUN(double, kg_cpu_load_f64, kg_cpu_store_f64)
  else ADAM_RUN(float, kg_cpu_load_f32, kg_cpu_store_f32)
}

/* iterates over {out[0], in[0], out[1], ...}: the parameter, its gradient, then the state */
static kg_status run(const kg_op_call *call, kg_iter_fn fn, double alpha) {
  optim_ctx c = {{0}, 0, call->out[0]->dtype == KG_F64, call->params, alpha};
  const kg_tensor *ts[KG_ITER_MAX] = {call->out[0], call->in[0]};
  for (int j = 1; j < call->nout; j++)
    if (call->out[j]) ts[1 + j] = call->out[j];
  c.nops = 1 + call->nout;
  if (call->nout == 2 && !call->out[1]) c.nops = 2;
  for (int k = 0; k < c.nops; k++) c.dt[k] = ts[k]->dtype;
  kg_iter it;
  kg_iter_init(&it, c.nops, ts);
  kg_iter_run(&it, fn, &c);
  return KG_OK;
}

kg_status kg_cpu_sgd_step(const kg_op_call *c) { return run(c, sgd_run, 0); }

kg_status kg_cpu_adam_step(const kg_op_call *c) {
  const kg_adam_params *q = c->params;
  double t = (double)q->step;
  double alpha = q->lr * sqrt(1 - pow(q->beta2, t)) / (1 - pow(q->beta1, t));
  return run(c, adam_run, alpha);
}
