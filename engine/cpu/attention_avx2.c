/* attention_avx2.c (cpu) — the f32-compute SDPA forward and backward with AVX2 + FMA
 * register-blocked tile products instead of BLAS calls (attention.c keeps the BLAS tiles for
 * f64 and for CPUs without AVX2/FMA; it calls here otherwise).
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads, T query length, S key length,
 * D head dim, Dp = D rounded up to 8 (packed rows are zero-padded to Dp). bq, bk: the query
 * and key tile (kg_attn_tune; 64 x 64 by default, the forward's keys 128: bkf). On a CPU with
 * AVX-512 the tile products and the softmax rows run 16 lanes wide (micro_z, the *_z row
 * pieces), with the same per-element arithmetic order as the AVX2 tile.
 *
 * Why: a 64 x 64 x 64 sgemm call spends more time packing its operands than multiplying, and
 * the tiles are multiplied many times. Here every operand is packed at most once, in the
 * layout the micro-kernel reads, and converted to f32 while packing (bf16/f16 inputs are never
 * copied whole); f32 rows with unit stride and D % 8 == 0 are read in place (rows_f32). The
 * softmax scale is folded into the packed Kᵀ, so Q is never scaled.
 *   forward, task (b, kv head, chunk of query rows) over the G query heads of the kv head
 *     (or over one query head when that leaves too few tasks): scale·K of the chunk's visible
 *     keys transposed to kt [Dp, keys] once; per query tile, S = Q·kt and acc += P·V with an
 *     online softmax
 *     (running max m and sum l per row), so no [T, S] matrix exists. With at most 4 query rows
 *     (a decode step) the scores are dot products with K's rows instead: no transposition.
 *   backward, task (b, kv head, run of key tiles): per key tile kb, kt (scaled), vt packed
 *     once; per query tile of each query head of the group S = Q·kt, dP = dO·vt,
 *     P = exp(S - lse), dS = P ∘ (dP - delta), then dv += Pᵀ·dO, dk += dSᵀ·Q (A read
 *     transposed, no copy; scaled at the store) and dq += dS·kb into an f32 accumulator per
 *     key run, summed over runs and scaled at the end (no two tasks write one row, so no
 *     atomics).
 * The micro-kernel C[mr, 8·nv] (+)= A[mr, K]·B[K, 8·nv] keeps mr x nv (up to 6 x 2) vectors
 * of C in registers, broadcasting A's elements against 8-wide rows of B: 12 FMAs per 2 loads
 * of B and 6 broadcasts, so it is FMA-bound. Keys and query tiles skip what the causal band
 * and window hide, as in attention.c.
 */
#include "attention.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma")))
#include "attention_simd.h" /* exp8, hsum8 */
#define MR 6 /* rows of C per micro-tile */

bool kg_attn_avx2_available(void) {
  static int have = -1; /* set once; a race writes the same value */
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return have == 1 && kg_cpu_simd() > 0; /* KENG_NO_SIMD=1: the scalar tiles (read each call) */
}

