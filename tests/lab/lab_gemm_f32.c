/* lab_gemm_f32.c — kernel lab for engine/cpu/gemm_f32.c: c[N, M] = a[N, K] @ b[K, M] (+ bias), f32.
 *
 *   lab_gemm_f32 --check   the kernel vs a naive f64 reference: odd N/M/K around the tile edges
 *                          (6 rows, 16/64 columns, 128-deep K blocks), a with padded rows, b
 *                          row-major / transposed / strided, padded ldc, bias, 1 and 2 threads
 *   lab_gemm_f32 --peak    the f32 FMA peak of one core: 24 independent zmm FMA chains
 *   lab_gemm_f32 [T]       the BERT/SAM linear shapes (forward, dx, dW) on T threads (default 1):
 *                          OpenBLAS sgemm vs the kernel, GFLOP/s from wall time, best of 7 (dW rows:
 *                          OpenBLAS only, matmul.c keeps them there)
 *
 * Shape letters: N rows of a (tokens), K reduction, M output columns.
 */
#include "lab.h"
#include "cpu/gemm_f32.h"

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / (1 << 23)) - 1.0);
}

static float *rand_buf(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++)
    p[i] = frand();
  return p;
}

/* one case: b layout (bt: transposed, bstr: column stride 2), a row-major with a padded row stride */
static int check_one(int64_t N, int64_t M, int64_t K, bool bt, bool bstr, bool bias, int64_t pad, int nt) {
  int64_t ars = K + 3, acs = 1;
  int64_t bs = bstr ? 2 : 1;
  int64_t brs = bt ? bs : (M + 1) * bs, bcs = bt ? (K + 2) * bs : bs;
  float *a = rand_buf(N * ars), *b = rand_buf(bt ? M * bcs : K * brs), *bi = rand_buf(M);
  int64_t ldc = M + pad;
  float *c = malloc((size_t)(N * ldc + 1) * sizeof(float));
  for (int64_t i = 0; i < N * ldc; i++)
    c[i] = 1e30f; /* padding must stay */
  kg_status st = kg_cpu_gemm_f32(c, ldc, a, ars, b, brs, bcs, N, M, K, bias ? bi : NULL, nt);
  double worst = 0;
  int bad = st != KG_OK;
  for (int64_t i = 0; i < N && !bad; i++) {
    for (int64_t j = 0; j < M; j++) {
      double s = bias ? bi[j] : 0.0, mag = fabs(s);
      for (int64_t k = 0; k < K; k++) {
        double p = (double)a[i * ars + k * acs] * (double)b[k * brs + j * bcs];
        s += p, mag += fabs(p);
      }
      double e = fabs((double)c[i * ldc + j] - s) / (mag + 1e-30);
      if (e > worst) worst = e;
    }
    for (int64_t j = M; j < ldc; j++)
      if (c[i * ldc + j] != 1e30f) bad = 1;
  }
  if (worst > 4e-7 * (1 + K / 64.0)) bad = 1; /* f32 rounding: ~K ulps of the magnitude sum, far looser than needed */
  if (bad)
    printf("FAIL N=%lld M=%lld K=%lld b%s%s bias=%d pad=%lld nt=%d: worst rel %.3g st=%d\n", (long long)N, (long long)M,
           (long long)K, bt ? "T" : "", bstr ? " strided" : "", bias, (long long)pad, nt, worst, st);
  free(a), free(b), free(bi), free(c);
  return bad;
}

static int check(void) {
  if (!kg_cpu_gemm_f32_ok()) {
    printf("gemm_f32: no AVX-512 here, nothing to check\n");
    return 0;
  }
  int fails = 0, n = 0;
  int64_t Ns[] = {1, 5, 6, 7, 13, 97, 200};
  int64_t Ms[] = {1, 15, 16, 17, 63, 64, 65, 130};
  int64_t Ks[] = {1, 7, 127, 128, 129, 300};
  for (size_t x = 0; x < sizeof Ns / sizeof *Ns; x++)
    for (size_t y = 0; y < sizeof Ms / sizeof *Ms; y++)
      for (size_t z = 0; z < sizeof Ks / sizeof *Ks; z++) {
        int v = (int)(x + y + z);
        fails += check_one(Ns[x], Ms[y], Ks[z], v & 1, v % 5 == 0, v % 3 != 0, (v >> 1) & 1 ? 3 : 0, 1 + (v & 1));
        n++;
      }
  /* every layout at one odd size, 1 and 2 threads, and a product with few rows and many panels */
  for (int l = 0; l < 8; l++) {
    fails += check_one(301, 203, 257, l & 1, (l >> 1) & 1, 1, 0, 1 + ((l >> 2) & 1));
    n++;
  }
  fails += check_one(130, 520, 1000, false, false, false, 0, 2), n++; /* few rows: panels split among threads */
  fails += check_one(13, 600, 2100, true, false, true, 0, 2), n++;    /* b packed in two chunks (> 4 MiB) */
  kg_cpu_gemm_f32_set_kc(37);                                         /* K and row blocks that do not divide K and N */
  kg_cpu_gemm_f32_set_mc(20);
  fails += check_one(50, 70, 200, true, false, true, 1, 2), n++;
  kg_cpu_gemm_f32_set_kc(0);
  kg_cpu_gemm_f32_set_mc(0);
  printf("gemm_f32 check: %d of %d cases failed\n", fails, n);
  return fails != 0;
}

