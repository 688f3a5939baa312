/* gemm_f32.c — AVX-512 f32 GEMM: c[N, M] = a[N, K] @ b[K, M] (+ bias) with a row-major, for the
 * ViT/BERT linears and their input gradients (K, M of 128-1024, thousands of rows; docs/kernels.md,
 * "keng's f32 GEMM").
 *
 * b is packed once per call into panels of GF_NR = 64 columns ([K, 64] each, zeros past M): a
 * 128-deep block of one panel is 32 KiB and stays in L1 while GF_MC rows of a stream past it. a is
 * read where it lies, never packed (for a weight gradient dW = gᵀ x, packing gᵀ and x took a
 * third of the time: those products stay with OpenBLAS). The tile is GF_MR = 6 rows x 64 columns: 24 zmm
 * accumulators, per k 4 loads of b and 6 broadcasts of a for 24 FMAs, so the two FMA ports, not
 * the loads, bound it. K runs in blocks of GF_KC; the first block starts from the bias (or zero),
 * later ones from c. Each output is the k-ordered f32 sum of FMAs (rounding differs from
 * OpenBLAS's order only). Threads share row blocks, or column panels when there are few rows.
 * Reference: the naive f64 loop in tests/lab/lab_gemm_f32.c.
 */
#include "gemm_f32.h"

#include <string.h>

#define GF_MR 6
#define GF_NR 64
#define GF_KC 128
#define GF_MC 96                /* rows per block: 16 tiles; their 128-deep a block (48 KiB) stays in L2 */
#define GF_PACK_BYTES (4 << 20) /* packed b per chunk of panels */

static int64_t gf_kc = GF_KC, gf_mc = GF_MC;
void kg_cpu_gemm_f32_set_kc(int64_t kc) { gf_kc = kc > 0 ? kc : GF_KC; }
void kg_cpu_gemm_f32_set_mc(int64_t mc) { gf_mc = mc > 0 ? (mc + GF_MR - 1) / GF_MR * GF_MR : GF_MC; }

bool kg_cpu_gemm_f32_ok(void) { return kg_cpu_vector_isa(KG_ENV_KENG_GEMM_F32) >= 2; }

#if defined(__x86_64__)
#include <immintrin.h>

/* b's columns [j0, j0 + 64) as one panel [K, 64], zeros past M */
static void pack_panel(float *dst, const float *b, int64_t brs, int64_t bcs, int64_t K, int64_t M, int64_t j0) {
  int64_t nc = M - j0 < GF_NR ? M - j0 : GF_NR;
  if (bcs == 1) { /* rows of b are contiguous */
    for (int64_t k = 0; k < K; k++) {
      memcpy(dst + k * GF_NR, b + k * brs + j0, (size_t)nc * sizeof(float));
      memset(dst + k * GF_NR + nc, 0, (size_t)(GF_NR - nc) * sizeof(float));
    }
    return;
  }
  /* columns of b contiguous (b = wᵀ, w row-major) or any strides: read b column by column */
  for (int64_t jj = 0; jj < GF_NR; jj++) {
    if (jj >= nc) {
      for (int64_t k = 0; k < K; k++)
        dst[k * GF_NR + jj] = 0.0f;
      continue;
    }
    const float *col = b + (j0 + jj) * bcs;
    for (int64_t k = 0; k < K; k++)
      dst[k * GF_NR + jj] = col[k * brs];
  }
}

/* one GF_MR x 64 tile of c over k in [0, kc): row r of a at a + r * lda (rows past rn repeat the
 * last one and are not stored), bp the panel's k block, nc columns of it valid; starts from c
 * (load_c), else from the bias or zero */
