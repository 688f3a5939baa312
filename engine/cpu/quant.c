/* quant.c — CPU kernels of the quantized weight-only ops (engine/ops/quant.c, the formats in
 * engine/ops/quant_format.h, docs/quantization.md).
 *
 * Decode (a few rows of x against a big quantized weight) is bound by the weight bytes read, so
 * the GEMV kernels read each weight row once per x row from memory (later x rows find it in L1)
 * and decode it in registers. Two arithmetics:
 *
 *   - int8 x (the default where the CPU has AVX-512 VNNI, keng.backends.quant_activations): each
 *     x row is quantized per block of 32 to int8 (scale absmax / 127, as llama.cpp quantizes the
 *     activations of its Q8_0 / Q4_0 dot products), the block dot products are exact integer sums
 *     (vpdpbusd: 64 unsigned x signed byte products a instruction, summed 4 at a time into 16
 *     int32 lanes) and each lane's sum is scaled once, in f32, by x's block scale (times the
 *     weight's block scale). vpdpbusd takes one unsigned operand: int8 weights are read with their
 *     sign bit flipped (w + 128, unsigned) and each lane starts at -128 · Σ x of its 4 bytes; Q4_0
 *     codes are unsigned already (q in 0..15 for q - 8) and the lane starts at -8 · Σ x.
 *   - f32 x (the reference arithmetic; other CPUs): the weights are widened to f32 and FMA'd.
 *
 * Many rows (prefill, training adapters on a quantized base) run the blocked path instead: a
 * block of weight rows is dequantized to f32 and multiplied by BLAS, so each block's decoding is
 * amortised over all rows. Variants are chosen at run time (__builtin_cpu_supports) as in
 * gemm_bf16.c; tests/lab/lab_quant.c checks each against an f64 reference.
 */
#include "quant.h"

#include <keng/ops_api.h>
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

/* the first scale of weight row m */
static const void *scale_row(const kg_qweight *w, int64_t m) {
  return w->fmt == KG_QF_Q8 ? (const void *)((const float *)w->scale + m)
                            : (const void *)((const uint16_t *)w->scale + m * w->lds);
}

/* ---- formats: quantize, dequantize ------------------------------------------------------------ */

void kg_cpu_quantize_q8_row(int8_t *q, float *scale, const double *w, int64_t K) {
  double amax = 0;
  for (int64_t k = 0; k < K; k++) amax = fmax(amax, fabs(w[k]));
  float s = (float)(amax / 127.0);
  *scale = s;
  for (int64_t k = 0; k < K; k++) q[k] = kg_qf_q8_code(w[k], s);
}

void kg_cpu_quantize_q4_row(uint8_t *q, uint16_t *scale, const double *w, int64_t K) {
  for (int64_t b = 0; b < K / KG_QF_BLOCK; b++)
    kg_qf_q4_block(q + b * (KG_QF_BLOCK / 2), scale + b, w + b * KG_QF_BLOCK);
}

void kg_cpu_dequantize_row(float *out, kg_qfmt fmt, const uint8_t *q, const void *scale, int64_t K) {
  for (int64_t k0 = 0; k0 < K; k0 += KG_QF_BLOCK) {
    float d = kg_qf_scale(fmt, scale, k0);
    int64_t n = K - k0 < KG_QF_BLOCK ? K - k0 : KG_QF_BLOCK;
    for (int64_t j = 0; j < n; j++) out[k0 + j] = (float)kg_qf_code(fmt, q, k0 + j) * d;
  }
}

/* ---- f32 x: scalar ------------------------------------------------------------------------------ */

/* acc[r] = Σ_k a[r][k] · W[m][k] for nr rows of a (nr <= 4); a Q8 row's scale is left to the
 * caller (applied once to the finished sum), the block scales of Q8_0 / Q4_0 are applied here */
static void row_scalar(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int64_t K) {
  const uint8_t *q = w->q + m * w->ldq;
  const void *s = scale_row(w, m);
  for (int r = 0; r < nr; r++) acc[r] = 0;
  for (int64_t k0 = 0; k0 < K; k0 += KG_QF_BLOCK) {
    float c[KG_QF_BLOCK], d = w->fmt == KG_QF_Q8 ? 1.f : kg_qf_scale(w->fmt, s, k0);
    int64_t n = K - k0 < KG_QF_BLOCK ? K - k0 : KG_QF_BLOCK;
    for (int64_t j = 0; j < n; j++) c[j] = (float)kg_qf_code(w->fmt, q, k0 + j);
    for (int r = 0; r < nr; r++) {
      float t = 0;
      for (int64_t j = 0; j < n; j++) t += a[r * lda + k0 + j] * c[j];
      acc[r] += t * d;
    }
  }
}

