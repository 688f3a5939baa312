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
 *
 * Training rows (past 32 rows of a whose values are bf16, AVX512_BF16): a packed kernel for both
 * layouts, the weight packed per K block into panels of bf16 pairs along K, an 8 x 32 tile of
 * vdpbf16ps; a may be passed as bf16 as it lies (opts.a16). See docs/kernels.md ("bf16 GEMM for
 * training rows").
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
/* rows of a beyond which AUTO takes the packed dpbf16 kernel (when a's values are bf16) */
#define GB_PACK_ROWS 32
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
  const uint16_t *a16; /* a as bf16 (row stride lda16) for the dpbf16 variants, else NULL */
  int64_t lda16;
  const uint16_t *w;
  int64_t lda, ldw, N, K, kc;
  bool trans, avx2, avx512;
  bool packed; /* the many-rows dpbf16 kernel (a16 set) */
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

/* the end of a dot-product tile (both 512-bit variants): c[j, i] (+)= the horizontal sum of
 * s[j][i], the dot product of row j of a and row i of W */
KG_AVX512_INLINE void store_dot_sums(__m512 s[Z_NR][Z_MR], const int mr, const int nr, float *c, int64_t ldc, bool acc) {
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

/* The drivers of a dot-product tile (the same for both 512-bit variants, which differ in a's
 * type and the tile): rows_SFX walks a's rows for mr rows of W, block_t_SFX walks W's rows. */
#define DEFINE_DOT_DRIVERS(SFX, A_T, ATTR_INLINE, ATTR)                                                      \
  ATTR_INLINE void rows_##SFX(const int mr, float *c, int64_t ldc, const A_T *a, int64_t lda, const uint16_t *w, \
                              int64_t ldw, int64_t pf, int64_t N, int64_t K, bool acc) {                       \
    int64_t n = 0;                                                                                             \
    for (; n + Z_NR <= N; n += Z_NR) tile_##SFX(mr, Z_NR, c + n * ldc, ldc, a + n * lda, lda, w, ldw, pf, K, acc); \
    float *cn = c + n * ldc;                                                                                   \
    const A_T *an = a + n * lda;                                                                               \
    switch (N - n) {                                                                                           \
    case 3: tile_##SFX(mr, 3, cn, ldc, an, lda, w, ldw, pf, K, acc); break;                                    \
    case 2: tile_##SFX(mr, 2, cn, ldc, an, lda, w, ldw, pf, K, acc); break;                                    \
    case 1: tile_##SFX(mr, 1, cn, ldc, an, lda, w, ldw, pf, K, acc); break;                                    \
    default: break;                                                                                            \
    }                                                                                                          \
  }                                                                                                            \
  ATTR static void block_t_##SFX(float *c, int64_t ldc, const A_T *a, int64_t lda, const uint16_t *w, int64_t ldw, \
                                 int64_t N, int64_t mc, int64_t K, bool acc) {                                 \
    int64_t rows_ahead = TR_PF_BYTES / (2 * (ldw > 0 ? ldw : 1)), m = 0;                                       \
    int64_t pf = (rows_ahead < Z_MR ? Z_MR : rows_ahead) * ldw;                                                \
    for (; m + Z_MR <= mc; m += Z_MR) rows_##SFX(Z_MR, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);   \
    for (; m < mc; m++) rows_##SFX(1, c + m, ldc, a, lda, w + m * ldw, ldw, pf, N, K, acc);                    \
  }

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
  store_dot_sums(s, mr, nr, c, ldc, acc);
}

DEFINE_DOT_DRIVERS(z, float, KG_AVX512_INLINE, KG_AVX512)

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
  store_dot_sums(s, mr, nr, c, ldc, acc);
}

DEFINE_DOT_DRIVERS(d, uint16_t, KG_DPBF16_INLINE, KG_DPBF16)

/* ---- AVX512_BF16 variant for many rows (both layouts; a's values are bf16) ------------------ */
/* The dot-product tile above ends every K block with 16 horizontal sums and reloads a for every
 * 4 rows of W; past ~32 rows of a the usual GEMM form wins: a panel of P_NC output columns is
 * packed once per K block as bf16 pairs along K (word [p][j] = {B[2p, j], B[2p + 1, j]}, the
 * layout vdpbf16ps multiplies), and every row tile of a streams past it: per pair of k, P_NV
 * loads of the panel and one 32-bit broadcast of a per row feed P_NR x P_NV vdpbf16ps, summed in
 * registers (no horizontal sums). In the b_trans layout a pair is two adjacent elements of a row
 * of W (one 32-bit load); in the x @ W layout it interleaves two rows of W. */
