/* softmax.c — softmax and log_softmax over one dim (numerically stable, reduced in f32, or f64
 * for f64 inputs) and their backward passes from the saved output y:
 *   softmax      dx = y * (g - sum(g * y))
 *   log_softmax  dx = g - exp(y) * sum(g)
 * each one fused kernel (softmax_backward / log_softmax_backward, INTERNAL ops).
 * Shapes: x: [..., N, ...] with N at dim; y like x. */
#include "../core/internal.h"

static kg_status softmax_like(kg_op op, kg_tensor **out, const kg_tensor *x, int dim) {
  const char *name = kg_op_info[op].name;
  char b[KG_SHAPE_STR_MAX];
  KG_TRY(kg_check_float(name, x, "input"));
  int d = dim;
  if (!kg_wrap_dim(&d, x->ndim ? x->ndim : 1))
    return kg_error(KG_ERR_VALUE, name, "dim %lld out of range for input %s", kg_pos1(dim), KG_SHAPE(x, b));
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

/* dx in one fused kernel (engine/cpu/softmax.c, engine/cuda/softmax.cu): in {g, y} -> {dx} */
static kg_status softmax_grad(kg_op bop, kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *y = n->saved_out[0], *g = dout[0];
  KG_TRY(kg_new_like(&din[0], g, y->ndim, y->shape, kg_dtype_promote(g->dtype, y->dtype)));
  const kg_tensor *in[2] = {g, y};
  return kg_op_dispatch(bop, 1, &din[0], 2, in, n->params); /* the engine releases din[] */
}

kg_status kg_grad_softmax(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return softmax_grad(KG_OP_SOFTMAX_BACKWARD, n, dout, din);
}

kg_status kg_grad_log_softmax(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return softmax_grad(KG_OP_LOG_SOFTMAX_BACKWARD, n, dout, din);
}
