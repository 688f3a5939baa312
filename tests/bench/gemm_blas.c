/* gemm_blas.c — the measurement behind docs/blas.md: f32 GEMM GFLOP/s at n^3 through
 * OpenBLAS (OpenMP build) and, when built with -DWITH_DNNL, oneDNN's dnnl_sgemm.
 *   cc -O2 -fopenmp gemm_blas.c -I/usr/include/x86_64-linux-gnu/openblas-openmp -lopenblas [-DWITH_DNNL -ldnnl]
 *   ./a.out 2048 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef WITH_DNNL
#include <dnnl.h>
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2048, reps = 5;
  float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
  for (long i = 0; i < (long)n * n; i++) a[i] = (float)(i % 7) - 3, b[i] = (float)(i % 5) - 2;
  double best = 1e30;
  for (int r = 0; r < reps + 1; r++) {
    double t = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    t = now() - t;
    if (r && t < best) best = t;
  }
  printf("openblas sgemm %d^3: %.1f GFLOP/s\n", n, 2.0 * n * n * n / best / 1e9);
#ifdef WITH_DNNL
  best = 1e30;
  for (int r = 0; r < reps + 1; r++) {
    double t = now();
    dnnl_sgemm('N', 'N', n, n, n, 1, a, n, b, n, 0, c, n);
    t = now() - t;
    if (r && t < best) best = t;
  }
  printf("onednn  sgemm %d^3: %.1f GFLOP/s\n", n, 2.0 * n * n * n / best / 1e9);
#endif
  return 0;
}