static int64_t round8(int64_t n) { return (n + 7) & ~(int64_t)7; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- tile product ------------------------------------------------------------------------ */

/* C[r, n] (+)= Σ_k A[r·ars + k·aks] · B[k·ldb + n] for r < mr, n < 8·nv; mr and nv are
 * constants at each call site. The accumulators are named variables, not an array: GCC 12
 * kept an array of them on the stack (a store per FMA, 2.5x slower). */
#define MK_FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
static inline __attribute__((always_inline)) AVX2 void micro(const int mr, const int nv, int64_t K, const float *A,
                                                              int64_t ars, int64_t aks, const float *B, int64_t ldb,
                                                              float *C, int64_t ldc, bool acc) {
#define MK_INIT(r)                                                                          \
  __m256 c0_##r = _mm256_setzero_ps(), c1_##r = _mm256_setzero_ps();                        \
  if (acc && mr > r) {                                                                      \
    c0_##r = _mm256_loadu_ps(C + r * ldc);                                                  \
    if (nv == 2) c1_##r = _mm256_loadu_ps(C + r * ldc + 8);                                 \
  }
  MK_FOR_ROWS(MK_INIT)
  for (int64_t k = 0; k < K; k++) {
    const float *a = A + k * aks, *b = B + k * ldb;
    __m256 b0 = _mm256_loadu_ps(b), b1 = nv == 2 ? _mm256_loadu_ps(b + 8) : b0;
#define MK_FMA(r)                                                                           \
    if (mr > r) {                                                                           \
      __m256 ar = _mm256_broadcast_ss(a + r * ars);                                         \
      c0_##r = _mm256_fmadd_ps(ar, b0, c0_##r);                                             \
      if (nv == 2) c1_##r = _mm256_fmadd_ps(ar, b1, c1_##r);                                \
    }
    MK_FOR_ROWS(MK_FMA)
  }
#define MK_STORE(r)                                                                         \
  if (mr > r) {                                                                             \
    _mm256_storeu_ps(C + r * ldc, c0_##r);                                                  \
    if (nv == 2) _mm256_storeu_ps(C + r * ldc + 8, c1_##r);                                 \
  }
  MK_FOR_ROWS(MK_STORE)
}

typedef void (*micro_fn)(int64_t K, const float *A, int64_t ars, int64_t aks, const float *B, int64_t ldb, float *C,
                         int64_t ldc, bool acc);
#define MICRO(mr, nv)                                                                                            \
  static AVX2 void micro_##mr##_##nv(int64_t K, const float *A, int64_t ars, int64_t aks, const float *B,      \
                                     int64_t ldb, float *C, int64_t ldc, bool acc) {                            \
    micro(mr, nv, K, A, ars, aks, B, ldb, C, ldc, acc);                                                         \
  }
MICRO(1, 1) MICRO(2, 1) MICRO(3, 1) MICRO(4, 1) MICRO(5, 1) MICRO(6, 1)
MICRO(1, 2) MICRO(2, 2) MICRO(3, 2) MICRO(4, 2) MICRO(5, 2) MICRO(6, 2)
static const micro_fn micro_tab[2][MR + 1] = {
    {NULL, micro_1_1, micro_2_1, micro_3_1, micro_4_1, micro_5_1, micro_6_1},
    {NULL, micro_1_2, micro_2_2, micro_3_2, micro_4_2, micro_5_2, micro_6_2}};

/* The same tile with AVX-512 (F): C[mr, 16·nz] in mr x nz zmm accumulators, 16 columns per
 * FMA instead of 8 (twice the work per instruction on a CPU with two 512-bit FMA pipes). Each
 * element of C is still one chain of FMAs over k in order, so the result is bit for bit the
 * AVX2 tile's. */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
static int have_avx512 = -1; /* set once; a race writes the same value */
static bool avx512_available(void) {
  if (have_avx512 < 0) {
    __builtin_cpu_init();
    have_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return have_avx512 == 1 && kg_cpu_simd() > 0;
}

static inline __attribute__((always_inline)) AVX512 void micro_z(const int mr, const int nz, int64_t K, const float *A,
                                                                  int64_t ars, int64_t aks, const float *B, int64_t ldb,
                                                                  float *C, int64_t ldc, bool acc) {
#define MZ_INIT(r)                                                                          \
  __m512 z0_##r = _mm512_setzero_ps(), z1_##r = _mm512_setzero_ps();                        \
  if (acc && mr > r) {                                                                      \
    z0_##r = _mm512_loadu_ps(C + r * ldc);                                                  \
    if (nz == 2) z1_##r = _mm512_loadu_ps(C + r * ldc + 16);                                \
  }
  MK_FOR_ROWS(MZ_INIT)
  for (int64_t k = 0; k < K; k++) {
    const float *a = A + k * aks, *b = B + k * ldb;
    __m512 b0 = _mm512_loadu_ps(b), b1 = nz == 2 ? _mm512_loadu_ps(b + 16) : b0;
#define MZ_FMA(r)                                                                           \
    if (mr > r) {                                                                           \
      __m512 ar = _mm512_set1_ps(a[r * ars]);                                               \
      z0_##r = _mm512_fmadd_ps(ar, b0, z0_##r);                                             \
      if (nz == 2) z1_##r = _mm512_fmadd_ps(ar, b1, z1_##r);                                \
    }
    MK_FOR_ROWS(MZ_FMA)
  }
#define MZ_STORE(r)                                                                         \
  if (mr > r) {                                                                             \
    _mm512_storeu_ps(C + r * ldc, z0_##r);                                                  \
    if (nz == 2) _mm512_storeu_ps(C + r * ldc + 16, z1_##r);                                \
  }
  MK_FOR_ROWS(MZ_STORE)
}
#define MICROZ(mr, nz)                                                                                           \
  static AVX512 void microz_##mr##_##nz(int64_t K, const float *A, int64_t ars, int64_t aks, const float *B,   \
                                        int64_t ldb, float *C, int64_t ldc, bool acc) {                         \
    micro_z(mr, nz, K, A, ars, aks, B, ldb, C, ldc, acc);                                                       \
  }
MICROZ(1, 1) MICROZ(2, 1) MICROZ(3, 1) MICROZ(4, 1) MICROZ(5, 1) MICROZ(6, 1)
MICROZ(1, 2) MICROZ(2, 2) MICROZ(3, 2) MICROZ(4, 2) MICROZ(5, 2) MICROZ(6, 2)
static const micro_fn microz_tab[2][MR + 1] = {
    {NULL, microz_1_1, microz_2_1, microz_3_1, microz_4_1, microz_5_1, microz_6_1},
    {NULL, microz_1_2, microz_2_2, microz_3_2, microz_4_2, microz_5_2, microz_6_2}};

/* C [M, N] (+)= A [M, K] · B [K, N] with A(r, k) = A[r·ars + k·aks] (row-major or read
 * transposed), B rows ldb apart; N a multiple of 8. Each 16-column panel of B (K x 16, in L1;
 * 32 columns with AVX-512, an 8-column tail on the AVX2 tile) serves every row block of A. The
 * rows are split evenly into blocks of 5 or 6 (64 = 9·6 + 2·5, not 10·6 + 4: a 4-row or 2-row
 * block does a third fewer FMAs per load of B). */
static void tile_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t aks, const float *B,
                      int64_t ldb, float *C, int64_t ldc, bool acc) {
  int64_t nblk = cdiv(M, MR), base = M / (nblk > 0 ? nblk : 1), extra = M - base * nblk;
  bool z = avx512_available();
  for (int64_t n0 = 0, step; n0 < N; n0 += step) {
    const micro_fn *tab;
    if (z && N - n0 >= 16) {
      int nz = N - n0 >= 32 ? 2 : 1;
      tab = microz_tab[nz - 1], step = 16 * nz;
    } else {
      int nv = N - n0 >= 16 ? 2 : 1;
      tab = micro_tab[nv - 1], step = 8 * nv;
    }
    for (int64_t blk = 0, r0 = 0; blk < nblk; blk++) {
      int mr = (int)(base + (blk < extra));
      tab[mr](K, A + r0 * ars, ars, aks, B + n0, ldb, C + r0 * ldc + n0, ldc, acc);
      r0 += mr;
    }
  }
}

/* C[r, c] = scale · A[r, :Dp] · Bk[c, :Dp] for r < M, c < N: scores straight from key rows,
 * for the few query rows of a decode step, where transposing the keys would cost as much as
 * the product */
static AVX2 void tile_dots(int64_t M, int64_t N, int64_t Dp, const float *A, int64_t lda, const float *Bk, int64_t ldk,
                           float scale, float *C, int64_t ldc) {
  for (int64_t r = 0; r < M; r++)
    for (int64_t c = 0; c < N; c++) {
      const float *a = A + r * lda, *b = Bk + c * ldk;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < Dp; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      C[r * ldc + c] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))) * scale;
    }
}

/* ---- softmax pieces ---------------------------------------------------------------------- */

