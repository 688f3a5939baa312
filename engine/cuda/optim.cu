/* optim.cu — the fused SGD and Adam updates on CUDA: one grid-stride kernel per parameter over
 * the strided iterator {p, g, state...}. Formulas and their order are those of engine/ops/optim.c
 * and engine/cpu/optim.c: compute in float (double when p is f64), store each tensor in its own
 * dtype. With lr_t / step_t (keng.optim on cuda) each thread first reads lr and the step count
 * from device memory and derives α (Adam) or the first-step flag (SGD) in double, as the host
 * would: a CUDA Graph replay of the update then sees the values written before its launch. */
#include "cuda.cuh"

/* stores v into a floating tensor whose dtype is known at run time */
template <class A> __device__ __forceinline__ void put_float(char *base, int dt, int64_t off, A v) {
  switch (dt) {
  case KG_F32: kg_put((float *)base + off, v); break;
  case KG_F64: kg_put((double *)base + off, v); break;
  case KG_BF16: kg_put((kg_bf16 *)base + off, v); break;
  default: kg_put((kg_f16 *)base + off, v); break;
  }
}

struct optim_args {
  double lr, wd, decay, mu, damp, alpha, omb1, omb2, eps, beta1, beta2, t;
  bool l2, decoupled, momentum, nesterov, first;
  const double *lr_p, *step_p; /* device scalars (lr_t / step_t) or NULL: then the values above */
};

/* the step's lr-derived values from the device scalars, as the host computes them (in double) */
__device__ __forceinline__ void sgd_scalars(optim_args &a) {
  if (a.lr_p) a.lr = *a.lr_p, a.decay = a.lr * a.wd;
  if (a.step_p) a.first = *a.step_p == 1.0;
}
__device__ __forceinline__ void adam_scalars(optim_args &a) {
  if (!a.lr_p && !a.step_p) return;
  double lr = a.lr_p ? *a.lr_p : a.lr, t = a.step_p ? *a.step_p : a.t;
  a.decay = a.wd * lr;
  a.alpha = lr * sqrt(1 - pow(a.beta2, t)) / (1 - pow(a.beta1, t));
}

/* operands {p, g[, buf]} */
template <class A> __global__ void sgd_kernel(kg_cuda_iter it, optim_args a, int64_t n) {
  sgd_scalars(a);
  KG_CUDA_FOR(i, n) {
    int64_t off[3];
    kg_cuda_offsets<3>(it, i, off);
    A p = kg_load<A>(it.base[0], it.dt[0], off[0]), g = kg_load<A>(it.base[1], it.dt[1], off[1]);
    if (a.l2) g += (A)a.wd * p;
    if (a.decoupled) p -= (A)a.decay * p;
    if (a.momentum) {
      A b = a.first ? g : (A)a.mu * kg_load<A>(it.base[2], it.dt[2], off[2]) + (A)a.damp * g;
      put_float(it.base[2], it.dt[2], off[2], b);
      g = a.nesterov ? g + (A)a.mu * b : b;
    }
    put_float(it.base[0], it.dt[0], off[0], p - (A)a.lr * g);
  }
}

/* operands {p, g, m, v} */
template <class A> __global__ void adam_kernel(kg_cuda_iter it, optim_args a, int64_t n) {
  adam_scalars(a);
  KG_CUDA_FOR(i, n) {
    int64_t off[4];
    kg_cuda_offsets<4>(it, i, off);
    A p = kg_load<A>(it.base[0], it.dt[0], off[0]), g = kg_load<A>(it.base[1], it.dt[1], off[1]);
    A m = kg_load<A>(it.base[2], it.dt[2], off[2]), v = kg_load<A>(it.base[3], it.dt[3], off[3]);
    if (a.l2) g += (A)a.wd * p;
    if (a.decoupled) p -= p * (A)a.decay;
    m = m + (g - m) * (A)a.omb1;
    v = v + (g * g - v) * (A)a.omb2;
    put_float(it.base[2], it.dt[2], off[2], m);
    put_float(it.base[3], it.dt[3], off[3], v);
    put_float(it.base[0], it.dt[0], off[0], p - (A)a.alpha * m / (sqrt(v) + (A)a.eps));
  }
}

/* iterates over {out[0], in[0], out[1], ...}: the parameter, its gradient, then the state */
static int operands(const kg_op_call *c, const kg_tensor **ts) {
  int n = 0;
  ts[n++] = c->out[0];
  ts[n++] = c->in[0];
  for (int j = 1; j < c->nout; j++)
    if (c->out[j]) ts[n++] = c->out[j];
  return n;
}

extern "C" kg_status kg_cuda_sgd_step(const kg_op_call *c) {
  const kg_sgd_params *q = (const kg_sgd_params *)c->params;
  const kg_tensor *ts[KG_CUDA_MAX_OPS];
  int nops = operands(c, ts);
  optim_args a = {};
  a.lr = q->lr, a.wd = q->weight_decay, a.decay = q->lr * q->weight_decay, a.mu = q->momentum;
  a.damp = 1 - q->dampening;
  a.l2 = q->weight_decay != 0 && !q->decoupled, a.decoupled = q->weight_decay != 0 && q->decoupled;
  a.momentum = nops == 3, a.nesterov = q->nesterov, a.first = q->step == 1;
  a.lr_p = q->lr_t ? (const double *)kg_data(q->lr_t) : NULL;
  a.step_p = q->step_t ? (const double *)kg_data(q->step_t) : NULL;
  kg_cuda_iter it;
  kg_cuda_iter_init(&it, nops, ts);
  int64_t n = kg_numel(c->out[0]);
  cudaStream_t s = kg_cuda_stream(c->out[0]->device.index);
  if (c->out[0]->dtype == KG_F64) sgd_kernel<double><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(it, a, n);
  else sgd_kernel<float><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(it, a, n);
  return kg_cuda_check("sgd_step", c->out[0]->device.index);
}

extern "C" kg_status kg_cuda_adam_step(const kg_op_call *c) {
  const kg_adam_params *q = (const kg_adam_params *)c->params;
  const kg_tensor *ts[KG_CUDA_MAX_OPS];
  int nops = operands(c, ts);
  double t = (double)q->step;
  optim_args a = {};
  a.wd = q->weight_decay, a.decay = q->weight_decay * q->lr;
  a.alpha = q->lr * sqrt(1 - pow(q->beta2, t)) / (1 - pow(q->beta1, t));
  a.omb1 = 1 - q->beta1, a.omb2 = 1 - q->beta2, a.eps = q->eps, a.beta1 = q->beta1, a.beta2 = q->beta2;
  a.lr = q->lr, a.t = t;
  a.lr_p = q->lr_t ? (const double *)kg_data(q->lr_t) : NULL;
  a.step_p = q->step_t ? (const double *)kg_data(q->step_t) : NULL;
  a.l2 = q->weight_decay != 0 && !q->decoupled, a.decoupled = q->weight_decay != 0 && q->decoupled;
  kg_cuda_iter it;
  kg_cuda_iter_init(&it, nops, ts);
  int64_t n = kg_numel(c->out[0]);
  cudaStream_t s = kg_cuda_stream(c->out[0]->device.index);
  if (c->out[0]->dtype == KG_F64) adam_kernel<double><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(it, a, n);
  else adam_kernel<float><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(it, a, n);
  return kg_cuda_check("adam_step", c->out[0]->device.index);
}
