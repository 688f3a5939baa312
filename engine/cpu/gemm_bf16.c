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
 * Training rows (past 32 rows of a whose values are bf16, or past 16 against a weight of at most
 * 2 MiB; AVX512_BF16): a packed kernel for both layouts, a (in L2-sized blocks) and the weight
 * (one panel at a time) packed per K block as bf16 pairs along K, an 8 x 32 tile of vdpbf16ps; a
 * may be passed as bf16 as it lies (opts.a16), also transposed (opts.a16_trans: dW = g^T x). See
 * docs/kernels.md ("bf16 GEMM for training rows").
 */
#include "gemm_bf16.h"

#include <keng/scalar.h>
#include <omp.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KG_X86 1
#endif

/* flops below which the product stays on one thread */
#define GB_PAR_FLOPS (4 << 20)
/* a GEMV (1-2 rows of a) is a weight stream: it takes the threads from this many weight bytes
 * (the 1B model's [2048 -> 256] k/v product, 1 MiB: 1 thread 14 GB/s, 2 threads 19-25 with the
 * second core free, where the flop rule kept it on one). Not lower: the tiny presets' 768 KiB
 * gate+up sits in L2/L3 (~30 us), where the second thread's wake-up and the join eat the gain */
#ifndef GB_PAR_GEMV_BYTES
#define GB_PAR_GEMV_BYTES (1 << 20)
#endif
/* rows of a beyond which AUTO takes the packed dpbf16 kernel (when a's values are bf16); beyond
 * GB_PACK_ROWS_SMALL_W rows already when the weight holds at most GB_PACK_SMALL_W bytes: batch-32
 * decode's projections, 1 thread, [32,256] x [256,256]ᵀ 25 vs 32 us, x [1024,256]ᵀ 96 vs 124 us;
 * its 16 MiB LM head stays on the dot tile (4.0 vs 4.4 ms packed) */
#define GB_PACK_ROWS 32
#define GB_PACK_ROWS_SMALL_W 16
#define GB_PACK_SMALL_W ((int64_t)2 << 20)
/* rows of bf16 a from which AUTO takes the AMX kernel (up to 32, b_trans) */
#ifndef GB_AMX_ROWS
#define GB_AMX_ROWS 8
#endif
/* widest chunk of output columns (bounds the per-thread f32 buffer for a bf16/f16 output) */
#define GB_MAX_CHUNK 512
/* widest chunk of the packed kernel: a's K block is packed once per chunk */
#ifndef GB_PACK_CHUNK
#define GB_PACK_CHUNK 2048
#endif
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
  bool packed;    /* the many-rows dpbf16 kernel (a16, or a holding bf16 values) */
  bool a16_trans; /* packed: a[n, k] = a16[k * lda16 + n] */
  int64_t kb_rows;  /* packed: 0, or rows of a per block when the row blocks are the outer loop
                       (every panel of B packed once for all of K) */
  bool amx;                /* the AMX kernel (b_trans, 3..32 rows of bf16 a) */
  const uint16_t *amx_a;   /* amx: a in 16-row blocks, zero-padded to amx_ld (a multiple of 32) */
  int64_t amx_ld;
  bool amx_packed; /* packed, on AMX tiles (run_amx_packed) */
} plan;

/* per-thread packing buffers of the many-rows kernel */
typedef struct {
  uint32_t *a, *b;
} packbuf;

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

/* the CPU's features are read once; KENG_NO_SIMD=1 (kg_cpu_simd, read each call: the labs switch
 * it) turns every vector kernel off */
static bool cpu_avx2(void) {
  if (have_avx2 < 0) {
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
  }
  return have_avx2 == 1;
}

bool kg_cpu_gemm_bf16_avx2(void) { return cpu_avx2() && kg_cpu_simd() > 0; }

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

static bool cpu_avx512(void) {
  if (have_avx512 < 0) {
    __builtin_cpu_init();
    have_avx512 = cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl")
                      ? 1
                      : 0;
  }
  return have_avx512 == 1;
}

bool kg_cpu_gemm_bf16_avx512(void) { return cpu_avx512() && kg_cpu_simd() > 0; }

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

static bool cpu_dpbf16(void) {
  if (have_dpbf16 < 0) {
    __builtin_cpu_init();
    have_dpbf16 = cpu_avx512() && __builtin_cpu_supports("avx512bf16") ? 1 : 0;
  }
  return have_dpbf16 == 1;
}

bool kg_cpu_gemm_bf16_dpbf16(void) { return cpu_dpbf16() && kg_cpu_simd() > 0; }

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

/* ---- AVX512_BF16 GEMV (1 or 2 rows of a, b_trans): batch-1 decode -------------------------- */
/* Batch-1 decode is a pure weight stream: what matters is how many cache lines are in flight and
 * how few instructions each line costs. Against the 4 x 4 tile: 8 rows of W per tile (8 streams
 * in flight, a loaded once per 8 rows), one prefetch per cache line of each row (the 4 x 4 tile
 * issues two per line), and the 8 x nr sums reduced in a tree (12 shuffles and adds per row of a
 * for 8 results) instead of 8 horizontal sums. */
#define GV_MR 8 /* rows of W per tile */
#define GV_NR 2 /* rows of a at most */
#ifndef GV_PF_BYTES
#define GV_PF_BYTES 8192 /* prefetch distance along the weight stream */
#endif
#ifndef GV_HINT
#define GV_HINT _MM_HINT_T0
#endif

/* {sum(v[0]), ..., sum(v[7])} */
KG_DPBF16_INLINE __m256 reduce8(const __m512 v[8]) {
  __m512 u[4], w[2];
  for (int i = 0; i < 4; i++) /* 8 lanes of v[2i] in lanes 0..7, of v[2i + 1] in 8..15 */
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  for (int i = 0; i < 2; i++) /* 4 lanes of v[4i + b] in 128-bit block b */
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xdd));
  /* block b: lanes 0, 1 = 2 lanes of v[b], v[4 + b] (twice); then lane 0 = sum(v[b]), 1 = sum(v[4 + b]) */
  __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4e));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, x));
}

/* c[nr, mr] (+)= a[nr, K] . W[mr, K]; mr in {1, GV_MR}, nr in {1, 2} */
KG_DPBF16_INLINE void tile_gv(const int mr, const int nr, float *c, int64_t ldc, const uint16_t *a, int64_t lda,
                              const uint16_t *w, int64_t ldw, int64_t pf, int64_t K, bool acc) {
  __m512 s[GV_NR][GV_MR];
  for (int j = 0; j < GV_NR; j++)
    for (int i = 0; i < GV_MR; i++) s[j][i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i av[GV_NR];
    for (int j = 0; j < nr; j++) av[j] = _mm512_loadu_si512(a + j * lda + k);
    for (int i = 0; i < mr; i++) {
      _mm_prefetch((const char *)(w + i * ldw + pf + k), GV_HINT);
      __m512i wv = _mm512_loadu_si512(w + i * ldw + k);
      for (int j = 0; j < nr; j++) s[j][i] = _mm512_dpbf16_ps(s[j][i], (__m512bh)av[j], (__m512bh)wv);
    }
  }
  if (k < K) { /* K % 32 tail: masked loads (zeros past the end) */
    __mmask32 m = (__mmask32)((1u << (K - k)) - 1);
    __m512i av[GV_NR];
    for (int j = 0; j < nr; j++) av[j] = _mm512_maskz_loadu_epi16(m, a + j * lda + k);
    for (int i = 0; i < mr; i++) {
      __m512i wv = _mm512_maskz_loadu_epi16(m, w + i * ldw + k);
      for (int j = 0; j < nr; j++) s[j][i] = _mm512_dpbf16_ps(s[j][i], (__m512bh)av[j], (__m512bh)wv);
    }
  }
  for (int j = 0; j < nr; j++) {
    float *cj = c + j * ldc;
    if (mr == GV_MR) {
      __m256 r = reduce8(s[j]);
      _mm256_storeu_ps(cj, acc ? _mm256_add_ps(_mm256_loadu_ps(cj), r) : r);
    } else {
      float r = _mm512_reduce_add_ps(s[j][0]);
      cj[0] = acc ? cj[0] + r : r;
    }
  }
}

