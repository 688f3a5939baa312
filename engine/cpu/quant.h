/* quant.h — int8 weight-only kernels (docs/quantization.md): y = x · (wq · scale)ᵀ + b with wq
 * int8 [M, K] and one f32 scale per output row, dequantized in registers (the weight is read as
 * int8, never expanded in memory for decode). The variants are public so that
 * tests/lab/lab_quant.c can check and time each one. */
#ifndef KENG_CPU_QUANT_H
#define KENG_CPU_QUANT_H

#include "cpu.h"

typedef enum {
  KG_Q8_AUTO,   /* the best the CPU runs; past KG_Q8_GEMV_ROWS rows: dequantize blocks + sgemm */
  KG_Q8_SCALAR, /* plain C, any CPU */
  KG_Q8_AVX2,   /* caller checked kg_cpu_q8_avx2() */
  KG_Q8_AVX512, /* caller checked kg_cpu_q8_avx512() */
  KG_Q8_BLOCKED /* dequantize a block of weight rows to f32, then sgemm (any row count) */
} kg_q8_variant;

/* rows of x up to which AUTO runs the GEMV kernels (decode: every weight byte read once per 4 rows
 * from L1); past it the blocked sgemm path */
#define KG_Q8_GEMV_ROWS 32

bool kg_cpu_q8_avx2(void);   /* AVX2 + FMA */
bool kg_cpu_q8_avx512(void); /* AVX-512 F, BW, VL */

/* out[N, M] (f32, row stride ldo) = scale[m] * sum_k a[n, k] * w[m, k] (+ bias[m] when bias is not
 * NULL); a f32 rows (stride lda), w int8 rows (stride ldw). threads: 0 = kg_num_threads() when the
 * product is large enough. Fails only when a temporary cannot be allocated. */
kg_status kg_cpu_gemm_q8(float *out, int64_t ldo, const float *a, int64_t lda, const int8_t *w, int64_t ldw,
                         const float *scale, const float *bias, int64_t N, int64_t M, int64_t K, kg_q8_variant v,
                         int threads);

/* Per row of w [M, K] (f64 values, row stride ldw): scale = absmax / 127 (as f32), q = w / scale
 * rounded to nearest even and clamped to [-127, 127]; an all-zero row gets scale 0 and q 0. */
void kg_cpu_quantize_q8_row(int8_t *q, float *scale, const double *w, int64_t K);

#endif
