/* gemm_bf16.c (cpu) — out[N, M] = a[N, K] @ B[K, M] for a few rows of f32 a against a bf16
 * weight read as it lies (decode: the projections and the LM head of a bf16 model at batch 1-32).
 *
 * Converting the whole weight to f32 and calling sgemm reads the weight, writes twice its size
 * and reads that again, for a product that does only 2N flops per weight element: at small N the
 * weight traffic is the cost. Here each weight element is loaded once per K block, widened to f32
 * in a register (bf16 is the high half of an f32: zero-extend to 32 bits, shift left 16) and fed
 * to FMAs for every row of a in the tile; accumulation is in f32.
 *
 * Two layouts of B:
 *   b_trans (w = W [M, K], x @ W^T): each output is the dot product of a row of a and a row of W,
 *     both contiguous. Tile: 4 rows of W x 3 rows of a = 12 accumulators of 8 lanes, summed
 *     horizontally at the end of the K block.
 *     With AVX-512 (F, BW, VL): 4 rows of W x 4 rows of a in zmm, a kept in registers; with
 *     AVX512_BF16 and a whose values are bf16: the same tile on vdpbf16ps (bf16 pairs, f32 sums).
 *   else (w = W [K, M], x @ W): each k contributes a[n, k] * W[k, m0 .. m0 + 16] to 16 adjacent
 *     outputs. Tile: 16 columns x 6 rows of a = 12 accumulators (AVX2 only).
 * The output columns are split into chunks shared among the threads; an [N, kc] block of a stays
 * in L2 while the chunk's weight rows stream past it. See docs/kernels.md ("Decode") for figures.
 */
#include "gemm_bf16.h"

#include <keng/scalar.h>
#include <omp.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KG_X86 1
#endif

/* flops below which the product stays on one thread */
#define GB_PAR_FLOPS (4 << 20)
/* widest chunk of output columns (bounds the per-thread f32 buffer for a bf16/f16 output) */
#define GB_MAX_CHUNK 512
/* K block of the x @ W layout: its 16-column tiles walk down W, and with a power-of-two row
 * stride a longer walk evicts the lines before the next tile uses their other half (lab: 64 rows
 * 38% of the read roofline, 256 rows 14%) */
#define GB_NN_KC 64
/* bytes of a's [N, kc] f32 block that should stay in L2 */
#define GB_A_BLOCK_BYTES (128 * 1024)

typedef struct {
  const float *a;
  const uint16_t *a16; /* a packed as bf16 [N, K] for the dpbf16 variant, else NULL */
  const uint16_t *w;
  int64_t lda, ldw, N, K, kc;
  bool trans, avx2, avx512;
} plan;

/* ---- scalar variant (any CPU; also the reference order of the tails) ------------------------ */

/* c[N, mc] (+)= a[N, K] @ B[K, mc], B[k, m] at w[m * ldw + k] (trans) or w[k * ldw + m] */
static void block_scalar(float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                         bool trans, int64_t N, int64_t mc, int64_t K, bool acc) {
  for (int64_t n = 0; n < N; n++) {
    float *cn = c + n * ldc;
    const float *an = a + n * lda;
    if (trans) {
      for (int64_t m = 0; m < mc; m++) {
        float s = 0;
        for (int64_t k = 0; k < K; k++) s += an[k] * kg_bf16_to_f32(w[m * ldw + k]);
        cn[m] = acc ? cn[m] + s : s;
      }
      continue;
    }
    if (!acc)
      for (int64_t m = 0; m < mc; m++) cn[m] = 0;
    for (int64_t k = 0; k < K; k++) { /* row k of W is contiguous: sweep it once per row of a */
      float ak = an[k];
      for (int64_t m = 0; m < mc; m++) cn[m] += ak * kg_bf16_to_f32(w[k * ldw + m]);
    }
  }
}

/* ---- AVX2 + FMA variant ------------------------------------------------------------------- */

#ifdef KG_X86
#define KG_AVX2 __attribute__((target("avx2,fma")))
#define KG_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

static int have_avx2 = -1; /* set once; a race writes the same value */

