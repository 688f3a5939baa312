/* conv.c (cpu) — conv2d and conv_transpose2d (NCHW) by im2col + GEMM, their backward passes,
 * and interpolate (nearest, bilinear, bicubic, antialias).
 *
 * Shape letters: B batch, C channels, H/W image height and width, G groups.
 * Every conv is three primitives over one geometry: an "image" side [B, G*C, H, W] and a
 * "column" side [B, G*M, Ho, Wo] linked by a kernel w [G*M, C, kh, kw] (K = C*kh*kw, P = Ho*Wo):
 *   fwd          col[b,g]  = w[g] @ im2col(im[b,g])            (conv2d forward)
 *   bwd_data     im[b,g]   = col2im(w[g]ᵀ @ col[b,g])          (conv2d dx, conv_transpose forward)
 *   bwd_weight   dw[g]     = Σ_b col[b,g] @ im2col(im[b,g])ᵀ   (dw of both)
 * conv2d has x on the image side and y on the column side; conv_transpose2d the reverse.
 * fwd and bwd_weight run tile by tile over the output pixels (CONV_TILE columns of one image,
 * or several small images side by side), tiles in parallel, so each im2col block is still in
 * cache when its GEMM reads it. bwd_data at stride 1 is fwd with the flipped kernel; strided,
 * it is one GEMM per chunk of images followed by col2im. A 1x1 kernel with unit stride and no
 * padding skips im2col when a tile lies in one image (the image is the column matrix).
 * Operands that are contiguous and in the compute type are used in place; others are loaded
 * (any strides, any float dtype) into contiguous f32 buffers, or f64 when an operand is f64.
 * Every buffer comes from the CPU pool (kg_cpu_alloc). GEMMs go to OpenBLAS (sgemm / dgemm).
 * Batches of small f32 images (<= 256 output pixels, >= 4 images, >= 16 channels in and out)
 * skip im2col and the GEMM: fwd (so also the stride-1 data gradient) and bwd_weight run a
 * direct AVX-512 or AVX2+FMA kernel (runtime-checked; KENG_CONV_DIRECT caps it, 0 = off) that
 * skips padding taps; see "direct kernel for small images" below. f32 1x1 convs (unit stride,
 * no padding) on images of fewer than CONV_TILE pixels run on an AVX-512 kernel of their own
 * (KENG_CONV_POINTWISE=0 off): "pointwise convs on small images" below.
 * f32 3x3 convs with stride 1, dilation 1 and one group go first to Winograd F(4x4, 3x3)
 * (conv_winograd.c: 36 instead of 144 multiplies per 16 outputs and channel pair) where its
 * measured rule picks it (>= 8 input and >= 16 output channels, >= 64 output pixels per image,
 * most of the 4x4 tiles inside the image); that covers fwd and the stride-1 data gradient
 * (KENG_CONV_WINOGRAD=0 off, =1 / =2 caps the ISA of its GEMM kernel), and bwd_weight by the
 * transposed algorithm (36 GEMMs reducing over the tiles) under the same rule for images of
 * 64+ output pixels (KENG_CONV_WINOGRAD_DW=0 leaves dw alone to the other paths).
 * The reference is the nested-loop convolution in tests/lua/conv_spec.lua; figures in
 * docs/kernels.md ("Convolution and elementwise", "Winograd convolution"). */
#include "conv_winograd.h"
#include "cpu.h"
#include "../ops/interp.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* GEMM columns per tile (see "tiles" below) */
#define CONV_TILE 256
/* the strided data gradient (GEMM + col2im): batch elements of small images fold into one
 * GEMM of about CONV_COLS columns */
#define CONV_COLS 4096
/* flops below which the tiles of one conv run on one thread */
#define CONV_PAR_FLOPS ((int64_t)2 << 20)
/* bytes of im2col buffer per chunk at most (a chunk is never smaller than one element) */
#define CONV_SCRATCH ((int64_t)32 << 20)

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

static int64_t kdim(const geom *g) { return g->C * g->kh * g->kw; }
static int64_t npix(const geom *g) { return g->Ho * g->Wo; }
static int64_t imsize(const geom *g) { return g->C * g->H * g->W; }

/* batch elements per chunk */
static int64_t chunk_of(const geom *g, int es) {
  int64_t P = npix(g), per = kdim(g) * P * es;
  int64_t nb = P >= CONV_COLS ? 1 : (CONV_COLS + P - 1) / P;
  int64_t cap = per > 0 ? CONV_SCRATCH / per : nb;
  if (nb > cap) nb = cap;
  if (nb > g->B) nb = g->B;
  return nb < 1 ? 1 : nb;
}

/* ---- buffers (CPU pool) ------------------------------------------------------------------- */

typedef struct {
  void *p;
  size_t bytes;
} scratch;

static void *scratch_get(scratch *s, int64_t n, int es) {
  s->p = kg_cpu_alloc((size_t)(n > 0 ? n : 1) * (size_t)es, &s->bytes);
  return s->p;
}

static void scratch_free(scratch *s) {
  if (s->p) kg_cpu_free(s->p, s->bytes);
  s->p = NULL;
}

/* t in the compute type, contiguous: t's own memory when it already is, else a converted copy
 * in s; NULL when out of memory */
static const void *load_all(const kg_tensor *t, bool wide, scratch *s) {
  s->p = NULL;
  if (t->dtype == (wide ? KG_F64 : KG_F32) && kg_is_contiguous(t)) return kg_data(t);
  int64_t n = kg_numel(t);
  void *buf = scratch_get(s, n, wide ? 8 : 4);
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
static void *out_buf(kg_tensor *t, bool wide, scratch *s) {
  s->p = NULL;
  if (kg_numel(t) > 0 && t->dtype == (wide ? KG_F64 : KG_F32)) return kg_data(t);
  return scratch_get(s, kg_numel(t), wide ? 8 : 4);
}

static void out_flush(kg_tensor *t, void *buf, bool wide, scratch *s) {
  if (buf == kg_data(t)) return;
  if (wide) kg_cpu_store_f64(kg_data(t), t->dtype, 1, buf, kg_numel(t));
  else kg_cpu_store_f32(kg_data(t), t->dtype, 1, buf, kg_numel(t));
  scratch_free(s);
}

#define AT(p, i) ((char *)(p) + (int64_t)(i) * es)

/* ---- col2im, one per compute type ------------------------------------------------ */

/* output columns ow in [*lo, *hi) read inside the image along one axis: 0 <= ow*s + off < n */
static void valid_range(int64_t off, int s, int64_t n, int64_t out, int64_t *lo, int64_t *hi) {
  int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
  int64_t b = n - off > 0 ? (n - off + s - 1) / s : 0;
  if (a > out) a = out;
  if (b > out) b = out;
  *lo = a;
  *hi = b > a ? b : a;
}

#define DEFINE_COL2IM(T, sfx)                                                                   \
  /* im: [C, H, W] = sum of col's entries (row stride ld) over the pixels they were taken from */ \
  static void col2im_##sfx(const geom *g, const T *col, int64_t ld, T *im) {                    \
    int64_t P = npix(g), kk = (int64_t)g->kh * g->kw;                                          \
    _Pragma("omp parallel for if (g->C * kk * P > KG_PAR_THRESHOLD) schedule(static)")         \
    for (int64_t c = 0; c < g->C; c++) {                                                        \
      T *dst = im + c * g->H * g->W;                                                            \
      memset(dst, 0, sizeof(T) * (size_t)(g->H * g->W));                                       \
      for (int64_t k = 0; k < kk; k++) {                                                        \
        int64_t ki = k / g->kw, kj = k % g->kw, off = kj * g->dw - g->pw, lo, hi;               \
        valid_range(off, g->sw, g->W, g->Wo, &lo, &hi);                                         \
        const T *src = col + (c * kk + k) * ld;                                                 \
        for (int64_t oh = 0; oh < g->Ho; oh++) {                                                \
          int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                         \
          if (ih < 0 || ih >= g->H) continue;                                                   \
          T *d = dst + ih * g->W + off;                                                         \
          const T *s = src + oh * g->Wo;                                                        \
          if (g->sw == 1) for (int64_t ow = lo; ow < hi; ow++) d[ow] += s[ow];                  \
          else for (int64_t ow = lo; ow < hi; ow++) d[ow * g->sw] += s[ow];                     \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  }
DEFINE_COL2IM(float, f32)
DEFINE_COL2IM(double, f64)

static void col2im(const geom *g, bool wide, const void *col, int64_t ld, void *im) {
  if (wide) col2im_f64(g, col, ld, im);
  else col2im_f32(g, col, ld, im);
}

/* rows of n elements: dst[r * dld + i] = src[r * sld + i] (+ bias[r] when given) */
static void copy_rows(bool wide, void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows, int64_t n,
                      const void *bias) {
#pragma omp parallel for if (rows * n > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    if (wide) {
      double *d = (double *)dst + r * dld, v = bias ? ((const double *)bias)[r] : 0;
      const double *s = (const double *)src + r * sld;
      for (int64_t i = 0; i < n; i++) d[i] = s[i] + v;
    } else {
      float *d = (float *)dst + r * dld, v = bias ? ((const float *)bias)[r] : 0;
      const float *s = (const float *)src + r * sld;
      for (int64_t i = 0; i < n; i++) d[i] = s[i] + v;
    }
  }
}

/* rows of n elements: dst[r * ld + i] = v[r] */
static void fill_rows(bool wide, void *dst, int64_t ld, int64_t rows, int64_t n, const void *v) {
#pragma omp parallel for if (rows * n > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    if (wide) {
      double *d = (double *)dst + r * ld, x = ((const double *)v)[r];
      for (int64_t i = 0; i < n; i++) d[i] = x;
    } else {
      float *d = (float *)dst + r * ld, x = ((const float *)v)[r];
      for (int64_t i = 0; i < n; i++) d[i] = x;
    }
  }
}

