/* index.cu — cat, pad, gather / index_select / embedding, scatter_add_, index_add_, as
 * engine/cpu/index.c computes them: copies move element bits (exact in every dtype);
 * scatter_add_ adds in double, index_add_ in float (double when an operand is f64 or integer),
 * each addition rounded to dst's dtype as the CPU's load-add-store does.
 *
 * Every index is checked on the device before anything moves: a check kernel records the first
 * offending position in a device flag, which the launcher copies back (a stream sync per call:
 * the price of raising the CPU's error, naming the op and the index, from the op that caused it).
 * While a CUDA Graph is being captured the flag is the device's deferred-error slot instead
 * (util.cuh), reported at the next synchronisation after a replay; the moving kernels skip an
 * out-of-range index (write 0 / add nothing), so a bad index in a replay never touches memory
 * outside the tensors.
 *
 * Accumulation: by default one thread owns one destination line and adds its sources in the
 * CPU's order — deterministic and bit-identical to the CPU. When there are too few lines to fill
 * the GPU (and many additions per line), a thread per source element adds with a compare-and-swap
 * loop (bf16/f16/bool/u8 through their aligned 32-bit word) — still one rounding per addition,
 * but in a run-dependent order, so results may differ from the CPU (and between runs) in the
 * last bits. */
#include "util.cuh"

extern "C" kg_status kg_cuda_fill(const kg_op_call *c);

/* ---- index checks -------------------------------------------------------------------------- */

__global__ void check_kernel(const char *idx, int dt, int64_t n, int64_t size, long long *flag) {
  KG_CUDA_FOR(i, n) {
    int64_t v = kg_load_index(idx, dt, i);
    if (v < 0 || v >= size) kg_flag(flag, i);
  }
}

/* fails with the shared message when a (contiguous) index is outside [0, t->shape[dim]), as
 * check_range on the CPU; name: how the message calls t (NULL for an embedding table) */
static kg_status check_range(const char *op, const kg_tensor *idx, const kg_tensor *t, int dim, const char *name) {
  int64_t n = kg_numel(idx);
  if (n == 0) return KG_OK;
  int dev = idx->device.index;
  kg_cuda_buf flag;
  KG_TRY(kg_flag_init(&flag, 1, dev, op));
  check_kernel<<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>((const char *)kg_data(idx), idx->dtype,
                                                                               n, t->shape[dim], (long long *)flag.p);
  KG_TRY(kg_cuda_check(op, dev));
  long long pos;
  KG_TRY(kg_flag_read(&flag, 1, &pos, op));
  if (pos == KG_NO_ERROR) return KG_OK;
  return kg_index_range_error(op, (int64_t)kg_cuda_peek(idx, pos), t, dim, name);
}

/* ---- cat and pad: copies into shallow views of the output --------------------------------- */

static kg_status copy_view(const char *op, kg_tensor *dst, const kg_tensor *src) {
  kg_cuda_ew_args a = {KG_EW_COPY, 0, NAN, NAN, 0, 0, 0};
  return kg_cuda_ew(op, a, dst, 1, &src);
}

extern "C" kg_status kg_cuda_cat(const kg_op_call *c) { return kg_cat_into_views(c, copy_view); }
extern "C" kg_status kg_cuda_pad(const kg_op_call *c) { return kg_pad_into_views(c, kg_cuda_fill, copy_view); }

/* ---- gather, index_select, embedding -------------------------------------------------------- */

struct take_args {
  int nd, dim, idt;
  int64_t n, size; /* size: the range of the index (x's length along dim) */
  int64_t shape[KG_MAX_DIMS], xs[KG_MAX_DIMS], is[KG_MAX_DIMS];
  const char *x, *idx;
  char *out;
};

