/* quant.c — weight-only quantization (docs/quantization.md; the formats in quant_format.h):
 *   linear_q8(x, wq, scale, b)  y [..., O] = x [..., I] · Wᵀ + b [O], W = wq [O, I] · scale: f32
 *                               [O] (Q8) or f16 [O, I / 32] (llama.cpp's Q8_0)
 *   quantize_q8(w)              wq, scale of w [O, I]: per output row absmax / 127 (Keras 3's
 *                               int8 Dense), round to nearest even, clamp to [-127, 127]
 *   linear_q4, quantize_q4, dequantize_q4 / dequantize_q8: the same for Q4_0 (4-bit codes)
 * Only x (and the bias) get gradients: the int8 weight and its scale are frozen (a quantized base
 * under LoRA adapters), so a scale that requires grad is refused rather than silently ignored. */
#include "../core/internal.h"
#include "../cpu/quant.h"
#include "quant_format.h"

#include <stdatomic.h>

/* int8 x needs AVX-512 VNNI to pay (the scalar reference is slower than the f32 kernels), so
 * elsewhere the setting reads, and is, off */
static atomic_bool act_int8 = true;
void kg_set_quant_act_int8(bool on) { atomic_store(&act_int8, on); }
bool kg_quant_act_int8(void) { return atomic_load(&act_int8) && kg_cpu_q8_vnni_present(); }

/* the format of codes wq and scales (quant_format.h), checked for op; sets *in to the
 * in-features. linear_q8 takes Q8 and Q8_0, linear_q4 / dequantize_q4 Q4_0. */
static kg_status q_format(const char *op, bool int8, const kg_tensor *wq, const kg_tensor *scale, kg_qfmt *fmt,
                          int64_t *in_out) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  int64_t in;
  if (int8) {
    if (wq->dtype != KG_I8 || wq->ndim != 2)
      return kg_error(KG_ERR_TYPE, op, "weight must be an i8 [out, in] tensor, got %s %s",
                      kg_dtype_info[wq->dtype].name, KG_SHAPE(wq, s1));
    in = wq->shape[1];
    *fmt = scale->ndim == 2 ? KG_QF_Q8_0 : KG_QF_Q8;
    if (*fmt == KG_QF_Q8 && (scale->dtype != KG_F32 || scale->ndim != 1 || scale->shape[0] != wq->shape[0]))
      return kg_error(KG_ERR_TYPE, op,
                      "scale must be an f32 [%lld] tensor (one per output row) or f16 [%lld,%lld] (one per block "
                      "of %d), got %s %s",
                      (long long)wq->shape[0], (long long)wq->shape[0], (long long)(in / KG_QF_BLOCK), KG_QF_BLOCK,
                      kg_dtype_info[scale->dtype].name, KG_SHAPE(scale, s1));
  } else {
    if (wq->dtype != KG_U8 || wq->ndim != 2)
      return kg_error(KG_ERR_TYPE, op, "weight must be a u8 [out, in / 2] tensor (two 4-bit codes a byte), got %s %s",
                      kg_dtype_info[wq->dtype].name, KG_SHAPE(wq, s1));
    in = wq->shape[1] * 2;
    *fmt = KG_QF_Q4_0;
  }
  if (*fmt != KG_QF_Q8) {
    if (in % KG_QF_BLOCK)
      return kg_error(KG_ERR_SHAPE, op, "weight %s: in-features %lld are not a multiple of %d", KG_SHAPE(wq, s1),
                      (long long)in, KG_QF_BLOCK);
    if (scale->dtype != KG_F16 || scale->ndim != 2 || scale->shape[0] != wq->shape[0] ||
        scale->shape[1] != in / KG_QF_BLOCK)
      return kg_error(KG_ERR_TYPE, op, "scale must be an f16 [%lld,%lld] tensor (one per block of %d), got %s %s",
                      (long long)wq->shape[0], (long long)(in / KG_QF_BLOCK), KG_QF_BLOCK,
                      kg_dtype_info[scale->dtype].name, KG_SHAPE(scale, s2));
  }
  if (kg_requires_grad(scale) && kg_grad_enabled())
    return kg_error(KG_ERR_AUTOGRAD, op, "scale requires grad, but the quantized weight and its scale are frozen "
                                         "(train adapters on top instead)");
  *in_out = in;
  return KG_OK;
}

/* y [..., O] = x [..., I] · Wᵀ + b for both ops: the kernels take x as rows [N, I] and dense
 * codes and scales */
