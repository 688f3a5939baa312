/* reduce.c — reductions over dims: sum, mean, var (composites of sum), and the shape rule
 * they share; reductions along one dim: max/min (values + 0-based i64 indices), argmax/argmin,
 * cumsum, topk, and their backward passes (composed of other ops). */
#include "../core/internal.h"

#include <math.h>

/* output shape of reducing x over mask; dims beyond x->ndim in the mask are an error */
kg_status kg_reduce_shape(const char *op, const kg_tensor *x, uint32_t mask, bool keepdim, int *nd, int64_t *shape) {
  char b[KG_SHAPE_STR_MAX];
  if (mask != KG_DIMS_ALL && x->ndim < 32 && (mask >> x->ndim))
    return kg_error(KG_ERR_VALUE, op, "dim out of range for input %s", KG_SHAPE(x, b));
  int k = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask & (1u << d)) {
      if (keepdim) shape[k++] = 1;
    } else {
      shape[k++] = x->shape[d];
    }
  }
  *nd = k;
  return KG_OK;
}

kg_status kg_sum(kg_tensor **out, const kg_tensor *x, uint32_t mask, bool keepdim) {
  int nd;
  int64_t shape[KG_MAX_DIMS];
  KG_TRY(kg_reduce_shape("sum", x, mask, keepdim, &nd, shape));
  kg_dtype dt = kg_dtype_info[x->dtype].is_float ? x->dtype : KG_I64;
  KG_TRY(kg_new_like(out, x, nd, shape, dt));
  kg_reduce_params p = {mask, keepdim, 0};
  kg_status s = kg_op_run(KG_OP_SUM, 1, out, 1, &x, &p, sizeof p);
  if (s) kg_tensor_release(*out);
  return s;
}

/* d sum = g broadcast back over the reduced dims */
kg_status kg_grad_sum(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_reduce_params *p = n->params;
  const kg_tensor_meta *m = &n->in_meta[0];
  int64_t kshape[KG_MAX_DIMS];
  for (int d = 0; d < m->ndim; d++) kshape[d] = (p->mask & (1u << d)) ? 1 : m->shape[d];
  kg_tensor *g;
  KG_TRY(kg_reshape(&g, dout[0], m->ndim, kshape));
  kg_status s = kg_expand(&din[0], g, m->ndim, m->shape);
  kg_tensor_release(g);
  return s;
}

static int64_t reduced_count(const kg_tensor *x, uint32_t mask) {
  int64_t n = 1;
  for (int d = 0; d < x->ndim; d++)
    if (mask & (1u << d)) n *= x->shape[d];
  return n;
}

kg_status kg_mean(kg_tensor **out, const kg_tensor *x, uint32_t mask, bool keepdim) {
  KG_TRY(kg_check_float("mean", x, "input"));
  kg_tensor *s;
  KG_TRY(kg_sum(&s, x, mask, keepdim));
  int64_t n = reduced_count(x, mask);
  kg_status st = kg_binary_scalar(out, KG_OP_DIV, s, n ? (double)n : NAN, false); /* mean of nothing is NaN */
  kg_tensor_release(s);
  return st;
}

kg_status kg_var(kg_tensor **out, const kg_tensor *x, uint32_t mask, bool keepdim, int correction) {
  KG_TRY(kg_check_float("var", x, "input"));
  kg_tensor *mu, *d, *sq, *s;
  KG_TRY(kg_mean(&mu, x, mask, true));
  kg_status st = kg_binary(&d, KG_OP_SUB, x, mu);
  kg_tensor_release(mu);
  KG_TRY(st);
  st = kg_binary(&sq, KG_OP_MUL, d, d);
  kg_tensor_release(d);
  KG_TRY(st);
  st = kg_sum(&s, sq, mask, keepdim);
  kg_tensor_release(sq);
  KG_TRY(st);
  int64_t n = reduced_count(x, mask) - correction;
  st = kg_binary_scalar(out, KG_OP_DIV, s, n > 0 ? (double)n : NAN, false);
  kg_tensor_release(s);
  return st;
}

/* ---- along one dim: max, min, argmax, argmin, cumsum, topk ------------------------------- */

/* wraps dim for x (a 0-d x counts as [1]); fails naming the op and the shape */
static kg_status check_dim(const char *op, const kg_tensor *x, int *dim) {
  char b[KG_SHAPE_STR_MAX];
  int d = *dim;
  if (!kg_wrap_dim(&d, x->ndim ? x->ndim : 1))
    return kg_error(KG_ERR_VALUE, op, "dim %lld out of range for input %s", kg_pos1(*dim), KG_SHAPE(x, b));
  *dim = d;
  return KG_OK;
}