/* out (contiguous)[c] = x[c with c[dim] := idx[Σ c_j is_j]]; U moves the element's bits */
template <class U> __global__ void take_kernel(take_args a) {
  KG_CUDA_FOR(i, a.n) {
    int64_t rem = i, xo = 0, io = 0;
    for (int j = a.nd - 1; j >= 0; j--) {
      int64_t q = rem / a.shape[j], cj = rem - q * a.shape[j];
      rem = q;
      if (j != a.dim) xo += cj * a.xs[j];
      io += cj * a.is[j];
    }
    int64_t v = kg_load_index(a.idx, a.idt, io);
    if (v < 0 || v >= a.size) { /* only reachable in a replayed graph (checked otherwise) */
      ((U *)a.out)[i] = 0;
      continue;
    }
    ((U *)a.out)[i] = ((const U *)a.x)[xo + v * a.xs[a.dim]];
  }
}

static kg_status take(const char *op, const kg_tensor *out, int nd, const int64_t *shape, const kg_tensor *x,
                      const int64_t *xs, const kg_tensor *idx, const int64_t *is, int dim) {
  take_args a;
  a.nd = nd, a.dim = dim, a.idt = idx->dtype;
  a.n = kg_numel(out), a.size = x->ndim > dim ? x->shape[dim] : 0;
  if (a.n == 0) return KG_OK;
  for (int j = 0; j < nd; j++) a.shape[j] = shape[j], a.xs[j] = xs[j], a.is[j] = is[j];
  a.x = (const char *)kg_data(x), a.idx = (const char *)kg_data(idx), a.out = (char *)kg_data(out);
  int dev = out->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  unsigned b = kg_cuda_blocks(a.n);
  switch (kg_elem_size(out)) {
  case 1: take_kernel<uint8_t><<<b, KG_CUDA_THREADS, 0, s>>>(a); break;
  case 2: take_kernel<uint16_t><<<b, KG_CUDA_THREADS, 0, s>>>(a); break;
  case 4: take_kernel<uint32_t><<<b, KG_CUDA_THREADS, 0, s>>>(a); break;
  default: take_kernel<uint64_t><<<b, KG_CUDA_THREADS, 0, s>>>(a); break;
  }
  return kg_cuda_check(op, dev);
}

/* in: x, idx (same ndim, contiguous) */
extern "C" kg_status kg_cuda_gather(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *x = c->in[0], *idx = c->in[1];
  KG_TRY(check_range("gather", idx, x, d, "x"));
  int64_t is[KG_MAX_DIMS];
  kg_contiguous_strides(idx->ndim, idx->shape, is);
  const kg_tensor *o = c->out[0];
  return take("gather", o, o->ndim, o->shape, x, x->stride, idx, is, d);
}

/* in: x, idx [K] */
extern "C" kg_status kg_cuda_index_select(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *x = c->in[0], *idx = c->in[1];
  KG_TRY(check_range("index_select", idx, x, d, "x"));
  int64_t is[KG_MAX_DIMS] = {0};
  is[d] = 1;
  const kg_tensor *o = c->out[0];
  return take("index_select", o, o->ndim, o->shape, x, x->stride, idx, is, d);
}

/* in: ids [...] (contiguous), table [V, C]; out [..., C] taken as [N, C] */
extern "C" kg_status kg_cuda_embedding(const kg_op_call *c) {
  const kg_tensor *ids = c->in[0], *table = c->in[1];
  KG_TRY(check_range("embedding", ids, table, 0, NULL));
  int64_t shape[2] = {kg_numel(ids), table->shape[1]}, is[2] = {1, 0};
  return take("embedding", c->out[0], 2, shape, table, table->stride, ids, is, 0);
}

/* ---- scatter_add_ and index_add_ ------------------------------------------------------------ */

