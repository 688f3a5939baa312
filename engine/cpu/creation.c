/* creation.c (cpu) — fill, arange, Philox random tensors, tril/triu. */
#include "cpu.h"

#include <keng/scalar.h>
#include <math.h>

typedef struct { double v; } fill_ctx;

static void fill_run(void *ctx, char *const *ptr, const int64_t *stride, int64_t n, kg_dtype dt) {
  double buf[KG_CHUNK];
  double v = ((fill_ctx *)ctx)->v;
  for (int64_t i = 0; i < KG_CHUNK; i++) buf[i] = v;
  for (int64_t i = 0; i < n; i += KG_CHUNK) {
    int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;
    kg_cpu_store_f64(ptr[0] + i * stride[0] * kg_dtype_info[dt].size, dt, stride[0], buf, m);
  }
}

#define DT_TRAMPOLINE(name, fn)                                                                \
  typedef struct { kg_dtype dt; void *inner; } name##_ctx;                                     \
  static void name(void *ctx, char *const *ptr, const int64_t *stride, int64_t n) {            \
    name##_ctx *c = ctx;                                                                       \
    fn(c->inner, ptr, stride, n, c->dt);                                                       \
  }
DT_TRAMPOLINE(fill_tramp, fill_run)

kg_status kg_cpu_fill(const kg_op_call *c) {
  kg_tensor *t = c->out[0];
  fill_ctx f = {((const kg_fill_params *)c->params)->value};
  fill_tramp_ctx ctx = {t->dtype, &f};
  kg_iter it;
  const kg_tensor *ts[1] = {t};
  kg_iter_init(&it, 1, ts);
  kg_iter_run(&it, fill_tramp, &ctx);
  return KG_OK;
}

kg_status kg_cpu_fill_value(kg_tensor *t, double v) {
  kg_fill_params p = {v};
  kg_op_call c = {KG_OP_FILL, 0, 1, NULL, &t, &p};
  return kg_cpu_fill(&c);
}

kg_status kg_cpu_arange(const kg_op_call *c) {
  const kg_arange_params *p = c->params;
  kg_tensor *t = c->out[0];
  int64_t n = kg_numel(t);
  char *d = kg_data(t);
  for (int64_t i = 0; i < n; i++) kg_store_from_double(d, t->dtype, i, p->start + (double)i * p->step);
  return KG_OK;
}

/* Element i draws words 2i and 2i+1 of the stream through the formulas of scalar.h, which the
 * CUDA kernel shares, so both devices produce the same tensor for the same seed. */
static int uniform_bits(kg_dtype dt) {
  switch (dt) {
  case KG_F64: return 53;
  case KG_BF16: return 8;
  case KG_F16: return 11;
  default: return 24;
  }
}

static kg_status random_fill(const kg_op_call *c) {
  const kg_random_params *p = c->params;
  kg_tensor *t = c->out[0];
  int64_t n = kg_numel(t);
  char *d = kg_data(t);
  kg_dtype dt = t->dtype;
  int es = kg_dtype_info[dt].size, bits = c->op == KG_OP_RAND ? uniform_bits(dt) : 53;
#pragma omp parallel for if (n > 65536) schedule(static)
  for (int64_t b = 0; b < n; b += KG_CHUNK) {
    double buf[KG_CHUNK];
    uint32_t words[2 * KG_CHUNK]; /* element i uses words 2i and 2i + 1 */
    int64_t m = n - b < KG_CHUNK ? n - b : KG_CHUNK;
    kg_cpu_philox_words(words, p->rng.seed, p->rng.offset, 2 * (uint64_t)b, m);
    kg_cpu_philox_words(words + m, p->rng.seed, p->rng.offset, 2 * (uint64_t)b + (uint64_t)m, m);
    for (int64_t j = 0; j < m; j++) {
      uint32_t w0 = words[2 * j], w1 = words[2 * j + 1];
      if (c->op == KG_OP_RANDN) buf[j] = p->a + p->b * kg_normal_u32x2(w0, w1);
      else if (c->op == KG_OP_RANDINT) buf[j] = p->a + floor(kg_uniform_bits(w0, w1, 53) * (p->b - p->a));
      else buf[j] = p->a + kg_uniform_bits(w0, w1, bits) * (p->b - p->a);
    }
    kg_cpu_store_f64(d + b * es, dt, 1, buf, m);
  }
  return KG_OK;
}
kg_status kg_cpu_rand(const kg_op_call *c) { return random_fill(c); }
kg_status kg_cpu_randn(const kg_op_call *c) { return random_fill(c); }
kg_status kg_cpu_randint(const kg_op_call *c) { return random_fill(c); }

/* out = x where (col - row <= k) for tril, (col - row >= k) for triu, else 0 */
static kg_status tri(const kg_op_call *c, bool lower) {
  const kg_tensor *x = c->in[0];
  kg_tensor *o = c->out[0];
  int64_t k = ((const kg_tri_params *)c->params)->k;
  int nd = x->ndim;
  int64_t R = x->shape[nd - 2], C = x->shape[nd - 1], batch = R * C > 0 ? kg_numel(x) / (R * C) : 0;
  if (!R || !C) return KG_OK;
  int64_t idx[KG_MAX_DIMS] = {0};
  for (int64_t bi = 0; bi < batch; bi++) {
    int64_t rem = bi, xoff = 0, ooff = 0;
    for (int d = nd - 3; d >= 0; d--) {
      idx[d] = rem % x->shape[d];
      rem /= x->shape[d];
      xoff += idx[d] * x->stride[d];
      ooff += idx[d] * o->stride[d];
    }
    for (int64_t r = 0; r < R; r++) {
      const char *src = (const char *)kg_data(x) + (xoff + r * x->stride[nd - 2]) * (int64_t)kg_elem_size(x);
      char *dst = (char *)kg_data(o) + (ooff + r * o->stride[nd - 2]) * (int64_t)kg_elem_size(o);
      for (int64_t col = 0; col < C; col++) {
        bool keep = lower ? col - r <= k : col - r >= k;
        double v = keep ? kg_load_as_double(src, x->dtype, col * x->stride[nd - 1]) : 0.0;
        kg_store_from_double(dst, o->dtype, col * o->stride[nd - 1], v);
      }
    }
  }
  return KG_OK;
}
kg_status kg_cpu_tril(const kg_op_call *c) { return tri(c, true); }
kg_status kg_cpu_triu(const kg_op_call *c) { return tri(c, false); }
