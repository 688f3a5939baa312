/* random.c — dropout and multinomial front-ends: validate, reserve Philox words, run.
 *
 * Both draw from the process-wide Philox stream (kg_rng_reserve), so a CUDA kernel given the
 * same (seed, offset) reproduces the CPU result. Shapes: probs [V] or [B, V], V categories.
 */
#include "../core/internal.h"

#include <math.h>

kg_status kg_dropout(kg_tensor **out, const kg_tensor *x, double p, bool training) {
  KG_TRY(kg_check_float("dropout", x, "x"));
  if (!(p >= 0 && p <= 1)) return kg_error(KG_ERR_VALUE, "dropout", "p must be in [0, 1], got %g", p);
  if (!training || p == 0) {
    *out = kg_tensor_retain((kg_tensor *)x);
    return KG_OK;
  }
  kg_tensor *xc, *o[2] = {NULL, NULL};
  KG_TRY(kg_contiguous(&xc, x)); /* word i of the stream belongs to element i in row-major order */
  kg_status s = kg_new_like(&o[0], x, x->ndim, x->shape, x->dtype);
  if (!s) s = kg_new_like(&o[1], x, x->ndim, x->shape, KG_BOOL);
  kg_dropout_params dp = {kg_rng_reserve((uint64_t)kg_numel(x)), p};
  const kg_tensor *in[1] = {xc};
  if (!s) s = kg_op_run(KG_OP_DROPOUT, 2, o, 1, in, &dp, sizeof dp);
  kg_tensor_release(xc);
  kg_tensor_release(o[1]); /* the node keeps the mask */
  if (s) {
    kg_tensor_release(o[0]);
    return s;
  }
  *out = o[0];
  return KG_OK;
}

/* dx = dy * mask / (1 - p) */
kg_status kg_grad_dropout(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_dropout_params *p = n->params;
  if (!dout[0]) return KG_OK;
  kg_tensor *t;
  KG_TRY(kg_binary(&t, KG_OP_MUL, dout[0], n->saved_out[1]));
  kg_status s = kg_binary_scalar(&din[0], KG_OP_MUL, t, p->p < 1 ? 1 / (1 - p->p) : 0, false);
  kg_tensor_release(t);
  return s;
}

kg_status kg_multinomial(kg_tensor **out, const kg_tensor *probs, int64_t n, bool replacement) {
  char a[KG_SHAPE_STR_MAX];
  KG_TRY(kg_check_float("multinomial", probs, "probs"));
  if (probs->ndim != 1 && probs->ndim != 2)
    return kg_error(KG_ERR_SHAPE, "multinomial", "probs %s must be [V] or [B, V]", KG_SHAPE(probs, a));
  int64_t V = probs->shape[probs->ndim - 1], B = probs->ndim == 2 ? probs->shape[0] : 1;
  if (V < 1) return kg_error(KG_ERR_SHAPE, "multinomial", "probs %s has no categories", KG_SHAPE(probs, a));
  if (n < 0) return kg_error(KG_ERR_VALUE, "multinomial", "number of samples must be >= 0, got %lld", (long long)n);
  if (!replacement && n > V)
    return kg_error(KG_ERR_VALUE, "multinomial",
                    "cannot draw %lld samples from %lld categories without replacement (probs %s)", (long long)n,
                    (long long)V, KG_SHAPE(probs, a));
  kg_tensor *pc;
  KG_TRY(kg_contiguous(&pc, probs));
  int64_t shape[2] = {B, n};
  kg_status s = kg_new_like(out, probs, probs->ndim, probs->ndim == 2 ? shape : shape + 1, KG_I64);
  /* with replacement: two words per sample; without: two per category (one key each) */
  uint64_t words = (uint64_t)B * 2 * (uint64_t)(replacement ? n : V);
  kg_multinomial_params mp = {kg_rng_reserve(words), n, replacement};
  if (!s) {
    s = kg_op_run(KG_OP_MULTINOMIAL, 1, out, 1, (const kg_tensor *const *)&pc, &mp, sizeof mp);
    if (s) kg_tensor_release(*out);
  }
  kg_tensor_release(pc);
  return s;
}
