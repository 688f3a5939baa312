/* quant.c — int8 weight-only quantization (docs/quantization.md):
 *   linear_q8(x, wq, scale, b)  y [..., O] = x [..., I] · (wq [O, I] · scale [O])ᵀ + b [O]
 *   quantize_q8(w)              wq, scale of w [O, I]: per output row absmax / 127 (Keras 3's
 *                               int8 Dense), round to nearest even, clamp to [-127, 127]
 * Only x (and the bias) get gradients: the int8 weight and its scale are frozen (a quantized base
 * under LoRA adapters), so a scale that requires grad is refused rather than silently ignored. */
#include "../core/internal.h"

kg_status kg_linear_q8(kg_tensor **out, const kg_tensor *x, const kg_tensor *wq, const kg_tensor *scale,
                       const kg_tensor *b) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[4] = {x, wq, scale, b};
  KG_TRY(kg_check_same_device("linear_q8", b ? 4 : 3, ts));
  if (wq->dtype != KG_I8 || wq->ndim != 2)
    return kg_error(KG_ERR_TYPE, "linear_q8", "weight must be an i8 [out, in] tensor, got %s %s",
                    kg_dtype_info[wq->dtype].name, KG_SHAPE(wq, s1));
  if (scale->dtype != KG_F32 || scale->ndim != 1 || scale->shape[0] != wq->shape[0])
    return kg_error(KG_ERR_TYPE, "linear_q8", "scale must be an f32 [%lld] tensor (one per output row), got %s %s",
                    (long long)wq->shape[0], kg_dtype_info[scale->dtype].name, KG_SHAPE(scale, s1));
  if (kg_requires_grad(scale) && kg_grad_enabled())
    return kg_error(KG_ERR_AUTOGRAD, "linear_q8", "scale requires grad, but the quantized weight and its scale "
                                                  "are frozen (train adapters on top instead)");
  KG_TRY(kg_check_float("linear_q8", x, "x"));
  if (x->ndim < 1 || x->shape[x->ndim - 1] != wq->shape[1])
    return kg_error(KG_ERR_SHAPE, "linear_q8", "x %s · w %sᵀ: x's last dim must equal w's in-features %lld",
                    KG_SHAPE(x, s1), KG_SHAPE(wq, s2), (long long)wq->shape[1]);
  if (b) {
    KG_TRY(kg_check_float("linear_q8", b, "bias"));
    if (b->ndim != 1 || b->shape[0] != wq->shape[0])
      return kg_error(KG_ERR_SHAPE, "linear_q8", "bias %s must be [%lld]", KG_SHAPE(b, s1), (long long)wq->shape[0]);
  }
  /* the kernels take x as rows [N, I] and a dense weight and scale */
  int64_t rows[2] = {-1, wq->shape[1]}, shape[KG_MAX_DIMS];
  kg_tensor *x2 = NULL, *w2 = NULL, *s2t = NULL, *y = NULL;
  kg_status s = kg_reshape(&x2, x, 2, rows);
  if (!s) s = kg_contiguous(&w2, wq);
  if (!s) s = kg_contiguous(&s2t, scale);
  if (!s) {
    int64_t yshape[2] = {x2->shape[0], wq->shape[0]};
    s = kg_new_like(&y, x, 2, yshape, x->dtype);
  }
  if (!s) {
    const kg_tensor *in[4] = {x2, w2, s2t, b};
    s = kg_op_run(KG_OP_LINEAR_Q8, 1, &y, b ? 4 : 3, in, NULL, 0);
    if (s) kg_tensor_release(y), y = NULL;
  }
  if (!s) {
    for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = wq->shape[0];
    s = kg_reshape(out, y, x->ndim, shape);
  }
  kg_tensor_release(x2);
  kg_tensor_release(w2);
  kg_tensor_release(s2t);
  kg_tensor_release(y);
  return s;
}

/* dx = g · (wq · scale), built from ops (any device); db = g (summed by the engine). The int8
 * weight takes no gradient (integer); the scale none either (refused in the forward). */