KG_DPBF16_INLINE void rows_gv(const int nr, float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *w,
                              int64_t ldw, int64_t mc, int64_t K, bool acc) {
  /* the prefetch runs a whole number of tiles ahead: row i of a later tile at the same k */
  int64_t tiles = GV_PF_BYTES / (2 * GV_MR * (ldw > 0 ? ldw : 1)), m = 0;
  int64_t pf = (tiles < 1 ? 1 : tiles) * GV_MR * ldw;
  for (; m + GV_MR <= mc; m += GV_MR) tile_gv(GV_MR, nr, c + m, ldc, a, lda, w + m * ldw, ldw, pf, K, acc);
  for (; m < mc; m++) tile_gv(1, nr, c + m, ldc, a, lda, w + m * ldw, ldw, pf, K, acc);
}

KG_DPBF16 static void block_t_gv(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *w, int64_t ldw,
                                 int64_t N, int64_t mc, int64_t K, bool acc) {
  if (N == 2) rows_gv(2, c, ldc, a, lda, w, ldw, mc, K, acc);
  else rows_gv(1, c, ldc, a, lda, w, ldw, mc, K, acc);
}

/* ---- AVX512_BF16 variant for many rows (both layouts; a's values are bf16) ------------------ */
/* The dot-product tile above ends every K block with 16 horizontal sums and reloads a for every
 * 4 rows of W; past ~32 rows of a the usual GEMM form wins. Per K block of P_KC:
 *   - a is taken P_A_BYTES at a time (1024 rows at K block 256: the block stays in L2) and packed
 *     into micro-panels of P_NR rows, word [p][r] = {a[r, 2p], a[r, 2p + 1]}, so that the tile's
 *     8 broadcasts per pair read one 32-byte run. a may be bf16 row-major, bf16 transposed (dW =
 *     g^T x: two rows of g interleave into the pairs of 32 rows of a) or f32 holding bf16 values
 *     (the high halves). A narrow chunk of columns (few panels to share the packing) reads a
 *     bf16 row-major a as it lies instead, unless its row stride is a multiple of 4 KiB (then the
 *     tile's 8 rows share one L1 set);
 *   - B is packed one panel of P_NC columns at a time as bf16 pairs along K (word [p][j] =
 *     {B[2p, j], B[2p + 1, j]}, the layout vdpbf16ps multiplies; in the b_trans layout a pair is
 *     two adjacent elements of a row of W, in the x @ W layout it interleaves two rows of W) just
 *     before its use: the panel (16 KiB, in L1) meets every micro-panel of the a block. Per pair
 *     of k, P_NV loads of the panel and P_NR 32-bit broadcasts of a feed P_NR x P_NV vdpbf16ps,
 *     summed in registers (no horizontal sums).
 * An odd last k is a pair whose high half is 0 on both sides; rows past the end of a are 0 in the
 * micro-panel (read as row 0 when a is read as it lies) and not stored. The sizes are macros so
 * that the lab can build variants (docs/kernels.md has the losing ones). */
#ifndef P_NV
#define P_NV 2 /* vectors of 16 columns per tile (lab: 3 no faster) */
#endif
#define P_NC (16 * P_NV) /* columns per packed panel */
#define P_NR 8           /* rows of a per tile: 16 accumulators (the packing of a assumes 8) */
#ifndef P_KC
#define P_KC 256 /* K block (elements): a panel is P_KC / 2 x P_NC words = 16 KiB, in L1 (320, 384, 512 alike) */
#endif
#ifndef P_A_BYTES
#define P_A_BYTES (512 * 1024) /* block of a (1024 rows at K block 256), in L2 (256 KiB slower) */
#endif
#ifndef P_B_ALL_BYTES
#define P_B_ALL_BYTES (1 << 20) /* panels of a chunk for all of K: rows outside the K blocks */
#endif
#ifndef P_C_BYTES
#define P_C_BYTES (256 * 1024) /* f32 sums of a row block when the rows are outside, in L2 */
#endif
#ifndef P_DIRECT_COLS
#define P_DIRECT_COLS 512 /* chunks up to this wide read a bf16 a as it lies */
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1 /* where the next tile's rows of c are fetched */
#endif

/* mp[p * ld + j] = word p of r[j], p < 16, j < 8: the 8 x 16 transpose of 32-bit words */
KG_DPBF16_INLINE void transpose_8x16(uint32_t *mp, int64_t ld, const __m512i r[8]) {
  __m512i t[8], u[8];
  for (int j = 0; j < 4; j++) { /* lane L of t[2j] (t[2j + 1]): rows 2j, 2j + 1 of words 4L, 4L + 1 (4L + 2, 4L + 3) */
    t[2 * j] = _mm512_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
    t[2 * j + 1] = _mm512_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
  }
  for (int h = 0; h < 2; h++) { /* lane L of u[4h + i]: rows 4h .. 4h + 3 of word 4L + i */
    u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int i = 0; i < 4; i++) { /* rows 0..7 of words i, 4 + i, 8 + i, 12 + i */
    __m512i x = _mm512_permutex2var_epi64(u[i], lo, u[4 + i]), y = _mm512_permutex2var_epi64(u[i], hi, u[4 + i]);
    _mm256_storeu_si256((__m256i *)(mp + i * ld), _mm512_castsi512_si256(x));
    _mm256_storeu_si256((__m256i *)(mp + (4 + i) * ld), _mm512_extracti64x4_epi64(x, 1));
    _mm256_storeu_si256((__m256i *)(mp + (8 + i) * ld), _mm512_castsi512_si256(y));
    _mm256_storeu_si256((__m256i *)(mp + (12 + i) * ld), _mm512_extracti64x4_epi64(y, 1));
  }
}

/* the panel of B for columns [m0, m0 + nc) (nc <= P_NC), K block [k0, k0 + kb):
 * bp[p * P_NC + j] = {B[k0 + 2p, m0 + j], B[k0 + 2p + 1, m0 + j]}, 0 past column nc and for the
 * missing half of an odd last pair; B[k, m] as in plan */
