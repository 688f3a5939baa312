/* conv.c (cpu) — conv2d and conv_transpose2d (NCHW) by im2col + GEMM, their backward passes,
 * and nearest-neighbour resizing.
 *
 * Shape letters: B batch, C channels, H/W image height and width, G groups.
 * Every conv is three primitives over one geometry: an "image" side [B, G*C, H, W] and a
 * "column" side [B, G*M, Ho, Wo] linked by a kernel w [G*M, C, kh, kw] (K = C*kh*kw):
 *   fwd          col[b,g]  = w[g] @ im2col(im[b,g])            (conv2d forward)
 *   bwd_data     im[b,g]   = col2im(w[g]ᵀ @ col[b,g])          (conv2d dx, conv_transpose forward)
 *   bwd_weight   dw[g]     = Σ_b col[b,g] @ im2col(im[b,g])ᵀ   (dw of both)
 * conv2d has x on the image side and y on the column side; conv_transpose2d the reverse.
 * Operands are loaded (any strides, any float dtype) into contiguous f32 buffers, or f64 when
 * an operand is f64; GEMMs go to OpenBLAS (sgemm / dgemm). The reference is the nested-loop
 * convolution in tests/lua/conv_spec.lua. */
#include "cpu.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t B, G;
  int64_t C, H, W;  /* image side, per group */
  int64_t M, Ho, Wo; /* column side, per group */
  int kh, kw, sh, sw, ph, pw, dh, dw;
} geom;

static geom make_geom(const kg_tensor *im, const kg_tensor *col, const kg_tensor *w, const kg_conv2d_params *p) {
  int64_t G = p->groups;
  return (geom){im->shape[0], G, im->shape[1] / G, im->shape[2], im->shape[3], col->shape[1] / G, col->shape[2],
                col->shape[3], (int)w->shape[2], (int)w->shape[3], p->stride[0], p->stride[1], p->padding[0],
                p->padding[1], p->dilation[0], p->dilation[1]};
}

/* a 1x1 kernel with unit stride and no padding: im2col is the identity */
static bool pointwise(const geom *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* ---- buffers ------------------------------------------------------------------------------ */

/* t (any strides, any dtype) as a new contiguous f32 or f64 buffer */
static void *load_all(const kg_tensor *t, bool wide) {
  int64_t n = kg_numel(t), es = wide ? 8 : 4;
  void *buf = malloc((size_t)(n > 0 ? n : 1) * (size_t)es);
  if (!buf || n == 0) return buf;
  int nd = t->ndim;
  int64_t len = t->shape[nd - 1], rows = n / len, ls = t->stride[nd - 1];
  const char *base = kg_data(t);
  int tes = kg_dtype_info[t->dtype].size;
#pragma omp parallel for if (n > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t rem = r, off = 0;
    for (int d = nd - 2; d >= 0; d--) {
      off += rem % t->shape[d] * t->stride[d];
      rem /= t->shape[d];
    }
    if (wide) kg_cpu_load_f64((double *)buf + r * len, base + off * tes, t->dtype, ls, len);
    else kg_cpu_load_f32((float *)buf + r * len, base + off * tes, t->dtype, ls, len);
  }
  return buf;
}

/* where to compute a (contiguous, freshly allocated) output: in place when it has the compute type */
static void *out_buf(kg_tensor *t, bool wide) {
  int64_t n = kg_numel(t);
  if (n > 0 && t->dtype == (wide ? KG_F64 : KG_F32)) return kg_data(t);
  return malloc((size_t)(n > 0 ? n : 1) * (wide ? 8 : 4));
}

static void out_flush(kg_tensor *t, void *buf, bool wide) {
  if (buf == kg_data(t)) return;
  if (wide) kg_cpu_store_f64(kg_data(t), t->dtype, 1, buf, kg_numel(t));
  else kg_cpu_store_f32(kg_data(t), t->dtype, 1, buf, kg_numel(t));
  free(buf);
}

#define AT(p, i) ((char *)(p) + (int64_t)(i) * es)

