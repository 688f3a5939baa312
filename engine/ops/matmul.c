/* matmul.c — batched matmul with broadcasting (PyTorch's rules, 1-D included) and linear. */
#include "../core/internal.h"

/* core: a [..., N, K] @ b [..., K, M], both at least 2-D */
static kg_status matmul_nd(kg_tensor **out, const kg_tensor *a, const kg_tensor *b) {
  char x[KG_SHAPE_STR_MAX], y[KG_SHAPE_STR_MAX];
  int na = a->ndim, nb = b->ndim, nd;
  int64_t shape[KG_MAX_DIMS];
  if (a->shape[na - 1] != b->shape[nb - 2])
    return kg_error(KG_ERR_SHAPE, "matmul", "%s @ %s: inner dims %lld and %lld differ", KG_SHAPE(a, x), KG_SHAPE(b, y),
                    (long long)a->shape[na - 1], (long long)b->shape[nb - 2]);
  if (!kg_broadcast_shapes(na - 2, a->shape, nb - 2, b->shape, &nd, shape))
    return kg_error(KG_ERR_SHAPE, "matmul", "%s @ %s: batch dims cannot be broadcast", KG_SHAPE(a, x), KG_SHAPE(b, y));
  shape[nd++] = a->shape[na - 2];
  shape[nd++] = b->shape[nb - 1];
  KG_TRY(kg_new_like(out, a, nd, shape, kg_dtype_promote(a->dtype, b->dtype)));
  const kg_tensor *in[2] = {a, b};
  kg_status s = kg_op_run(KG_OP_MATMUL, 1, out, 2, in, NULL, 0);
  if (s) kg_tensor_release(*out);
  return s;
}