/* dst[i] += src[i] */
static void add_into(bool wide, void *dst, const void *src, int64_t n) {
  if (wide)
    for (int64_t i = 0; i < n; i++) ((double *)dst)[i] += ((const double *)src)[i];
  else
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] += ((const float *)src)[i];
}

/* C[M, N] = A[M, K] @ B[K, N] + beta C, row-major with leading dims; ta / tb: the operand is
 * stored transposed ([K, M] / [N, K]) */
static void gemm(bool wide, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                 const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) { /* BLAS leaves C alone only for beta = 1 */
    if (beta == 0)
      for (int64_t r = 0; r < M; r++) memset((char *)C + r * ldc * (wide ? 8 : 4), 0, (size_t)N * (wide ? 8 : 4));
    return;
  }
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (wide)
    cblas_dgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, (float)beta, C,
                (int)ldc);
  kg_flop_add((uint64_t)(2 * M * N * K));
}

/* ---- the three primitives (buffers contiguous, in the compute type) --------------------------- */

/* A tile is the GEMM's column range: CONV_TILE output pixels of one image, or, when an image
 * has fewer pixels, nb whole images side by side. Its im2col block [K, tile] stays in L2/L3
 * while the GEMM reads it: at [8,32,128,128] 3x3 one sgemm over the whole image ran at 31-36
 * GFLOP/s, over 256-column tiles at 66-80 (docs/kernels.md). Tiles run in parallel, each with
 * a single-threaded GEMM (OpenBLAS's OpenMP build does not nest). */
typedef struct {
  int64_t b0, nb, p0, np; /* images b0 .. b0+nb-1, pixels p0 .. p0+np-1 of each */
} tile;

typedef struct {
  int64_t per_img, imgs, count; /* tiles per image (large images) or images per tile (small) */
} tiling;

static tiling make_tiling(const geom *g) {
  int64_t P = npix(g);
  if (P >= CONV_TILE) return (tiling){(P + CONV_TILE - 1) / CONV_TILE, 1, g->B * ((P + CONV_TILE - 1) / CONV_TILE)};
  int64_t imgs = P > 0 ? CONV_TILE / P : 1;
  if (imgs < 1) imgs = 1;
  if (imgs > g->B) imgs = g->B;
  return (tiling){1, imgs, (g->B + imgs - 1) / imgs};
}

static tile tile_at(const geom *g, const tiling *tl, int64_t t) {
  int64_t P = npix(g);
  if (tl->per_img > 1 || tl->imgs == 1) {
    int64_t p0 = t % tl->per_img * CONV_TILE;
    return (tile){t / tl->per_img, 1, p0, P - p0 < CONV_TILE ? P - p0 : CONV_TILE};
  }
  int64_t b0 = t * tl->imgs;
  return (tile){b0, g->B - b0 < tl->imgs ? g->B - b0 : tl->imgs, 0, P};
}

/* run tiles in parallel only when there is enough work to share */
static bool tiles_parallel(const geom *g, const tiling *tl) {
  return tl->count > 1 && 2 * g->B * g->G * g->M * npix(g) * kdim(g) > CONV_PAR_FLOPS;
}

/* col block [C*kh*kw, np] (row stride ld) of pixels p0 .. p0+np-1 of im [C, H, W], zero outside
 * the image; the in-image span of each output row is found once, then copied */
#define DEFINE_IM2COL_RANGE(T, sfx)                                                              \
  static void im2col_range_##sfx(const geom *g, const T *im, T *col, int64_t ld, int64_t p0, int64_t np) { \
    int64_t rows = kdim(g), Wo = g->Wo;                                                          \
    for (int64_t r = 0; r < rows; r++) {                                                         \
      int64_t c = r / (g->kh * g->kw), ki = r / g->kw % g->kh, kj = r % g->kw;                   \
      int64_t off = kj * g->dw - g->pw, lo, hi;                                                  \
      valid_range(off, g->sw, g->W, Wo, &lo, &hi);                                               \
      const T *src = im + c * g->H * g->W;                                                       \
      for (int64_t oh = p0 / Wo; oh * Wo < p0 + np; oh++) {                                      \
        int64_t a = p0 - oh * Wo > 0 ? p0 - oh * Wo : 0, e = p0 + np - oh * Wo < Wo ? p0 + np - oh * Wo : Wo; \
        T *d = col + r * ld + oh * Wo - p0; /* d[ow]: pixel (oh, ow) */                          \
        int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                            \
        if (ih < 0 || ih >= g->H) {                                                              \
          for (int64_t ow = a; ow < e; ow++) d[ow] = 0;                                          \
          continue;                                                                              \
        }                                                                                        \
        int64_t l = lo < a ? a : lo > e ? e : lo, h = hi > e ? e : hi < l ? l : hi;              \
        const T *s = src + ih * g->W + off;                                                      \
        /* plain loops, not memset/memcpy: rows of small images are a few elements long */      \
        for (int64_t ow = a; ow < l; ow++) d[ow] = 0;                                            \
        /* constant strides vectorise (stride 2: the VAE's downsampling convs) */              \
        if (g->sw == 1)                                                                          \
          for (int64_t ow = l; ow < h; ow++) d[ow] = s[ow];                                      \
        else if (g->sw == 2)                                                                     \
          for (int64_t ow = l; ow < h; ow++) d[ow] = s[2 * ow];                                  \
        else                                                                                     \
          for (int64_t ow = l; ow < h; ow++) d[ow] = s[ow * g->sw];                              \
        for (int64_t ow = h; ow < e; ow++) d[ow] = 0;                                            \
      }                                                                                          \
    }                                                                                            \
  }
DEFINE_IM2COL_RANGE(float, f32)
DEFINE_IM2COL_RANGE(double, f64)

/* im2col of whole small images (several per tile) as a gather: the source offset within a
 * channel plane of each (kernel tap, output pixel), or -1 for padding, is the same for every
 * channel and image, so it is computed once; row by row im2col spent most of its time on the
 * bookkeeping of rows only a few pixels long. false when the map cannot be allocated. */
