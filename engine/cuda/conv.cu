/* conv.cu — conv2d and conv_transpose2d (forward and backward) through cuDNN's convolution API,
 * and interpolate (nearest, bilinear, bicubic, antialias; + backward) as plain kernels, matching
 * engine/cpu/conv.c through the shared window and weight formulas of engine/ops/interp.h.
 *
 * Every conv is one of cuDNN's three primitives over one geometry: an image side
 * [B, G*C, H, W] and a column side [B, G*M, Ho, Wo] linked by w [G*M, C, kh, kw]:
 *   Forward          col = conv(im, w)      conv2d forward, conv_transpose2d dx
 *   BackwardData     im = conv_T(col, w)    conv2d dx, conv_transpose2d forward
 *   BackwardFilter   dw from (im, col)      dw of both
 * Operands are made dense in one compute dtype (the output's for the forward; f64 when any
 * operand is f64 in the backward, else dy's) by the copy kernel; cuDNN computes in f32 for
 * f32/bf16/f16 (f32 without TF32 — CUDNN_FMA_MATH — unless keng.backends.allow_tf32 is set, then
 * CUDNN_TENSOR_OP_MATH) and f64 for f64.
 * The algorithm is cuDNN's first heuristic choice (cudnnGet*Algorithm_v7) whose workspace fits
 * KG_CONV_WORKSPACE_CAP (1 GiB) and can be allocated and whose launch succeeds (the fallback
 * order is conv_algo.h's, tested on the CPU), chosen once per (primitive, shapes, dtype, TF32,
 * device) and cached; a cached choice that later fails (memory) is searched again. Bias add and db are plain kernels
 * (db sums in double). Built without cuDNN (not found by CMake) the conv ops raise an error;
 * interpolate works either way. */
#include "util.cuh"
#include "../ops/interp.h"

#include <pthread.h>

/* ---- interpolate ------------------------------------------------------------------------------- */

/* one axis of the params (windows and weights: engine/ops/interp.h, as the CPU's tables) */
static kg_interp_axis interp_axis(const kg_interpolate_params *p, bool single, int axis, int64_t in) {
  kg_interp_axis a = {p->mode, p->antialias, p->align_corners, single, in, axis ? p->out_w : p->out_h,
                      axis ? p->scale_w : p->scale_h};
  return a;
}

/* y[b, c, oh, ow] = Σ_h Σ_w wh(oh, h) ww(ow, w) x[b, c, h, w] over the two windows, in double */
__global__ void interp_kernel(const char *x, int xdt, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, char *y,
                              int ydt, int64_t C, kg_interp_axis ah, kg_interp_axis aw, int64_t n) {
  KG_CUDA_FOR(e, n) {
    int64_t Ho = ah.out, Wo = aw.out;
    int64_t ow = e % Wo, oh = e / Wo % Ho, ch = e / (Wo * Ho) % C, b = e / (Wo * Ho * C);
    int64_t h0, h1, w0, w1;
    kg_interp_bounds(&ah, oh, &h0, &h1);
    kg_interp_bounds(&aw, ow, &w0, &w1);
    double nh = kg_interp_norm(&ah, oh, h0, h1), nw = kg_interp_norm(&aw, ow, w0, w1), acc = 0;
    const int64_t base = b * xs0 + ch * xs1;
    for (int64_t h = h0; h < h1; h++) {
      double row = 0;
      for (int64_t w = w0; w < w1; w++) row += kg_interp_weight(&aw, ow, w, nw) * kg_load<double>(x, xdt, base + h * xs2 + w * xs3);
      acc += kg_interp_weight(&ah, oh, h, nh) * row;
    }
    kg_store(y, ydt, e, acc);
  }
}

/* dx[b, c, h, w] = Σ dy[oh, ow] wh(oh, h) ww(ow, w) over the output pixels that read (h, w):
 * a gather (no atomics), summed in double */