__attribute__((target("avx512f"))) static void tile(const float *a, int64_t lda, const float *bp, int64_t kc, float *c,
                                                    int64_t ldc, int rn, int64_t nc, const float *bias, bool load_c) {
  __mmask16 m[4];
  for (int v = 0; v < 4; v++) {
    int64_t left = nc - 16 * v;
    m[v] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
  }
  const float *ar[GF_MR];
  for (int r = 0; r < GF_MR; r++)
    ar[r] = a + (r < rn ? r : rn - 1) * lda;
  __m512 acc[GF_MR][4];
#pragma GCC unroll 6
  for (int r = 0; r < GF_MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (load_c)
        acc[r][v] = r < rn ? _mm512_maskz_loadu_ps(m[v], c + r * ldc + 16 * v) : _mm512_setzero_ps();
      else
        acc[r][v] = bias ? _mm512_maskz_loadu_ps(m[v], bias + 16 * v) : _mm512_setzero_ps();
    }
  for (int64_t k = 0; k < kc; k++) {
    const float *bk = bp + k * GF_NR;
    __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + 16), b2 = _mm512_loadu_ps(bk + 32),
           b3 = _mm512_loadu_ps(bk + 48);
#pragma GCC unroll 6
    for (int r = 0; r < GF_MR; r++) {
      __m512 av = _mm512_set1_ps(ar[r][k]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(av, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(av, b3, acc[r][3]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < GF_MR; r++)
    if (r < rn)
#pragma GCC unroll 4
      for (int v = 0; v < 4; v++)
        _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m[v], acc[r][v]);
}

/* rows [i0, i1) x panels [p0, p1) of c, all of K */
static void block(float *c, int64_t ldc, const float *a, int64_t lda, const float *bp, int64_t i0, int64_t i1,
                  int64_t p0, int64_t p1, int64_t M, int64_t K, const float *bias) {
  int64_t kcb = gf_kc;
  for (int64_t k0 = 0; k0 < K; k0 += kcb) {
    int64_t kc = K - k0 < kcb ? K - k0 : kcb;
    for (int64_t p = p0; p < p1; p++) {
      int64_t j0 = p * GF_NR, nc = M - j0 < GF_NR ? M - j0 : GF_NR;
      const float *bk = bp + p * K * GF_NR + k0 * GF_NR, *bb = bias ? bias + j0 : NULL;
      for (int64_t i = i0; i < i1; i += GF_MR) {
        int rn = i1 - i < GF_MR ? (int)(i1 - i) : GF_MR;
        tile(a + i * lda + k0, lda, bk, kc, c + i * ldc + j0, ldc, rn, nc, bb, k0 > 0);
      }
    }
  }
}

kg_status kg_cpu_gemm_f32(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t brs, int64_t bcs,
                          int64_t N, int64_t M, int64_t K, const float *bias, int nt) {
  if (N <= 0 || M <= 0) return KG_OK;
  if (K <= 0) {
    for (int64_t i = 0; i < N; i++)
      for (int64_t j = 0; j < M; j++)
        c[i * ldc + j] = bias ? bias[j] : 0.0f;
    return KG_OK;
  }
  /* b is packed GF_PACK_BYTES at a time (a chunk of panels, at least one per thread) so that a
   * big weight (an LM head) is not copied whole; a is read once per chunk */
  int64_t np = (M + GF_NR - 1) / GF_NR, pbytes = K * GF_NR * (int64_t)sizeof(float);
  if (nt <= 0) nt = kg_num_threads();
  int64_t cp = GF_PACK_BYTES / pbytes;
  cp = cp < nt ? nt : cp > np ? np : cp;
  size_t bytes;
  float *bp = kg_cpu_alloc((size_t)(cp * pbytes), &bytes);
  if (!bp) return kg_error(KG_ERR_OOM, "matmul", "out of memory packing b (%lld x %lld)", (long long)K, (long long)M);
  /* row blocks of about gf_mc rows, as many as a multiple of the threads: 11 blocks of SAM's 1024
   * rows on 2 threads ran 6 against 5 (9% slower than OpenBLAS's threading) */
  int64_t nrb = (N + gf_mc - 1) / gf_mc;
  nrb = (nrb + nt - 1) / nt * nt;
  int64_t mc = ((N + nrb - 1) / nrb + GF_MR - 1) / GF_MR * GF_MR;
  nrb = (N + mc - 1) / mc;
  for (int64_t q0 = 0; q0 < np; q0 += cp) {
    int64_t nq = np - q0 < cp ? np - q0 : cp;
    /* work items: row blocks x panel groups; fewer row blocks than threads split the panels */
    int64_t ng = nrb >= nt ? 1 : (nq < nt ? nq : nt);
    int64_t pg = (nq + ng - 1) / ng, items = nrb * ng;
    int nth = nt > items ? (int)items : nt;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
#pragma omp for schedule(static)
      for (int64_t p = 0; p < nq; p++)
        pack_panel(bp + p * K * GF_NR, b, brs, bcs, K, M, (q0 + p) * GF_NR);
#pragma omp for schedule(static)
      for (int64_t it = 0; it < items; it++) {
        int64_t rb = it / ng, g = it % ng;
        int64_t i0 = rb * mc, i1 = i0 + mc < N ? i0 + mc : N;
        int64_t p0 = g * pg, p1 = p0 + pg < nq ? p0 + pg : nq;
        if (p0 < p1)
          block(c + q0 * GF_NR, ldc, a, lda, bp, i0, i1, p0, p1, M - q0 * GF_NR, K, bias ? bias + q0 * GF_NR : NULL);
      }
    }
  }
  kg_cpu_free(bp, bytes);
  return KG_OK;
}

#else
kg_status kg_cpu_gemm_f32(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t brs, int64_t bcs,
                          int64_t N, int64_t M, int64_t K, const float *bias, int nt) {
  (void)c, (void)ldc, (void)a, (void)lda, (void)b, (void)brs, (void)bcs, (void)N, (void)M, (void)K;
  (void)bias, (void)nt;
  return kg_error(KG_ERR_VALUE, "matmul", "gemm_f32: not an x86-64 build");
}
#endif
