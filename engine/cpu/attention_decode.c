/* attention_decode.c (cpu) — the SDPA forward of a decode step (at most 4 query rows), AVX2 +
 * FMA: keys and values are read where they lie (an f32 or bf16 KV cache, rows of unit stride),
 * each bf16 element widened in a register (exact), and only the keys the causal / window band
 * lets the query see. The general kernel (attention_avx2.c) first converts every key and value
 * row of its range to an f32 copy, per query head, which at one query row costs more than the
 * products (2.5-3x this kernel's time on gemma_tiny / mistral_tiny decode shapes).
 *
 * Per query head h and row i: s_j = scale·(q·k_j) for every visible key j (four keys per pass,
 * each its own register chain), + the float mask (or -inf where a bool mask is false),
 * m = max s, p_j = e^(s_j - m) (attention.c's exp polynomial), out = Σ p_j v_j / Σ p_j (64
 * columns of the sum in registers), lse = m + log Σ p_j. The tiled kernel's softmax in one pass
 * over the keys instead of online blocks, so the two differ only by f32 rounding
 * (tests/lua/attention_decode_spec.lua). The G query heads of a kv head run one after another,
 * so its keys and values stay in cache.
 * Shape letters: B batch, H query heads, Hkv key/value heads, G = H / Hkv, T query rows,
 * S keys, D head dim. */
#include "attention.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma")))
#include "attention_simd.h" /* exp8, hsum8 */

/* 8 elements of a row at p (f32, or bf16 widened: the bits shifted into the high half) */
static inline AVX2 __m256 load8(const char *p, bool bf) {
  if (!bf) return _mm256_loadu_ps((const float *)p);
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the kernel's operands are fit: f32 compute, q / k / v f32 or bf16 with k, v rows of unit
 * stride and D a multiple of 8, few query rows */
static bool fits(const kg_attn_plan *P) {
  if (P->T > 4 || P->D % 8 != 0 || P->k.st[3] != 1 || P->v.st[3] != 1) return false;
  if (P->k.dt != P->v.dt || (P->k.dt != KG_F32 && P->k.dt != KG_BF16)) return false;
  return P->q.dt == KG_F32 || P->q.dt == KG_BF16;
}

/* s[j] = scale·(q·k_j) for j in [lo, hi): four keys at a time, each its own register chain */
static AVX2 void scores(const kg_attn_plan *P, const float *q, int64_t b, int64_t hk, int64_t lo, int64_t hi,
                        float *s) {
  int64_t D = P->D;
  bool bf = P->k.dt == KG_BF16;
  float sc = (float)P->scale;
  int64_t es = P->k.es, j = lo;
  for (; j + 4 <= hi; j += 4) {
    const char *k0 = kg_attn_at(&P->k, b, hk, j), *k1 = kg_attn_at(&P->k, b, hk, j + 1);
    const char *k2 = kg_attn_at(&P->k, b, hk, j + 2), *k3 = kg_attn_at(&P->k, b, hk, j + 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += 8) {
      __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, load8(k0 + d * es, bf), a0);
      a1 = _mm256_fmadd_ps(qv, load8(k1 + d * es, bf), a1);
      a2 = _mm256_fmadd_ps(qv, load8(k2 + d * es, bf), a2);
      a3 = _mm256_fmadd_ps(qv, load8(k3 + d * es, bf), a3);
    }
    s[j] = hsum8(a0) * sc, s[j + 1] = hsum8(a1) * sc, s[j + 2] = hsum8(a2) * sc, s[j + 3] = hsum8(a3) * sc;
  }
  for (; j < hi; j++) {
    const char *k0 = kg_attn_at(&P->k, b, hk, j);
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k0 + d * es, bf), a0);
    s[j] = hsum8(a0) * sc;
  }
}

