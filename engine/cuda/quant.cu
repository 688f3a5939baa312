/* quant.cu — CUDA kernels of the int8 weight-only ops (engine/ops/quant.c, docs/quantization.md).
 *
 * linear_q8: a dequantize-in-the-loop GEMV for decode: one warp per output row m reads the int8
 * weight row once per x row (from L1/L2 after the first), widening 16 bytes per lane per load when
 * the row is 16-byte aligned, and applies the row's scale to the finished warp sum. Many rows run
 * the same kernel (correct, not tuned: a dequantize-to-bf16 + cuBLASLt path is not written yet).
 * quantize_q8: one block per weight row, absmax by a shared-memory reduction. */
#include "cuda.cuh"
#include "util.cuh"

#define Q8_WARPS 8

template <class S, class A>
__global__ void linear_q8_kernel(const S *x, int64_t xrs, int64_t xcs, const int8_t *w, const float *scale,
                                 const char *bias, int bdt, int64_t bs, S *y, int64_t N, int64_t M, int64_t K,
                                 bool vec) {
  int lane = threadIdx.x & 31;
  int64_t m = (int64_t)blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
  if (m >= M) return;
  const int8_t *wr = w + m * K;
  A b = bias ? kg_load<A>(bias, bdt, m * bs) : (A)0;
  for (int64_t n = 0; n < N; n++) {
    const S *xr = x + n * xrs;
    A s = 0;
    if (vec) { /* K % 16 == 0 and 16-byte aligned rows, x dense: 16 weights per lane per load */
      for (int64_t k = (int64_t)lane * 16; k < K; k += 32 * 16) {
        int4 pk = *(const int4 *)(wr + k);
        const int8_t *q = (const int8_t *)&pk;
#pragma unroll
        for (int j = 0; j < 16; j++) s += (A)kg_get(xr + k + j) * (A)q[j];
      }
    } else {
      for (int64_t k = lane; k < K; k += 32) s += (A)kg_get(xr + k * xcs) * (A)wr[k];
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) kg_put(y + n * M + m, s * (A)scale[m] + b);
  }
}

extern "C" kg_status kg_cuda_linear_q8(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *wq = c->in[1], *sc = c->in[2], *b = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *y = c->out[0];
  int64_t N = x->shape[0], K = x->shape[1], M = wq->shape[0];
  if (N == 0 || M == 0) return KG_OK;
  int dev = y->device.index;
  cudaStream_t st = kg_cuda_stream(dev);
  bool vec = K % 16 == 0 && x->stride[1] == 1 && ((uintptr_t)kg_data(wq) & 15) == 0;
  unsigned blocks = (unsigned)((M + Q8_WARPS - 1) / Q8_WARPS);
  const char *bp = b ? (const char *)kg_data(b) : NULL;
  int bdt = b ? (int)b->dtype : 0;
  int64_t bs = b ? b->stride[0] : 0;
  switch (x->dtype) {
  case KG_F32:
    linear_q8_kernel<float, float><<<blocks, 32 * Q8_WARPS, 0, st>>>(
        (const float *)kg_data(x), x->stride[0], x->stride[1], (const int8_t *)kg_data(wq), (const float *)kg_data(sc),
        bp, bdt, bs, (float *)kg_data(y), N, M, K, vec);
    break;
  case KG_F64:
    linear_q8_kernel<double, double><<<blocks, 32 * Q8_WARPS, 0, st>>>(
        (const double *)kg_data(x), x->stride[0], x->stride[1], (const int8_t *)kg_data(wq),
        (const float *)kg_data(sc), bp, bdt, bs, (double *)kg_data(y), N, M, K, vec);
    break;
  case KG_BF16:
    linear_q8_kernel<kg_bf16, float><<<blocks, 32 * Q8_WARPS, 0, st>>>(
        (const kg_bf16 *)kg_data(x), x->stride[0], x->stride[1], (const int8_t *)kg_data(wq),
        (const float *)kg_data(sc), bp, bdt, bs, (kg_bf16 *)kg_data(y), N, M, K, vec);
    break;
  case KG_F16:
    linear_q8_kernel<kg_f16, float><<<blocks, 32 * Q8_WARPS, 0, st>>>(
        (const kg_f16 *)kg_data(x), x->stride[0], x->stride[1], (const int8_t *)kg_data(wq),
        (const float *)kg_data(sc), bp, bdt, bs, (kg_f16 *)kg_data(y), N, M, K, vec);
    break;
  default: return kg_error(KG_ERR_TYPE, "linear_q8", "x dtype %s not supported on cuda", kg_dtype_info[x->dtype].name);
  }
  return kg_cuda_check("linear_q8", dev);
}

