/* rows_simd.h (cpu) — reductions over one contiguous float row, shared by the row-wise kernels
 * (softmax.c, norm.c, reduce.c): max with a NaN flag, sum, dot and sum of squared deviations.
 *
 * Sums keep the accuracy of the buffered kernels: float lanes over blocks of ROWS_BLOCK
 * elements, each block's total added in double (a lane adds ROWS_BLOCK/16 values before its
 * block is flushed). The AVX2+FMA versions (8 lanes, two accumulators) run when the CPU has them
 * (runtime check; KENG_NO_SIMD=1 forces the scalar loops, which the kernel lab checks too); the
 * compiler does not vectorise the scalar loops (float reductions are not reassociated). */
#ifndef KENG_CPU_ROWS_SIMD_H
#define KENG_CPU_ROWS_SIMD_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#define KG_ROWS_X86 1
#include <immintrin.h>
#endif

#define ROWS_BLOCK 256

static inline bool kg_rows_avx2(void) { return kg_cpu_avx2_fma(); }

#ifdef KG_ROWS_X86
__attribute__((target("avx2,fma"))) static inline float kg_rows_hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
__attribute__((target("avx2,fma"))) static inline float kg_rows_hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
/* elements done in *done (a multiple of 8); max (min: of -v, negated by the caller) of those,
 * *nan set when one is NaN */
__attribute__((target("avx2,fma"))) static inline float kg_rows_max8(const float *v, int64_t n, bool neg, int64_t *done,
                                                                    int *nan) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, bad = _mm256_setzero_ps(), flip = _mm256_set1_ps(neg ? -0.0f : 0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_xor_ps(_mm256_loadu_ps(v + i), flip), b = _mm256_xor_ps(_mm256_loadu_ps(v + i + 8), flip);
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_xor_ps(_mm256_loadu_ps(v + i), flip);
    m0 = _mm256_max_ps(m0, a);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  *done = i;
  *nan = _mm256_movemask_ps(bad) != 0;
  return kg_rows_hmax8(_mm256_max_ps(m0, m1));
}
/* first i (a multiple of 8 block scan) with v[i] == e (NaN: v[i] is NaN); -1 when none in the
 * 8-element blocks, *done set to the elements scanned */
__attribute__((target("avx2,fma"))) static inline int64_t kg_rows_find8(const float *v, int64_t n, float e, int64_t *done) {
  __m256 ev = _mm256_set1_ps(e);
  bool nan = e != e;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(v + i);
    int m = _mm256_movemask_ps(nan ? _mm256_cmp_ps(a, a, _CMP_UNORD_Q) : _mm256_cmp_ps(a, ev, _CMP_EQ_OQ));
    if (m) return i + __builtin_ctz((unsigned)m);
  }
  *done = i;
  return -1;
}
/* sum over one block (n <= ROWS_BLOCK) of a[i] * (b ? b[i] - m : 1) or (a[i] - m)^2 (sq) */
__attribute__((target("avx2,fma"))) static inline float kg_rows_block8(const float *a, const float *b, float m, bool sq,
                                                                      int64_t n, int64_t *done) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, mv = _mm256_set1_ps(m);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x0 = _mm256_loadu_ps(a + i), x1 = _mm256_loadu_ps(a + i + 8);
    if (sq) {
      x0 = _mm256_sub_ps(x0, mv), x1 = _mm256_sub_ps(x1, mv);
      s0 = _mm256_fmadd_ps(x0, x0, s0), s1 = _mm256_fmadd_ps(x1, x1, s1);
    } else if (b) {
      __m256 y0 = _mm256_sub_ps(_mm256_loadu_ps(b + i), mv), y1 = _mm256_sub_ps(_mm256_loadu_ps(b + i + 8), mv);
      s0 = _mm256_fmadd_ps(x0, y0, s0), s1 = _mm256_fmadd_ps(x1, y1, s1);
    } else {
      s0 = _mm256_add_ps(s0, x0), s1 = _mm256_add_ps(s1, x1);
    }
  }
  *done = i;
  return kg_rows_hsum8(_mm256_add_ps(s0, s1));
}
#endif

/* max of v[i] (min when want_min), NaN when any is NaN (-inf, +inf for min, when n = 0) */
static inline float kg_row_extreme_f32(const float *v, int64_t n, bool want_min) {
  float mx = -INFINITY;
  int nan = 0;
  int64_t i = 0;
#ifdef KG_ROWS_X86
  if (kg_rows_avx2()) mx = kg_rows_max8(v, n, want_min, &i, &nan);
#endif
  for (; i < n; i++) {
    float x = want_min ? -v[i] : v[i];
    mx = x > mx ? x : mx;
    nan |= x != x;
  }
  return nan ? NAN : want_min ? -mx : mx;
}
static inline float kg_row_max_f32(const float *v, int64_t n) { return kg_row_extreme_f32(v, n, false); }

/* first i with v[i] == e (v[i] NaN when e is), -1 when none */
static inline int64_t kg_row_find_f32(const float *v, int64_t n, float e) {
  int64_t i = 0;
#ifdef KG_ROWS_X86
  if (kg_rows_avx2()) {
    int64_t hit = kg_rows_find8(v, n, e, &i);
    if (hit >= 0) return hit;
  }
#endif
  for (; i < n; i++)
    if (e != e ? v[i] != v[i] : v[i] == e) return i;
  return -1;
}

/* one block: sum a[i] * (b ? b[i] - m : 1), or sum (a[i] - m)^2 when sq */
static inline double kg_rows_block(const float *a, const float *b, float m, bool sq, int64_t n) {
  double s = 0;
  int64_t i = 0;
#ifdef KG_ROWS_X86
  if (kg_rows_avx2()) s = kg_rows_block8(a, b, m, sq, n, &i);
#endif
  if (i == 0) { /* scalar: 8 float lanes, the same grouping idea */
    float lane[8] = {0};
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; k++) {
        float d = sq ? a[i + k] - m : a[i + k];
        lane[k] += sq ? d * d : b ? d * (b[i + k] - m) : d;
      }
    for (int k = 0; k < 8; k++) s += lane[k];
  }
  for (; i < n; i++) {
    double d = sq ? (double)(a[i] - m) : a[i];
    s += sq ? d * d : b ? d * (double)(b[i] - m) : d;
  }
  return s;
}

static inline double kg_rows_reduce(const float *a, const float *b, float m, bool sq, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i += ROWS_BLOCK) s += kg_rows_block(a + i, b ? b + i : NULL, m, sq, n - i < ROWS_BLOCK ? n - i : ROWS_BLOCK);
  return s;
}
/* sum v[i], sum a[i] b[i], sum (v[i] - m)^2; float lanes per block, blocks added in double */
static inline double kg_row_sum_f32(const float *v, int64_t n) { return kg_rows_reduce(v, NULL, 0, false, n); }
static inline double kg_row_dot_f32(const float *a, const float *b, int64_t n) { return kg_rows_reduce(a, b, 0, false, n); }
static inline double kg_row_ss_f32(const float *v, int64_t n, float m) { return kg_rows_reduce(v, NULL, m, true, n); }

#endif
