/* quant_format.h — the quantized weight formats, described once for the front-end
 * (engine/ops/quant.c), the CPU kernels (engine/cpu/quant.c) and the CUDA kernels
 * (engine/cuda/quant.cu); docs/quantization.md.
 *
 * A weight W [M, K] is stored as codes (one row of kg_qf_row_bytes per output row) and scales:
 *
 *   format  codes            scales                 W[m, k]
 *   Q8      i8 [M, K]        f32 [M]                code · scale[m]            (keng "int8")
 *   Q8_0    i8 [M, K]        f16 [M, K / 32]        code · scale[m, k / 32]    (llama.cpp Q8_0)
 *   Q4_0    u8 [M, K / 2]    f16 [M, K / 32]        (code - 8) · scale[m, k / 32]
 *
 * Q4_0 (keng "int4", llama.cpp's Q4_0 with d moved out of the block): byte j of a block of 32
 * holds element j in its low nibble and element j + 16 in its high nibble. The functions are
 * KG_HD, so the CPU reference and the CUDA kernels decode with the same arithmetic. */
#ifndef KENG_QUANT_FORMAT_H
#define KENG_QUANT_FORMAT_H

#include <keng/scalar.h>
#include <stdint.h>

#define KG_QF_BLOCK 32 /* the group of Q8_0 and Q4_0 (and of the int8 activations) */

typedef enum { KG_QF_Q8, KG_QF_Q8_0, KG_QF_Q4_0 } kg_qfmt;

/* bytes of one row of codes */
KG_HD int64_t kg_qf_row_bytes(kg_qfmt f, int64_t K) { return f == KG_QF_Q4_0 ? K / 2 : K; }
/* scales of one row (f32 for Q8, f16 otherwise) */
KG_HD int64_t kg_qf_row_scales(kg_qfmt f, int64_t K) { return f == KG_QF_Q8 ? 1 : K / KG_QF_BLOCK; }

/* the signed integer code of element k of a row */
KG_HD int kg_qf_code(kg_qfmt f, const uint8_t *row, int64_t k) {
  if (f != KG_QF_Q4_0) return (int8_t)row[k];
  uint8_t b = row[k / KG_QF_BLOCK * 16 + (k % 16)];
  return (k % KG_QF_BLOCK < 16 ? (b & 15) : (b >> 4)) - 8;
}

/* the scale of element k of a row (srow: the row's first scale) */
KG_HD float kg_qf_scale(kg_qfmt f, const void *srow, int64_t k) {
  if (f == KG_QF_Q8) return *(const float *)srow;
  return kg_f16_to_f32(((const uint16_t *)srow)[k / KG_QF_BLOCK]);
}

/* the Q8 code of v for the row scale s (absmax / 127): nearest even, clamped to ±127, 0 when s is 0 */
KG_HD int8_t kg_qf_q8_code(double v, float s) {
  double q = s > 0 ? rint(v / (double)s) : 0;
  return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}

/* one Q4_0 block from its 32 values: the value of largest magnitude m gives d = f16(m / -8) (m
 * itself is code 0), codes clamp(round_half_even(v / d) + 8, 0, 15); a zero block: d = 0, codes 8 */
KG_HD void kg_qf_q4_block(uint8_t *qb, uint16_t *d16, const double *x) {
  double m = 0;
  for (int j = 0; j < KG_QF_BLOCK; j++)
    if (fabs(x[j]) > fabs(m)) m = x[j];
  *d16 = kg_f32_to_f16((float)(m / -8.0));
  double d = kg_f16_to_f32(*d16);
  for (int j = 0; j < KG_QF_BLOCK / 2; j++) {
    int c[2];
    for (int h = 0; h < 2; h++) {
      double v = d != 0 ? rint(x[j + 16 * h] / d) + 8 : 8;
      c[h] = v < 0 ? 0 : v > 15 ? 15 : (int)v;
    }
    qb[j] = (uint8_t)(c[0] | c[1] << 4);
  }
}

#endif
