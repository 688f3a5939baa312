/* norm.c (cpu) — layer_norm, rms_norm, group_norm and their fused backward kernels.
 *
 * All three share one layout: the (contiguous) input is `rows` rows of M elements, one mean/rstd
 * per row; a row is cpg channel blocks of S contiguous elements, block k being channel
 * (r % G) * cpg + k. Layer/rms norm over [N, C]: rows = N, G = 1, cpg = C, S = 1. Group norm over
 * [B, C, *] with G groups: rows = B * G, cpg = C / G, S = the spatial size.
 *
 *   forward   y = (x - mean) * rstd * w[c] + b[c]       (rms: mean = 0, no b, w -> 1 + w if unit_offset)
 *   backward  xhat = (x - mean) * rstd, gw = dy * w[c]
 *             dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))   (rms: no mean(gw) term)
 *             dw[c] = sum dy * xhat, db[c] = sum dy               (over rows and spatial positions)
 *
 * Values are stored in the tensors' dtypes and computed in f32 (f64 for f64 input); the row
 * sums accumulate in double (f32: over float lanes per block, the blocks added in double). Rows
 * run in parallel; dw/db use per-thread partial sums in double.
 *
 * f32 / bf16 / f16 tensors (all of one dtype) take the direct kernels at the end of the file
 * (rows in place, or one float row buffer for the half types; rows_simd.h sums); f64 and mixed
 * dtypes the buffered ones. KENG_NORM_DIRECT=0 forces the buffered kernels (lab_rows compares).
 */
#include "cpu.h"
#include "rows_simd.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
  int64_t rows, M, S, cpg, G;
  bool center;      /* subtract the mean (layer/group norm) */
  bool unit_offset; /* scale by 1 + w (rms norm) */
  double eps;
} norm_plan;

static norm_plan plan_of(const kg_tensor *x, const kg_norm_params *p, bool group, bool center) {
  norm_plan q = {0};
  q.center = center;
  q.unit_offset = p->unit_offset;
  q.eps = p->eps;
  int nd = x->ndim;
  if (group) {
    q.G = p->groups;
    q.cpg = x->shape[1] / q.G;
    q.S = 1;
    for (int d = 2; d < nd; d++) q.S *= x->shape[d];
    q.rows = x->shape[0] * q.G;
  } else {
    q.G = 1;
    q.cpg = x->shape[nd - 1];
    q.S = 1;
    q.rows = 1;
    for (int d = 0; d < nd - 1; d++) q.rows *= x->shape[d];
  }
  q.M = q.cpg * q.S;
  return q;
}


/* ---- row sums: float lanes, blocks added in double --------------------------------------------
 * A double accumulator per element is one long dependency chain (4 cycles an add); 8 float
 * lanes over blocks of NORM_BLOCK elements, each block's total added in double, vectorise and
 * keep the rounding of a block's float sum to ~NORM_BLOCK/8 additions. double rows keep the
 * plain loop. */
#define NORM_BLOCK 128

static double sum_block_f32(const float *v, int64_t n) {
  float lane[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) lane[k] += v[i + k];
  double s = 0;
  for (; i < n; i++) s += v[i];
  for (int k = 0; k < 8; k++) s += lane[k];
  return s;
}

/* sum v[i] */
static double row_sum_f32(const float *v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i += NORM_BLOCK) s += sum_block_f32(v + i, n - i < NORM_BLOCK ? n - i : NORM_BLOCK);
  return s;
}
static double row_sum_f64(const double *v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  return s;
}

/* sum (v[i] - m)^2 */
static double row_ss_f32(const float *v, int64_t n, float m) {
  double s = 0;
  for (int64_t i0 = 0; i0 < n; i0 += NORM_BLOCK) {
    int64_t e = n - i0 < NORM_BLOCK ? n - i0 : NORM_BLOCK, i = 0;
    float lane[8] = {0};
    const float *b = v + i0;
    for (; i + 8 <= e; i += 8)
      for (int k = 0; k < 8; k++) lane[k] += (b[i + k] - m) * (b[i + k] - m);
    for (; i < e; i++) s += (double)(b[i] - m) * (b[i] - m);
    for (int k = 0; k < 8; k++) s += lane[k];
  }
  return s;
}
static double row_ss_f64(const double *v, int64_t n, double m) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
  return s;
}