__global__ void interp_back_kernel(const char *g, int gdt, int64_t gs0, int64_t gs1, int64_t gs2, int64_t gs3, char *dx,
                                   int ddt, int64_t C, kg_interp_axis ah, kg_interp_axis aw, int64_t n) {
  KG_CUDA_FOR(e, n) {
    int64_t H = ah.in, W = aw.in;
    int64_t w = e % W, h = e / W % H, ch = e / (W * H) % C, b = e / (W * H * C);
    int64_t oh0, oh1, ow0, ow1, lo, hi;
    kg_interp_readers(&ah, h, &oh0, &oh1);
    kg_interp_readers(&aw, w, &ow0, &ow1);
    double acc = 0;
    for (int64_t oh = oh0; oh < oh1; oh++) {
      kg_interp_bounds(&ah, oh, &lo, &hi);
      double wh = kg_interp_weight(&ah, oh, h, kg_interp_norm(&ah, oh, lo, hi)), row = 0;
      for (int64_t ow = ow0; ow < ow1; ow++) {
        kg_interp_bounds(&aw, ow, &lo, &hi);
        row += kg_interp_weight(&aw, ow, w, kg_interp_norm(&aw, ow, lo, hi)) *
               kg_load<double>(g, gdt, b * gs0 + ch * gs1 + oh * gs2 + ow * gs3);
      }
      acc += wh * row;
    }
    kg_store(dx, ddt, e, acc);
  }
}

extern "C" kg_status kg_cuda_interpolate(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  const kg_interpolate_params *p = (const kg_interpolate_params *)c->params;
  int64_t n = kg_numel(y);
  if (n == 0) return KG_OK;
  int dev = y->device.index;
  bool single = x->dtype != KG_F64;
  interp_kernel<<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
      (const char *)kg_data(x), x->dtype, x->stride[0], x->stride[1], x->stride[2], x->stride[3], (char *)kg_data(y),
      y->dtype, x->shape[1], interp_axis(p, single, 0, x->shape[2]), interp_axis(p, single, 1, x->shape[3]), n);
  return kg_cuda_check("interpolate", dev);
}

extern "C" kg_status kg_cuda_interpolate_backward(const kg_op_call *c) {
  const kg_tensor *g = c->in[0];
  kg_tensor *dx = c->out[0];
  const kg_interpolate_params *p = (const kg_interpolate_params *)c->params;
  int64_t n = kg_numel(dx);
  if (n == 0) return KG_OK;
  int dev = dx->device.index;
  bool single = dx->dtype != KG_F64;
  interp_back_kernel<<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
      (const char *)kg_data(g), g->dtype, g->stride[0], g->stride[1], g->stride[2], g->stride[3], (char *)kg_data(dx),
      dx->dtype, dx->shape[1], interp_axis(p, single, 0, dx->shape[2]), interp_axis(p, single, 1, dx->shape[3]), n);
  return kg_cuda_check("interpolate_backward", dev);
}

/* ---- bias and its gradient ------------------------------------------------------------------ */

/* y [B, C, P] (dense, dtype ydt) += bias[c] */
template <class A> __global__ void bias_add_kernel(char *y, int ydt, const char *bias, int bdt, int64_t C, int64_t P,
                                                   int64_t n) {
  KG_CUDA_FOR(e, n) kg_store(y, ydt, e, kg_load<A>(y, ydt, e) + kg_load<A>(bias, bdt, e / P % C));
}

/* db[c] = Σ_{b, p} dy[b, c, p] in double; a block per channel; dy any strides */
__global__ void bias_grad_kernel(const char *dy, int gdt, int64_t s0, int64_t s1, int64_t s2, int64_t s3, int64_t B,
                                 int64_t C, int64_t H, int64_t W, char *db, int ddt) {
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double acc = 0;
    for (int64_t e = threadIdx.x; e < B * H * W; e += blockDim.x) {
      int64_t w = e % W, h = e / W % H, b = e / (W * H);
      acc += kg_load<double>(dy, gdt, b * s0 + c * s1 + h * s2 + w * s3);
    }
    acc = kg_block_sum(acc);
    if (threadIdx.x == 0) kg_store(db, ddt, c, acc);
  }
}

static kg_status bias_grad(const char *op, const kg_tensor *dy, kg_tensor *db) {
  int dev = db->device.index;
  const int64_t *s = dy->stride;
  bias_grad_kernel<<<kg_grid(dy->shape[1]), 256, 0, kg_cuda_stream(dev)>>>(
      (const char *)kg_data(dy), dy->dtype, s[0], s[1], s[2], s[3], dy->shape[0], dy->shape[1], dy->shape[2],
      dy->shape[3], (char *)kg_data(db), db->dtype);
  return kg_cuda_check(op, dev);
}

#ifdef KENG_HAVE_CUDNN
#include <cudnn.h>

#include "conv_algo.h"