KG_DPBF16 static void pack_b(uint32_t *bp, const uint16_t *w, int64_t ldw, bool trans, int64_t m0, int64_t nc,
                             int64_t k0, int64_t kb) {
  int64_t np = (kb + 1) / 2;
  if (trans) { /* a pair is one 32-bit word of a row of W: 8 rows x 16 pairs at a time, transposed */
    for (int64_t j = 0; j < P_NC; j += 8)
      for (int64_t pi = 0; pi < np; pi += 16) {
        int64_t left = kb - 2 * pi; /* k left in the block, >= 1 */
        __mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
        __m512i r[8];
        for (int i = 0; i < 8; i++)
          r[i] = j + i < nc ? _mm512_maskz_loadu_epi16(m, w + (m0 + j + i) * ldw + k0 + 2 * pi) : _mm512_setzero_si512();
        if (np - pi >= 16) {
          transpose_8x16(bp + pi * P_NC + j, P_NC, r);
          continue;
        }
        uint32_t tmp[16 * 8]; /* the last < 16 pairs: the panel ends here */
        transpose_8x16(tmp, 8, r);
        for (int64_t q = 0; q < np - pi; q++) memcpy(bp + (pi + q) * P_NC + j, tmp + q * 8, 32);
      }
    return;
  }
  for (int64_t pi = 0; pi < np; pi++) { /* two rows of W, zero-extended and interleaved */
    const uint16_t *lo = w + (k0 + 2 * pi) * ldw + m0;
    bool two = 2 * pi + 1 < kb;
    for (int v = 0; v < P_NV; v++) {
      int64_t left = nc - 16 * v;
      __mmask16 m = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
      __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + 16 * v));
      __m512i h = two ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + ldw + 16 * v)) : _mm512_setzero_si512();
      _mm512_storeu_si512(bp + pi * P_NC + 16 * v, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
    }
  }
}

/* micro-panels of a for rows [n0, n0 + nr), K block [k0, k0 + kb): micro-panel t at
 * ap + t * np * P_NR, ap[p * P_NR + r] = {a[n0 + 8t + r, k0 + 2p], a[.., k0 + 2p + 1]}, 0 for rows
 * past nr and for the missing half of an odd last pair. Row-major a goes 8 rows x 16 pairs at a
 * time through a transpose of words (lab: scalar packing was 4-12% of 2048^3) */
KG_DPBF16 static void pack_a(uint32_t *ap, const plan *p, int64_t n0, int64_t nr, int64_t k0, int64_t kb) {
  int64_t np = (kb + 1) / 2;
  const __m512i odd = _mm512_setr_epi32(0x30001, 0x70005, 0xb0009, 0xf000d, 0x130011, 0x170015, 0x1b0019, 0x1f001d,
                                        0x230021, 0x270025, 0x2b0029, 0x2f002d, 0x330031, 0x370035, 0x3b0039,
                                        0x3f003d); /* words 1, 3, .., 63: the high halves of 32 f32 */
  if (p->a16_trans) { /* a[n, k] = a16[k * lda16 + n]: 32 rows (a cache line of two rows of a16) at a time */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int64_t t = 0; t * P_NR < nr; t += 4) {
      int64_t r0 = n0 + t * P_NR, rows = nr - t * P_NR < 4 * P_NR ? nr - t * P_NR : 4 * P_NR;
      __mmask32 m = rows >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << rows) - 1);
      uint32_t *mp = ap + t * np * P_NR;
      for (int64_t pi = 0; pi < np; pi++) {
        const uint16_t *src = p->a16 + (k0 + 2 * pi) * p->lda16 + r0;
        __m512i l = _mm512_maskz_loadu_epi16(m, src);
        __m512i h = 2 * pi + 1 < kb ? _mm512_maskz_loadu_epi16(m, src + p->lda16) : _mm512_setzero_si512();
        /* lane L of ul / uh: pairs of rows 8L .. 8L + 3 / 8L + 4 .. 8L + 7 */
        __m512i ul = _mm512_unpacklo_epi16(l, h), uh = _mm512_unpackhi_epi16(l, h);
        __m512i x = _mm512_permutex2var_epi64(ul, lo, uh), y = _mm512_permutex2var_epi64(ul, hi, uh);
        _mm256_storeu_si256((__m256i *)(mp + pi * P_NR), _mm512_castsi512_si256(x));
        if (rows > P_NR) _mm256_storeu_si256((__m256i *)(mp + (np + pi) * P_NR), _mm512_extracti64x4_epi64(x, 1));
        if (rows > 2 * P_NR) _mm256_storeu_si256((__m256i *)(mp + (2 * np + pi) * P_NR), _mm512_castsi512_si256(y));
        if (rows > 3 * P_NR) _mm256_storeu_si256((__m256i *)(mp + (3 * np + pi) * P_NR), _mm512_extracti64x4_epi64(y, 1));
      }
    }
    return;
  }
  for (int64_t t = 0; t * P_NR < nr; t++) {
    uint32_t *mp = ap + t * np * P_NR;
    int64_t r0 = n0 + t * P_NR, rows = nr - t * P_NR < P_NR ? nr - t * P_NR : P_NR;
    for (int64_t pi = 0; pi < np; pi += 16) { /* 16 pairs = 32 k of each row */
      int64_t left = kb - 2 * pi;             /* k left in the block, >= 1 */
      __m512i r[P_NR];
      for (int j = 0; j < P_NR; j++) {
        if (j >= rows) {
          r[j] = _mm512_setzero_si512();
        } else if (p->a16) {
          __mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
          r[j] = _mm512_maskz_loadu_epi16(m, p->a16 + (r0 + j) * p->lda16 + k0 + 2 * pi);
        } else { /* f32 holding bf16 values: the high halves, exact */
          const float *f = p->a + (r0 + j) * p->lda + k0 + 2 * pi;
          __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
          __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
          __m512i x = _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, f));
          __m512i y = _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, f + 16));
          r[j] = _mm512_permutex2var_epi16(x, odd, y);
        }
      }
      if (np - pi >= 16) {
        transpose_8x16(mp + pi * P_NR, P_NR, r);
      } else { /* the last < 16 pairs: through a buffer, the micro-panel ends here */
        uint32_t tmp[16 * P_NR];
        transpose_8x16(tmp, P_NR, r);
        memcpy(mp + pi * P_NR, tmp, (size_t)((np - pi) * P_NR * 4));
      }
    }
  }
}

/* s += micro-panel ap [8, 2 np] @ panel bp [2 np, P_NC] */
KG_DPBF16_INLINE void dot_pairs(__m512 s[P_NR][P_NV], const uint32_t *ap, const uint32_t *bp, int64_t np) {
  for (int64_t pi = 0; pi < np; pi++, ap += P_NR, bp += P_NC) {
    __m512i wv[P_NV];
    for (int v = 0; v < P_NV; v++) wv[v] = _mm512_load_si512(bp + 16 * v);
    for (int j = 0; j < P_NR; j++) {
      __m512i av = _mm512_set1_epi32((int)ap[j]);
      for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_dpbf16_ps(s[j][v], (__m512bh)av, (__m512bh)wv[v]);
    }
  }
}

/* the m lanes of q (+)= r, or with o (a bf16 output's last K block) o = q (+) r rounded */
KG_DPBF16_INLINE void store_row(float *q, uint16_t *o, __m512 r, __mmask16 m, bool acc) {
  if (acc) r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, q), r);
  if (o) _mm256_mask_storeu_epi16(o, m, (__m256i)_mm512_cvtneps_pbh(r)); /* RNE */
  else _mm512_mask_storeu_ps(q, m, r);
}

/* s += rows of a as they lie (bf16, row j at a + j * lda; rows past nr read row 0 and are not
 * stored) [P_NR, kb] @ panel bp [kb, P_NC]; an odd last k broadcasts one bf16 (high half 0) */