/* ---- im2col / col2im, one per compute type ------------------------------------------------ */

/* col: [C*kh*kw, Ho*Wo] <- im: [C, H, W] (zero outside the image) */
#define DEFINE_IM2COL(T, sfx)                                                                   \
  static void im2col_##sfx(const geom *g, const T *im, T *col) {                                \
    int64_t P = g->Ho * g->Wo, rows = g->C * g->kh * g->kw;                                     \
    _Pragma("omp parallel for if (rows * P > KG_PAR_THRESHOLD) schedule(static)")              \
    for (int64_t r = 0; r < rows; r++) {                                                        \
      int64_t c = r / (g->kh * g->kw), ki = r / g->kw % g->kh, kj = r % g->kw;                  \
      const T *src = im + c * g->H * g->W;                                                      \
      T *dst = col + r * P;                                                                     \
      for (int64_t oh = 0; oh < g->Ho; oh++) {                                                  \
        int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                           \
        for (int64_t ow = 0; ow < g->Wo; ow++) {                                                \
          int64_t iw = ow * g->sw - g->pw + kj * g->dw;                                         \
          dst[oh * g->Wo + ow] =                                                                \
              (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W) ? src[ih * g->W + iw] : (T)0;     \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  }                                                                                             \
  /* im: [C, H, W] = sum of col's entries over the pixels they were taken from */              \
  static void col2im_##sfx(const geom *g, const T *col, T *im) {                                \
    int64_t P = g->Ho * g->Wo, kk = (int64_t)g->kh * g->kw;                                    \
    _Pragma("omp parallel for if (g->C * kk * P > KG_PAR_THRESHOLD) schedule(static)")         \
    for (int64_t c = 0; c < g->C; c++) {                                                        \
      T *dst = im + c * g->H * g->W;                                                            \
      memset(dst, 0, sizeof(T) * (size_t)(g->H * g->W));                                       \
      for (int64_t k = 0; k < kk; k++) {                                                        \
        int64_t ki = k / g->kw, kj = k % g->kw;                                                 \
        const T *src = col + (c * kk + k) * P;                                                  \
        for (int64_t oh = 0; oh < g->Ho; oh++) {                                                \
          int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                         \
          if (ih < 0 || ih >= g->H) continue;                                                   \
          for (int64_t ow = 0; ow < g->Wo; ow++) {                                              \
            int64_t iw = ow * g->sw - g->pw + kj * g->dw;                                       \
            if (iw >= 0 && iw < g->W) dst[ih * g->W + iw] += src[oh * g->Wo + ow];              \
          }                                                                                     \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  }
DEFINE_IM2COL(float, f32)
DEFINE_IM2COL(double, f64)

static void im2col(const geom *g, bool wide, const void *im, void *col) {
  if (wide) im2col_f64(g, im, col);
  else im2col_f32(g, im, col);
}
static void col2im(const geom *g, bool wide, const void *col, void *im) {
  if (wide) col2im_f64(g, col, im);
  else col2im_f32(g, col, im);
}

/* C[M, N] = A[M, K] @ B[K, N] + beta C, row-major, contiguous; ta / tb: the operand is stored
 * transposed ([K, M] / [N, K]) */
static void gemm(bool wide, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                 double beta, void *C) {
  if (M == 0 || N == 0) return;
  if (K == 0) { /* BLAS leaves C alone only for beta = 1 */
    if (beta == 0) memset(C, 0, (size_t)(M * N) * (wide ? 8 : 4));
    return;
  }
  int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (wide) cblas_dgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0, A, lda, B, ldb, beta, C, (int)N);
  else cblas_sgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0f, A, lda, B, ldb, (float)beta, C, (int)N);
  kg_flop_add((uint64_t)(2 * M * N * K));
}

/* ---- the three primitives (buffers contiguous, in the compute type) --------------------------- */

static int64_t kdim(const geom *g) { return g->C * g->kh * g->kw; }

static kg_status conv_fwd(const geom *g, bool wide, const void *im, const void *w, void *col) {
  int es = wide ? 8 : 4;
  int64_t K = kdim(g), P = g->Ho * g->Wo, imsz = g->C * g->H * g->W;
  void *ws = pointwise(g) ? NULL : malloc((size_t)(K * P > 0 ? K * P : 1) * (size_t)es);
  if (!pointwise(g) && !ws) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the im2col buffer");
  for (int64_t b = 0; b < g->B && !kg_interrupt_pending(); b++)
    for (int64_t gi = 0; gi < g->G; gi++) {
      const void *src = AT(im, (b * g->G + gi) * imsz), *cols = src;
      if (ws) im2col(g, wide, src, ws), cols = ws;
      gemm(wide, false, false, g->M, P, K, AT(w, gi * g->M * K), cols, 0, AT(col, (b * g->G + gi) * g->M * P));
    }
  free(ws);
  return KG_OK;
}

static kg_status conv_bwd_data(const geom *g, bool wide, const void *col, const void *w, void *im) {
  int es = wide ? 8 : 4;
  int64_t K = kdim(g), P = g->Ho * g->Wo, imsz = g->C * g->H * g->W;
  void *ws = pointwise(g) ? NULL : malloc((size_t)(K * P > 0 ? K * P : 1) * (size_t)es);
  if (!pointwise(g) && !ws) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the col2im buffer");
  for (int64_t b = 0; b < g->B && !kg_interrupt_pending(); b++)
    for (int64_t gi = 0; gi < g->G; gi++) {
      void *dst = AT(im, (b * g->G + gi) * imsz);
      gemm(wide, true, false, K, P, g->M, AT(w, gi * g->M * K), AT(col, (b * g->G + gi) * g->M * P), 0,
           ws ? ws : dst);
      if (ws) col2im(g, wide, ws, dst);
    }
  free(ws);
  return KG_OK;
}

static kg_status conv_bwd_weight(const geom *g, bool wide, const void *im, const void *col, void *dw) {
  int es = wide ? 8 : 4;
  int64_t K = kdim(g), P = g->Ho * g->Wo, imsz = g->C * g->H * g->W;
  memset(dw, 0, (size_t)(g->G * g->M * K) * (size_t)es);
  void *ws = pointwise(g) ? NULL : malloc((size_t)(K * P > 0 ? K * P : 1) * (size_t)es);
  if (!pointwise(g) && !ws) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the im2col buffer");
  for (int64_t b = 0; b < g->B && !kg_interrupt_pending(); b++)
    for (int64_t gi = 0; gi < g->G; gi++) {
      const void *src = AT(im, (b * g->G + gi) * imsz), *cols = src;
      if (ws) im2col(g, wide, src, ws), cols = ws;
      gemm(wide, false, true, g->M, K, P, AT(col, (b * g->G + gi) * g->M * P), cols, 1, AT(dw, gi * g->M * K));
    }
  free(ws);
  return KG_OK;
}

/* y: [B, C, P] += bias[C] */
static void add_bias(bool wide, void *y, const void *bias, int64_t B, int64_t C, int64_t P) {
#pragma omp parallel for if (B * C * P > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t r = 0; r < B * C; r++) {
    if (wide) {
      double *row = (double *)y + r * P, v = ((const double *)bias)[r % C];
      for (int64_t i = 0; i < P; i++) row[i] += v;
    } else {
      float *row = (float *)y + r * P, v = ((const float *)bias)[r % C];
      for (int64_t i = 0; i < P; i++) row[i] += v;
    }
  }
}

/* db[C] = Σ_{b, p} dy[b, C, p], accumulated in double */
static void bias_grad(bool wide, const void *dy, void *db, int64_t B, int64_t C, int64_t P) {
#pragma omp parallel for if (B * C * P > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t c = 0; c < C; c++) {
    double s = 0;
    for (int64_t b = 0; b < B; b++) {
      int64_t o = (b * C + c) * P;
      if (wide) for (int64_t i = 0; i < P; i++) s += ((const double *)dy)[o + i];
      else for (int64_t i = 0; i < P; i++) s += ((const float *)dy)[o + i];
    }
    if (wide) ((double *)db)[c] = s;
    else ((float *)db)[c] = (float)s;
  }
}

