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

/* ---- Philox words in bulk ---------------------------------------------------------------------
 * kg_philox_word computes a whole 4-word Philox block per word and keeps one; here each block
 * serves its 4 words, and PHILOX_LANES blocks run side by side in plain arrays, which the
 * compiler vectorises (the 32x32->64 multiplies become vpmuludq). The rounds are those of
 * kg_philox4x32 (keng/scalar.h), so the words are bit-identical; lab_rows --check compares
 * them with kg_philox_word. */
#define PHILOX_LANES 16

/* blocks ctr .. ctr + PHILOX_LANES - 1 for key seed: out[4 j + k] = word k of block ctr + j */
static void philox_lanes(uint32_t *out, uint64_t ctr, uint64_t seed) {
  uint32_t c0[PHILOX_LANES], c1[PHILOX_LANES], c2[PHILOX_LANES], c3[PHILOX_LANES];
  for (int j = 0; j < PHILOX_LANES; j++) {
    uint64_t c = ctr + (uint64_t)j;
    c0[j] = (uint32_t)c, c1[j] = (uint32_t)(c >> 32), c2[j] = 0, c3[j] = 0;
  }
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    for (int j = 0; j < PHILOX_LANES; j++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * c0[j], p1 = (uint64_t)0xCD9E8D57u * c2[j];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = (uint32_t)p1, c3[j] = (uint32_t)p0, c0[j] = n0, c2[j] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int j = 0; j < PHILOX_LANES; j++) {
    out[4 * j] = c0[j], out[4 * j + 1] = c1[j], out[4 * j + 2] = c2[j], out[4 * j + 3] = c3[j];
  }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* the 32x32 -> 64 products of 8 lanes: *hi, *lo (vpmuludq takes the even lanes; the odd ones
 * are shifted down, multiplied and blended back) */
__attribute__((target("avx2"))) static inline void mul_hilo8(__m256i a, __m256i m, __m256i *hi, __m256i *lo) {
  __m256i pe = _mm256_mul_epu32(a, m), po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
  *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}
/* philox_lanes with 8 blocks per AVX2 register, two registers at a time */
__attribute__((target("avx2"))) static void philox_lanes_avx2(uint32_t *out, uint64_t ctr, uint64_t seed) {
  __m256i c0[2], c1[2], c2[2], c3[2];
  const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
  for (int h = 0; h < 2; h++) {
    uint32_t lo[8], hi[8];
    for (int j = 0; j < 8; j++) {
      uint64_t c = ctr + (uint64_t)(8 * h + j);
      lo[j] = (uint32_t)c, hi[j] = (uint32_t)(c >> 32);
    }
    c0[h] = _mm256_loadu_si256((const __m256i *)lo), c1[h] = _mm256_loadu_si256((const __m256i *)hi);
    c2[h] = c3[h] = _mm256_setzero_si256();
  }
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    __m256i kv0 = _mm256_set1_epi32((int)k0), kv1 = _mm256_set1_epi32((int)k1);
    for (int h = 0; h < 2; h++) {
      __m256i hi0, lo0, hi1, lo1;
      mul_hilo8(c0[h], m0, &hi0, &lo0);
      mul_hilo8(c2[h], m1, &hi1, &lo1);
      __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[h]), kv0);
      __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[h]), kv1);
      c0[h] = n0, c1[h] = lo1, c2[h] = n2, c3[h] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int h = 0; h < 2; h++) { /* 8 x 4 words to block-major order: a 4x8 transpose */
    uint32_t w[4][8];
    _mm256_storeu_si256((__m256i *)w[0], c0[h]);
    _mm256_storeu_si256((__m256i *)w[1], c1[h]);
    _mm256_storeu_si256((__m256i *)w[2], c2[h]);
    _mm256_storeu_si256((__m256i *)w[3], c3[h]);
    for (int j = 0; j < 8; j++)
      for (int k = 0; k < 4; k++) out[4 * (8 * h + j) + k] = w[k][j];
  }
}
static bool philox_avx2(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2");
  }
  return have == 1 && !kg_env_bool(KG_ENV_KENG_NO_SIMD);
}
#define PHILOX_LANES_FN (philox_avx2() ? philox_lanes_avx2 : philox_lanes)
#else
#define PHILOX_LANES_FN philox_lanes
#endif

/* w[j] = kg_philox_word(seed, offset, i + j) for j < n (n <= KG_CHUNK); also creation.c's */
void kg_cpu_philox_words(uint32_t *w, uint64_t seed, uint64_t offset, uint64_t i, int64_t n) {
  enum { SPAN = 4 * PHILOX_LANES };
  uint32_t tmp[KG_CHUNK + 2 * SPAN];
  uint64_t first = offset + i, skip = first & 3; /* the first word's place in its block */
  int64_t need = (int64_t)skip + n;
  void (*lanes)(uint32_t *, uint64_t, uint64_t) = PHILOX_LANES_FN;
  for (int64_t b = 0; b < need; b += SPAN) lanes(tmp + b, (first >> 2) + (uint64_t)(b / 4), seed);
  for (int64_t j = 0; j < n; j++) w[j] = tmp[skip + (uint64_t)j];
}

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
    uint32_t w[KG_CHUNK];
    kg_cpu_philox_words(w, p->rng.seed, p->rng.offset, (uint64_t)b, m);
    uint8_t *mk = md + b;
    for (int64_t j = 0; j < m; j++) mk[j] = kg_u32_to_unit(w[j]) >= thr;
    if (x->dtype == KG_F64) {
      double buf[KG_CHUNK];
      kg_cpu_load_f64(buf, xd + b * xes, x->dtype, 1, m);
      for (int64_t j = 0; j < m; j++) buf[j] = mk[j] ? buf[j] * scale : 0;
      kg_cpu_store_f64(yd + b * yes, y->dtype, 1, buf, m);
    } else {
      float buf[KG_CHUNK], s = (float)scale;
      kg_cpu_load_f32(buf, xd + b * xes, x->dtype, 1, m);
      for (int64_t j = 0; j < m; j++) buf[j] = mk[j] ? buf[j] * s : 0;
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
                     (long long)b + 1, w[v]);
        break;
      }
      total += w[v];
      positive += w[v] > 0;
    }
    if (s) break;
    if (!(total > 0)) {
      s = kg_error(KG_ERR_VALUE, "multinomial", "probs row %lld sums to zero", (long long)b + 1);
      break;
    }
    if (!p->replacement && positive < n) {
      s = kg_error(KG_ERR_VALUE, "multinomial",
                   "probs row %lld has %lld non-zero categories, fewer than the %lld samples drawn without "
                   "replacement",
                   (long long)b + 1, (long long)positive, (long long)n);
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