static bool gather_columns(const geom *g, bool wide, const void *im, const tile *t, int64_t gi, void *ws,
                           int64_t ld) {
  int64_t kk = (int64_t)g->kh * g->kw, P = npix(g), HW = g->H * g->W;
  int32_t *map = malloc(sizeof(int32_t) * (size_t)(kk * P));
  if (!map) return false;
  for (int64_t k = 0; k < kk; k++)
    for (int64_t p = 0; p < P; p++) {
      int64_t ih = p / g->Wo * g->sh - g->ph + k / g->kw * g->dh, iw = p % g->Wo * g->sw - g->pw + k % g->kw * g->dw;
      map[k * P + p] = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W ? (int32_t)(ih * g->W + iw) : -1;
    }
  for (int64_t j = 0; j < t->nb; j++) {
    int64_t base = ((t->b0 + j) * g->G + gi) * imsize(g);
    for (int64_t r = 0; r < kdim(g); r++) {
      const int32_t *m = map + r % kk * P;
      int64_t src = base + r / kk * HW, dst = r * ld + j * P;
      if (wide) {
        const double *sp = (const double *)im + src;
        double *dp = (double *)ws + dst;
        for (int64_t p = 0; p < P; p++) dp[p] = m[p] >= 0 ? sp[m[p]] : 0;
      } else {
        const float *sp = (const float *)im + src;
        float *dp = (float *)ws + dst;
        for (int64_t p = 0; p < P; p++) dp[p] = m[p] >= 0 ? sp[m[p]] : 0;
      }
    }
  }
  free(map);
  return true;
}

/* the column matrix [K, nb*np] (leading dim *ld) of tile t of group gi: the image itself when
 * the kernel is pointwise and the tile lies in one image, else im2col into ws */
static const void *tile_columns(const geom *g, bool wide, const void *im, const tile *t, int64_t gi, void *ws,
                                int64_t *ld) {
  int es = wide ? 8 : 4;
  if (pointwise(g) && t->nb == 1) {
    *ld = npix(g);
    return AT(im, (t->b0 * g->G + gi) * imsize(g) + t->p0);
  }
  *ld = t->nb * t->np;
  if (t->nb > 1 && gather_columns(g, wide, im, t, gi, ws, *ld)) return ws;
  for (int64_t j = 0; j < t->nb; j++) {
    const void *src = AT(im, ((t->b0 + j) * g->G + gi) * imsize(g));
    if (wide) im2col_range_f64(g, src, (double *)ws + j * t->np, *ld, t->p0, t->np);
    else im2col_range_f32(g, src, (float *)ws + j * t->np, *ld, t->p0, t->np);
  }
  return ws;
}

/* the column-side block [M, nb*np] (leading dim *ld) of tile t of group gi: in place when the
 * tile lies in one image, else gathered into ws */
static const void *tile_block(const geom *g, bool wide, const void *col, const tile *t, int64_t gi, void *ws,
                              int64_t *ld) {
  int es = wide ? 8 : 4;
  int64_t P = npix(g), M = g->M;
  if (t->nb == 1) {
    *ld = P;
    return AT(col, (t->b0 * g->G + gi) * M * P + t->p0);
  }
  *ld = t->nb * P;
  for (int64_t j = 0; j < t->nb; j++)
    copy_rows(wide, AT(ws, j * P), *ld, AT(col, ((t->b0 + j) * g->G + gi) * M * P), P, M, P, NULL);
  return ws;
}

/* ---- direct kernel for small images (f32, AVX-512 or AVX2+FMA) -------------------------------- */

/* At the UNet's latent sizes (16x16 down to 2x2) im2col + GEMM loses twice: the GEMM per tile
 * is small, so OpenBLAS's packing of each tile costs as much as its FLOPs, and with 3x3
 * padding 1 a large share of the column matrix is padding zeros (4x4: 31%, 2x2: 56%). The
 * direct kernel takes as register block one output pixel (oh, ow) of n images at once and
 * DIRECT_LANES x 2 output channels: the n pixels share their in-image kernel taps, so the
 * padding taps are skipped exactly and no im2col is built. Its operands, repacked once per
 * call: the images as xt[chunk][H][W][G*C][n] (the n values of one (pixel, channel)
 * contiguous, broadcast one by one) and the kernel as wp[G][M/MB][kh][kw][C][MB] (MB output
 * channels contiguous, zero past M). Figures: docs/kernels.md "Convolution at UNet sizes". */

/* output pixels per image up to which the direct kernel is used, and the fewest images */
#define DIRECT_MAX_PIX 256
/* AVX2 (6 images per block, 16 channels): ahead of the GEMM up to 8x8, behind at 16x16 x 128 */
#define DIRECT_MAX_PIX_AVX2 64
#define DIRECT_MIN_IMGS 4
/* output pixels per job: their results are gathered so y is written in row runs */
#define DIRECT_PIX_GROUP 16

typedef struct {
  int64_t oh, ow, n;  /* output pixel; images in the chunk */
  const float *xt;    /* the chunk's repacked images, at group gi's first channel */
  const float *wp;    /* the m-block's packed kernel [kh][kw][C][MB] */
  const float *bias;  /* [MB] */
  float *out;         /* [n][MB] */
} direct_job;

/* acc[j] (j < N images) = bias + Σ over in-image taps and channels of x * w, MB = 2 vectors
 * of output channels; N is a compile-time constant so the accumulators stay in registers */
#define DEFINE_DIRECT_TILE(ISA, TGT, V, L, LOAD, STORE, SET1, FMA, N)                                 \
  __attribute__((target(TGT))) static void direct_tile_##ISA##_##N(const geom *g, const direct_job *jb) { \
    V acc[N][2];                                                                                       \
    V b0 = LOAD(jb->bias), b1 = LOAD(jb->bias + L);                                                    \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) acc[j][0] = b0, acc[j][1] = b1;               \
    int64_t C = g->C, Ct = g->G * g->C;                                                                \
    for (int64_t ki = 0; ki < g->kh; ki++) {                                                           \
      int64_t ih = jb->oh * g->sh - g->ph + ki * g->dh;                                                \
      if (ih < 0 || ih >= g->H) continue;                                                              \
      for (int64_t kj = 0; kj < g->kw; kj++) {                                                         \
        int64_t iw = jb->ow * g->sw - g->pw + kj * g->dw;                                              \
        if (iw < 0 || iw >= g->W) continue;                                                            \
        const float *x = jb->xt + (ih * g->W + iw) * Ct * N, *a = jb->wp + (ki * g->kw + kj) * C * 2 * L; \
        for (int64_t c = 0; c < C; c++, x += N, a += 2 * L) {                                          \
          V a0 = LOAD(a), a1 = LOAD(a + L);                                                            \
          _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                       \
            V xv = SET1(x[j]);                                                                         \
            acc[j][0] = FMA(a0, xv, acc[j][0]);                                                        \
            acc[j][1] = FMA(a1, xv, acc[j][1]);                                                        \
          }                                                                                            \
        }                                                                                              \
      }                                                                                                \
    }                                                                                                  \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                             \
      STORE(jb->out + j * 2 * L, acc[j][0]);                                                           \
      STORE(jb->out + j * 2 * L + L, acc[j][1]);                                                       \
    }                                                                                                  \
  }

#define DT512(N) DEFINE_DIRECT_TILE(avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, N)
#define DT256(N) DEFINE_DIRECT_TILE(avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, N)
/* AVX-512: 2 x N accumulators + 2 kernel vectors + 1 broadcast <= 32 registers; AVX2: <= 16 */
DT512(1) DT512(2) DT512(3) DT512(4) DT512(5) DT512(6) DT512(7) DT512(8) DT512(9) DT512(10) DT512(11)
DT512(12) DT512(13) DT512(14)
DT256(1) DT256(2) DT256(3) DT256(4) DT256(5) DT256(6)

typedef void (*direct_fn)(const geom *, const direct_job *);
static const direct_fn direct_avx512[] = {NULL, direct_tile_avx512_1, direct_tile_avx512_2, direct_tile_avx512_3,
                                          direct_tile_avx512_4, direct_tile_avx512_5, direct_tile_avx512_6,
                                          direct_tile_avx512_7, direct_tile_avx512_8, direct_tile_avx512_9,
                                          direct_tile_avx512_10, direct_tile_avx512_11, direct_tile_avx512_12,
                                          direct_tile_avx512_13, direct_tile_avx512_14};
static const direct_fn direct_avx2[] = {NULL, direct_tile_avx2_1, direct_tile_avx2_2, direct_tile_avx2_3,
                                        direct_tile_avx2_4, direct_tile_avx2_5, direct_tile_avx2_6};