static inline AVX2 float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* max of s [n8] (NaN ignored, as the scalar path's compare) */
static AVX2 float row_max_y(const float *s, int64_t n8) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  for (int64_t c = 0; c < n8; c += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + c), m);
  return hmax8(m);
}
/* s[c] <- e^(s[c] - m) for c < n8; returns Σ. Two vectors per step: exp8 is one long
 * dependency chain, and two in flight keep the FMA pipes busier. */
static AVX2 float row_exp_y(float *s, int64_t n8, float m) {
  __m256 mv = _mm256_set1_ps(m), sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= n8; c += 16) {
    __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), mv));
    __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c + 8), mv));
    _mm256_storeu_ps(s + c, e0);
    _mm256_storeu_ps(s + c + 8, e1);
    sum0 = _mm256_add_ps(sum0, e0);
    sum1 = _mm256_add_ps(sum1, e1);
  }
  if (c < n8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), mv));
    _mm256_storeu_ps(s + c, e);
    sum0 = _mm256_add_ps(sum0, e);
  }
  return hsum8(_mm256_add_ps(sum0, sum1));
}
static AVX2 void row_scale_y(float *a, int64_t n8, float f) {
  __m256 fv = _mm256_set1_ps(f);
  for (int64_t c = 0; c < n8; c += 8) _mm256_storeu_ps(a + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), fv));
}
/* p[c] <- e^(s[c] - L), ds[c] <- p[c]·(dp[c] - dl) (s holds p afterwards, dp holds ds) */
static AVX2 void row_probs_grad_y(float *s, float *dp, int64_t n8, float L, float dl) {
  __m256 Lv = _mm256_set1_ps(L), dlv = _mm256_set1_ps(dl);
  for (int64_t c = 0; c < n8; c += 8) {
    __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), Lv));
    _mm256_storeu_ps(s + c, p);
    _mm256_storeu_ps(dp + c, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + c), dlv)));
  }
}

/* Score row s [n8] of query i against keys j0..j0+nk: mask applied (bool: -inf where false,
 * float: added), -inf outside the band and in the padding columns nk..n8. */
/* s[c] += bias[c] (f32) or s[c] <- -inf where !keep[c] (bool), for c < n; unit stride, read in
 * place: sam's bias is as large as the scores, and a copy per row cost a quarter of its time */
static AVX2 void mask_row_unit_y(float *s, const void *mp, kg_dtype dt, int64_t n) {
  int64_t c = 0;
  if (dt == KG_F32) {
    const float *bias = mp;
    for (; c + 8 <= n; c += 8)
      _mm256_storeu_ps(s + c, _mm256_add_ps(_mm256_loadu_ps(s + c), _mm256_loadu_ps(bias + c)));
    for (; c < n; c++) s[c] += bias[c];
  } else {
    const uint8_t *keep = mp;
    __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (; c + 8 <= n; c += 8) {
      __m256i k8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(keep + c)));
      __m256 hide = _mm256_castsi256_ps(_mm256_cmpeq_epi32(k8, _mm256_setzero_si256()));
      _mm256_storeu_ps(s + c, _mm256_blendv_ps(_mm256_loadu_ps(s + c), ninf, hide));
    }
    for (; c < n; c++) s[c] = keep[c] ? s[c] : -INFINITY;
  }
}

/* The row pieces with AVX-512: 16 lanes per step, an 8-lane tail on the AVX2 formula (rows are
 * padded to a multiple of 8). exp16 is exp8's formula lane for lane (same bits); the sums of
 * row_exp add in another order. */
static inline AVX512 __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f);
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));
  __m512 k = _mm512_roundscale_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(0.5f)),
                                  _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1 / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1 / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1 / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1 / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
}
static AVX512 float row_max_z(const float *s, int64_t n8) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t c = 0;
  for (; c + 16 <= n8; c += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + c), m);
  float r = _mm512_reduce_max_ps(m), t = c < n8 ? row_max_y(s + c, n8 - c) : -INFINITY;
  return t > r ? t : r;
}
static AVX512 float row_exp_z(float *s, int64_t n8, float m) {
  __m512 mv = _mm512_set1_ps(m), sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= n8; c += 32) {
    __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c), mv));
    __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c + 16), mv));
    _mm512_storeu_ps(s + c, e0);
    _mm512_storeu_ps(s + c + 16, e1);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  for (; c + 16 <= n8; c += 16) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c), mv));
    _mm512_storeu_ps(s + c, e);
    sum0 = _mm512_add_ps(sum0, e);
  }
  float t = c < n8 ? row_exp_y(s + c, n8 - c, m) : 0;
  return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1)) + t;
}
static AVX512 void row_scale_z(float *a, int64_t n8, float f) {
  __m512 fv = _mm512_set1_ps(f);
  int64_t c = 0;
  for (; c + 16 <= n8; c += 16) _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), fv));
  if (c < n8) row_scale_y(a + c, n8 - c, f);
}
static AVX512 void row_probs_grad_z(float *s, float *dp, int64_t n8, float L, float dl) {
  __m512 Lv = _mm512_set1_ps(L), dlv = _mm512_set1_ps(dl);
  int64_t c = 0;
  for (; c + 16 <= n8; c += 16) {
    __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c), Lv));
    _mm512_storeu_ps(s + c, p);
    _mm512_storeu_ps(dp + c, _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + c), dlv)));
  }
  if (c < n8) row_probs_grad_y(s + c, dp + c, n8 - c, L, dl);
}
static AVX512 void mask_row_unit_z(float *s, const void *mp, kg_dtype dt, int64_t n) {
  int64_t c = 0;
  if (dt == KG_F32) {
    const float *bias = mp;
    for (; c + 16 <= n; c += 16)
      _mm512_storeu_ps(s + c, _mm512_add_ps(_mm512_loadu_ps(s + c), _mm512_loadu_ps(bias + c)));
  }
  if (c < n) mask_row_unit_y(s + c, (const char *)mp + c * (dt == KG_F32 ? 4 : 1), dt, n - c);
}
/* kg_attn_rel_row_f32 (attention.h) 16 keys per step: each key's grid row ky and column kx
 * (tabulated per thread for keys below REL_MAXK) pick their terms by a
 * lane permute from the row's rh and rw held in one register each (kh, kw <= 16: SAM's windows
 * and small global grids) or by a gather. The scalar loop over short grid rows cost as much as
 * the materialised bias's add, and masked stores per grid row stall the loads after them. */