/* over one channel block: *aw = sum g[i] * xhat[i], *ab = sum g[i], writing xhat into x */
static void chan_sums_f32(float *x, const float *g, int64_t n, float mean, float rstd, double *aw, double *ab) {
  double sw = 0, sb = 0;
  for (int64_t i0 = 0; i0 < n; i0 += NORM_BLOCK) {
    int64_t e = n - i0 < NORM_BLOCK ? n - i0 : NORM_BLOCK, i = 0;
    float lw[8] = {0}, lb[8] = {0};
    float *xb = x + i0;
    const float *gb = g + i0;
    for (; i + 8 <= e; i += 8)
      for (int k = 0; k < 8; k++) {
        float xh = (xb[i + k] - mean) * rstd;
        xb[i + k] = xh;
        lw[k] += gb[i + k] * xh;
        lb[k] += gb[i + k];
      }
    for (; i < e; i++) {
      float xh = (xb[i] - mean) * rstd;
      xb[i] = xh;
      sw += (double)gb[i] * xh;
      sb += gb[i];
    }
    for (int k = 0; k < 8; k++) sw += lw[k], sb += lb[k];
  }
  *aw = sw, *ab = sb;
}
static void chan_sums_f64(double *x, const double *g, int64_t n, double mean, double rstd, double *aw, double *ab) {
  double sw = 0, sb = 0;
  for (int64_t i = 0; i < n; i++) {
    double xh = (x[i] - mean) * rstd;
    x[i] = xh;
    sw += g[i] * xh;
    sb += g[i];
  }
  *aw = sw, *ab = sb;
}

