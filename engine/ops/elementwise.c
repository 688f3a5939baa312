/* elementwise.c — unary, binary (broadcasting), clamp, where; their backward passes.
 * A unary op's derivative runs as one fused UNARY_BACKWARD kernel with the derivative column of
 * its elementwise.def row; binary backward passes are built from ops below. */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>

/* output dtype of a unary op (the flags of its elementwise.def row) */
static kg_dtype unary_dtype(kg_op op, kg_dtype in) {
  unsigned f = kg_op_info[op].flags;
  if (f & KG_OPF_COMPARE) return KG_BOOL;
  if (f & KG_OPF_INT) return in;
  return kg_dtype_info[in].is_float ? in : KG_F32;
}

kg_status kg_unary(kg_tensor **out, kg_op op, const kg_tensor *x) {
  if (kg_op_info[op].kind != KG_KIND_UNARY) return kg_error(KG_ERR_VALUE, kg_op_info[op].name, "not a unary op");
  if (x->dtype == KG_BOOL && (kg_op_info[op].flags & KG_OPF_INT)) /* neg, abs, relu: PyTorch refuses these too */
    return kg_error(KG_ERR_TYPE, kg_op_info[op].name, "not supported for a bool tensor%s", op == KG_OP_NEG ?
                    "; to invert a mask use logical_not()" : "; convert it first (e.g. :long() or :float())");
  KG_TRY(kg_new_like(out, x, x->ndim, x->shape, unary_dtype(op, x->dtype)));
  kg_status s = kg_op_run(op, 1, out, 1, &x, NULL, 0);
  if (s) kg_tensor_release(*out);
  return s;
}

static kg_status binary_shape(const char *name, const kg_tensor *a, const kg_tensor *b, int *nd, int64_t *shape) {
  char x[KG_SHAPE_STR_MAX], y[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[2] = {a, b};
  KG_TRY(kg_check_same_device(name, 2, ts));
  if (!kg_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, nd, shape))
    return kg_error(KG_ERR_SHAPE, name, "shapes %s and %s cannot be broadcast", KG_SHAPE(a, x),
                    KG_SHAPE(b, y));
  return KG_OK;
}

/* Two bool operands, as PyTorch: add is logical or and mul logical and (a bool result: the store
 * is != 0), maximum / minimum and comparisons stay bool, div gives floats; sub and pow have no
 * bool meaning and are refused. */
static kg_status check_bool_operands(kg_op op, kg_dtype dt) {
  if (dt != KG_BOOL || (op != KG_OP_SUB && op != KG_OP_POW)) return KG_OK;
  return kg_error(KG_ERR_TYPE, kg_op_info[op].name, "not supported for two bool tensors%s",
                  op == KG_OP_SUB ? "; for a mask difference use logical_xor (a ~= b) or convert with :long()" : "");
}

/* the result dtype of a <op> b: promoted, bool for comparisons, float for integer division */
static kg_status binary_dtype(kg_op op, const kg_tensor *a, const kg_tensor *b, kg_dtype *out) {
  kg_dtype dt = kg_dtype_promote(a->dtype, b->dtype);
  KG_TRY(check_bool_operands(op, dt));
  if (kg_op_info[op].flags & KG_OPF_COMPARE) dt = KG_BOOL;
  else if (!(kg_op_info[op].flags & KG_OPF_INT) && !kg_dtype_info[dt].is_float) dt = KG_F32; /* div */
  *out = dt;
  return KG_OK;
}

kg_status kg_binary(kg_tensor **out, kg_op op, const kg_tensor *a, const kg_tensor *b) {
  if (kg_op_info[op].kind != KG_KIND_BINARY) return kg_error(KG_ERR_VALUE, kg_op_info[op].name, "not a binary op");
  int nd;
  int64_t shape[KG_MAX_DIMS];
  KG_TRY(binary_shape(kg_op_info[op].name, a, b, &nd, shape));
  kg_dtype dt;
  KG_TRY(binary_dtype(op, a, b, &dt));
  KG_TRY(kg_new_like(out, a, nd, shape, dt));
  const kg_tensor *in[2] = {a, b};
  kg_status s = kg_op_run(op, 1, out, 2, in, NULL, 0);
  if (s) kg_tensor_release(*out);
  return s;
}

