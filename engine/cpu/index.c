/* index.c (cpu) — cat, pad, gather / index_select / embedding, scatter_add_, index_add_.
 *
 * Shape letters: N ids, V table rows, C channels, K index length. Copies move element bytes
 * (exact in every dtype); the accumulating ops add in double (scatter_add_) or in f32, f64 for
 * f64 (index_add_). Index tensors arrive contiguous (i32 or i64) from engine/ops/index.c and
 * every index is checked before any element moves. The accumulating ops run in parallel only
 * over the dims that are not indexed, so no two threads touch one element and the order of
 * the additions is fixed: results do not depend on the thread count.
 */
#include "cpu.h"

#include <string.h>

static inline int64_t load_index(const void *p, kg_dtype dt, int64_t i) {
  return dt == KG_I32 ? ((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

/* Fails with the shared message when a (contiguous) index is outside [0, t->shape[dim]);
 * name: how the message calls t (NULL for an embedding table). */
static kg_status check_range(const char *op, const kg_tensor *idx, const kg_tensor *t, int dim, const char *name) {
  const void *p = kg_data(idx);
  int64_t n = kg_numel(idx), size = t->shape[dim];
  for (int64_t i = 0; i < n; i++) {
    int64_t v = load_index(p, idx->dtype, i);
    if (v < 0 || v >= size) return kg_index_range_error(op, v, t, dim, name);
  }
  return KG_OK;
}

static inline void move(char *dst, const char *src, int es) {
  switch (es) {
  case 1: *(uint8_t *)dst = *(const uint8_t *)src; break;
  case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
  case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
  default: *(uint64_t *)dst = *(const uint64_t *)src; break;
  }
}

/* n elements from src (element stride ss) to contiguous dst */
static void move_run(char *dst, const char *src, int64_t ss, int64_t n, int es) {
  if (ss == 1) memcpy(dst, src, (size_t)(n * es));
  else
    for (int64_t j = 0; j < n; j++) move(dst + j * es, src + j * ss * es, es);
}

/* ---- cat and pad: strided copies into shallow views of the output ---------------------- */

static kg_status copy_view(const char *op, kg_tensor *dst, const kg_tensor *src) {
  (void)op;
  kg_op_call c = {KG_OP_COPY, 1, 1, &src, &dst, NULL};
  return kg_cpu_copy(&c);
}

kg_status kg_cpu_cat(const kg_op_call *c) { return kg_cat_into_views(c, copy_view); }
kg_status kg_cpu_pad(const kg_op_call *c) { return kg_pad_into_views(c, kg_cpu_fill, copy_view); }

/* ---- gather, index_select, embedding ------------------------------------------------------ */

/* out[c] = x[c with c[dim] := idx at offset sum_j c[j] * istr[j]] for every c of out (contiguous).
 * Rows run along out's last dim; when each row has one index it is copied as a run. */
static void take(const kg_tensor *out, const kg_tensor *x, const kg_tensor *idx, const int64_t *istr, int dim) {
  int nd = out->ndim, last = nd - 1, es = (int)kg_elem_size(out);
  int64_t ncol = out->shape[last], n = kg_numel(out), nrow = n / ncol;
  const char *xb = kg_data(x);
  const void *ib = kg_data(idx);
  char *ob = kg_data(out);
#pragma omp parallel for if (n > KG_PAR_THRESHOLD && nrow > 1) schedule(static)
  for (int64_t r = 0; r < nrow; r++) {
    int64_t rem = r, xo = 0, io = 0;
    for (int j = last - 1; j >= 0; j--) {
      int64_t cj = rem % out->shape[j];
      rem /= out->shape[j];
      if (j != dim) xo += cj * x->stride[j];
      io += cj * istr[j];
    }
    char *orow = ob + r * ncol * es;
    if (dim != last && istr[last] == 0) {
      int64_t i = load_index(ib, idx->dtype, io);
      move_run(orow, xb + (xo + i * x->stride[dim]) * es, x->stride[last], ncol, es);
    } else {
      for (int64_t j = 0; j < ncol; j++) {
        int64_t i = load_index(ib, idx->dtype, io + j * istr[last]);
        int64_t off = xo + i * x->stride[dim] + (dim == last ? 0 : j * x->stride[last]);
        move(orow + j * es, xb + off * es, es);
      }
    }
  }
}

/* in: x, idx (same ndim, contiguous) */
kg_status kg_cpu_gather(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *x = c->in[0], *idx = c->in[1];
  KG_TRY(check_range("gather", idx, x, d, "x"));
  int64_t istr[KG_MAX_DIMS];
  kg_contiguous_strides(idx->ndim, idx->shape, istr);
  take(c->out[0], x, idx, istr, d);
  return KG_OK;
}

/* in: x, idx [K] */
kg_status kg_cpu_index_select(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *x = c->in[0], *idx = c->in[1];
  KG_TRY(check_range("index_select", idx, x, d, "x"));
  int64_t istr[KG_MAX_DIMS] = {0};
  istr[d] = 1;
  take(c->out[0], x, idx, istr, d);
  return KG_OK;
}

/* in: ids [...] (contiguous), table [V, C]; out [..., C] taken as [N, C] */
kg_status kg_cpu_embedding(const kg_op_call *c) {
  const kg_tensor *ids = c->in[0], *table = c->in[1];
  KG_TRY(check_range("embedding", ids, table, 0, NULL));
  kg_tensor o = *c->out[0];
  o.ndim = 2;
  o.shape[0] = kg_numel(ids);
  o.shape[1] = table->shape[1];
  kg_contiguous_strides(2, o.shape, o.stride);
  int64_t istr[2] = {1, 0};
  take(&o, table, ids, istr, 0);
  return KG_OK;
}

/* ---- scatter_add_ and index_add_ (in place) ------------------------------------------------- */

/* in: dst, idx (contiguous, ndim of dst), src. Parallel over the lines of idx along dim. */
kg_status kg_cpu_scatter_add(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *dst = c->in[0], *idx = c->in[1], *src = c->in[2];
  KG_TRY(check_range("scatter_add_", idx, dst, d, "dst"));
  int64_t n = kg_numel(idx), len = idx->shape[d], lines = len ? n / len : 0, istr[KG_MAX_DIMS];
  kg_contiguous_strides(idx->ndim, idx->shape, istr);
  char *db = kg_data(dst);
  const char *sb = kg_data(src);
  const void *ib = kg_data(idx);
#pragma omp parallel for if (n > KG_PAR_THRESHOLD && lines > 1) schedule(static)
  for (int64_t l = 0; l < lines; l++) {
    int64_t rem = l, doff = 0, soff = 0, ioff = 0;
    for (int j = idx->ndim - 1; j >= 0; j--) {
      if (j == d) continue;
      int64_t cj = rem % idx->shape[j];
      rem /= idx->shape[j];
      doff += cj * dst->stride[j];
      soff += cj * src->stride[j];
      ioff += cj * istr[j];
    }
    for (int64_t k = 0; k < len; k++) {
      int64_t at = doff + load_index(ib, idx->dtype, ioff + k * istr[d]) * dst->stride[d];
      double v = kg_load_as_double(db, dst->dtype, at) + kg_load_as_double(sb, src->dtype, soff + k * src->stride[d]);
      kg_store_from_double(db, dst->dtype, at, v);
    }
  }
  return KG_OK;
}

#define ADD_BLOCK 64

/* dst's elements at one position of the non-indexed dims: runs of up to ADD_BLOCK along the
 * last dim (when it is not the indexed one), each adding src's K slices in order */
#define INDEX_ADD_RUN(T, LOAD, STORE)                                                                \
  {                                                                                                  \
    T a[ADD_BLOCK], b[ADD_BLOCK];                                                                    \
    for (int64_t k = 0; k < K; k++) {                                                                \
      char *dp = db + (doff + load_index(ib, idx->dtype, k) * dst->stride[d]) * des;                 \
      const char *sp = sb + (soff + k * src->stride[d]) * ses;                                       \
      LOAD(a, dp, dst->dtype, drun, m);                                                              \
      LOAD(b, sp, src->dtype, srun, m);                                                              \
      for (int64_t j = 0; j < m; j++) a[j] += b[j];                                                  \
      STORE(dp, dst->dtype, drun, a, m);                                                             \
    }                                                                                                \
  }

/* in: dst, idx [K] (contiguous), src (dst's shape with K at dim) */
kg_status kg_cpu_index_add(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *dst = c->in[0], *idx = c->in[1], *src = c->in[2];
  KG_TRY(check_range("index_add_", idx, dst, d, "dst"));
  int nd = dst->ndim, last = nd - 1;
  int64_t K = kg_numel(idx);
  /* the run dim is the last one unless that is indexed (then runs have length 1) */
  bool has_run = d != last;
  int64_t ncol = has_run ? dst->shape[last] : 1, nblk = (ncol + ADD_BLOCK - 1) / ADD_BLOCK;
  int64_t drun = has_run ? dst->stride[last] : 0, srun = has_run ? src->stride[last] : 0;
  int64_t nouter = 1;
  for (int j = 0; j < nd; j++)
    if (j != d && !(has_run && j == last)) nouter *= dst->shape[j];
  int64_t ntask = nouter * nblk;
  bool wide = kg_cpu_wide(dst->dtype) || kg_cpu_wide(src->dtype);
  int des = (int)kg_elem_size(dst), ses = (int)kg_elem_size(src);
  char *db = kg_data(dst);
  const char *sb = kg_data(src);
  const void *ib = kg_data(idx);
#pragma omp parallel for if (ntask > 1 && K * nouter * ncol > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t t = 0; t < ntask; t++) {
    int64_t o = t / nblk, j0 = (t % nblk) * ADD_BLOCK, m = ncol - j0 < ADD_BLOCK ? ncol - j0 : ADD_BLOCK;
    int64_t doff = j0 * drun, soff = j0 * srun;
    for (int j = nd - 1; j >= 0; j--) {
      if (j == d || (has_run && j == last)) continue;
      int64_t cj = o % dst->shape[j];
      o /= dst->shape[j];
      doff += cj * dst->stride[j];
      soff += cj * src->stride[j];
    }
    if (wide) INDEX_ADD_RUN(double, kg_cpu_load_f64, kg_cpu_store_f64)
    else INDEX_ADD_RUN(float, kg_cpu_load_f32, kg_cpu_store_f32)
  }
  return KG_OK;
}
