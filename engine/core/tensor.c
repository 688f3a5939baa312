/* tensor.c — tensor headers: creation, views, refcounts, shape helpers. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t kg_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  uint64_t n = 1; /* unsigned: a shape that check_shape would refuse must not be undefined here */
  for (int i = ndim - 1; i >= 0; i--) {
    if (stride) stride[i] = (int64_t)n;
    n *= (uint64_t)shape[i];
  }
  return (int64_t)n;
}

kg_status kg_check_shape(const char *op, int ndim, const int64_t *shape) {
  char b[KG_SHAPE_STR_MAX];
  if (ndim < 0 || ndim > KG_MAX_DIMS)
    return kg_error(KG_ERR_VALUE, op, "%d dims; at most %d are supported", ndim, KG_MAX_DIMS);
  /* the product of the non-zero sizes bounds every contiguous stride (a zero size makes the
   * tensor empty, not its strides small: [0, 2^32, 2^32] is refused too) */
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return kg_error(KG_ERR_VALUE, op, "negative size in shape %s", kg_shape_str(b, ndim, shape));
    if (shape[i] && n > KG_SIZE_MAX / shape[i])
      return kg_error(KG_ERR_VALUE, op, "shape %s is too large (more than 2^59 elements)", kg_shape_str(b, ndim, shape));
    if (shape[i]) n *= shape[i];
  }
  return KG_OK;
}

static kg_tensor *header(int ndim, const int64_t *shape, kg_dtype dt, kg_device dev) {
  kg_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->refcount = 1;
  t->ndim = ndim;
  if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  kg_contiguous_strides(ndim, t->shape, t->stride);
  t->dtype = dt;
  t->device = dev;
  return t;
}

kg_status kg_tensor_empty_op(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev,
                             const char *op) {
  KG_TRY(kg_check_shape(op, ndim, shape));
  if ((unsigned)dt >= KG_DTYPE_COUNT) return kg_error(KG_ERR_TYPE, op, "bad dtype %d", (int)dt);
  if (dev.type == KG_DEV_CUDA && !kg_cuda_available())
    return kg_error(KG_ERR_DEVICE, op, "cuda:%d requested but no CUDA device is available", dev.index);
  kg_tensor *t = header(ndim, shape, dt, dev);
  if (!t) return kg_error(KG_ERR_OOM, op, "out of memory allocating a tensor header");
  size_t nbytes = (size_t)kg_numel(t) * (size_t)kg_dtype_info[dt].size;
  kg_status s = kg_storage_new(&t->storage, nbytes, dev);
  if (s) {
    free(t);
    return s;
  }
  *out = t;
  return KG_OK;
}

kg_status kg_tensor_empty(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev) {
  return kg_tensor_empty_op(out, ndim, shape, dt, dev, "empty");
}

kg_status kg_tensor_from_blob(kg_tensor **out, void *data, int ndim, const int64_t *shape, kg_dtype dt,
                              kg_device dev, void *owner, void (*release)(kg_storage *)) {
  KG_TRY(kg_check_shape("from_blob", ndim, shape));
  kg_tensor *t = header(ndim, shape, dt, dev);
  kg_storage *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    return kg_error(KG_ERR_OOM, "from_blob", "out of memory allocating a tensor header");
  }
  s->refcount = 1;
  s->data = data;
  s->nbytes = (size_t)kg_numel(t) * (size_t)kg_dtype_info[dt].size;
  s->device = dev;
  s->owner = owner;
  s->release = release;
  t->storage = s;
  *out = t;
  return KG_OK;
}

kg_status kg_tensor_view_raw(kg_tensor **out, const kg_tensor *src, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset) {
  /* every view's shape passes the constructors' check: a wrapped element count must never
   * reach a kernel (the ops check first, so this names the op only when one forgot) */
  KG_TRY(kg_check_shape("view", ndim, shape));
  kg_tensor *t = header(ndim, shape, src->dtype, src->device);
  if (!t) return kg_error(KG_ERR_OOM, "view", "out of memory allocating a tensor header");
  if (ndim) memcpy(t->stride, stride, sizeof(int64_t) * (size_t)ndim);
  t->offset = offset;
  t->storage = kg_storage_retain(src->storage);
  *out = t;
  return KG_OK;
}