/* 2: AVX-512, 1: AVX2+FMA, 0: neither; KENG_CONV_DIRECT=0 turns the kernel off, =2 / =1 caps
 * the ISA (the lab switches variants with setenv + kg_env_reload) */
static int direct_isa(void) { return kg_cpu_vector_isa(KG_ENV_KENG_CONV_DIRECT); }

/* KENG_CONV_DIRECT_FORCE=1 (lab): use the direct kernel at any size and batch */
static bool direct_wanted(const geom *g, int isa) {
  if (kg_env_bool(KG_ENV_KENG_CONV_DIRECT_FORCE)) return true;
  /* 1x1: the GEMM reads the image in place; few output channels would leave lanes empty; few
   * input channels make the per-tap loop too short (UNet conv_in, 4 channels: 1.6x slower) */
  return npix(g) <= (isa == 2 ? DIRECT_MAX_PIX : DIRECT_MAX_PIX_AVX2) && g->B >= DIRECT_MIN_IMGS && !pointwise(g) &&
         g->M >= 16 && g->C >= 16;
}

/* the AVX-512 direct kernel's weight block: dst[tap][c][l] (32 lanes, zero from mn on) =
 * src[l][c][tap] (rows of K = C*kk floats), two 16-lane gathers per (tap, c): the scalar
 * transpose took a quarter of a 13x128x4x4 conv's time */
__attribute__((target("avx512f"))) static void pack_kernel_avx512(float *dst, const float *src, int64_t K, int64_t kk,
                                                                   int64_t mn) {
  int64_t C = K / kk;
  __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_epi32((int)K));
  __mmask16 m0 = (__mmask16)(mn >= 16 ? 0xffff : (1u << mn) - 1), m1 = (__mmask16)(mn >= 32 ? 0xffff : mn > 16 ? (1u << (mn - 16)) - 1 : 0);
  const float *hi = mn > 16 ? src + 16 * K : src;
  for (int64_t k = 0; k < kk; k++)
    for (int64_t c = 0; c < C; c++) {
      float *d = dst + (k * C + c) * 32;
      _mm512_storeu_ps(d, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m0, idx, src + c * kk + k, 4));
      _mm512_storeu_ps(d + 16, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m1, idx, hi + c * kk + k, 4));
    }
}

/* col (+ bias) = conv of im with w, by the direct kernel; false when it does not apply (f64,
 * no AVX2, large images, few images) or its buffers cannot be allocated */
static bool conv_fwd_direct(const geom *g, bool wide, const float *im, const float *w, const float *bias, float *col) {
  int isa = wide ? 0 : direct_isa();
  if (isa == 0 || !direct_wanted(g, isa) || npix(g) == 0 || g->B == 0) return false;
  int L = isa == 2 ? 16 : 8, MB = 2 * L, NBmax = isa == 2 ? 14 : 6;
  const direct_fn *fns = isa == 2 ? direct_avx512 : direct_avx2;
  int64_t C = g->C, Ct = g->G * C, M = g->M, G = g->G, kk = (int64_t)g->kh * g->kw, HW = g->H * g->W, P = npix(g);
  int64_t nmb = (M + MB - 1) / MB, chunks = (g->B + NBmax - 1) / NBmax;
  scratch sx = {0}, sw = {0}, sb = {0};
  float *xt = scratch_get(&sx, g->B * Ct * HW, 4), *wp = scratch_get(&sw, G * nmb * kk * C * MB, 4),
        *bp = scratch_get(&sb, G * nmb * MB, 4);
  if (!xt || !wp || !bp) {
    scratch_free(&sx), scratch_free(&sw), scratch_free(&sb);
    return false;
  }
  /* chunks of near-equal size (13 images: one chunk; 26: two of 13; 15: 8 + 7) */
  int64_t base = g->B / chunks, extra = g->B % chunks;
#define CHUNK_B0(q) ((q) * base + ((q) < extra ? (q) : extra))
  bool par = 2 * g->B * G * M * P * C * kk > CONV_PAR_FLOPS;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static) nowait
    for (int64_t qc = 0; qc < chunks * Ct; qc++) { /* xt[chunk][p][c][j] = im[b0 + j][c][p] */
      int64_t q = qc / Ct, c = qc % Ct, b0 = CHUNK_B0(q), n = CHUNK_B0(q + 1) - b0;
      float *dst = xt + b0 * Ct * HW + c * n;
      const float *src = im + (b0 * Ct + c) * HW;
      /* the n values of a pixel written together (one cache line), n sequential reads */
      for (int64_t p = 0; p < HW; p++)
        for (int64_t j = 0; j < n; j++) dst[p * Ct * n + j] = src[j * Ct * HW + p];
    }
#pragma omp for schedule(static)
    for (int64_t gm = 0; gm < G * nmb; gm++) { /* wp[gi][mb][tap][c][l] = w[gi*M + mb*MB + l][c][tap] */
      int64_t gi = gm / nmb, m0 = gm % nmb * MB;
      float *dst = wp + gm * kk * C * MB, *bd = bp + gm * MB;
      int64_t mn = M - m0 < MB ? M - m0 : MB;
      const float *src = w + (gi * M + m0) * C * kk;
      for (int64_t l = 0; l < MB; l++) bd[l] = l < mn && bias ? bias[gi * M + m0 + l] : 0;
      if (isa == 2 && C * kk * MB <= INT32_MAX) {
        pack_kernel_avx512(dst, src, C * kk, kk, mn);
        continue;
      }
      /* written in order; read across MB kernel rows, each read sequentially */
      for (int64_t k = 0; k < kk; k++)
        for (int64_t c = 0; c < C; c++) {
          float *d = dst + (k * C + c) * MB;
          for (int64_t l = 0; l < mn; l++) d[l] = src[(l * C + c) * kk + k];
          for (int64_t l = mn; l < MB; l++) d[l] = 0;
        }
    }
    /* a job: DIRECT_PIX_GROUP pixels, gathered as [n][MB][pixels] so y gets whole row runs */
    float out[14 * 32], grp[14 * 32 * DIRECT_PIX_GROUP];
    int64_t npg = (P + DIRECT_PIX_GROUP - 1) / DIRECT_PIX_GROUP, jobs = chunks * G * nmb * npg;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < jobs; t++) {
      if (kg_interrupt_pending()) continue;
      int64_t p0 = t % npg * DIRECT_PIX_GROUP, gm = t / npg % (G * nmb), q = t / npg / (G * nmb), gi = gm / nmb;
      int64_t m0 = gm % nmb * MB, b0 = CHUNK_B0(q), n = CHUNK_B0(q + 1) - b0, mn = M - m0 < MB ? M - m0 : MB;
      int64_t np = P - p0 < DIRECT_PIX_GROUP ? P - p0 : DIRECT_PIX_GROUP;
      for (int64_t i = 0; i < np; i++) {
        int64_t p = p0 + i;
        direct_job jb = {p / g->Wo, p % g->Wo, n, xt + b0 * Ct * HW + gi * C * n, wp + gm * kk * C * MB, bp + gm * MB, out};
        fns[n](g, &jb);
        for (int64_t jl = 0; jl < n * MB; jl++) grp[jl * DIRECT_PIX_GROUP + i] = out[jl];
      }
      for (int64_t j = 0; j < n; j++)
        for (int64_t l = 0; l < mn; l++)
          memcpy(col + ((b0 + j) * G * M + gi * M + m0 + l) * P + p0, grp + (j * MB + l) * DIRECT_PIX_GROUP,
                 sizeof(float) * (size_t)np);
    }
  }
#undef CHUNK_B0
  scratch_free(&sx), scratch_free(&sw), scratch_free(&sb);
  kg_flop_add((uint64_t)(2 * g->B * G * M * P * C * kk));
  return true;
}

/* The weight gradient by the same register blocking, with the roles of images and channels
 * swapped: dw[m][c][tap] = Σ over images b and output pixels p of dy[b][m][p] x[b][c][p + tap],
 * a block of n input channels x MB output channels per (tap, channel block), the sum running
 * only over the pixels whose tap lies in the image. Operands repacked once per call: dy as
 * dyp[G][M/MB][B][P][MB] (zero past M), the images channel-last xc[B][H][W][G*C]. */