static cudnnHandle_t handles[16];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static kg_status get_handle(int dev, const char *op, cudnnHandle_t *out) {
  cudaStream_t s = kg_cuda_stream(dev);
  if (dev < 0 || dev >= 16) return kg_error(KG_ERR_DEVICE, op, "cuda:%d out of range", dev);
  pthread_mutex_lock(&lock);
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (!handles[dev]) st = cudnnCreate(&handles[dev]);
  pthread_mutex_unlock(&lock);
  if (st != CUDNN_STATUS_SUCCESS) return kg_error(KG_ERR_DEVICE, op, "cudnnCreate: %s", cudnnGetErrorString(st));
  cudnnSetStream(handles[dev], s);
  *out = handles[dev];
  return KG_OK;
}

enum { PRIM_FWD, PRIM_BWD_DATA, PRIM_BWD_FILTER };

/* the algorithm chosen per (primitive, device, dtype, TF32, geometry): conv_algo.h */
static kg_conv_cache cache;

struct conv_descs {
  cudnnTensorDescriptor_t im, col;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnDataType_t dt;
};

static void destroy(conv_descs *d) {
  if (d->im) cudnnDestroyTensorDescriptor(d->im);
  if (d->col) cudnnDestroyTensorDescriptor(d->col);
  if (d->w) cudnnDestroyFilterDescriptor(d->w);
  if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
}

#define CUDNN_TRY(call)                                                                                \
  do {                                                                                                 \
    cudnnStatus_t st_ = (call);                                                                        \
    if (st_ != CUDNN_STATUS_SUCCESS) return kg_error(KG_ERR_DEVICE, op, "%s: %s", #call, cudnnGetErrorString(st_)); \
  } while (0)

static kg_status make_descs(conv_descs *d, const char *op, kg_dtype dt, bool tf32, const int64_t *im,
                            const int64_t *col, const int64_t *w, const kg_conv2d_params *p) {
  *d = conv_descs{};
  for (int i = 0; i < 4; i++)
    if (im[i] > INT32_MAX || col[i] > INT32_MAX || w[i] > INT32_MAX)
      return kg_error(KG_ERR_SHAPE, op, "a dim exceeds cuDNN's int range");
  d->dt = dt == KG_F64 ? CUDNN_DATA_DOUBLE : dt == KG_BF16 ? CUDNN_DATA_BFLOAT16 : dt == KG_F16 ? CUDNN_DATA_HALF
                                                                                                 : CUDNN_DATA_FLOAT;
  CUDNN_TRY(cudnnCreateTensorDescriptor(&d->im));
  CUDNN_TRY(cudnnCreateTensorDescriptor(&d->col));
  CUDNN_TRY(cudnnCreateFilterDescriptor(&d->w));
  CUDNN_TRY(cudnnCreateConvolutionDescriptor(&d->conv));
  CUDNN_TRY(cudnnSetTensor4dDescriptor(d->im, CUDNN_TENSOR_NCHW, d->dt, (int)im[0], (int)im[1], (int)im[2], (int)im[3]));
  CUDNN_TRY(cudnnSetTensor4dDescriptor(d->col, CUDNN_TENSOR_NCHW, d->dt, (int)col[0], (int)col[1], (int)col[2], (int)col[3]));
  CUDNN_TRY(cudnnSetFilter4dDescriptor(d->w, d->dt, CUDNN_TENSOR_NCHW, (int)w[0], (int)w[1], (int)w[2], (int)w[3]));
  CUDNN_TRY(cudnnSetConvolution2dDescriptor(d->conv, p->padding[0], p->padding[1], p->stride[0], p->stride[1],
                                            p->dilation[0], p->dilation[1], CUDNN_CROSS_CORRELATION,
                                            dt == KG_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
  CUDNN_TRY(cudnnSetConvolutionGroupCount(d->conv, p->groups));
  /* f32: FMA (no TF32) unless keng.backends.allow_tf32; f64 FMA; bf16/f16 tensor cores */
  bool fma = dt == KG_F64 || (dt == KG_F32 && !tf32);
  CUDNN_TRY(cudnnSetConvolutionMathType(d->conv, fma ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  return KG_OK;
}

/* cuDNN's heuristic list for the primitive, best first, each with its workspace (conv_algo.h) */
static kg_status candidates(const char *op, cudnnHandle_t h, const conv_descs *d, int prim, kg_conv_candidate *c,
                            int *n) {
  size_t size = 0;
  *n = 0;
  if (prim == PRIM_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, d->im, d->w, d->conv, d->col, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                     n, perf));
    for (int i = 0; i < *n; i++) {
      c[i].algo = (int)perf[i].algo;
      c[i].ok = perf[i].status == CUDNN_STATUS_SUCCESS &&
                cudnnGetConvolutionForwardWorkspaceSize(h, d->im, d->w, d->conv, d->col, perf[i].algo, &size) ==
                    CUDNN_STATUS_SUCCESS;
      c[i].workspace = c[i].ok ? (int64_t)size : 0;
    }
  } else if (prim == PRIM_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d->w, d->col, d->conv, d->im,
                                                          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, perf));
    for (int i = 0; i < *n; i++) {
      c[i].algo = (int)perf[i].algo;
      c[i].ok = perf[i].status == CUDNN_STATUS_SUCCESS &&
                cudnnGetConvolutionBackwardDataWorkspaceSize(h, d->w, d->col, d->conv, d->im, perf[i].algo, &size) ==
                    CUDNN_STATUS_SUCCESS;
      c[i].workspace = c[i].ok ? (int64_t)size : 0;
    }
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d->im, d->col, d->conv, d->w,
                                                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, perf));
    for (int i = 0; i < *n; i++) {
      c[i].algo = (int)perf[i].algo;
      c[i].ok = perf[i].status == CUDNN_STATUS_SUCCESS &&
                cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d->im, d->col, d->conv, d->w, perf[i].algo, &size) ==
                    CUDNN_STATUS_SUCCESS;
      c[i].workspace = c[i].ok ? (int64_t)size : 0;
    }
  }
  return KG_OK;
}