/* ---- AVX2 + FMA ----------------------------------------------------------------------------- */

#ifdef KG_Q8_X86
/* the CPU's features are read once (cpu_*); KENG_NO_SIMD=1 (kg_cpu_simd, read each call: the labs
 * switch it) turns every vector kernel off (kg_cpu_q8_*) */
static bool cpu_avx2(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
  }
  return have;
}

bool kg_cpu_q8_avx2(void) { return cpu_avx2() && kg_cpu_simd() > 0; }

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

static bool cpu_avx512(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    /* F16C (the int4 block scales) comes with every AVX-512 CPU; clang-14 (the fuzz build) does
     * not know "f16c" as a __builtin_cpu_supports feature, so it is not asked for by name */
    have = cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl")
               ? 1
               : 0;
  }
  return have;
}

bool kg_cpu_q8_avx512(void) { return cpu_avx512() && kg_cpu_simd() > 0; }

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

#ifdef KG_Q8_X86
/* Q8_0 with f32 x: per block of 32, the codes widened to f32 and FMA'd into a block sum per x
 * row, which the block's f16 scale then multiplies into the row's sum (AVX-512: 2 × 16 lanes;
 * AVX2: 4 × 8, the scale converted in C as dot4_avx2 does) */
Q8_AVX512 static void dot80_avx512(float *acc, const float *a, int64_t lda, int nr, const int8_t *w,
                                   const uint16_t *s, int64_t K) {
  __m512 sum[4];
  for (int r = 0; r < 4; r++) sum[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < K / KG_QF_BLOCK; b++) {
    const int8_t *wb = w + b * KG_QF_BLOCK;
    __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)wb)));
    __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wb + 16))));
    __m512 d = _mm512_set1_ps(_cvtsh_ss(s[b]));
    for (int r = 0; r < nr; r++) {
      const float *ar = a + r * lda + b * KG_QF_BLOCK;
      __m512 t = _mm512_mul_ps(_mm512_loadu_ps(ar), w0);
      sum[r] = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(ar + 16), w1, t), d, sum[r]);
    }
  }
  for (int r = 0; r < nr; r++) acc[r] = _mm512_reduce_add_ps(sum[r]);
}

__attribute__((target("avx2,fma"))) static void dot80_avx2(float *acc, const float *a, int64_t lda, int nr,
                                                           const int8_t *w, const uint16_t *s, int64_t K) {
  __m256 sum[4];
  for (int r = 0; r < 4; r++) sum[r] = _mm256_setzero_ps();
#define Q80_W(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
  for (int64_t b = 0; b < K / KG_QF_BLOCK; b++) {
    const int8_t *wb = w + b * KG_QF_BLOCK;
    __m256 w0 = Q80_W(wb), w1 = Q80_W(wb + 8), w2 = Q80_W(wb + 16), w3 = Q80_W(wb + 24);
    __m256 d = _mm256_set1_ps(kg_f16_to_f32(s[b]));
    for (int r = 0; r < nr; r++) {
      const float *ar = a + r * lda + b * KG_QF_BLOCK;
      __m256 t = _mm256_mul_ps(_mm256_loadu_ps(ar), w0);
      t = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 8), w1, t);
      t = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 16), w2, t);
      t = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 24), w3, t);
      sum[r] = _mm256_fmadd_ps(t, d, sum[r]);
    }
  }
#undef Q80_W
  for (int r = 0; r < nr; r++) acc[r] = hsum256(sum[r]);
}
#endif

/* ---- int8 x ------------------------------------------------------------------------------------ */