KG_DPBF16_INLINE void dot_rows(__m512 s[P_NR][P_NV], const uint16_t *a, int64_t lda, int nr, const uint32_t *bp,
                               int64_t kb) {
  const uint16_t *row[P_NR];
  for (int j = 0; j < P_NR; j++) row[j] = a + (j < nr ? j : 0) * lda;
  for (int64_t pi = 0; pi < kb / 2; pi++, bp += P_NC) {
    __m512i wv[P_NV];
    for (int v = 0; v < P_NV; v++) wv[v] = _mm512_load_si512(bp + 16 * v);
    for (int j = 0; j < P_NR; j++) {
      uint32_t pair;
      memcpy(&pair, row[j] + 2 * pi, 4);
      __m512i av = _mm512_set1_epi32((int)pair);
      for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_dpbf16_ps(s[j][v], (__m512bh)av, (__m512bh)wv[v]);
    }
  }
  if (kb % 2) {
    __m512i wv[P_NV];
    for (int v = 0; v < P_NV; v++) wv[v] = _mm512_load_si512(bp + 16 * v);
    for (int j = 0; j < P_NR; j++) {
      __m512i av = _mm512_set1_epi32((int)row[j][kb - 1]);
      for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_dpbf16_ps(s[j][v], (__m512bh)av, (__m512bh)wv[v]);
    }
  }
}

/* c[nr, nc] (+)= micro-panel ap [8, kb] (or with ar the rows of a as they lie, row stride lda) @
 * panel bp [kb, P_NC]; nr in 1..P_NR, nc in 1..P_NC.
 * With o16 (the last K block of a bf16 output) the sums (+ c when acc) go there rounded, not to
 * c. */
KG_DPBF16_INLINE void tile_p(float *c, int64_t ldc, uint16_t *o16, int64_t ldo, const uint32_t *ap, const uint16_t *ar,
                             int64_t lda, const uint32_t *bp, int64_t kb, int nr, int64_t nc, bool acc) {
  __m512 s[P_NR][P_NV];
  for (int j = 0; j < P_NR; j++)
    for (int v = 0; v < P_NV; v++) s[j][v] = _mm512_setzero_ps();
  /* c, read back after the loop, comes from L3 or DRAM: the next tile's rows are fetched now
   * (lab: 2048^3 one thread 90 ms, 111 ms without; fetching this tile's own rows late in the
   * loop as well gained nothing) */
  if (acc)
    for (int j = 0; j < P_NR; j++) /* past the last row too: a prefetch does not fault */
      for (int v = 0; v < P_NV; v++) _mm_prefetch((const char *)(c + (j + P_NR) * ldc + 16 * v), PF_HINT);
  if (ar) dot_rows(s, ar, lda, nr, bp, kb);
  else dot_pairs(s, ap, bp, (kb + 1) / 2);
  if (nr == P_NR && nc == P_NC) { /* constant indices only: the accumulators stay in registers */
    for (int j = 0; j < P_NR; j++)
      for (int v = 0; v < P_NV; v++) store_row(c + j * ldc + 16 * v, o16 ? o16 + j * ldo + 16 * v : NULL, s[j][v],
                                               (__mmask16)0xffff, acc);
    return;
  }
  float t[P_NR][P_NC]; /* an edge tile goes through a buffer */
  for (int j = 0; j < P_NR; j++)
    for (int v = 0; v < P_NV; v++) _mm512_storeu_ps(t[j] + 16 * v, s[j][v]);
  for (int v = 0; v < P_NV && nc > 16 * v; v++) {
    int64_t left = nc - 16 * v;
    __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    for (int j = 0; j < nr; j++)
      store_row(c + j * ldc + 16 * v, o16 ? o16 + j * ldo + 16 * v : NULL, _mm512_loadu_ps(t[j] + 16 * v), m, acc);
  }
}

/* rows of a per packed block of np pairs: P_A_BYTES of micro-panels, a multiple of P_NR */
static int64_t block_rows(int64_t np) {
  int64_t r = P_A_BYTES / (np * 4) / P_NR * P_NR;
  return r < P_NR ? P_NR : r;
}

/* c[nr, mc] (row n0 of the product at c, o16) = columns [m0, m0 + mc) of rows [n0, n0 + nr) of the
 * product, one K block at a time; with o16 (bf16 output) the last block writes there instead.
 * Per K block, each block of a is packed once (it stays in L2) and each panel of B is packed just
 * before its use (it is in L1 for every micro-panel of the block) */
KG_DPBF16 static void run_packed(const plan *p, const packbuf *pb, float *c, int64_t ldc, uint16_t *o16, int64_t ldo,
                                 int64_t m0, int64_t mc, int64_t n0, int64_t nr) {
  /* a bf16 a read as it lies when few panels would share its packing and its row stride does not
   * put the tile's 8 rows in one L1 set (a multiple of 4 KiB) */
  bool rows = p->a16 && !p->a16_trans && mc <= P_DIRECT_COLS && p->lda16 * 2 % 4096 != 0;
  for (int64_t k0 = 0; k0 < p->K; k0 += p->kc) {
    int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc, np = (kb + 1) / 2, mb = block_rows(np);
    bool acc = k0 > 0, last = k0 + kb >= p->K;
    for (int64_t i0 = 0; i0 < nr; i0 += mb) {
      int64_t nb = nr - i0 < mb ? nr - i0 : mb;
      if (!rows) pack_a(pb->a, p, n0 + i0, nb, k0, kb);
      for (int64_t j = 0; j < mc; j += P_NC) {
        int64_t nc = mc - j < P_NC ? mc - j : P_NC;
        pack_b(pb->b, p->w, p->ldw, p->trans, m0 + j, nc, k0, kb);
        for (int64_t t = 0; t * P_NR < nb; t++) {
          int64_t r = i0 + t * P_NR;
          int nrt = nb - t * P_NR < P_NR ? (int)(nb - t * P_NR) : P_NR;
          uint16_t *o = o16 && last ? o16 + r * ldo + j : NULL;
          const uint16_t *ar = rows ? p->a16 + (n0 + r) * p->lda16 + k0 : NULL;
          tile_p(c + r * ldc + j, ldc, o, ldo, pb->a + t * np * P_NR, ar, p->lda16, pb->b, kb, nrt, nc, acc);
        }
      }
    }
  }
}

/* the same with the row blocks outside the K blocks (plan.kb_rows rows each): the f32 sums of a
 * block of rows x mc stay in L2 from one K block to the next instead of streaming through DRAM,
 * and every panel of B, packed once for all of K at the start, is reused by every row block */