typedef struct {
  int64_t ki, kj, n;  /* kernel tap; input channels in the block */
  const float *dyp;   /* the m-block's dy [B][P][MB] */
  const float *xc;    /* the images at the block's first channel */
  float *out;         /* [n][MB] */
} dw_job;

#define DEFINE_DW_TILE(ISA, TGT, V, L, LOAD, STORE, SET1, FMA, ZERO, N)                                   \
  __attribute__((target(TGT))) static void dw_tile_##ISA##_##N(const geom *g, const dw_job *jb) {          \
    V acc[N][2];                                                                                           \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) acc[j][0] = ZERO(), acc[j][1] = ZERO();           \
    int64_t Ct = g->G * g->C, P = npix(g), oh0, oh1, ow0, ow1;                                             \
    valid_range(jb->ki * g->dh - g->ph, g->sh, g->H, g->Ho, &oh0, &oh1);                                   \
    valid_range(jb->kj * g->dw - g->pw, g->sw, g->W, g->Wo, &ow0, &ow1);                                   \
    for (int64_t b = 0; b < g->B; b++)                                                                     \
      for (int64_t oh = oh0; oh < oh1; oh++) {                                                             \
        int64_t ih = oh * g->sh - g->ph + jb->ki * g->dh;                                                  \
        const float *a = jb->dyp + ((b * P) + oh * g->Wo + ow0) * 2 * L;                                   \
        const float *x = jb->xc + ((b * g->H + ih) * g->W + ow0 * g->sw - g->pw + jb->kj * g->dw) * Ct;    \
        for (int64_t ow = ow0; ow < ow1; ow++, a += 2 * L, x += g->sw * Ct) {                              \
          V a0 = LOAD(a), a1 = LOAD(a + L);                                                                \
          _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                           \
            V xv = SET1(x[j]);                                                                             \
            acc[j][0] = FMA(a0, xv, acc[j][0]);                                                            \
            acc[j][1] = FMA(a1, xv, acc[j][1]);                                                            \
          }                                                                                                \
        }                                                                                                  \
      }                                                                                                    \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                                 \
      STORE(jb->out + j * 2 * L, acc[j][0]);                                                               \
      STORE(jb->out + j * 2 * L + L, acc[j][1]);                                                           \
    }                                                                                                      \
  }

#define DW512(N) DEFINE_DW_TILE(avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_setzero_ps, N)
#define DW256(N) DEFINE_DW_TILE(avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_setzero_ps, N)
DW512(1) DW512(2) DW512(3) DW512(4) DW512(5) DW512(6) DW512(7) DW512(8) DW512(9) DW512(10) DW512(11)
DW512(12) DW512(13) DW512(14)
DW256(1) DW256(2) DW256(3) DW256(4) DW256(5) DW256(6)

typedef void (*dw_fn)(const geom *, const dw_job *);
static const dw_fn dw_avx512[] = {NULL, dw_tile_avx512_1, dw_tile_avx512_2, dw_tile_avx512_3, dw_tile_avx512_4,
                                  dw_tile_avx512_5, dw_tile_avx512_6, dw_tile_avx512_7, dw_tile_avx512_8,
                                  dw_tile_avx512_9, dw_tile_avx512_10, dw_tile_avx512_11, dw_tile_avx512_12,
                                  dw_tile_avx512_13, dw_tile_avx512_14};
static const dw_fn dw_avx2[] = {NULL, dw_tile_avx2_1, dw_tile_avx2_2, dw_tile_avx2_3,
                                dw_tile_avx2_4, dw_tile_avx2_5, dw_tile_avx2_6};

/* dw = the weight gradient by the direct kernel; false when it does not apply or its buffers
 * cannot be allocated */
static bool conv_bwd_weight_direct(const geom *g, bool wide, const float *im, const float *col, float *dw) {
  int isa = wide ? 0 : direct_isa();
  if (isa == 0 || !direct_wanted(g, isa) || npix(g) == 0 || g->B == 0) return false;
  int L = isa == 2 ? 16 : 8, MB = 2 * L, NBmax = isa == 2 ? 14 : 6;
  const dw_fn *fns = isa == 2 ? dw_avx512 : dw_avx2;
  int64_t C = g->C, Ct = g->G * C, M = g->M, G = g->G, kk = (int64_t)g->kh * g->kw, HW = g->H * g->W, P = npix(g);
  int64_t nmb = (M + MB - 1) / MB, ncb = (C + NBmax - 1) / NBmax, B = g->B;
  scratch sx = {0}, sd = {0};
  float *xc = scratch_get(&sx, B * Ct * HW, 4), *dyp = scratch_get(&sd, G * nmb * B * P * MB, 4);
  if (!xc || !dyp) {
    scratch_free(&sx), scratch_free(&sd);
    return false;
  }
  int64_t base = C / ncb, extra = C % ncb; /* channel blocks of near-equal size */
#define CB_C0(q) ((q) * base + ((q) < extra ? (q) : extra))
  bool par = 2 * B * G * M * P * C * kk > CONV_PAR_FLOPS;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < B; b++) /* xc[b][p][c] = im[b][c][p] */
      for (int64_t c = 0; c < Ct; c++) {
        const float *src = im + (b * Ct + c) * HW;
        float *dst = xc + b * HW * Ct + c;
        for (int64_t p = 0; p < HW; p++) dst[p * Ct] = src[p];
      }
#pragma omp for schedule(static)
    for (int64_t gb = 0; gb < G * nmb * B; gb++) { /* dyp[gi][mb][b][p][l] = dy[b][gi*M + mb*MB + l][p] */
      int64_t b = gb % B, gm = gb / B, gi = gm / nmb, m0 = gm % nmb * MB, mn = M - m0 < MB ? M - m0 : MB;
      float *dst = dyp + gb * P * MB;
      const float *src = col + (b * G * M + gi * M + m0) * P;
      for (int64_t p = 0; p < P; p++) {
        for (int64_t l = 0; l < mn; l++) dst[p * MB + l] = src[l * P + p];
        for (int64_t l = mn; l < MB; l++) dst[p * MB + l] = 0;
      }
    }
    float out[14 * 32];
    int64_t jobs = G * nmb * kk * ncb;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < jobs; t++) {
      if (kg_interrupt_pending()) continue;
      int64_t q = t % ncb, k = t / ncb % kk, gm = t / ncb / kk, gi = gm / nmb, m0 = gm % nmb * MB;
      int64_t c0 = CB_C0(q), n = CB_C0(q + 1) - c0, mn = M - m0 < MB ? M - m0 : MB;
      dw_job jb = {k / g->kw, k % g->kw, n, dyp + gm * B * P * MB, xc + gi * C + c0, out};
      fns[n](g, &jb);
      for (int64_t j = 0; j < n; j++) {
        float *d = dw + ((gi * M + m0) * C + c0 + j) * kk + k;
        for (int64_t l = 0; l < mn; l++) d[l * C * kk] = out[j * MB + l];
      }
    }
  }
#undef CB_C0
  scratch_free(&sx), scratch_free(&sd);
  kg_flop_add((uint64_t)(2 * B * G * M * P * C * kk));
  return true;
}

/* ---- pointwise convs on small images (f32, AVX-512) ------------------------------------------ */

/* A 1x1 conv with unit stride and no padding is, image by image, y[b] = w[M, C] @ x[b][C, P]
 * (+ bias). At the UNet's 8x8, 4x4 and 2x2 latents P is 64, 16 or 4: the tile path gathered the
 * images side by side and ran one OpenBLAS sgemm [M, C] x [C, B*P] of a few MFLOP, on which
 * OpenBLAS's own threads cost more than they share (2 threads slower than 1) and wait for a
 * parked thread on a busy machine. Here 8 output channels x 32 columns of accumulators start
 * from the bias, the weights are broadcast one by one, the 16-column vectors read in place
 * (P a multiple of 16: each vector lies in one image) or from a gathered copy [C, B*P] (P = 4),
 * and the blocks are shared by our own threads. Figures: docs/kernels.md "Pointwise convs on
 * small images". */
#define PW_ROWS 8
#define PW_LANES 16