void kg_cpu_quantize_x_row(int8_t *q, float *d, const float *x, int64_t K) {
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += KG_QF_BLOCK, b++) {
    int64_t n = K - k0 < KG_QF_BLOCK ? K - k0 : KG_QF_BLOCK;
    float amax = 0;
    bool finite = true;
    for (int64_t j = 0; j < n; j++) {
      float v = fabsf(x[k0 + j]);
      finite = finite && isfinite(v);
      amax = v > amax ? v : amax;
    }
    if (!finite) { /* the products become NaN, as the f32 arithmetic's would (or ±inf) */
      d[b] = NAN;
      memset(q + k0, 0, (size_t)n);
      continue;
    }
    float s = amax / 127.f, id = s > 0 ? 1.f / s : 0.f;
    d[b] = s;
    for (int64_t j = 0; j < n; j++) {
      float v = nearbyintf(x[k0 + j] * id);
      q[k0 + j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
  }
}

/* one quantized x row as the kernels read it: codes q (natural order for Q8 / Q8_0; for Q4_0 each
 * group of 128 holds the first halves of its 4 blocks, then the second halves, the order of a
 * weight vector's low and high nibbles), the block scales d, and per vpdpbusd lane (4 codes) the
 * block scale dl and the start value corr; zero past K (kp: K rounded up to 128) */
typedef struct {
  int8_t *q;
  float *d, *dl;
  int32_t *corr;
} xrow;

static size_t xrow_bytes(int64_t K) {
  int64_t kp = (K + 127) / 128 * 128;
  return (size_t)kp + (size_t)(kp / KG_QF_BLOCK) * 4 + (size_t)(kp / 4) * 8 + 64;
}

/* lays out x row a (K values) in buf (xrow_bytes(K) bytes) for weight format fmt and kernel v */
static xrow xrow_make(char *buf, const float *a, int64_t K, kg_qfmt fmt, bool lanes) {
  int64_t kp = (K + 127) / 128 * 128;
  xrow x = {.q = (int8_t *)buf};
  x.d = (float *)(buf + kp), x.dl = x.d + kp / KG_QF_BLOCK, x.corr = (int32_t *)(x.dl + kp / 4);
  memset(buf, 0, xrow_bytes(K));
  kg_cpu_quantize_x_row(x.q, x.d, a, K);
  if (!lanes) return x;
  if (fmt != KG_QF_Q4_0) { /* lane i of byte chunk k covers codes k + 4i .. k + 4i + 3 */
    for (int64_t l = 0; l < (K + 3) / 4; l++) {
      x.dl[l] = x.d[l * 4 / KG_QF_BLOCK];
      x.corr[l] = -128 * (x.q[4 * l] + x.q[4 * l + 1] + x.q[4 * l + 2] + x.q[4 * l + 3]);
    }
    return x;
  }
  int8_t g[128];
  for (int64_t k = 0; k < K; k += 128) { /* a group of up to 4 blocks; lane i is in block i / 4 */
    int64_t nb = K - k >= 128 ? 4 : (K - k) / KG_QF_BLOCK;
    memset(g, 0, sizeof g);
    for (int64_t b = 0; b < nb; b++) {
      memcpy(g + 16 * b, x.q + k + 32 * b, 16);
      memcpy(g + 64 + 16 * b, x.q + k + 32 * b + 16, 16);
    }
    memcpy(x.q + k, g, 128);
    for (int i = 0; i < 4 * nb; i++) {
      x.dl[k / 8 + i] = x.d[k / KG_QF_BLOCK + i / 4];
      int s = 0;
      for (int j = 0; j < 4; j++) s += g[4 * i + j] + g[64 + 4 * i + j];
      x.corr[k / 8 + i] = -8 * s;
    }
  }
  return x;
}

/* the reference: per block an exact integer sum Σ qx · code, scaled by x's block scale (and the
 * weight's); acc[j] for weight rows m .. m + mr - 1 (a Q8 row's scale left to the caller) */
static void rows_i8_scalar(float *acc, const xrow *x, const kg_qweight *w, int64_t m, int mr, int64_t K) {
  for (int j = 0; j < mr; j++) {
    const uint8_t *q = w->q + (m + j) * w->ldq;
    const void *s = scale_row(w, m + j);
    float t = 0;
    for (int64_t k0 = 0; k0 < K; k0 += KG_QF_BLOCK) {
      int64_t n = K - k0 < KG_QF_BLOCK ? K - k0 : KG_QF_BLOCK;
      /* the codes decoded first: GCC 12 at -O3 -march=native vectorised the fused loop into wrong
       * sums (lab_quant --check caught it) */
      int32_t c[KG_QF_BLOCK], is = 0;
      for (int64_t i = 0; i < n; i++) c[i] = kg_qf_code(w->fmt, q, k0 + i);
      for (int64_t i = 0; i < n; i++) is += x->q[k0 + i] * c[i];
      float p = (float)is * x->d[k0 / KG_QF_BLOCK];
      t += w->fmt == KG_QF_Q8 ? p : p * kg_qf_scale(w->fmt, s, k0);
    }
    acc[j] = t;
  }
}

#ifdef KG_Q8_X86
bool kg_cpu_q8_vnni_present(void) {
  static int have = -1;
  if (have < 0) {
    __builtin_cpu_init();
    have = cpu_avx512() && __builtin_cpu_supports("avx512vnni") ? 1 : 0;
  }
  return have;
}

bool kg_cpu_q8_vnni(void) { return kg_cpu_q8_vnni_present() && kg_cpu_simd() > 0; }

#define Q8_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* software prefetch: each of the 4 weight rows being read prefetches the same offset Q_PREFETCH_ROWS
 * rows further on (the rows of a weight are contiguous, so that is the row of a later group read
 * about a group from now). The hardware prefetcher ramps up too slowly on rows of 1-3 KB (K
 * 2048-5632), a new matrix every call. A fixed byte distance (the earlier rule: 1024 bytes for Q8,
 * 512 for Q4_0, then into the next group's rows) suited one row width only. Measured with a /tmp
 * harness timing every GEMV of one decode step of the ~1B Mistral (22 layers of q, k, v, o, gate,
 * up, down and the LM head, weights from kg_cpu_alloc; one thread, 2-core VM at load 15-17, best
 * of 8): rows ahead 5 against the byte rule, Q4_0 45.8 against 55.2 ms (K 2048), 46.2 against
 * 50.0 (a 7B-shaped K 4096); Q8_0 74.0 against 85.0 and 82.7 against 84.7. 4 and 8 rows ahead
 * (every line of one later group) were as slow as the byte rule, 3 and 6 in between. */
#ifndef Q_PREFETCH_ROWS
#define Q_PREFETCH_ROWS 5
#endif

/* int8 weights (Q8, or Q8_0 when grouped), one x row, 4 weight rows in named registers; per 64
 * weight bytes and row: a load, the sign flip, vpdpbusd, the int32 -> f32 conversion and an FMA
 * by the lanes' scales (Q8_0: x's times the weight's, two f16 scales spread over 8 lanes each) */
Q8_VNNI static inline __attribute__((always_inline)) void q8_vnni(float *acc, const xrow *x, const uint8_t *const *wr,
                                                                  const uint16_t *const *sr, int64_t K, bool grouped) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __m512i gidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t k = 0; k < K; k += 64) {
    __mmask64 m = K - k >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (K - k)) - 1; /* the tail, masked */
    int64_t pf = k + Q_PREFETCH_ROWS * (wr[1] - wr[0]); /* the rows repeat in a last group of < 4: no harm */
    for (int r = 0; r < 4; r++) _mm_prefetch((const char *)((uintptr_t)wr[r] + (uintptr_t)pf), _MM_HINT_T0);
    __m512i xv = _mm512_loadu_si512(x->q + k), c = _mm512_loadu_si512(x->corr + k / 4);
    __m512 d = _mm512_loadu_ps(x->dl + k / 4);
#define Q8_ROW(r, s)                                                                                               \
  do {                                                                                                             \
    __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, wr[r] + k), flip);                                    \
    __m512 dd = d;                                                                                                 \
    if (grouped) {                                                                                                 \
      int32_t two = sr[r][k / 32];                                                                                 \
      if (K - k > 32) memcpy(&two, sr[r] + k / 32, 4);                                                             \
      dd = _mm512_mul_ps(d, _mm512_permutexvar_ps(gidx, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(two))))); \
    }                                                                                                              \
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, u, xv)), dd, s);                                 \
  } while (0)
    Q8_ROW(0, s0);
    Q8_ROW(1, s1);
    Q8_ROW(2, s2);
    Q8_ROW(3, s3);