KG_DPBF16 static void run_packed_rows(const plan *p, const packbuf *pb, float *c, int64_t ldc, uint16_t *o16,
                                      int64_t ldo, int64_t m0, int64_t mc, int64_t n0, int64_t nr) {
  bool rows = p->a16 && !p->a16_trans && mc <= P_DIRECT_COLS && p->lda16 * 2 % 4096 != 0;
  int64_t npan = (mc + P_NC - 1) / P_NC;
  for (int64_t k0 = 0, off = 0; k0 < p->K; k0 += p->kc) { /* K block k0 at pb->b + off, panels np words apart */
    int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc, np = (kb + 1) / 2;
    for (int64_t j = 0; j < mc; j += P_NC)
      pack_b(pb->b + off + j / P_NC * np * P_NC, p->w, p->ldw, p->trans, m0 + j, mc - j < P_NC ? mc - j : P_NC, k0, kb);
    off += npan * np * P_NC;
  }
  for (int64_t i0 = 0; i0 < nr; i0 += p->kb_rows) {
    int64_t nb = nr - i0 < p->kb_rows ? nr - i0 : p->kb_rows;
    for (int64_t k0 = 0, off = 0; k0 < p->K; k0 += p->kc) {
      int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc, np = (kb + 1) / 2;
      bool acc = k0 > 0, last = k0 + kb >= p->K;
      if (!rows) pack_a(pb->a, p, n0 + i0, nb, k0, kb);
      for (int64_t j = 0; j < mc; j += P_NC) {
        int64_t nc = mc - j < P_NC ? mc - j : P_NC;
        const uint32_t *bp = pb->b + off + j / P_NC * np * P_NC;
        for (int64_t t = 0; t * P_NR < nb; t++) {
          int64_t r = i0 + t * P_NR;
          int nrt = nb - t * P_NR < P_NR ? (int)(nb - t * P_NR) : P_NR;
          uint16_t *o = o16 && last ? o16 + r * ldo + j : NULL;
          const uint16_t *ar = rows ? p->a16 + (n0 + r) * p->lda16 + k0 : NULL;
          tile_p(c + r * ldc + j, ldc, o, ldo, pb->a + t * np * P_NR, ar, p->lda16, bp, kb, nrt, nc, acc);
        }
      }
      off += npan * np * P_NC;
    }
  }
}

/* ---- AMX-BF16 variant of the b_trans layout: 3..32 rows of bf16 a (batch decode) ---------- */
/* At batch 8-32 the dot-product tile is compute-bound (batch-32 decode of the tiny presets: the
 * LM head ~4 ms of a ~9 ms step at 1 thread). One tdpbf16ps does a 16 x 16 x 32 product (the 4 x 4
 * vdpbf16ps tile needs 16 instructions for 4 x 4 x 32), so with AMX the weight stream is the bound
 * again. Per chunk of columns, 32 columns (a panel, pack_b's layout: bf16 pairs along K, one
 * 128-byte row per pair, which the two B tiles of 16 columns read with stride 128) at a time,
 * all of K into 4 C tiles (2 blocks of 16 rows of a x 2 halves of the panel) that stay in tile
 * registers; a is packed once per call into 16-row blocks zero-padded to 32 k (p->amx_a), and the
 * panel's pairs past the K block are zero, so the padding adds 0. Tiles: C 0-3, A 4-5, B 6-7. */
#define KG_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define AMX_KC 256 /* K block of the panel (elements): AMX_KC / 2 x 32 words = 16 KiB, in L1 */

static int have_amx = -1;

bool kg_cpu_gemm_bf16_amx(void) {
  if (have_amx < 0) {
    unsigned a, b, c, d;
    /* CPUID.(7, 0).EDX: bit 22 AMX-BF16, bit 24 AMX-TILE; then the kernel's permission to use the
     * tile data state (Linux asks for it per process) */
    bool cpu = cpu_dpbf16() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
    have_amx = cpu && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : 0;
  }
  return have_amx == 1 && kg_cpu_simd() > 0;
}

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

/* fetches rows [m, m + nr) of W, columns [k0, k0 + kb), into L2: the packing's 8-row loads
 * wait on L3 or DRAM otherwise (the LM head, 16 MiB, was packed at ~6 GB/s without) */
