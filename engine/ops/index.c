/* index.c — indexing and layout ops: cat, stack, pad, gather, index_select, embedding,
 * scatter_add_, index_add_, repeat_interleave; their backward passes.
 *
 * Shape letters: N ids (flattened), V table rows, C channels. Index tensors are i32 or i64,
 * 0-based, and made contiguous here; the kernels (engine/cpu/index.c) check every index
 * against its bound and fail with the op's name instead of reading out of range.
 */
#include "../core/internal.h"

#include <stdlib.h>
#include <string.h>

static kg_status run1(kg_op op, kg_tensor **out, int nin, const kg_tensor *const *in, const void *p, size_t size) {
  kg_status s = kg_op_run(op, 1, out, nin, in, p, size);
  if (s) {
    kg_tensor_release(*out);
    *out = NULL;
  }
  return s;
}

static kg_status check_index_dtype(const char *op, const kg_tensor *idx) {
  if (idx->dtype == KG_I32 || idx->dtype == KG_I64) return KG_OK;
  return kg_error(KG_ERR_TYPE, op, "index must be an i32 or i64 tensor, got %s", kg_dtype_info[idx->dtype].name);
}

static kg_status bad_dim(const char *op, int dim, const kg_tensor *x) {
  char a[KG_SHAPE_STR_MAX];
  return kg_error(KG_ERR_VALUE, op, "dim %lld out of range for %s", kg_pos1(dim), KG_SHAPE(x, a));
}

/* ---- cat and stack ---------------------------------------------------------------------- */

kg_status kg_cat(kg_tensor **out, int n, const kg_tensor *const *xs, int dim) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (n < 1) return kg_error(KG_ERR_VALUE, "cat", "needs at least one tensor");
  const kg_tensor *x0 = xs[0];
  int d = dim;
  if (x0->ndim == 0 || !kg_wrap_dim(&d, x0->ndim)) return bad_dim("cat", dim, x0);
  KG_TRY(kg_check_same_device("cat", n, xs));
  int64_t shape[KG_MAX_DIMS];
  memcpy(shape, x0->shape, sizeof shape);
  shape[d] = 0;
  kg_dtype dt = x0->dtype;
  for (int i = 0; i < n; i++) {
    const kg_tensor *x = xs[i];
    bool fits = x->ndim == x0->ndim;
    for (int j = 0; fits && j < x->ndim; j++) fits = j == d || x->shape[j] == x0->shape[j];
    if (!fits)
      return kg_error(KG_ERR_SHAPE, "cat", "tensor %d %s does not match tensor 1 %s outside dim %d", i + 1,
                      KG_SHAPE(x, a), KG_SHAPE(x0, b), d + 1);
    if (!kg_size_add(shape[d], x->shape[d], &shape[d]))
      return kg_error(KG_ERR_VALUE, "cat", "the sizes along dim %d add up to more than 2^59 (tensor %d %s)", d + 1,
                      i + 1, KG_SHAPE(x, a));
    dt = kg_dtype_promote(dt, x->dtype);
  }
  KG_TRY(kg_new_like(out, x0, x0->ndim, shape, dt));
  kg_cat_params p = {d};
  return run1(KG_OP_CAT, out, n, xs, &p, sizeof p);
}

/* d cat = the slices of the gradient each input filled */
kg_status kg_grad_cat(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  int d = ((const kg_cat_params *)n->params)->dim;
  int64_t start = 0;
  for (int i = 0; i < n->nin; i++) {
    int64_t len = n->in_meta[i].shape[d];
    if (kg_node_needs_grad(n, i)) KG_TRY(kg_narrow(&din[i], dout[0], d, start, len));
    start += len;
  }
  return KG_OK;
}

kg_status kg_stack(kg_tensor **out, int n, const kg_tensor *const *xs, int dim) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (n < 1) return kg_error(KG_ERR_VALUE, "stack", "needs at least one tensor");
  int nd = xs[0]->ndim, d = dim < 0 ? dim + nd + 1 : dim;
  if (d < 0 || d > nd || nd >= KG_MAX_DIMS) return bad_dim("stack", dim, xs[0]);
  for (int i = 1; i < n; i++)
    if (!kg_same_shape(xs[i], xs[0]))
      return kg_error(KG_ERR_SHAPE, "stack", "tensor %d %s differs in shape from tensor 1 %s", i + 1,
                      KG_SHAPE(xs[i], a), KG_SHAPE(xs[0], b));
  kg_tensor **u = calloc((size_t)n, sizeof *u);
  if (!u) return kg_error(KG_ERR_OOM, "stack", "out of memory for %d views", n);
  kg_status s = KG_OK;
  for (int i = 0; i < n && !s; i++) s = kg_unsqueeze(&u[i], xs[i], d);
  if (!s) s = kg_cat(out, n, (const kg_tensor *const *)u, d);
  kg_release_all(n, u);
  free(u);
  return s;
}

