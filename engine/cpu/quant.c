/* quant.c — CPU kernels of the int8 weight-only ops (engine/ops/quant.c, docs/quantization.md).
 *
 * Decode (a few rows of x against a big int8 weight) is bound by the weight bytes read, so the
 * GEMV kernels read each weight row once per group of 4 x rows, widen 16 (AVX-512) or 8 (AVX2)
 * int8 values to f32 in registers and FMA them into per-row accumulators; the row's scale is
 * applied once to the finished dot product (scale · Σ a·q equals Σ a·(q·scale) up to rounding).
 * Many rows (prefill, training the adapters of a quantized base) run the blocked path instead:
 * a block of weight rows is dequantized to f32 and multiplied by BLAS, so each block's widening
 * is amortised over all rows. Variants are chosen at run time (__builtin_cpu_supports) as in
 * gemm_bf16.c; tests/lab/lab_quant.c checks each against an f64 reference.
 */
#include "quant.h"

#include <keng/scalar.h>

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define KG_Q8_X86 1
#include <immintrin.h>
#endif

/* weight rows dequantized per block by the blocked path (f32 bytes: 64 * K * 4) */
#define Q8_BLOCK_ROWS 64
/* multiply-adds below which a product stays on one thread (gemm_bf16.c's threshold: below it the
 * threads' start and barrier cost more than they save, most of all on a busy machine) */
#define Q8_PAR_WORK (2 << 20)

/* ---- scalar ------------------------------------------------------------------------------- */

/* acc[r] = Σ_k a[r][k] * w[k] for nr rows of a (nr <= 4) */
static void dot_scalar(float *acc, const float *a, int64_t lda, int nr, const int8_t *w, int64_t K) {
  for (int r = 0; r < nr; r++) {
    const float *ar = a + r * lda;
    float s = 0;
    for (int64_t k = 0; k < K; k++) s += ar[k] * (float)w[k];
    acc[r] = s;
  }
}

/* ---- AVX2 + FMA ----------------------------------------------------------------------------- */

#ifdef KG_Q8_X86
bool kg_cpu_q8_avx2(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
  }
  return have;
}

__attribute__((target("avx2,fma"))) static float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void dot_avx2(float *acc, const float *a, int64_t lda, int nr,
                                                          const int8_t *w, int64_t K) {
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    long long bits;
    memcpy(&bits, w + k, 8);
    __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bits)));
    for (int r = 0; r < nr; r++) s[r] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + k), wv, s[r]);
  }
  for (int r = 0; r < nr; r++) {
    float t = hsum256(s[r]);
    for (int64_t j = k; j < K; j++) t += a[r * lda + j] * (float)w[j];
    acc[r] = t;
  }
}

/* decode (one x row) against 4 weight rows: 8 accumulators in named registers, as row_avx512 */
__attribute__((target("avx2,fma"))) static void tile_avx2(float *acc, const float *a, int64_t lda, int nr,
                                                           const int8_t *w, int64_t ldw, int64_t K) {
  if (nr > 1) { /* several x rows: one weight row at a time */
    for (int j = 0; j < 4; j++) {
      float t[4];
      dot_avx2(t, a, lda, nr, w + j * ldw, K);
      for (int r = 0; r < nr; r++) acc[r * 4 + j] = t[r];
    }
    return;
  }
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
  const int8_t *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
#define Q8_W8(p, k) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((p) + (k)))))
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 x0 = _mm256_loadu_ps(a + k), x1 = _mm256_loadu_ps(a + k + 8);
    s0 = _mm256_fmadd_ps(x0, Q8_W8(w0, k), s0), t0 = _mm256_fmadd_ps(x1, Q8_W8(w0, k + 8), t0);
    s1 = _mm256_fmadd_ps(x0, Q8_W8(w1, k), s1), t1 = _mm256_fmadd_ps(x1, Q8_W8(w1, k + 8), t1);
    s2 = _mm256_fmadd_ps(x0, Q8_W8(w2, k), s2), t2 = _mm256_fmadd_ps(x1, Q8_W8(w2, k + 8), t2);
    s3 = _mm256_fmadd_ps(x0, Q8_W8(w3, k), s3), t3 = _mm256_fmadd_ps(x1, Q8_W8(w3, k + 8), t3);
  }