KG_AMX static void prefetch_panel(const uint16_t *w, int64_t ldw, int64_t m, int64_t nr, int64_t k0, int64_t kb) {
  for (int64_t r = 0; r < nr; r++) {
    const char *row = (const char *)(w + (m + r) * ldw + k0);
    for (int64_t b = 0; b < kb * 2; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

/* c[N, mc] = columns [m0, m0 + mc) of the product (N <= 32, all of K) */
KG_AMX static void run_amx(const plan *p, const packbuf *pb, float *c, int64_t ldc, int64_t m0, int64_t mc) {
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  const uint16_t *a0 = p->amx_a, *a1 = p->amx_a + 16 * p->amx_ld;
  long lda = (long)(p->amx_ld * 2);
  bool two = p->N > 16;
  float out[32][32];
  for (int64_t j = 0; j < mc; j += P_NC) {
    int64_t nc = mc - j < P_NC ? mc - j : P_NC;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k0 = 0; k0 < p->K; k0 += AMX_KC) {
      int64_t kb = p->K - k0 < AMX_KC ? p->K - k0 : AMX_KC, np = (kb + 1) / 2, np16 = (np + 15) / 16 * 16;
      if (k0 + kb < p->K) /* the next K block of this panel, else the next panel's first */
        prefetch_panel(p->w, p->ldw, m0 + j, nc, k0 + kb, p->K - k0 - kb < AMX_KC ? p->K - k0 - kb : AMX_KC);
      else if (j + P_NC < mc)
        prefetch_panel(p->w, p->ldw, m0 + j + P_NC, mc - j - P_NC < P_NC ? mc - j - P_NC : P_NC, 0,
                       p->K < AMX_KC ? p->K : AMX_KC);
      pack_b(pb->b, p->w, p->ldw, true, m0 + j, nc, k0, kb);
      memset(pb->b + np * P_NC, 0, (size_t)((np16 - np) * P_NC * 4));
      __asm__ volatile("" ::: "memory"); /* the tile loads below are asm the compiler cannot see reading the panel */
      for (int64_t q = 0; q < np16; q += 16) {
        _tile_loadd(6, pb->b + q * P_NC, P_NC * 4);
        _tile_loadd(7, pb->b + q * P_NC + 16, P_NC * 4);
        _tile_loadd(4, a0 + k0 + 2 * q, lda);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, a1 + k0 + 2 * q, lda);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
    }
    _tile_stored(0, &out[0][0], 128);
    _tile_stored(1, &out[0][16], 128);
    if (two) {
      _tile_stored(2, &out[16][0], 128);
      _tile_stored(3, &out[16][16], 128);
    }
    __asm__ volatile("" ::: "memory");
    for (int64_t n = 0; n < p->N; n++) memcpy(c + n * ldc + j, out[n], (size_t)(nc * 4));
  }
  _tile_release();
}

/* ---- AMX-BF16 variant of the many-rows kernel (both layouts; a's values are bf16) ---------- */
/* The packed kernel's 8 x 32 vdpbf16ps tile does 8 x 32 x 2 products per 16 instructions; one
 * tdpbf16ps does 16 x 16 x 32. Same blocking as run_packed (per K block of AP_KC: a block of a in
 * L2, one panel of B in L1 at a time, packed by pack_b as for the packed kernel and zeroed to a
 * whole number of 16-pair tile rows), with a packed into 16-row groups of 1 KiB tiles (16 rows x
 * 32 k, row-major, zero past the rows and past the K block) so that every tile load reads 1 KiB
 * in a row. Per 32 rows x 32 columns: 4 C tiles (the f32 sums, loaded from c after the first K
 * block) x 2 A tiles x 2 B tiles, the 8 tile registers. Tiles: C 0-3, A 4-5, B 6-7. */
#ifndef AP_KC
#define AP_KC 256 /* K block (elements, a multiple of 32): a panel is AP_KC / 2 x 128 bytes, in L1 */
#endif
#define AP_TILE 512 /* bf16 per packed A tile: 16 rows x 32 k */

/* rows of a per packed block of kb (a multiple of 32) k: P_A_BYTES of tiles, a multiple of 32 */
static int64_t amx_block_rows(int64_t kb) {
  int64_t r = P_A_BYTES / (kb * 2) / 32 * 32;
  return r < 32 ? 32 : r;
}

/* out[r] = word r of row 0..15 of the 16 x 16 transpose of 32-bit words v[0..15] (row p of v:
 * words of 16 columns) */
KG_AMX static void transpose_16x16(__m512i v[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  /* u[4i + j], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + j */
  for (int j = 0; j < 4; j++) {
    __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), x1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    __m512i y0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd), y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    v[j] = _mm512_shuffle_i32x4(x0, x1, 0x88);      /* column j */
    v[8 + j] = _mm512_shuffle_i32x4(x0, x1, 0xdd);  /* column 8 + j */
    v[4 + j] = _mm512_shuffle_i32x4(y0, y1, 0x88);  /* column 4 + j */
    v[12 + j] = _mm512_shuffle_i32x4(y0, y1, 0xdd); /* column 12 + j */
  }
}

/* rows [n0, n0 + nr) of a, K block [k0, k0 + kb), as 16-row groups of tiles: group g, k step q at
 * ap + (g * nq + q) * AP_TILE, [r * 32 + kk] = a[n0 + 16g + r, k0 + 32q + kk]; 0 past nr (up to
 * a multiple of 32 rows) and past kb (nq = kb rounded up to 32, / 32) */
KG_AMX static void pack_a_amx(uint16_t *ap, const plan *p, int64_t n0, int64_t nr, int64_t k0, int64_t kb) {
  int64_t nq = (kb + 31) / 32, ng = (nr + 31) / 32 * 2;
  const __m512i odd = _mm512_setr_epi32(0x30001, 0x70005, 0xb0009, 0xf000d, 0x130011, 0x170015, 0x1b0019, 0x1f001d,
                                        0x230021, 0x270025, 0x2b0029, 0x2f002d, 0x330031, 0x370035, 0x3b0039,
                                        0x3f003d); /* words 1, 3, .., 63: the high halves of 32 f32 */
  for (int64_t g = 0; g < ng; g++)
    for (int64_t q = 0; q < nq; q++) {
      uint16_t *t = ap + (g * nq + q) * AP_TILE;
      int64_t left = kb - 32 * q, r0 = n0 + 16 * g, rows = nr - 16 * g; /* k left >= 1; rows may be <= 0 */
      __mmask32 km = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
      if (p->a16_trans && rows > 0) { /* a[n, k] = a16[k * lda16 + n]: pairs of k rows, then a 16 x 16 word transpose */
        __mmask16 nm = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
        __m512i v[16];
        for (int pi = 0; pi < 16; pi++) {
          int64_t k = k0 + 32 * q + 2 * pi;
          __m512i lo = 2 * pi < left ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(nm, p->a16 + k * p->lda16 + r0))
                                     : _mm512_setzero_si512();
          __m512i hi = 2 * pi + 1 < left
                           ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(nm, p->a16 + (k + 1) * p->lda16 + r0))
                           : _mm512_setzero_si512();
          v[pi] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)); /* word n: {a[n, k], a[n, k + 1]} */
        }
        transpose_16x16(v);
        for (int r = 0; r < 16; r++) _mm512_storeu_si512(t + r * 32, v[r]);
        continue;
      }
      for (int64_t r = 0; r < 16; r++) {
        __m512i x;
        if (r >= rows) {
          x = _mm512_setzero_si512();
        } else if (p->a16) {
          x = _mm512_maskz_loadu_epi16(km, p->a16 + (r0 + r) * p->lda16 + k0 + 32 * q);
        } else { /* f32 holding bf16 values: the high halves, exact */
          const float *f = p->a + (r0 + r) * p->lda + k0 + 32 * q;
          __mmask16 m0 = (__mmask16)km, m1 = (__mmask16)(km >> 16);
          x = _mm512_permutex2var_epi16(_mm512_castps_si512(_mm512_maskz_loadu_ps(m0, f)), odd,
                                        _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, f + 16)));
        }
        _mm512_storeu_si512(t + r * 32, x);
      }
    }
}

/* c[nr, nc] (+)= rows of the product at c (f32, row stride ldc) or, with o16 (the last K block of
 * a bf16 output), rounded into o16; ap: the two A tile groups (16 rows each, nq steps), bp: the
 * panel; nr in 1..32, nc in 1..32 */
KG_AMX static void tile_amx(float *c, int64_t ldc, uint16_t *o16, int64_t ldo, const uint16_t *ap, int64_t nq,
                            const uint32_t *bp, int nr, int64_t nc, bool acc) {
  bool two = nr > 16, full = nr == 32 && nc == 32 && !o16;
  float e[32][32]; /* an edge block, or the sums before rounding to bf16 */
  if (acc && full) {
    _tile_loadd(0, c, ldc * 4);
    _tile_loadd(1, c + 16, ldc * 4);
    _tile_loadd(2, c + 16 * ldc, ldc * 4);
    _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  } else if (acc) {
    for (int r = 0; r < 32; r++) {
      __mmask16 m0 = r < nr ? (nc >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nc) - 1)) : 0;
      __mmask16 m1 = r < nr && nc > 16 ? (nc >= 32 ? (__mmask16)0xffff : (__mmask16)((1u << (nc - 16)) - 1)) : 0;
      _mm512_storeu_ps(e[r], _mm512_maskz_loadu_ps(m0, c + r * ldc));
      _mm512_storeu_ps(e[r] + 16, _mm512_maskz_loadu_ps(m1, c + r * ldc + 16));
    }
    __asm__ volatile("" ::: "memory"); /* the tile loads are asm the compiler cannot see reading e */
    _tile_loadd(0, &e[0][0], 128);
    _tile_loadd(1, &e[0][16], 128);
    _tile_loadd(2, &e[16][0], 128);
    _tile_loadd(3, &e[16][16], 128);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const uint16_t *a1 = ap + nq * AP_TILE;
  for (int64_t q = 0; q < nq; q++) {
    _tile_loadd(6, bp + q * 16 * P_NC, P_NC * 4);
    _tile_loadd(7, bp + q * 16 * P_NC + 16, P_NC * 4);
    _tile_loadd(4, ap + q * AP_TILE, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, a1 + q * AP_TILE, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (full) {
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
    return;
  }
  _tile_stored(0, &e[0][0], 128);
  _tile_stored(1, &e[0][16], 128);
  if (two) {
    _tile_stored(2, &e[16][0], 128);
    _tile_stored(3, &e[16][16], 128);
  }
  __asm__ volatile("" ::: "memory");
  for (int r = 0; r < nr; r++)
    for (int v = 0; v < 2 && nc > 16 * v; v++) {
      int64_t left = nc - 16 * v;
      __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
      __m512 x = _mm512_loadu_ps(e[r] + 16 * v);
      if (o16) _mm256_mask_storeu_epi16(o16 + r * ldo + 16 * v, m, (__m256i)_mm512_cvtneps_pbh(x)); /* RNE */
      else _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m, x);
    }
}