/* one block per row of w [M, K] (any strides, any float dtype): the rounding as the CPU's
 * kg_cpu_quantize_q8_row (f64 division, nearest even, clamp to ±127) */
__global__ void quantize_q8_kernel(const char *w, int wdt, int64_t rs, int64_t cs, int8_t *q, float *scale,
                                   int64_t K) {
  __shared__ double red[256];
  int64_t m = blockIdx.x;
  double amax = 0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) amax = fmax(amax, fabs(kg_load<double>(w, wdt, m * rs + k * cs)));
  red[threadIdx.x] = amax;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if ((int)threadIdx.x < h) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + h]);
    __syncthreads();
  }
  float s = (float)(red[0] / 127.0);
  if (threadIdx.x == 0) scale[m] = s;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    double v = s > 0 ? rint(kg_load<double>(w, wdt, m * rs + k * cs) / (double)s) : 0.0;
    q[m * K + k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
  }
}

extern "C" kg_status kg_cuda_quantize_q8(const kg_op_call *c) {
  const kg_tensor *w = c->in[0];
  int64_t M = w->shape[0], K = w->shape[1];
  if (M == 0) return KG_OK;
  int dev = w->device.index;
  quantize_q8_kernel<<<(unsigned)M, 256, 0, kg_cuda_stream(dev)>>>((const char *)kg_data(w), (int)w->dtype,
                                                                   w->stride[0], w->stride[1],
                                                                   (int8_t *)kg_data(c->out[0]),
                                                                   (float *)kg_data(c->out[1]), K);
  return kg_cuda_check("quantize_q8", dev);
}

/* ---- int4, blocks of 32 with an f16 scale (engine/cpu/quant.h has the layout) ------------- */

/* one warp per output row; lane l takes blocks l, l + 32, ... (16 bytes and one scale each) */
template <class S, class A>
__global__ void linear_q4_kernel(const S *x, int64_t xrs, int64_t xcs, const uint8_t *w, const uint16_t *scale,
                                 const char *bias, int bdt, int64_t bs, S *y, int64_t N, int64_t M, int64_t K) {
  int lane = threadIdx.x & 31;
  int64_t m = (int64_t)blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
  if (m >= M) return;
  int64_t nb = K / 32;
  const uint8_t *wr = w + m * (K / 2);
  const uint16_t *sr = scale + m * nb;
  A b = bias ? kg_load<A>(bias, bdt, m * bs) : (A)0;
  for (int64_t n = 0; n < N; n++) {
    const S *xr = x + n * xrs;
    A s = 0;
    for (int64_t blk = lane; blk < nb; blk += 32) {
      A part = 0;
      for (int j = 0; j < 16; j++) {
        uint8_t q = wr[blk * 16 + j];
        part += (A)kg_get(xr + (blk * 32 + j) * xcs) * (A)((q & 15) - 8);
        part += (A)kg_get(xr + (blk * 32 + j + 16) * xcs) * (A)((q >> 4) - 8);
      }
      s += part * (A)kg_f16_to_f32(sr[blk]);
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) kg_put(y + n * M + m, s + b);
  }
}