#define NORM_KERNELS(T, SFX)                                                                         \
  /* t[c] + add for c < C, or def everywhere when t is NULL; malloc'ed */                            \
  static T *vec_##SFX(const kg_tensor *t, int64_t C, T def, T add) {                                 \
    T *v = malloc(sizeof(T) * (size_t)(C ? C : 1));                                                  \
    if (!v) return NULL;                                                                             \
    if (t) kg_cpu_load_##SFX(v, kg_data(t), t->dtype, 1, C);                                         \
    for (int64_t c = 0; c < C; c++) v[c] = t ? v[c] + add : def;                                     \
    return v;                                                                                        \
  }                                                                                                  \
                                                                                                     \
  static T stat_##SFX(const kg_tensor *t, int64_t r) {                                               \
    T v;                                                                                             \
    kg_cpu_load_##SFX(&v, (const char *)kg_data(t) + r * (int64_t)kg_elem_size(t), t->dtype, 1, 1);  \
    return v;                                                                                        \
  }                                                                                                  \
  static void put_##SFX(kg_tensor *t, int64_t r, T v) {                                              \
    kg_cpu_store_##SFX((char *)kg_data(t) + r * (int64_t)kg_elem_size(t), t->dtype, 1, &v, 1);       \
  }                                                                                                  \
                                                                                                     \
  /* in = {x, w, b}; out = {y, mean, rstd} (centred) or {y, rstd} */                                 \
  static kg_status forward_##SFX(const kg_op_call *c, const norm_plan *q) {                          \
    const kg_tensor *x = c->in[0];                                                                   \
    kg_tensor *y = c->out[0], *smean = q->center ? c->out[1] : NULL, *srstd = c->out[q->center ? 2 : 1]; \
    int64_t C = q->cpg * q->G;                                                                       \
    T *wv = vec_##SFX(c->in[1], C, 1, q->unit_offset ? 1 : 0), *bv = vec_##SFX(c->in[2], C, 0, 0);   \
    int oom = !wv || !bv;                                                                            \
    const char *xd = kg_data(x);                                                                     \
    char *yd = kg_data(y);                                                                           \
    int64_t xes = (int64_t)kg_elem_size(x), yes = (int64_t)kg_elem_size(y);                          \
    bool par = q->rows * q->M > KG_PAR_THRESHOLD && q->rows > 1;                                     \
    _Pragma("omp parallel if (par && !oom)") {                                                       \
      T *buf = oom ? NULL : malloc(sizeof(T) * (size_t)(q->M ? q->M : 1));                           \
      if (!buf) { _Pragma("omp atomic write") oom = 1; }                                               \
      _Pragma("omp for schedule(static)") for (int64_t r = 0; r < q->rows; r++) {                    \
        if (!buf) continue;                                                                          \
        kg_cpu_load_##SFX(buf, xd + r * q->M * xes, x->dtype, 1, q->M);                              \
        T mean = q->center ? (T)(row_sum_##SFX(buf, q->M) / (double)q->M) : 0;                       \
        double ss = row_ss_##SFX(buf, q->M, mean);                                                   \
        T rstd = (T)(1.0 / sqrt(ss / (double)q->M + q->eps));                                        \
        int64_t c0 = (r % q->G) * q->cpg;                                                            \
        for (int64_t k = 0; k < q->cpg; k++) {                                                       \
          T sc = wv[c0 + k] * rstd, sh = bv[c0 + k], *v = buf + k * q->S;                            \
          for (int64_t s = 0; s < q->S; s++) v[s] = (v[s] - mean) * sc + sh;                        \
        }                                                                                            \
        kg_cpu_store_##SFX(yd + r * q->M * yes, y->dtype, 1, buf, q->M);                             \
        if (smean) put_##SFX(smean, r, mean);                                                        \
        put_##SFX(srstd, r, rstd);                                                                   \
      }                                                                                              \
      free(buf);                                                                                     \
    }                                                                                                \
    free(wv);                                                                                        \
    free(bv);                                                                                        \
    return oom ? kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for row buffers") : KG_OK; \
  }                                                                                                  \
                                                                                                     \
  /* in = {dy, x, w, mean, rstd} (centred) or {dy, x, w, rstd}; out = {dx, dw[, db]} */             \
  static kg_status backward_##SFX(const kg_op_call *c, const norm_plan *q) {                         \
    const kg_tensor *g = c->in[0], *x = c->in[1];                                                    \
    const kg_tensor *smean = q->center ? c->in[3] : NULL, *srstd = c->in[q->center ? 4 : 3];         \
    kg_tensor *dx = c->out[0];                                                                       \
    int64_t C = q->cpg * q->G;                                                                       \
    T *wv = vec_##SFX(c->in[2], C, 1, q->unit_offset ? 1 : 0);                                       \
    double *dw = calloc((size_t)C + 1, sizeof(double)), *db = calloc((size_t)C + 1, sizeof(double)); \
    int oom = !wv || !dw || !db;                                                                     \
    const char *xd = kg_data(x), *gd = kg_data(g);                                                   \
    char *dd = kg_data(dx);                                                                          \
    int64_t xes = (int64_t)kg_elem_size(x), ges = (int64_t)kg_elem_size(g), des = (int64_t)kg_elem_size(dx); \
    bool par = q->rows * q->M > KG_PAR_THRESHOLD && q->rows > 1;                                     \
    _Pragma("omp parallel if (par && !oom)") {                                                       \
      T *xb = oom ? NULL : malloc(sizeof(T) * (size_t)(q->M ? q->M : 1));                            \
      T *gb = oom ? NULL : malloc(sizeof(T) * (size_t)(q->M ? q->M : 1));                            \
      double *pw = oom ? NULL : calloc((size_t)C + 1, sizeof(double));                               \
      double *pb = oom ? NULL : calloc((size_t)C + 1, sizeof(double));                               \
      bool ok = xb && gb && pw && pb;                                                                \
      if (!ok) { _Pragma("omp atomic write") oom = 1; }                                                \
      _Pragma("omp for schedule(static)") for (int64_t r = 0; r < q->rows; r++) {                    \
        if (!ok) continue;                                                                           \
        kg_cpu_load_##SFX(xb, xd + r * q->M * xes, x->dtype, 1, q->M);                               \
        kg_cpu_load_##SFX(gb, gd + r * q->M * ges, g->dtype, 1, q->M);                               \
        T mean = smean ? stat_##SFX(smean, r) : 0, rstd = stat_##SFX(srstd, r);                      \
        int64_t c0 = (r % q->G) * q->cpg;                                                            \
        double sa = 0, sb = 0; /* sum gw, sum gw * xhat */                                           \
        for (int64_t k = 0; k < q->cpg; k++) {                                                       \
          double aw = 0, ab = 0;                                                                     \
          T wc = wv[c0 + k];                                                                         \
          if (q->S == 1) { /* layer/rms norm: one element per channel */                             \
            T xh = (xb[k] - mean) * rstd;                                                            \
            xb[k] = xh;                                                                              \
            aw = (double)gb[k] * xh;                                                                 \
            ab = gb[k];                                                                              \
          } else {                                                                                   \
            chan_sums_##SFX(xb + k * q->S, gb + k * q->S, q->S, mean, rstd, &aw, &ab);               \
          }                                                                                          \
          pw[c0 + k] += aw;                                                                          \
          pb[c0 + k] += ab;                                                                          \
          sa += ab * wc;                                                                             \
          sb += aw * wc;                                                                             \
        }                                                                                            \
        T A = q->center ? (T)(sa / (double)q->M) : 0, B = (T)(sb / (double)q->M);                    \
        for (int64_t k = 0; k < q->cpg; k++) {                                                       \
          T wc = wv[c0 + k], *xv = xb + k * q->S, *gv = gb + k * q->S;                               \
          for (int64_t s = 0; s < q->S; s++) gv[s] = rstd * (gv[s] * wc - A - xv[s] * B);           \
        }                                                                                            \
        kg_cpu_store_##SFX(dd + r * q->M * des, dx->dtype, 1, gb, q->M);                             \
      }                                                                                              \
      if (ok) {                                                                                      \
        _Pragma("omp critical") for (int64_t i = 0; i < C; i++) {                                    \
          dw[i] += pw[i];                                                                            \
          db[i] += pb[i];                                                                            \
        }                                                                                            \
      }                                                                                              \
      free(xb);                                                                                      \
      free(gb);                                                                                      \
      free(pw);                                                                                      \
      free(pb);                                                                                      \
    }                                                                                                \
    if (!oom) {                                                                                      \
      kg_cpu_store_f64(kg_data(c->out[1]), c->out[1]->dtype, 1, dw, C);                              \
      if (c->nout > 2) kg_cpu_store_f64(kg_data(c->out[2]), c->out[2]->dtype, 1, db, C);             \
    }                                                                                                \
    free(wv);                                                                                        \
    free(dw);                                                                                        \
    free(db);                                                                                        \
    return oom ? kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for row buffers") : KG_OK; \
  }

