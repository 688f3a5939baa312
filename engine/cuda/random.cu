/* random.cu — dropout and multinomial with engine/cpu/random.c's use of the Philox stream, so a
 * CUDA run draws what a CPU run draws for the same (seed, offset):
 *   dropout      element i (row-major) keeps when unit(word i) >= p
 *   multinomial  with replacement: sample j of row b uses words 2(b n + j), +1: u in [0, 1) picks
 *                the first category whose running sum exceeds u * total; without replacement:
 *                category v of row b gets the key -log1p(-u) / p_v from words 2(b V + v), +1 (inf
 *                for p_v = 0) and the n smallest keys (ties by index) are the samples.
 * The running sums are a block scan in double (per-thread chunks, then the chunk totals), so
 * they can differ from the CPU's sequential sums in the last bits: a draw landing within an ulp
 * of a category boundary may pick the neighbour. Invalid rows (negative / non-finite entries, a
 * zero sum, too few non-zero categories) are flagged on the device and raised with the CPU's
 * message after a sync.
 *
 * Every kernel here takes its Philox key as a kg_cuda_rng and reads it with kg_rng_load, never
 * as a plain (seed, offset): under CUDA Graph capture the key lives in device memory that each
 * replay rewrites, so a replayed dropout or sampling step draws new numbers (a key passed by
 * value would be baked into the graph and every replay would reuse the captured uniforms;
 * tests/lua/random_spec.lua checks this file's kernels for it). */
#include "util.cuh"

template <class T> __global__ void dropout_kernel(const char *x, int xdt, char *y, int ydt, uint8_t *mask, int64_t n,
                                                  kg_cuda_rng rng, float thr, T scale) {
  uint64_t seed, offset;
  kg_rng_load(rng, seed, offset);
  KG_CUDA_FOR(i, n) {
    bool keep = kg_u32_to_unit(kg_philox_word(seed, offset, (uint64_t)i)) >= thr;
    mask[i] = keep;
    kg_store(y, ydt, i, keep ? kg_load<T>(x, xdt, i) * scale : (T)0);
  }
}

extern "C" kg_status kg_cuda_dropout(const kg_op_call *c) {
  const kg_dropout_params *p = (const kg_dropout_params *)c->params;
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0], *mask = c->out[1];
  int64_t n = kg_numel(x);
  if (n == 0) return KG_OK;
  double scale = p->p < 1 ? 1 / (1 - p->p) : 0;
  int dev = y->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  const char *xb = (const char *)kg_data(x);
  kg_cuda_rng rng = kg_cuda_rng_key(p->rng, dev); /* read on the device while captured */
  if (x->dtype == KG_F64)
    dropout_kernel<double><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(
        xb, x->dtype, (char *)kg_data(y), y->dtype, (uint8_t *)kg_data(mask), n, rng,
        (float)p->p, scale);
  else
    dropout_kernel<float><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(
        xb, x->dtype, (char *)kg_data(y), y->dtype, (uint8_t *)kg_data(mask), n, rng,
        (float)p->p, (float)scale);
  return kg_cuda_check("dropout", dev);
}

/* error kinds in flag slots: [0] a bad entry (position b*V+v), [1] a zero-sum row, [2] a row
 * with too few non-zero categories */
#define SCAN_THREADS 256

/* block per row: validates, and writes running sums (replacement) or keys (no replacement) */
__global__ void multinomial_prep_kernel(const char *pr, int pdt, int64_t B, int64_t V, int64_t n, bool replacement,
                                        kg_cuda_rng rng, double *work, long long *flag) {
  __shared__ double chunk_tot[SCAN_THREADS];
  uint64_t seed, offset;
  kg_rng_load(rng, seed, offset);
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    __syncthreads(); /* chunk_tot of the previous row is read */
    const int64_t base = b * V;
    double total = 0, positive = 0;
    long long bad = KG_NO_ERROR;
    int64_t per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per, hi = lo + per < V ? lo + per : V;
    for (int64_t v = lo; v < hi; v++) {
      double w = kg_load<double>(pr, pdt, base + v);
      if (!(w >= 0) || isinf(w)) bad = bad < base + v ? bad : base + v;
      total += w;
      positive += w > 0;
    }
    chunk_tot[threadIdx.x] = total;
    bad = kg_block_min_ll(bad);
    positive = kg_block_sum(positive);
    __syncthreads();
    double before = 0, all = 0;
    for (unsigned t = 0; t < blockDim.x; t++) {
      if (t < threadIdx.x) before += chunk_tot[t];
      all += chunk_tot[t];
    }
    if (bad != KG_NO_ERROR) {
      if (threadIdx.x == 0) kg_flag(&flag[0], bad);
      continue;
    }
    if (!(all > 0)) {
      if (threadIdx.x == 0) kg_flag(&flag[1], b);
      continue;
    }
    if (!replacement && positive < (double)n) {
      if (threadIdx.x == 0) kg_flag(&flag[2], b), work[base] = positive; /* for the message */
      continue;
    }
    if (replacement) {
      double run = before;
      for (int64_t v = lo; v < hi; v++) work[base + v] = run += kg_load<double>(pr, pdt, base + v);
    } else {
      for (int64_t v = lo; v < hi; v++) {
        uint64_t i = 2 * (uint64_t)(base + v);
        double u = kg_u32x2_to_unit(kg_philox_word(seed, offset, i), kg_philox_word(seed, offset, i + 1));
        double w = kg_load<double>(pr, pdt, base + v);
        work[base + v] = w > 0 ? -log1p(-u) / w : INFINITY;
      }
    }
  }
}

