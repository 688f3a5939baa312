/* norm.c — layer_norm, rms_norm, group_norm front-ends and their backward passes.
 *
 * Shapes: x [N, C] for layer/rms norm (N = all leading dims flattened, C the normalised last dim),
 * x [B, C, *] for group norm with G groups; w, b [C]. Each forward also writes per-row statistics
 * (mean and/or rstd: [N] or [B, G], f32, or f64 for f64 input) that the autograd node keeps, so
 * the backward is one fused *_BACKWARD kernel (engine/cpu/norm.c) giving dx, dw, db in one pass.
 */
#include "../core/internal.h"

/* dtype of the saved statistics */
static kg_dtype stat_dtype(const kg_tensor *x) { return x->dtype == KG_F64 ? KG_F64 : KG_F32; }

/* w or b: NULL, or a floating [C] on x's device */
static kg_status check_param(const char *op, const kg_tensor *x, const kg_tensor *p, int64_t C, const char *what) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (!p) return KG_OK;
  const kg_tensor *ts[2] = {x, p};
  KG_TRY(kg_check_same_device(op, 2, ts));
  KG_TRY(kg_check_float(op, p, what));
  if (p->ndim != 1 || p->shape[0] != C)
    return kg_error(KG_ERR_SHAPE, op, "%s %s does not match the %lld channels of x %s", what, KG_SHAPE(p, a),
                    (long long)C, KG_SHAPE(x, b));
  return KG_OK;
}

/* Makes x, w, b contiguous (the kernels walk plain rows; a no-op for the usual contiguous input),
 * runs op with outputs y (x's shape and dtype) and nstat statistics of shape sshape, and returns
 * y; the statistics live on in the autograd node only. */
static kg_status run_norm(kg_tensor **out, kg_op op, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                          int nstat, int sdim, const int64_t *sshape, const kg_norm_params *p) {
  kg_tensor *in[3] = {NULL, NULL, NULL}, *o[3] = {NULL, NULL, NULL};
  const kg_tensor *src[3] = {x, w, b};
  kg_status s = KG_OK;
  for (int i = 0; i < 3 && !s; i++)
    if (src[i]) s = kg_contiguous(&in[i], src[i]);
  if (!s) s = kg_new_like(&o[0], x, x->ndim, x->shape, x->dtype);
  for (int j = 1; j <= nstat && !s; j++) s = kg_new_like(&o[j], x, sdim, sshape, stat_dtype(x));
  if (!s) s = kg_op_run(op, 1 + nstat, o, 3, (const kg_tensor *const *)in, p, sizeof *p);
  kg_release_all(3, in);
  if (s) {
    kg_release_all(3, o);
    return s;
  }
  *out = o[0];
  kg_release_all(2, o + 1);
  return KG_OK;
}

kg_status kg_layer_norm(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b, double eps) {
  char a[KG_SHAPE_STR_MAX];
  KG_TRY(kg_check_float("layer_norm", x, "x"));
  if (x->ndim < 1) return kg_error(KG_ERR_SHAPE, "layer_norm", "x %s needs at least one dim", KG_SHAPE(x, a));
  int64_t C = x->shape[x->ndim - 1];
  KG_TRY(check_param("layer_norm", x, w, C, "weight"));
  KG_TRY(check_param("layer_norm", x, b, C, "bias"));
  if (!(eps >= 0)) return kg_error(KG_ERR_VALUE, "layer_norm", "eps must be >= 0, got %g", eps);
  kg_norm_params p = {eps, false, 1};
  return run_norm(out, KG_OP_LAYER_NORM, x, w, b, 2, x->ndim - 1, x->shape, &p);
}

kg_status kg_rms_norm(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, double eps, bool unit_offset) {
  char a[KG_SHAPE_STR_MAX];
  KG_TRY(kg_check_float("rms_norm", x, "x"));
  if (x->ndim < 1) return kg_error(KG_ERR_SHAPE, "rms_norm", "x %s needs at least one dim", KG_SHAPE(x, a));
  KG_TRY(check_param("rms_norm", x, w, x->shape[x->ndim - 1], "weight"));
  if (!(eps >= 0)) return kg_error(KG_ERR_VALUE, "rms_norm", "eps must be >= 0, got %g", eps);
  kg_norm_params p = {eps, unit_offset, 1};
  return run_norm(out, KG_OP_RMS_NORM, x, w, NULL, 1, x->ndim - 1, x->shape, &p);
}