#define P_NV 2           /* vectors of 16 columns per tile */
#define P_NC (16 * P_NV) /* columns per packed panel */
#define P_NR 8           /* rows of a per tile: 16 accumulators (lab: 8 x 3 and 6 x 4 no faster) */
#define P_KC 256         /* K block (elements): the panel is P_KC / 2 x P_NC words = 16 KiB, in L1 */

/* panel[p * P_NC + j] = {B[k0 + 2p, j], B[k0 + 2p + 1, j]} for columns j < nc (0 beyond, and 0 for
 * the missing half of an odd last pair); B[k, m] as in plan */
static void pack_panel(uint32_t *panel, const uint16_t *w, int64_t ldw, bool trans, int64_t m0, int64_t nc,
                       int64_t k0, int64_t kb) {
  int64_t np = (kb + 1) / 2;
  for (int64_t pi = 0; pi < np; pi++) {
    int64_t k = k0 + 2 * pi;
    bool two = k + 1 < k0 + kb;
    uint32_t *dst = panel + pi * P_NC;
    for (int64_t j = 0; j < nc; j++) {
      uint16_t lo, hi;
      if (trans) lo = w[(m0 + j) * ldw + k], hi = two ? w[(m0 + j) * ldw + k + 1] : 0;
      else lo = w[k * ldw + m0 + j], hi = two ? w[(k + 1) * ldw + m0 + j] : 0;
      dst[j] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    for (int64_t j = nc; j < P_NC; j++) dst[j] = 0;
  }
}

/* c[nr, nc] (+)= a[nr, kb] @ panel; a is bf16 (row stride lda); nr in 1..P_NR. With o16 (the
 * last K block of a bf16 output) the sums (+ c when acc) go there rounded, not to c. */
KG_DPBF16_INLINE void tile_p(const int nr, float *c, int64_t ldc, uint16_t *o16, int64_t ldo, const uint16_t *a,
                             int64_t lda, const uint32_t *panel, int64_t nc, int64_t kb, bool acc) {
  __m512 s[P_NR][P_NV];
  for (int j = 0; j < nr; j++)
    for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_setzero_ps();
  int64_t np = kb / 2, pi = 0;
  for (; pi < np; pi++) {
    __m512i wv[P_NV];
    for (int v = 0; v < P_NV; v++) wv[v] = _mm512_loadu_si512(panel + pi * P_NC + 16 * v);
    for (int j = 0; j < nr; j++) {
      uint32_t pair;
      memcpy(&pair, a + j * lda + 2 * pi, 4);
      __m512i av = _mm512_set1_epi32((int)pair);
      for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_dpbf16_ps(s[j][v], (__m512bh)av, (__m512bh)wv[v]);
    }
  }
  if (kb % 2) { /* odd last k: a's missing half is 0, as is the panel's */
    __m512i wv[P_NV];
    for (int v = 0; v < P_NV; v++) wv[v] = _mm512_loadu_si512(panel + pi * P_NC + 16 * v);
    for (int j = 0; j < nr; j++) {
      __m512i av = _mm512_set1_epi32((int)a[j * lda + 2 * pi]);
      for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_dpbf16_ps(s[j][v], (__m512bh)av, (__m512bh)wv[v]);
    }
  }
  for (int v = 0; v < P_NV; v++) {
    int64_t left = nc - 16 * v;
    if (left <= 0) break;
    __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    for (int j = 0; j < nr; j++) {
      float *p = c + j * ldc + 16 * v;
      __m512 r = acc ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), s[j][v]) : s[j][v];
      if (o16) _mm256_mask_storeu_epi16(o16 + j * ldo + 16 * v, m, (__m256i)_mm512_cvtneps_pbh(r)); /* RNE */
      else _mm512_mask_storeu_ps(p, m, r);
    }
  }
}

