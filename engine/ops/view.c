/* view.c — ops that return views sharing storage: view/reshape, permute, expand, narrow,
 * select, squeeze, unsqueeze. None runs a kernel except reshape of a non-viewable tensor. */
#include "../core/internal.h"

#include <string.h>

static kg_status record(kg_op op, kg_tensor *out, const kg_tensor *x, const void *p, size_t size) {
  kg_status s = kg_op_record(op, 1, &out, 1, &x, p, size);
  if (s) kg_tensor_release(out);
  return s;
}

/* fills shape with -1 resolved; error names the op */
static kg_status infer_shape(const char *op, const kg_tensor *x, int ndim, const int64_t *in, int64_t *shape) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (ndim < 0 || ndim > KG_MAX_DIMS) return kg_error(KG_ERR_VALUE, op, "%d dims; at most %d are supported", ndim, KG_MAX_DIMS);
  int infer = -1;
  int64_t known = 1; /* the product of the non-zero sizes, then 0 if any size is */
  bool zero = false;
  for (int i = 0; i < ndim; i++) {
    shape[i] = in[i];
    if (in[i] == -1) {
      if (infer >= 0) return kg_error(KG_ERR_VALUE, op, "only one dimension can be -1 in %s", kg_shape_str(a, ndim, in));
      infer = i;
    } else if (in[i] < 0) {
      return kg_error(KG_ERR_VALUE, op, "negative size in shape %s", kg_shape_str(a, ndim, in));
    } else if (!kg_size_mul(known, in[i] ? in[i] : 1, &known)) {
      /* a wrapped product could match x's count and view far outside its storage */
      return kg_error(KG_ERR_VALUE, op, "shape %s is too large (more than 2^59 elements)", kg_shape_str(a, ndim, in));
    } else if (in[i] == 0) {
      zero = true;
    }
  }
  if (zero) known = 0;
  int64_t n = kg_numel(x);
  if (infer >= 0) {
    if (known == 0 || n % known)
      return kg_error(KG_ERR_SHAPE, op, "cannot reshape %s (%lld elements) into %s", KG_SHAPE(x, a), (long long)n,
                      kg_shape_str(b, ndim, in));
    shape[infer] = n / known;
    return kg_check_shape(op, ndim, shape);
  } else if (known != n) {
    return kg_error(KG_ERR_SHAPE, op, "cannot reshape %s (%lld elements) into %s (%lld elements)", KG_SHAPE(x, a),
                    (long long)n, kg_shape_str(b, ndim, in), (long long)known);
  }
  return KG_OK;
}

/* Strides for viewing x as `shape` without copying, if possible (chunks of x's dims that are
 * contiguous among themselves may be split or merged). Returns false if a copy is needed. */