#undef Q8_ROW
  }
  acc[0] = _mm512_reduce_add_ps(s0), acc[1] = _mm512_reduce_add_ps(s1);
  acc[2] = _mm512_reduce_add_ps(s2), acc[3] = _mm512_reduce_add_ps(s3);
}

/* Q4_0, one x row, 4 weight rows; per 64 weight bytes (4 blocks) and row: a load, the low and
 * high nibbles (and, shift, and), two vpdpbusd against x's matching halves, the 4 f16 scales
 * spread over 4 lanes each, the conversion and an FMA */
Q8_VNNI static void q4_vnni(float *acc, const xrow *x, const uint8_t *const *wr, const uint16_t *const *sr,
                            int64_t K) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  const __m512i gidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t k = 0; k < K; k += 128) {
    int nb = K - k >= 128 ? 4 : (int)((K - k) / KG_QF_BLOCK); /* the tail: whole blocks, masked */
    __mmask64 m = nb == 4 ? ~(__mmask64)0 : ((__mmask64)1 << (16 * nb)) - 1;
    __mmask8 ms = (__mmask8)((1u << nb) - 1);
    int64_t pf = k / 2 + Q_PREFETCH_ROWS * (wr[1] - wr[0]);
    for (int r = 0; r < 4; r++) _mm_prefetch((const char *)((uintptr_t)wr[r] + (uintptr_t)pf), _MM_HINT_T0);
    __m512i xl = _mm512_loadu_si512(x->q + k), xh = _mm512_loadu_si512(x->q + k + 64);
    __m512i c = _mm512_loadu_si512(x->corr + k / 8);
    __m512 d = _mm512_loadu_ps(x->dl + k / 8);
#define Q4_ROW(r, s)                                                                                               \
  do {                                                                                                             \
    __m512i b = _mm512_maskz_loadu_epi8(m, wr[r] + k / 2);                                                        \
    __m512i i = _mm512_dpbusd_epi32(c, _mm512_and_si512(b, lo4), xl);                                             \
    i = _mm512_dpbusd_epi32(i, _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4), xh);                                \
    __m512 ws = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(ms, sr[r] + k / 32)));                   \
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, _mm512_permutexvar_ps(gidx, ws)), s);             \
  } while (0)
    Q4_ROW(0, s0);
    Q4_ROW(1, s1);
    Q4_ROW(2, s2);
    Q4_ROW(3, s3);