/* dst element at p <- (A)dst + v, rounded to dt, atomically (compare-and-swap) */
template <class A> __device__ void atomic_add_dyn(char *base, int dt, int64_t off, A v) {
  if (dt == KG_F64 || dt == KG_I64) {
    unsigned long long *w = (unsigned long long *)(base + off * 8), old = *w, as;
    do {
      as = old;
      unsigned long long nw;
      if (dt == KG_F64) nw = (unsigned long long)__double_as_longlong((double)((A)__longlong_as_double((long long)as) + v));
      else nw = (unsigned long long)(long long)((A)(long long)as + v);
      old = atomicCAS(w, as, nw);
    } while (old != as);
    return;
  }
  if (dt == KG_F32 || dt == KG_I32) {
    unsigned *w = (unsigned *)(base + off * 4), old = *w, as;
    do {
      as = old;
      unsigned nw;
      if (dt == KG_F32) nw = __float_as_uint((float)((A)__uint_as_float(as) + v));
      else nw = (unsigned)(int32_t)((A)(int32_t)as + v);
      old = atomicCAS(w, as, nw);
    } while (old != as);
    return;
  }
  /* 1- and 2-byte elements: CAS on the aligned word holding them */
  int es = (dt == KG_BF16 || dt == KG_F16) ? 2 : 1;
  char *p = base + off * es;
  unsigned *w = (unsigned *)((uintptr_t)p & ~(uintptr_t)3);
  unsigned shift = (unsigned)((uintptr_t)p & 3) * 8, mask = (es == 2 ? 0xffffu : 0xffu) << shift;
  unsigned old = *w, as;
  do {
    as = old;
    unsigned bits = (as & mask) >> shift, nb;
    if (dt == KG_BF16) nb = kg_f32_to_bf16((float)((A)kg_bf16_to_f32((uint16_t)bits) + v));
    else if (dt == KG_F16) nb = kg_f32_to_f16((float)((A)kg_f16_to_f32((uint16_t)bits) + v));
    else if (dt == KG_BOOL) nb = ((A)bits + v) != 0;
    else nb = (uint8_t)((A)bits + v);
    old = atomicCAS(w, as, (as & ~mask) | ((nb << shift) & mask));
  } while (old != as);
}

struct acc_args {
  int nd, d, idt, ddt, sdt;
  int64_t shape[KG_MAX_DIMS]; /* the shape iterated over (idx's for scatter, src's for index_add) */
  int64_t ds[KG_MAX_DIMS], ss[KG_MAX_DIMS], is[KG_MAX_DIMS];
  int64_t len;  /* length of the indexed dim */
  int64_t size; /* dst's length along d: the index range */
  char *dst;
  const char *src, *idx;
};

/* offsets of position p over every dim except d (p in row-major order of those dims) */
__device__ __forceinline__ void line_offsets(const acc_args &a, int64_t p, int64_t *doff, int64_t *soff, int64_t *ioff) {
  int64_t dd = 0, so = 0, io = 0;
  for (int j = a.nd - 1; j >= 0; j--) {
    if (j == a.d) continue;
    int64_t q = p / a.shape[j], cj = p - q * a.shape[j];
    p = q;
    dd += cj * a.ds[j], so += cj * a.ss[j], io += cj * a.is[j];
  }
  *doff = dd, *soff = so, *ioff = io;
}

/* one thread per line, additions in index order (the CPU's): scatter (index per element, is = idx
 * strides) or index_add (index per slice, is = 0 except is[d] = 1) */
template <class A> __global__ void acc_line_kernel(acc_args a, int64_t lines) {
  KG_CUDA_FOR(l, lines) {
    int64_t doff, soff, ioff;
    line_offsets(a, l, &doff, &soff, &ioff);
    for (int64_t k = 0; k < a.len; k++) {
      int64_t ix = kg_load_index(a.idx, a.idt, ioff + k * a.is[a.d]);
      if (ix < 0 || ix >= a.size) continue; /* only in a replayed graph */
      int64_t at = doff + ix * a.ds[a.d];
      A v = kg_load<A>(a.dst, a.ddt, at) + kg_load<A>(a.src, a.sdt, soff + k * a.ss[a.d]);
      kg_store(a.dst, a.ddt, at, v);
    }
  }
}