#define REL_MAXK 4096 /* keys tabulated: SAM's largest grid, 64 x 64 */
typedef struct {
  int64_t kw, n; /* entries [0, n) hold key j's (j / kw, j % kw) */
  int32_t ky[REL_MAXK], kx[REL_MAXK];
} rel_index;
static _Thread_local rel_index rel_idx = {0, 0, {0}, {0}};

static AVX512 void rel_row_z(float *s, const float *rh, const float *rw, const kg_attn_plan *P, int64_t j0,
                             int64_t nk) {
  rel_index *x = &rel_idx;
  if (x->kw != P->kw || x->n < j0 + nk) { /* the call's S keys only: sam alternates two grids */
    for (int64_t j = 0; j < P->S; j++) x->ky[j] = (int32_t)(j / P->kw), x->kx[j] = (int32_t)(j % P->kw);
    x->kw = P->kw, x->n = P->S;
  }
  bool perm = P->kh <= 16 && P->kw <= 16;
  __m512 hv = _mm512_setzero_ps(), wv = hv;
  if (perm) {
    hv = _mm512_maskz_loadu_ps((__mmask16)((1u << P->kh) - 1), rh);
    wv = _mm512_maskz_loadu_ps((__mmask16)((1u << P->kw) - 1), rw);
  }
  for (int64_t c = 0; c < nk; c += 16) {
    __mmask16 m = (__mmask16)(nk - c >= 16 ? 0xffff : (1u << (nk - c)) - 1);
    __m512i iy = _mm512_maskz_loadu_epi32(m, x->ky + j0 + c), ix = _mm512_maskz_loadu_epi32(m, x->kx + j0 + c);
    __m512 bias = perm ? _mm512_add_ps(_mm512_permutexvar_ps(iy, hv), _mm512_permutexvar_ps(ix, wv))
                       : _mm512_add_ps(_mm512_mask_i32gather_ps(hv, m, iy, rh, 4), _mm512_mask_i32gather_ps(wv, m, ix, rw, 4));
    _mm512_mask_storeu_ps(s + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + c), bias));
  }
}
/* the rel bias of row (b, h, i) added to s [nk] (keys j0..); tmp [kh + kw] */
static void rel_row(float *s, float *tmp, const kg_attn_plan *P, int64_t b, int64_t h, int64_t i, int64_t j0,
                    int64_t nk) {
  const kg_attn_view *vh = &P->rh, *vw = &P->rw;
  if (!avx512_available() || P->S > REL_MAXK) {
    kg_attn_rel_row_f32(s, tmp, P, b, h, i, j0, nk);
    return;
  }
  const float *rh = (const float *)kg_attn_at(vh, b, h, i), *rw = (const float *)kg_attn_at(vw, b, h, i);
  if (vh->dt != KG_F32 || vh->st[3] != 1) kg_cpu_load_f32(tmp, rh, vh->dt, vh->st[3], P->kh), rh = tmp;
  if (vw->dt != KG_F32 || vw->st[3] != 1) kg_cpu_load_f32(tmp + P->kh, rw, vw->dt, vw->st[3], P->kw), rw = tmp + P->kh;
  rel_row_z(s, rh, rw, P, j0, nk);
}

static float row_max(const float *s, int64_t n8) { return avx512_available() ? row_max_z(s, n8) : row_max_y(s, n8); }
static float row_exp(float *s, int64_t n8, float m) {
  return avx512_available() ? row_exp_z(s, n8, m) : row_exp_y(s, n8, m);
}
static void row_scale(float *a, int64_t n8, float f) {
  if (avx512_available()) row_scale_z(a, n8, f);
  else row_scale_y(a, n8, f);
}
/* dst[c] = a[c]·f for c < n8 */
static AVX2 void row_scale_to(float *dst, const float *a, int64_t n8, float f) {
  __m256 fv = _mm256_set1_ps(f);
  for (int64_t c = 0; c < n8; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), fv));
}
static void row_probs_grad(float *s, float *dp, int64_t n8, float L, float dl) {
  if (avx512_available()) row_probs_grad_z(s, dp, n8, L, dl);
  else row_probs_grad_y(s, dp, n8, L, dl);
}
static void mask_row_unit(float *s, const void *mp, kg_dtype dt, int64_t n) {
  if (avx512_available()) mask_row_unit_z(s, mp, dt, n);
  else mask_row_unit_y(s, mp, dt, n);
}

static void mask_row(float *s, float *mrow, const kg_attn_plan *P, int64_t b, int64_t h, int64_t i, int64_t j0,
                     int64_t nk, int64_t n8) {
  if (P->has_mask) {
    const kg_attn_view *m = &P->m;
    const char *mp = m->base + (b * m->st[0] + h * m->st[1] + i * m->st[2] + j0 * m->st[3]) * m->es;
    if (m->st[3] == 1 && (m->dt == KG_F32 || m->dt == KG_BOOL)) {
      mask_row_unit(s, mp, m->dt, nk);
    } else {
      kg_cpu_load_f32(mrow, mp, m->dt, m->st[3], nk);
      if (m->dt == KG_BOOL)
        for (int64_t c = 0; c < nk; c++) s[c] = mrow[c] != 0 ? s[c] : -INFINITY;
      else
        for (int64_t c = 0; c < nk; c++) s[c] += mrow[c];
    }
  }
  if (P->has_rel) rel_row(s, mrow, P, b, h, i, j0, nk); /* mrow [bk + kh + kw], free again */
  int64_t lo = kg_attn_key_lo(P, i) - j0, hi = kg_attn_key_hi(P, i) - j0;
  for (int64_t c = 0; c < lo && c < nk; c++) s[c] = -INFINITY;
  for (int64_t c = hi > 0 ? hi : 0; c < n8; c++) s[c] = -INFINITY;
  for (int64_t c = nk; c < n8; c++) s[c] = -INFINITY;
}
/* does every query of [i0, i0 + nq) see every key of [j0, j0 + nk) (so rows need no mask_row
 * beyond the padding)? */