kg_tensor *kg_tensor_retain(kg_tensor *t) {
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

void kg_tensor_release(kg_tensor *t) {
  if (!t || __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  kg_tensor_release(t->grad);
  if (t->grad_fn) kg_node_release(t->grad_fn);
  kg_storage_release(t->storage);
  free(t);
}

void kg_release_all(int n, kg_tensor **ts) {
  for (int i = 0; i < n; i++) kg_tensor_release(ts[i]);
}

int64_t kg_numel(const kg_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

bool kg_is_contiguous(const kg_tensor *t) {
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

bool kg_same_shape(const kg_tensor *a, const kg_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

bool kg_wrap_dim(int *dim, int ndim) {
  int d = *dim < 0 ? *dim + ndim : *dim;
  if (d < 0 || d >= (ndim ? ndim : 1)) return false;
  *dim = d;
  return true;
}

bool kg_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t da = i < n - na ? 1 : a[i - (n - na)];
    int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  *nout = n;
  return true;
}

kg_status kg_check_same_device(const char *op, int n, const kg_tensor *const *ts) {
  for (int i = 1; i < n; i++) {
    if (ts[i] && !kg_device_eq(ts[i]->device, ts[0]->device)) {
      char a[16], b[16];
      return kg_error(KG_ERR_DEVICE, op, "expected all tensors on one device, got %s and %s",
                      kg_device_name(ts[0]->device, a), kg_device_name(ts[i]->device, b));
    }
  }
  return KG_OK;
}

kg_status kg_check_float(const char *op, const kg_tensor *x, const char *what) {
  if (kg_dtype_info[x->dtype].is_float) return KG_OK;
  return kg_error(KG_ERR_TYPE, op, "%s must be floating point, got %s", what, kg_dtype_info[x->dtype].name);
}

kg_status kg_check_integer(const char *op, const kg_tensor *x, const char *what) {
  if (x->dtype == KG_I32 || x->dtype == KG_I64 || x->dtype == KG_U8) return KG_OK;
  return kg_error(KG_ERR_TYPE, op, "%s must be an integer tensor (i32 or i64), got %s", what,
                  kg_dtype_info[x->dtype].name);
}

/* ---- memory overlap of in-place writes ---------------------------------------------------- */

/* An in-place kernel writes element i of dst while it reads element i of each input. That is
 * right only if no two elements of dst share memory (else the last write wins: an expanded
 * view) and an input shares memory with dst only element for element (x:add_(x)); otherwise
 * the result depends on the order of the writes (b:t():add_(b)). As PyTorch, such calls are
 * refused. Fast answers first (distinct storage, disjoint ranges, the same layout, strides that
 * nest); layouts that remain are settled exactly with a bitmap of dst's offsets when they are
 * small enough (OVERLAP_EXACT_MAX elements), and otherwise as PyTorch does: a destination that
 * aliases itself through a 0 stride, or two dense blocks that intersect, are refused; the rest
 * passes ("too hard" to tell). */

#define OVERLAP_EXACT_MAX ((int64_t)1 << 24)

/* the smallest and largest element offsets t touches (t not empty) */
static void offset_range(const kg_tensor *t, int64_t *lo, int64_t *hi) {
  *lo = *hi = t->offset;
  for (int d = 0; d < t->ndim; d++) {
    int64_t span = (t->shape[d] - 1) * t->stride[d];
    if (span < 0) *lo += span;
    else *hi += span;
  }
}

/* true when the strides nest (sorted by size, each one steps past everything the smaller ones
 * reach), which proves that no two elements share memory */
static bool strides_nest(const kg_tensor *t) {
  int64_t st[KG_MAX_DIMS], sz[KG_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1) continue;
    int64_t s = t->stride[d] < 0 ? -t->stride[d] : t->stride[d];
    int j = n++;
    for (; j > 0 && st[j - 1] > s; j--) st[j] = st[j - 1], sz[j] = sz[j - 1];
    st[j] = s, sz[j] = t->shape[d];
  }
  int64_t reach = 0;
  for (int i = 0; i < n; i++) {
    if (st[i] <= reach) return false;
    reach += (sz[i] - 1) * st[i];
  }
  return true;
}

/* nesting strides without gaps: t covers a block of memory, each element once */
static bool dense(const kg_tensor *t) {
  int64_t lo, hi;
  offset_range(t, &lo, &hi);
  return strides_nest(t) && hi - lo + 1 == kg_numel(t);
}

/* Walks dst's elements in row-major order with the offsets of dst and (if src) of src
 * broadcast to dst's shape; fn returns false to stop. */
typedef bool (*overlap_fn)(void *ctx, int64_t od, int64_t os);
static void walk(const kg_tensor *dst, const kg_tensor *src, overlap_fn fn, void *ctx) {
  int64_t sstr[KG_MAX_DIMS] = {0}, idx[KG_MAX_DIMS] = {0};
  int lead = src ? dst->ndim - src->ndim : 0;
  for (int d = 0; src && d < src->ndim; d++) sstr[d + lead] = src->shape[d] == 1 ? 0 : src->stride[d];
  int64_t n = kg_numel(dst), od = dst->offset, os = src ? src->offset : 0;
  for (int64_t i = 0; i < n; i++) {
    if (!fn(ctx, od, os)) return;
    for (int d = dst->ndim - 1; d >= 0; d--) {
      od += dst->stride[d], os += sstr[d];
      if (++idx[d] < dst->shape[d]) break;
      od -= dst->stride[d] * dst->shape[d], os -= sstr[d] * dst->shape[d];
      idx[d] = 0;
    }
  }
}

typedef struct {
  uint8_t *bits;
  int64_t lo, hi;
  bool hit;
  bool same_ok;
} overlap_ctx;

static bool mark(void *ctx, int64_t od, int64_t os) {
  (void)os;
  overlap_ctx *c = ctx;
  int64_t k = od - c->lo;
  if (c->bits[k >> 3] & (1u << (k & 7))) return !(c->hit = true);
  c->bits[k >> 3] |= (uint8_t)(1u << (k & 7));
  return true;
}

static bool probe(void *ctx, int64_t od, int64_t os) {
  overlap_ctx *c = ctx;
  if (os < c->lo || os > c->hi || (c->same_ok && os == od)) return true;
  int64_t k = os - c->lo;
  if (c->bits[k >> 3] & (1u << (k & 7))) return !(c->hit = true);
  return true;
}

static bool probe_any(void *ctx, int64_t ox, int64_t unused) {
  (void)unused;
  overlap_ctx *c = ctx;
  if (ox < c->lo || ox > c->hi) return true;
  int64_t k = ox - c->lo;
  if (c->bits[k >> 3] & (1u << (k & 7))) return !(c->hit = true);
  return true;
}

/* 1: dst has two elements at one address; 0: it has not, or that could not be settled */
static int internal_overlap(const kg_tensor *dst, overlap_ctx *c) {
  for (int d = 0; d < dst->ndim; d++)
    if (dst->shape[d] > 1 && dst->stride[d] == 0) return 1;
  if (strides_nest(dst) || kg_numel(dst) > OVERLAP_EXACT_MAX) return 0;
  offset_range(dst, &c->lo, &c->hi);
  if (c->hi - c->lo >= 8 * OVERLAP_EXACT_MAX) return 0;
  c->bits = calloc((size_t)((c->hi - c->lo) / 8 + 1), 1);
  if (!c->bits) return 0;
  c->hit = false;
  walk(dst, NULL, mark, c);
  free(c->bits);
  c->bits = NULL;
  return c->hit;
}

/* true when src, broadcast to dst's shape, reads exactly the addresses dst writes, in order */
static bool same_layout(const kg_tensor *dst, const kg_tensor *src) {
  if (src->offset != dst->offset || src->dtype != dst->dtype) return false;
  int lead = dst->ndim - src->ndim;
  for (int d = 0; d < dst->ndim; d++) {
    if (dst->shape[d] == 1) continue;
    int64_t s = d < lead || src->shape[d - lead] == 1 ? 0 : src->stride[d - lead];
    if (s != dst->stride[d]) return false;
  }
  return true;
}

kg_status kg_check_overlap(const char *op, const kg_tensor *dst, int nin, const kg_tensor *const *in, bool same_ok) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  if (!dst->storage || kg_numel(dst) == 0) return KG_OK;
  overlap_ctx c = {.same_ok = same_ok};
  if (internal_overlap(dst, &c))
    return kg_error(KG_ERR_VALUE, op,
                    "the destination %s has elements that share memory (an expanded or overlapping view), so an "
                    "in-place write is ambiguous; write into a copy (clone() or contiguous()) instead",
                    KG_SHAPE(dst, a));
  for (int i = 0; i < nin; i++) {
    const kg_tensor *x = in[i];
    if (!x || (same_ok && x == dst) || x->storage != dst->storage || kg_numel(x) == 0) continue;
    if (same_ok && same_layout(dst, x)) continue;
    int64_t dlo, dhi, xlo, xhi;
    offset_range(dst, &dlo, &dhi);
    offset_range(x, &xlo, &xhi);
    size_t de = kg_elem_size(dst), xe = kg_elem_size(x); /* compare bytes: dtypes may differ */
    if ((xhi + 1) * (int64_t)xe <= dlo * (int64_t)de || (dhi + 1) * (int64_t)de <= xlo * (int64_t)xe) continue;
    /* intersecting ranges: settled exactly where affordable, else as PyTorch (two dense blocks
     * that intersect and differ overlap partly; other layouts are too hard to tell and pass) */
    bool shared = dense(dst) && dense(x);
    if (x->dtype == dst->dtype && kg_numel(dst) <= OVERLAP_EXACT_MAX && dhi - dlo < 8 * OVERLAP_EXACT_MAX) {
      c.lo = dlo, c.hi = dhi, c.hit = false;
      c.bits = calloc((size_t)((dhi - dlo) / 8 + 1), 1);
      if (c.bits) {
        walk(dst, NULL, mark, &c);
        c.hit = false;
        if (same_ok) walk(dst, x, probe, &c); /* x broadcast to dst: element i against element i */
        else walk(x, NULL, probe_any, &c);    /* index ops: any address of x that dst writes */
        free(c.bits);
        c.bits = NULL;
        shared = c.hit;
      }
    }
    if (shared)
      return kg_error(KG_ERR_VALUE, op,
                      "input %d %s shares memory with the destination %s other than element for element, so the "
                      "result would depend on the order of the writes; clone() the input first",
                      i + 1, KG_SHAPE(x, a), KG_SHAPE(dst, b));
  }
  return KG_OK;
}

/* ---- slow element access (printing, tolist, tests) ----------------------------------------- */

#include <keng/scalar.h>

static int64_t flat_to_offset(const kg_tensor *t, int64_t i) {
  int64_t off = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t n = t->shape[d];
    off += (i % n) * t->stride[d];
    i /= n;
  }
  return off;
}

double kg_load_as_double(const void *base, kg_dtype dt, int64_t off) {
  switch (dt) {
  case KG_F32: return ((const float *)base)[off];
  case KG_F64: return ((const double *)base)[off];
  case KG_BF16: return kg_bf16_to_f32(((const uint16_t *)base)[off]);
  case KG_F16: return kg_f16_to_f32(((const uint16_t *)base)[off]);
  case KG_I32: return ((const int32_t *)base)[off];
  case KG_I64: return (double)((const int64_t *)base)[off];
  case KG_BOOL: case KG_U8: return ((const uint8_t *)base)[off];
  case KG_I8: return ((const int8_t *)base)[off];
  default: return 0;
  }
}

void kg_store_from_double(void *base, kg_dtype dt, int64_t off, double v) {
  switch (dt) {
  case KG_F32: ((float *)base)[off] = (float)v; break;
  case KG_F64: ((double *)base)[off] = v; break;
  case KG_BF16: ((uint16_t *)base)[off] = kg_f32_to_bf16((float)v); break;
  case KG_F16: ((uint16_t *)base)[off] = kg_f32_to_f16((float)v); break;
  case KG_I32: ((int32_t *)base)[off] = kg_sat_i32(v); break;
  case KG_I64: ((int64_t *)base)[off] = kg_sat_i64(v); break;
  case KG_BOOL: ((uint8_t *)base)[off] = v != 0; break;
  case KG_U8: ((uint8_t *)base)[off] = kg_sat_u8(v); break;
  case KG_I8: ((int8_t *)base)[off] = kg_sat_i8(v); break;
  default: break;
  }
}

double kg_get_flat(const kg_tensor *t, int64_t i) {
  if (!t->storage->data || t->device.type != KG_DEV_CPU) return 0;
  return kg_load_as_double(t->storage->data, t->dtype, flat_to_offset(t, i));
}

void kg_set_flat(kg_tensor *t, int64_t i, double v) {
  if (!t->storage->data || t->device.type != KG_DEV_CPU) return;
  kg_store_from_double(t->storage->data, t->dtype, flat_to_offset(t, i), v);
}
