/* creation.c — full, arange, random tensors, tril/triu. */
#include "../core/internal.h"

#include <math.h>

kg_status kg_fill_(kg_tensor *t, double value) {
  KG_TRY(kg_check_inplace("fill_", t));
  KG_TRY(kg_check_overlap("fill_", t, 0, NULL, true));
  KG_TRY(kg_check_value_fits("fill_", value, t->dtype));
  kg_fill_params p = {value};
  kg_tensor_bump_version(t);
  return kg_op_dispatch(KG_OP_FILL, 1, &t, 0, NULL, &p);
}

kg_status kg_full(kg_tensor **out, int ndim, const int64_t *shape, double value, kg_dtype dt, kg_device dev) {
  return kg_full_named(out, ndim, shape, value, dt, dev, "full");
}

kg_status kg_full_named(kg_tensor **out, int ndim, const int64_t *shape, double value, kg_dtype dt, kg_device dev,
                        const char *op) {
  kg_tensor *t;
  KG_TRY(kg_check_value_fits(op, value, dt));
  KG_TRY(kg_tensor_empty_op(&t, ndim, shape, dt, dev, op));
  kg_fill_params p = {value};
  kg_status s = kg_op_dispatch(KG_OP_FILL, 1, &t, 0, NULL, &p);
  if (s) return kg_tensor_release(t), s;
  *out = t;
  return KG_OK;
}

kg_status kg_scalar(kg_tensor **out, double v, kg_dtype dt, kg_device dev) { return kg_full(out, 0, NULL, v, dt, dev); }

kg_status kg_arange(kg_tensor **out, double start, double end, double step, kg_dtype dt, kg_device dev) {
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
    return kg_error(KG_ERR_VALUE, "arange", "start %g, end %g, step %g: step must be non-zero and all finite", start,
                    end, step);
  double n = ceil((end - start) / step);
  if (n < 0) n = 0;
  if (n > (double)KG_SIZE_MAX) return kg_error(KG_ERR_VALUE, "arange", "%g elements is too many (more than 2^59)", n);
  int64_t len = (int64_t)n;
  kg_tensor *t;
  KG_TRY(kg_tensor_empty_op(&t, 1, &len, dt, dev, "arange"));
  kg_arange_params p = {start, step};
  kg_status s = kg_op_dispatch(KG_OP_ARANGE, 1, &t, 0, NULL, &p);
  if (s) return kg_tensor_release(t), s;
  *out = t;
  return KG_OK;
}

static kg_status random_tensor(kg_tensor **out, kg_op op, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev,
                               double a, double b, uint64_t words_per_elem) {
  kg_tensor *t;
  KG_TRY(kg_tensor_empty_op(&t, ndim, shape, dt, dev, kg_op_info[op].name));
  kg_random_params p = {kg_rng_reserve((uint64_t)kg_numel(t) * words_per_elem), a, b};
  kg_status s = kg_op_dispatch(op, 1, &t, 0, NULL, &p);
  if (s) return kg_tensor_release(t), s;
  *out = t;
  return KG_OK;
}

kg_status kg_rand(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev) {
  if (!kg_dtype_info[dt].is_float) return kg_error(KG_ERR_TYPE, "rand", "dtype must be floating, got %s", kg_dtype_info[dt].name);
  return random_tensor(out, KG_OP_RAND, ndim, shape, dt, dev, 0, 1, 2);
}

kg_status kg_randn(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev) {
  if (!kg_dtype_info[dt].is_float) return kg_error(KG_ERR_TYPE, "randn", "dtype must be floating, got %s", kg_dtype_info[dt].name);
  return random_tensor(out, KG_OP_RANDN, ndim, shape, dt, dev, 0, 1, 2);
}

kg_status kg_randint(kg_tensor **out, int64_t lo, int64_t hi, int ndim, const int64_t *shape, kg_dtype dt,
                     kg_device dev) {
  if (hi <= lo) return kg_error(KG_ERR_VALUE, "randint", "empty range [%lld, %lld)", (long long)lo, (long long)hi);
  return random_tensor(out, KG_OP_RANDINT, ndim, shape, dt, dev, (double)lo, (double)hi, 2);
}

static kg_status tri(kg_tensor **out, kg_op op, const kg_tensor *x, int64_t k) {
  const char *name = kg_op_info[op].name;
  char b[KG_SHAPE_STR_MAX];
  if (x->ndim < 2) return kg_error(KG_ERR_SHAPE, name, "input %s must have at least 2 dims", KG_SHAPE(x, b));
  KG_TRY(kg_new_like(out, x, x->ndim, x->shape, x->dtype));
  kg_tri_params p = {k};
  kg_status s = kg_op_run(op, 1, out, 1, &x, &p, sizeof p);
  if (s) kg_tensor_release(*out);
  return s;
}
kg_status kg_tril(kg_tensor **out, const kg_tensor *x, int64_t k) { return tri(out, KG_OP_TRIL, x, k); }
kg_status kg_triu(kg_tensor **out, const kg_tensor *x, int64_t k) { return tri(out, KG_OP_TRIU, x, k); }

/* d tril(x) = tril(dy): the mask is linear */
kg_status kg_grad_tril(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return kg_tril(&din[0], dout[0], ((kg_tri_params *)n->params)->k);
}
kg_status kg_grad_triu(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return kg_triu(&din[0], dout[0], ((kg_tri_params *)n->params)->k);
}