/* one launch of a primitive with algorithm `algo` and `work` bytes of workspace at `wp` */
static cudnnStatus_t launch(cudnnHandle_t h, const conv_descs *d, int prim, kg_dtype dt, int algo, void *wp,
                            size_t work, void *im, void *col, void *w) {
  float f1 = 1, f0 = 0;
  double d1 = 1, d0 = 0;
  const void *one = dt == KG_F64 ? (const void *)&d1 : (const void *)&f1;
  const void *zero = dt == KG_F64 ? (const void *)&d0 : (const void *)&f0;
  if (prim == PRIM_FWD)
    return cudnnConvolutionForward(h, one, d->im, im, d->w, w, d->conv, (cudnnConvolutionFwdAlgo_t)algo, wp, work,
                                   zero, d->col, col);
  if (prim == PRIM_BWD_DATA)
    return cudnnConvolutionBackwardData(h, one, d->w, w, d->col, col, d->conv, (cudnnConvolutionBwdDataAlgo_t)algo, wp,
                                        work, zero, d->im, im);
  return cudnnConvolutionBackwardFilter(h, one, d->im, im, d->col, col, d->conv,
                                        (cudnnConvolutionBwdFilterAlgo_t)algo, wp, work, zero, d->w, w);
}

/* runs one primitive: im, col, w dense device buffers of dtype dt (the output one written).
 * The cached algorithm of the shape first; when there is none, or its workspace cannot be had,
 * or its launch fails, cuDNN's heuristic list under the workspace cap with the fallbacks of
 * conv_algo.h, and the one that ran becomes the shape's choice. */
