/* random.c (cpu) — dropout and multinomial from the Philox stream (keng/scalar.h).
 *
 * The word layout is the contract a CUDA kernel follows to reproduce the CPU:
 *   dropout      element i (row-major) keeps when unit(word i) >= p
 *   multinomial  probs [B, V]; with replacement sample j of row b uses words 2(b n + j) and +1,
 *                a uniform u in [0, 1) picking the first category whose running sum exceeds
 *                u * total; without replacement category v of row b gets the key
 *                -log(u) / p_v from words 2(b V + v) and +1, and the n smallest keys in
 *                increasing order are the samples (exponential races: the same law as drawing
 *                one at a time and renormalising).
 */
#include "cpu.h"

#include <keng/scalar.h>
#include <math.h>
#include <stdlib.h>

kg_status kg_cpu_dropout(const kg_op_call *c) {
  const kg_dropout_params *p = c->params;
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0], *mask = c->out[1];
  int64_t n = kg_numel(x);
  const char *xd = kg_data(x);
  char *yd = kg_data(y);
  uint8_t *md = kg_data(mask);
  int64_t xes = (int64_t)kg_elem_size(x), yes = (int64_t)kg_elem_size(y);
  double scale = p->p < 1 ? 1 / (1 - p->p) : 0;
  float thr = (float)p->p;
#pragma omp parallel for if (n > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t b = 0; b < n; b += KG_CHUNK) {
    int64_t m = n - b < KG_CHUNK ? n - b : KG_CHUNK;
    if (x->dtype == KG_F64) {
      double buf[KG_CHUNK];
      kg_cpu_load_f64(buf, xd + b * xes, x->dtype, 1, m);
      for (int64_t j = 0; j < m; j++) {
        md[b + j] = kg_u32_to_unit(kg_philox_word(p->rng.seed, p->rng.offset, (uint64_t)(b + j))) >= thr;
        buf[j] = md[b + j] ? buf[j] * scale : 0;
      }
      kg_cpu_store_f64(yd + b * yes, y->dtype, 1, buf, m);
    } else {
      float buf[KG_CHUNK], s = (float)scale;
      kg_cpu_load_f32(buf, xd + b * xes, x->dtype, 1, m);
      for (int64_t j = 0; j < m; j++) {
        md[b + j] = kg_u32_to_unit(kg_philox_word(p->rng.seed, p->rng.offset, (uint64_t)(b + j))) >= thr;
        buf[j] = md[b + j] ? buf[j] * s : 0;
      }
      kg_cpu_store_f32(yd + b * yes, y->dtype, 1, buf, m);
    }
  }
  return KG_OK;
}

typedef struct {
  double key;
  int64_t v;
} keyed;

static int by_key(const void *a, const void *b) {
  const keyed *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->v < y->v ? -1 : x->v > y->v;
}

kg_status kg_cpu_multinomial(const kg_op_call *c) {
  const kg_multinomial_params *p = c->params;
  const kg_tensor *pr = c->in[0];
  kg_tensor *o = c->out[0];
  int64_t V = pr->shape[pr->ndim - 1], B = pr->ndim == 2 ? pr->shape[0] : 1, n = p->n;
  int64_t *od = kg_data(o);
  const char *pd = kg_data(pr);
  int64_t es = (int64_t)kg_elem_size(pr);
  double *w = malloc(sizeof(double) * (size_t)V);
  keyed *keys = p->replacement ? NULL : malloc(sizeof(keyed) * (size_t)V);
  if (!w || (!p->replacement && !keys)) {
    free(w);
    free(keys);
    return kg_error(KG_ERR_OOM, "multinomial", "out of memory for %lld categories", (long long)V);
  }
  kg_status s = KG_OK;
  for (int64_t b = 0; b < B && !s; b++) {
    kg_cpu_load_f64(w, pd + b * V * es, pr->dtype, 1, V);
    double total = 0;
    int64_t positive = 0;
    for (int64_t v = 0; v < V; v++) {
      if (!(w[v] >= 0) || isinf(w[v])) {
        s = kg_error(KG_ERR_VALUE, "multinomial", "probs row %lld has an entry %g; entries must be finite and >= 0",
                     (long long)b, w[v]);
        break;
      }
      total += w[v];
      positive += w[v] > 0;
    }
    if (s) break;
    if (!(total > 0)) {
      s = kg_error(KG_ERR_VALUE, "multinomial", "probs row %lld sums to zero", (long long)b);
      break;
    }
    if (!p->replacement && positive < n) {
      s = kg_error(KG_ERR_VALUE, "multinomial",
                   "probs row %lld has %lld non-zero categories, fewer than the %lld samples drawn without "
                   "replacement",
                   (long long)b, (long long)positive, (long long)n);
      break;
    }
    if (p->replacement) {
      for (int64_t v = 1; v < V; v++) w[v] += w[v - 1]; /* running sums */
      for (int64_t j = 0; j < n; j++) {
        uint64_t i = 2 * (uint64_t)(b * n + j);
        double u = kg_u32x2_to_unit(kg_philox_word(p->rng.seed, p->rng.offset, i),
                                    kg_philox_word(p->rng.seed, p->rng.offset, i + 1)) * total;
        int64_t lo = 0, hi = V - 1; /* first v with w[v] > u: never a zero-weight one */
        while (lo < hi) {
          int64_t mid = (lo + hi) / 2;
          if (w[mid] > u) hi = mid;
          else lo = mid + 1;
        }
        od[b * n + j] = lo;
      }
    } else {
      for (int64_t v = 0; v < V; v++) {
        uint64_t i = 2 * (uint64_t)(b * V + v);
        double u = kg_u32x2_to_unit(kg_philox_word(p->rng.seed, p->rng.offset, i),
                                    kg_philox_word(p->rng.seed, p->rng.offset, i + 1));
        keys[v].key = w[v] > 0 ? -log1p(-u) / w[v] : INFINITY; /* 1 - u is in (0, 1] */
        keys[v].v = v;
      }
      qsort(keys, (size_t)V, sizeof *keys, by_key);
      for (int64_t j = 0; j < n; j++) od[b * n + j] = keys[j].v;
    }
  }
  free(w);
  free(keys);
  return s;
}