kg_status kg_binary_scalar(kg_tensor **out, kg_op op, const kg_tensor *a, double v, bool scalar_first) {
  /* a number takes the tensor's dtype, unless it needs a float and the tensor is integral */
  kg_dtype dt = a->dtype;
  if (!kg_dtype_info[dt].is_float && (v != floor(v) || !isfinite(v))) dt = KG_F32;
  if (dt == KG_BOOL) dt = KG_I64; /* a number with a bool tensor is an integer (PyTorch: b + 1 is [2, 1]) */
  if (!kg_value_fits(v, dt)) dt = dt == KG_U8 && kg_value_fits(v, KG_I64) ? KG_I64 : KG_F32;
  if (op == KG_OP_POW && !scalar_first && !kg_dtype_info[dt].is_float && v < 0) /* PyTorch refuses it too */
    return kg_error(KG_ERR_VALUE, "pow", "an integer tensor (%s) to a negative integer power (%g) is not allowed; "
                    "convert it to floats first (e.g. t:double() ^ %g)", kg_dtype_info[a->dtype].name, v, v);
  kg_tensor *s;
  KG_TRY(kg_scalar(&s, v, dt, a->device));
  kg_status st = scalar_first ? kg_binary(out, op, s, a) : kg_binary(out, op, a, s);
  kg_tensor_release(s);
  return st;
}

kg_status kg_binary_(kg_op op, kg_tensor *a, const kg_tensor *b) {
  int nd;
  int64_t shape[KG_MAX_DIMS];
  char x[KG_SHAPE_STR_MAX], y[KG_SHAPE_STR_MAX];
  char name[32]; /* errors name the call the user made: add_, mul_, ... */
  snprintf(name, sizeof name, "%s_", kg_op_info[op].name);
  KG_TRY(kg_check_inplace(name, a));
  KG_TRY(binary_shape(name, a, b, &nd, shape));
  KG_TRY(kg_check_overlap(name, a, 1, &b, true));
  kg_dtype rt;
  KG_TRY(binary_dtype(op, a, b, &rt));
  /* as PyTorch: the result must be castable to the destination without changing kind (a float
   * result is not truncated into integers, a number is not squeezed into a bool) */
  if ((kg_dtype_info[rt].is_float && !kg_dtype_info[a->dtype].is_float) || (rt != KG_BOOL && a->dtype == KG_BOOL))
    return kg_error(KG_ERR_TYPE, name, "the result type %s cannot be stored in the destination of type %s; use the "
                    "out-of-place form (or convert the destination first)", kg_dtype_info[rt].name,
                    kg_dtype_info[a->dtype].name);
  bool fits = nd == a->ndim;
  for (int i = 0; fits && i < nd; i++) fits = shape[i] == a->shape[i];
  if (!fits)
    return kg_error(KG_ERR_SHAPE, name, "in-place result %s would not fit the destination %s",
                    kg_shape_str(y, nd, shape), KG_SHAPE(a, x));
  kg_tensor_bump_version(a);
  const kg_tensor *in[2] = {a, b};
  return kg_op_dispatch(op, 1, &a, 2, in, NULL);
}

kg_status kg_clamp(kg_tensor **out, const kg_tensor *x, double lo, double hi) {
  if (lo > hi) return kg_error(KG_ERR_VALUE, "clamp", "min %g is greater than max %g", lo, hi);
  /* an integer tensor clamped to a fractional or NaN bound gives floats, as a number would */
  kg_dtype dt = x->dtype;
  if (!kg_dtype_info[dt].is_float && ((isfinite(lo) && lo != floor(lo)) || (isfinite(hi) && hi != floor(hi)) ||
                                      isnan(lo) || isnan(hi)))
    dt = KG_F32;
  KG_TRY(kg_new_like(out, x, x->ndim, x->shape, dt));
  kg_clamp_params p = {lo, hi};
  kg_status s = kg_op_run(KG_OP_CLAMP, 1, out, 1, &x, &p, sizeof p);
  if (s) kg_tensor_release(*out);
  return s;
}