static bool view_strides(const kg_tensor *x, int ndim, const int64_t *shape, int64_t *stride) {
  if (kg_numel(x) == 0 || kg_is_contiguous(x)) {
    kg_contiguous_strides(ndim, shape, stride);
    return true;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = x->ndim ? x->stride[x->ndim - 1] : 1, tensor_numel = 1, view_numel = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    tensor_numel *= x->shape[d];
    if (d == 0 || (x->shape[d - 1] != 1 && x->stride[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        stride[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = x->stride[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

kg_status kg_view(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *in_shape) {
  kg_view_params p = {ndim, {0}};
  KG_TRY(infer_shape("view", x, ndim, in_shape, p.shape));
  int64_t stride[KG_MAX_DIMS];
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (!view_strides(x, ndim, p.shape, stride))
    return kg_error(KG_ERR_SHAPE, "view", "cannot view %s with strides that do not allow %s; use reshape",
                    KG_SHAPE(x, a), kg_shape_str(b, ndim, p.shape));
  KG_TRY(kg_tensor_view_raw(out, x, ndim, p.shape, stride, x->offset));
  return record(KG_OP_VIEW, *out, x, &p, sizeof p);
}

kg_status kg_reshape(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *in_shape) {
  int64_t shape[KG_MAX_DIMS], stride[KG_MAX_DIMS];
  KG_TRY(infer_shape("reshape", x, ndim, in_shape, shape));
  if (view_strides(x, ndim, shape, stride)) return kg_view(out, x, ndim, shape);
  kg_tensor *c;
  KG_TRY(kg_contiguous(&c, x));
  kg_status s = kg_view(out, c, ndim, shape);
  kg_tensor_release(c);
  return s;
}

kg_status kg_flatten(kg_tensor **out, const kg_tensor *x) {
  int64_t n = kg_numel(x);
  return kg_reshape(out, x, 1, &n);
}

kg_status kg_grad_view(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return kg_reshape(&din[0], dout[0], n->in_meta[0].ndim, n->in_meta[0].shape);
}

kg_status kg_permute(kg_tensor **out, const kg_tensor *x, const int *perm_in) {
  kg_permute_params p;
  int64_t shape[KG_MAX_DIMS], stride[KG_MAX_DIMS];
  bool seen[KG_MAX_DIMS] = {0};
  for (int i = 0; i < x->ndim; i++) {
    int d = perm_in[i];
    if (!kg_wrap_dim(&d, x->ndim) || seen[d]) {
      char a[KG_SHAPE_STR_MAX];
      return kg_error(KG_ERR_VALUE, "permute", "dims must be a permutation of %d dims of %s (bad or repeated dim %lld)",
                      x->ndim, KG_SHAPE(x, a), kg_pos1(perm_in[i]));
    }
    seen[d] = true;
    p.perm[i] = d;
    shape[i] = x->shape[d];
    stride[i] = x->stride[d];
  }
  KG_TRY(kg_tensor_view_raw(out, x, x->ndim, shape, stride, x->offset));
  return record(KG_OP_PERMUTE, *out, x, &p, sizeof p);
}

kg_status kg_transpose(kg_tensor **out, const kg_tensor *x, int d0, int d1) {
  int perm[KG_MAX_DIMS];
  char a[KG_SHAPE_STR_MAX];
  int n = x->ndim;
  if (n == 0) return kg_view(out, x, 0, NULL);
  if (!kg_wrap_dim(&d0, n) || !kg_wrap_dim(&d1, n))
    return kg_error(KG_ERR_VALUE, "transpose", "dims %lld, %lld out of range for %s", kg_pos1(d0), kg_pos1(d1),
                    KG_SHAPE(x, a));
  for (int i = 0; i < n; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return kg_permute(out, x, perm);
}

kg_status kg_grad_permute(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_permute_params *p = n->params;
  int inv[KG_MAX_DIMS];
  for (int i = 0; i < n->in_meta[0].ndim; i++) inv[p->perm[i]] = i;
  return kg_permute(&din[0], dout[0], inv);
}

kg_status kg_expand(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *in_shape) {
  int64_t shape[KG_MAX_DIMS], stride[KG_MAX_DIMS];
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (ndim < x->ndim || ndim > KG_MAX_DIMS)
    return kg_error(KG_ERR_SHAPE, "expand", "cannot expand %s to %s: fewer dims", KG_SHAPE(x, a), kg_shape_str(b, ndim, in_shape));
  int lead = ndim - x->ndim;
  for (int i = 0; i < ndim; i++) {
    int j = i - lead;
    int64_t want = in_shape[i];
    if (j < 0) {
      if (want < 0) return kg_error(KG_ERR_VALUE, "expand", "-1 is not allowed for a new leading dim in %s", kg_shape_str(b, ndim, in_shape));
      shape[i] = want;
      stride[i] = 0;
    } else if (want == -1 || want == x->shape[j]) {
      shape[i] = x->shape[j];
      stride[i] = x->stride[j];
    } else if (x->shape[j] == 1 && want >= 0) {
      shape[i] = want;
      stride[i] = 0;
    } else {
      return kg_error(KG_ERR_SHAPE, "expand", "cannot expand %s to %s: dim %d has size %lld, not 1", KG_SHAPE(x, a),
                      kg_shape_str(b, ndim, in_shape), j + 1, (long long)x->shape[j]);
    }
  }
  KG_TRY(kg_check_shape("expand", ndim, shape));
  KG_TRY(kg_tensor_view_raw(out, x, ndim, shape, stride, x->offset));
  return record(KG_OP_EXPAND, *out, x, NULL, 0);
}

kg_status kg_grad_expand(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  (void)n;
  din[0] = kg_tensor_retain(dout[0]); /* the engine sums over the broadcast dims */
  return KG_OK;
}

kg_status kg_narrow(kg_tensor **out, const kg_tensor *x, int dim, int64_t start, int64_t length) {
  char a[KG_SHAPE_STR_MAX];
  int d = dim;
  if (!kg_wrap_dim(&d, x->ndim) || x->ndim == 0)
    return kg_error(KG_ERR_VALUE, "narrow", "dim %lld out of range for %s", kg_pos1(dim), KG_SHAPE(x, a));
  int64_t given = start;
  if (start < 0) start += x->shape[d];
  if (start < 0 || start > x->shape[d] || length < 0 || length > x->shape[d] - start)
    return kg_error(KG_ERR_VALUE, "narrow", "start %lld with length %lld does not fit in size %lld of dim %d of %s",
                    kg_pos1(given), (long long)length, (long long)x->shape[d], d + 1, KG_SHAPE(x, a));
  int64_t shape[KG_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[d] = length;
  KG_TRY(kg_tensor_view_raw(out, x, x->ndim, shape, x->stride, x->offset + start * x->stride[d]));
  kg_narrow_params p = {d, start, length};
  return record(KG_OP_NARROW, *out, x, &p, sizeof p);
}

kg_status kg_select(kg_tensor **out, const kg_tensor *x, int dim, int64_t index) {
  char a[KG_SHAPE_STR_MAX];
  int d = dim;
  if (x->ndim == 0 || !kg_wrap_dim(&d, x->ndim))
    return kg_error(KG_ERR_VALUE, "select", "dim %lld out of range for %s", kg_pos1(dim), KG_SHAPE(x, a));
  int64_t i = index < 0 ? index + x->shape[d] : index;
  if (i < 0 || i >= x->shape[d])
    return kg_error(KG_ERR_VALUE, "select", "index %lld out of range for dim %d of size %lld in %s", kg_pos1(index),
                    d + 1, (long long)x->shape[d], KG_SHAPE(x, a));
  int64_t shape[KG_MAX_DIMS], stride[KG_MAX_DIMS];
  int k = 0;
  for (int j = 0; j < x->ndim; j++)
    if (j != d) shape[k] = x->shape[j], stride[k++] = x->stride[j];
  KG_TRY(kg_tensor_view_raw(out, x, x->ndim - 1, shape, stride, x->offset + i * x->stride[d]));
  kg_select_params p = {d, i};
  return record(KG_OP_SELECT, *out, x, &p, sizeof p);
}

/* zeros of the input's shape with dout laid into the slice the forward took */
static kg_status scatter_into_zeros(kg_node *n, kg_tensor *dout, kg_tensor **din, bool is_select) {
  kg_tensor *z, *slice;
  KG_TRY(kg_full(&z, n->in_meta[0].ndim, n->in_meta[0].shape, 0, dout->dtype, dout->device));
  kg_status s;
  if (is_select) {
    const kg_select_params *p = n->params;
    s = kg_select(&slice, z, p->dim, p->index);
  } else {
    const kg_narrow_params *p = n->params;
    s = kg_narrow(&slice, z, p->dim, p->start, p->length);
  }
  if (s == KG_OK) {
    s = kg_copy_(slice, dout);
    kg_tensor_release(slice);
  }
  if (s) return kg_tensor_release(z), s;
  din[0] = z;
  return KG_OK;
}
kg_status kg_grad_narrow(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { return scatter_into_zeros(n, dout[0], din, false); }
kg_status kg_grad_select(kg_node *n, kg_tensor *const *dout, kg_tensor **din) { return scatter_into_zeros(n, dout[0], din, true); }

kg_status kg_squeeze(kg_tensor **out, const kg_tensor *x, int dim) {
  int64_t shape[KG_MAX_DIMS];
  int k = 0;
  char a[KG_SHAPE_STR_MAX];
  int d = dim;
  if (dim != KG_ALL_DIMS && !kg_wrap_dim(&d, x->ndim))
    return kg_error(KG_ERR_VALUE, "squeeze", "dim %lld out of range for %s", kg_pos1(dim), KG_SHAPE(x, a));
  for (int j = 0; j < x->ndim; j++)
    if (!(x->shape[j] == 1 && (dim == KG_ALL_DIMS || j == d))) shape[k++] = x->shape[j];
  return kg_view(out, x, k, shape);
}

kg_status kg_unsqueeze(kg_tensor **out, const kg_tensor *x, int dim) {
  int64_t shape[KG_MAX_DIMS];
  char a[KG_SHAPE_STR_MAX];
  int d = dim < 0 ? dim + x->ndim + 1 : dim;
  if (d < 0 || d > x->ndim || x->ndim >= KG_MAX_DIMS)
    return kg_error(KG_ERR_VALUE, "unsqueeze", "dim %lld out of range for %s", kg_pos1(dim), KG_SHAPE(x, a));
  for (int j = 0, k = 0; j <= x->ndim; j++) shape[j] = j == d ? 1 : x->shape[k++];
  return kg_view(out, x, x->ndim + 1, shape);
}
