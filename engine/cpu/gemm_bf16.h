/* gemm_bf16.h — small-N GEMM reading a bf16 weight directly (decode: a few rows of x against a
 * big bf16 weight), f32 accumulation. Used by matmul.c's bf16 path; the variants are public so
 * that tests/lab/lab_gemm_bf16.c can check and time each one. */
#ifndef KENG_CPU_GEMM_BF16_H
#define KENG_CPU_GEMM_BF16_H

#include "cpu.h"

typedef enum {
  KG_GEMM_BF16_AUTO,   /* the best the CPU runs: AVX-512, else AVX2 + FMA, else scalar */
  KG_GEMM_BF16_SCALAR, /* plain C, any CPU */
  KG_GEMM_BF16_AVX2,   /* caller checked kg_cpu_gemm_bf16_avx2() */
  KG_GEMM_BF16_AVX512, /* caller checked kg_cpu_gemm_bf16_avx512(); x @ W (not b_trans) runs AVX2 */
  KG_GEMM_BF16_DPBF16, /* caller checked kg_cpu_gemm_bf16_dpbf16(); b_trans with a_bf16 only,
                          else as KG_GEMM_BF16_AVX512 */
  KG_GEMM_BF16_PACKED, /* caller checked kg_cpu_gemm_bf16_dpbf16(); a_bf16 only (else as
                          KG_GEMM_BF16_AVX512): the many-rows kernel, both layouts (AUTO takes it
                          past 32 rows when a_bf16) */
  KG_GEMM_BF16_AMX,    /* caller checked kg_cpu_gemm_bf16_amx(); b_trans with a_bf16 and 3..32 rows
                          (AUTO takes it from GB_AMX_ROWS rows), else as KG_GEMM_BF16_DPBF16 */
  KG_GEMM_BF16_AMX_PACKED, /* caller checked kg_cpu_gemm_bf16_amx(); the packed kernel (a_bf16 only, both
                              layouts) on AMX tiles: AUTO takes it wherever it takes PACKED on a CPU
                              with AMX-BF16 */
} kg_gemm_bf16_variant;

typedef struct {
  kg_gemm_bf16_variant variant;
  int threads; /* 0: kg_num_threads() when the product is large enough, else 1 */
  int64_t kc;  /* K block (elements); 0: chosen so that an [N, kc] f32 block of a stays in L2 */
  bool a_bf16; /* every value of a is a bf16 (a came from a bf16 tensor): allows the DPBF16
                  variant, which packs a as bf16 */
  const uint16_t *a16; /* a itself as bf16 (row stride lda16; then a may be NULL): only for the
                          packed kernel (PACKED, or AUTO past 32 rows, on a CPU with AVX512_BF16),
                          else the call fails */
  int64_t lda16;
  bool a16_trans; /* a16 holds a transposed: a[n, k] = a16[k * lda16 + n] (dW = g^T x) */
} kg_gemm_bf16_opts;

/* does this CPU run the AVX2 (AVX2 + FMA) / AVX-512 (F, BW, VL) variant? */
bool kg_cpu_gemm_bf16_avx2(void);
bool kg_cpu_gemm_bf16_avx512(void);
bool kg_cpu_gemm_bf16_dpbf16(void); /* AVX-512 + AVX512_BF16 */
bool kg_cpu_gemm_bf16_amx(void);    /* that + AMX-BF16, and Linux's permission to use the tiles */

/* out[N, M] (row stride ldo elements, dtype odt) = a[N, K] (f32, row stride lda) @ B[K, M], where
 * B is read from the bf16 matrix w in one of two layouts:
 *   b_trans:  B[k, m] = w[m * ldw + k]   (w is W [M, K] row-major: x @ W^T, the nn.Linear case)
 *   else:     B[k, m] = w[k * ldw + m]   (w is W [K, M] row-major: x @ W)
 * Each weight element is read once per K block (once in all when N * K * 4 bytes fit in L2).
 * o may be NULL (defaults). Fails only when a temporary cannot be allocated. */
kg_status kg_cpu_gemm_bf16(void *out, kg_dtype odt, int64_t ldo, const float *a, int64_t lda, const uint16_t *w,
                           int64_t ldw, bool b_trans, int64_t N, int64_t M, int64_t K, const kg_gemm_bf16_opts *o);

#endif