static bool tile_open(const kg_attn_plan *P, int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
  return !P->has_mask && !P->has_rel && kg_attn_key_lo(P, i0 + nq - 1) <= j0 && kg_attn_key_hi(P, i0) >= j0 + nk;
}

/* ---- packing ----------------------------------------------------------------------------- */

/* rows i0..i0+n of x (b, h) times mul -> dst [n, ld], zero from D to ld */
static void pack_rows(float *dst, int64_t ld, const kg_attn_view *x, int64_t b, int64_t h, int64_t i0, int64_t n,
                      int64_t D, float mul) {
  for (int64_t r = 0; r < n; r++) {
    float *d = dst + r * ld;
    kg_cpu_load_f32(d, kg_attn_at(x, b, h, i0 + r), x->dt, x->st[3], D);
    if (mul != 1)
      for (int64_t e = 0; e < D; e++) d[e] *= mul;
    memset(d + D, 0, sizeof(float) * (size_t)(ld - D));
  }
}
/* dst[(d0 + k)·ld + r] = row[r][d0 + k]·mul for r, k < 8: an 8 x 8 block transposed in registers */
static AVX2 void transpose8(float *dst, int64_t ld, const float *const *row, int64_t d0, float mul) {
  __m256 r0 = _mm256_loadu_ps(row[0] + d0), r1 = _mm256_loadu_ps(row[1] + d0), r2 = _mm256_loadu_ps(row[2] + d0);
  __m256 r3 = _mm256_loadu_ps(row[3] + d0), r4 = _mm256_loadu_ps(row[4] + d0), r5 = _mm256_loadu_ps(row[5] + d0);
  __m256 r6 = _mm256_loadu_ps(row[6] + d0), r7 = _mm256_loadu_ps(row[7] + d0), m = _mm256_set1_ps(mul);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3);
  __m256 t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  float *o = dst + d0 * ld;
  _mm256_storeu_ps(o + 0 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u0, u4, 0x20), m));
  _mm256_storeu_ps(o + 1 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u1, u5, 0x20), m));
  _mm256_storeu_ps(o + 2 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u2, u6, 0x20), m));
  _mm256_storeu_ps(o + 3 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u3, u7, 0x20), m));
  _mm256_storeu_ps(o + 4 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u0, u4, 0x31), m));
  _mm256_storeu_ps(o + 5 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u1, u5, 0x31), m));
  _mm256_storeu_ps(o + 6 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u2, u6, 0x31), m));
  _mm256_storeu_ps(o + 7 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(u3, u7, 0x31), m));
}

/* rows j0..j0+n of x (b, h) times mul, transposed -> dst [Dp, ld] (dst[d·ld + j]), zero
 * elsewhere; tmp holds 8 rows of D */
static void pack_cols(float *dst, int64_t ld, int64_t Dp, const kg_attn_view *x, int64_t b, int64_t h, int64_t j0,
                      int64_t n, int64_t D, float mul, float *tmp) {
  /* only what the transposition leaves: columns n.. of rows < D, and rows D..Dp (a window's
   * 49 keys: the memset of it all and a copy call per key row were a tenth of its time) */
  for (int64_t d = 0; d < D; d++) memset(dst + d * ld + n, 0, sizeof(float) * (size_t)(ld - n));
  memset(dst + D * ld, 0, sizeof(float) * (size_t)((Dp - D) * ld));
  bool direct = x->dt == KG_F32 && x->st[3] == 1; /* f32 rows read in place */
  for (int64_t j = 0; j < n; j += 8) {
    int64_t w = min64(8, n - j);
    const float *row[8];
    for (int64_t r = 0; r < w; r++) {
      const char *src = kg_attn_at(x, b, h, j0 + j + r);
      if (direct) row[r] = (const float *)src;
      else kg_cpu_load_f32(tmp + r * D, src, x->dt, x->st[3], D), row[r] = tmp + r * D;
    }
    int64_t d = 0;
    if (w == 8)
      for (; d + 8 <= D; d += 8) transpose8(dst + j, ld, row, d, mul);
    for (; d < D; d++)
      for (int64_t r = 0; r < w; r++) dst[d * ld + j + r] = row[r][d] * mul;
  }
}

/* rows i0..i0+n of x (b, h) as f32 rows *ld apart with Dp readable columns (zero from D):
 * the tensor itself when it is f32 with unit stride and D % 8 == 0, else packed into buf */
static const float *rows_f32(const kg_attn_view *x, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t D,
                             float *buf, int64_t *ld) {
  if (x->dt == KG_F32 && x->st[3] == 1 && D % 8 == 0) {
    *ld = x->st[2];
    return (const float *)kg_attn_at(x, b, h, i0);
  }
  *ld = round8(D);
  pack_rows(buf, *ld, x, b, h, i0, n, D, 1);
  return buf;
}

/* ---- forward ----------------------------------------------------------------------------- */

typedef struct {
  float *kt, *vp, *qs, *acc, *s, *mrow, *m, *l, *tmp;
} fwd_bufs;

/* the forward's key tile */
static int64_t fwd_bk(void) { return kg_attn_tune.bkf > 0 ? kg_attn_tune.bkf : kg_attn_tune.bk; }

/* query rows [i0, i0 + nq) of head (b, h) against the packed keys [jlo, ...): kp is scale·Kᵀ
 * [Dp, ldk] or, when key_rows, K itself (rows ldk apart) */
