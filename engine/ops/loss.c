/* loss.c — losses: cross_entropy (fused log-softmax + NLL over the last dim, with a fused
 * backward kernel; class weights and label smoothing as PyTorch's) and mse_loss (a composite of
 * sub, mul and mean/sum).
 * Shapes: logits [..., C] (N rows of C classes), targets [...] integer 0-based class ids,
 * weight [C]. */
#include "../core/internal.h"

#include <stdio.h>

kg_status kg_cross_entropy(kg_tensor **out, const kg_tensor *logits, const kg_tensor *targets,
                           const kg_tensor *weight, const kg_loss_params *p) {
  char b1[KG_SHAPE_STR_MAX], b2[KG_SHAPE_STR_MAX];
  const kg_tensor *in[3] = {logits, targets, weight};
  KG_TRY(kg_check_float("cross_entropy", logits, "logits"));
  KG_TRY(kg_check_integer("cross_entropy", targets, "targets"));
  KG_TRY(kg_check_same_device("cross_entropy", weight ? 3 : 2, in));
  if (!(p->label_smoothing >= 0 && p->label_smoothing <= 1))
    return kg_error(KG_ERR_VALUE, "cross_entropy", "label_smoothing must be in [0, 1], got %g", p->label_smoothing);
  if (weight) {
    KG_TRY(kg_check_float("cross_entropy", weight, "weight"));
    if (weight->ndim != 1 || logits->ndim < 1 || weight->shape[0] != logits->shape[logits->ndim - 1])
      return kg_error(KG_ERR_SHAPE, "cross_entropy", "weight %s must be [C] for logits %s (one weight per class)",
                      KG_SHAPE(weight, b1), KG_SHAPE(logits, b2));
    if (kg_grad_enabled() && kg_requires_grad(weight))
      return kg_error(KG_ERR_VALUE, "cross_entropy",
                      "weight requires grad, but class weights are constants here (as in PyTorch): pass weight:detach()");
  }
  bool fits = logits->ndim >= 1 && targets->ndim == logits->ndim - 1;
  for (int d = 0; fits && d < targets->ndim; d++) fits = targets->shape[d] == logits->shape[d];
  if (!fits)
    return kg_error(KG_ERR_SHAPE, "cross_entropy",
                    "logits %s and targets %s: targets must have the logits' shape without the last (class) dim",
                    KG_SHAPE(logits, b1), KG_SHAPE(targets, b2));
  if (logits->shape[logits->ndim - 1] == 0)
    return kg_error(KG_ERR_SHAPE, "cross_entropy", "logits %s have no classes", KG_SHAPE(logits, b1));
  if (p->reduction != KG_REDUCE_MEAN && p->reduction != KG_REDUCE_SUM && p->reduction != KG_REDUCE_NONE)
    return kg_error(KG_ERR_VALUE, "cross_entropy", "unknown reduction %d", (int)p->reduction);
  kg_dtype dt = logits->dtype == KG_F64 ? KG_F64 : KG_F32;
  kg_tensor *outs[2] = {NULL, NULL}; /* loss, per-row logsumexp (saved for backward) */
  bool none = p->reduction == KG_REDUCE_NONE;
  KG_TRY(kg_new_like(&outs[0], logits, none ? targets->ndim : 0, targets->shape, dt));
  kg_status s = kg_new_like(&outs[1], logits, targets->ndim, targets->shape, dt);
  if (!s) s = kg_op_run(KG_OP_CROSS_ENTROPY, 2, outs, 3, in, p, sizeof *p);
  if (s) return kg_release_all(2, outs), s;
  kg_tensor_release(outs[1]);
  *out = outs[0];
  return KG_OK;
}

/* the error for target `value` out of [0, C) in row `row` (row-major over the targets' shape):
 * names the value and its 1-based position in targets; shared by the CPU and CUDA kernels */
kg_status kg_cross_entropy_range_error(const kg_tensor *logits, const kg_tensor *targets, int64_t row, long long value) {
  char b1[KG_SHAPE_STR_MAX], b2[KG_SHAPE_STR_MAX], pos[KG_SHAPE_STR_MAX] = "";
  int64_t idx[KG_MAX_DIMS], o = row;
  for (int d = targets->ndim - 1; d >= 0; d--) idx[d] = o % targets->shape[d], o /= targets->shape[d];
  for (int d = 0, n = 0; d < targets->ndim && n < (int)sizeof pos; d++)
    n += snprintf(pos + n, sizeof pos - n, "%s%lld", d ? "," : "", (long long)idx[d] + 1);
  return kg_error(KG_ERR_VALUE, "cross_entropy",
                  "target %lld at position [%s] of targets %s is out of range for %lld classes (logits %s); "
                  "targets are 0-based class ids",
                  value, pos, KG_SHAPE(targets, b1), (long long)logits->shape[logits->ndim - 1], KG_SHAPE(logits, b2));
}

/* dlogits = (a·softmax(logits) - (1-ε)·w[t]·onehot(t) - ε/C·w) * g / Σw[t] (mean), with
 * a = (1-ε)·w[t] + ε/C·Σw (w = 1 without weights), in one kernel */
kg_status kg_grad_cross_entropy(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (!kg_node_needs_grad(n, 0) || !dout[0]) return KG_OK;
  const kg_tensor_meta *m = &n->in_meta[0];
  KG_TRY(kg_tensor_empty(&din[0], m->ndim, m->shape, m->dtype, m->device));
  const kg_tensor *in[5] = {n->saved_in[0], n->saved_in[1], n->saved_out[1], dout[0], n->saved_in[2]};
  kg_status s = kg_op_dispatch(KG_OP_CROSS_ENTROPY_BACKWARD, 1, din, 5, in, n->params);
  if (s) {
    kg_tensor_release(din[0]);
    din[0] = NULL;
  }
  return s;
}

kg_status kg_mse_loss(kg_tensor **out, const kg_tensor *a, const kg_tensor *b, kg_reduction reduction) {
  char b1[KG_SHAPE_STR_MAX], b2[KG_SHAPE_STR_MAX];
  int nd;
  int64_t shape[KG_MAX_DIMS];
  KG_TRY(kg_check_float("mse_loss", a, "input"));
  KG_TRY(kg_check_float("mse_loss", b, "target"));
  if (!kg_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, &nd, shape))
    return kg_error(KG_ERR_SHAPE, "mse_loss", "input %s and target %s cannot be broadcast", KG_SHAPE(a, b1),
                    KG_SHAPE(b, b2));
  if (reduction != KG_REDUCE_MEAN && reduction != KG_REDUCE_SUM && reduction != KG_REDUCE_NONE)
    return kg_error(KG_ERR_VALUE, "mse_loss", "unknown reduction %d", (int)reduction);
  kg_tensor *d, *sq;
  KG_TRY(kg_binary(&d, KG_OP_SUB, a, b));
  kg_status s = kg_binary(&sq, KG_OP_MUL, d, d);
  kg_tensor_release(d);
  KG_TRY(s);
  if (reduction == KG_REDUCE_NONE) return *out = sq, KG_OK;
  s = reduction == KG_REDUCE_MEAN ? kg_mean(out, sq, KG_DIMS_ALL, false) : kg_sum(out, sq, KG_DIMS_ALL, false);
  kg_tensor_release(sq);
  return s;
}
