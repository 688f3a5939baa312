/* gemm_par.c — every threaded BLAS GEMM of keng, cut into pieces for keng's pool.
 *
 * OpenBLAS's own threads split a product statically, and its OpenMP build waits at the end for
 * each of them: beside a busy core, every product waits for the parked one (docs/kernels.md,
 * "Threads under load"). So OpenBLAS runs on one thread (engine/core/threads.c) and keng hands
 * out pieces of a product through kg_parallel_for, each one single-threaded BLAS call:
 *
 * - a long K (K >= 2 max(N, M): weight gradients, x^T·dy over all tokens): k pieces along K, the
 *   first into C (with beta), the others into partial products added to C in piece order. These
 *   pieces are cut at any thread count, one included (so the bits never depend on it), and they
 *   pack the same bytes as one call: A's and B's slices once each;
 * - otherwise tiles of C, rows x cols (the larger dim cut first): each tile packs its rows of A
 *   and its columns of B again, so tiles stay large (>= 64 rows/cols, <= GP_MAX_PIECES), and they
 *   are cut only when more than one thread runs. Each element's sum over K is the same as in one
 *   call (BLAS cuts K the same way for any tile), so the bits do not change either.
 *
 * The count of pieces depends only on the sizes, never on the thread count. */
#include "gemm_par.h"

#include "../core/pool.h"
#include "cpu.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

/* flops below which a product is one call */
#define GP_MIN_FLOPS (4.0 * (1 << 20))
/* flops per piece aimed at, and the most pieces: enough for a dynamic handout on a few threads */
#define GP_PIECE_FLOPS (16.0 * (1 << 20))
#define GP_MAX_PIECES 16
/* smallest piece: rows/cols of a tile, K of a K piece */
#define GP_MIN_TILE 64
#define GP_MIN_K 256

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

kg_gemm_split kg_cpu_gemm_split(int64_t N, int64_t M, int64_t K) {
  kg_gemm_split s = {1, 1, 1};
  double flops = 2.0 * (double)N * (double)M * (double)K;
  if (flops < GP_MIN_FLOPS) return s;
  int64_t want = clamp64((int64_t)(flops / GP_PIECE_FLOPS), 2, GP_MAX_PIECES);
  int64_t big = N > M ? N : M;
  if (K >= 2 * big && K >= 2 * GP_MIN_K) {
    s.k = clamp64(K / GP_MIN_K, 1, want);
    return s;
  }
  int64_t *first = N >= M ? &s.rows : &s.cols, *second = N >= M ? &s.cols : &s.rows;
  int64_t d1 = N >= M ? N : M, d2 = N >= M ? M : N;
  *first = clamp64(d1 / GP_MIN_TILE, 1, want);
  *second = clamp64(d2 / GP_MIN_TILE, 1, want / *first);
  return s;
}

typedef struct {
  bool wide, ta, tb;
  int64_t N, M, K, lda, ldb, ldc;
  const char *A, *B;
  char *C;
  double beta;
  /* tiles */
  int64_t rb, cb, ncol;
  /* K pieces */
  int64_t kb;
  char *parts; /* pieces 1.. : [N, M] each */
} gp_job;

static void call(bool wide, bool ta, bool tb, int64_t N, int64_t M, int64_t K, const void *A, int64_t lda,
                 const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (wide)
    cblas_dgemm(CblasRowMajor, TA, TB, (int)N, (int)M, (int)K, 1.0, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, TA, TB, (int)N, (int)M, (int)K, 1.0f, A, (int)lda, B, (int)ldb, (float)beta, C,
                (int)ldc);
}

/* element (r, c) of an operand stored [R, C] (or transposed, [C, R]) with leading dim ld */
static const char *at(const char *p, bool trans, int64_t ld, int64_t r, int64_t c, int es) {
  return p + (trans ? c * ld + r : r * ld + c) * es;
}

static int tile(void *ctx, int64_t t) {
  gp_job *j = ctx;
  int es = j->wide ? 8 : 4;
  int64_t r0 = (t / j->ncol) * j->rb, c0 = (t % j->ncol) * j->cb;
  int64_t nr = j->N - r0 < j->rb ? j->N - r0 : j->rb, nc = j->M - c0 < j->cb ? j->M - c0 : j->cb;
  call(j->wide, j->ta, j->tb, nr, nc, j->K, at(j->A, j->ta, j->lda, r0, 0, es), j->lda,
       at(j->B, j->tb, j->ldb, 0, c0, es), j->ldb, j->beta, j->C + (r0 * j->ldc + c0) * es, j->ldc);
  return 0;
}