#undef Q4_ROW
  }
  acc[0] = _mm512_reduce_add_ps(s0), acc[1] = _mm512_reduce_add_ps(s1);
  acc[2] = _mm512_reduce_add_ps(s2), acc[3] = _mm512_reduce_add_ps(s3);
}

/* weight rows m .. m + mr - 1 (mr <= 4; missing rows repeat the last one, their sums dropped) */
Q8_VNNI static void rows_i8_vnni(float *acc, const xrow *x, const kg_qweight *w, int64_t m, int mr, int64_t K) {
  const uint8_t *wr[4];
  const uint16_t *sr[4];
  float t[4];
  for (int j = 0; j < 4; j++) {
    int64_t r = m + (j < mr ? j : mr - 1);
    wr[j] = w->q + r * w->ldq, sr[j] = (const uint16_t *)scale_row(w, r);
  }
  if (w->fmt == KG_QF_Q4_0) q4_vnni(t, x, wr, sr, K);
  else if (w->fmt == KG_QF_Q8_0) q8_vnni(t, x, wr, sr, K, true);
  else q8_vnni(t, x, wr, sr, K, false);
  for (int j = 0; j < mr; j++) acc[j] = t[j];
}
#else
bool kg_cpu_q8_vnni_present(void) { return false; }
bool kg_cpu_q8_vnni(void) { return false; }
#endif

typedef void (*rows_i8_fn)(float *acc, const xrow *x, const kg_qweight *w, int64_t m, int mr, int64_t K);

/* every x row quantized once, then groups of 4 weight rows shared among the threads */
static kg_status gemv_i8(float *out, int64_t ldo, const float *a, int64_t lda, const kg_qweight *w, const float *bias,
                         int64_t N, int64_t M, int64_t K, rows_i8_fn fn, bool lanes, int nt) {
  size_t per = (xrow_bytes(K) + 63) / 64 * 64, bytes;
  char *buf = kg_cpu_alloc(per * (size_t)N, &bytes);
  xrow *xs = malloc(sizeof(xrow) * (size_t)N);
  if (!buf || !xs) {
    if (buf) kg_cpu_free(buf, bytes);
    free(xs);
    return kg_error(KG_ERR_OOM, "linear_q", "out of memory quantizing x");
  }
  for (int64_t n = 0; n < N; n++) xs[n] = xrow_make(buf + per * (size_t)n, a + n * lda, K, w->fmt, lanes);
  int64_t ngroups = (M + 3) / 4;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t g = 0; g < ngroups; g++) {
    int64_t m = g * 4;
    int mr = M - m < 4 ? (int)(M - m) : 4;
    float acc[4];
    for (int64_t n = 0; n < N; n++) {
      fn(acc, &xs[n], w, m, mr, K);
      for (int j = 0; j < mr; j++)
        out[n * ldo + m + j] = acc[j] * (w->fmt == KG_QF_Q8 ? ((const float *)w->scale)[m + j] : 1.f) +
                               (bias ? bias[m + j] : 0.f);
    }
  }
  kg_cpu_free(buf, bytes);
  free(xs);
  return KG_OK;
}

/* ---- f32 x: the drivers ------------------------------------------------------------------------- */

