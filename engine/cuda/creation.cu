/* creation.cu — fill, arange, Philox random tensors, copy (strided, broadcasting, casting),
 * tril/triu. Random kernels draw exactly what engine/cpu/creation.c draws for the same
 * (seed, offset): element i (row-major) uses words 2i and 2i+1 of the stream. */
#include "cuda.cuh"

#include <math.h>

extern "C" kg_status kg_cuda_fill(const kg_op_call *c) {
  kg_cuda_ew_args a = {KG_EW_FILL, 0, ((const kg_fill_params *)c->params)->value, NAN, 0, 0, 0};
  return kg_cuda_ew("fill", a, c->out[0], 0, NULL);
}

extern "C" kg_status kg_cuda_copy(const kg_op_call *c) {
  kg_cuda_ew_args a = {KG_EW_COPY, 0, NAN, NAN, 0, 0, 0};
  return kg_cuda_ew("copy", a, c->out[0], 1, c->in);
}

static kg_status tri(const kg_op_call *c, bool lower) {
  const kg_tensor *x = c->in[0];
  kg_cuda_ew_args a = {KG_EW_TRI, lower ? 1 : 0, NAN, NAN, ((const kg_tri_params *)c->params)->k,
                       x->shape[x->ndim - 2], x->shape[x->ndim - 1]};
  return kg_cuda_ew(lower ? "tril" : "triu", a, c->out[0], 1, c->in);
}
extern "C" kg_status kg_cuda_tril(const kg_op_call *c) { return tri(c, true); }
extern "C" kg_status kg_cuda_triu(const kg_op_call *c) { return tri(c, false); }

/* arange: out is fresh and contiguous; value i = start + i * step in double */
template <class S> __global__ void arange_kernel(S *out, int64_t n, double start, double step) {
  KG_CUDA_FOR(i, n) kg_put(out + i, start + (double)i * step);
}

extern "C" kg_status kg_cuda_arange(const kg_op_call *c) {
  const kg_arange_params *p = (const kg_arange_params *)c->params;
  kg_tensor *t = c->out[0];
  int64_t n = kg_numel(t);
  cudaStream_t s = kg_cuda_stream(t->device.index);
  KG_CUDA_DISPATCH("arange", t->dtype, S,
                   arange_kernel<S><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>((S *)kg_data(t), n, p->start, p->step))
  return kg_cuda_check("arange", t->device.index);
}

enum { RAND_UNIFORM, RAND_NORMAL, RAND_INT };

/* the double value of element i, with the formulas of scalar.h that engine/cpu/creation.c uses */
__device__ __forceinline__ double random_value(int kind, uint64_t seed, uint64_t offset, uint64_t i, double a, double b,
                                               int bits) {
  uint32_t w0 = kg_philox_word(seed, offset, 2 * i), w1 = kg_philox_word(seed, offset, 2 * i + 1);
  if (kind == RAND_NORMAL) return a + b * kg_normal_u32x2(w0, w1);
  if (kind == RAND_INT) return a + floor(kg_uniform_bits(w0, w1, 53) * (b - a));
  return a + kg_uniform_bits(w0, w1, bits) * (b - a);
}

template <class S>
__global__ void random_kernel(S *out, int64_t n, int kind, kg_cuda_rng rng, double a, double b, int bits) {
  uint64_t seed, offset;
  kg_rng_load(rng, seed, offset);
  KG_CUDA_FOR(i, n) {
    S r;
    kg_put(&r, random_value(kind, seed, offset, (uint64_t)i, a, b, bits));
    out[i] = r;
  }
}

/* uniform draws carry as many random bits as the dtype holds, so none rounds up to b */
static int uniform_bits(kg_dtype dt) { return dt == KG_F64 ? 53 : dt == KG_BF16 ? 8 : dt == KG_F16 ? 11 : 24; }

static kg_status random_fill(const kg_op_call *c, int kind) {
  const kg_random_params *p = (const kg_random_params *)c->params;
  kg_tensor *t = c->out[0];
  int64_t n = kg_numel(t);
  const char *name = kg_op_info[c->op].name;
  if (!kg_is_contiguous(t)) return kg_error(KG_ERR_VALUE, name, "output must be contiguous");
  int bits = kind == RAND_UNIFORM ? uniform_bits(t->dtype) : 53;
  cudaStream_t s = kg_cuda_stream(t->device.index);
  kg_cuda_rng rng = kg_cuda_rng_key(p->rng, t->device.index);
  KG_CUDA_DISPATCH(name, t->dtype, S,
                   random_kernel<S><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(
                       (S *)kg_data(t), n, kind, rng, p->a, p->b, bits))
  return kg_cuda_check(name, t->device.index);
}
extern "C" kg_status kg_cuda_rand(const kg_op_call *c) { return random_fill(c, RAND_UNIFORM); }
extern "C" kg_status kg_cuda_randn(const kg_op_call *c) { return random_fill(c, RAND_NORMAL); }
extern "C" kg_status kg_cuda_randint(const kg_op_call *c) { return random_fill(c, RAND_INT); }