static void fwd_tile(const kg_attn_plan *P, fwd_bufs *w, const float *kp, int64_t ldk, bool key_rows, const float *vp,
                     int64_t ldv, int64_t jlo, int64_t b, int64_t h, int64_t i0, int64_t nq, kg_attn_view *o,
                     float *lse) {
  int64_t D = P->D, Dp = round8(D), bk = fwd_bk(), ldq;
  const float *qs = rows_f32(&P->q, b, h, i0, nq, D, w->qs, &ldq);
  memset(w->acc, 0, sizeof(float) * (size_t)(nq * Dp));
  for (int64_t r = 0; r < nq; r++) w->m[r] = -INFINITY, w->l[r] = 0;
  int64_t j1 = kg_attn_key_hi(P, i0 + nq - 1);
  for (int64_t j0 = kg_attn_key_lo(P, i0); j0 < j1; j0 += bk) {
    int64_t nk = min64(bk, j1 - j0), n8 = round8(nk);
    if (key_rows) tile_dots(nq, nk, Dp, qs, ldq, kp + (j0 - jlo) * ldk, ldk, (float)P->scale, w->s, bk);
    else tile_gemm(nq, n8, D, qs, ldq, 1, kp + (j0 - jlo), ldk, w->s, bk, false); /* S = Q·(scale·K)ᵀ */
    bool open = tile_open(P, i0, nq, j0, nk);
    for (int64_t r = 0; r < nq; r++) {
      float *sr = w->s + r * bk;
      if (!open) mask_row(sr, w->mrow, P, b, h, i0 + r, j0, nk, n8);
      else
        for (int64_t c = nk; c < n8; c++) sr[c] = -INFINITY;
      float mx = row_max(sr, n8), mnew = mx > w->m[r] ? mx : w->m[r];
      if (mnew == -INFINITY) { /* nothing visible yet: this row adds nothing */
        memset(sr, 0, sizeof(float) * (size_t)n8);
        continue;
      }
      float corr = expf(w->m[r] - mnew), sum = row_exp(sr, n8, mnew);
      w->l[r] = w->l[r] * corr + sum;
      /* the row's first visible tile finds acc = 0: no rescale (all of it when one tile holds the keys) */
      if (corr != 1 && w->m[r] != -INFINITY) row_scale(w->acc + r * Dp, Dp, corr);
      w->m[r] = mnew;
    }
    tile_gemm(nq, Dp, nk, w->s, bk, 1, vp + (j0 - jlo) * ldv, ldv, w->acc, Dp, true); /* acc += P·V */
  }
  bool direct = o->dt == KG_F32 && o->st[3] == 1 && D % 8 == 0; /* normalised straight into out */
  for (int64_t r = 0; r < nq; r++) { /* rows that see no key give zeros and lse -inf */
    float *a = w->acc + r * Dp, l = w->l[r], *dst = (float *)kg_attn_at(o, b, h, i0 + r);
    if (direct) {
      row_scale_to(dst, a, D, l > 0 ? 1 / l : 0);
    } else {
      row_scale(a, Dp, l > 0 ? 1 / l : 0);
      kg_cpu_store_f32((char *)dst, o->dt, o->st[3], a, D);
    }
    lse[(b * P->H + h) * P->T + i0 + r] = l > 0 ? w->m[r] + logf(l) : -INFINITY;
  }
}

/* with at most 4 query rows per task, transposing the keys costs as much as the products */
static bool chunk_rows_few(int64_t T, int64_t chunk) { return min64(T, chunk) <= 4; }

void kg_attn_fwd_avx2(const kg_attn_plan *P, kg_tensor *out, float *lse) {
  int64_t D = P->D, Dp = round8(D), G = P->H / P->Hkv, bq = kg_attn_tune.bq, bk = fwd_bk();
  /* a task is a chunk of query tiles of one head; chunks only as small as needed for about 4
   * tasks per thread, since each chunk packs its keys once */
  int64_t nqb = cdiv(P->T, bq), nt4 = 4 * kg_num_threads();
  /* a task is a chunk of query tiles of the G query heads of one kv head (packing K and V once
   * for all G), or of one query head when that leaves too few tasks; chunks only as small as
   * needed for about 4 tasks per thread, since each chunk packs its keys */
  int64_t gh = P->B * P->Hkv * nqb >= nt4 ? G : 1, units = P->B * P->H / gh;
  int64_t nch = min64(nqb, cdiv(nt4, units)), chunk = cdiv(nqb, nch) * bq;
  nch = cdiv(P->T, chunk);
  int64_t ntask = units * nch, S8 = round8(P->S) + 8, R = P->kh + P->kw;
  bool key_rows = chunk_rows_few(P->T, chunk); /* decode: scores by dot products, keys untransposed */
  kg_attn_view o = kg_attn_view_of(out, out->stride);
#pragma omp parallel if (ntask > 1 && P->T * P->S * P->D > 16384)
  {
    size_t nf = (size_t)(Dp * S8 + S8 * Dp + 2 * bq * Dp + bq * bk + bk + R + 2 * bq + 8 * Dp);
    float *buf = malloc(sizeof(float) * nf);
    fwd_bufs w = {buf};
    w.vp = w.kt + Dp * S8, w.qs = w.vp + S8 * Dp, w.acc = w.qs + bq * Dp, w.s = w.acc + bq * Dp;
    w.mrow = w.s + bq * bk, w.m = w.mrow + bk + R, w.l = w.m + bq, w.tmp = w.l + bq;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < ntask; task++) {
      int64_t unit = task / nch, b = unit / (P->H / gh), h0 = unit % (P->H / gh) * gh, hk = h0 / G;
      int64_t i_begin = task % nch * chunk, i_end = min64(P->T, i_begin + chunk);
      int64_t jlo = kg_attn_key_lo(P, i_begin), jhi = kg_attn_key_hi(P, i_end - 1);
      int64_t nkey = jhi > jlo ? jhi - jlo : 0, ldk = round8(nkey) + 8; /* + 8: tiles read up to round8 */
      const float *kp = w.kt;
      if (key_rows) kp = rows_f32(&P->k, b, hk, jlo, nkey, D, w.kt, &ldk);
      else pack_cols(w.kt, ldk, Dp, &P->k, b, hk, jlo, nkey, D, (float)P->scale, w.tmp);
      int64_t ldv;
      const float *vp = rows_f32(&P->v, b, hk, jlo, nkey, D, w.vp, &ldv);
      for (int64_t h = h0; h < h0 + gh; h++)
        for (int64_t i0 = i_begin; i0 < i_end; i0 += bq)
          fwd_tile(P, &w, kp, ldk, key_rows, vp, ldv, jlo, b, h, i0, min64(bq, i_end - i0), &o, lse);
    }
    free(buf);
  }
}