/* 24 independent FMA chains (latency 4 x 2 ports = 8 needed in flight): flops per second of one core */
__attribute__((target("avx512f"), noinline)) static double peak_run(int64_t iters) {
  __m512 acc[24], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  for (int i = 0; i < 24; i++)
    acc[i] = _mm512_set1_ps((float)i);
  double t0 = lab_wall_seconds();
  for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; i++)
      acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  double t = lab_wall_seconds() - t0;
  __m512 s = acc[0];
  for (int i = 1; i < 24; i++)
    s = _mm512_add_ps(s, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return (double)iters * 24 * 16 * 2 / t;
}

static void peak(void) {
  int64_t iters = 20000000;
  double best1 = 0;
  for (int r = 0; r < 7; r++) {
    double g = peak_run(iters);
    if (g > best1) best1 = g;
  }
  double best2 = 0;
  for (int r = 0; r < 5; r++) {
    double sum = 0;
#pragma omp parallel num_threads(2) reduction(+ : sum)
    sum += peak_run(iters);
    if (sum > best2) best2 = sum;
  }
  printf("f32 FMA peak: 1 thread %.1f GFLOP/s (= 2 ports x 16 lanes x 2 flops x %.2f GHz), 2 threads %.1f GFLOP/s\n",
         best1 * 1e-9, best1 * 1e-9 / 64, best2 * 1e-9);
}

typedef struct {
  const char *name;
  int64_t N, M, K;
  bool at, bt; /* a transposed (dW), b transposed (forward: x wᵀ) */
  bool bias;
} shape;

static double gflops(const shape *s, int nt, bool blas) {
  int64_t N = s->N, M = s->M, K = s->K;
  float *a = rand_buf(N * K), *b = rand_buf(K * M), *bi = rand_buf(M), *c = rand_buf(N * M);
  double best = 1e30;
  for (int r = 0; r < 7; r++) {
    double t0 = lab_wall_seconds();
    if (blas) {
      if (s->bias) /* what matmul.c does: bias rows, then beta = 1 */
        for (int64_t i = 0; i < N; i++)
          memcpy(c + i * M, bi, (size_t)M * sizeof(float));
      cblas_sgemm(CblasRowMajor, s->at ? CblasTrans : CblasNoTrans, s->bt ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                  (int)K, 1.0f, a, s->at ? (int)N : (int)K, b, s->bt ? (int)K : (int)M, s->bias ? 1.0f : 0.0f, c,
                  (int)M);
    } else {
      kg_cpu_gemm_f32(c, M, a, K, b, s->bt ? 1 : M, s->bt ? K : 1, N, M, K, s->bias ? bi : NULL, nt);
    }
    double t = lab_wall_seconds() - t0;
    if (t < best) best = t;
  }
  free(a), free(b), free(bi), free(c);
  return 2.0 * (double)N * (double)M * (double)K / best * 1e-9;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--check")) return check();
  if (argc > 1 && !strcmp(argv[1], "--peak")) {
    peak();
    return 0;
  }
  int nt = argc > 1 ? atoi(argv[1]) : 1;
  if (getenv("LAB_KC")) kg_cpu_gemm_f32_set_kc(atoll(getenv("LAB_KC"))); /* tuning runs */
  if (getenv("LAB_MC")) kg_cpu_gemm_f32_set_mc(atoll(getenv("LAB_MC")));
  openblas_set_num_threads(nt);
  omp_set_num_threads(nt);
  shape shapes[] = {
      {"bert qkv/out fwd  [4096,128] x [128,128]^T + b", 4096, 128, 128, false, true, true},
      {"bert fc1 fwd      [4096,128] x [512,128]^T + b", 4096, 512, 128, false, true, true},
      {"bert fc2 fwd      [4096,512] x [128,512]^T + b", 4096, 128, 512, false, true, true},
      {"bert qkv dx       [4096,128] @ [128,128]", 4096, 128, 128, false, false, false},
      {"bert fc1 dx       [4096,512] @ [512,128]", 4096, 128, 512, false, false, false},
      {"bert fc2 dx       [4096,128] @ [128,512]", 4096, 512, 128, false, false, false},
      {"bert qkv dW       [128,4096] @ [4096,128]", 128, 128, 4096, true, false, false},
      {"bert fc1 dW       [512,4096] @ [4096,128]", 512, 128, 4096, true, false, false},
      {"bert fc2 dW       [128,4096] @ [4096,512]", 128, 512, 4096, true, false, false},
      {"sam mlp1 fwd      [1024,192] x [768,192]^T + b", 1024, 768, 192, false, true, true},
      {"sam mlp2 fwd      [1024,768] x [192,768]^T + b", 1024, 192, 768, false, true, true},
      {"sam qkv fwd       [1764,192] x [576,192]^T + b", 1764, 576, 192, false, true, true},
      {"sam neck fwd      [1024,256] x [128,256]^T + b", 1024, 128, 256, false, true, true},
      {"sam mlp2 dW (fit) [192,256] @ [256,768]", 192, 768, 256, true, false, false},
  };
  printf("%d thread(s), GFLOP/s (wall, best of 7)\n%-50s %9s %9s\n", nt, "product", "OpenBLAS", "gemm_f32");
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    double g0 = gflops(&shapes[i], nt, true), g1 = shapes[i].at ? 0.0 : gflops(&shapes[i], nt, false);
    printf("%-50s %9.1f %9.1f\n", shapes[i].name, g0, g1);
  }
  return 0;
}
