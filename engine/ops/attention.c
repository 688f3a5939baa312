/* attention.c — front-ends of the transformer blocks: fused scaled-dot-product attention and
 * rotary position embedding, and their backward passes.
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0, grouped-query),
 * T query length, S key length, D head dim. Kernels: engine/cpu/attention.c. Reference: the
 * naive softmax(Q·Kᵀ·scale + mask)·V of tests/lua/attention_spec.lua.
 */
#include "../core/internal.h"

#include <math.h>

/* ---- scaled dot-product attention -------------------------------------------------------- */

/* q: [B, H, T, D], k, v: [B, Hkv, S, D], mask: NULL or bool/float broadcastable to [B, H, T, S] */
static kg_status sdpa_check(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                            const kg_sdpa_params *p) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX], m[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[4] = {q, k, v, mask};
  KG_TRY(kg_check_same_device("scaled_dot_product_attention", 4, ts));
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
    return kg_error(KG_ERR_SHAPE, "scaled_dot_product_attention",
                    "q %s, k %s, v %s: expected 4-D q [B,H,T,D] and k, v [B,Hkv,S,D]", KG_SHAPE(q, a), KG_SHAPE(k, b),
                    KG_SHAPE(v, c));
  if (!kg_dtype_info[q->dtype].is_float || k->dtype != q->dtype || v->dtype != q->dtype)
    return kg_error(KG_ERR_TYPE, "scaled_dot_product_attention", "q %s, k %s, v %s: one floating dtype expected",
                    kg_dtype_info[q->dtype].name, kg_dtype_info[k->dtype].name, kg_dtype_info[v->dtype].name);
  int64_t B = q->shape[0], H = q->shape[1], D = q->shape[3], Hkv = k->shape[1];
  if (k->shape[0] != B || v->shape[0] != B || k->shape[3] != D || !kg_same_shape(k, v) || Hkv == 0 ||
      H % Hkv != 0)
    return kg_error(KG_ERR_SHAPE, "scaled_dot_product_attention",
                    "q %s, k %s, v %s: need q [B,H,T,D], k = v [B,Hkv,S,D] with H divisible by Hkv",
                    KG_SHAPE(q, a), KG_SHAPE(k, b), KG_SHAPE(v, c));
  if (mask) {
    int64_t full[4] = {B, H, q->shape[2], k->shape[2]};
    bool ok = mask->ndim <= 4;
    for (int i = 0; ok && i < mask->ndim; i++) {
      int64_t s = mask->shape[mask->ndim - 1 - i];
      ok = s == 1 || s == full[3 - i];
    }
    if (!ok)
      return kg_error(KG_ERR_SHAPE, "scaled_dot_product_attention", "mask %s cannot be broadcast to [B,H,T,S] = %s",
                      KG_SHAPE(mask, m), kg_shape_str(a, 4, full));
    if (mask->dtype != KG_BOOL && !kg_dtype_info[mask->dtype].is_float)
      return kg_error(KG_ERR_TYPE, "scaled_dot_product_attention", "mask %s must be bool or floating, got %s",
                      KG_SHAPE(mask, m), kg_dtype_info[mask->dtype].name);
  }
  if (p->window < 0)
    return kg_error(KG_ERR_VALUE, "scaled_dot_product_attention", "window %lld must be >= 0", (long long)p->window);
  return KG_OK;
}

kg_status kg_sdpa(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                  const kg_sdpa_params *p) {
  kg_sdpa_params prm = p ? *p : (kg_sdpa_params){0};
  KG_TRY(sdpa_check(q, k, v, mask, &prm));
  if (prm.scale == 0) prm.scale = 1.0 / sqrt((double)q->shape[3]);
  /* out: [B, H, T, D]; lse: [B, H, T] logsumexp of each score row, saved for backward */
  kg_tensor *o[2] = {NULL, NULL};
  KG_TRY(kg_new_like(&o[0], q, 4, q->shape, q->dtype));
  kg_status s = kg_new_like(&o[1], q, 3, q->shape, q->dtype == KG_F64 ? KG_F64 : KG_F32);
  const kg_tensor *in[4] = {q, k, v, mask};
  if (s == KG_OK) s = kg_op_run(KG_OP_SDPA, 2, o, 4, in, &prm, sizeof prm);
  kg_tensor_release(o[1]);
  if (s) kg_tensor_release(o[0]);
  else *out = o[0];
  return s;
}