/* ---- kernels ---------------------------------------------------------------------------------- */

/* in {x, w, b or NULL} -> out {y}; transposed: conv_transpose2d */
static kg_status conv_forward(const kg_op_call *c, bool transposed) {
  const kg_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
  kg_tensor *y = c->out[0];
  bool wide = y->dtype == KG_F64;
  geom g = transposed ? make_geom(y, x, w, c->params) : make_geom(x, y, w, c->params);
  void *xb = load_all(x, wide), *wb = load_all(w, wide), *yb = out_buf(y, wide), *bb = b ? load_all(b, wide) : NULL;
  kg_status s = KG_OK;
  if (!xb || !wb || !yb || (b && !bb)) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for buffers");
  else s = transposed ? conv_bwd_data(&g, wide, xb, wb, yb) : conv_fwd(&g, wide, xb, wb, yb);
  if (s == KG_OK && bb) add_bias(wide, yb, bb, y->shape[0], y->shape[1], y->shape[2] * y->shape[3]);
  if (yb) out_flush(y, yb, wide);
  free(xb), free(wb), free(bb);
  return s;
}

kg_status kg_cpu_conv2d(const kg_op_call *c) { return conv_forward(c, false); }
kg_status kg_cpu_conv_transpose2d(const kg_op_call *c) { return conv_forward(c, true); }