kg_status kg_where(kg_tensor **out, const kg_tensor *cond, const kg_tensor *a, const kg_tensor *b) {
  int n1, nd;
  int64_t s1[KG_MAX_DIMS], shape[KG_MAX_DIMS];
  char x[KG_SHAPE_STR_MAX], y[KG_SHAPE_STR_MAX], z[KG_SHAPE_STR_MAX];
  const kg_tensor *in[3] = {cond, a, b};
  KG_TRY(kg_check_same_device("where", 3, in));
  if (!kg_broadcast_shapes(cond->ndim, cond->shape, a->ndim, a->shape, &n1, s1) ||
      !kg_broadcast_shapes(n1, s1, b->ndim, b->shape, &nd, shape))
    return kg_error(KG_ERR_SHAPE, "where", "condition %s, x %s and y %s cannot be broadcast together", KG_SHAPE(cond, x),
                    KG_SHAPE(a, y), KG_SHAPE(b, z));
  KG_TRY(kg_new_like(out, a, nd, shape, kg_dtype_promote(a->dtype, b->dtype)));
  kg_status s = kg_op_run(KG_OP_WHERE, 1, out, 3, in, NULL, 0);
  if (s) kg_tensor_release(*out);
  return s;
}

/* softplus(x) = log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's
 * nn.Softplus). The defaults (1, 20) are the fused SOFTPLUS row. Other values are composed from
 * ops, so the tape gives PyTorch's gradient: sigmoid(beta x) below the threshold, 1 above. The row
 * is z itself above 20; under a threshold above 20 those z take z + log(1 + exp(-z)), exact and
 * without overflow. Half-precision inputs compute in f32 (as PyTorch's opmath); integers and bools
 * give f32, as the row does. */
kg_status kg_softplus(kg_tensor **out, const kg_tensor *x, double beta, double threshold) {
  if (!isfinite(beta) || beta == 0)
    return kg_error(KG_ERR_VALUE, "softplus", "beta must be a finite non-zero number, got %g",
                    isnan(beta) ? fabs(beta) : beta); /* "nan", not "-nan" */
  if (isnan(threshold)) return kg_error(KG_ERR_VALUE, "softplus", "threshold must be a number, got nan");
  if (beta == 1 && threshold == 20) return kg_unary(out, KG_OP_SOFTPLUS, x);
  kg_dtype dt = unary_dtype(KG_OP_SOFTPLUS, x->dtype), ct = dt == KG_F64 ? KG_F64 : KG_F32;
  kg_tensor *xc = NULL, *z = NULL, *sp = NULL, *nz = NULL, *tail = NULL, *zt = NULL, *big = NULL, *y0 = NULL,
            *lin = NULL, *y = NULL;
  kg_status s = KG_OK;
  /* a failed op leaves its out pointer dangling: keep a result only once its op succeeded */
#define STEP(dst, call)                 \
  if (!s) {                             \
    kg_tensor *r_ = NULL;               \
    if ((s = (call)) == KG_OK) dst = r_; \
  }
  STEP(xc, kg_to(&r_, x, ct, x->device))
  STEP(z, kg_binary_scalar(&r_, KG_OP_MUL, xc, beta, false))
  STEP(sp, kg_unary(&r_, KG_OP_SOFTPLUS, z))
  if (threshold > 20) { /* sp <- where(z > 20, z + softplus(-z), sp) */
    STEP(nz, kg_unary(&r_, KG_OP_NEG, z))
    STEP(tail, kg_unary(&r_, KG_OP_SOFTPLUS, nz))
    STEP(zt, kg_binary(&r_, KG_OP_ADD, z, tail))
    STEP(big, kg_binary_scalar(&r_, KG_OP_GT, z, 20, false))
    kg_tensor *merged = NULL;
    STEP(merged, kg_where(&r_, big, zt, sp))
    if (!s) kg_tensor_release(sp), sp = merged;
  }
  STEP(y0, kg_binary_scalar(&r_, KG_OP_DIV, sp, beta, false))
  STEP(lin, kg_binary_scalar(&r_, KG_OP_GT, z, threshold, false))
  STEP(y, kg_where(&r_, lin, xc, y0))
  STEP(*out, kg_to(&r_, y, dt, x->device))
#undef STEP
  kg_tensor *tmp[] = {xc, z, sp, nz, tail, zt, big, y0, lin, y};
  for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++)
    if (tmp[i]) kg_tensor_release(tmp[i]);
  return s;
}

