/* kernel_shared.c — pieces the backends' kernels share (declared in core/internal.h), kept below
 * engine/cpu and engine/cuda so that no kernel calls up into engine/ops: the index-out-of-range
 * message of every index kernel, and cat and pad as copies into shallow views of the output
 * made with the backend's own copy and fill kernels. */
#include "internal.h"

kg_status kg_index_range_error(const char *op, int64_t v, const kg_tensor *t, int dim, const char *name) {
  char b[KG_SHAPE_STR_MAX];
  if (!name)
    return kg_error(KG_ERR_VALUE, op, "index %lld out of range for table of %lld rows", (long long)v,
                    (long long)t->shape[0]);
  return kg_error(KG_ERR_VALUE, op, "index %lld out of range for dim %d of size %lld (%s %s)", (long long)v, dim + 1,
                  (long long)t->shape[dim], name, KG_SHAPE(t, b));
}

/* each input lands in the slice of out along dim that follows the previous one */
kg_status kg_cat_into_views(const kg_op_call *c, kg_copy_view_fn copy) {
  int d = ((const kg_cat_params *)c->params)->dim;
  const kg_tensor *out = c->out[0];
  kg_tensor v = *out; /* header only: shares out's storage, never released */
  int64_t start = 0;
  for (int i = 0; i < c->nin; i++) {
    const kg_tensor *x = c->in[i];
    v.shape[d] = x->shape[d];
    v.offset = out->offset + start * out->stride[d];
    start += x->shape[d];
    if (kg_numel(x)) KG_TRY(copy("cat", &v, x));
  }
  return KG_OK;
}

/* out is filled with the value, then the part of x that survives (negative pads crop) is copied
 * to where it lands */
kg_status kg_pad_into_views(const kg_op_call *c, kg_kernel_fn fill, kg_copy_view_fn copy) {
  const kg_pad_params *p = c->params;
  const kg_tensor *x = c->in[0];
  kg_tensor *out = c->out[0];
  kg_fill_params fp = {p->value};
  kg_op_call fc = {KG_OP_FILL, 0, 1, NULL, c->out, &fp};
  KG_TRY(fill(&fc));
  kg_tensor vo = *out, vx = *x; /* headers only, never released */
  for (int i = 0; i < p->npad / 2; i++) {
    int d = x->ndim - 1 - i;
    int64_t l = p->pad[2 * i], r = p->pad[2 * i + 1];
    int64_t skip = l < 0 ? -l : 0, len = x->shape[d] - skip - (r < 0 ? -r : 0);
    if (len <= 0) return KG_OK;
    vx.shape[d] = vo.shape[d] = len;
    vx.offset += skip * x->stride[d];
    vo.offset += (l > 0 ? l : 0) * out->stride[d];
  }
  return kg_numel(&vx) ? copy("pad", &vo, &vx) : KG_OK;
}