NORM_KERNELS(float, f32)
NORM_KERNELS(double, f64)

/* ---- direct path: f32 x and y (dy and dx), read and written in place ---------------------------
 * The buffered kernels above copy each row into a float buffer and walk it per channel (S = 1
 * for layer/rms norm, so the inner loop ran one element at a time and did not vectorise). Here
 * the statistics are two passes over the row where it lies (sum, then squared deviations: the
 * row stays in L1/L2 and the two-pass variance does not cancel), with rows_simd.h's float lanes
 * per block and block totals in double; the scale/shift loops are plain and vectorise. */

/* forward of row r: y = (x - mean) * (w[c] * rstd) + b[c] */
static void forward_row_f32(float *y, const float *x, const norm_plan *q, const float *wv, const float *bv, int64_t r,
                            float *mean_out, float *rstd_out) {
  int64_t M = q->M, S = q->S, c0 = (r % q->G) * q->cpg;
  float mean = q->center ? (float)(kg_row_sum_f32(x, M) / (double)M) : 0;
  float rstd = (float)(1.0 / sqrt(kg_row_ss_f32(x, M, mean) / (double)M + q->eps));
  if (S == 1) {
    const float *w = wv + c0, *b = bv + c0;
    for (int64_t k = 0; k < M; k++) y[k] = (x[k] - mean) * (w[k] * rstd) + b[k];
  } else {
    for (int64_t k = 0; k < q->cpg; k++) {
      float sc = wv[c0 + k] * rstd, sh = bv[c0 + k];
      const float *xv = x + k * S;
      float *yv = y + k * S;
      for (int64_t s = 0; s < S; s++) yv[s] = (xv[s] - mean) * sc + sh;
    }
  }
  *mean_out = mean, *rstd_out = rstd;
}