#undef Q8_W8
  float r0 = hsum256(_mm256_add_ps(s0, t0)), r1 = hsum256(_mm256_add_ps(s1, t1));
  float r2 = hsum256(_mm256_add_ps(s2, t2)), r3 = hsum256(_mm256_add_ps(s3, t3));
  for (; k < K; k++) {
    float x = a[k];
    r0 += x * (float)w0[k], r1 += x * (float)w1[k], r2 += x * (float)w2[k], r3 += x * (float)w3[k];
  }
  acc[0] = r0, acc[1] = r1, acc[2] = r2, acc[3] = r3;
}

/* ---- AVX-512 -------------------------------------------------------------------------------- */

bool kg_cpu_q8_avx512(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    /* F16C (the int4 block scales) comes with every AVX-512 CPU; clang-14 (the fuzz build) does
     * not know "f16c" as a __builtin_cpu_supports feature, so it is not asked for by name */
    have = kg_cpu_q8_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl")
               ? 1
               : 0;
  }
  return have;
}

#define Q8_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* a tile of nr x rows (<= 4) by 4 weight rows: 16 independent FMA chains, each x vector loaded
 * once for 4 weight rows and each widened weight vector used for nr x rows */
/* decode (one x row): 4 weight rows, 2 accumulators each, full vectors in the loop, named
 * registers (no arrays indexed at run time, which the compiler may keep in memory) */
Q8_AVX512 static void row_avx512(float *acc, const float *a, const int8_t *w, int64_t ldw, int64_t K) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
  const int8_t *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
#define Q8_W(p, k) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((p) + (k)))))
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512 x0 = _mm512_loadu_ps(a + k), x1 = _mm512_loadu_ps(a + k + 16);
    s0 = _mm512_fmadd_ps(x0, Q8_W(w0, k), s0), t0 = _mm512_fmadd_ps(x1, Q8_W(w0, k + 16), t0);
    s1 = _mm512_fmadd_ps(x0, Q8_W(w1, k), s1), t1 = _mm512_fmadd_ps(x1, Q8_W(w1, k + 16), t1);
    s2 = _mm512_fmadd_ps(x0, Q8_W(w2, k), s2), t2 = _mm512_fmadd_ps(x1, Q8_W(w2, k + 16), t2);
    s3 = _mm512_fmadd_ps(x0, Q8_W(w3, k), s3), t3 = _mm512_fmadd_ps(x1, Q8_W(w3, k + 16), t3);
  }
#undef Q8_W
  for (; k < K; k += 16) { /* the tail, masked */
    __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
    __m512 x0 = _mm512_maskz_loadu_ps(m, a + k);
#define Q8_WM(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (p) + k)))
    s0 = _mm512_fmadd_ps(x0, Q8_WM(w0), s0), s1 = _mm512_fmadd_ps(x0, Q8_WM(w1), s1);
    s2 = _mm512_fmadd_ps(x0, Q8_WM(w2), s2), s3 = _mm512_fmadd_ps(x0, Q8_WM(w3), s3);
#undef Q8_WM
  }
  acc[0] = _mm512_reduce_add_ps(_mm512_add_ps(s0, t0)), acc[1] = _mm512_reduce_add_ps(_mm512_add_ps(s1, t1));
  acc[2] = _mm512_reduce_add_ps(_mm512_add_ps(s2, t2)), acc[3] = _mm512_reduce_add_ps(_mm512_add_ps(s3, t3));
}

Q8_AVX512 static void tile_avx512(float *acc, const float *a, int64_t lda, int nr, const int8_t *w, int64_t ldw,
                                  int64_t K) {
  if (nr == 1) {
    row_avx512(acc, a, w, ldw, K);
    return;
  }
  __m512 s[4][4];
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < 4; j++) s[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1); /* the tail, masked */
    __m512 wv[4];
    for (int j = 0; j < 4; j++)
      wv[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, w + j * ldw + k)));
    for (int r = 0; r < 4; r++) {
      if (r >= nr) break;
      __m512 xv = _mm512_maskz_loadu_ps(m, a + r * lda + k);
      for (int j = 0; j < 4; j++) s[r][j] = _mm512_fmadd_ps(xv, wv[j], s[r][j]);
    }
  }
  for (int r = 0; r < nr; r++)
    for (int j = 0; j < 4; j++) acc[r * 4 + j] = _mm512_reduce_add_ps(s[r][j]);
}

