/* conv_winograd.h — Winograd F(4x4, 3x3) convolution on the CPU (f32; engine/cpu/conv_winograd.c).
 * Shape letters: B batch, C input channels, M output channels, H/W input size, Ho/Wo output. */
#ifndef KENG_CONV_WINOGRAD_H
#define KENG_CONV_WINOGRAD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
  int64_t B, C, H, W, M;              /* x: [B, C, H, W], w: [M, C, kh, kw], y: [B, M, Ho, Wo] */
  int kh, kw, sh, sw, ph, pw, dh, dw; /* kernel, stride, padding, dilation */
  int64_t groups;
} kg_wino_shape;

/* y (+ bias[M] when given) = conv2d(x, w) by Winograd F(4x4, 3x3), all operands contiguous f32;
 * false (y untouched) when it does not apply (not 3x3 / stride 1 / dilation 1 / one group, no
 * AVX2+FMA, a shape the selection rule leaves to the other paths, KENG_CONV_WINOGRAD=0) or its
 * buffers cannot be allocated */
bool kg_cpu_conv_winograd(float *y, const float *x, const float *w, const float *bias, const kg_wino_shape *s);

/* dw = the weight gradient of that conv (dw [M, C, 3, 3] from x [B, C, H, W] and dy [B, M, Ho,
 * Wo], all contiguous f32), by the transposed algorithm (36 GEMMs reducing over the tiles);
 * false (dw untouched) under the same conditions as kg_cpu_conv_winograd */
bool kg_cpu_conv_winograd_bwd_weight(float *dw, const float *x, const float *dy, const kg_wino_shape *s);

#endif