bool kg_cpu_gemm_bf16_avx2(void) {
  if (have_avx2 < 0) {
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
  }
  return have_avx2 == 1;
}

/* 8 bf16 -> 8 f32 (exact) */
KG_AVX2_INLINE __m256 bf16x8(const uint16_t *p) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

KG_AVX2_INLINE float hsum1(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* {sum(v0), sum(v1), sum(v2), sum(v3)} */
KG_AVX2_INLINE __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

#define TR_MR 4 /* rows of W (output columns) per tile */
#define TR_NR 3 /* rows of a per tile */
/* how far ahead the weight rows are prefetched: each row of a tile is a short stream (K = 256:
 * 8 cache lines) that the hardware prefetcher does not pick up in time */
#ifndef TR_PF_BYTES
#define TR_PF_BYTES 16384
#endif

/* trans tile: c[nr, mr] (+)= a[nr, K] . W[mr, K] row by row; mr in {1, 4}, nr in 1..3 */
KG_AVX2_INLINE void tile_t(const int mr, const int nr, float *c, int64_t ldc, const float *a, int64_t lda,
                           const uint16_t *w, int64_t ldw, int64_t pf, int64_t K, bool acc) {
  __m256 s[TR_NR][TR_MR];
  for (int j = 0; j < nr; j++)
    for (int i = 0; i < mr; i++) s[j][i] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 av[TR_NR]; /* 12 accumulators + 3 rows of a + 1 weight vector = the 16 registers */
    for (int j = 0; j < nr; j++) av[j] = _mm256_loadu_ps(a + j * lda + k);
    for (int i = 0; i < mr; i++) {
      _mm_prefetch((const char *)(w + i * ldw + pf + k), _MM_HINT_T0);
      __m256 wv = bf16x8(w + i * ldw + k);
      for (int j = 0; j < nr; j++) s[j][i] = _mm256_fmadd_ps(av[j], wv, s[j][i]);
    }
  }
  for (int j = 0; j < nr; j++) {
    float r[TR_MR];
    if (mr == TR_MR) _mm_storeu_ps(r, hsum4(s[j][0], s[j][1], s[j][2], s[j][3]));
    else
      for (int i = 0; i < mr; i++) r[i] = hsum1(s[j][i]);
    for (int64_t t = k; t < K; t++) /* K % 8 tail */
      for (int i = 0; i < mr; i++) r[i] += a[j * lda + t] * kg_bf16_to_f32(w[i * ldw + t]);
    float *cj = c + j * ldc;
    for (int i = 0; i < mr; i++) cj[i] = acc ? cj[i] + r[i] : r[i];
  }
}

/* the rows of a in groups of TR_NR for one group of mr rows of W (which stays in L1) */
KG_AVX2_INLINE void rows_t(const int mr, float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w,
                           int64_t ldw, int64_t pf, int64_t N, int64_t K, bool acc) {
  int64_t n = 0;
  for (; n + TR_NR <= N; n += TR_NR) tile_t(mr, TR_NR, c + n * ldc, ldc, a + n * lda, lda, w, ldw, pf, K, acc);
  if (N - n == 2) tile_t(mr, 2, c + n * ldc, ldc, a + n * lda, lda, w, ldw, pf, K, acc);
  if (N - n == 1) tile_t(mr, 1, c + n * ldc, ldc, a + n * lda, lda, w, ldw, pf, K, acc);
}

KG_AVX2 static void block_t_avx2(float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                                 int64_t N, int64_t mc, int64_t K, bool acc) {
  int64_t rows_ahead = TR_PF_BYTES / (2 * (ldw > 0 ? ldw : 1)), m = 0;
  int64_t pf = (rows_ahead < TR_MR ? TR_MR : rows_ahead) * ldw; /* elements */
  for (; m + TR_MR <= mc; m += TR_MR) rows_t(TR_MR, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);
  for (; m < mc; m++) rows_t(1, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);
}

#define NN_NV 2 /* vectors of 8 columns per tile */
#define NN_NR 6 /* rows of a per tile */