/* one weight row (the last M % 4): two accumulators per x row against the FMA latency */
Q8_AVX512 static void dot_avx512(float *acc, const float *a, int64_t lda, int nr, const int8_t *w, int64_t K) {
  __m512 s[4], t[4];
  for (int r = 0; r < 4; r++) s[r] = t[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + k))));
    __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + k + 16))));
    for (int r = 0; r < nr; r++) {
      s[r] = _mm512_fmadd_ps(_mm512_loadu_ps(a + r * lda + k), w0, s[r]);
      t[r] = _mm512_fmadd_ps(_mm512_loadu_ps(a + r * lda + k + 16), w1, t[r]);
    }
  }
  for (; k < K; k += 16) { /* the tail, masked */
    __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
    __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, w + k)));
    for (int r = 0; r < nr; r++) s[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + r * lda + k), wv, s[r]);
  }
  for (int r = 0; r < nr; r++) acc[r] = _mm512_reduce_add_ps(_mm512_add_ps(s[r], t[r]));
}
#else
bool kg_cpu_q8_avx2(void) { return false; }
bool kg_cpu_q8_avx512(void) { return false; }
#endif

/* ---- the product ------------------------------------------------------------------------------ */

typedef void (*dot_fn)(float *acc, const float *a, int64_t lda, int nr, const int8_t *w, int64_t K);

typedef void (*tile_fn)(float *acc, const float *a, int64_t lda, int nr, const int8_t *w, int64_t ldw, int64_t K);

/* tile (may be NULL) takes 4 weight rows at a time, dot the rest */
static void gemv(float *out, int64_t ldo, const float *a, int64_t lda, const int8_t *w, int64_t ldw,
                 const float *scale, const float *bias, int64_t N, int64_t M, int64_t K, dot_fn dot, tile_fn tile,
                 int nt) {
  int64_t M4 = tile ? M / 4 * 4 : 0, ngroups = M4 / 4 + (M - M4);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t g = 0; g < ngroups; g++) {
    float acc[16];
    int64_t m = g < M4 / 4 ? g * 4 : M4 + (g - M4 / 4);
    int mr = g < M4 / 4 ? 4 : 1;
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
      int nr = N - n0 < 4 ? (int)(N - n0) : 4;
      if (mr == 4) tile(acc, a + n0 * lda, lda, nr, w + m * ldw, ldw, K);
      else dot(acc, a + n0 * lda, lda, nr, w + m * ldw, K);
      for (int r = 0; r < nr; r++)
        for (int j = 0; j < mr; j++)
          out[(n0 + r) * ldo + m + j] = acc[r * mr + j] * scale[m + j] + (bias ? bias[m + j] : 0.f);
    }
  }
}

/* weight blocks shared among the threads, one dequantized block buffer each, one single-threaded
 * sgemm per block (as matmul.c's threaded_gemm splits a product) */
static kg_status blocked(float *out, int64_t ldo, const float *a, int64_t lda, const int8_t *w, int64_t ldw,
                         const float *scale, const float *bias, int64_t N, int64_t M, int64_t K, int nt) {
  size_t per = (size_t)Q8_BLOCK_ROWS * (size_t)K * 4, bytes;
  char *deqs = kg_cpu_alloc(per * (size_t)nt, &bytes);
  if (!deqs) return kg_error(KG_ERR_OOM, "linear_q8", "out of memory dequantizing a weight block");
  int64_t nblocks = (M + Q8_BLOCK_ROWS - 1) / Q8_BLOCK_ROWS;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    float *deq = (float *)(deqs + per * (size_t)omp_get_thread_num());
    int64_t m0 = blk * Q8_BLOCK_ROWS, mb = M - m0 < Q8_BLOCK_ROWS ? M - m0 : Q8_BLOCK_ROWS;
    for (int64_t i = 0; i < mb; i++)
      for (int64_t k = 0; k < K; k++) deq[i * K + k] = (float)w[(m0 + i) * ldw + k] * scale[m0 + i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)mb, (int)K, 1.f, a, (int)lda, deq, (int)K, 0.f,
                out + m0, (int)ldo);
    if (bias)
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < mb; i++) out[n * ldo + m0 + i] += bias[m0 + i];
  }
  kg_cpu_free(deqs, bytes);
  return KG_OK;
}