/* ---- pad -------------------------------------------------------------------------------- */

kg_status kg_pad(kg_tensor **out, const kg_tensor *x, int npad, const int64_t *pad, double value) {
  char a[KG_SHAPE_STR_MAX];
  if (npad < 0 || npad % 2 || npad / 2 > x->ndim)
    return kg_error(KG_ERR_VALUE, "pad", "%d pad values for %s: need an even count, at most 2 per dim", npad,
                    KG_SHAPE(x, a));
  kg_pad_params p = {npad, {0}, value};
  int64_t shape[KG_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  for (int i = 0; i < npad; i++) p.pad[i] = pad[i];
  for (int i = 0; i < npad / 2; i++) {
    int d = x->ndim - 1 - i;
    int64_t both;
    if (__builtin_add_overflow(pad[2 * i], pad[2 * i + 1], &both) || __builtin_add_overflow(shape[d], both, &shape[d]) ||
        shape[d] > KG_SIZE_MAX)
      return kg_error(KG_ERR_VALUE, "pad", "pads %lld, %lld of dim %d of %s make it larger than 2^59",
                      (long long)pad[2 * i], (long long)pad[2 * i + 1], d + 1, KG_SHAPE(x, a));
    if (shape[d] < 0 || pad[2 * i] < -x->shape[d] || pad[2 * i + 1] < -x->shape[d])
      return kg_error(KG_ERR_SHAPE, "pad", "pads %lld, %lld crop dim %d of %s (size %lld) below zero",
                      (long long)pad[2 * i], (long long)pad[2 * i + 1], d + 1, KG_SHAPE(x, a),
                      (long long)x->shape[d]);
  }
  KG_TRY(kg_new_like(out, x, x->ndim, shape, x->dtype));
  return run1(KG_OP_PAD, out, 1, &x, &p, sizeof p);
}

/* d pad = the gradient cropped back: narrow views when every pad is >= 0, otherwise pad by the
 * negated amounts (cropped borders get zeros) */
kg_status kg_grad_pad(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_pad_params *p = n->params;
  bool crop = false;
  int64_t neg[2 * KG_MAX_DIMS];
  for (int i = 0; i < p->npad; i++) {
    neg[i] = -p->pad[i];
    if (p->pad[i] < 0) crop = true;
  }
  if (crop) return kg_pad(&din[0], dout[0], p->npad, neg, 0);
  kg_tensor *g = kg_tensor_retain(dout[0]), *v;
  int nd = n->in_meta[0].ndim;
  for (int i = 0; i < p->npad / 2; i++) {
    int d = nd - 1 - i;
    kg_status s = kg_narrow(&v, g, d, p->pad[2 * i], n->in_meta[0].shape[d]);
    kg_tensor_release(g);
    KG_TRY(s);
    g = v;
  }
  din[0] = g;
  return KG_OK;
}

/* ---- gather, index_select, embedding ------------------------------------------------------- */

/* backward passes accumulate 16-bit gradients in f32 (the engine casts din to the input's dtype) */
static kg_dtype acc_dtype(kg_dtype dt) { return dt == KG_BF16 || dt == KG_F16 ? KG_F32 : dt; }

kg_status kg_gather(kg_tensor **out, const kg_tensor *x, int dim, const kg_tensor *idx) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  int d = dim;
  if (x->ndim == 0 || !kg_wrap_dim(&d, x->ndim)) return bad_dim("gather", dim, x);
  KG_TRY(check_index_dtype("gather", idx));
  const kg_tensor *ts[2] = {x, idx};
  KG_TRY(kg_check_same_device("gather", 2, ts));
  bool fits = idx->ndim == x->ndim;
  for (int j = 0; fits && j < x->ndim; j++) fits = j == d || idx->shape[j] <= x->shape[j];
  if (!fits)
    return kg_error(KG_ERR_SHAPE, "gather", "index %s must have the dims of x %s, no larger outside dim %d",
                    KG_SHAPE(idx, a), KG_SHAPE(x, b), d + 1);
  kg_tensor *ic;
  KG_TRY(kg_contiguous(&ic, idx));
  kg_status s = kg_new_like(out, x, idx->ndim, idx->shape, x->dtype);
  if (!s) {
    kg_index_params p = {d};
    const kg_tensor *in[2] = {x, ic};
    s = run1(KG_OP_GATHER, out, 2, in, &p, sizeof p);
  }
  kg_tensor_release(ic);
  return s;
}