static kg_status run_prim(const char *op, int prim, int dev, kg_dtype dt, const int64_t *ims, const int64_t *cols,
                          const int64_t *ws_, const kg_conv2d_params *p, void *im, void *col, void *w) {
  cudnnHandle_t h = NULL;
  KG_TRY(get_handle(dev, op, &h));
  conv_descs d;
  bool tf32 = dt == KG_F32 && kg_allow_tf32();
  kg_status s = make_descs(&d, op, dt, tf32, ims, cols, ws_, p);
  if (s) {
    destroy(&d);
    return s;
  }
  kg_conv_key key;
  memset(&key, 0, sizeof key);
  key.prim = prim, key.dev = dev, key.dt = dt, key.tf32 = tf32, key.groups = p->groups;
  for (int i = 0; i < 2; i++) key.pad[i] = p->padding[i], key.stride[i] = p->stride[i], key.dil[i] = p->dilation[i];
  for (int i = 0; i < 4; i++) key.im[i] = ims[i], key.col[i] = cols[i], key.w[i] = ws_[i];
  pthread_mutex_lock(&lock);
  kg_conv_entry *e = kg_conv_cache_find(&cache, &key);
  kg_conv_candidate cached = {e ? e->algo : -1, e ? e->workspace : 0, e != NULL};
  pthread_mutex_unlock(&lock);
  int64_t cap = KG_CONV_WORKSPACE_CAP;
  bool done = false;
  cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
  if (cached.ok) { /* the usual case: one allocation, one launch */
    kg_cuda_buf work;
    if (work.alloc((size_t)cached.workspace, dev, op) != KG_OK) cap = kg_conv_cap_after(&cached, cap, true);
    else if ((last = launch(h, &d, prim, dt, cached.algo, work.p, (size_t)cached.workspace, im, col, w)) ==
             CUDNN_STATUS_SUCCESS)
      done = true;
  }
  if (!done) {
    kg_conv_candidate c[16];
    int n = 0;
    s = candidates(op, h, &d, prim, c, &n);
    for (int i = s ? -1 : kg_conv_pick(c, n, 0, cap); i >= 0; i = kg_conv_pick(c, n, i + 1, cap)) {
      if (cached.ok && c[i].algo == cached.algo && c[i].workspace == cached.workspace) continue; /* failed above */
      kg_cuda_buf work;
      if (work.alloc((size_t)c[i].workspace, dev, op) != KG_OK) {
        cap = kg_conv_cap_after(&c[i], cap, true);
        continue;
      }
      last = launch(h, &d, prim, dt, c[i].algo, work.p, (size_t)c[i].workspace, im, col, w);
      if (last == CUDNN_STATUS_SUCCESS) {
        pthread_mutex_lock(&lock);
        kg_conv_cache_put(&cache, &key, c[i].algo, c[i].workspace);
        pthread_mutex_unlock(&lock);
        done = true;
        break;
      }
      cudaGetLastError();
      cap = kg_conv_cap_after(&c[i], cap, last == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED);
    }
    if (!s && !done)
      s = last != CUDNN_STATUS_SUCCESS
              ? kg_error(KG_ERR_DEVICE, op, "cuDNN convolution: %s", cudnnGetErrorString(last))
              : kg_error(KG_ERR_OOM, op, "no cuDNN algorithm for this convolution fits the free device memory");
  }
  destroy(&d);
  if (!s) s = kg_cuda_check(op, dev);
  return s;
}

/* an output written in dtype dt: the tensor itself when it is dense of dt, else a temporary */
static kg_status out_buf(kg_tensor **buf, kg_tensor *out, kg_dtype dt) {
  if (out->dtype == dt && kg_is_contiguous(out)) {
    *buf = kg_tensor_retain(out);
    return KG_OK;
  }
  return kg_tensor_empty(buf, out->ndim, out->shape, dt, out->device);
}
static kg_status out_flush(kg_tensor *buf, kg_tensor *out) {
  if (buf == out) return KG_OK;
  const kg_tensor *in = buf;
  return kg_op_dispatch(KG_OP_COPY, 1, &out, 1, &in, NULL);
}

/* in {x, w, b or NULL} -> out {y}; transposed: conv_transpose2d */
static kg_status conv_forward(const kg_op_call *c, bool transposed) {
  const char *op = kg_op_info[c->op].name;
  const kg_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
  kg_tensor *y = c->out[0];
  if (kg_numel(y) == 0) return KG_OK;
  kg_dtype dt = y->dtype;
  int dev = y->device.index;
  kg_tensor *xd = NULL, *wd = NULL, *yd = NULL;
  kg_status s = kg_cuda_dense(&xd, x, dt);
  if (!s) s = kg_cuda_dense(&wd, w, dt);
  if (!s) s = out_buf(&yd, y, dt);
  if (!s && kg_numel(x) == 0) { /* nothing to convolve: zeros (then the bias) */
    kg_cuda_ew_args a = {KG_EW_FILL, 0, 0, NAN, 0, 0, 0};
    s = kg_cuda_ew(op, a, yd, 0, NULL);
  } else if (!s) {
    const kg_conv2d_params *p = (const kg_conv2d_params *)c->params;
    if (transposed) s = run_prim(op, PRIM_BWD_DATA, dev, dt, y->shape, x->shape, w->shape, p, kg_data(yd), kg_data(xd), kg_data(wd));
    else s = run_prim(op, PRIM_FWD, dev, dt, x->shape, y->shape, w->shape, p, kg_data(xd), kg_data(yd), kg_data(wd));
  }
  if (!s && b) {
    int64_t n = kg_numel(y), P = y->shape[2] * y->shape[3];
    if (dt == KG_F64)
      bias_add_kernel<double><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
          (char *)kg_data(yd), dt, (const char *)kg_data(b), b->dtype, y->shape[1], P, n);
    else
      bias_add_kernel<float><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, kg_cuda_stream(dev)>>>(
          (char *)kg_data(yd), dt, (const char *)kg_data(b), b->dtype, y->shape[1], P, n);
    s = kg_cuda_check(op, dev);
  }
  if (!s) s = out_flush(yd, y);
  kg_tensor_release(xd), kg_tensor_release(wd), kg_tensor_release(yd);
  return s;
}

