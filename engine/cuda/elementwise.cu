/* elementwise.cu — unary, binary (broadcasting), clamp, where, the fused unary backward, and
 * the one generic strided kernel behind them (also used by fill, copy and tril/triu in
 * creation.cu). Formulas are the rows of engine/ops/elementwise.def, as on the CPU: compute in
 * float, or double when any operand is f64 or an integer; store in the output's dtype. */
#include "cuda.cuh"

#include <math.h>

/* The formulas of elementwise.def, one case per row (T = the compute type A). Only rows of the
 * table launch these kinds (their kg_cuda_<name> are generated from the same rows below), so the
 * value after each switch is never reached. */
template <class A> __device__ __forceinline__ A unary_f(int op, A x) {
  typedef A T;
  switch (op) {
#define KG_UNARY(ID, name, saves, grad, flags, F, D) \
  case KG_OP_##ID: return (A)(F);
#define KG_BINARY(ID, name, saves, grad, flags, F)
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
  }
  return (A)NAN;
}

template <class A> __device__ __forceinline__ A binary_f(int op, A a, A b) {
  typedef A T;
  switch (op) {
#define KG_UNARY(ID, name, saves, grad, flags, F, D)
#define KG_BINARY(ID, name, saves, grad, flags, F) \
  case KG_OP_##ID: return (A)(F);
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
  }
  return (A)NAN;
}

/* dx = g f'(s), s the saved input or output (the row's saves column); clamp's gradient passes
 * inside [lo, hi] (absent bounds are -inf / +inf) */
#define GRAD_CASE_GRAD(ID, D) \
  case KG_OP_##ID: return (A)(D);
#define GRAD_CASE_NOGRAD(ID, D)
template <class A> __device__ __forceinline__ A unary_grad_f(int op, A g, A s, double lo, double hi) {
  typedef A T;
  switch (op) {
#define KG_UNARY(ID, name, saves, grad, flags, F, D) GRAD_CASE_##grad(ID, D)
#define KG_BINARY(ID, name, saves, grad, flags, F)
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
  case KG_OP_CLAMP: return (s >= lo && s <= hi) ? g : (A)0;
  }
  return (A)NAN;
}

/* N operands (output first); S the output's storage type, A the compute type */
template <class S, class A, int N> __global__ void ew_kernel(kg_cuda_iter it, kg_cuda_ew_args a, int64_t n) {
  KG_CUDA_FOR(i, n) {
    int64_t off[N];
    kg_cuda_offsets<N>(it, i, off);
    A x[N];
#pragma unroll
    for (int k = 1; k < N; k++) x[k] = kg_load<A>(it.base[k], it.dt[k], off[k]);
    A y = 0;
    if constexpr (N == 1) { /* fill */
      y = (A)a.lo;
    } else if constexpr (N == 2) {
      A v = x[1];
      if (a.kind == KG_EW_UNARY) {
        v = unary_f<A>(a.op, v);
      } else if (a.kind == KG_EW_CLAMP) {
        if (v < (A)a.lo) v = (A)a.lo; /* absent bounds are -inf / +inf */
        if (v > (A)a.hi) v = (A)a.hi;
        if (a.lo != a.lo || a.hi != a.hi) v = (A)NAN; /* a NaN bound: NaN everywhere (PyTorch) */
      } else if (a.kind == KG_EW_TRI) {
        int64_t col = i % a.cols, row = (i / a.cols) % a.rows;
        bool keep = a.op ? col - row <= a.k : col - row >= a.k;
        if (!keep) v = 0;
      } /* else copy with conversion */
      y = v;
    } else if constexpr (N == 3) {
      y = a.kind == KG_EW_UGRAD ? unary_grad_f<A>(a.op, x[1], x[2], a.lo, a.hi) : binary_f<A>(a.op, x[1], x[2]);
    } else { /* where */
      y = x[1] != 0 ? x[2] : x[3];
    }
    kg_put((S *)it.base[0] + off[0], y);
  }
}

/* same-dtype copy: moves the stored bits (exact for every dtype) */
template <class S> __global__ void move_kernel(kg_cuda_iter it, int64_t n) {
  KG_CUDA_FOR(i, n) {
    int64_t off[2];
    kg_cuda_offsets<2>(it, i, off);
    ((S *)it.base[0])[off[0]] = ((const S *)it.base[1])[off[1]];
  }
}