/* d gather = zeros of x's shape with the gradient scatter-added where it was read */
kg_status kg_grad_gather(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor_meta *m = &n->in_meta[0];
  kg_tensor *z;
  KG_TRY(kg_full(&z, m->ndim, m->shape, 0, acc_dtype(dout[0]->dtype), dout[0]->device));
  kg_status s = kg_scatter_add_(z, ((const kg_index_params *)n->params)->dim, n->saved_in[1], dout[0]);
  if (s) return kg_tensor_release(z), s;
  din[0] = z;
  return KG_OK;
}

kg_status kg_index_select(kg_tensor **out, const kg_tensor *x, int dim, const kg_tensor *idx) {
  char a[KG_SHAPE_STR_MAX];
  int d = dim;
  if (x->ndim == 0 || !kg_wrap_dim(&d, x->ndim)) return bad_dim("index_select", dim, x);
  KG_TRY(check_index_dtype("index_select", idx));
  const kg_tensor *ts[2] = {x, idx};
  KG_TRY(kg_check_same_device("index_select", 2, ts));
  if (idx->ndim > 1) return kg_error(KG_ERR_SHAPE, "index_select", "index %s must be 1-D", KG_SHAPE(idx, a));
  kg_tensor *ic;
  KG_TRY(kg_contiguous(&ic, idx));
  int64_t shape[KG_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[d] = kg_numel(idx);
  kg_status s = kg_new_like(out, x, x->ndim, shape, x->dtype);
  if (!s) {
    kg_index_params p = {d};
    const kg_tensor *in[2] = {x, ic};
    s = run1(KG_OP_INDEX_SELECT, out, 2, in, &p, sizeof p);
  }
  kg_tensor_release(ic);
  return s;
}

kg_status kg_grad_index_select(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor_meta *m = &n->in_meta[0];
  kg_tensor *z;
  KG_TRY(kg_full(&z, m->ndim, m->shape, 0, acc_dtype(dout[0]->dtype), dout[0]->device));
  kg_status s = kg_index_add_(z, ((const kg_index_params *)n->params)->dim, n->saved_in[1], dout[0]);
  if (s) return kg_tensor_release(z), s;
  din[0] = z;
  return KG_OK;
}

/* ids: [...], table: [V, C] -> out: [..., C] */
kg_status kg_embedding(kg_tensor **out, const kg_tensor *ids, const kg_tensor *table) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  KG_TRY(check_index_dtype("embedding", ids));
  const kg_tensor *ts[2] = {table, ids};
  KG_TRY(kg_check_same_device("embedding", 2, ts));
  if (table->ndim != 2 || ids->ndim >= KG_MAX_DIMS)
    return kg_error(KG_ERR_SHAPE, "embedding", "table %s must be [V, C] (ids %s)", KG_SHAPE(table, a),
                    KG_SHAPE(ids, b));
  kg_tensor *ic;
  KG_TRY(kg_contiguous(&ic, ids));
  int64_t shape[KG_MAX_DIMS];
  memcpy(shape, ids->shape, sizeof shape);
  shape[ids->ndim] = table->shape[1];
  kg_status s = kg_new_like(out, table, ids->ndim + 1, shape, table->dtype);
  if (!s) {
    const kg_tensor *in[2] = {ic, table};
    s = run1(KG_OP_EMBEDDING, out, 2, in, NULL, 0);
  }
  kg_tensor_release(ic);
  return s;
}

/* d table = zeros [V, C] with each gradient row added to the row its id named; ids get none */
kg_status kg_grad_embedding(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (!kg_node_needs_grad(n, 1)) return KG_OK;
  const kg_tensor_meta *m = &n->in_meta[1];
  int64_t nids = kg_numel(n->saved_in[0]), rows[2] = {nids, m->shape[1]};
  kg_tensor *z, *ids, *g;
  KG_TRY(kg_full(&z, 2, m->shape, 0, acc_dtype(dout[0]->dtype), dout[0]->device));
  kg_status s = kg_reshape(&ids, n->saved_in[0], 1, &nids);
  if (s) return kg_tensor_release(z), s;
  s = kg_reshape(&g, dout[0], 2, rows);
  if (!s) {
    s = kg_index_add_(z, 0, ids, g);
    kg_tensor_release(g);
  }
  kg_tensor_release(ids);
  if (s) return kg_tensor_release(z), s;
  din[1] = z;
  return KG_OK;
}

/* ---- in-place accumulation (used by the backward passes above) ------------------------------ */

static kg_status check_dst(const char *op, const kg_tensor *dst, const kg_tensor *idx, const kg_tensor *src) {
  KG_TRY(kg_check_inplace(op, dst));
  KG_TRY(check_index_dtype(op, idx));
  const kg_tensor *ts[3] = {dst, idx, src};
  KG_TRY(kg_check_same_device(op, 3, ts));
  /* the rows of src land at other positions than they are read from: no sharing at all */
  return kg_check_overlap(op, dst, 2, ts + 1, false);
}