kg_status kg_matmul(kg_tensor **out, const kg_tensor *a, const kg_tensor *b) {
  char x[KG_SHAPE_STR_MAX], y[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[2] = {a, b};
  KG_TRY(kg_check_same_device("matmul", 2, ts));
  if (a->ndim == 0 || b->ndim == 0)
    return kg_error(KG_ERR_SHAPE, "matmul", "%s @ %s: both arguments need at least 1 dim", KG_SHAPE(a, x), KG_SHAPE(b, y));
  if (!kg_dtype_info[a->dtype].is_float || !kg_dtype_info[b->dtype].is_float)
    return kg_error(KG_ERR_TYPE, "matmul", "%s %s @ %s %s: floating point tensors expected", kg_dtype_info[a->dtype].name,
                    KG_SHAPE(a, x), kg_dtype_info[b->dtype].name, KG_SHAPE(b, y));
  if (a->ndim > 2 && b->ndim == 2) {
    /* [..., N, K] @ [K, M]: fold the batch into the rows, one GEMM instead of one per batch
     * element (and one conversion of b for bf16/f16, not one per batch element) */
    int64_t rows[2] = {-1, a->shape[a->ndim - 1]}, shape[KG_MAX_DIMS];
    kg_tensor *a2, *r;
    KG_TRY(kg_reshape(&a2, a, 2, rows));
    kg_status s = matmul_nd(&r, a2, b);
    kg_tensor_release(a2);
    KG_TRY(s);
    for (int i = 0; i < a->ndim - 1; i++) shape[i] = a->shape[i];
    shape[a->ndim - 1] = b->shape[1];
    s = kg_reshape(out, r, a->ndim, shape);
    kg_tensor_release(r);
    return s;
  }
  if (a->ndim >= 2 && b->ndim >= 2) return matmul_nd(out, a, b);
  /* 1-D operands: a [K] acts as [1, K], b [K] as [K, 1]; the added dim is removed after */
  kg_tensor *a2 = NULL, *b2 = NULL, *r = NULL, *t = NULL;
  kg_status s = KG_OK;
  if (a->ndim == 1) s = kg_unsqueeze(&a2, a, 0);
  else a2 = kg_tensor_retain((kg_tensor *)a);
  if (s == KG_OK && b->ndim == 1) s = kg_unsqueeze(&b2, b, 1);
  else if (s == KG_OK) b2 = kg_tensor_retain((kg_tensor *)b);
  if (s == KG_OK) s = matmul_nd(&t, a2, b2);
  if (s == KG_OK) {
    if (a->ndim == 1 && b->ndim == 1) s = kg_reshape(&r, t, 0, NULL);
    else s = kg_squeeze(&r, t, a->ndim == 1 ? t->ndim - 2 : t->ndim - 1);
    kg_tensor_release(t);
  }
  kg_tensor_release(a2);
  kg_tensor_release(b2);
  if (s == KG_OK) *out = r;
  return s;
}

/* dA = g @ Bᵀ, dB = Aᵀ @ g (the engine sums broadcast batch dims away) */
kg_status kg_grad_matmul(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *a = n->saved_in[0], *b = n->saved_in[1];
  kg_tensor *t;
  if (kg_node_needs_grad(n, 0)) {
    KG_TRY(kg_transpose(&t, b, -1, -2));
    kg_status s = matmul_nd(&din[0], dout[0], t);
    kg_tensor_release(t);
    KG_TRY(s);
  }
  if (kg_node_needs_grad(n, 1)) {
    KG_TRY(kg_transpose(&t, a, -1, -2));
    kg_status s = matmul_nd(&din[1], t, dout[0]);
    kg_tensor_release(t);
    KG_TRY(s);
  }
  return KG_OK;
}

/* y [..., O] = x [..., I] · w [O, I]ᵀ + b [O]: one op, the bias added inside the product's kernel
 * (engine/cpu/matmul.c; on cuda a cuBLASLt bias epilogue) instead of a separate pass over y.
 * A 1-D x gives a 1-D y, as x @ wᵀ does. */
kg_status kg_linear(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  const kg_tensor *in[3] = {x, w, b};
  KG_TRY(kg_check_same_device("linear", b ? 3 : 2, in));
  if (w->ndim != 2) return kg_error(KG_ERR_SHAPE, "linear", "weight %s must be 2-D [out, in]", KG_SHAPE(w, s1));
  if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
    return kg_error(KG_ERR_SHAPE, "linear", "x %s · w %sᵀ: x's last dim must equal w's in-features %lld", KG_SHAPE(x, s1),
                    KG_SHAPE(w, s2), (long long)w->shape[1]);
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return kg_error(KG_ERR_SHAPE, "linear", "bias %s must be [%lld]", KG_SHAPE(b, s1), (long long)w->shape[0]);
  KG_TRY(kg_check_float("linear", x, "x"));
  KG_TRY(kg_check_float("linear", w, "weight"));
  int64_t shape[KG_MAX_DIMS];
  for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = w->shape[0];
  kg_dtype dt = kg_dtype_promote(x->dtype, w->dtype);
  if (b) dt = kg_dtype_promote(dt, b->dtype);
  KG_TRY(kg_new_like(out, x, x->ndim, shape, dt));
  kg_status s = kg_op_run(KG_OP_LINEAR, 1, out, 3, in, NULL, 0);
  if (s) kg_tensor_release(*out);
  return s;
}

/* dx = g · w, dw = gᵀ · x with every leading dim folded into the rows, db = g (the engine sums it
 * over the leading dims); built from matmul, so any dtype and device */
kg_status kg_grad_linear(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *x = n->saved_in[0], *w = n->saved_in[1];
  kg_tensor *g = dout[0];
  if (kg_node_needs_grad(n, 0)) KG_TRY(kg_matmul(&din[0], g, w));
  if (kg_node_needs_grad(n, 1)) {
    int64_t grows[2] = {-1, w->shape[0]}, xrows[2] = {-1, w->shape[1]};
    kg_tensor *g2 = NULL, *gt = NULL, *x2 = NULL;
    kg_status s = kg_reshape(&g2, g, 2, grows);
    if (!s) s = kg_transpose(&gt, g2, 0, 1);
    if (!s) s = kg_reshape(&x2, x, 2, xrows);
    if (!s) s = kg_matmul(&din[1], gt, x2);
    kg_tensor_release(g2);
    kg_tensor_release(gt);
    kg_tensor_release(x2);
    KG_TRY(s);
  }
  if (n->nin > 2 && kg_node_needs_grad(n, 2)) din[2] = kg_tensor_retain(g);
  return KG_OK;
}
