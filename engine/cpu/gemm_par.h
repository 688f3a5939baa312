/* gemm_par.h — BLAS GEMM threaded by keng's pool (engine/cpu/gemm_par.c) */
#ifndef KENG_GEMM_PAR_H
#define KENG_GEMM_PAR_H

#include <stdbool.h>
#include <stdint.h>

/* C[N, M] = A[N, K] @ B[K, M] + beta C, row-major with leading dims, f64 when wide (else f32);
 * ta / tb: the operand is stored transposed ([K, N] / [M, K]). On up to nt threads (<= 0:
 * kg_num_threads()), as single-threaded BLAS calls on pieces handed out by kg_parallel_for;
 * inside a parallel region or a pool chunk it is one call on the calling thread. The pieces
 * depend only on the sizes, so any thread count above 1 gives the same bits. */
void kg_cpu_blas_gemm(bool wide, bool ta, bool tb, int64_t N, int64_t M, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, double beta, void *C, int64_t ldc, int nt);

/* How kg_cpu_blas_gemm cuts a product (for tests): `k` pieces along K (partial products summed
 * in piece order), else `rows` x `cols` tiles of C; 1/1/1 for a single call. */
typedef struct {
  int64_t k, rows, cols;
} kg_gemm_split;
kg_gemm_split kg_cpu_gemm_split(int64_t N, int64_t M, int64_t K);

#endif