/* plain tile: c[nr, 8 nv] (+)= a[nr, K] @ W[K, 8 nv]; nv in {1, 2}, nr in 1..6 */
KG_AVX2_INLINE void tile_n(const int nv, const int nr, float *c, int64_t ldc, const float *a, int64_t lda,
                           const uint16_t *w, int64_t ldw, int64_t K, bool acc) {
  __m256 s[NN_NR][NN_NV];
  for (int j = 0; j < nr; j++)
    for (int v = 0; v < nv; v++) s[j][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    __m256 wv[NN_NV];
    for (int v = 0; v < nv; v++) wv[v] = bf16x8(w + k * ldw + 8 * v);
    for (int j = 0; j < nr; j++) {
      __m256 av = _mm256_broadcast_ss(a + j * lda + k);
      for (int v = 0; v < nv; v++) s[j][v] = _mm256_fmadd_ps(av, wv[v], s[j][v]);
    }
  }
  for (int j = 0; j < nr; j++)
    for (int v = 0; v < nv; v++) {
      float *p = c + j * ldc + 8 * v;
      _mm256_storeu_ps(p, acc ? _mm256_add_ps(_mm256_loadu_ps(p), s[j][v]) : s[j][v]);
    }
}

KG_AVX2_INLINE void rows_n(const int nv, float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w,
                           int64_t ldw, int64_t N, int64_t K, bool acc) {
  int64_t n = 0;
  for (; n + NN_NR <= N; n += NN_NR) tile_n(nv, NN_NR, c + n * ldc, ldc, a + n * lda, lda, w, ldw, K, acc);
  switch (N - n) {
  case 5: tile_n(nv, 5, c + n * ldc, ldc, a + n * lda, lda, w, ldw, K, acc); break;
  case 4: tile_n(nv, 4, c + n * ldc, ldc, a + n * lda, lda, w, ldw, K, acc); break;
  case 3: tile_n(nv, 3, c + n * ldc, ldc, a + n * lda, lda, w, ldw, K, acc); break;
  case 2: tile_n(nv, 2, c + n * ldc, ldc, a + n * lda, lda, w, ldw, K, acc); break;
  case 1: tile_n(nv, 1, c + n * ldc, ldc, a + n * lda, lda, w, ldw, K, acc); break;
  default: break;
  }
}

KG_AVX2 static void block_n_avx2(float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                                 int64_t N, int64_t mc, int64_t K, bool acc) {
  int64_t m = 0;
  for (; m + 8 * NN_NV <= mc; m += 8 * NN_NV) rows_n(NN_NV, c + m, ldc, a, lda, w + m, ldw, N, K, acc);
  if (mc - m >= 8) rows_n(1, c + m, ldc, a, lda, w + m, ldw, N, K, acc), m += 8;
  if (m < mc) block_scalar(c + m, ldc, a, lda, w + m, ldw, false, N, mc - m, K, acc); /* < 8 columns */
}

/* ---- AVX-512 variant of the b_trans layout ------------------------------------------------ */
/* 32 registers: a 4 x 4 tile (16 accumulators + 4 rows of a + 1 weight vector) keeps a in
 * registers, where the AVX2 tile reloads it for every FMA; the K % 16 tail is a masked load.
 * (A 4 x 6 tile would fit the registers, but GCC then keeps the accumulator array on the stack,
 * storing it every iteration: 1.9x slower. 4 x 3 / 4 x 4 / 4 x 5 time alike.) */
#define KG_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"), always_inline)) static inline
#define KG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

static int have_avx512 = -1;

bool kg_cpu_gemm_bf16_avx512(void) {
  if (have_avx512 < 0) {
    __builtin_cpu_init();
    have_avx512 = kg_cpu_gemm_bf16_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl")
                      ? 1
                      : 0;
  }
  return have_avx512 == 1;
}

