/* reduce.c — reductions over dims: sum, mean, var (composites of sum), and the shape rule
 * they share. */
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