kg_status kg_cpu_gemm_q8(float *out, int64_t ldo, const float *a, int64_t lda, const int8_t *w, int64_t ldw,
                         const float *scale, const float *bias, int64_t N, int64_t M, int64_t K, kg_q8_variant v,
                         int threads) {
  if (N <= 0 || M <= 0) return KG_OK;
  int nt = threads > 0 ? threads : (double)N * (double)M * (double)K >= Q8_PAR_WORK ? kg_num_threads() : 1;
  if (K == 0) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t m = 0; m < M; m++) out[n * ldo + m] = bias ? bias[m] : 0.f;
    return KG_OK;
  }
  if (v == KG_Q8_BLOCKED || (v == KG_Q8_AUTO && N > KG_Q8_GEMV_ROWS))
    return blocked(out, ldo, a, lda, w, ldw, scale, bias, N, M, K, nt);
  dot_fn dot = dot_scalar;
  tile_fn tile = NULL;
#ifdef KG_Q8_X86
  if (v == KG_Q8_AVX512 || (v == KG_Q8_AUTO && kg_cpu_q8_avx512())) dot = dot_avx512, tile = tile_avx512;
  else if (v == KG_Q8_AVX2 || (v == KG_Q8_AUTO && kg_cpu_q8_avx2())) dot = dot_avx2, tile = tile_avx2;
#endif
  gemv(out, ldo, a, lda, w, ldw, scale, bias, N, M, K, dot, tile, nt);
  return KG_OK;
}