/* 16 bf16 (the first n of them when masked) -> 16 f32 */
KG_AVX512_INLINE __m512 bf16x16(const uint16_t *p, __mmask16 m) {
  __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

KG_AVX512_INLINE __m256 half_sum(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

#define Z_MR 4 /* rows of W per tile */
#define Z_NR 4 /* rows of a per tile */

KG_AVX512_INLINE void tile_z(const int mr, const int nr, float *c, int64_t ldc, const float *a, int64_t lda,
                             const uint16_t *w, int64_t ldw, int64_t pf, int64_t K, bool acc) {
  __m512 s[Z_NR][Z_MR];
  for (int j = 0; j < nr; j++)
    for (int i = 0; i < mr; i++) s[j][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
    __m512 av[Z_NR];
    for (int j = 0; j < nr; j++) av[j] = _mm512_maskz_loadu_ps(m, a + j * lda + k);
    for (int i = 0; i < mr; i++) {
      _mm_prefetch((const char *)(w + i * ldw + pf + k), _MM_HINT_T0);
      __m512 wv = bf16x16(w + i * ldw + k, m);
      for (int j = 0; j < nr; j++) s[j][i] = _mm512_fmadd_ps(av[j], wv, s[j][i]);
    }
  }
  for (int j = 0; j < nr; j++) {
    float r[Z_MR];
    if (mr == Z_MR)
      _mm_storeu_ps(r, hsum4(half_sum(s[j][0]), half_sum(s[j][1]), half_sum(s[j][2]), half_sum(s[j][3])));
    else
      for (int i = 0; i < mr; i++) r[i] = hsum1(half_sum(s[j][i]));
    float *cj = c + j * ldc;
    for (int i = 0; i < mr; i++) cj[i] = acc ? cj[i] + r[i] : r[i];
  }
}

KG_AVX512_INLINE void rows_z(const int mr, float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w,
                             int64_t ldw, int64_t pf, int64_t N, int64_t K, bool acc) {
  int64_t n = 0;
  for (; n + Z_NR <= N; n += Z_NR) tile_z(mr, Z_NR, c + n * ldc, ldc, a + n * lda, lda, w, ldw, pf, K, acc);
  float *cn = c + n * ldc;
  const float *an = a + n * lda;
  switch (N - n) {
  case 3: tile_z(mr, 3, cn, ldc, an, lda, w, ldw, pf, K, acc); break;
  case 2: tile_z(mr, 2, cn, ldc, an, lda, w, ldw, pf, K, acc); break;
  case 1: tile_z(mr, 1, cn, ldc, an, lda, w, ldw, pf, K, acc); break;
  default: break;
  }
}

KG_AVX512 static void block_t_avx512(float *c, int64_t ldc, const float *a, int64_t lda, const uint16_t *w,
                                     int64_t ldw, int64_t N, int64_t mc, int64_t K, bool acc) {
  int64_t rows_ahead = TR_PF_BYTES / (2 * (ldw > 0 ? ldw : 1)), m = 0;
  int64_t pf = (rows_ahead < Z_MR ? Z_MR : rows_ahead) * ldw;
  for (; m + Z_MR <= mc; m += Z_MR) rows_z(Z_MR, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);
  for (; m < mc; m++) rows_z(1, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);
}

/* ---- AVX512_BF16 variant of the b_trans layout (a's values are bf16) ------------------------ */
/* vdpbf16ps multiplies 32 bf16 pairs and adds each pair's sum to an f32 lane: no widening of the
 * weight, 32 k per instruction. It needs a in bf16 too, so it runs only when a's values are bf16
 * (exact after packing); it treats bf16 denormals as zero (no other difference from f32 FMAs:
 * the products of two bf16 are exact in f32). */
#define KG_DPBF16_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma"), always_inline)) static inline
#define KG_DPBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

static int have_dpbf16 = -1;

bool kg_cpu_gemm_bf16_dpbf16(void) {
  if (have_dpbf16 < 0) {
    __builtin_cpu_init();
    have_dpbf16 = kg_cpu_gemm_bf16_avx512() && __builtin_cpu_supports("avx512bf16") ? 1 : 0;
  }
  return have_dpbf16 == 1;
}

KG_DPBF16_INLINE void tile_d(const int mr, const int nr, float *c, int64_t ldc, const uint16_t *a, int64_t lda,
                           const uint16_t *w, int64_t ldw, int64_t pf, int64_t K, bool acc) {
  __m512 s[Z_NR][Z_MR];
  for (int j = 0; j < nr; j++)
    for (int i = 0; i < mr; i++) s[j][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    __mmask32 m = K - k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (K - k)) - 1);
    __m512i av[Z_NR];
    for (int j = 0; j < nr; j++) av[j] = _mm512_maskz_loadu_epi16(m, a + j * lda + k);
    for (int i = 0; i < mr; i++) {
      _mm_prefetch((const char *)(w + i * ldw + pf + k), _MM_HINT_T0);
      _mm_prefetch((const char *)(w + i * ldw + pf + k + 16), _MM_HINT_T0);
      __m512i wv = _mm512_maskz_loadu_epi16(m, w + i * ldw + k);
      for (int j = 0; j < nr; j++) s[j][i] = _mm512_dpbf16_ps(s[j][i], (__m512bh)av[j], (__m512bh)wv);
    }
  }
  for (int j = 0; j < nr; j++) {
    float r[Z_MR];
    if (mr == Z_MR)
      _mm_storeu_ps(r, hsum4(half_sum(s[j][0]), half_sum(s[j][1]), half_sum(s[j][2]), half_sum(s[j][3])));
    else
      for (int i = 0; i < mr; i++) r[i] = hsum1(half_sum(s[j][i]));
    float *cj = c + j * ldc;
    for (int i = 0; i < mr; i++) cj[i] = acc ? cj[i] + r[i] : r[i];
  }
}