/* run_packed with the AMX tile: c[nr, mc] (row n0 of the product at c, o16) = columns
 * [m0, m0 + mc) of rows [n0, n0 + nr), one K block at a time */
KG_AMX static void run_amx_packed(const plan *p, const packbuf *pb, float *c, int64_t ldc, uint16_t *o16, int64_t ldo,
                                  int64_t m0, int64_t mc, int64_t n0, int64_t nr) {
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  uint16_t *ap = (uint16_t *)pb->a;
  for (int64_t k0 = 0; k0 < p->K; k0 += p->kc) {
    int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc, np = (kb + 1) / 2, nq = (kb + 31) / 32;
    int64_t mb = amx_block_rows(p->kc); /* p->kc: a multiple of 32, the block the buffer was sized for */
    bool acc = k0 > 0, last = k0 + kb >= p->K;
    for (int64_t i0 = 0; i0 < nr; i0 += mb) {
      int64_t nb = nr - i0 < mb ? nr - i0 : mb;
      pack_a_amx(ap, p, n0 + i0, nb, k0, kb);
      for (int64_t j = 0; j < mc; j += P_NC) {
        int64_t nc = mc - j < P_NC ? mc - j : P_NC;
        pack_b(pb->b, p->w, p->ldw, p->trans, m0 + j, nc, k0, kb);
        memset(pb->b + np * P_NC, 0, (size_t)((nq * 16 - np) * P_NC * 4));
        __asm__ volatile("" ::: "memory"); /* the tile loads read the panel */
        for (int64_t t = 0; t * 32 < nb; t++) {
          int64_t r = i0 + t * 32;
          int nrt = nb - t * 32 < 32 ? (int)(nb - t * 32) : 32;
          uint16_t *o = o16 && last ? o16 + r * ldo + j : NULL;
          tile_amx(c + r * ldc + j, ldc, o, ldo, ap + 2 * t * nq * AP_TILE, nq, pb->b, nrt, nc, acc);
        }
      }
    }
  }
  _tile_release();
}
#else
bool kg_cpu_gemm_bf16_avx2(void) { return false; }
bool kg_cpu_gemm_bf16_avx512(void) { return false; }
bool kg_cpu_gemm_bf16_dpbf16(void) { return false; }
bool kg_cpu_gemm_bf16_amx(void) { return false; }
#endif

/* ---- driver --------------------------------------------------------------------------------- */

/* c[N, mc] = columns [m0, m0 + mc) of the product, one K block at a time; with o16 (packed
 * kernel, bf16 output) the last block writes there instead. The packed kernel does rows
 * [n0, n0 + nr) only (c and o16 point at row n0); the others take n0 = 0, nr = N. */