/* c[N, nc] (+)= a[N, kb] @ panel, P_NR rows at a time */
KG_DPBF16 static void rows_p(float *c, int64_t ldc, uint16_t *o16, int64_t ldo, const uint16_t *a, int64_t lda,
                             const uint32_t *panel, int64_t N, int64_t nc, int64_t kb, bool acc) {
  int64_t n = 0;
  for (; n + P_NR <= N; n += P_NR)
    tile_p(P_NR, c + n * ldc, ldc, o16 ? o16 + n * ldo : NULL, ldo, a + n * lda, lda, panel, nc, kb, acc);
  float *cn = c + n * ldc;
  uint16_t *on = o16 ? o16 + n * ldo : NULL;
  const uint16_t *an = a + n * lda;
  switch (N - n) {
  case 7: tile_p(7, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  case 6: tile_p(6, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  case 5: tile_p(5, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  case 4: tile_p(4, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  case 3: tile_p(3, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  case 2: tile_p(2, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  case 1: tile_p(1, cn, ldc, on, ldo, an, lda, panel, nc, kb, acc); break;
  default: break;
  }
}
#else
bool kg_cpu_gemm_bf16_avx2(void) { return false; }
bool kg_cpu_gemm_bf16_avx512(void) { return false; }
bool kg_cpu_gemm_bf16_dpbf16(void) { return false; }
#endif

/* ---- driver --------------------------------------------------------------------------------- */

/* c[N, mc] = columns [m0, m0 + mc) of the product, one K block at a time; with o16 (packed
 * kernel, bf16 output) the last block writes there instead. The packed kernel does rows
 * [n0, n0 + nr) only (c and o16 point at row n0); the others take n0 = 0, nr = N. */
static void run_chunk(const plan *p, float *c, int64_t ldc, uint16_t *o16, int64_t ldo, int64_t m0, int64_t mc,
                      int64_t n0, int64_t nr) {
  for (int64_t k0 = 0; k0 < p->K; k0 += p->kc) {
    int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc;
    bool acc = k0 > 0;
    const float *ak = p->a + k0;
    const uint16_t *wk = p->trans ? p->w + m0 * p->ldw + k0 : p->w + k0 * p->ldw + m0;
#ifdef KG_X86
    if (p->packed) {
      uint32_t panel[P_KC / 2 * P_NC];
      for (int64_t j = 0; j < mc; j += P_NC) {
        int64_t nc = mc - j < P_NC ? mc - j : P_NC;
        pack_panel(panel, p->w, p->ldw, p->trans, m0 + j, nc, k0, kb);
        uint16_t *oj = o16 && k0 + kb >= p->K ? o16 + j : NULL;
        rows_p(c + j, ldc, oj, ldo, p->a16 + n0 * p->lda16 + k0, p->lda16, panel, nr, nc, kb, acc);
      }
      continue;
    }
    if (p->a16) {
      block_t_d(c, ldc, p->a16 + k0, p->lda16, wk, p->ldw, p->N, mc, kb, acc);
      continue;
    }
    if (p->avx512 && p->trans) {
      block_t_z(c, ldc, ak, p->lda, wk, p->ldw, p->N, mc, kb, acc);
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
  plan p = {a, NULL, K, w, lda, ldw, N, K, o->kc, b_trans, false, false, false};
  bool autov = o->variant == KG_GEMM_BF16_AUTO;
  p.avx512 = o->variant == KG_GEMM_BF16_AVX512 || o->variant == KG_GEMM_BF16_DPBF16 ||
             o->variant == KG_GEMM_BF16_PACKED || (autov && kg_cpu_gemm_bf16_avx512());
  p.avx2 = p.avx512 || o->variant == KG_GEMM_BF16_AVX2 || (autov && kg_cpu_gemm_bf16_avx2());
  bool dp_cpu = o->variant == KG_GEMM_BF16_DPBF16 || o->variant == KG_GEMM_BF16_PACKED ||
                (autov && kg_cpu_gemm_bf16_dpbf16());
  p.packed = (o->a_bf16 || o->a16) && dp_cpu && (o->variant == KG_GEMM_BF16_PACKED || (autov && N > GB_PACK_ROWS));
  int64_t unit = 16; /* chunks of output columns are multiples of it */
#ifdef KG_X86
  if (p.packed) { /* an even K block that the panel buffer holds; chunks of whole panels */
    p.kc = p.kc <= 0 || p.kc > P_KC ? P_KC : (p.kc + 1) / 2 * 2;
    unit = P_NC;
  }
#else
  p.packed = false;
#endif
  if (!p.packed && p.kc <= 0) {
    p.kc = GB_A_BLOCK_BYTES / (4 * N) / 8 * 8;
    if (p.kc < 256) p.kc = 256;
    if (!b_trans && p.kc > GB_NN_KC) p.kc = GB_NN_KC;
  }
  int nt = o->threads > 0 ? o->threads : 2.0 * (double)N * (double)M * (double)K >= GB_PAR_FLOPS ? kg_num_threads() : 1;
  /* about 4 chunks per thread (balance), multiples of 16 columns (of a panel when packed), at
   * most GB_MAX_CHUNK */
  int64_t cw = (M + 4 * nt - 1) / (4 * nt);
  cw = (cw + unit - 1) / unit * unit;
  if (cw > GB_MAX_CHUNK) cw = GB_MAX_CHUNK / unit * unit;
  int64_t nchunk = (M + cw - 1) / cw, nrb = 1; /* column chunks, row blocks */
  if (p.packed) { /* wide chunks: the K block of a (N x P_KC bf16) is read once per chunk */
    nchunk = (M + GB_MAX_CHUNK - 1) / GB_MAX_CHUNK;
    if (nchunk < 4 * nt) nchunk = (nchunk + nt - 1) / nt * nt; /* as many per thread */
    cw = ((M + nchunk - 1) / nchunk + unit - 1) / unit * unit;
    nchunk = (M + cw - 1) / cw;
    if (nchunk < nt) nrb = nt < N ? nt : N; /* too few columns: the threads split the rows */
  }
  int64_t rbs = (N + nrb - 1) / nrb, nitem = nrb * nchunk;
  if (nt > nitem) nt = (int)nitem;
  if (o->a16 && !p.packed) return kg_error(KG_ERR_VALUE, "matmul", "bf16 a needs the packed AVX512_BF16 kernel");
  bool dp = p.packed || (b_trans && o->a_bf16 && dp_cpu);
  size_t a16_bytes = 0;
  uint16_t *a16 = dp && !o->a16 ? kg_cpu_alloc((size_t)(N * K * 2), &a16_bytes) : NULL;
  if (dp && !o->a16 && !a16) return kg_error(KG_ERR_OOM, "matmul", "out of memory packing operands");
  for (int64_t n = 0; a16 && n < N; n++) kg_cpu_store_f32(a16 + n * K, KG_BF16, 1, a + n * lda, K); /* exact */
  p.a16 = o->a16 ? o->a16 : a16;
  p.lda16 = o->a16 ? o->lda16 : K;
  bool direct = odt == KG_F32, oom = false;
  bool direct16 = p.packed && odt == KG_BF16; /* the tiles round into out themselves */
  bool need_cb = !direct && (!direct16 || K > p.kc); /* f32 sums between K blocks */
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t bytes = 0;
    float *cb = need_cb ? kg_cpu_alloc((size_t)(rbs * cw * 4), &bytes) : NULL;
    if (need_cb && !cb) {
#pragma omp atomic write
      oom = true;
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < nitem; it++) {
      if (oom) continue;
      int64_t ch = it % nchunk, n0 = it / nchunk * rbs;
      int64_t m0 = ch * cw, mc = M - m0 < cw ? M - m0 : cw, nr = N - n0 < rbs ? N - n0 : rbs;
      if (nr <= 0) continue;
      char *orow = (char *)out + n0 * ldo * os;
      if (direct) {
        run_chunk(&p, (float *)orow + m0, ldo, NULL, 0, m0, mc, n0, nr);
        continue;
      }
      if (direct16) {
        run_chunk(&p, cb, mc, (uint16_t *)orow + m0, ldo, m0, mc, n0, nr);
        continue;
      }
      run_chunk(&p, cb, mc, NULL, 0, m0, mc, n0, nr);
      for (int64_t n = 0; n < nr; n++) kg_cpu_store_f32(orow + (n * ldo + m0) * os, odt, 1, cb + n * mc, mc);
    }
    if (cb) kg_cpu_free(cb, bytes);
  }
  if (a16) kg_cpu_free(a16, a16_bytes);
  return oom ? kg_error(KG_ERR_OOM, "matmul", "out of memory for the f32 result") : KG_OK;
}