/* ---- backward ---------------------------------------------------------------------------- */

typedef struct {
  float *qs, *dob, *kb, *kt, *vt, *ak, *av, *s, *dp, *mrow, *tmp;
  const float *krows; /* K's rows of the key tile: kb, or the tensor itself (rows_f32) */
  int64_t ldk;
} bwd_bufs;

typedef struct {
  const kg_attn_plan *P;
  const float *lse, *delta;
  float *dqacc;  /* [runs, B·H·T, Dp] */
  float *relacc; /* [runs, B·H·T, kh + kw]: the rel bias's gradient, or NULL */
  kg_attn_view g;
  int64_t nrow;
} bwd_ctx;

/* query rows [i0, i0 + nq) of head (b, h) against key tile [j0, j0 + nk) (packed in w): adds
 * to dq (dqrow: the accumulator of row i0), dk (w->ak) and dv (w->av) */
static void bwd_tile(const bwd_ctx *x, bwd_bufs *w, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0,
                     int64_t nk, float *dqrow, float *relrow) {
  const kg_attn_plan *P = x->P;
  int64_t D = P->D, Dp = round8(D), bk = kg_attn_tune.bk, n8 = round8(nk), row0 = (b * P->H + h) * P->T + i0;
  int64_t ldq, ldg;
  const float *qs = rows_f32(&P->q, b, h, i0, nq, D, w->qs, &ldq), *dob = rows_f32(&x->g, b, h, i0, nq, D, w->dob, &ldg);
  tile_gemm(nq, n8, D, qs, ldq, 1, w->kt, bk, w->s, bk, false);   /* S = Q·(scale·K)ᵀ */
  tile_gemm(nq, n8, D, dob, ldg, 1, w->vt, bk, w->dp, bk, false); /* dP = dO·Vᵀ */
  bool open = tile_open(P, i0, nq, j0, nk);
  for (int64_t r = 0; r < nq; r++) {
    float *sr = w->s + r * bk, *dr = w->dp + r * bk, L = x->lse[row0 + r];
    if (L == -INFINITY) { /* a row that sees no key has no gradient */
      memset(sr, 0, sizeof(float) * (size_t)n8);
      memset(dr, 0, sizeof(float) * (size_t)n8);
      continue;
    }
    if (!open) mask_row(sr, w->mrow, P, b, h, i0 + r, j0, nk, n8);
    else
      for (int64_t c = nk; c < n8; c++) sr[c] = -INFINITY;
    row_probs_grad(sr, dr, n8, L, x->delta[row0 + r]);
    if (relrow) kg_attn_rel_grad_f32(relrow + r * (P->kh + P->kw), relrow + r * (P->kh + P->kw) + P->kh, dr, P, j0, nk);
  }
  tile_gemm(nq, Dp, nk, w->dp, bk, 1, w->krows, w->ldk, dqrow, Dp, true); /* dq += dS·K (scaled at the end) */
  tile_gemm(nk, Dp, nq, w->s, 1, bk, dob, ldg, w->av, Dp, true);   /* dv += Pᵀ·dO */
  tile_gemm(nk, Dp, nq, w->dp, 1, bk, qs, ldq, w->ak, Dp, true);   /* dk += dSᵀ·Q (scaled at the store) */
}

/* key tile [j0, j0 + nk) of kv head (b, hk) against every query that sees it */
static void bwd_key_tile(const bwd_ctx *x, bwd_bufs *w, int64_t run, int64_t b, int64_t hk, int64_t j0, int64_t nk,
                         kg_attn_view *dk, kg_attn_view *dv) {
  const kg_attn_plan *P = x->P;
  int64_t D = P->D, Dp = round8(D), G = P->H / P->Hkv, bq = kg_attn_tune.bq, bk = kg_attn_tune.bk, ilo, ihi;
  w->krows = rows_f32(&P->k, b, hk, j0, nk, D, w->kb, &w->ldk);
  pack_cols(w->kt, bk, Dp, &P->k, b, hk, j0, nk, D, (float)P->scale, w->tmp);
  pack_cols(w->vt, bk, Dp, &P->v, b, hk, j0, nk, D, 1, w->tmp);
  memset(w->ak, 0, sizeof(float) * (size_t)(nk * Dp));
  memset(w->av, 0, sizeof(float) * (size_t)(nk * Dp));
  kg_attn_query_range(P, j0, nk, &ilo, &ihi);
  for (int64_t h = hk * G; h < (hk + 1) * G; h++)
    for (int64_t i0 = ilo; i0 < ihi; i0 += bq) {
      int64_t row = run * x->nrow + (b * P->H + h) * P->T + i0;
      float *relrow = x->relacc ? x->relacc + row * (P->kh + P->kw) : NULL;
      bwd_tile(x, w, b, h, i0, min64(bq, ihi - i0), j0, nk, x->dqacc + row * Dp, relrow);
    }
  bool direct = dk->dt == KG_F32 && dk->st[3] == 1 && dv->dt == KG_F32 && dv->st[3] == 1 && D % 8 == 0;
  for (int64_t c = 0; c < nk; c++) {
    float *dkr = (float *)kg_attn_at(dk, b, hk, j0 + c), *dvr = (float *)kg_attn_at(dv, b, hk, j0 + c);
    if (direct) { /* f32 rows written in place (a copy call per row was a tenth of a window's backward) */
      row_scale_to(dkr, w->ak + c * Dp, D, (float)P->scale);
      row_scale_to(dvr, w->av + c * Dp, D, 1);
      continue;
    }
    row_scale(w->ak + c * Dp, Dp, (float)P->scale);
    kg_cpu_store_f32((char *)dkr, dk->dt, dk->st[3], w->ak + c * Dp, D);
    kg_cpu_store_f32((char *)dvr, dv->dt, dv->st[3], w->av + c * Dp, D);
  }
}