kg_status kg_grad_linear_q8(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor *wq = n->saved_in[1], *scale = n->saved_in[2];
  kg_tensor *g = dout[0];
  if (kg_node_needs_grad(n, 0)) {
    kg_tensor *wf = NULL, *sf = NULL, *s1 = NULL, *w = NULL;
    kg_status s = kg_to(&wf, wq, g->dtype, g->device);
    if (!s) s = kg_to(&sf, scale, g->dtype, g->device);
    if (!s) s = kg_unsqueeze(&s1, sf, 1);
    if (!s) s = kg_binary(&w, KG_OP_MUL, wf, s1);
    if (!s) s = kg_matmul(&din[0], g, w);
    kg_tensor_release(wf);
    kg_tensor_release(sf);
    kg_tensor_release(s1);
    kg_tensor_release(w);
    KG_TRY(s);
  }
  if (n->nin > 3 && kg_node_needs_grad(n, 3)) din[3] = kg_tensor_retain(g);
  return KG_OK;
}

kg_status kg_quantize_q8(kg_tensor **q, kg_tensor **scale, const kg_tensor *w) {
  char s1[KG_SHAPE_STR_MAX];
  if (w->ndim != 2)
    return kg_error(KG_ERR_SHAPE, "quantize_q8", "weight %s must be 2-D [out, in]", KG_SHAPE(w, s1));
  KG_TRY(kg_check_float("quantize_q8", w, "weight"));
  kg_tensor *outs[2] = {NULL, NULL};
  int64_t sshape[1] = {w->shape[0]};
  kg_status s = kg_new_like(&outs[0], w, 2, w->shape, KG_I8);
  if (!s) s = kg_new_like(&outs[1], w, 1, sshape, KG_F32);
  if (!s) s = kg_op_run(KG_OP_QUANTIZE_Q8, 2, outs, 1, &w, NULL, 0);
  if (s) {
    kg_tensor_release(outs[0]);
    kg_tensor_release(outs[1]);
    return s;
  }
  *q = outs[0], *scale = outs[1];
  return KG_OK;
}

/* ---- int4, blocks of 32 with an f16 scale (llama.cpp's Q4_0 layout, engine/cpu/quant.h) ---- */

#define Q4_BLOCK 32

/* wq u8 [O, I / 2] and scale f16 [O, I / 32] describe a weight [O, I]; sets *in = I */
static kg_status q4_in_features(const char *op, const kg_tensor *wq, const kg_tensor *scale, int64_t *in_out) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  if (wq->dtype != KG_U8 || wq->ndim != 2)
    return kg_error(KG_ERR_TYPE, op, "weight must be a u8 [out, in / 2] tensor (two 4-bit codes a byte), got %s %s",
                    kg_dtype_info[wq->dtype].name, KG_SHAPE(wq, s1));
  int64_t in = wq->shape[1] * 2;
  if (in % Q4_BLOCK)
    return kg_error(KG_ERR_SHAPE, op, "weight %s: in-features %lld are not a multiple of %d", KG_SHAPE(wq, s1),
                    (long long)in, Q4_BLOCK);
  if (scale->dtype != KG_F16 || scale->ndim != 2 || scale->shape[0] != wq->shape[0] || scale->shape[1] != in / Q4_BLOCK)
    return kg_error(KG_ERR_TYPE, op, "scale must be an f16 [%lld,%lld] tensor (one per block of %d), got %s %s",
                    (long long)wq->shape[0], (long long)(in / Q4_BLOCK), Q4_BLOCK, kg_dtype_info[scale->dtype].name,
                    KG_SHAPE(scale, s2));
  if (kg_requires_grad(scale) && kg_grad_enabled())
    return kg_error(KG_ERR_AUTOGRAD, op, "scale requires grad, but the quantized weight and its scale are frozen "
                                         "(train adapters on top instead)");
  *in_out = in;
  return KG_OK;
}

kg_status kg_dequantize_q4(kg_tensor **out, const kg_tensor *wq, const kg_tensor *scale, kg_dtype dt) {
  const kg_tensor *ts[2] = {wq, scale};
  KG_TRY(kg_check_same_device("dequantize_q4", 2, ts));
  int64_t in;
  KG_TRY(q4_in_features("dequantize_q4", wq, scale, &in));
  if (!kg_dtype_info[dt].is_float)
    return kg_error(KG_ERR_TYPE, "dequantize_q4", "dtype must be floating point, got %s", kg_dtype_info[dt].name);
  kg_tensor *w2 = NULL, *s2 = NULL;
  int64_t shape[2] = {wq->shape[0], in};
  kg_status s = kg_contiguous(&w2, wq);
  if (!s) s = kg_contiguous(&s2, scale);
  if (!s) s = kg_new_like(out, wq, 2, shape, dt);
  if (!s) {
    const kg_tensor *in2[2] = {w2, s2};
    s = kg_op_run(KG_OP_DEQUANTIZE_Q4, 1, out, 2, in2, NULL, 0);
    if (s) kg_tensor_release(*out);
  }
  kg_tensor_release(w2);
  kg_tensor_release(s2);
  return s;
}