void kg_cpu_quantize_q8_row(int8_t *q, float *scale, const double *w, int64_t K) {
  double amax = 0;
  for (int64_t k = 0; k < K; k++) amax = fmax(amax, fabs(w[k]));
  float s = (float)(amax / 127.0);
  *scale = s;
  for (int64_t k = 0; k < K; k++) {
    double v = s > 0 ? nearbyint(w[k] / (double)s) : 0; /* the default rounding mode: nearest even */
    q[k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
  }
}

/* ---- int4 (Q4_0 layout) ------------------------------------------------------------------------ */

void kg_cpu_quantize_q4_row(uint8_t *q, uint16_t *scale, const double *w, int64_t K) {
  for (int64_t b = 0; b < K / KG_Q4_BLOCK; b++) {
    const double *x = w + b * KG_Q4_BLOCK;
    double m = 0;
    for (int j = 0; j < KG_Q4_BLOCK; j++)
      if (fabs(x[j]) > fabs(m)) m = x[j];
    uint16_t d16 = kg_f32_to_f16((float)(m / -8.0));
    double d = kg_f16_to_f32(d16);
    scale[b] = d16;
    uint8_t *qb = q + b * (KG_Q4_BLOCK / 2);
    for (int j = 0; j < KG_Q4_BLOCK / 2; j++) {
      int c[2];
      for (int h = 0; h < 2; h++) {
        double v = d != 0 ? nearbyint(x[j + 16 * h] / d) + 8 : 8;
        c[h] = v < 0 ? 0 : v > 15 ? 15 : (int)v;
      }
      qb[j] = (uint8_t)(c[0] | c[1] << 4);
    }
  }
}

void kg_cpu_dequantize_q4_row(float *out, const uint8_t *q, const uint16_t *scale, int64_t K) {
  for (int64_t b = 0; b < K / KG_Q4_BLOCK; b++) {
    float d = kg_f16_to_f32(scale[b]);
    const uint8_t *qb = q + b * (KG_Q4_BLOCK / 2);
    for (int j = 0; j < KG_Q4_BLOCK / 2; j++) {
      out[b * KG_Q4_BLOCK + j] = (float)((qb[j] & 15) - 8) * d;
      out[b * KG_Q4_BLOCK + j + 16] = (float)((qb[j] >> 4) - 8) * d;
    }
  }
}

typedef void (*dot4_fn)(float *acc, const float *a, int64_t lda, int nr, const uint8_t *w, const uint16_t *s,
                        int64_t K);

static void dot4_scalar(float *acc, const float *a, int64_t lda, int nr, const uint8_t *w, const uint16_t *s,
                        int64_t K) {
  float deq[KG_Q4_BLOCK];
  for (int r = 0; r < nr; r++) acc[r] = 0;
  for (int64_t b = 0; b < K / KG_Q4_BLOCK; b++) {
    kg_cpu_dequantize_q4_row(deq, w + b * (KG_Q4_BLOCK / 2), s + b, KG_Q4_BLOCK);
    for (int r = 0; r < nr; r++) {
      const float *ar = a + r * lda + b * KG_Q4_BLOCK;
      float t = 0;
      for (int j = 0; j < KG_Q4_BLOCK; j++) t += ar[j] * deq[j];
      acc[r] += t;
    }
  }
}

#ifdef KG_Q8_X86
/* per block: the 16 bytes widened to 16 lanes; vpermps looks each lane's low nibble up in a
 * 16-entry table of the block's values (code - 8) · d, and the high nibble after a shift — the
 * table replaces the mask, subtract, widening and scale multiply of each code (about 9
 * instructions per 32 weights instead of 15) */
Q8_AVX512 static void dot4_avx512(float *acc, const float *a, int64_t lda, int nr, const uint8_t *w,
                                  const uint16_t *s, int64_t K) {
  __m512 sum[4];
  for (int r = 0; r < 4; r++) sum[r] = _mm512_setzero_ps();
  const __m512 base = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t b = 0; b < K / KG_Q4_BLOCK; b++) {
    __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + b * (KG_Q4_BLOCK / 2))));
    __m512 tab = _mm512_mul_ps(base, _mm512_set1_ps(_cvtsh_ss(s[b])));
    __m512 wl = _mm512_permutexvar_ps(codes, tab); /* uses the index's low 4 bits */
    __m512 wh = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), tab);
    for (int r = 0; r < nr; r++) {
      const float *ar = a + r * lda + b * KG_Q4_BLOCK;
      sum[r] = _mm512_fmadd_ps(_mm512_loadu_ps(ar), wl, sum[r]);
      sum[r] = _mm512_fmadd_ps(_mm512_loadu_ps(ar + 16), wh, sum[r]);
    }
  }
  for (int r = 0; r < nr; r++) acc[r] = _mm512_reduce_add_ps(sum[r]);
}
#endif

#ifdef KG_Q8_X86
/* AVX2 + FMA: per block, the low and high nibbles widened to 4 x 8 f32 codes minus 8, one FMA
 * chain per x row over the block, then the block's scale applied once: d · Σ x·(q - 8). The scale
 * is converted in C (F16C is not asked for: clang-14 does not know it as a cpu feature name) */
__attribute__((target("avx2,fma"))) static void dot4_avx2(float *acc, const float *a, int64_t lda, int nr,
                                                          const uint8_t *w, const uint16_t *s, int64_t K) {
  __m256 sum[4];
  for (int r = 0; r < 4; r++) sum[r] = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256 eight = _mm256_set1_ps(8.f);
#define Q4_W(v) _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), eight)
  for (int64_t b = 0; b < K / KG_Q4_BLOCK; b++) {
    __m128i q = _mm_loadu_si128((const __m128i *)(w + b * (KG_Q4_BLOCK / 2)));
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    __m256 w0 = Q4_W(lo), w1 = Q4_W(_mm_srli_si128(lo, 8)); /* elements 0..7, 8..15 */
    __m256 w2 = Q4_W(hi), w3 = Q4_W(_mm_srli_si128(hi, 8)); /* 16..23, 24..31 */
    __m256 d = _mm256_set1_ps(kg_f16_to_f32(s[b]));
    for (int r = 0; r < nr; r++) {
      const float *ar = a + r * lda + b * KG_Q4_BLOCK;
      __m256 t = _mm256_mul_ps(_mm256_loadu_ps(ar), w0);
      t = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 8), w1, t);
      t = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 16), w2, t);
      t = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 24), w3, t);
      sum[r] = _mm256_fmadd_ps(t, d, sum[r]);
    }
  }