/* in: q, k, v, mask, out, lse, dout[, rel_h, rel_w]; out: dq, dk, dv[, drel_h, drel_w] */
void kg_attn_bwd_avx2(const kg_attn_plan *P, const kg_op_call *c) {
  int64_t D = P->D, Dp = round8(D), bq = kg_attn_tune.bq, bk = kg_attn_tune.bk, R = P->kh + P->kw;
  int64_t nrow = P->B * P->H * P->T, nkb = cdiv(P->S, bk), kvheads = P->B * P->Hkv;
  /* a task is a run of key tiles of one kv head; runs split a head only for about 4 tasks per
   * thread, since each run needs its own dq accumulator */
  int64_t nrun = min64(nkb, cdiv(4 * kg_num_threads(), kvheads)), per_run = cdiv(nkb, nrun);
  nrun = cdiv(nkb, per_run);
  int64_t ntask = kvheads * nrun;
  kg_attn_view o = kg_attn_view_of(c->in[4], c->in[4]->stride);
  kg_attn_view dq = kg_attn_view_of(c->out[0], c->out[0]->stride), dk = kg_attn_view_of(c->out[1], c->out[1]->stride);
  kg_attn_view dv = kg_attn_view_of(c->out[2], c->out[2]->stride);
  float *delta = malloc(sizeof(float) * (size_t)nrow); /* delta_i = dO_i · O_i */
  size_t dq_bytes = sizeof(float) * (size_t)(nrun * nrow * Dp), dq_rounded; /* zeroed below, by rows */
  float *dqacc = kg_cpu_alloc(dq_bytes, &dq_rounded);
  /* the rel bias's gradient per run like dq's (runs of one head share query rows) */
  size_t rel_bytes = sizeof(float) * (size_t)(nrun * nrow * R), rel_rounded = 0;
  float *relacc = P->has_rel ? kg_cpu_alloc(rel_bytes, &rel_rounded) : NULL;
  bwd_ctx x = {P, kg_data(c->in[5]), delta, dqacc, relacc, kg_attn_view_of(c->in[6], c->in[6]->stride), nrow};
  kg_attn_view drh = {0}, drw = {0};
  if (P->has_rel) drh = kg_attn_view_of(c->out[3], c->out[3]->stride), drw = kg_attn_view_of(c->out[4], c->out[4]->stride);
  bool par = P->T * P->S * P->D > 16384;
#pragma omp parallel if (par)
  {
    size_t nf = (size_t)(2 * bq * Dp + 2 * bk * Dp + 2 * Dp * bk + 2 * bk * Dp + 2 * bq * bk + bk + R + 8 * Dp);
    float *buf = malloc(sizeof(float) * nf);
    bwd_bufs w = {buf};
    w.dob = w.qs + bq * Dp, w.kb = w.dob + bq * Dp, w.kt = w.kb + bk * Dp, w.vt = w.kt + Dp * bk;
    w.ak = w.vt + Dp * bk, w.av = w.ak + bk * Dp, w.s = w.av + bk * Dp, w.dp = w.s + bq * bk;
    w.mrow = w.dp + bq * bk, w.tmp = w.mrow + bk + R;
#pragma omp for schedule(static)
    for (int64_t row = 0; row < nrow; row++) {
      int64_t b = row / (P->H * P->T), h = row / P->T % P->H, i = row % P->T;
      const float *orow = (const float *)kg_attn_at(&o, b, h, i), *grow = (const float *)kg_attn_at(&x.g, b, h, i);
      if (o.dt != KG_F32 || o.st[3] != 1) kg_cpu_load_f32(w.qs, orow, o.dt, o.st[3], D), orow = w.qs; /* f32: in place */
      if (x.g.dt != KG_F32 || x.g.st[3] != 1) kg_cpu_load_f32(w.dob, grow, x.g.dt, x.g.st[3], D), grow = w.dob;
      float sum = 0;
      for (int64_t d = 0; d < D; d++) sum += orow[d] * grow[d];
      delta[row] = sum;
      for (int64_t r = 0; r < nrun; r++) memset(dqacc + (r * nrow + row) * Dp, 0, sizeof(float) * (size_t)Dp);
      for (int64_t r = 0; relacc && r < nrun; r++) memset(relacc + (r * nrow + row) * R, 0, sizeof(float) * (size_t)R);
    }
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < ntask; task++) {
      int64_t b = task / (P->Hkv * nrun), hk = task / nrun % P->Hkv, run = task % nrun;
      for (int64_t kb = run * per_run; kb < min64(nkb, (run + 1) * per_run); kb++)
        bwd_key_tile(&x, &w, run, b, hk, kb * bk, min64(bk, P->S - kb * bk), &dk, &dv);
    }
    /* dq = scale · Σ over runs */
#pragma omp for schedule(static)
    for (int64_t row = 0; row < nrow; row++) {
      float *a = dqacc + row * Dp;
      for (int64_t r = 1; r < nrun; r++)
        for (int64_t d = 0; d < D; d++) a[d] += dqacc[(r * nrow + row) * Dp + d];
      for (int64_t d = 0; d < D; d++) a[d] *= (float)P->scale;
      int64_t b = row / (P->H * P->T), h = row / P->T % P->H, i = row % P->T;
      kg_cpu_store_f32((char *)kg_attn_at(&dq, b, h, i), dq.dt, dq.st[3], a, D);
      if (relacc) {
        float *g = relacc + row * R;
        for (int64_t r = 1; r < nrun; r++)
          for (int64_t e = 0; e < R; e++) g[e] += relacc[(r * nrow + row) * R + e];
        kg_cpu_store_f32((char *)kg_attn_at(&drh, b, h, i), drh.dt, drh.st[3], g, P->kh);
        kg_cpu_store_f32((char *)kg_attn_at(&drw, b, h, i), drw.dt, drw.st[3], g + P->kh, P->kw);
      }
    }
    free(buf);
  }
  kg_cpu_free(dqacc, dq_rounded);
  if (relacc) kg_cpu_free(relacc, rel_rounded);
  free(delta);
}