/* one thread per (line, k), atomic */
template <class A> __global__ void acc_atomic_kernel(acc_args a, int64_t lines) {
  KG_CUDA_FOR(e, lines * a.len) {
    int64_t l = e / a.len, k = e - l * a.len, doff, soff, ioff;
    line_offsets(a, l, &doff, &soff, &ioff);
    int64_t ix = kg_load_index(a.idx, a.idt, ioff + k * a.is[a.d]);
    if (ix < 0 || ix >= a.size) continue; /* only in a replayed graph */
    int64_t at = doff + ix * a.ds[a.d];
    atomic_add_dyn<A>(a.dst, a.ddt, at, kg_load<A>(a.src, a.sdt, soff + k * a.ss[a.d]));
  }
}

template <class A> static void accumulate(const acc_args &a, int64_t lines, cudaStream_t s) {
  int64_t n = lines * a.len;
  if (lines >= 4096 || a.len <= 16) acc_line_kernel<A><<<kg_cuda_blocks(lines), 128, 0, s>>>(a, lines);
  else acc_atomic_kernel<A><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(a, lines);
}

/* in: dst, idx (contiguous, ndim of dst), src */
extern "C" kg_status kg_cuda_scatter_add(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *dst = c->in[0], *idx = c->in[1], *src = c->in[2];
  KG_TRY(check_range("scatter_add_", idx, dst, d, "dst"));
  acc_args a;
  a.nd = idx->ndim, a.d = d, a.idt = idx->dtype, a.ddt = dst->dtype, a.sdt = src->dtype;
  kg_contiguous_strides(idx->ndim, idx->shape, a.is);
  for (int j = 0; j < a.nd; j++) a.shape[j] = idx->shape[j], a.ds[j] = dst->stride[j], a.ss[j] = src->stride[j];
  a.len = idx->shape[d], a.size = dst->shape[d];
  int64_t n = kg_numel(idx), lines = a.len ? n / a.len : 0;
  if (lines == 0) return KG_OK;
  a.dst = (char *)kg_data(dst), a.src = (const char *)kg_data(src), a.idx = (const char *)kg_data(idx);
  int dev = dst->device.index;
  accumulate<double>(a, lines, kg_cuda_stream(dev));
  return kg_cuda_check("scatter_add_", dev);
}

/* in: dst, idx [K] (contiguous), src (dst's shape with K at dim) */
extern "C" kg_status kg_cuda_index_add(const kg_op_call *c) {
  int d = ((const kg_index_params *)c->params)->dim;
  const kg_tensor *dst = c->in[0], *idx = c->in[1], *src = c->in[2];
  KG_TRY(check_range("index_add_", idx, dst, d, "dst"));
  acc_args a;
  a.nd = dst->ndim, a.d = d, a.idt = idx->dtype, a.ddt = dst->dtype, a.sdt = src->dtype;
  for (int j = 0; j < a.nd; j++) a.shape[j] = src->shape[j], a.ds[j] = dst->stride[j], a.ss[j] = src->stride[j], a.is[j] = 0;
  a.is[d] = 1;
  a.len = kg_numel(idx), a.size = dst->shape[d];
  int64_t lines = 1;
  for (int j = 0; j < a.nd; j++)
    if (j != d) lines *= dst->shape[j];
  if (lines == 0 || a.len == 0) return KG_OK;
  a.dst = (char *)kg_data(dst), a.src = (const char *)kg_data(src), a.idx = (const char *)kg_data(idx);
  int dev = dst->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  if (kg_cuda_wide(dst->dtype) || kg_cuda_wide(src->dtype)) accumulate<double>(a, lines, s);
  else accumulate<float>(a, lines, s);
  return kg_cuda_check("index_add_", dev);
}