typedef struct {
  const float *b[2]; /* each column vector's first row (k = 0) */
  int64_t bld[2];    /* its row stride */
  float *c[2];       /* its output for the block's first channel */
  int64_t cld[2];    /* output row stride */
  __mmask16 mask[2]; /* valid lanes */
} pw_cols;

/* c[i] (i < rows) = bias[i] + Σ_k A[i][k] b[k] for the two column vectors; rows past `rows`
 * repeat the last one (computed, not stored) so the accumulators stay a constant 8 x 2 */
__attribute__((target("avx512f"))) static void pw_block(const float *A, int64_t lda, int64_t K, const float *bias,
                                                         int rows, const pw_cols *v) {
  __m512 acc[PW_ROWS][2];
  const float *a[PW_ROWS];
  _Pragma("GCC unroll 8") for (int i = 0; i < PW_ROWS; i++) {
    int r = i < rows ? i : rows - 1;
    a[i] = A + r * lda;
    acc[i][0] = acc[i][1] = _mm512_set1_ps(bias ? bias[r] : 0.0f);
  }
  const float *b0 = v->b[0], *b1 = v->b[1];
  int64_t s0 = v->bld[0], s1 = v->bld[1];
  __mmask16 m0 = v->mask[0], m1 = v->mask[1];
  for (int64_t k = 0; k < K; k++, b0 += s0, b1 += s1) {
    __m512 x0 = _mm512_maskz_loadu_ps(m0, b0), x1 = _mm512_maskz_loadu_ps(m1, b1);
    _Pragma("GCC unroll 8") for (int i = 0; i < PW_ROWS; i++) {
      __m512 wv = _mm512_set1_ps(a[i][k]);
      acc[i][0] = _mm512_fmadd_ps(wv, x0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(wv, x1, acc[i][1]);
    }
  }
  /* constant trip count: a variable one made GCC keep acc in memory */
  _Pragma("GCC unroll 8") for (int i = 0; i < PW_ROWS; i++) {
    if (i >= rows) break;
    _mm512_mask_storeu_ps(v->c[0] + i * v->cld[0], m0, acc[i][0]);
    _mm512_mask_storeu_ps(v->c[1] + i * v->cld[1], m1, acc[i][1]);
  }
}

/* col (+ bias) = the pointwise conv of im with w on small images; false when it does not apply
 * (f64, not 1x1 / unit stride / no padding, images of CONV_TILE+ pixels, no AVX-512,
 * KENG_CONV_DIRECT=0 or 1, KENG_CONV_POINTWISE=0) or its buffers cannot be allocated */
static bool conv_fwd_pointwise(const geom *g, bool wide, const float *im, const float *w, const float *bias,
                               float *col) {
  int64_t P = npix(g), B = g->B, G = g->G, M = g->M, C = g->C, N = B * P;
  if (wide || !pointwise(g) || P >= CONV_TILE || N == 0 || M == 0 || direct_isa() != 2 ||
      !kg_env_bool(KG_ENV_KENG_CONV_POINTWISE))
    return false;
  bool inplace = P % PW_LANES == 0;
  scratch sx = {0}, sy = {0};
  float *xg = NULL, *yg = NULL;
  if (!inplace) { /* xg[gi*C + c][b*P + p] = im[b][gi*C + c][p]; yg likewise for the output */
    xg = scratch_get(&sx, G * C * N, 4), yg = scratch_get(&sy, G * M * N, 4);
    if (!xg || !yg) {
      scratch_free(&sx), scratch_free(&sy);
      return false;
    }
  }
  int64_t ncb = (N + 2 * PW_LANES - 1) / (2 * PW_LANES), nrb = (M + PW_ROWS - 1) / PW_ROWS, jobs = G * ncb * nrb;
  bool par = 2 * N * G * M * C > CONV_PAR_FLOPS;
#pragma omp parallel if (par)
  {
    if (!inplace) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < G * C; r++)
        for (int64_t b = 0; b < B; b++) memcpy(xg + r * N + b * P, im + (b * G * C + r) * P, sizeof(float) * (size_t)P);
    }
    /* row blocks innermost: a thread's consecutive jobs reuse one column block from L1 */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < jobs; t++) {
      int64_t rb = t % nrb, cb = t / nrb % ncb, gi = t / nrb / ncb, m0 = rb * PW_ROWS;
      pw_cols v = {0};
      for (int u = 0; u < 2; u++) {
        int64_t j = (cb * 2 + u) * PW_LANES, n = N - j < PW_LANES ? N - j : PW_LANES;
        if (n <= 0) { /* no second vector: masked off, pointers kept valid */
          v.b[1] = v.b[0], v.bld[1] = v.bld[0], v.c[1] = v.c[0], v.cld[1] = v.cld[0], v.mask[1] = 0;
          continue;
        }
        v.mask[u] = (__mmask16)((1u << n) - 1);
        if (inplace) {
          int64_t b = j / P, p = j % P;
          v.b[u] = im + (b * G + gi) * C * P + p, v.bld[u] = P;
          v.c[u] = col + (b * G + gi) * M * P + m0 * P + p, v.cld[u] = P;
        } else {
          v.b[u] = xg + gi * C * N + j, v.bld[u] = N;
          v.c[u] = yg + (gi * M + m0) * N + j, v.cld[u] = N;
        }
      }
      int rows = M - m0 < PW_ROWS ? (int)(M - m0) : PW_ROWS;
      pw_block(w + (gi * M + m0) * C, C, C, bias ? bias + gi * M + m0 : NULL, rows, &v);
    }
    if (!inplace) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < G * M; r++)
        for (int64_t b = 0; b < B; b++) memcpy(col + (b * G * M + r) * P, yg + r * N + b * P, sizeof(float) * (size_t)P);
    }
  }
  scratch_free(&sx), scratch_free(&sy);
  kg_flop_add((uint64_t)(2 * N * G * M * C));
  return true;
}

/* col (+ bias[G*M] when given) = w @ im2col(im), tile by tile */
static kg_status conv_fwd(const geom *g, bool wide, const void *im, const void *w, const void *bias, void *col) {
  int es = wide ? 8 : 4;
  if (!wide) {
    kg_wino_shape ws = {g->B, g->C, g->H, g->W, g->M, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->G};
    if (kg_cpu_conv_winograd(col, im, w, bias, &ws)) return KG_OK;
  }
  if (conv_fwd_direct(g, wide, im, w, bias, col) || conv_fwd_pointwise(g, wide, im, w, bias, col)) return KG_OK;
  int64_t K = kdim(g), P = npix(g), M = g->M;
  tiling tl = make_tiling(g);
  int64_t cols = tl.imgs * (tl.per_img > 1 ? CONV_TILE : P);
  bool oom = false;
#pragma omp parallel if (tiles_parallel(g, &tl))
  {
    scratch s1 = {0}, s2 = {0};
    void *ws = scratch_get(&s1, K * cols, es), *out = tl.imgs > 1 ? scratch_get(&s2, M * cols, es) : NULL;
    if (!ws || (tl.imgs > 1 && !out)) {
#pragma omp atomic write
      oom = true;
    }
#pragma omp for schedule(static)
    for (int64_t ti = 0; ti < tl.count; ti++) {
      if (oom || kg_interrupt_pending()) continue;
      tile t = tile_at(g, &tl, ti);
      for (int64_t gi = 0; gi < g->G; gi++) {
        int64_t ld;
        const void *cm = tile_columns(g, wide, im, &t, gi, ws, &ld), *bg = bias ? AT(bias, gi * M) : NULL;
        if (t.nb == 1) { /* straight into y, on top of the bias */
          void *y = AT(col, (t.b0 * g->G + gi) * M * P + t.p0);
          if (bg) fill_rows(wide, y, P, M, t.np, bg);
          gemm(wide, false, false, M, t.np, K, AT(w, gi * M * K), K, cm, ld, bg ? 1 : 0, y, P);
        } else {
          gemm(wide, false, false, M, t.nb * P, K, AT(w, gi * M * K), K, cm, ld, 0, out, t.nb * P);
          for (int64_t j = 0; j < t.nb; j++)
            copy_rows(wide, AT(col, ((t.b0 + j) * g->G + gi) * M * P), P, AT(out, j * P), t.nb * P, M, P, bg);
        }
      }
    }
    scratch_free(&s1), scratch_free(&s2);
  }
  if (oom) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the im2col buffers");
  return KG_OK;
}