static kg_status linear_q(kg_tensor **out, kg_op id, const char *op, const kg_tensor *x, const kg_tensor *wq,
                          const kg_tensor *scale, const kg_tensor *b) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[4] = {x, wq, scale, b};
  KG_TRY(kg_check_same_device(op, b ? 4 : 3, ts));
  int64_t in = 0;
  kg_qfmt fmt = KG_QF_Q8;
  KG_TRY(q_format(op, id == KG_OP_LINEAR_Q8, wq, scale, &fmt, &in));
  KG_TRY(kg_check_float(op, x, "x"));
  if (x->ndim < 1 || x->shape[x->ndim - 1] != in)
    return kg_error(KG_ERR_SHAPE, op, "x %s · w %sᵀ: x's last dim must equal the in-features %lld", KG_SHAPE(x, s1),
                    KG_SHAPE(wq, s2), (long long)in);
  if (b) {
    KG_TRY(kg_check_float(op, b, "bias"));
    if (b->ndim != 1 || b->shape[0] != wq->shape[0])
      return kg_error(KG_ERR_SHAPE, op, "bias %s must be [%lld]", KG_SHAPE(b, s1), (long long)wq->shape[0]);
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
    s = kg_op_run(id, 1, &y, b ? 4 : 3, in4, NULL, 0);
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

kg_status kg_linear_q8(kg_tensor **out, const kg_tensor *x, const kg_tensor *wq, const kg_tensor *scale,
                       const kg_tensor *b) {
  return linear_q(out, KG_OP_LINEAR_Q8, "linear_q8", x, wq, scale, b);
}

kg_status kg_linear_q4(kg_tensor **out, const kg_tensor *x, const kg_tensor *wq, const kg_tensor *scale,
                       const kg_tensor *b) {
  return linear_q(out, KG_OP_LINEAR_Q4, "linear_q4", x, wq, scale, b);
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

/* ---- int4 (Q4_0) -------------------------------------------------------------------------- */

/* W [O, I] in dtype dt from codes and scales of any format (quant_format.h) */
static kg_status dequantize(kg_tensor **out, const char *op, bool int8, const kg_tensor *wq, const kg_tensor *scale,
                            kg_dtype dt) {
  const kg_tensor *ts[2] = {wq, scale};
  KG_TRY(kg_check_same_device(op, 2, ts));
  int64_t in = 0;
  kg_qfmt fmt = KG_QF_Q8;
  KG_TRY(q_format(op, int8, wq, scale, &fmt, &in));
  if (!kg_dtype_info[dt].is_float)
    return kg_error(KG_ERR_TYPE, op, "dtype must be floating point, got %s", kg_dtype_info[dt].name);
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

kg_status kg_dequantize_q4(kg_tensor **out, const kg_tensor *wq, const kg_tensor *scale, kg_dtype dt) {
  return dequantize(out, "dequantize_q4", false, wq, scale, dt);
}

kg_status kg_dequantize_q8(kg_tensor **out, const kg_tensor *wq, const kg_tensor *scale, kg_dtype dt) {
  return dequantize(out, "dequantize_q8", true, wq, scale, dt);
}

/* dx = g · W (the dequantized weight, materialised once per backward); db = g (summed by the
 * engine). The codes take no gradient (integers); the scales none either (refused in the
 * forward). */
kg_status kg_grad_linear_q8(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  kg_tensor *g = dout[0];
  if (kg_node_needs_grad(n, 0)) {
    kg_tensor *w = NULL;
    const kg_tensor *wq = n->saved_in[1];
    kg_status s = dequantize(&w, wq->dtype == KG_I8 ? "linear_q8" : "linear_q4", wq->dtype == KG_I8, wq,
                             n->saved_in[2], g->dtype);
    if (!s) s = kg_matmul(&din[0], g, w);
    kg_tensor_release(w);
    KG_TRY(s);
  }
  if (n->nin > 3 && kg_node_needs_grad(n, 3)) din[3] = kg_tensor_retain(g);
  return KG_OK;
}

kg_status kg_grad_linear_q4(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return kg_grad_linear_q8(n, dout, din);
}

kg_status kg_quantize_q4(kg_tensor **q, kg_tensor **scale, const kg_tensor *w) {
  char s1[KG_SHAPE_STR_MAX];
  if (w->ndim != 2 || w->shape[1] % KG_QF_BLOCK)
    return kg_error(KG_ERR_SHAPE, "quantize_q4", "weight %s must be 2-D [out, in] with in a multiple of %d",
                    KG_SHAPE(w, s1), KG_QF_BLOCK);
  KG_TRY(kg_check_float("quantize_q4", w, "weight"));
  kg_tensor *outs[2] = {NULL, NULL};
  int64_t qshape[2] = {w->shape[0], w->shape[1] / 2}, sshape[2] = {w->shape[0], w->shape[1] / KG_QF_BLOCK};
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
