/* quant.cu — CUDA kernels of the quantized weight-only ops (engine/ops/quant.c; the formats,
 * decoded by the same KG_HD functions as the CPU's reference, in engine/ops/quant_format.h).
 *
 * linear_q8 / linear_q4: a dequantize-in-the-loop GEMV for decode: one warp per output row m
 * reads the weight row once per x row (from L1/L2 after the first), lane l its 32-bit words of
 * codes l, l + 32, ... (4 int8 or 8 int4 codes of one block, decoded by quant_format.h's
 * kg_qf_word_*: the sum of their x · code times the block's scale; rows not on 4-byte boundaries —
 * a Q8 K not a multiple of 4, a view at an odd offset — byte by byte), and the warp sum gets the
 * bias.
 * Many rows run the same kernel (correct, not tuned: a dequantize-to-bf16 + cuBLASLt path is not
 * written yet). quantize_q8: one block per weight row, absmax by a shared-memory reduction;
 * quantize_q4: a thread per block of 32; dequantize (both ops' backward): a thread per element. */
#include "cuda.cuh"
#include "util.cuh"
#include "../ops/quant_format.h"

#define Q_WARPS 8

template <class S, class A>
__global__ void linear_q_kernel(const S *x, int64_t xrs, int64_t xcs, kg_qfmt fmt, const uint8_t *w, int64_t ldq,
                                const void *scale, int64_t lds, const char *bias, int bdt, int64_t bs, S *y, int64_t N,
                                int64_t M, int64_t K, bool words) {
  int lane = threadIdx.x & 31;
  int64_t m = (int64_t)blockIdx.x * Q_WARPS + (threadIdx.x >> 5);
  if (m >= M) return;
  const uint8_t *wr = w + m * ldq;
  const void *sr = fmt == KG_QF_Q8 ? (const void *)((const float *)scale + m)
                                   : (const void *)((const uint16_t *)scale + m * lds);
  A b = bias ? kg_load<A>(bias, bdt, m * bs) : (A)0;
  /* the row as 32-bit words (words: every row 4-byte aligned, so its bytes are whole words) */
  int64_t nw = words ? kg_qf_row_bytes(fmt, K) / 4 : 0, k0 = nw * (fmt == KG_QF_Q4_0 ? 8 : 4);
  const uint32_t *ww = (const uint32_t *)wr;
  for (int64_t n = 0; n < N; n++) {
    const S *xr = x + n * xrs;
    A s = 0;
    for (int64_t i = lane; i < nw; i += 32) { /* consecutive lanes, consecutive words: 128 bytes a warp */
      uint32_t v = ww[i];
      A t = 0;
      for (int j = 0; j < kg_qf_word_codes(fmt); j++)
        t += (A)kg_get(xr + kg_qf_word_elem(fmt, i, j) * xcs) * (A)kg_qf_word_code(fmt, v, j);
      s += t * (A)kg_qf_scale(fmt, sr, kg_qf_word_elem(fmt, i, 0)); /* one block, one scale */
    }
    for (int64_t k = k0 + lane; k < K; k += 32) /* unaligned rows: byte by byte */
      s += (A)kg_get(xr + k * xcs) * (A)kg_qf_code(fmt, wr, k) * (A)kg_qf_scale(fmt, sr, k);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) kg_put(y + n * M + m, s + b);
  }
}

/* both linear ops: the format from the codes' dtype and the scales' rank */
static kg_status linear_q(const kg_op_call *c, const char *op) {
  const kg_tensor *x = c->in[0], *wq = c->in[1], *sc = c->in[2], *b = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *y = c->out[0];
  int64_t N = x->shape[0], K = x->shape[1], M = wq->shape[0];
  if (N == 0 || M == 0) return KG_OK;
  int dev = y->device.index;
  cudaStream_t st = kg_cuda_stream(dev);
  kg_qfmt fmt = wq->dtype == KG_U8 ? KG_QF_Q4_0 : sc->ndim == 2 ? KG_QF_Q8_0 : KG_QF_Q8;
  unsigned blocks = (unsigned)((M + Q_WARPS - 1) / Q_WARPS);
  const char *bp = b ? (const char *)kg_data(b) : NULL;
  int bdt = b ? (int)b->dtype : 0;
  int64_t bs = b ? b->stride[0] : 0, lds = sc->ndim == 2 ? sc->shape[1] : 1;
  const uint8_t *w = (const uint8_t *)kg_data(wq);
  const void *s = kg_data(sc);
  /* every row starts on a 4-byte boundary (always for Q8_0 / Q4_0, whose rows are whole blocks,
   * unless the codes are a view at an odd offset): the codes are read as 32-bit words */
  bool words = (uintptr_t)w % 4 == 0 && wq->shape[1] % 4 == 0;
#define Q_LAUNCH(S, A)                                                                                              \
  linear_q_kernel<S, A><<<blocks, 32 * Q_WARPS, 0, st>>>((const S *)kg_data(x), x->stride[0], x->stride[1], fmt, w, \
                                                         wq->shape[1], s, lds, bp, bdt, bs, (S *)kg_data(y), N, M, K, \
                                                         words)
  switch (x->dtype) {
  case KG_F32: Q_LAUNCH(float, float); break;
  case KG_F64: Q_LAUNCH(double, double); break;
  case KG_BF16: Q_LAUNCH(kg_bf16, float); break;
  case KG_F16: Q_LAUNCH(kg_f16, float); break;
  default: return kg_error(KG_ERR_TYPE, op, "x dtype %s not supported on cuda", kg_dtype_info[x->dtype].name);
  }
#undef Q_LAUNCH
  return kg_cuda_check(op, dev);
}

