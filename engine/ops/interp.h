/* interp.h — where one output index of interpolate reads along one axis, and with what weights:
 * PyTorch's formulas (ATen's UpSample.h and the separable antialias kernels), so keng's resize
 * equals torch.nn.functional.interpolate. Shared by the CPU kernel (which tabulates them) and the
 * CUDA kernel (which evaluates them per thread), hence plain C that nvcc also compiles.
 *
 * Every mode is separable and reads a contiguous window [lo, hi) of source indices per output
 * index: nearest one index, bilinear two, bicubic four (clamped indices at the border merge into
 * one, their weights summed), antialias a window as wide as the filter's support scaled by the
 * downscale factor. Index math runs in float when `single` (PyTorch's opmath for f32, bf16 and
 * f16: float), else in double, so the floor at a boundary lands where PyTorch's does. */
#ifndef KENG_OPS_INTERP_H
#define KENG_OPS_INTERP_H

#include <math.h>
#include <stdint.h>

#include <keng/keng.h> /* the KG_INTERP_* modes (ops_api.h) */

#ifdef __CUDACC__
#define KG_INTERP_FN __host__ __device__ static inline
#else
#define KG_INTERP_FN static inline
#endif

/* the modes KG_INTERP_NEAREST / BILINEAR / BICUBIC: <keng/ops_api.h> */

typedef struct {
  int mode, antialias, align_corners, single;
  int64_t in, out;
  double scale; /* the user's scale factor for this axis (PyTorch's `scales`), 0 when a size was given */
} kg_interp_axis;

/* round to the index-math precision */
KG_INTERP_FN double kg_interp_r(const kg_interp_axis *a, double v) { return a->single ? (double)(float)v : v; }

/* source step per output step: area_pixel_compute_scale */
KG_INTERP_FN double kg_interp_step(const kg_interp_axis *a) {
  if (a->align_corners) return a->out > 1 ? kg_interp_r(a, (double)(a->in - 1) / (double)(a->out - 1)) : 0.0;
  if (a->scale > 0) return kg_interp_r(a, 1.0 / a->scale);
  return kg_interp_r(a, (double)a->in / (double)a->out);
}

/* bicubic convolution with PyTorch's A = -0.75 (OpenCV's), for |x| <= 1 and 1 < |x| < 2 */
KG_INTERP_FN double kg_cubic1(double x, double A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }
KG_INTERP_FN double kg_cubic2(double x, double A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }

/* the antialias filters: triangle for bilinear, Keys' cubic with a = -0.5 for bicubic (PyTorch
 * uses PIL's a here, not the -0.75 of the plain bicubic) */
KG_INTERP_FN double kg_interp_filter(int mode, double x) {
  x = fabs(x);
  if (mode == KG_INTERP_BILINEAR) return x < 1 ? 1 - x : 0;
  if (x < 1) return kg_cubic1(x, -0.5);
  if (x < 2) return kg_cubic2(x, -0.5);
  return 0;
}

/* antialias: the filter's centre and half-width in source coordinates */
KG_INTERP_FN void kg_interp_aa_geom(const kg_interp_axis *a, int64_t i, double *center, double *support,
                                    double *invscale) {
  double step = kg_interp_step(a), half = a->mode == KG_INTERP_BICUBIC ? 2.0 : 1.0;
  *support = kg_interp_r(a, step >= 1.0 ? half * step : half);
  *center = kg_interp_r(a, step * kg_interp_r(a, (double)i + 0.5));
  *invscale = step >= 1.0 ? kg_interp_r(a, 1.0 / step) : 1.0;
}

/* the plain (non-antialias) modes: base index and fraction (guard_index_and_lambda) */
KG_INTERP_FN void kg_interp_base(const kg_interp_axis *a, int64_t i, int64_t *idx, double *t) {
  double step = kg_interp_step(a), real;
  if (a->align_corners)
    real = kg_interp_r(a, step * (double)i);
  else {
    real = kg_interp_r(a, kg_interp_r(a, step * kg_interp_r(a, (double)i + 0.5)) - 0.5);
    if (a->mode == KG_INTERP_BILINEAR && real < 0) real = 0;
  }
  int64_t k = (int64_t)floor(real);
  if (k > a->in - 1) k = a->in - 1;
  double f = kg_interp_r(a, real - (double)k);
  *idx = k, *t = f < 0 ? 0 : f > 1 ? 1 : f;
}