static int kpiece(void *ctx, int64_t p) {
  gp_job *j = ctx;
  int es = j->wide ? 8 : 4;
  int64_t k0 = p * j->kb, nk = j->K - k0 < j->kb ? j->K - k0 : j->kb;
  const char *a = at(j->A, j->ta, j->lda, 0, k0, es), *b = at(j->B, j->tb, j->ldb, k0, 0, es);
  if (p == 0) call(j->wide, j->ta, j->tb, j->N, j->M, nk, a, j->lda, b, j->ldb, j->beta, j->C, j->ldc);
  else call(j->wide, j->ta, j->tb, j->N, j->M, nk, a, j->lda, b, j->ldb, 0.0, j->parts + (p - 1) * j->N * j->M * es, j->M);
  return 0;
}

/* C's rows [16 t, 16 t + 16) += the partial products, in piece order */
static int ksum(void *ctx, int64_t t) {
  gp_job *j = ctx;
  int64_t np = (j->K + j->kb - 1) / j->kb, r1 = (t + 1) * 16 < j->N ? (t + 1) * 16 : j->N;
  for (int64_t r = t * 16; r < r1; r++)
    for (int64_t p = 1; p < np; p++) {
      if (j->wide) {
        double *c = (double *)j->C + r * j->ldc;
        const double *s = (const double *)j->parts + ((p - 1) * j->N + r) * j->M;
        for (int64_t i = 0; i < j->M; i++) c[i] += s[i];
      } else {
        float *c = (float *)j->C + r * j->ldc;
        const float *s = (const float *)j->parts + ((p - 1) * j->N + r) * j->M;
        for (int64_t i = 0; i < j->M; i++) c[i] += s[i];
      }
    }
  return 0;
}

static void blas_gemm(bool wide, bool ta, bool tb, int64_t N, int64_t M, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, double beta, void *C, int64_t ldc, int nt);

/* OpenBLAS's OpenMP build takes its thread count from the calling thread's OpenMP count (it sets
 * its own to omp_get_max_threads() on each call), so the caller's count is 1 while it runs here:
 * every BLAS call is single-threaded, whichever thread makes it (the pool's workers keep 1) */
void kg_cpu_blas_gemm(bool wide, bool ta, bool tb, int64_t N, int64_t M, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, double beta, void *C, int64_t ldc, int nt) {
  int cur = kg_num_threads(), icv = omp_get_max_threads();
  if (icv != 1) omp_set_num_threads(1);
  blas_gemm(wide, ta, tb, N, M, K, A, lda, B, ldb, beta, C, ldc, nt <= 0 ? cur : nt);
  if (icv != 1) omp_set_num_threads(icv);
}

static void blas_gemm(bool wide, bool ta, bool tb, int64_t N, int64_t M, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, double beta, void *C, int64_t ldc, int nt) {
  if (N <= 0 || M <= 0) return;
  if (kg_pool_nested()) nt = 1; /* tiles would only repack on this one thread */
  kg_gemm_split s = kg_cpu_gemm_split(N, M, K);
  gp_job j = {wide, ta, tb, N, M, K, lda, ldb, ldc, A, B, C, beta, N, M, 1, K, NULL};
  int es = wide ? 8 : 4;
  if (s.k > 1) {
    j.kb = (K + s.k - 1) / s.k;
    int64_t np = (K + j.kb - 1) / j.kb;
    size_t got = 0, bytes = (size_t)((np - 1) * N * M * es);
    j.parts = kg_cpu_alloc(bytes, &got);
    if (j.parts) {
      kg_parallel_for(np, nt, kpiece, &j);
      kg_parallel_for((N + 15) / 16, nt, ksum, &j);
      kg_cpu_free(j.parts, got);
      return;
    }
    /* no memory for the partials: tiles or one call, as below */
  }
  if (nt > 1 && s.rows * s.cols > 1) {
    j.rb = (N + s.rows - 1) / s.rows;
    j.cb = (M + s.cols - 1) / s.cols;
    j.rb = s.rows > 1 ? (j.rb + 15) / 16 * 16 : j.rb;
    j.cb = s.cols > 1 ? (j.cb + 15) / 16 * 16 : j.cb;
    j.ncol = (M + j.cb - 1) / j.cb;
    kg_parallel_for(((N + j.rb - 1) / j.rb) * j.ncol, nt, tile, &j);
    return;
  }
  call(wide, ta, tb, N, M, K, A, lda, B, ldb, beta, C, ldc);
}