kg_status kg_linear_q4(kg_tensor **out, const kg_tensor *x, const kg_tensor *wq, const kg_tensor *scale,
                       const kg_tensor *b) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[4] = {x, wq, scale, b};
  KG_TRY(kg_check_same_device("linear_q4", b ? 4 : 3, ts));
  int64_t in;
  KG_TRY(q4_in_features("linear_q4", wq, scale, &in));
  KG_TRY(kg_check_float("linear_q4", x, "x"));
  if (x->ndim < 1 || x->shape[x->ndim - 1] != in)
    return kg_error(KG_ERR_SHAPE, "linear_q4", "x %s · w %sᵀ: x's last dim must equal the in-features %lld",
                    KG_SHAPE(x, s1), KG_SHAPE(wq, s2), (long long)in);
  if (b) {
    KG_TRY(kg_check_float("linear_q4", b, "bias"));
    if (b->ndim != 1 || b->shape[0] != wq->shape[0])
      return kg_error(KG_ERR_SHAPE, "linear_q4", "bias %s must be [%lld]", KG_SHAPE(b, s1), (long long)wq->shape[0]);
  }
  int64_t rows[2] = {-1, in}, shape[KG_MAX_DIMS];
  kg_tensor *x2 = NULL, *w2 = NULL, *s2t = NULL, *y = NULL;
  kg_status s = kg_reshape(&x2, x, 2, rows);
  if (!s) s = kg_contiguous(&w2, wq);
  if (!s) s = kg_contiguous(&s2t, scale);
  if (!s) {
    int64_t yshape[2] = {x2->shape[0], wq->shape[0]};
    s = kg_new_like(&y, x, 2, yshape, x->dtype);
  }
  if (!s) {
    const kg_tensor *in4[4] = {x2, w2, s2t, b};
    s = kg_op_run(KG_OP_LINEAR_Q4, 1, &y, b ? 4 : 3, in4, NULL, 0);
    if (s) kg_tensor_release(y), y = NULL;
  }
  if (!s) {
    for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = wq->shape[0];
    s = kg_reshape(out, y, x->ndim, shape);
  }
  kg_tensor_release(x2);
  kg_tensor_release(w2);
  kg_tensor_release(s2t);
  kg_tensor_release(y);
  return s;
}

/* dx = g · dequantize_q4(wq, scale); db = g; the codes and scales take none */
kg_status kg_grad_linear_q4(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  kg_tensor *g = dout[0];
  if (kg_node_needs_grad(n, 0)) {
    kg_tensor *w = NULL;
    kg_status s = kg_dequantize_q4(&w, n->saved_in[1], n->saved_in[2], g->dtype);
    if (!s) s = kg_matmul(&din[0], g, w);
    kg_tensor_release(w);
    KG_TRY(s);
  }
  if (n->nin > 3 && kg_node_needs_grad(n, 3)) din[3] = kg_tensor_retain(g);
  return KG_OK;
}

kg_status kg_quantize_q4(kg_tensor **q, kg_tensor **scale, const kg_tensor *w) {
  char s1[KG_SHAPE_STR_MAX];
  if (w->ndim != 2 || w->shape[1] % Q4_BLOCK)
    return kg_error(KG_ERR_SHAPE, "quantize_q4", "weight %s must be 2-D [out, in] with in a multiple of %d",
                    KG_SHAPE(w, s1), Q4_BLOCK);
  KG_TRY(kg_check_float("quantize_q4", w, "weight"));
  kg_tensor *outs[2] = {NULL, NULL};
  int64_t qshape[2] = {w->shape[0], w->shape[1] / 2}, sshape[2] = {w->shape[0], w->shape[1] / Q4_BLOCK};
  kg_status s = kg_new_like(&outs[0], w, 2, qshape, KG_U8);
  if (!s) s = kg_new_like(&outs[1], w, 2, sshape, KG_F16);
  if (!s) s = kg_op_run(KG_OP_QUANTIZE_Q4, 2, outs, 1, &w, NULL, 0);
  if (s) {
    kg_tensor_release(outs[0]);
    kg_tensor_release(outs[1]);
    return s;
  }
  *q = outs[0], *scale = outs[1];
  return KG_OK;
}
