/* optim.c — fused optimizer updates: one in-place kernel call per parameter (SGD_STEP, ADAM_STEP).
 *
 * Shapes: p, g and every state tensor share one shape [*] (any strides; views are fine). State
 * lives in the dtype the caller made it in (keng.optim uses the parameter's dtype); kernels
 * compute in f32 (f64 when p is f64). Kernels: engine/cpu/optim.c, engine/cuda/optim.cu.
 *
 * SGD (PyTorch's torch.optim.SGD, lr η, momentum μ, dampening δ, weight decay λ):
 *   decoupled:  p ← p − η·λ·p              otherwise: g ← g + λ·p        (when λ ≠ 0)
 *   μ ≠ 0:      b ← g on step 1, else b ← μ·b + (1 − δ)·g
 *               g ← g + μ·b (nesterov) or g ← b
 *   p ← p − η·g
 * With δ = 0 this equals Keras 3's SGD (its velocity is −η·b while η is constant).
 *
 * Adam / AdamW (Keras 3 keras/optimizers/adam.py, weight decay as its base optimizer applies it):
 *   t the 1-based step, α = η·sqrt(1 − β2^t) / (1 − β1^t)   (computed in double, once per call)
 *   decoupled (AdamW): p ← p − p·λ·η            otherwise (Adam with L2): g ← g + λ·p
 *   m ← m + (g − m)·(1 − β1)
 *   v ← v + (g² − v)·(1 − β2)
 *   p ← p − α·m / (sqrt(v) + ε)
 * ε is Keras' "epsilon hat": added to sqrt(v) of the uncorrected v, so ε = 1e-7 here equals
 * PyTorch's eps = 1e-7·sqrt(1 − β2^t) only approximately; the spec checks this form exactly.
 *
 * lr_t / step_t (optional, one-element f64 tensors): lr and t read when the update runs. On the
 * cpu they are read here (the kernel gets numbers); on cuda the kernel reads them on the device
 * and computes α and η·λ there in double, so a CUDA Graph replay uses whatever keng.optim wrote
 * into them before the launch.
 */
#include "../core/internal.h"

#include <math.h>

/* t: floating, on p's device, p's shape */
static kg_status check_like(const char *op, const kg_tensor *p, const kg_tensor *t, const char *what) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[2] = {p, t};
  KG_TRY(kg_check_same_device(op, 2, ts));
  KG_TRY(kg_check_float(op, t, what));
  if (!kg_same_shape(p, t))
    return kg_error(KG_ERR_SHAPE, op, "%s %s does not match param %s", what, KG_SHAPE(t, a), KG_SHAPE(p, b));
  return KG_OK;
}

/* lr_t / step_t (optional): one-element f64 tensors on p's device */
static kg_status check_scalar(const char *op, const kg_tensor *p, const kg_tensor *t, const char *what) {
  char a[KG_SHAPE_STR_MAX];
  if (!t) return KG_OK;
  const kg_tensor *ts[2] = {p, t};
  KG_TRY(kg_check_same_device(op, 2, ts));
  if (t->dtype != KG_F64 || kg_numel(t) != 1)
    return kg_error(KG_ERR_TYPE, op, "%s must be a one-element f64 tensor, got %s%s", what, kg_dtype_info[t->dtype].name,
                    KG_SHAPE(t, a));
  return KG_OK;
}

/* On the cpu the scalars are read here, so the cpu kernel sees plain numbers (it never reads
 * lr_t / step_t); on cuda the kernel reads them on the device. */
static kg_status read_scalars(const char *op, const kg_tensor *param, const kg_tensor **lr_t, const kg_tensor **step_t,
                              double *lr, int64_t *step) {
  KG_TRY(check_scalar(op, param, *lr_t, "lr_t"));
  KG_TRY(check_scalar(op, param, *step_t, "step_t"));
  if (param->device.type != KG_DEV_CPU) return KG_OK;
  if (*lr_t) *lr = *(const double *)kg_data(*lr_t), *lr_t = NULL;
  if (*step_t) {
    double s = *(const double *)kg_data(*step_t);
    if (s != (double)(int64_t)s) return kg_error(KG_ERR_VALUE, op, "step_t holds %g, not an integer", s);
    *step = (int64_t)s, *step_t = NULL;
  }
  return KG_OK;
}

static kg_status check_finite_nonneg(const char *op, const char *what, double v) {
  if (!(v >= 0) || isinf(v)) return kg_error(KG_ERR_VALUE, op, "%s must be a finite number >= 0, got %g", what, v);
  return KG_OK;
}