/* stride 1 with padding <= the dilated kernel's reach: the data gradient is itself a
 * convolution of the column side with the flipped, transposed kernel (padding (k-1)d - p), so
 * it runs as conv_fwd (efficient GEMM with K = M*kh*kw, no col2im scatter) */
static bool flip_ok(const geom *g) {
  return g->sh == 1 && g->sw == 1 && g->ph <= (g->kh - 1) * g->dh && g->pw <= (g->kw - 1) * g->dw;
}

/* wf[g*C + c, m, kh-1-i, kw-1-j] = w[g*M + m, c, i, j] */
static void flip_kernel(const geom *g, bool wide, const void *w, void *wf) {
  int es = wide ? 8 : 4;
  int64_t kk = (int64_t)g->kh * g->kw;
  for (int64_t gi = 0; gi < g->G; gi++)
    for (int64_t m = 0; m < g->M; m++)
      for (int64_t c = 0; c < g->C; c++)
        for (int64_t k = 0; k < kk; k++)
          memcpy(AT(wf, ((gi * g->C + c) * g->M + m) * kk + kk - 1 - k), AT(w, ((gi * g->M + m) * g->C + c) * kk + k),
                 (size_t)es);
}

static kg_status conv_bwd_data(const geom *g, bool wide, const void *col, const void *w, void *im) {
  int es = wide ? 8 : 4;
  int64_t K = kdim(g), P = npix(g), M = g->M;
  if (flip_ok(g)) {
    geom f = {g->B, g->G, g->M, g->Ho, g->Wo, g->C, g->H, g->W, g->kh, g->kw, 1, 1,
              (g->kh - 1) * g->dh - g->ph, (g->kw - 1) * g->dw - g->pw, g->dh, g->dw};
    scratch s = {0};
    void *wf = scratch_get(&s, g->G * M * K, es);
    if (!wf) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the flipped kernel");
    flip_kernel(g, wide, w, wf);
    kg_status st = conv_fwd(&f, wide, col, wf, NULL, im);
    scratch_free(&s);
    return st;
  }
  /* strided: GEMM into whole-image column blocks, then col2im (adds overlapping windows) */
  int64_t nb = chunk_of(g, es);
  scratch s1 = {0}, s2 = {0};
  void *ws = scratch_get(&s1, K * nb * P, es), *in = nb > 1 ? scratch_get(&s2, M * nb * P, es) : NULL;
  if (!ws || (nb > 1 && !in)) {
    scratch_free(&s1), scratch_free(&s2);
    return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the col2im buffer");
  }
  for (int64_t b0 = 0; b0 < g->B && !kg_interrupt_pending(); b0 += nb) {
    int64_t n = g->B - b0 < nb ? g->B - b0 : nb;
    for (int64_t gi = 0; gi < g->G; gi++) {
      tile t = {b0, n, 0, P};
      int64_t ld;
      const void *dy = tile_block(g, wide, col, &t, gi, in, &ld);
      gemm(wide, true, false, K, n * P, M, AT(w, gi * M * K), K, dy, ld, 0, ws, n * P);
      for (int64_t j = 0; j < n; j++) col2im(g, wide, AT(ws, j * P), n * P, AT(im, ((b0 + j) * g->G + gi) * imsize(g)));
    }
  }
  scratch_free(&s1), scratch_free(&s2);
  return KG_OK;
}

/* dw[g] = Σ_tiles col_tile @ im2col_tileᵀ; each thread sums its tiles into its own partial,
 * the partials are added in thread order (deterministic for a given thread count). f32 3x3
 * stride-1 convs go first to Winograd (kg_cpu_conv_winograd_bwd_weight, deterministic the
 * same way), then small images to the direct kernel */
static kg_status conv_bwd_weight(const geom *g, bool wide, const void *im, const void *col, void *dw) {
  if (!wide) { /* Winograd's transposed algorithm where its rule picks it (conv_winograd.c) */
    kg_wino_shape ws = {g->B, g->C, g->H, g->W, g->M, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->G};
    if (kg_cpu_conv_winograd_bwd_weight(dw, im, col, &ws)) return KG_OK;
  }
  if (conv_bwd_weight_direct(g, wide, im, col, dw)) return KG_OK;
  int es = wide ? 8 : 4;
  int64_t K = kdim(g), P = npix(g), M = g->M, nw = g->G * M * K;
  tiling tl = make_tiling(g);
  int64_t cols = tl.imgs * (tl.per_img > 1 ? CONV_TILE : P);
  int nt = tiles_parallel(g, &tl) ? omp_get_max_threads() : 1;
  scratch sp = {0};
  char *parts = nt > 1 ? scratch_get(&sp, nw * (nt - 1), es) : NULL;
  if (nt > 1 && !parts) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the weight-gradient partials");
  bool oom = false;
  int used = 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int me = omp_get_thread_num();
    void *acc = me == 0 ? dw : parts + (int64_t)(me - 1) * nw * es;
    if (me == 0) used = omp_get_num_threads();
    memset(acc, 0, (size_t)nw * (size_t)es);
    scratch s1 = {0}, s2 = {0};
    void *ws = scratch_get(&s1, K * cols, es), *in = tl.imgs > 1 ? scratch_get(&s2, M * cols, es) : NULL;
    if (!ws || (tl.imgs > 1 && !in)) {
#pragma omp atomic write
      oom = true;
    }
#pragma omp for schedule(static)
    for (int64_t ti = 0; ti < tl.count; ti++) {
      if (oom || kg_interrupt_pending()) continue;
      tile t = tile_at(g, &tl, ti);
      for (int64_t gi = 0; gi < g->G; gi++) {
        int64_t lda, ldb;
        const void *dy = tile_block(g, wide, col, &t, gi, in, &lda), *cm = tile_columns(g, wide, im, &t, gi, ws, &ldb);
        gemm(wide, false, true, M, K, t.nb * t.np, dy, lda, cm, ldb, 1, AT(acc, gi * M * K), K);
      }
    }
    scratch_free(&s1), scratch_free(&s2);
  }
  for (int p = 1; p < used; p++) add_into(wide, dw, parts + (int64_t)(p - 1) * nw * es, nw);
  scratch_free(&sp);
  if (oom) return kg_error(KG_ERR_OOM, "conv2d", "out of memory for the im2col buffers");
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

/* db[C] = Σ_{b, p} dy[b, C, p]: f32 partial sums over runs of 8 lanes (vectorisable), the
 * runs added in double */