/* in {dy, x, w} -> out: the wanted ones of {dx, dw, db} */
static kg_status conv_backward(const kg_op_call *c, bool transposed) {
  const char *op = kg_op_info[c->op].name;
  const kg_conv_backward_params *bp = (const kg_conv_backward_params *)c->params;
  const kg_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
  kg_tensor *dx = NULL, *dw = NULL, *db = NULL;
  int k = 0;
  if (bp->need[0]) dx = c->out[k++];
  if (bp->need[1]) dw = c->out[k++];
  if (bp->need[2]) db = c->out[k++];
  kg_dtype dt = dy->dtype;
  if (x->dtype != dt || w->dtype != dt) dt = kg_dtype_promote(kg_dtype_promote(dy->dtype, x->dtype), w->dtype);
  int dev = dy->device.index;
  /* the image side is x for conv2d, dy for conv_transpose2d */
  const kg_tensor *im = transposed ? dy : x, *col = transposed ? x : dy;
  kg_tensor *dyd = NULL, *xd = NULL, *wd = NULL, *o = NULL;
  kg_status s = KG_OK;
  if (db) s = bias_grad(op, dy, db);
  bool empty = kg_numel(dy) == 0 || kg_numel(x) == 0;
  if (!s && (dx || dw)) s = kg_cuda_dense(&dyd, dy, dt);
  if (!s && dw) s = kg_cuda_dense(&xd, x, dt);
  if (!s && dx) s = kg_cuda_dense(&wd, w, dt);
  if (!s && dx && kg_numel(dx)) {
    s = out_buf(&o, dx, dt);
    if (!s && empty) {
      kg_cuda_ew_args a = {KG_EW_FILL, 0, 0, NAN, 0, 0, 0};
      s = kg_cuda_ew(op, a, o, 0, NULL);
    } else if (!s && transposed) { /* dx (column side) = Forward(im = dy) */
      s = run_prim(op, PRIM_FWD, dev, dt, im->shape, col->shape, w->shape, &bp->p, kg_data(dyd), kg_data(o), kg_data(wd));
    } else if (!s) { /* dx (image side) = BackwardData(col = dy) */
      s = run_prim(op, PRIM_BWD_DATA, dev, dt, im->shape, col->shape, w->shape, &bp->p, kg_data(o), kg_data(dyd), kg_data(wd));
    }
    if (!s) s = out_flush(o, dx);
    kg_tensor_release(o), o = NULL;
  }
  if (!s && dw && kg_numel(dw)) {
    s = out_buf(&o, dw, dt);
    if (!s && empty) {
      kg_cuda_ew_args a = {KG_EW_FILL, 0, 0, NAN, 0, 0, 0};
      s = kg_cuda_ew(op, a, o, 0, NULL);
    } else if (!s) {
      void *imb = transposed ? kg_data(dyd) : kg_data(xd), *colb = transposed ? kg_data(xd) : kg_data(dyd);
      s = run_prim(op, PRIM_BWD_FILTER, dev, dt, im->shape, col->shape, w->shape, &bp->p, imb, colb, kg_data(o));
    }
    if (!s) s = out_flush(o, dw);
    kg_tensor_release(o), o = NULL;
  }
  kg_tensor_release(dyd), kg_tensor_release(xd), kg_tensor_release(wd);
  return s;
}

#else /* built without cuDNN */

static kg_status no_cudnn(const kg_op_call *c) {
  return kg_error(KG_ERR_DEVICE, kg_op_info[c->op].name, "this build has no cuDNN (CMake did not find libcudnn)");
}
static kg_status conv_forward(const kg_op_call *c, bool transposed) { return no_cudnn(c); }
static kg_status conv_backward(const kg_op_call *c, bool transposed) { return no_cudnn(c); }

#endif

extern "C" kg_status kg_cuda_conv2d(const kg_op_call *c) { return conv_forward(c, false); }
extern "C" kg_status kg_cuda_conv_transpose2d(const kg_op_call *c) { return conv_forward(c, true); }
extern "C" kg_status kg_cuda_conv2d_backward(const kg_op_call *c) { return conv_backward(c, false); }
extern "C" kg_status kg_cuda_conv_transpose2d_backward(const kg_op_call *c) { return conv_backward(c, true); }
