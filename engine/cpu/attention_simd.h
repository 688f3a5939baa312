/* attention_simd.h (cpu) — the AVX2 pieces the tiled attention (attention_avx2.c) and the decode
 * step (attention_decode.c) share, so that both softmaxes round alike. Include after defining
 * AVX2 (the target attribute) and <immintrin.h>. */
#ifndef KENG_CPU_ATTENTION_SIMD_H
#define KENG_CPU_ATTENTION_SIMD_H

/* e^x with the formula of attention.c's exp_f32 (x = k·ln2 + r, degree-6 Taylor in r, about
 * 2 ulp): below -87.3 (and -inf) exactly 0, NaN stays NaN (max/min pass their second operand
 * when one is NaN, so x goes second). */
static inline AVX2 __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
  __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), xc);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1 / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1 / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1 / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1 / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
}

static inline AVX2 float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

#endif