/* ---- backward --------------------------------------------------------------------------- */

static kg_status unary_backward(kg_tensor **din, kg_op op, const kg_tensor *g, const kg_tensor *saved, double lo,
                                double hi) {
  int nd;
  int64_t shape[KG_MAX_DIMS];
  kg_broadcast_shapes(g->ndim, g->shape, saved->ndim, saved->shape, &nd, shape);
  KG_TRY(kg_new_like(din, g, nd, shape, kg_dtype_promote(g->dtype, saved->dtype)));
  kg_unary_backward_params p = {op, lo, hi};
  const kg_tensor *in[2] = {g, saved};
  kg_status s = kg_op_dispatch(KG_OP_UNARY_BACKWARD, 1, din, 2, in, &p);
  if (s) { /* the engine releases din[] on failure too: leave no dangling pointer */
    kg_tensor_release(*din);
    *din = NULL;
  }
  return s;
}

/* kg_grad_<name> of every differentiable unary row of elementwise.def: one UNARY_BACKWARD pass
 * with the row's derivative, reading the saved tensor its saves column names (SAVE_NONE: the
 * derivative reads only g) */
static kg_status unary_grad(kg_op op, kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  unsigned saves = kg_op_info[op].saves;
  const kg_tensor *s = saves & KG_SAVES_OUT(0) ? n->saved_out[0] : saves & KG_SAVES_IN(0) ? n->saved_in[0] : dout[0];
  return unary_backward(&din[0], op, dout[0], s, 0, 0);
}
#define GRAD_FN_GRAD(ID, name)                                                   \
  kg_status kg_grad_##name(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { \
    return unary_grad(KG_OP_##ID, n, dout, din);                                  \
  }
#define GRAD_FN_NOGRAD(ID, name)
#define KG_UNARY(ID, name, saves, grad, flags, f, df) GRAD_FN_##grad(ID, name)
#define KG_BINARY(ID, name, saves, grad, flags, f)
#include "elementwise.def"
#undef KG_UNARY
#undef KG_BINARY

kg_status kg_grad_clamp(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_clamp_params *p = n->params;
  return unary_backward(&din[0], KG_OP_CLAMP, dout[0], n->saved_in[0], p->lo, p->hi);
}

kg_status kg_grad_add(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (kg_node_needs_grad(n, 0)) din[0] = kg_tensor_retain(dout[0]);
  if (kg_node_needs_grad(n, 1)) din[1] = kg_tensor_retain(dout[0]);
  return KG_OK;
}

kg_status kg_grad_sub(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (kg_node_needs_grad(n, 0)) din[0] = kg_tensor_retain(dout[0]);
  if (kg_node_needs_grad(n, 1)) KG_TRY(kg_unary(&din[1], KG_OP_NEG, dout[0]));
  return KG_OK;
}

kg_status kg_grad_mul(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (kg_node_needs_grad(n, 0)) KG_TRY(kg_binary(&din[0], KG_OP_MUL, dout[0], n->saved_in[1]));
  if (kg_node_needs_grad(n, 1)) KG_TRY(kg_binary(&din[1], KG_OP_MUL, dout[0], n->saved_in[0]));
  return KG_OK;
}

/* d(a/b) = g/b, -g a/b² */
kg_status kg_grad_div(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *a = n->saved_in[0], *b = n->saved_in[1];
  kg_tensor *gb;
  KG_TRY(kg_binary(&gb, KG_OP_DIV, dout[0], b));
  if (kg_node_needs_grad(n, 1)) {
    kg_tensor *t, *u;
    kg_status s = kg_binary(&t, KG_OP_MUL, gb, a);
    if (s == KG_OK) {
      s = kg_binary(&u, KG_OP_DIV, t, b);
      kg_tensor_release(t);
      if (s == KG_OK) {
        s = kg_unary(&din[1], KG_OP_NEG, u);
        kg_tensor_release(u);
      }
    }
    if (s) return kg_tensor_release(gb), s;
  }
  if (kg_node_needs_grad(n, 0)) din[0] = gb;
  else kg_tensor_release(gb);
  return KG_OK;
}