/* dq, dk, dv from one SDPA_BACKWARD kernel that recomputes the probabilities from lse */
kg_status kg_grad_scaled_dot_product_attention(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (!dout[0]) return KG_OK;
  const kg_tensor *q = n->saved_in[0], *k = n->saved_in[1], *v = n->saved_in[2];
  kg_tensor *g[3] = {NULL, NULL, NULL};
  kg_status s = kg_new_like(&g[0], q, 4, q->shape, q->dtype);
  if (s == KG_OK) s = kg_new_like(&g[1], k, 4, k->shape, k->dtype);
  if (s == KG_OK) s = kg_new_like(&g[2], v, 4, v->shape, v->dtype);
  /* in: q, k, v, mask, out, lse, dout */
  const kg_tensor *in[7] = {q, k, v, n->saved_in[3], n->saved_out[0], n->saved_out[1], dout[0]};
  if (s == KG_OK) s = kg_op_dispatch(KG_OP_SDPA_BACKWARD, 3, g, 7, in, n->params);
  if (s) {
    kg_release_all(3, g);
    return s;
  }
  for (int i = 0; i < 3; i++) {
    if (kg_node_needs_grad(n, i)) din[i] = g[i];
    else kg_tensor_release(g[i]);
  }
  return KG_OK;
}

/* ---- rotary position embedding ------------------------------------------------------------ */

/* x: [..., T, D] (D even), positions: [T] or [B, T] with B = x's first dim (or 1), inv_freq:
 * NULL or [D/2] floating (saved for backward with the positions) */
kg_status kg_rope_freq(kg_tensor **out, const kg_tensor *x, const kg_tensor *positions, const kg_tensor *inv_freq,
                       const kg_rope_params *p) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[3] = {x, positions, inv_freq};
  KG_TRY(kg_check_same_device("rope", 3, ts));
  KG_TRY(kg_check_float("rope", x, "x"));
  KG_TRY(kg_check_integer("rope", positions, "positions"));
  if (x->ndim < 2 || x->shape[x->ndim - 1] % 2 != 0)
    return kg_error(KG_ERR_SHAPE, "rope", "x %s must be [..., T, D] with D even", KG_SHAPE(x, a));
  int64_t T = x->shape[x->ndim - 2];
  bool ok = (positions->ndim == 1 && positions->shape[0] == T) ||
            (positions->ndim == 2 && positions->shape[1] == T &&
             (positions->shape[0] == 1 || (x->ndim >= 3 && positions->shape[0] == x->shape[0])));
  if (!ok)
    return kg_error(KG_ERR_SHAPE, "rope", "positions %s must be [T] or [B, T] for x %s", KG_SHAPE(positions, b),
                    KG_SHAPE(x, a));
  if (inv_freq) {
    KG_TRY(kg_check_float("rope", inv_freq, "inv_freq"));
    if (inv_freq->ndim != 1 || inv_freq->shape[0] != x->shape[x->ndim - 1] / 2)
      return kg_error(KG_ERR_SHAPE, "rope", "inv_freq %s must be [D/2] = [%lld] for x %s", KG_SHAPE(inv_freq, b),
                      (long long)(x->shape[x->ndim - 1] / 2), KG_SHAPE(x, a));
    if (inv_freq->requires_grad || inv_freq->grad_fn)
      return kg_error(KG_ERR_VALUE, "rope", "inv_freq %s must not require grad (rope has no gradient for it)",
                      KG_SHAPE(inv_freq, b));
  } else if (!(p->base > 0)) {
    return kg_error(KG_ERR_VALUE, "rope", "base %g must be positive", p->base);
  }
  if (!isfinite(p->scale)) return kg_error(KG_ERR_VALUE, "rope", "scale %g must be finite", p->scale);
  kg_tensor *xc;
  KG_TRY(kg_contiguous(&xc, x));
  kg_status s = kg_new_like(out, x, x->ndim, x->shape, x->dtype);
  const kg_tensor *in[3] = {xc, positions, inv_freq};
  if (s == KG_OK) {
    s = kg_op_run(KG_OP_ROPE, 1, out, 3, in, p, sizeof *p);
    if (s) kg_tensor_release(*out);
  }
  kg_tensor_release(xc);
  return s;
}

kg_status kg_rope(kg_tensor **out, const kg_tensor *x, const kg_tensor *positions, double base) {
  kg_rope_params p = {base, 1.0};
  return kg_rope_freq(out, x, positions, NULL, &p);
}

/* y = scale · R(pos) x, so dx = scale · R(-pos) dy: the same op at the negated positions */
kg_status kg_grad_rope(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (!kg_node_needs_grad(n, 0)) return KG_OK;
  const kg_rope_params *p = n->params;
  kg_tensor *neg;
  KG_TRY(kg_unary(&neg, KG_OP_NEG, n->saved_in[1]));
  kg_status s = kg_rope_freq(&din[0], dout[0], neg, n->saved_in[2], p);
  kg_tensor_release(neg);
  return s;
}