KG_DPBF16_INLINE void rows_d(const int mr, float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *w,
                           int64_t ldw, int64_t pf, int64_t N, int64_t K, bool acc) {
  int64_t n = 0;
  for (; n + Z_NR <= N; n += Z_NR) tile_d(mr, Z_NR, c + n * ldc, ldc, a + n * lda, lda, w, ldw, pf, K, acc);
  float *cn = c + n * ldc;
  const uint16_t *an = a + n * lda;
  switch (N - n) {
  case 3: tile_d(mr, 3, cn, ldc, an, lda, w, ldw, pf, K, acc); break;
  case 2: tile_d(mr, 2, cn, ldc, an, lda, w, ldw, pf, K, acc); break;
  case 1: tile_d(mr, 1, cn, ldc, an, lda, w, ldw, pf, K, acc); break;
  default: break;
  }
}

KG_DPBF16 static void block_t_dpbf16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *w,
                                   int64_t ldw, int64_t N, int64_t mc, int64_t K, bool acc) {
  int64_t rows_ahead = TR_PF_BYTES / (2 * (ldw > 0 ? ldw : 1)), m = 0;
  int64_t pf = (rows_ahead < Z_MR ? Z_MR : rows_ahead) * ldw;
  for (; m + Z_MR <= mc; m += Z_MR) rows_d(Z_MR, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);
  for (; m < mc; m++) rows_d(1, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);
}
#else
bool kg_cpu_gemm_bf16_avx2(void) { return false; }
bool kg_cpu_gemm_bf16_avx512(void) { return false; }
bool kg_cpu_gemm_bf16_dpbf16(void) { return false; }
#endif

/* ---- driver --------------------------------------------------------------------------------- */

/* c[N, mc] = columns [m0, m0 + mc) of the product, one K block at a time */
static void run_chunk(const plan *p, float *c, int64_t ldc, int64_t m0, int64_t mc) {
  for (int64_t k0 = 0; k0 < p->K; k0 += p->kc) {
    int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc;
    bool acc = k0 > 0;
    const float *ak = p->a + k0;
    const uint16_t *wk = p->trans ? p->w + m0 * p->ldw + k0 : p->w + k0 * p->ldw + m0;
#ifdef KG_X86
    if (p->a16) {
      block_t_dpbf16(c, ldc, p->a16 + k0, p->K, wk, p->ldw, p->N, mc, kb, acc);
      continue;
    }
    if (p->avx512 && p->trans) {
      block_t_avx512(c, ldc, ak, p->lda, wk, p->ldw, p->N, mc, kb, acc);
      continue;
    }
    if (p->avx2) {
      if (p->trans) block_t_avx2(c, ldc, ak, p->lda, wk, p->ldw, p->N, mc, kb, acc);
      else block_n_avx2(c, ldc, ak, p->lda, wk, p->ldw, p->N, mc, kb, acc);
      continue;
    }
#endif
    block_scalar(c, ldc, ak, p->lda, wk, p->ldw, p->trans, p->N, mc, kb, acc);
  }
}