template <class S, class A>
static void launch(const kg_cuda_iter &it, const kg_cuda_ew_args &a, int64_t n, cudaStream_t s) {
  unsigned blocks = kg_cuda_blocks(n);
  switch (it.nops) {
  case 1: ew_kernel<S, A, 1><<<blocks, KG_CUDA_THREADS, 0, s>>>(it, a, n); break;
  case 2: ew_kernel<S, A, 2><<<blocks, KG_CUDA_THREADS, 0, s>>>(it, a, n); break;
  case 3: ew_kernel<S, A, 3><<<blocks, KG_CUDA_THREADS, 0, s>>>(it, a, n); break;
  default: ew_kernel<S, A, 4><<<blocks, KG_CUDA_THREADS, 0, s>>>(it, a, n); break;
  }
}

kg_status kg_cuda_ew(const char *name, const kg_cuda_ew_args &a, kg_tensor *out, int nin, const kg_tensor *const *in) {
  const kg_tensor *ts[KG_CUDA_MAX_OPS] = {out};
  bool wide = kg_cuda_wide(out->dtype), same = true;
  for (int k = 0; k < nin; k++) {
    ts[k + 1] = in[k];
    if (in[k]->device.type != KG_DEV_CUDA || in[k]->device.index != out->device.index)
      return kg_error(KG_ERR_DEVICE, name, "input %d is not on the output's device", k + 1);
    wide = wide || kg_cuda_wide(in[k]->dtype);
    same = same && in[k]->dtype == out->dtype;
  }
  int64_t n = kg_numel(out);
  if (n == 0) return KG_OK;
  kg_cuda_iter it;
  kg_cuda_iter_init(&it, 1 + nin, ts);
  cudaStream_t s = kg_cuda_stream(out->device.index);
  if (a.kind == KG_EW_COPY && same) {
    KG_CUDA_DISPATCH(name, out->dtype, S, move_kernel<S><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(it, n))
  } else if (a.kind == KG_EW_FILL) { /* the value arrives as a double, stored as the CPU stores it */
    KG_CUDA_DISPATCH(name, out->dtype, S, launch<S, double>(it, a, n, s))
  } else if (wide) {
    KG_CUDA_DISPATCH(name, out->dtype, S, launch<S, double>(it, a, n, s))
  } else {
    KG_CUDA_DISPATCH(name, out->dtype, S, launch<S, float>(it, a, n, s))
  }
  return kg_cuda_check(name, out->device.index);
}

static kg_status run(const kg_op_call *c, int kind) {
  kg_cuda_ew_args a = {kind, (int)c->op, NAN, NAN, 0, 0, 0};
  if (kind == KG_EW_CLAMP) {
    const kg_clamp_params *p = (const kg_clamp_params *)c->params;
    a.lo = p->lo, a.hi = p->hi;
  } else if (kind == KG_EW_UGRAD) {
    const kg_unary_backward_params *p = (const kg_unary_backward_params *)c->params;
    a.op = (int)p->op, a.lo = p->lo, a.hi = p->hi;
    if (p->op != KG_OP_CLAMP && (kg_op_info[p->op].kind != KG_KIND_UNARY || !kg_op_info[p->op].differentiable))
      return kg_error(KG_ERR_VALUE, "unary_backward", "%s has no derivative", kg_op_info[p->op].name);
  }
  return kg_cuda_ew(kg_op_info[c->op].name, a, c->out[0], c->nin, c->in);
}

/* kg_cuda_<name> for every row of elementwise.def */
#define KG_UNARY(ID, name, saves, grad, flags, F, D) \
  extern "C" kg_status kg_cuda_##name(const kg_op_call *c) { return run(c, KG_EW_UNARY); }
#define KG_BINARY(ID, name, saves, grad, flags, F) \
  extern "C" kg_status kg_cuda_##name(const kg_op_call *c) { return run(c, KG_EW_BINARY); }
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
extern "C" kg_status kg_cuda_where(const kg_op_call *c) { return run(c, KG_EW_WHERE); }
extern "C" kg_status kg_cuda_clamp(const kg_op_call *c) { return run(c, KG_EW_CLAMP); }
extern "C" kg_status kg_cuda_unary_backward(const kg_op_call *c) { return run(c, KG_EW_UGRAD); }
