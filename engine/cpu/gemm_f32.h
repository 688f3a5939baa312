/* gemm_f32.h — keng's AVX-512 f32 GEMM for the mid-size products of the ViT/BERT linears
 * (K and M of 128-1024, thousands of rows): the forward x wᵀ + b and the input gradient g w. Used by matmul.c; public
 * so that tests/lab/lab_gemm_f32.c can check and time it against OpenBLAS.
 *
 * Shape letters: N rows of a (tokens), K reduction, M output columns. */
#ifndef KENG_CPU_GEMM_F32_H
#define KENG_CPU_GEMM_F32_H

#include "cpu.h"

/* does this CPU run the kernel (AVX-512F, not capped by KENG_GEMM_F32 / KENG_NO_SIMD)? */
bool kg_cpu_gemm_f32_ok(void);

/* c[N, M] (row stride ldc) = a[N, K] @ b[K, M] (+ bias[M] on every row when not NULL), all f32.
 * a row-major with row stride lda; b[k, m] at b[k * brs + m * bcs], any strides (it is packed).
 * nt threads (0: kg_num_threads()). [out] c. Fails only when the packing buffer is out of memory
 * (or on a non-x86-64 build, where kg_cpu_gemm_f32_ok() is false). */
kg_status kg_cpu_gemm_f32(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t brs, int64_t bcs,
                          int64_t N, int64_t M, int64_t K, const float *bias, int nt);

/* the K block (0: the built-in one); for the lab */
void kg_cpu_gemm_f32_set_kc(int64_t kc);
/* the row block (0: the built-in one); for the lab */
void kg_cpu_gemm_f32_set_mc(int64_t mc);

#endif