static void run_chunk(const plan *p, const packbuf *pb, float *c, int64_t ldc, uint16_t *o16, int64_t ldo, int64_t m0,
                      int64_t mc, int64_t n0, int64_t nr) {
#ifdef KG_X86
  if (p->amx) {
    run_amx(p, pb, c, ldc, m0, mc);
    return;
  }
  if (p->amx_packed) {
    run_amx_packed(p, pb, c, ldc, o16, ldo, m0, mc, n0, nr);
    return;
  }
  if (p->packed) {
    if (p->kb_rows) run_packed_rows(p, pb, c, ldc, o16, ldo, m0, mc, n0, nr);
    else run_packed(p, pb, c, ldc, o16, ldo, m0, mc, n0, nr);
    return;
  }
#else
  (void)pb, (void)o16, (void)ldo, (void)n0, (void)nr;
#endif
  for (int64_t k0 = 0; k0 < p->K; k0 += p->kc) {
    int64_t kb = p->K - k0 < p->kc ? p->K - k0 : p->kc;
    bool acc = k0 > 0;
    const float *ak = p->a + k0;
    const uint16_t *wk = p->trans ? p->w + m0 * p->ldw + k0 : p->w + k0 * p->ldw + m0;
#ifdef KG_X86
    if (p->a16 && p->N <= GV_NR) {
      block_t_gv(c, ldc, p->a16 + k0, p->lda16, wk, p->ldw, p->N, mc, kb, acc);
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
  bool forced_amx = o->variant == KG_GEMM_BF16_AMX;
  p.avx512 = p.avx512 || forced_amx, p.avx2 = p.avx2 || forced_amx;
  bool forced_amxp = o->variant == KG_GEMM_BF16_AMX_PACKED;
  p.avx512 = p.avx512 || forced_amxp, p.avx2 = p.avx2 || forced_amxp;
  bool dp_cpu = o->variant == KG_GEMM_BF16_DPBF16 || o->variant == KG_GEMM_BF16_PACKED || forced_amx || forced_amxp ||
                (autov && kg_cpu_gemm_bf16_dpbf16());
  p.packed = (o->a_bf16 || o->a16) && dp_cpu &&
             (o->variant == KG_GEMM_BF16_PACKED || forced_amxp ||
              (autov && (N > GB_PACK_ROWS || (N > GB_PACK_ROWS_SMALL_W && 2 * K * M <= GB_PACK_SMALL_W))));
  int64_t unit = 16; /* chunks of output columns are multiples of it */
#ifdef KG_X86
  bool amx_ok = autov && kg_cpu_gemm_bf16_amx() && kg_env_bool(KG_ENV_KENG_GEMM_AMX); /* AUTO may take AMX */
  p.amx = b_trans && o->a_bf16 && !o->a16 && N >= 3 && N <= 32 && (forced_amx || (amx_ok && N >= GB_AMX_ROWS));
  if (p.amx) p.packed = false, unit = P_NC;
  p.amx_packed = p.packed && (forced_amxp || amx_ok);
  if (p.amx_packed) /* K blocks of whole tiles (32 k) */
    p.kc = p.kc <= 0 || p.kc > AP_KC ? AP_KC : (p.kc + 31) / 32 * 32;
  else if (p.packed) /* an even K block that the panel buffer holds */
    p.kc = p.kc <= 0 || p.kc > P_KC ? P_KC : (p.kc + 1) / 2 * 2;
  if (p.packed) unit = P_NC; /* chunks of whole panels */
#else
  p.packed = false;
#endif
  if (!p.packed && p.kc <= 0) {
    p.kc = GB_A_BLOCK_BYTES / (4 * N) / 8 * 8;
    if (p.kc < 256) p.kc = 256;
    if (!b_trans && p.kc > GB_NN_KC) p.kc = GB_NN_KC;
  }
  bool par = 2.0 * (double)N * (double)M * (double)K >= GB_PAR_FLOPS || (N <= 2 && 2 * M * K >= GB_PAR_GEMV_BYTES);
  int nt = o->threads > 0 ? o->threads : par ? kg_num_threads() : 1;
  /* about 4 chunks per thread (balance), multiples of 16 columns (of a panel when packed), at
   * most GB_MAX_CHUNK */
  int64_t cw = (M + 4 * nt - 1) / (4 * nt);
  cw = (cw + unit - 1) / unit * unit;
  if (cw > GB_MAX_CHUNK) cw = GB_MAX_CHUNK / unit * unit;
  int64_t nchunk = (M + cw - 1) / cw, nrb = 1; /* column chunks, row blocks */
  if (p.packed) { /* wide chunks: the K block of a (N x P_KC bf16) is packed once per chunk */
    nchunk = (M + GB_PACK_CHUNK - 1) / GB_PACK_CHUNK;
    if (nchunk < 4 * nt) nchunk = (nchunk + nt - 1) / nt * nt; /* as many per thread */
    cw = ((M + nchunk - 1) / nchunk + unit - 1) / unit * unit;
    nchunk = (M + cw - 1) / cw;
    if (nchunk < nt) nrb = nt < N ? nt : N; /* too few columns: the threads split the rows */
  }
  int64_t rbs = (N + nrb - 1) / nrb, nitem = nrb * nchunk;
  if (nt > nitem) nt = (int)nitem;
  if (o->a16 && !p.packed) return kg_error(KG_ERR_VALUE, "matmul", "bf16 a needs the packed AVX512_BF16 kernel");
  /* the dot-product dpbf16 tile reads a as bf16 rows: an exact bf16 copy of an f32 a (the
   * packed kernel packs a itself) */
  bool dp = !p.packed && b_trans && o->a_bf16 && dp_cpu;
  size_t a16_bytes = 0;
  uint16_t *a16 = dp ? kg_cpu_alloc((size_t)(N * K * 2), &a16_bytes) : NULL;
  if (dp && !a16) return kg_error(KG_ERR_OOM, "matmul", "out of memory packing operands");
  for (int64_t n = 0; a16 && n < N; n++) kg_cpu_store_f32(a16 + n * K, KG_BF16, 1, a + n * lda, K); /* exact */
  p.a16 = o->a16 ? o->a16 : a16;
  p.lda16 = o->a16 ? o->lda16 : K;
  p.a16_trans = o->a16 && o->a16_trans;
  /* amx: a as bf16 in 16-row blocks, zero past row N and past K up to a multiple of 32 */
  size_t amx_bytes = 0;
  uint16_t *amx_a = NULL;
  if (p.amx) {
    p.amx_ld = (K + 31) / 32 * 32;
    int64_t rows = N > 16 ? 32 : 16;
    amx_a = kg_cpu_alloc((size_t)(rows * p.amx_ld * 2), &amx_bytes);
    if (!amx_a) {
      if (a16) kg_cpu_free(a16, a16_bytes);
      return kg_error(KG_ERR_OOM, "matmul", "out of memory packing operands");
    }
    memset(amx_a, 0, (size_t)(rows * p.amx_ld * 2));
    for (int64_t n = 0; n < N; n++) memcpy(amx_a + n * p.amx_ld, p.a16 + n * p.lda16, (size_t)(K * 2));
    p.amx_a = amx_a;
  }
  bool direct = odt == KG_F32, oom = false;
  bool direct16 = p.packed && odt == KG_BF16; /* the tiles round into out themselves */
  bool need_cb = !direct && (!direct16 || K > p.kc); /* f32 sums between K blocks */
  /* packed: a block of a and a panel of B, one K block of each */
  size_t apk_want = 0, bpk_want = 0;
#ifdef KG_X86
  if (p.amx) bpk_want = (size_t)(AMX_KC / 2 * P_NC * 4); /* one panel of a K block */
  if (p.amx_packed) { /* a block (amx_block_rows of a K block, at most rbs rows rounded up to 32), a panel */
    int64_t kq = (p.kc + 31) / 32 * 32, rows = (rbs + 31) / 32 * 32, most = amx_block_rows(kq);
    apk_want = (size_t)((rows < most ? rows : most) * kq * 2), bpk_want = (size_t)(kq / 2 * P_NC * 4);
  } else if (p.packed) { /* a block (block_rows of a K block, at most rbs rows), a panel */
    int64_t pairs = (p.kc + 1) / 2, all = pairs * ((rbs + P_NR - 1) / P_NR * P_NR) * 4;
    int64_t most = P_A_BYTES + pairs * P_NR * 4;
    apk_want = (size_t)(all < most ? all : most), bpk_want = (size_t)(pairs * P_NC * 4);
    /* several K blocks and a narrow chunk whose panels for all of K fit P_B_ALL_BYTES: row blocks
     * outside (run_packed_rows), P_C_BYTES of f32 sums each */
    int64_t nkb = (K + p.kc - 1) / p.kc, ball = (K / 2 + nkb) * ((cw + P_NC - 1) / P_NC) * P_NC * 4;
    if (nkb > 1 && ball <= P_B_ALL_BYTES) {
      int64_t r = P_C_BYTES / (cw * 4) / P_NR * P_NR, rmax = block_rows(pairs);
      p.kb_rows = r < P_NR ? P_NR : r > rmax ? rmax : r;
      bpk_want = (size_t)ball;
    }
  }
#endif
  bool dyn = !p.packed && !p.amx && !p.amx_packed;
  int64_t next = 0; /* dyn: the next item to take */
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    size_t bytes = 0, apk_bytes = 0, bpk_bytes = 0;
    float *cb = need_cb ? kg_cpu_alloc((size_t)(rbs * cw * 4), &bytes) : NULL;
    packbuf pb = {apk_want ? kg_cpu_alloc(apk_want, &apk_bytes) : NULL, bpk_want ? kg_cpu_alloc(bpk_want, &bpk_bytes) : NULL};
    if ((need_cb && !cb) || (p.packed && (!pb.a || !pb.b)) || (p.amx && !pb.b)) {
#pragma omp atomic write
      oom = true;
    }
    /* the dot-product tiles take chunks first come, first served: a thread that starts late (its
     * wake-up, or a busy core) leaves its share to the others instead of making them wait at
     * the end (the 1B decode's [2048 -> 2048] product, 2 threads on a busy machine: 8.7 GB/s
     * with each thread's half fixed); the packed kernels keep contiguous static blocks */
    int tid = omp_get_thread_num(), tn = omp_get_num_threads();
    int64_t q = nitem / tn, r = nitem % tn, lo = tid * q + (tid < r ? tid : r), hi = lo + q + (tid < r);
    for (int64_t k = 0;; k++) {
      int64_t it = lo + k;
      if (dyn) {
#pragma omp atomic capture
        it = next++;
      }
      if (it >= (dyn ? nitem : hi)) break;
      if (oom) continue;
      int64_t ch = it % nchunk, n0 = it / nchunk * rbs;
      int64_t m0 = ch * cw, mc = M - m0 < cw ? M - m0 : cw, nr = N - n0 < rbs ? N - n0 : rbs;
      if (nr <= 0) continue;
      char *orow = (char *)out + n0 * ldo * os;
      if (direct) {
        run_chunk(&p, &pb, (float *)orow + m0, ldo, NULL, 0, m0, mc, n0, nr);
        continue;
      }
      if (direct16) {
        run_chunk(&p, &pb, cb, mc, (uint16_t *)orow + m0, ldo, m0, mc, n0, nr);
        continue;
      }
      run_chunk(&p, &pb, cb, mc, NULL, 0, m0, mc, n0, nr);
      for (int64_t n = 0; n < nr; n++) kg_cpu_store_f32(orow + (n * ldo + m0) * os, odt, 1, cb + n * mc, mc);
    }
    if (cb) kg_cpu_free(cb, bytes);
    kg_cpu_free(pb.a, apk_bytes);
    kg_cpu_free(pb.b, bpk_bytes);
  }
  if (a16) kg_cpu_free(a16, a16_bytes);
  if (amx_a) kg_cpu_free(amx_a, amx_bytes);
  return oom ? kg_error(KG_ERR_OOM, "matmul", "out of memory for the f32 result") : KG_OK;
}