/* backward of row r; adds this row's dw, db terms into pw, pb (layer/rms norm: into the float
 * partials fw, fb, which the caller flushes into pw, pb every NORM_FLUSH rows) */
static void backward_row_f32(float *dx, const float *g, const float *x, const norm_plan *q, const float *wv, float mean,
                             float rstd, int64_t r, double *pw, double *pb, float *fw, float *fb) {
  int64_t M = q->M, S = q->S, c0 = (r % q->G) * q->cpg;
  double sa = 0, sb = 0; /* sum gw, sum gw * xhat */
  float xh[ROWS_BLOCK], gw[ROWS_BLOCK];
  if (S == 1) {
    const float *w = wv + c0;
    float *dw = fw + c0, *db = fb + c0;
    for (int64_t i = 0; i < M; i += ROWS_BLOCK) {
      int64_t m = M - i < ROWS_BLOCK ? M - i : ROWS_BLOCK;
      for (int64_t j = 0; j < m; j++) {
        xh[j] = (x[i + j] - mean) * rstd;
        gw[j] = g[i + j] * w[i + j];
        dw[i + j] += g[i + j] * xh[j];
        db[i + j] += g[i + j];
      }
      sa += kg_rows_block(gw, NULL, 0, false, m);
      sb += kg_rows_block(gw, xh, 0, false, m);
    }
  } else {
    for (int64_t k = 0; k < q->cpg; k++) {
      const float *xv = x + k * S, *gv = g + k * S;
      double aw = 0, ab = 0; /* sum g * xhat = rstd * sum g (x - mean), sum g over the channel block */
      for (int64_t i = 0; i < S; i += ROWS_BLOCK) {
        int64_t m = S - i < ROWS_BLOCK ? S - i : ROWS_BLOCK;
        aw += kg_rows_block(gv + i, xv + i, mean, false, m);
        ab += kg_rows_block(gv + i, NULL, 0, false, m);
      }
      aw *= rstd;
      float wc = wv[c0 + k];
      pw[c0 + k] += aw;
      pb[c0 + k] += ab;
      sa += ab * wc;
      sb += aw * wc;
    }
  }
  float A = q->center ? (float)(sa / (double)M) : 0, B = (float)(sb / (double)M);
  if (S == 1) {
    const float *w = wv + c0;
    for (int64_t k = 0; k < M; k++) dx[k] = rstd * (g[k] * w[k] - A - ((x[k] - mean) * rstd) * B);
  } else {
    for (int64_t k = 0; k < q->cpg; k++) {
      float wc = wv[c0 + k];
      const float *xv = x + k * S, *gv = g + k * S;
      float *dv = dx + k * S;
      for (int64_t s = 0; s < S; s++) dv[s] = rstd * (gv[s] * wc - A - ((xv[s] - mean) * rstd) * B);
    }
  }
}