/* acc[r * mr + j] = Σ_k a[r][k] · W[m + j][k] for nr x rows (<= 4) and mr (4 or 1) weight rows */
typedef void (*rows_fn)(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int mr,
                        int64_t K);

static void rows_scalar(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int mr,
                        int64_t K) {
  float t[4];
  for (int j = 0; j < mr; j++) {
    row_scalar(t, a, lda, nr, w, m + j, K);
    for (int r = 0; r < nr; r++) acc[r * mr + j] = t[r];
  }
}

#ifdef KG_Q8_X86
static void rows_q8_avx2(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int mr,
                         int64_t K) {
  if (mr == 4) tile_avx2(acc, a, lda, nr, (const int8_t *)w->q + m * w->ldq, w->ldq, K);
  else dot_avx2(acc, a, lda, nr, (const int8_t *)w->q + m * w->ldq, K);
}
static void rows_q8_avx512(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int mr,
                           int64_t K) {
  if (mr == 4) tile_avx512(acc, a, lda, nr, (const int8_t *)w->q + m * w->ldq, w->ldq, K);
  else dot_avx512(acc, a, lda, nr, (const int8_t *)w->q + m * w->ldq, K);
}
/* Q4_0 and Q8_0 (block scales): one weight row at a time */
static void rows_q4_avx2(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int mr,
                         int64_t K) {
  (void)mr; /* 1 */
  const uint16_t *s = (const uint16_t *)w->scale + m * w->lds;
  if (w->fmt == KG_QF_Q8_0) dot80_avx2(acc, a, lda, nr, (const int8_t *)w->q + m * w->ldq, s, K);
  else dot4_avx2(acc, a, lda, nr, w->q + m * w->ldq, s, K);
}
static void rows_q4_avx512(float *acc, const float *a, int64_t lda, int nr, const kg_qweight *w, int64_t m, int mr,
                           int64_t K) {
  (void)mr;
  const uint16_t *s = (const uint16_t *)w->scale + m * w->lds;
  if (w->fmt == KG_QF_Q8_0) dot80_avx512(acc, a, lda, nr, (const int8_t *)w->q + m * w->ldq, s, K);
  else dot4_avx512(acc, a, lda, nr, w->q + m * w->ldq, s, K);
}
#endif

/* fn takes `tile` (4 or 1) weight rows at a time, the last M % tile one at a time; a Q8 row's
 * scale multiplies the finished sum */
static void gemv_f32(float *out, int64_t ldo, const float *a, int64_t lda, const kg_qweight *w, const float *bias,
                     int64_t N, int64_t M, int64_t K, rows_fn fn, int tile, int nt) {
  int64_t M4 = tile == 4 ? M / 4 * 4 : 0, ngroups = M4 / 4 + (M - M4);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t g = 0; g < ngroups; g++) {
    float acc[16];
    int64_t m = g < M4 / 4 ? g * 4 : M4 + (g - M4 / 4);
    int mr = g < M4 / 4 ? 4 : 1;
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
      int nr = N - n0 < 4 ? (int)(N - n0) : 4;
      fn(acc, a + n0 * lda, lda, nr, w, m, mr, K);
      for (int r = 0; r < nr; r++)
        for (int j = 0; j < mr; j++)
          out[(n0 + r) * ldo + m + j] = acc[r * mr + j] * (w->fmt == KG_QF_Q8 ? ((const float *)w->scale)[m + j] : 1.f) +
                                        (bias ? bias[m + j] : 0.f);
    }
  }
}

/* weight blocks shared among the threads, one dequantized block buffer each, one single-threaded
 * sgemm per block (as matmul.c's threaded_gemm splits a product) */
static kg_status blocked(float *out, int64_t ldo, const float *a, int64_t lda, const kg_qweight *w, const float *bias,
                         int64_t N, int64_t M, int64_t K, int nt) {
  size_t per = (size_t)Q8_BLOCK_ROWS * (size_t)K * 4, bytes;
  char *deqs = kg_cpu_alloc(per * (size_t)nt, &bytes);
  if (!deqs) return kg_error(KG_ERR_OOM, "linear_q", "out of memory dequantizing a weight block");
  int64_t nblocks = (M + Q8_BLOCK_ROWS - 1) / Q8_BLOCK_ROWS;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    float *deq = (float *)(deqs + per * (size_t)omp_get_thread_num());
    int64_t m0 = blk * Q8_BLOCK_ROWS, mb = M - m0 < Q8_BLOCK_ROWS ? M - m0 : Q8_BLOCK_ROWS;
    for (int64_t i = 0; i < mb; i++) kg_cpu_dequantize_row(deq + i * K, w->fmt, w->q + (m0 + i) * w->ldq, scale_row(w, m0 + i), K);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)mb, (int)K, 1.f, a, (int)lda, deq, (int)K, 0.f,
                out + m0, (int)ldo);
    if (bias)
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < mb; i++) out[n * ldo + m0 + i] += bias[m0 + i];
  }
  kg_cpu_free(deqs, bytes);
  return KG_OK;
}