#undef Q4_W
  for (int r = 0; r < nr; r++) acc[r] = hsum256(sum[r]);
}
#endif

kg_status kg_cpu_gemm_q4(float *out, int64_t ldo, const float *a, int64_t lda, const uint8_t *w, int64_t ldw,
                         const uint16_t *scale, int64_t lds, const float *bias, int64_t N, int64_t M, int64_t K,
                         kg_q8_variant v, int threads) {
  if (N <= 0 || M <= 0) return KG_OK;
  int nt = threads > 0 ? threads : (double)N * (double)M * (double)K >= Q8_PAR_WORK ? kg_num_threads() : 1;
  if (v == KG_Q8_BLOCKED || (v == KG_Q8_AUTO && N > KG_Q8_GEMV_ROWS)) {
    size_t per = (size_t)Q8_BLOCK_ROWS * (size_t)(K > 0 ? K : 1) * 4, bytes;
    char *deqs = kg_cpu_alloc(per * (size_t)nt, &bytes);
    if (!deqs) return kg_error(KG_ERR_OOM, "linear_q4", "out of memory dequantizing a weight block");
    int64_t nblocks = (M + Q8_BLOCK_ROWS - 1) / Q8_BLOCK_ROWS;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t blk = 0; blk < nblocks; blk++) {
      float *deq = (float *)(deqs + per * (size_t)omp_get_thread_num());
      int64_t m0 = blk * Q8_BLOCK_ROWS, mb = M - m0 < Q8_BLOCK_ROWS ? M - m0 : Q8_BLOCK_ROWS;
      for (int64_t i = 0; i < mb; i++) kg_cpu_dequantize_q4_row(deq + i * K, w + (m0 + i) * ldw, scale + (m0 + i) * lds, K);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)mb, (int)K, 1.f, a, (int)lda, deq, (int)K,
                  0.f, out + m0, (int)ldo);
      if (bias)
        for (int64_t n = 0; n < N; n++)
          for (int64_t i = 0; i < mb; i++) out[n * ldo + m0 + i] += bias[m0 + i];
    }
    kg_cpu_free(deqs, bytes);
    return KG_OK;
  }
  dot4_fn dot = dot4_scalar;
#ifdef KG_Q8_X86
  if (v == KG_Q8_AVX512 || (v == KG_Q8_AUTO && kg_cpu_q8_avx512())) dot = dot4_avx512;
  else if (v == KG_Q8_AVX2 || (v == KG_Q8_AUTO && kg_cpu_q8_avx2())) dot = dot4_avx2;
#endif
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t m = 0; m < M; m++) {
    float acc[4];
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
      int nr = N - n0 < 4 ? (int)(N - n0) : 4;
      dot(acc, a + n0 * lda, lda, nr, w + m * ldw, scale + m * lds, K);
      for (int r = 0; r < nr; r++) out[(n0 + r) * ldo + m] = acc[r] + (bias ? bias[m] : 0.f);
    }
  }
  return KG_OK;
}

/* ---- op kernels ------------------------------------------------------------------------------ */

/* in: x [N, K] (rows of any stride), wq int8 [M, K] and scale f32 [M] (contiguous, from the
 * front-end), bias [M] or absent; out: y [N, M] contiguous */