/* in {dy, x, w} -> out: the wanted ones of {dx, dw, db} (params kg_conv_backward_params) */
static kg_status conv_backward(const kg_op_call *c, bool transposed) {
  const kg_conv_backward_params *bp = c->params;
  const kg_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
  kg_tensor *dx = NULL, *dw = NULL, *db = NULL;
  int k = 0;
  if (bp->need[0]) dx = c->out[k++];
  if (bp->need[1]) dw = c->out[k++];
  if (bp->need[2]) db = c->out[k++];
  bool wide = dy->dtype == KG_F64 || x->dtype == KG_F64 || w->dtype == KG_F64;
  /* the image side is x for conv2d, dy for conv_transpose2d */
  const kg_tensor *im = transposed ? dy : x, *col = transposed ? x : dy;
  geom g = make_geom(im, col, w, &bp->p);
  void *dyb = load_all(dy, wide), *xb = dw ? load_all(x, wide) : NULL, *wb = dx ? load_all(w, wide) : NULL;
  kg_status s = KG_OK;
  if (!dyb || (dw && !xb) || (dx && !wb)) {
    s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for buffers");
    goto done;
  }
  const void *imb = transposed ? dyb : xb, *colb = transposed ? xb : dyb;
  if (dx) {
    void *o = out_buf(dx, wide);
    if (!o) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for dx");
    else s = transposed ? conv_fwd(&g, wide, dyb, wb, o) : conv_bwd_data(&g, wide, dyb, wb, o);
    if (o) out_flush(dx, o, wide);
  }
  if (dw && s == KG_OK) {
    void *o = out_buf(dw, wide);
    if (!o) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for dw");
    else s = conv_bwd_weight(&g, wide, imb, colb, o);
    if (o) out_flush(dw, o, wide);
  }
  if (db && s == KG_OK) {
    void *o = out_buf(db, wide);
    if (!o) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for db");
    else bias_grad(wide, dyb, o, dy->shape[0], dy->shape[1], dy->shape[2] * dy->shape[3]);
    if (o) out_flush(db, o, wide);
  }
done:
  free(dyb), free(xb), free(wb);
  return s;
}

kg_status kg_cpu_conv2d_backward(const kg_op_call *c) { return conv_backward(c, false); }
kg_status kg_cpu_conv_transpose2d_backward(const kg_op_call *c) { return conv_backward(c, true); }

/* ---- nearest-neighbour resize ------------------------------------------------------------------ */