kg_status kg_cpu_gemm_q(float *out, int64_t ldo, const float *a, int64_t lda, const kg_qweight *w, const float *bias,
                        int64_t N, int64_t M, int64_t K, kg_q8_variant v, int threads) {
  if (N <= 0 || M <= 0) return KG_OK;
  int nt = threads > 0 ? threads : (double)N * (double)M * (double)K >= Q8_PAR_WORK ? kg_num_threads() : 1;
  if (K == 0) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t m = 0; m < M; m++) out[n * ldo + m] = bias ? bias[m] : 0.f;
    return KG_OK;
  }
  if (v == KG_Q8_AUTO && N > KG_Q8_GEMV_ROWS) v = KG_Q8_BLOCKED;
  /* int8 x is a numerics choice made on the CPU's features, not on KENG_NO_SIMD: without the
   * vector kernel the scalar loop gives the same sums */
  if (v == KG_Q8_AUTO && kg_quant_act_int8()) v = kg_cpu_q8_vnni() ? KG_Q8_I8_VNNI : KG_Q8_I8_SCALAR;
  if (v == KG_Q8_BLOCKED) return blocked(out, ldo, a, lda, w, bias, N, M, K, nt);
  if (v == KG_Q8_I8_SCALAR) return gemv_i8(out, ldo, a, lda, w, bias, N, M, K, rows_i8_scalar, false, nt);
#ifdef KG_Q8_X86
  if (v == KG_Q8_I8_VNNI) return gemv_i8(out, ldo, a, lda, w, bias, N, M, K, rows_i8_vnni, true, nt);
  /* f32 x: the widening kernels (Q8: 4 weight rows a pass; block-scaled formats: one) */
  bool q8 = w->fmt == KG_QF_Q8;
  if (v == KG_Q8_AUTO) v = kg_cpu_q8_avx512() ? KG_Q8_AVX512 : kg_cpu_q8_avx2() ? KG_Q8_AVX2 : KG_Q8_SCALAR;
  if (v == KG_Q8_AVX512) {
    gemv_f32(out, ldo, a, lda, w, bias, N, M, K, q8 ? rows_q8_avx512 : rows_q4_avx512, q8 ? 4 : 1, nt);
    return KG_OK;
  }
  if (v == KG_Q8_AVX2) {
    gemv_f32(out, ldo, a, lda, w, bias, N, M, K, q8 ? rows_q8_avx2 : rows_q4_avx2, q8 ? 4 : 1, nt);
    return KG_OK;
  }
#endif
  gemv_f32(out, ldo, a, lda, w, bias, N, M, K, rows_scalar, 1, nt);
  return KG_OK;
}

/* ---- op kernels ------------------------------------------------------------------------------ */

/* the format of a (codes, scale) pair the front-end accepted */
static kg_qfmt fmt_of(const kg_tensor *wq, const kg_tensor *sc) {
  return wq->dtype == KG_U8 ? KG_QF_Q4_0 : sc->ndim == 2 ? KG_QF_Q8_0 : KG_QF_Q8;
}

/* in: x [N, K] (rows of any stride), codes [M, row bytes] and scales (contiguous, from the
 * front-end), bias [M] or absent; out: y [N, M] contiguous. linear_q8 (Q8, Q8_0), linear_q4 */