kg_status kg_cpu_linear_q8(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *wq = c->in[1], *sc = c->in[2], *b = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *y = c->out[0];
  int64_t N = x->shape[0], K = x->shape[1], M = wq->shape[0];
  const char *xp = kg_data(x);
  const int8_t *w = kg_data(wq);
  const float *scale = kg_data(sc);
  int es = kg_dtype_info[x->dtype].size;
  if (y->dtype == KG_F64) { /* exact reference path (gradchecks): f64 sums, scalar */
    double *yo = kg_data(y), *xr = malloc((size_t)(K > 0 ? K : 1) * 8);
    if (!xr) return kg_error(KG_ERR_OOM, "linear_q8", "out of memory");
    for (int64_t n = 0; n < N; n++) {
      kg_cpu_load_f64(xr, xp + n * x->stride[0] * es, x->dtype, x->stride[1], K);
      for (int64_t m = 0; m < M; m++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += xr[k] * (double)w[m * K + k];
        yo[n * M + m] = s * (double)scale[m] + (b ? kg_get_flat(b, m) : 0.0);
      }
    }
    free(xr);
    return KG_OK;
  }
  size_t abytes = 0, obytes = 0, bbytes = 0;
  float *a = kg_cpu_alloc((size_t)(N * K > 0 ? N * K : 1) * 4, &abytes);
  float *o = y->dtype == KG_F32 ? kg_data(y) : kg_cpu_alloc((size_t)(N * M > 0 ? N * M : 1) * 4, &obytes);
  float *bias = b ? kg_cpu_alloc((size_t)M * 4, &bbytes) : NULL;
  kg_status st = KG_OK;
  if (!a || !o || (b && !bias)) st = kg_error(KG_ERR_OOM, "linear_q8", "out of memory converting x");
  if (!st) {
    for (int64_t n = 0; n < N; n++) kg_cpu_load_f32(a + n * K, xp + n * x->stride[0] * es, x->dtype, x->stride[1], K);
    if (b) kg_cpu_load_f32(bias, kg_data(b), b->dtype, b->stride[0], M);
    st = kg_cpu_gemm_q8(o, M, a, K, w, K, scale, bias, N, M, K, KG_Q8_AUTO, 0);
    if (!st && y->dtype != KG_F32) kg_cpu_store_f32(kg_data(y), y->dtype, 1, o, N * M);
  }
  if (a) kg_cpu_free(a, abytes);
  if (o && y->dtype != KG_F32) kg_cpu_free(o, obytes);
  if (bias) kg_cpu_free(bias, bbytes);
  return st;
}

/* in: w [M, K] float (any strides); out: q int8 [M, K], scale f32 [M] (contiguous) */
kg_status kg_cpu_quantize_q8(const kg_op_call *c) {
  const kg_tensor *w = c->in[0];
  int8_t *q = kg_data(c->out[0]);
  float *scale = kg_data(c->out[1]);
  int64_t M = w->shape[0], K = w->shape[1];
  int es = kg_dtype_info[w->dtype].size;
  double *row = malloc((size_t)(K > 0 ? K : 1) * 8);
  if (!row) return kg_error(KG_ERR_OOM, "quantize_q8", "out of memory");
  for (int64_t m = 0; m < M; m++) {
    kg_cpu_load_f64(row, (const char *)kg_data(w) + m * w->stride[0] * es, w->dtype, w->stride[1], K);
    kg_cpu_quantize_q8_row(q + m * K, scale + m, row, K);
  }
  free(row);
  return KG_OK;
}

/* in: x [N, K] (rows of any stride), wq u8 [M, K / 2], scale f16 [M, K / 32] (contiguous), bias;
 * out: y [N, M] contiguous */