/* x, y f32: rows in place; bf16 / f16: each row converted into a float buffer and back */
static kg_status forward_direct_f32(const kg_op_call *c, const norm_plan *q) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0], *smean = q->center ? c->out[1] : NULL, *srstd = c->out[q->center ? 2 : 1];
  int64_t C = q->cpg * q->G, M = q->M;
  float *wv = vec_f32(c->in[1], C, 1, q->unit_offset ? 1 : 0), *bv = vec_f32(c->in[2], C, 0, 0);
  int oom = !wv || !bv;
  bool conv = x->dtype != KG_F32;
  const char *xd = kg_data(x);
  char *yd = kg_data(y);
  int64_t es = (int64_t)kg_elem_size(x);
  bool par = q->rows * M > KG_PAR_THRESHOLD && q->rows > 1;
  _Pragma("omp parallel if (par && !oom)") {
    float *buf = conv && !oom ? malloc(sizeof(float) * (size_t)(M ? M : 1)) : NULL;
    bool ok = !oom && (!conv || buf);
    if (!ok) { _Pragma("omp atomic write") oom = 1; }
    _Pragma("omp for schedule(static)") for (int64_t r = 0; r < q->rows; r++) {
      if (!ok) continue;
      float mean, rstd;
      if (conv) {
        kg_cpu_load_f32(buf, xd + r * M * es, x->dtype, 1, M);
        forward_row_f32(buf, buf, q, wv, bv, r, &mean, &rstd);
        kg_cpu_store_f32(yd + r * M * es, y->dtype, 1, buf, M);
      } else {
        forward_row_f32((float *)yd + r * M, (const float *)xd + r * M, q, wv, bv, r, &mean, &rstd);
      }
      if (smean) put_f32(smean, r, mean);
      put_f32(srstd, r, rstd);
    }
    free(buf);
  }
  free(wv);
  free(bv);
  return oom ? kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for row buffers") : KG_OK;
}

/* layer/rms norm add dw, db terms per element: into float partials (a double add per element
 * was a third of the backward), moved into the double sums every NORM_FLUSH rows, so a float
 * partial adds at most NORM_FLUSH terms */
#define NORM_FLUSH 16
static void flush_partials(float *fw, float *fb, double *pw, double *pb, int64_t C) {
  for (int64_t i = 0; i < C; i++) {
    pw[i] += fw[i], pb[i] += fb[i];
    fw[i] = 0, fb[i] = 0;
  }
}