/* nearest: PyTorch's nearest_idx (float index math whatever the dtype) */
KG_INTERP_FN int64_t kg_interp_nearest(const kg_interp_axis *a, int64_t i) {
  if (a->out == a->in) return i;
  if (a->out == 2 * a->in) return i >> 1;
  float s = a->scale > 0 ? (float)(1.0 / a->scale) : (float)a->in / (float)a->out;
  int64_t k = (int64_t)floorf((float)i * s);
  return k < a->in - 1 ? k : a->in - 1;
}

KG_INTERP_FN int64_t kg_interp_clamp(int64_t k, int64_t n) { return k < 0 ? 0 : k > n - 1 ? n - 1 : k; }

/* the window [lo, hi) that output index i reads; monotone in i (the CUDA backward relies on it) */
KG_INTERP_FN void kg_interp_bounds(const kg_interp_axis *a, int64_t i, int64_t *lo, int64_t *hi) {
  if (a->mode == KG_INTERP_NEAREST) {
    *lo = kg_interp_nearest(a, i), *hi = *lo + 1;
  } else if (a->antialias) {
    double c, sup, inv;
    kg_interp_aa_geom(a, i, &c, &sup, &inv);
    int64_t l = (int64_t)(c - sup + 0.5), h = (int64_t)(c + sup + 0.5);
    *lo = l > 0 ? l : 0, *hi = h < a->in ? h : a->in;
  } else {
    int64_t k;
    double t;
    kg_interp_base(a, i, &k, &t);
    if (a->mode == KG_INTERP_BILINEAR)
      *lo = k, *hi = (k < a->in - 1 ? k + 1 : k) + 1;
    else
      *lo = kg_interp_clamp(k - 1, a->in), *hi = kg_interp_clamp(k + 2, a->in) + 1;
  }
}

/* antialias weights are normalised to sum 1 over the window; the factor (1 for other modes) */
KG_INTERP_FN double kg_interp_norm(const kg_interp_axis *a, int64_t i, int64_t lo, int64_t hi) {
  if (a->mode == KG_INTERP_NEAREST || !a->antialias) return 1.0;
  double c, sup, inv, tot = 0;
  kg_interp_aa_geom(a, i, &c, &sup, &inv);
  for (int64_t j = lo; j < hi; j++)
    tot += kg_interp_r(a, kg_interp_filter(a->mode, kg_interp_r(a, ((double)j - c + 0.5) * inv)));
  return tot != 0 ? 1.0 / tot : 1.0;
}

/* weight of source index j (inside the window) for output index i */
KG_INTERP_FN double kg_interp_weight(const kg_interp_axis *a, int64_t i, int64_t j, double norm) {
  if (a->mode == KG_INTERP_NEAREST) return 1.0;
  if (a->antialias) {
    double c, sup, inv;
    kg_interp_aa_geom(a, i, &c, &sup, &inv);
    return kg_interp_r(a,
                       kg_interp_r(a, kg_interp_filter(a->mode, kg_interp_r(a, ((double)j - c + 0.5) * inv))) * norm);
  }
  int64_t k;
  double t, w = 0;
  kg_interp_base(a, i, &k, &t);
  if (a->mode == KG_INTERP_BILINEAR) {
    int64_t k1 = k < a->in - 1 ? k + 1 : k;
    if (j == k) w += kg_interp_r(a, 1.0 - t);
    if (j == k1) w += t;
    return w;
  }
  const double A = -0.75;
  double c[4] = {kg_cubic2(t + 1, A), kg_cubic1(t, A), kg_cubic1(1 - t, A), kg_cubic2(2 - t, A)};
  for (int q = 0; q < 4; q++)
    if (kg_interp_clamp(k - 1 + q, a->in) == j) w += kg_interp_r(a, c[q]);
  return w;
}

/* the output indices whose windows hold source index j (the CUDA backward's gather): windows
 * are monotone in the output index, so a contiguous range [first o with hi(o) > j, first o with
 * lo(o) > j), found by two binary searches (tests/c/test_interp.c checks it by brute force) */
KG_INTERP_FN void kg_interp_readers(const kg_interp_axis *a, int64_t j, int64_t *o0, int64_t *o1) {
  int64_t l = 0, r = a->out, lo, hi;
  while (l < r) {
    int64_t m = (l + r) / 2;
    kg_interp_bounds(a, m, &lo, &hi);
    if (hi > j)
      r = m;
    else
      l = m + 1;
  }
  *o0 = l;
  r = a->out;
  while (l < r) {
    int64_t m = (l + r) / 2;
    kg_interp_bounds(a, m, &lo, &hi);
    if (lo > j)
      r = m;
    else
      l = m + 1;
  }
  *o1 = l;
}

#endif