extern "C" kg_status kg_cuda_linear_q4(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *wq = c->in[1], *sc = c->in[2], *b = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *y = c->out[0];
  int64_t N = x->shape[0], K = x->shape[1], M = wq->shape[0];
  if (N == 0 || M == 0) return KG_OK;
  int dev = y->device.index;
  cudaStream_t st = kg_cuda_stream(dev);
  unsigned blocks = (unsigned)((M + Q8_WARPS - 1) / Q8_WARPS);
  const char *bp = b ? (const char *)kg_data(b) : NULL;
  int bdt = b ? (int)b->dtype : 0;
  int64_t bs = b ? b->stride[0] : 0;
  const uint8_t *w = (const uint8_t *)kg_data(wq);
  const uint16_t *s = (const uint16_t *)kg_data(sc);
  switch (x->dtype) {
  case KG_F32:
    linear_q4_kernel<float, float><<<blocks, 32 * Q8_WARPS, 0, st>>>((const float *)kg_data(x), x->stride[0],
                                                                      x->stride[1], w, s, bp, bdt, bs,
                                                                      (float *)kg_data(y), N, M, K);
    break;
  case KG_F64:
    linear_q4_kernel<double, double><<<blocks, 32 * Q8_WARPS, 0, st>>>((const double *)kg_data(x), x->stride[0],
                                                                        x->stride[1], w, s, bp, bdt, bs,
                                                                        (double *)kg_data(y), N, M, K);
    break;
  case KG_BF16:
    linear_q4_kernel<kg_bf16, float><<<blocks, 32 * Q8_WARPS, 0, st>>>((const kg_bf16 *)kg_data(x), x->stride[0],
                                                                        x->stride[1], w, s, bp, bdt, bs,
                                                                        (kg_bf16 *)kg_data(y), N, M, K);
    break;
  case KG_F16:
    linear_q4_kernel<kg_f16, float><<<blocks, 32 * Q8_WARPS, 0, st>>>((const kg_f16 *)kg_data(x), x->stride[0],
                                                                       x->stride[1], w, s, bp, bdt, bs,
                                                                       (kg_f16 *)kg_data(y), N, M, K);
    break;
  default: return kg_error(KG_ERR_TYPE, "linear_q4", "x dtype %s not supported on cuda", kg_dtype_info[x->dtype].name);
  }
  return kg_cuda_check("linear_q4", dev);
}

/* one thread per block of 32: the rounding of kg_cpu_quantize_q4_row */
__global__ void quantize_q4_kernel(const char *w, int wdt, int64_t rs, int64_t cs, uint8_t *q, uint16_t *scale,
                                   int64_t M, int64_t K) {
  int64_t nb = K / 32;
  KG_CUDA_FOR(i, M * nb) {
    int64_t m = i / nb, blk = i % nb;
    int64_t base = m * rs + blk * 32 * cs;
    double mx = 0;
    for (int j = 0; j < 32; j++) {
      double v = kg_load<double>(w, wdt, base + j * cs);
      if (fabs(v) > fabs(mx)) mx = v;
    }
    uint16_t d16 = kg_f32_to_f16((float)(mx / -8.0));
    double d = kg_f16_to_f32(d16);
    scale[i] = d16;
    for (int j = 0; j < 16; j++) {
      int c[2];
      for (int h = 0; h < 2; h++) {
        double v = d != 0 ? rint(kg_load<double>(w, wdt, base + (j + 16 * h) * cs) / d) + 8 : 8;
        c[h] = v < 0 ? 0 : v > 15 ? 15 : (int)v;
      }
      q[m * (K / 2) + blk * 16 + j] = (uint8_t)(c[0] | c[1] << 4);
    }
  }
}

extern "C" kg_status kg_cuda_quantize_q4(const kg_op_call *c) {
  const kg_tensor *w = c->in[0];
  int64_t M = w->shape[0], K = w->shape[1];
  if (M == 0 || K == 0) return KG_OK;
  int dev = w->device.index;
  quantize_q4_kernel<<<kg_cuda_blocks(M * (K / 32)), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
      (const char *)kg_data(w), (int)w->dtype, w->stride[0], w->stride[1], (uint8_t *)kg_data(c->out[0]),
      (uint16_t *)kg_data(c->out[1]), M, K);
  return kg_cuda_check("quantize_q4", dev);
}

__global__ void dequantize_q4_kernel(const uint8_t *q, const uint16_t *scale, char *w, int wdt, int64_t M, int64_t K) {
  KG_CUDA_FOR(i, M * K) {
    int64_t m = i / K, k = i % K, blk = k / 32, j = k % 32;
    uint8_t b = q[m * (K / 2) + blk * 16 + (j & 15)];
    int code = j < 16 ? (b & 15) : (b >> 4);
    kg_store(w, wdt, i, (float)(code - 8) * kg_f16_to_f32(scale[m * (K / 32) + blk]));
  }
}

extern "C" kg_status kg_cuda_dequantize_q4(const kg_op_call *c) {
  kg_tensor *w = c->out[0];
  int64_t M = w->shape[0], K = w->shape[1];
  if (M * K == 0) return KG_OK;
  int dev = w->device.index;
  dequantize_q4_kernel<<<kg_cuda_blocks(M * K), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
      (const uint8_t *)kg_data(c->in[0]), (const uint16_t *)kg_data(c->in[1]), (char *)kg_data(w), (int)w->dtype, M, K);
  return kg_cuda_check("dequantize_q4", dev);
}
