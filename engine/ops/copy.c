/* copy.c — copies, casts and device moves; all go through the COPY kernel. */
#include "../core/internal.h"

#include <stdlib.h>

static kg_status check_copy(const kg_tensor *dst, const kg_tensor *src) {
  int nd;
  int64_t shape[KG_MAX_DIMS];
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  bool ok = kg_broadcast_shapes(dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape) && nd == dst->ndim;
  for (int i = 0; ok && i < nd; i++) ok = shape[i] == dst->shape[i];
  if (!ok) return kg_error(KG_ERR_SHAPE, "copy_", "source %s cannot be broadcast to destination %s", KG_SHAPE(src, a), KG_SHAPE(dst, b));
  return KG_OK;
}

kg_status kg_copy_(kg_tensor *dst, const kg_tensor *src) {
  KG_TRY(kg_check_inplace("copy_", dst));
  KG_TRY(check_copy(dst, src));
  KG_TRY(kg_check_overlap("copy_", dst, 1, &src, true));
  kg_tensor_bump_version(dst);
  if (kg_device_eq(dst->device, src->device) || dst->device.type == KG_DEV_META || src->device.type == KG_DEV_META)
    return kg_op_dispatch(KG_OP_COPY, 1, &dst, 1, &src, NULL);
  /* across devices: make a contiguous copy in dst's dtype on the source device, move the bytes,
   * then lay them into dst's view */
  kg_tensor *staged, *moved;
  KG_TRY(kg_tensor_empty_op(&staged, src->ndim, src->shape, dst->dtype, src->device, "copy_"));
  kg_status s = kg_op_dispatch(KG_OP_COPY, 1, &staged, 1, &src, NULL);
  if (s == KG_OK) s = kg_tensor_empty_op(&moved, src->ndim, src->shape, dst->dtype, dst->device, "copy_");
  if (s) return kg_tensor_release(staged), s;
  s = kg_cuda_memcpy(kg_data(moved), moved->device, kg_data(staged), staged->device,
                     (size_t)kg_numel(staged) * kg_elem_size(staged));
  if (s == KG_OK) {
    const kg_tensor *m = moved;
    s = kg_op_dispatch(KG_OP_COPY, 1, &dst, 1, &m, NULL);
  }
  kg_tensor_release(staged);
  kg_tensor_release(moved);
  return s;
}

/* a new contiguous tensor holding x, with dtype dt on device dev, recorded as COPY; errors name
 * op, the call the user made (to, contiguous, clone) */
static kg_status copy_to(kg_tensor **out, const kg_tensor *x, kg_dtype dt, kg_device dev, const char *op) {
  kg_tensor *t;
  KG_TRY(kg_tensor_empty_op(&t, x->ndim, x->shape, dt, dev, op));
  bool was = kg_set_grad_enabled(false); /* kg_copy_ bumps versions; no grad check needed */
  kg_status s = kg_copy_(t, x);
  kg_set_grad_enabled(was);
  if (s == KG_OK) s = kg_op_record(KG_OP_COPY, 1, &t, 1, &x, NULL, 0);
  if (s) return kg_tensor_release(t), s;
  *out = t;
  return KG_OK;
}

kg_status kg_to(kg_tensor **out, const kg_tensor *x, kg_dtype dt, kg_device dev) {
  if (x->dtype == dt && kg_device_eq(x->device, dev)) {
    *out = kg_tensor_retain((kg_tensor *)x);
    return KG_OK;
  }
  return copy_to(out, x, dt, dev, "to");
}

kg_status kg_contiguous(kg_tensor **out, const kg_tensor *x) {
  if (kg_is_contiguous(x)) {
    *out = kg_tensor_retain((kg_tensor *)x);
    return KG_OK;
  }
  return copy_to(out, x, x->dtype, x->device, "contiguous");
}

kg_status kg_clone(kg_tensor **out, const kg_tensor *x) { return copy_to(out, x, x->dtype, x->device, "clone"); }

kg_status kg_detach(kg_tensor **out, const kg_tensor *x) {
  return kg_tensor_view_raw(out, x, x->ndim, x->shape, x->stride, x->offset);
}

/* back to the input's device; the engine casts the dtype */
kg_status kg_grad_copy(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return kg_to(&din[0], dout[0], dout[0]->dtype, n->in_meta[0].device);
}