kg_status kg_group_norm(kg_tensor **out, const kg_tensor *x, int groups, const kg_tensor *w, const kg_tensor *b,
                        double eps) {
  char a[KG_SHAPE_STR_MAX];
  KG_TRY(kg_check_float("group_norm", x, "x"));
  if (x->ndim < 2) return kg_error(KG_ERR_SHAPE, "group_norm", "x %s must be [B, C, *]", KG_SHAPE(x, a));
  int64_t C = x->shape[1];
  if (groups < 1 || C % groups)
    return kg_error(KG_ERR_SHAPE, "group_norm", "%d groups do not divide the %lld channels of x %s", groups,
                    (long long)C, KG_SHAPE(x, a));
  KG_TRY(check_param("group_norm", x, w, C, "weight"));
  KG_TRY(check_param("group_norm", x, b, C, "bias"));
  if (!(eps >= 0)) return kg_error(KG_ERR_VALUE, "group_norm", "eps must be >= 0, got %g", eps);
  kg_norm_params p = {eps, false, groups};
  int64_t sshape[2] = {x->shape[0], groups};
  return run_norm(out, KG_OP_GROUP_NORM, x, w, b, 2, 2, sshape, &p);
}

/* ---- backward --------------------------------------------------------------------------- */

/* Dispatches op_backward with in = {dy, saved...} and out = {dx, dw, db}: dx like x, dw and db
 * [C] in the statistics dtype (always computed, cheap next to dx; the engine casts them). */
static kg_status norm_backward(kg_node *n, kg_op op, kg_tensor *const *dout, kg_tensor **din, int nin,
                               const kg_tensor *const *saved, int ngrad, int64_t C) {
  if (!dout[0]) return KG_OK; /* only a statistic got a gradient: none of them is user-visible */
  const kg_tensor *x = saved[0];
  kg_tensor *g, *o[3] = {NULL, NULL, NULL};
  KG_TRY(kg_contiguous(&g, dout[0]));
  const kg_tensor *in[5] = {g};
  for (int i = 0; i < nin; i++) in[1 + i] = saved[i];
  kg_status s = kg_new_like(&o[0], x, x->ndim, x->shape, x->dtype);
  for (int j = 1; j < ngrad && !s; j++) s = kg_new_like(&o[j], x, 1, &C, stat_dtype(x));
  if (!s) s = kg_op_dispatch(op, ngrad, o, 1 + nin, in, n->params);
  kg_tensor_release(g);
  for (int j = 0; j < ngrad; j++) {
    if (!s && kg_node_needs_grad(n, j)) din[j] = o[j];
    else kg_tensor_release(o[j]);
  }
  return s;
}

static int64_t last_dim(const kg_node *n) { return n->in_meta[0].shape[n->in_meta[0].ndim - 1]; }

/* in = {dy, x, w, mean, rstd} */
kg_status kg_grad_layer_norm(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *saved[4] = {n->saved_in[0], n->saved_in[1], n->saved_out[1], n->saved_out[2]};
  return norm_backward(n, KG_OP_LAYER_NORM_BACKWARD, dout, din, 4, saved, 3, last_dim(n));
}

/* in = {dy, x, w, rstd} */
kg_status kg_grad_rms_norm(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *saved[3] = {n->saved_in[0], n->saved_in[1], n->saved_out[1]};
  return norm_backward(n, KG_OP_RMS_NORM_BACKWARD, dout, din, 3, saved, 2, last_dim(n));
}

/* in = {dy, x, w, mean, rstd} */
kg_status kg_grad_group_norm(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *saved[4] = {n->saved_in[0], n->saved_in[1], n->saved_out[1], n->saved_out[2]};
  return norm_backward(n, KG_OP_GROUP_NORM_BACKWARD, dout, din, 4, saved, 3, n->in_meta[0].shape[1]);
}