static kg_status linear_q(const kg_op_call *c, const char *op) {
  const kg_tensor *x = c->in[0], *wq = c->in[1], *sc = c->in[2], *b = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *y = c->out[0];
  int64_t N = x->shape[0], K = x->shape[1], M = wq->shape[0];
  kg_qweight w = {fmt_of(wq, sc), kg_data(wq), wq->shape[1], kg_data(sc), sc->ndim == 2 ? sc->shape[1] : 1};
  const char *xp = kg_data(x);
  int es = kg_dtype_info[x->dtype].size;
  if (y->dtype == KG_F64) { /* exact reference path (gradchecks): f64 sums of code · scale, scalar */
    double *yo = kg_data(y), *xr = malloc((size_t)(K > 0 ? K : 1) * 8);
    if (!xr) return kg_error(KG_ERR_OOM, op, "out of memory");
    for (int64_t n = 0; n < N; n++) {
      kg_cpu_load_f64(xr, xp + n * x->stride[0] * es, x->dtype, x->stride[1], K);
      for (int64_t m = 0; m < M; m++) {
        const uint8_t *q = w.q + m * w.ldq;
        const void *s = scale_row(&w, m);
        double t = 0;
        for (int64_t k = 0; k < K; k++) t += xr[k] * (double)kg_qf_code(w.fmt, q, k) * (double)kg_qf_scale(w.fmt, s, k);
        yo[n * M + m] = t + (b ? kg_get_flat(b, m) : 0.0);
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
  if (!a || !o || (b && !bias)) st = kg_error(KG_ERR_OOM, op, "out of memory converting x");
  if (!st) {
    for (int64_t n = 0; n < N; n++) kg_cpu_load_f32(a + n * K, xp + n * x->stride[0] * es, x->dtype, x->stride[1], K);
    if (b) kg_cpu_load_f32(bias, kg_data(b), b->dtype, b->stride[0], M);
    st = kg_cpu_gemm_q(o, M, a, K, &w, bias, N, M, K, KG_Q8_AUTO, 0);
    if (!st && y->dtype != KG_F32) kg_cpu_store_f32(kg_data(y), y->dtype, 1, o, N * M);
  }
  if (a) kg_cpu_free(a, abytes);
  if (o && y->dtype != KG_F32) kg_cpu_free(o, obytes);
  if (bias) kg_cpu_free(bias, bbytes);
  return st;
}

kg_status kg_cpu_linear_q8(const kg_op_call *c) { return linear_q(c, "linear_q8"); }
kg_status kg_cpu_linear_q4(const kg_op_call *c) { return linear_q(c, "linear_q4"); }

/* in: w [M, K] float (any strides); out: codes and scales (contiguous): quantize_q8 (Q8),
 * quantize_q4 (Q4_0) */
static kg_status quantize(const kg_op_call *c, kg_qfmt fmt, const char *op) {
  const kg_tensor *w = c->in[0];
  uint8_t *q = kg_data(c->out[0]);
  int64_t M = w->shape[0], K = w->shape[1];
  int es = kg_dtype_info[w->dtype].size;
  double *row = malloc((size_t)(K > 0 ? K : 1) * 8);
  if (!row) return kg_error(KG_ERR_OOM, op, "out of memory");
  for (int64_t m = 0; m < M; m++) {
    kg_cpu_load_f64(row, (const char *)kg_data(w) + m * w->stride[0] * es, w->dtype, w->stride[1], K);
    if (fmt == KG_QF_Q8) kg_cpu_quantize_q8_row((int8_t *)q + m * K, (float *)kg_data(c->out[1]) + m, row, K);
    else kg_cpu_quantize_q4_row(q + m * (K / 2), (uint16_t *)kg_data(c->out[1]) + m * (K / KG_QF_BLOCK), row, K);
  }
  free(row);
  return KG_OK;
}

kg_status kg_cpu_quantize_q8(const kg_op_call *c) { return quantize(c, KG_QF_Q8, "quantize_q8"); }
kg_status kg_cpu_quantize_q4(const kg_op_call *c) { return quantize(c, KG_QF_Q4_0, "quantize_q4"); }

/* in: codes, scales (contiguous); out: w [M, K] (float dtype, contiguous) */
kg_status kg_cpu_dequantize_q4(const kg_op_call *c) {
  const kg_tensor *q = c->in[0], *sc = c->in[1];
  kg_tensor *w = c->out[0];
  int64_t M = w->shape[0], K = w->shape[1];
  kg_qweight qw = {fmt_of(q, sc), kg_data(q), q->shape[1], kg_data(sc), sc->ndim == 2 ? sc->shape[1] : 1};
  float *row = malloc((size_t)(K > 0 ? K : 1) * 4);
  if (!row) return kg_error(KG_ERR_OOM, "dequantize_q4", "out of memory");
  int es = kg_dtype_info[w->dtype].size;
  for (int64_t m = 0; m < M; m++) {
    kg_cpu_dequantize_row(row, qw.fmt, qw.q + m * qw.ldq, scale_row(&qw, m), K);
    kg_cpu_store_f32((char *)kg_data(w) + m * K * es, w->dtype, 1, row, K);
  }
  free(row);
  return KG_OK;
}