/* dst[.., idx[c], ..] += src[c] along dim for every c in idx's shape */
kg_status kg_scatter_add_(kg_tensor *dst, int dim, const kg_tensor *idx, const kg_tensor *src) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX];
  int d = dim;
  if (dst->ndim == 0 || !kg_wrap_dim(&d, dst->ndim)) return bad_dim("scatter_add_", dim, dst);
  KG_TRY(check_dst("scatter_add_", dst, idx, src));
  bool fits = idx->ndim == dst->ndim && src->ndim == dst->ndim;
  for (int j = 0; fits && j < dst->ndim; j++)
    fits = idx->shape[j] <= src->shape[j] && (j == d || idx->shape[j] <= dst->shape[j]);
  if (!fits)
    return kg_error(KG_ERR_SHAPE, "scatter_add_", "index %s must have the dims of src %s and dst %s, no larger "
                    "(outside dim %d for dst)", KG_SHAPE(idx, a), KG_SHAPE(src, b), KG_SHAPE(dst, c), d + 1);
  kg_tensor *ic;
  KG_TRY(kg_contiguous(&ic, idx));
  kg_index_params p = {d};
  const kg_tensor *in[3] = {dst, ic, src};
  kg_tensor_bump_version(dst);
  kg_status s = kg_op_dispatch(KG_OP_SCATTER_ADD, 1, &dst, 3, in, &p);
  kg_tensor_release(ic);
  return s;
}

/* dst.select(dim, idx[i]) += src.select(dim, i) */
kg_status kg_index_add_(kg_tensor *dst, int dim, const kg_tensor *idx, const kg_tensor *src) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX];
  int d = dim;
  if (dst->ndim == 0 || !kg_wrap_dim(&d, dst->ndim)) return bad_dim("index_add_", dim, dst);
  KG_TRY(check_dst("index_add_", dst, idx, src));
  bool fits = idx->ndim <= 1 && src->ndim == dst->ndim;
  for (int j = 0; fits && j < dst->ndim; j++) fits = src->shape[j] == (j == d ? kg_numel(idx) : dst->shape[j]);
  if (!fits)
    return kg_error(KG_ERR_SHAPE, "index_add_", "src %s must be dst %s with dim %d the length of the 1-D index %s",
                    KG_SHAPE(src, b), KG_SHAPE(dst, c), d + 1, KG_SHAPE(idx, a));
  kg_tensor *ic;
  KG_TRY(kg_contiguous(&ic, idx));
  kg_index_params p = {d};
  const kg_tensor *in[3] = {dst, ic, src};
  kg_tensor_bump_version(dst);
  kg_status s = kg_op_dispatch(KG_OP_INDEX_ADD, 1, &dst, 3, in, &p);
  kg_tensor_release(ic);
  return s;
}

/* ---- repeat_interleave ---------------------------------------------------------------------- */

/* each slice along dim repeated n times in place: unsqueeze after dim, expand, merge */
kg_status kg_repeat_interleave(kg_tensor **out, const kg_tensor *x, int64_t n, int dim) {
  char a[KG_SHAPE_STR_MAX];
  int d = dim;
  if (x->ndim == 0 || x->ndim >= KG_MAX_DIMS || !kg_wrap_dim(&d, x->ndim)) return bad_dim("repeat_interleave", dim, x);
  if (n < 0) return kg_error(KG_ERR_VALUE, "repeat_interleave", "repeats %lld must be >= 0", (long long)n);
  int64_t big[KG_MAX_DIMS], shape[KG_MAX_DIMS];
  for (int j = 0, k = 0; j < x->ndim; j++) {
    big[k++] = x->shape[j];
    if (j == d) big[k++] = n;
    shape[j] = x->shape[j];
    if (j == d && !kg_size_mul(x->shape[j], n, &shape[j]))
      return kg_error(KG_ERR_VALUE, "repeat_interleave", "%lld repeats of dim %d of %s make more than 2^59 elements",
                      (long long)n, d + 1, KG_SHAPE(x, a));
  }
  KG_TRY(kg_check_shape("repeat_interleave", x->ndim + 1, big));
  kg_tensor *u, *e;
  KG_TRY(kg_unsqueeze(&u, x, d + 1));
  kg_status s = kg_expand(&e, u, x->ndim + 1, big);
  kg_tensor_release(u);
  KG_TRY(s);
  s = kg_reshape(out, e, x->ndim, shape);
  kg_tensor_release(e);
  return s;
}