/* x's shape with dim set to n (keep) or removed */
static int shape_at(const kg_tensor *x, int dim, int64_t n, bool keep, int64_t *shape) {
  int k = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (d != dim) shape[k++] = x->shape[d];
    else if (keep) shape[k++] = n;
  }
  return k;
}

/* x as a [1] view when it is 0-d (retained otherwise) */
static kg_status at_least_1d(kg_tensor **out, const kg_tensor *x) {
  if (x->ndim) return *out = kg_tensor_retain((kg_tensor *)x), KG_OK;
  int64_t one = 1;
  return kg_reshape(out, x, 1, &one);
}

/* max/min (values and indices) or argmax/argmin (indices only) */
static kg_status select_dim(kg_op op, kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int dim,
                            bool keepdim) {
  const char *name = kg_op_info[op].name;
  char b[KG_SHAPE_STR_MAX];
  KG_TRY(check_dim(name, x, &dim));
  kg_tensor *x1, *v = NULL, *idx = NULL;
  KG_TRY(at_least_1d(&x1, x));
  if (!x->ndim) keepdim = false; /* a 0-d input gives 0-d results */
  kg_status s = KG_OK;
  if (x1->shape[dim] == 0)
    s = kg_error(KG_ERR_SHAPE, name, "cannot reduce over an empty dim of input %s", KG_SHAPE(x, b));
  int64_t shape[KG_MAX_DIMS];
  int nd = shape_at(x1, dim, 1, keepdim, shape);
  bool with_values = op == KG_OP_MAX || op == KG_OP_MIN;
  if (!s && with_values) s = kg_new_like(&v, x1, nd, shape, x1->dtype);
  if (!s) s = kg_new_like(&idx, x1, nd, shape, KG_I64);
  if (!s) {
    kg_dim_params p = {dim, keepdim};
    kg_tensor *outs[2] = {v, idx};
    s = with_values ? kg_op_run(op, 2, outs, 1, (const kg_tensor *const *)&x1, &p, sizeof p)
                    : kg_op_run(op, 1, &idx, 1, (const kg_tensor *const *)&x1, &p, sizeof p);
  }
  kg_tensor_release(x1);
  if (s) {
    kg_tensor_release(v);
    kg_tensor_release(idx);
    return s;
  }
  if (values) *values = v; else kg_tensor_release(v);
  if (indices) *indices = idx; else kg_tensor_release(idx);
  return KG_OK;
}

kg_status kg_max(kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int dim, bool keepdim) {
  return select_dim(KG_OP_MAX, values, indices, x, dim, keepdim);
}
kg_status kg_min(kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int dim, bool keepdim) {
  return select_dim(KG_OP_MIN, values, indices, x, dim, keepdim);
}
kg_status kg_argmax(kg_tensor **out, const kg_tensor *x, int dim, bool keepdim) {
  return select_dim(KG_OP_ARGMAX, NULL, out, x, dim, keepdim);
}
kg_status kg_argmin(kg_tensor **out, const kg_tensor *x, int dim, bool keepdim) {
  return select_dim(KG_OP_ARGMIN, NULL, out, x, dim, keepdim);
}

kg_status kg_cumsum(kg_tensor **out, const kg_tensor *x, int dim) {
  KG_TRY(check_dim("cumsum", x, &dim));
  kg_tensor *x1, *r;
  KG_TRY(at_least_1d(&x1, x));
  kg_dtype dt = kg_dtype_info[x->dtype].is_float ? x->dtype : KG_I64;
  kg_status s = kg_new_like(&r, x1, x1->ndim, x1->shape, dt);
  if (!s) {
    kg_dim_params p = {dim, false};
    s = kg_op_run(KG_OP_CUMSUM, 1, &r, 1, (const kg_tensor *const *)&x1, &p, sizeof p);
    if (s) kg_tensor_release(r);
  }
  kg_tensor_release(x1);
  KG_TRY(s);
  if (x->ndim) return *out = r, KG_OK;
  s = kg_reshape(out, r, 0, NULL);
  kg_tensor_release(r);
  return s;
}

kg_status kg_topk(kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int64_t k, int dim, bool largest,
                  bool sorted) {
  char b[KG_SHAPE_STR_MAX];
  KG_TRY(check_dim("topk", x, &dim));
  if (!x->ndim) return kg_error(KG_ERR_SHAPE, "topk", "input %s must have at least one dim", KG_SHAPE(x, b));
  if (k < 0 || k > x->shape[dim])
    return kg_error(KG_ERR_VALUE, "topk", "k = %lld is out of range for a dim of size %lld in input %s", (long long)k,
                    (long long)x->shape[dim], KG_SHAPE(x, b));
  int64_t shape[KG_MAX_DIMS];
  int nd = shape_at(x, dim, k, true, shape);
  kg_tensor *outs[2] = {NULL, NULL};
  KG_TRY(kg_new_like(&outs[0], x, nd, shape, x->dtype));
  kg_status s = kg_new_like(&outs[1], x, nd, shape, KG_I64);
  if (!s) {
    kg_topk_params p = {k, dim, largest, sorted};
    s = kg_op_run(KG_OP_TOPK, 2, outs, 1, &x, &p, sizeof p);
  }
  if (s) return kg_release_all(2, outs), s;
  if (values) *values = outs[0]; else kg_tensor_release(outs[0]);
  if (indices) *indices = outs[1]; else kg_tensor_release(outs[1]);
  return KG_OK;
}