static void bias_grad(bool wide, const void *dy, void *db, int64_t B, int64_t C, int64_t P) {
#pragma omp parallel for if (B * C * P > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t c = 0; c < C; c++) {
    double s = 0;
    for (int64_t b = 0; b < B; b++) {
      int64_t o = (b * C + c) * P;
      if (wide) {
        for (int64_t i = 0; i < P; i++) s += ((const double *)dy)[o + i];
      } else {
        const float *row = (const float *)dy + o;
        float lane[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= P; i += 8)
          for (int k = 0; k < 8; k++) lane[k] += row[i + k];
        for (; i < P; i++) s += row[i];
        for (int k = 0; k < 8; k++) s += lane[k];
      }
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
  scratch sx, sw, sb = {0}, sy;
  const void *xb = load_all(x, wide, &sx), *wb = load_all(w, wide, &sw), *bb = b ? load_all(b, wide, &sb) : NULL;
  void *yb = out_buf(y, wide, &sy);
  kg_status s = KG_OK;
  if (!xb || !wb || !yb || (b && !bb)) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for buffers");
  else if (transposed) s = conv_bwd_data(&g, wide, xb, wb, yb);
  else s = conv_fwd(&g, wide, xb, wb, bb, yb);
  if (s == KG_OK && bb && transposed) add_bias(wide, yb, bb, y->shape[0], y->shape[1], y->shape[2] * y->shape[3]);
  if (yb) out_flush(y, yb, wide, &sy);
  scratch_free(&sx), scratch_free(&sw), scratch_free(&sb);
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
  scratch sdy, sx = {0}, sw = {0}, so;
  const void *dyb = load_all(dy, wide, &sdy), *xb = dw ? load_all(x, wide, &sx) : NULL,
             *wb = dx ? load_all(w, wide, &sw) : NULL;
  kg_status s = KG_OK;
  if (!dyb || (dw && !xb) || (dx && !wb)) {
    s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for buffers");
    goto done;
  }
  const void *imb = transposed ? dyb : xb, *colb = transposed ? xb : dyb;
  if (dx) {
    void *o = out_buf(dx, wide, &so);
    if (!o) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for dx");
    else s = transposed ? conv_fwd(&g, wide, dyb, wb, NULL, o) : conv_bwd_data(&g, wide, dyb, wb, o);
    if (o) out_flush(dx, o, wide, &so);
  }
  if (dw && s == KG_OK) {
    void *o = out_buf(dw, wide, &so);
    if (!o) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for dw");
    else s = conv_bwd_weight(&g, wide, imb, colb, o);
    if (o) out_flush(dw, o, wide, &so);
  }
  if (db && s == KG_OK) {
    void *o = out_buf(db, wide, &so);
    if (!o) s = kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for db");
    else bias_grad(wide, dyb, o, dy->shape[0], dy->shape[1], dy->shape[2] * dy->shape[3]);
    if (o) out_flush(db, o, wide, &so);
  }
done:
  scratch_free(&sdy), scratch_free(&sx), scratch_free(&sw);
  return s;
}

kg_status kg_cpu_conv2d_backward(const kg_op_call *c) { return conv_backward(c, false); }
kg_status kg_cpu_conv_transpose2d_backward(const kg_op_call *c) { return conv_backward(c, true); }

/* ---- interpolate: nearest, bilinear, bicubic, antialias ------------------------------------ */

/* one axis's windows and weights (engine/ops/interp.h) tabulated: output index o reads source
 * indices lo[o] .. lo[o] + n[o] - 1 with weights w[o * k ..] */
typedef struct {
  int64_t *lo, *n, k;
  double *w;
} interp_table;

static void interp_table_free(interp_table *t) { free(t->lo), free(t->n), free(t->w); }

static bool interp_table_make(interp_table *t, const kg_interpolate_params *p, bool single, int axis, int64_t in) {
  kg_interp_axis a = {p->mode, p->antialias, p->align_corners, single, in, axis ? p->out_w : p->out_h,
                      axis ? p->scale_w : p->scale_h};
  t->lo = malloc((size_t)a.out * sizeof *t->lo), t->n = malloc((size_t)a.out * sizeof *t->n), t->w = NULL, t->k = 1;
  if (!t->lo || !t->n) return false;
  for (int64_t o = 0; o < a.out; o++) {
    int64_t hi;
    kg_interp_bounds(&a, o, &t->lo[o], &hi);
    t->n[o] = hi - t->lo[o];
    if (t->n[o] > t->k) t->k = t->n[o];
  }
  t->w = malloc((size_t)(a.out * t->k) * sizeof *t->w);
  if (!t->w) return false;
  for (int64_t o = 0; o < a.out; o++) {
    double norm = kg_interp_norm(&a, o, t->lo[o], t->lo[o] + t->n[o]);
    for (int64_t j = 0; j < t->n[o]; j++) t->w[o * t->k + j] = kg_interp_weight(&a, o, t->lo[o] + j, norm);
  }
  return true;
}

/* in {x: [B, C, H, W]} -> out {y: [B, C, Ho, Wo]}, separable: each output row is first the
 * weighted sum of its source rows, then each output pixel the weighted sum along that row; in
 * double for every dtype (the index math in the dtype's own precision, as PyTorch) */
kg_status kg_cpu_interpolate(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  const kg_interpolate_params *p = c->params;
  int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3], Ho = y->shape[2], Wo = y->shape[3];
  interp_table th, tw;
  bool single = x->dtype != KG_F64;
  bool ok = interp_table_make(&th, p, single, 0, H), okw = interp_table_make(&tw, p, single, 1, W);
  kg_status s = KG_OK;
  if (!ok || !okw) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory for the weight tables");
  const char *xb = kg_data(x);
  char *yb = kg_data(y);
  int xes = kg_dtype_info[x->dtype].size, yes = kg_dtype_info[y->dtype].size;
  int64_t rows = s == KG_OK ? y->shape[0] * C * Ho : 0;
  int oom = 0;
#pragma omp parallel if (rows * Wo * th.k * tw.k > KG_PAR_THRESHOLD)
  {
    double *in = malloc((size_t)(2 * W + Wo) * sizeof(double)), *mid = in ? in + W : NULL, *out = in ? mid + W : NULL;
    if (!in) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      if (!in) continue;
      int64_t oh = r % Ho, bc = r / Ho, b = bc / C, ch = bc % C;
      for (int64_t j = 0; j < W; j++) mid[j] = 0;
      for (int64_t q = 0; q < th.n[oh]; q++) {
        const char *src = xb + (b * x->stride[0] + ch * x->stride[1] + (th.lo[oh] + q) * x->stride[2]) * xes;
        kg_cpu_load_f64(in, src, x->dtype, x->stride[3], W);
        double wq = th.w[oh * th.k + q];
        for (int64_t j = 0; j < W; j++) mid[j] += wq * in[j];
      }
      for (int64_t j = 0; j < Wo; j++) {
        const double *wj = tw.w + j * tw.k, *mj = mid + tw.lo[j];
        double acc = 0;
        for (int64_t q = 0; q < tw.n[j]; q++) acc += wj[q] * mj[q];
        out[j] = acc;
      }
      kg_cpu_store_f64(yb + r * Wo * yes, y->dtype, 1, out, Wo);
    }
    free(in);
  }
  interp_table_free(&th), interp_table_free(&tw);
  if (oom) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory for row buffers");
  return s;
}

/* in {dy: [B, C, Ho, Wo]} -> out {dx: [B, C, H, W]}: the forward's transpose; each source pixel
 * sums the gradients of the output pixels that read it, times the weights they read it with */
kg_status kg_cpu_interpolate_backward(const kg_op_call *c) {
  const kg_tensor *dy = c->in[0];
  kg_tensor *dx = c->out[0];
  const kg_interpolate_params *p = c->params;
  int64_t C = dx->shape[1], H = dx->shape[2], W = dx->shape[3], Ho = dy->shape[2], Wo = dy->shape[3];
  interp_table th, tw;
  bool single = dx->dtype != KG_F64;
  bool ok = interp_table_make(&th, p, single, 0, H), okw = interp_table_make(&tw, p, single, 1, W);
  kg_status s = KG_OK;
  if (!ok || !okw) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory for the weight tables");
  const char *gb = kg_data(dy);
  char *xb = kg_data(dx);
  int ges = kg_dtype_info[dy->dtype].size, xes = kg_dtype_info[dx->dtype].size;
  int64_t planes = s == KG_OK ? dx->shape[0] * C : 0;
  int oom = 0;
#pragma omp parallel if (planes * Ho * Wo * th.k * tw.k > KG_PAR_THRESHOLD)
  {
    double *acc = malloc((size_t)(H * W + W + Wo) * sizeof(double)), *mid = acc ? acc + H * W : NULL,
           *row = acc ? mid + W : NULL;
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
        memset(mid, 0, (size_t)W * sizeof(double));
        for (int64_t j = 0; j < Wo; j++)
          for (int64_t q = 0; q < tw.n[j]; q++) mid[tw.lo[j] + q] += tw.w[j * tw.k + q] * row[j];
        for (int64_t q = 0; q < th.n[oh]; q++) {
          double *dst = acc + (th.lo[oh] + q) * W, wq = th.w[oh * th.k + q];
          for (int64_t j = 0; j < W; j++) dst[j] += wq * mid[j];
        }
      }
      kg_cpu_store_f64(xb + pl * H * W * xes, dx->dtype, 1, acc, H * W);
    }
    free(acc);
  }
  interp_table_free(&th), interp_table_free(&tw);
  if (oom) s = kg_error(KG_ERR_OOM, "interpolate", "out of memory for plane buffers");
  return s;
}