kg_status kg_cpu_gemm_bf16(void *out, kg_dtype odt, int64_t ldo, const float *a, int64_t lda, const uint16_t *w,
                           int64_t ldw, bool b_trans, int64_t N, int64_t M, int64_t K, const kg_gemm_bf16_opts *o) {
  kg_gemm_bf16_opts def = {0};
  if (!o) o = &def;
  if (N <= 0 || M <= 0) return KG_OK;
  int os = kg_dtype_info[odt].size;
  if (K <= 0) { /* empty sum: +0 in every float dtype */
    for (int64_t n = 0; n < N; n++) memset((char *)out + n * ldo * os, 0, (size_t)(M * os));
    return KG_OK;
  }
  plan p = {a, NULL, w, lda, ldw, N, K, o->kc, b_trans, false, false};
  bool autov = o->variant == KG_GEMM_BF16_AUTO;
  p.avx512 = o->variant == KG_GEMM_BF16_AVX512 || o->variant == KG_GEMM_BF16_DPBF16 || (autov && kg_cpu_gemm_bf16_avx512());
  p.avx2 = p.avx512 || o->variant == KG_GEMM_BF16_AVX2 || (autov && kg_cpu_gemm_bf16_avx2());
  if (p.kc <= 0) {
    p.kc = GB_A_BLOCK_BYTES / (4 * N) / 8 * 8;
    if (p.kc < 256) p.kc = 256;
    if (!b_trans && p.kc > GB_NN_KC) p.kc = GB_NN_KC;
  }
  int nt = o->threads > 0 ? o->threads : 2.0 * (double)N * (double)M * (double)K >= GB_PAR_FLOPS ? kg_num_threads() : 1;
  /* about 4 chunks per thread (balance), multiples of 16 columns, at most GB_MAX_CHUNK */
  int64_t cw = (M + 4 * nt - 1) / (4 * nt);
  cw = (cw + 15) / 16 * 16;
  if (cw > GB_MAX_CHUNK) cw = GB_MAX_CHUNK;
  int64_t nchunk = (M + cw - 1) / cw;
  if (nt > nchunk) nt = (int)nchunk;
  bool dp = b_trans && o->a_bf16 &&
            (o->variant == KG_GEMM_BF16_DPBF16 || (autov && kg_cpu_gemm_bf16_dpbf16()));
  size_t a16_bytes = 0;
  uint16_t *a16 = dp ? kg_cpu_alloc((size_t)(N * K * 2), &a16_bytes) : NULL;
  if (dp && !a16) return kg_error(KG_ERR_OOM, "matmul", "out of memory packing operands");
  for (int64_t n = 0; a16 && n < N; n++) kg_cpu_store_f32(a16 + n * K, KG_BF16, 1, a + n * lda, K); /* exact */
  p.a16 = a16;
  bool direct = odt == KG_F32, oom = false;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t bytes = 0;
    float *cb = direct ? NULL : kg_cpu_alloc((size_t)(N * cw * 4), &bytes);
    if (!direct && !cb) {
#pragma omp atomic write
      oom = true;
    }
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < nchunk; ch++) {
      if (oom) continue;
      int64_t m0 = ch * cw, mc = M - m0 < cw ? M - m0 : cw;
      if (direct) {
        run_chunk(&p, (float *)out + m0, ldo, m0, mc);
        continue;
      }
      run_chunk(&p, cb, mc, m0, mc);
      for (int64_t n = 0; n < N; n++) kg_cpu_store_f32((char *)out + (n * ldo + m0) * os, odt, 1, cb + n * mc, mc);
    }
    if (cb) kg_cpu_free(cb, bytes);
  }
  if (a16) kg_cpu_free(a16, a16_bytes);
  return oom ? kg_error(KG_ERR_OOM, "matmul", "out of memory for the f32 result") : KG_OK;
}