/* ---- backward along one dim ---------------------------------------------------------------- */

/* bool [1,..,n,..,1] (n at dim, ndim dims) == idx, broadcast: a one-hot of idx along dim */
static kg_status onehot_along(kg_tensor **out, const kg_tensor *idx, int ndim, int dim, int64_t n) {
  kg_tensor *ar, *arv;
  KG_TRY(kg_arange(&ar, 0, (double)n, 1, KG_I64, idx->device));
  int64_t shape[KG_MAX_DIMS];
  for (int d = 0; d < ndim; d++) shape[d] = d == dim ? n : 1;
  kg_status s = kg_reshape(&arv, ar, ndim, shape);
  kg_tensor_release(ar);
  KG_TRY(s);
  s = kg_binary(out, KG_OP_EQ, arv, idx);
  kg_tensor_release(arv);
  return s;
}

/* t reshaped to the input's shape with dim set to 1 (undoes keepdim = false) */
static kg_status keepdim_view(kg_tensor **out, const kg_tensor *t, const kg_tensor_meta *m, int dim) {
  int64_t shape[KG_MAX_DIMS];
  for (int d = 0; d < m->ndim; d++) shape[d] = d == dim ? 1 : m->shape[d];
  return kg_reshape(out, t, m->ndim, shape);
}

/* the gradient goes to the selected element: where(onehot(index), g, 0) */
static kg_status select_grad(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_dim_params *p = n->params;
  const kg_tensor_meta *m = &n->in_meta[0];
  kg_tensor *g = NULL, *idx = NULL, *hot = NULL, *zero = NULL;
  kg_status s = keepdim_view(&g, dout[0], m, p->dim);
  if (!s) s = keepdim_view(&idx, n->saved_out[1], m, p->dim);
  if (!s) s = onehot_along(&hot, idx, m->ndim, p->dim, m->shape[p->dim]);
  if (!s) s = kg_scalar(&zero, 0, g->dtype, g->device);
  if (!s) s = kg_where(&din[0], hot, g, zero);
  kg_tensor *tmp[4] = {g, idx, hot, zero};
  kg_release_all(4, tmp);
  return s;
}
kg_status kg_grad_max(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { return select_grad(n, dout, din); }
kg_status kg_grad_min(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { return select_grad(n, dout, din); }

/* reverse cumsum: dx[i] = sum_{j >= i} g[j] = sum(g) - cumsum(g)[i] + g[i] */
kg_status kg_grad_cumsum(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_dim_params *p = n->params;
  kg_tensor *c = NULL, *t = NULL, *tot = NULL;
  kg_status s = kg_cumsum(&c, dout[0], p->dim);
  if (!s) s = kg_binary(&t, KG_OP_SUB, dout[0], c);
  if (!s) s = kg_sum(&tot, dout[0], 1u << p->dim, true);
  if (!s) s = kg_binary(&din[0], KG_OP_ADD, t, tot);
  kg_tensor *tmp[3] = {c, t, tot};
  kg_release_all(3, tmp);
  return s;
}

/* dx[.., j, ..] = sum_i g[.., i, ..] * (idx[.., i, ..] == j): a one-hot [.., k, n, ..] summed over k */
kg_status kg_grad_topk(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_topk_params *p = n->params;
  const kg_tensor_meta *m = &n->in_meta[0];
  if (m->ndim + 1 > KG_MAX_DIMS)
    return kg_error(KG_ERR_SHAPE, "topk", "backward needs one more dim than the input's %d", m->ndim);
  kg_tensor *g = NULL, *idx = NULL, *hot = NULL, *zero = NULL, *w = NULL;
  kg_status s = kg_unsqueeze(&g, dout[0], p->dim + 1);
  if (!s) s = kg_unsqueeze(&idx, n->saved_out[1], p->dim + 1);
  if (!s) s = onehot_along(&hot, idx, m->ndim + 1, p->dim + 1, m->shape[p->dim]);
  if (!s) s = kg_scalar(&zero, 0, g->dtype, g->device);
  if (!s) s = kg_where(&w, hot, g, zero);
  if (!s) s = kg_sum(&din[0], w, 1u << p->dim, false);
  kg_tensor *tmp[5] = {g, idx, hot, zero, w};
  kg_release_all(5, tmp);
  return s;
}