kg_status kg_cpu_linear_q4(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *wq = c->in[1], *sc = c->in[2], *b = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *y = c->out[0];
  int64_t N = x->shape[0], K = x->shape[1], M = wq->shape[0];
  const char *xp = kg_data(x);
  int es = kg_dtype_info[x->dtype].size;
  if (y->dtype == KG_F64) { /* exact reference path (gradchecks): the dequantized values are exact in f32 */
    double *yo = kg_data(y), *xr = malloc((size_t)(K > 0 ? K : 1) * 8);
    float *wr = malloc((size_t)(K > 0 ? K : 1) * 4);
    if (!xr || !wr) return free(xr), free(wr), kg_error(KG_ERR_OOM, "linear_q4", "out of memory");
    for (int64_t m = 0; m < M; m++) {
      kg_cpu_dequantize_q4_row(wr, (const uint8_t *)kg_data(wq) + m * (K / 2),
                               (const uint16_t *)kg_data(sc) + m * (K / KG_Q4_BLOCK), K);
      for (int64_t n = 0; n < N; n++) {
        kg_cpu_load_f64(xr, xp + n * x->stride[0] * es, x->dtype, x->stride[1], K);
        double t = 0;
        for (int64_t k = 0; k < K; k++) t += xr[k] * (double)wr[k];
        yo[n * M + m] = t + (b ? kg_get_flat(b, m) : 0.0);
      }
    }
    free(xr), free(wr);
    return KG_OK;
  }
  size_t abytes = 0, obytes = 0, bbytes = 0;
  float *a = kg_cpu_alloc((size_t)(N * K > 0 ? N * K : 1) * 4, &abytes);
  float *o = y->dtype == KG_F32 ? kg_data(y) : kg_cpu_alloc((size_t)(N * M > 0 ? N * M : 1) * 4, &obytes);
  float *bias = b ? kg_cpu_alloc((size_t)M * 4, &bbytes) : NULL;
  kg_status st = KG_OK;
  if (!a || !o || (b && !bias)) st = kg_error(KG_ERR_OOM, "linear_q4", "out of memory converting x");
  if (!st) {
    for (int64_t n = 0; n < N; n++) kg_cpu_load_f32(a + n * K, xp + n * x->stride[0] * es, x->dtype, x->stride[1], K);
    if (b) kg_cpu_load_f32(bias, kg_data(b), b->dtype, b->stride[0], M);
    st = kg_cpu_gemm_q4(o, M, a, K, kg_data(wq), K / 2, kg_data(sc), K / KG_Q4_BLOCK, bias, N, M, K, KG_Q8_AUTO, 0);
    if (!st && y->dtype != KG_F32) kg_cpu_store_f32(kg_data(y), y->dtype, 1, o, N * M);
  }
  if (a) kg_cpu_free(a, abytes);
  if (o && y->dtype != KG_F32) kg_cpu_free(o, obytes);
  if (bias) kg_cpu_free(bias, bbytes);
  return st;
}

/* in: w [M, K] float (any strides); out: q u8 [M, K / 2], scale f16 [M, K / 32] */
kg_status kg_cpu_quantize_q4(const kg_op_call *c) {
  const kg_tensor *w = c->in[0];
  uint8_t *q = kg_data(c->out[0]);
  uint16_t *scale = kg_data(c->out[1]);
  int64_t M = w->shape[0], K = w->shape[1];
  int es = kg_dtype_info[w->dtype].size;
  double *row = malloc((size_t)(K > 0 ? K : 1) * 8);
  if (!row) return kg_error(KG_ERR_OOM, "quantize_q4", "out of memory");
  for (int64_t m = 0; m < M; m++) {
    kg_cpu_load_f64(row, (const char *)kg_data(w) + m * w->stride[0] * es, w->dtype, w->stride[1], K);
    kg_cpu_quantize_q4_row(q + m * (K / 2), scale + m * (K / KG_Q4_BLOCK), row, K);
  }
  free(row);
  return KG_OK;
}

/* in: q u8 [M, K / 2], scale f16 [M, K / 32] (contiguous); out: w [M, K] (float dtype, contiguous) */
kg_status kg_cpu_dequantize_q4(const kg_op_call *c) {
  const kg_tensor *q = c->in[0];
  kg_tensor *w = c->out[0];
  int64_t M = w->shape[0], K = w->shape[1];
  float *row = malloc((size_t)(K > 0 ? K : 1) * 4);
  if (!row) return kg_error(KG_ERR_OOM, "dequantize_q4", "out of memory");
  int es = kg_dtype_info[w->dtype].size;
  for (int64_t m = 0; m < M; m++) {
    kg_cpu_dequantize_q4_row(row, (const uint8_t *)kg_data(q) + m * (K / 2),
                             (const uint16_t *)kg_data(c->in[1]) + m * (K / KG_Q4_BLOCK), K);
    kg_cpu_store_f32((char *)kg_data(w) + m * K * es, w->dtype, 1, row, K);
  }
  free(row);
  return KG_OK;
}