/* dy, x, dx f32: rows in place; bf16 / f16 (all three the same dtype): converted per row */
static kg_status backward_direct_f32(const kg_op_call *c, const norm_plan *q) {
  const kg_tensor *smean = q->center ? c->in[3] : NULL, *srstd = c->in[q->center ? 4 : 3];
  const kg_tensor *g = c->in[0], *x = c->in[1];
  int64_t C = q->cpg * q->G, M = q->M;
  float *wv = vec_f32(c->in[2], C, 1, q->unit_offset ? 1 : 0);
  double *dw = calloc((size_t)C + 1, sizeof(double)), *db = calloc((size_t)C + 1, sizeof(double));
  int oom = !wv || !dw || !db;
  bool conv = x->dtype != KG_F32;
  const char *gd = kg_data(g), *xd = kg_data(x);
  char *dd = kg_data(c->out[0]);
  int64_t es = (int64_t)kg_elem_size(x);
  bool par = q->rows * M > KG_PAR_THRESHOLD && q->rows > 1;
  _Pragma("omp parallel if (par && !oom)") {
    double *pw = oom ? NULL : calloc((size_t)C + 1, sizeof(double));
    double *pb = oom ? NULL : calloc((size_t)C + 1, sizeof(double));
    float *gb = conv && !oom ? malloc(sizeof(float) * (size_t)(2 * M + 1)) : NULL, *xb = gb ? gb + M : NULL;
    float *fw = oom ? NULL : calloc((size_t)(2 * C + 1), sizeof(float)), *fb = fw ? fw + C : NULL;
    int since_flush = 0;
    bool ok = pw && pb && fw && (!conv || gb);
    if (!ok) { _Pragma("omp atomic write") oom = 1; }
    _Pragma("omp for schedule(static)") for (int64_t r = 0; r < q->rows; r++) {
      if (!ok) continue;
      float mean = smean ? stat_f32(smean, r) : 0, rstd = stat_f32(srstd, r);
      if (conv) {
        kg_cpu_load_f32(gb, gd + r * M * es, g->dtype, 1, M);
        kg_cpu_load_f32(xb, xd + r * M * es, x->dtype, 1, M);
        backward_row_f32(gb, gb, xb, q, wv, mean, rstd, r, pw, pb, fw, fb);
        kg_cpu_store_f32(dd + r * M * es, c->out[0]->dtype, 1, gb, M);
      } else {
        backward_row_f32((float *)dd + r * M, (const float *)gd + r * M, (const float *)xd + r * M, q, wv, mean, rstd, r,
                         pw, pb, fw, fb);
      }
      if (++since_flush == NORM_FLUSH) flush_partials(fw, fb, pw, pb, C), since_flush = 0;
    }
    if (ok) {
      flush_partials(fw, fb, pw, pb, C);
      _Pragma("omp critical") for (int64_t i = 0; i < C; i++) {
        dw[i] += pw[i];
        db[i] += pb[i];
      }
    }
    free(pw);
    free(pb);
    free(gb);
    free(fw);
  }
  if (!oom) {
    kg_cpu_store_f64(kg_data(c->out[1]), c->out[1]->dtype, 1, dw, C);
    if (c->nout > 2) kg_cpu_store_f64(kg_data(c->out[2]), c->out[2]->dtype, 1, db, C);
  }
  free(wv);
  free(dw);
  free(db);
  return oom ? kg_error(KG_ERR_OOM, kg_op_info[c->op].name, "out of memory for row buffers") : KG_OK;
}

/* KENG_NORM_DIRECT=0 forces the buffered path (the kernel lab compares both) */
static bool direct_enabled(void) { return kg_env_bool(KG_ENV_KENG_NORM_DIRECT); }

/* float, bf16 or f16, all of ts the same dtype */
static bool direct_dtypes(const kg_tensor *const *ts, int n) {
  kg_dtype dt = ts[0]->dtype;
  if (dt != KG_F32 && dt != KG_BF16 && dt != KG_F16) return false;
  for (int i = 1; i < n; i++)
    if (ts[i]->dtype != dt) return false;
  return direct_enabled();
}

static kg_status forward(const kg_op_call *c, bool group, bool center) {
  norm_plan q = plan_of(c->in[0], c->params, group, center);
  if (direct_dtypes((const kg_tensor *[]){c->in[0], c->out[0]}, 2)) return forward_direct_f32(c, &q);
  return c->in[0]->dtype == KG_F64 ? forward_f64(c, &q) : forward_f32(c, &q);
}
static kg_status backward(const kg_op_call *c, bool group, bool center) {
  norm_plan q = plan_of(c->in[1], c->params, group, center);
  if (direct_dtypes((const kg_tensor *[]){c->in[0], c->in[1], c->out[0]}, 3)) return backward_direct_f32(c, &q);
  return c->in[1]->dtype == KG_F64 ? backward_f64(c, &q) : backward_f32(c, &q);
}

kg_status kg_cpu_layer_norm(const kg_op_call *c) { return forward(c, false, true); }
kg_status kg_cpu_rms_norm(const kg_op_call *c) { return forward(c, false, false); }
kg_status kg_cpu_group_norm(const kg_op_call *c) { return forward(c, true, true); }
kg_status kg_cpu_layer_norm_backward(const kg_op_call *c) { return backward(c, false, true); }
kg_status kg_cpu_rms_norm_backward(const kg_op_call *c) { return backward(c, false, false); }
kg_status kg_cpu_group_norm_backward(const kg_op_call *c) { return backward(c, true, true); }