/* thread per sample: the first category whose running sum exceeds u * total */
__global__ void multinomial_draw_kernel(const double *cum, int64_t B, int64_t V, int64_t n, kg_cuda_rng rng,
                                        int64_t *out) {
  uint64_t seed, offset;
  kg_rng_load(rng, seed, offset);
  KG_CUDA_FOR(e, B * n) {
    int64_t b = e / n;
    const double *w = cum + b * V;
    uint64_t i = 2 * (uint64_t)e;
    double u = kg_u32x2_to_unit(kg_philox_word(seed, offset, i), kg_philox_word(seed, offset, i + 1)) * w[V - 1];
    int64_t lo = 0, hi = V - 1;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (w[mid] > u) hi = mid;
      else lo = mid + 1;
    }
    out[e] = lo;
  }
}

extern "C" kg_status kg_cuda_multinomial(const kg_op_call *c) {
  const kg_multinomial_params *p = (const kg_multinomial_params *)c->params;
  const kg_tensor *pr = c->in[0];
  kg_tensor *o = c->out[0];
  int64_t V = pr->shape[pr->ndim - 1], B = pr->ndim == 2 ? pr->shape[0] : 1, n = p->n;
  if (B == 0 || n == 0) return KG_OK;
  int dev = o->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  kg_cuda_buf flag;
  KG_TRY(kg_flag_init(&flag, 3, dev, "multinomial"));
  kg_tensor *work = NULL;
  int64_t wshape[2] = {B, V};
  KG_TRY(kg_tensor_empty(&work, 2, wshape, KG_F64, o->device));
  kg_cuda_rng rng = kg_cuda_rng_key(p->rng, dev); /* read on the device while captured */
  multinomial_prep_kernel<<<kg_grid(B), SCAN_THREADS, 0, s>>>((const char *)kg_data(pr), pr->dtype, B, V, n,
                                                              p->replacement, rng, (double *)kg_data(work),
                                                              (long long *)flag.p);
  kg_status st = kg_cuda_check("multinomial", dev);
  long long f[3] = {KG_NO_ERROR, KG_NO_ERROR, KG_NO_ERROR};
  if (!st) st = kg_flag_read(&flag, 3, f, "multinomial");
  /* the first bad row, and in it the CPU's first complaint */
  long long bad_row = KG_NO_ERROR;
  if (!st) {
    if (f[0] != KG_NO_ERROR) bad_row = f[0] / V;
    if (f[1] < bad_row) bad_row = f[1];
    if (f[2] < bad_row) bad_row = f[2];
  }
  if (!st && bad_row != KG_NO_ERROR) {
    if (f[0] != KG_NO_ERROR && f[0] / V == bad_row)
      st = kg_error(KG_ERR_VALUE, "multinomial", "probs row %lld has an entry %g; entries must be finite and >= 0",
                    bad_row + 1, kg_cuda_peek(pr, f[0]));
    else if (f[1] == bad_row)
      st = kg_error(KG_ERR_VALUE, "multinomial", "probs row %lld sums to zero", bad_row + 1);
    else
      st = kg_error(KG_ERR_VALUE, "multinomial",
                    "probs row %lld has %lld non-zero categories, fewer than the %lld samples drawn without "
                    "replacement",
                    bad_row + 1, (long long)kg_cuda_peek(work, bad_row * V), (long long)n);
  }
  if (!st && p->replacement) {
    multinomial_draw_kernel<<<kg_cuda_blocks(B * n), KG_CUDA_THREADS, 0, s>>>(
        (const double *)kg_data(work), B, V, n, rng, (int64_t *)kg_data(o));
    st = kg_cuda_check("multinomial", dev);
  } else if (!st) { /* the n smallest keys of each row, in increasing order */
    kg_tensor ov = *o; /* o viewed as [B, n] */
    ov.ndim = 2, ov.shape[0] = B, ov.shape[1] = n;
    kg_contiguous_strides(2, ov.shape, ov.stride);
    st = kg_cuda_topk_rows("multinomial", work, 1, n, false, NULL, &ov);
  }
  kg_tensor_release(work);
  return st;
}
