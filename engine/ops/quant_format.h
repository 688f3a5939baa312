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

/* Reading a row of codes as 32-bit words (the CUDA GEMV: one aligned load for 4 or 8 codes
 * instead of a load per byte): word i holds bytes 4i .. 4i + 3, little-endian. Its codes are
 * numbered j = 0 .. kg_qf_word_codes - 1 — for Q4_0 the low nibbles of its 4 bytes, then their
 * high nibbles — and all lie in one block of 32 (a block's 16 or 32 bytes are whole words), so
 * one scale serves the word: that of element kg_qf_word_elem(f, i, 0). */
KG_HD int kg_qf_word_codes(kg_qfmt f) { return f == KG_QF_Q4_0 ? 8 : 4; }

/* the element (column of W) of code j of word i */
KG_HD int64_t kg_qf_word_elem(kg_qfmt f, int64_t i, int j) {
  if (f != KG_QF_Q4_0) return 4 * i + j;
  int64_t b = 4 * i + (j & 3); /* the byte */
  return b / 16 * KG_QF_BLOCK + b % 16 + 16 * (j >> 2);
}

/* the signed code j of word v */
KG_HD int kg_qf_word_code(kg_qfmt f, uint32_t v, int j) {
  if (f != KG_QF_Q4_0) return (int8_t)(uint8_t)(v >> (8 * j));
  return (int)((v >> (8 * (j & 3) + 4 * (j >> 2))) & 15u) - 8;
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