/* d(a^b) = g b a^(b-1), g y log(a) */
kg_status kg_grad_pow(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *a = n->saved_in[0], *b = n->saved_in[1], *y = n->saved_out[0];
  kg_tensor *t1 = NULL, *t2 = NULL;
  kg_status s = KG_OK;
  if (kg_node_needs_grad(n, 0)) {
    s = kg_binary_scalar(&t1, KG_OP_SUB, b, 1, false);
    if (!s) s = kg_binary(&t2, KG_OP_POW, a, t1);
    kg_tensor_release(t1);
    if (!s) s = kg_binary(&t1, KG_OP_MUL, t2, b);
    kg_tensor_release(t2);
    if (!s) s = kg_binary(&din[0], KG_OP_MUL, dout[0], t1);
    kg_tensor_release(t1);
    KG_TRY(s);
  }
  if (kg_node_needs_grad(n, 1)) {
    s = kg_unary(&t1, KG_OP_LOG, a);
    if (!s) s = kg_binary(&t2, KG_OP_MUL, t1, y);
    kg_tensor_release(t1);
    if (!s) s = kg_binary(&din[1], KG_OP_MUL, dout[0], t2);
    kg_tensor_release(t2);
  }
  return s;
}

/* the gradient goes to the larger (smaller) input; ties split it evenly, as PyTorch does */
static kg_status minmax_grad(kg_node *n, kg_tensor *const *dout, kg_tensor **din, kg_op pick) {
  const kg_tensor *a = n->saved_in[0], *b = n->saved_in[1];
  kg_tensor *wins_a, *tie, *half, *zero, *wa, *wb;
  KG_TRY(kg_binary(&wins_a, pick, a, b));
  kg_status s = kg_binary(&tie, KG_OP_EQ, a, b);
  if (s) return kg_tensor_release(wins_a), s;
  s = kg_binary_scalar(&half, KG_OP_MUL, dout[0], 0.5, false);
  if (!s) s = kg_scalar(&zero, 0, dout[0]->dtype, dout[0]->device);
  if (!s) {
    /* wa = tie ? g/2 : (a wins ? g : 0); wb = tie ? g/2 : (a wins ? 0 : g) */
    kg_tensor *ga = NULL, *gb = NULL;
    s = kg_where(&ga, wins_a, dout[0], zero);
    if (!s) s = kg_where(&gb, wins_a, zero, dout[0]);
    if (!s) s = kg_where(&wa, tie, half, ga);
    if (!s) s = kg_where(&wb, tie, half, gb);
    kg_tensor_release(ga);
    kg_tensor_release(gb);
    if (!s) {
      if (kg_node_needs_grad(n, 0)) din[0] = wa; else kg_tensor_release(wa);
      if (kg_node_needs_grad(n, 1)) din[1] = wb; else kg_tensor_release(wb);
    }
    kg_tensor_release(zero);
  }
  kg_tensor_release(half);
  kg_tensor_release(wins_a);
  kg_tensor_release(tie);
  return s;
}
kg_status kg_grad_maximum(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { return minmax_grad(n, dout, din, KG_OP_GT); }
kg_status kg_grad_minimum(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { return minmax_grad(n, dout, din, KG_OP_LT); }

kg_status kg_grad_where(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  kg_tensor *zero;
  KG_TRY(kg_scalar(&zero, 0, dout[0]->dtype, dout[0]->device));
  kg_status s = KG_OK;
  if (kg_node_needs_grad(n, 1)) s = kg_where(&din[1], n->saved_in[0], dout[0], zero);
  if (!s && kg_node_needs_grad(n, 2)) s = kg_where(&din[2], n->saved_in[0], zero, dout[0]);
  kg_tensor_release(zero);
  return s;
}

/* A differentiable binary row of elementwise.def needs its kg_grad_<name> above: a missing one
 * is an undeclared identifier here, so the build fails instead of the coverage test. */
#define BINARY_GRAD_GRAD(name) kg_grad_##name,
#define BINARY_GRAD_NOGRAD(name)
static const kg_backward_fn binary_grads[] __attribute__((unused)) = {
#define KG_UNARY(ID, name, saves, grad, flags, f, df)
#define KG_BINARY(ID, name, saves, grad, flags, f) BINARY_GRAD_##grad(name)
#include "elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
};
