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
bool kg_cpu_q8_avx512(void); /* AVX-512 F, BW, VL (+ F16C for the int4 scales) */

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

/* ---- int4, blocks of 32 (llama.cpp's Q4_0 layout) ------------------------------------------
 * A weight row of K (a multiple of 32) values is K / 32 blocks; block b has an f16 scale d and
 * 16 bytes: byte j holds element j in its low nibble and element j + 16 in its high nibble, each
 * a code q in [0, 15] for the value (q - 8) · d. */
#define KG_Q4_BLOCK 32

/* one row: the block's value of largest magnitude m gives d = f16(m / -8) (so m itself is code
 * 0), q = clamp(round_half_even(w / d) + 8, 0, 15); an all-zero block gets d = 0, q = 8 */
void kg_cpu_quantize_q4_row(uint8_t *q, uint16_t *scale, const double *w, int64_t K);
/* out[k] = (q - 8) · d for one row of K values */
void kg_cpu_dequantize_q4_row(float *out, const uint8_t *q, const uint16_t *scale, int64_t K);
/* as kg_cpu_gemm_q8 with a Q4 weight (rows of K / 2 bytes at stride ldw bytes, scales at stride
 * lds); v: AUTO, SCALAR, AVX2, AVX512 or BLOCKED */
kg_status kg_cpu_gemm_q4(float *out, int64_t ldo, const float *a, int64_t lda, const uint8_t *w, int64_t ldw,
                         const uint16_t *scale, int64_t lds, const float *bias, int64_t N, int64_t M, int64_t K,
                         kg_q8_variant v, int threads);