extern "C" kg_status kg_cuda_linear_q8(const kg_op_call *c) { return linear_q(c, "linear_q8"); }
extern "C" kg_status kg_cuda_linear_q4(const kg_op_call *c) { return linear_q(c, "linear_q4"); }

/* one block per row of w [M, K] (any strides, any float dtype): the rounding of
 * quant_format.h's kg_qf_q8_code, as the CPU's */
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
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) q[m * K + k] = kg_qf_q8_code(kg_load<double>(w, wdt, m * rs + k * cs), s);
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

/* ---- Q4_0 --------------------------------------------------------------------------------- */

/* one thread per block of 32: its values gathered in f64, then quant_format.h's kg_qf_q4_block */
__global__ void quantize_q4_kernel(const char *w, int wdt, int64_t rs, int64_t cs, uint8_t *q, uint16_t *scale,
                                   int64_t M, int64_t K) {
  int64_t nb = K / KG_QF_BLOCK;
  KG_CUDA_FOR(i, M * nb) {
    int64_t m = i / nb, blk = i % nb;
    double v[KG_QF_BLOCK];
    for (int j = 0; j < KG_QF_BLOCK; j++) v[j] = kg_load<double>(w, wdt, m * rs + (blk * KG_QF_BLOCK + j) * cs);
    kg_qf_q4_block(q + m * (K / 2) + blk * 16, scale + i, v);
  }
}

extern "C" kg_status kg_cuda_quantize_q4(const kg_op_call *c) {
  const kg_tensor *w = c->in[0];
  int64_t M = w->shape[0], K = w->shape[1];
  if (M == 0 || K == 0) return KG_OK;
  int dev = w->device.index;
  quantize_q4_kernel<<<kg_cuda_blocks(M * (K / KG_QF_BLOCK)), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
      (const char *)kg_data(w), (int)w->dtype, w->stride[0], w->stride[1], (uint8_t *)kg_data(c->out[0]),
      (uint16_t *)kg_data(c->out[1]), M, K);
  return kg_cuda_check("quantize_q4", dev);
}

/* W [M, K] of any format (the backward of both linear ops, keng.dequantize_q4 / _q8) */
__global__ void dequantize_kernel(kg_qfmt fmt, const uint8_t *q, int64_t ldq, const void *scale, int64_t lds, char *w,
                                  int wdt, int64_t M, int64_t K) {
  KG_CUDA_FOR(i, M * K) {
    int64_t m = i / K, k = i % K;
    const void *sr = fmt == KG_QF_Q8 ? (const void *)((const float *)scale + m)
                                     : (const void *)((const uint16_t *)scale + m * lds);
    kg_store(w, wdt, i, (float)kg_qf_code(fmt, q + m * ldq, k) * kg_qf_scale(fmt, sr, k));
  }
}

extern "C" kg_status kg_cuda_dequantize_q4(const kg_op_call *c) {
  const kg_tensor *q = c->in[0], *sc = c->in[1];
  kg_tensor *w = c->out[0];
  int64_t M = w->shape[0], K = w->shape[1];
  if (M * K == 0) return KG_OK;
  int dev = w->device.index;
  kg_qfmt fmt = q->dtype == KG_U8 ? KG_QF_Q4_0 : sc->ndim == 2 ? KG_QF_Q8_0 : KG_QF_Q8;
  dequantize_kernel<<<kg_cuda_blocks(M * K), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
      fmt, (const uint8_t *)kg_data(q), q->shape[1], kg_data(sc), sc->ndim == 2 ? sc->shape[1] : 1,
      (char *)kg_data(w), (int)w->dtype, M, K);
  return kg_cuda_check("dequantize_q4", dev);
}