/* src index of each destination index: floor(dst * in / out), as PyTorch's "nearest" */
static int64_t *nearest_map(int64_t in, int64_t out) {
  int64_t *m = malloc((size_t)(out > 0 ? out : 1) * sizeof *m);
  if (m)
    for (int64_t i = 0; i < out; i++) m[i] = i * in / out;
  return m;
}

/* in {x: [B, C, H, W]} -> out {y: [B, C, Ho, Wo]}; a copy, so done in double for every dtype */
kg_status kg_cpu_interpolate(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3], Ho = y->shape[2], Wo = y->shape[3];
  int64_t *mh = nearest_map(H, Ho), *mw = nearest_map(W, Wo);
  kg_status s = KG_OK;
  if (!mh || !mw) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory");
  const char *xb = kg_data(x);
  char *yb = kg_data(y);
  int xes = kg_dtype_info[x->dtype].size, yes = kg_dtype_info[y->dtype].size;
  int64_t rows = s == KG_OK ? y->shape[0] * C * Ho : 0;
  int oom = 0;
#pragma omp parallel if (rows * Wo > KG_PAR_THRESHOLD)
  {
    double *in = malloc((size_t)(W + Wo) * sizeof(double)), *out = in ? in + W : NULL;
    if (!in) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      if (!in) continue;
      int64_t oh = r % Ho, bc = r / Ho, b = bc / C, ch = bc % C;
      const char *src = xb + (b * x->stride[0] + ch * x->stride[1] + mh[oh] * x->stride[2]) * xes;
      kg_cpu_load_f64(in, src, x->dtype, x->stride[3], W);
      for (int64_t j = 0; j < Wo; j++) out[j] = in[mw[j]];
      kg_cpu_store_f64(yb + r * Wo * yes, y->dtype, 1, out, Wo);
    }
    free(in);
  }
  free(mh), free(mw);
  if (oom) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory for row buffers");
  return s;
}

/* in {dy: [B, C, Ho, Wo]} -> out {dx: [B, C, H, W]}: each source pixel sums the gradients of
 * the destination pixels that copied it */
kg_status kg_cpu_interpolate_backward(const kg_op_call *c) {
  const kg_tensor *dy = c->in[0];
  kg_tensor *dx = c->out[0];
  int64_t C = dx->shape[1], H = dx->shape[2], W = dx->shape[3], Ho = dy->shape[2], Wo = dy->shape[3];
  int64_t *mh = nearest_map(H, Ho), *mw = nearest_map(W, Wo);
  kg_status s = KG_OK;
  if (!mh || !mw) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory");
  const char *gb = kg_data(dy);
  char *xb = kg_data(dx);
  int ges = kg_dtype_info[dy->dtype].size, xes = kg_dtype_info[dx->dtype].size;
  int64_t planes = s == KG_OK ? dx->shape[0] * C : 0;
  int oom = 0;
#pragma omp parallel if (planes * Ho * Wo > KG_PAR_THRESHOLD)
  {
    double *acc = malloc((size_t)(H * W + Wo) * sizeof(double)), *row = acc ? acc + H * W : NULL;
    if (!acc) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t pl = 0; pl < planes; pl++) {
      if (!acc) continue;
      int64_t b = pl / C, ch = pl % C;
      memset(acc, 0, (size_t)(H * W) * sizeof(double));
      for (int64_t oh = 0; oh < Ho; oh++) {
        const char *src = gb + (b * dy->stride[0] + ch * dy->stride[1] + oh * dy->stride[2]) * ges;
        kg_cpu_load_f64(row, src, dy->dtype, dy->stride[3], Wo);
        double *dst = acc + mh[oh] * W;
        for (int64_t j = 0; j < Wo; j++) dst[mw[j]] += row[j];
      }
      kg_cpu_store_f64(xb + pl * H * W * xes, dx->dtype, 1, acc, H * W);
    }
    free(acc);
  }
  free(mh), free(mw);
  if (oom) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory for plane buffers");
  return s;
}
