/* softmax.c — softmax and log_softmax over one dim (numerically stable, reduced in f32, or f64
 * for f64 inputs) and their backward passes from the saved output y:
 *   softmax      dx = y * (g - sum(g * y))
 *   log_softmax  dx = g - exp(y) * sum(g)
 * Shapes: x: [..., N, ...] with N at dim; y like x. */
#include "../core/internal.h"

static kg_status softmax_like(kg_op op, kg_tensor **out, const kg_tensor *x, int dim) {
  const char *name = kg_op_info[op].name;
  char b[KG_SHAPE_STR_MAX];
  KG_TRY(kg_check_float(name, x, "input"));
  int d = dim;
  if (!kg_wrap_dim(&d, x->ndim ? x->ndim : 1))
    return kg_error(KG_ERR_VALUE, name, "dim %d out of range for input %s", dim, KG_SHAPE(x, b));
  kg_tensor *x1, *y;
  if (x->ndim) x1 = kg_tensor_retain((kg_tensor *)x);
  else KG_TRY(kg_reshape(&x1, x, 1, (int64_t[]){1}));
  kg_status s = kg_new_like(&y, x1, x1->ndim, x1->shape, x1->dtype);
  if (!s) {
    kg_dim_params p = {d, false};
    s = kg_op_run(op, 1, &y, 1, (const kg_tensor *const *)&x1, &p, sizeof p);
    if (s) kg_tensor_release(y);
  }
  kg_tensor_release(x1);
  KG_TRY(s);
  if (x->ndim) return *out = y, KG_OK;
  s = kg_reshape(out, y, 0, NULL);
  kg_tensor_release(y);
  return s;
}

kg_status kg_softmax(kg_tensor **out, const kg_tensor *x, int dim) { return softmax_like(KG_OP_SOFTMAX, out, x, dim); }
kg_status kg_log_softmax(kg_tensor **out, const kg_tensor *x, int dim) {
  return softmax_like(KG_OP_LOG_SOFTMAX, out, x, dim);
}

kg_status kg_grad_softmax(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_dim_params *p = n->params;
  const kg_tensor *y = n->saved_out[0];
  kg_tensor *gy = NULL, *s = NULL, *t = NULL;
  kg_status st = kg_binary(&gy, KG_OP_MUL, dout[0], y);
  if (!st) st = kg_sum(&s, gy, 1u << p->dim, true);
  if (!st) st = kg_binary(&t, KG_OP_SUB, dout[0], s);
  if (!st) st = kg_binary(&din[0], KG_OP_MUL, y, t);
  kg_tensor *tmp[3] = {gy, s, t};
  kg_release_all(3, tmp);
  return st;
}

kg_status kg_grad_log_softmax(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_dim_params *p = n->params;
  kg_tensor *e = NULL, *s = NULL, *t = NULL;
  kg_status st = kg_unary(&e, KG_OP_EXP, n->saved_out[0]);
  if (!st) st = kg_sum(&s, dout[0], 1u << p->dim, true);
  if (!st) st = kg_binary(&t, KG_OP_MUL, e, s);
  if (!st) st = kg_binary(&din[0], KG_OP_SUB, dout[0], t);
  kg_tensor *tmp[3] = {e, s, t};
  kg_release_all(3, tmp);
  return st;
}
