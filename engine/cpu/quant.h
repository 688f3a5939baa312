/* quant.h — CPU kernels of the quantized weight-only linear (docs/quantization.md):
 * out = x · Wᵀ + b with W in one of the formats of engine/ops/quant_format.h (Q8: int8 + a row
 * scale; Q8_0: int8 + an f16 scale per 32; Q4_0: 4-bit codes + an f16 scale per 32), decoded in
 * registers (the weight is read as stored, never expanded in memory for decode). The variants are
 * public so that tests/lab/lab_quant.c can check and time each one. */
#ifndef KENG_CPU_QUANT_H
#define KENG_CPU_QUANT_H

#include "cpu.h"
#include "../ops/quant_format.h"

typedef enum {
  KG_Q8_AUTO,      /* the best the CPU runs for the current activation mode (kg_quant_act_int8); past
                      KG_Q8_GEMV_ROWS rows: dequantize blocks + sgemm */
  KG_Q8_SCALAR,    /* f32 x, plain C, any CPU */
  KG_Q8_AVX2,      /* f32 x, caller checked kg_cpu_q8_avx2() */
  KG_Q8_AVX512,    /* f32 x, caller checked kg_cpu_q8_avx512() */
  KG_Q8_BLOCKED,   /* f32 x: dequantize a block of weight rows to f32, then sgemm (any row count) */
  KG_Q8_I8_SCALAR, /* x quantized to int8 per block of 32 (kg_cpu_quantize_x_row), integer block
                      sums: the reference of the int8-activation kernels, plain C */
  KG_Q8_I8_VNNI    /* the same arithmetic with AVX-512 VNNI (vpdpbusd); caller checked
                      kg_cpu_q8_vnni() */
} kg_q8_variant;

/* rows of x up to which AUTO runs the GEMV kernels (decode: every weight byte read once per 4 rows
 * from L1); past it the blocked sgemm path */
#define KG_Q8_GEMV_ROWS 32

/* the kernels the CPU has and KENG_NO_SIMD allows */
bool kg_cpu_q8_avx2(void);   /* AVX2 + FMA */
bool kg_cpu_q8_avx512(void); /* AVX-512 F, BW, VL (+ F16C for the f16 scales) */
bool kg_cpu_q8_vnni(void);   /* the above + AVX512_VNNI */
/* AVX-512 VNNI on the CPU, whatever KENG_NO_SIMD says: decides int8 x (kg_quant_act_int8), so the
 * switch changes the kernel, not the numbers */
bool kg_cpu_q8_vnni_present(void);

/* a quantized weight: codes rows of kg_qf_row_bytes(fmt, K) bytes at stride ldq bytes; scales
 * rows at stride lds elements (f32 for Q8, whose lds is 1; f16 otherwise) */
typedef struct {
  kg_qfmt fmt;
  const uint8_t *q;
  int64_t ldq;
  const void *scale;
  int64_t lds;
} kg_qweight;

/* out[N, M] (f32, row stride ldo) = sum_k a[n, k] * W[m, k] (+ bias[m] when bias is not NULL); a
 * f32 rows (stride lda). Q8_0 and Q4_0 need K a multiple of 32. With f32 x (SCALAR, AVX2,
 * AVX512, BLOCKED) the sums are those of the dequantized weight; with the I8 variants each x row
 * is first quantized per block of 32 to int8 (kg_cpu_quantize_x_row). threads: 0 = kg_num_threads() when the
 * product is large enough. Fails only when a temporary cannot be allocated. */
kg_status kg_cpu_gemm_q(float *out, int64_t ldo, const float *a, int64_t lda, const kg_qweight *w, const float *bias,
                        int64_t N, int64_t M, int64_t K, kg_q8_variant v, int threads);

/* x [K] -> q [K] int8 and d [ceil(K / 32)]: per block of 32 (the last may be shorter) d =
 * absmax / 127 and q = nearbyint(x · (1 / d)) (f32 arithmetic, nearest even), 0 in a zero block;
 * a block holding a NaN or an infinity gets d = NaN, so that its products are NaN */
void kg_cpu_quantize_x_row(int8_t *q, float *d, const float *x, int64_t K);

/* Per row of w [M, K] (f64 values): scale = absmax / 127 (as f32), q = w / scale rounded to
 * nearest even and clamped to [-127, 127]; an all-zero row gets scale 0 and q 0. */
void kg_cpu_quantize_q8_row(int8_t *q, float *scale, const double *w, int64_t K);
/* one Q4_0 row of K (a multiple of 32) values: kg_qf_q4_block per block */
void kg_cpu_quantize_q4_row(uint8_t *q, uint16_t *scale, const double *w, int64_t K);
/* out[k] = W[m, k] of one row (q, scale: the row's codes and first scale) */
void kg_cpu_dequantize_row(float *out, kg_qfmt fmt, const uint8_t *q, const void *scale, int64_t K);

#define KG_Q4_BLOCK KG_QF_BLOCK

#endif