kg_status kg_sgd_step_(kg_tensor *param, const kg_tensor *grad, kg_tensor *momentum_buf, const kg_sgd_params *pp) {
  const char *op = "sgd_step";
  KG_TRY(kg_check_float(op, param, "param"));
  kg_sgd_params q = *pp;
  const kg_sgd_params *p = &q;
  KG_TRY(read_scalars(op, param, &q.lr_t, &q.step_t, &q.lr, &q.step));
  KG_TRY(check_like(op, param, grad, "grad"));
  KG_TRY(check_finite_nonneg(op, "lr", p->lr));
  KG_TRY(check_finite_nonneg(op, "weight_decay", p->weight_decay));
  if (!(p->momentum >= 0 && p->momentum < 1))
    return kg_error(KG_ERR_VALUE, op, "momentum must be in [0, 1), got %g", p->momentum);
  if (!(p->dampening >= 0 && p->dampening <= 1))
    return kg_error(KG_ERR_VALUE, op, "dampening must be in [0, 1], got %g", p->dampening);
  if (p->nesterov && (p->momentum <= 0 || p->dampening != 0))
    return kg_error(KG_ERR_VALUE, op, "nesterov needs momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                    p->momentum, p->dampening);
  if (p->momentum > 0 && !momentum_buf)
    return kg_error(KG_ERR_VALUE, op, "momentum %g needs a momentum buffer", p->momentum);
  if (p->step < 1) return kg_error(KG_ERR_VALUE, op, "step must be >= 1, got %lld", (long long)p->step);
  if (momentum_buf) KG_TRY(check_like(op, param, momentum_buf, "momentum_buf"));
  KG_TRY(kg_check_inplace(op, param));
  KG_TRY(kg_check_overlap(op, param, 1, &grad, true));
  if (momentum_buf) KG_TRY(kg_check_inplace(op, momentum_buf));
  if (momentum_buf) KG_TRY(kg_check_overlap(op, momentum_buf, 2, (const kg_tensor *[]){grad, param}, false));
  kg_tensor_bump_version(param);
  if (momentum_buf && p->momentum > 0) kg_tensor_bump_version(momentum_buf);
  kg_tensor *out[2] = {param, p->momentum > 0 ? momentum_buf : NULL};
  return kg_op_dispatch(KG_OP_SGD_STEP, out[1] ? 2 : 1, out, 1, &grad, p);
}

kg_status kg_adam_step_(kg_tensor *param, const kg_tensor *grad, kg_tensor *m, kg_tensor *v,
                        const kg_adam_params *pp) {
  const char *op = "adam_step";
  KG_TRY(kg_check_float(op, param, "param"));
  kg_adam_params q = *pp;
  const kg_adam_params *p = &q;
  KG_TRY(read_scalars(op, param, &q.lr_t, &q.step_t, &q.lr, &q.step));
  KG_TRY(check_like(op, param, grad, "grad"));
  KG_TRY(check_like(op, param, m, "m"));
  KG_TRY(check_like(op, param, v, "v"));
  KG_TRY(check_finite_nonneg(op, "lr", p->lr));
  KG_TRY(check_finite_nonneg(op, "weight_decay", p->weight_decay));
  if (!(p->beta1 >= 0 && p->beta1 < 1)) return kg_error(KG_ERR_VALUE, op, "beta1 must be in [0, 1), got %g", p->beta1);
  if (!(p->beta2 >= 0 && p->beta2 < 1)) return kg_error(KG_ERR_VALUE, op, "beta2 must be in [0, 1), got %g", p->beta2);
  if (!(p->eps > 0) || isinf(p->eps)) return kg_error(KG_ERR_VALUE, op, "eps must be a finite number > 0, got %g", p->eps);
  if (p->step < 1) return kg_error(KG_ERR_VALUE, op, "step must be >= 1, got %lld", (long long)p->step);
  if (m->storage == param->storage || v->storage == param->storage || m->storage == v->storage)
    return kg_error(KG_ERR_VALUE, op, "param, m and v must not share storage");
  KG_TRY(kg_check_inplace(op, param));
  KG_TRY(kg_check_inplace(op, m));
  KG_TRY(kg_check_inplace(op, v));
  KG_TRY(kg_check_overlap(op, param, 1, &grad, true));
  KG_TRY(kg_check_overlap(op, m, 1, &grad, false));
  KG_TRY(kg_check_overlap(op, v, 1, &grad, false));
  kg_tensor_bump_version(param);
  kg_tensor_bump_version(m);
  kg_tensor_bump_version(v);
  kg_tensor *out[3] = {param, m, v};
  return kg_op_dispatch(KG_OP_ADAM_STEP, 3, out, 1, &grad, p);
}