/* acc [D] = Σ_j p[j]·v_j for j in [lo, hi), 64 columns at a time in registers */
#define DV_FOR(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
static AVX2 void weighted_values(const kg_attn_plan *P, const float *p, int64_t b, int64_t hk, int64_t lo, int64_t hi,
                                 float *acc) {
  int64_t D = P->D, es = P->v.es;
  bool bf = P->v.dt == KG_BF16;
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    int64_t nv = (D - d0) / 8 < 8 ? (D - d0) / 8 : 8;
#define DV_INIT(r) __m256 c##r = _mm256_setzero_ps();
    DV_FOR(DV_INIT)
    for (int64_t j = lo; j < hi; j++) {
      const char *vr = kg_attn_at(&P->v, b, hk, j) + d0 * es;
      __m256 pj = _mm256_set1_ps(p[j]);
#define DV_FMA(r) if (nv > r) c##r = _mm256_fmadd_ps(pj, load8(vr + 8 * r * es, bf), c##r);
      DV_FOR(DV_FMA)
    }
#define DV_STORE(r) if (nv > r) _mm256_storeu_ps(acc + d0 + 8 * r, c##r);
    DV_FOR(DV_STORE)
  }
}

/* query head h, row i of batch b (kv head hk); w: [S] scores, [S] mask row, [D] query, [D] sum */
static AVX2 void decode_row(const kg_attn_plan *P, int64_t b, int64_t hk, int64_t h, int64_t i, float *w,
                            kg_attn_view *o, float *lse) {
  int64_t D = P->D, S = P->S, lo = kg_attn_key_lo(P, i), hi = kg_attn_key_hi(P, i);
  float *s = w, *mrow = s + S, *q = mrow + S, *acc = q + D;
  kg_cpu_load_f32(q, kg_attn_at(&P->q, b, h, i), P->q.dt, P->q.st[3], D);
  scores(P, q, b, hk, lo, hi, s);
  if (P->has_mask) { /* the mask's row for (b, h, i) over the visible keys */
    const kg_attn_view *mv = &P->m;
    const char *mp = mv->base + (b * mv->st[0] + h * mv->st[1] + i * mv->st[2] + lo * mv->st[3]) * mv->es;
    if (mv->dt == KG_BOOL) {
      for (int64_t j = lo; j < hi; j++) s[j] = mp[(j - lo) * mv->st[3]] ? s[j] : -INFINITY;
    } else {
      kg_cpu_load_f32(mrow, mp, mv->dt, mv->st[3], hi - lo);
      for (int64_t j = lo; j < hi; j++) s[j] += mrow[j - lo];
    }
  }
  float mx = -INFINITY, l = 0;
  for (int64_t j = lo; j < hi; j++) mx = s[j] > mx ? s[j] : mx;
  if (mx != -INFINITY) { /* else it sees no key: zeros, lse -inf */
    __m256 mv = _mm256_set1_ps(mx), sum = _mm256_setzero_ps();
    int64_t j = lo;
    for (; j + 8 <= hi; j += 8) {
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
      _mm256_storeu_ps(s + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    l = hsum8(sum);
    if (j < hi) { /* the tail through a padded vector */
      float t[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
      memcpy(t, s + j, sizeof(float) * (size_t)(hi - j));
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(t), mv));
      _mm256_storeu_ps(t, e);
      memcpy(s + j, t, sizeof(float) * (size_t)(hi - j));
      l += hsum8(e);
    }
  }
  if (l > 0) {
    weighted_values(P, s, b, hk, lo, hi, acc);
    for (int64_t d = 0; d < D; d++) acc[d] /= l;
  } else {
    memset(acc, 0, sizeof(float) * (size_t)D);
  }
  kg_cpu_store_f32((char *)kg_attn_at(o, b, h, i), o->dt, o->st[3], acc, D);
  lse[(b * P->H + h) * P->T + i] = l > 0 ? mx + logf(l) : -INFINITY;
}

bool kg_attn_fwd_decode(const kg_attn_plan *P, kg_tensor *out, float *lse) {
  if (!fits(P) || !kg_attn_avx2_available()) return false;
  int64_t G = P->H / P->Hkv, ntask = P->B * P->Hkv;
  kg_attn_view o = kg_attn_view_of(out, out->stride);
  bool ok = true;
#pragma omp parallel if (ntask > 1 && P->B * P->H * P->T * P->S * P->D > 65536)
  {
    float *buf = malloc(sizeof(float) * (size_t)(2 * P->S + 2 * P->D));
    if (!buf) ok = false; /* a race writes the same value */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < ntask; t++) {
      if (!buf) continue;
      int64_t b = t / P->Hkv, hk = t % P->Hkv; /* the group's heads in turn: its keys stay in cache */
      for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t i = 0; i < P->T; i++) decode_row(P, b, hk, h, i, buf, &o, lse);
    }
    free(buf);
  }
  return ok;
}
