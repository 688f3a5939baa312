/* loss.c (cpu) — cross_entropy forward and backward over rows of C classes.
 * logits: [N, C] viewed from [..., C] (any strides), targets: [N] integer 0-based,
 * lse: [N] per-row logsumexp, loss: scalar or [N]. Rows run in parallel; each row is loaded
 * into a float buffer (double for f64) and the logsumexp accumulates in double. Float rows use
 * the vector exp (kg_cpu_exp_f32, <= 1 ulp) and row reductions of rows_simd.h: with an LM head's
 * 32000 classes, libm's expf per element was most of the loss's time.
 * Class weights w [C] (optional) and label smoothing ε follow PyTorch: row loss
 * (1-ε)·w[t]·(lse - x[t]) + ε/C·Σc w[c]·(lse - x[c]), mean over Σ w[t] of the kept rows. */
#include "cpu.h"
#include "rows_simd.h"

#include <math.h>
#include <stdlib.h>

static bool ignored(const kg_loss_params *p, int64_t t) { return p->has_ignore && t == p->ignore_index; }

/* the class weights as doubles (*wv NULL without them) and their sum W (C without them) */
static kg_status load_weights(const kg_tensor *w, int64_t C, double **wv, double *W) {
  *wv = NULL;
  *W = (double)C;
  if (!w) return KG_OK;
  double *v = malloc((size_t)C * sizeof *v);
  if (!v) return kg_error(KG_ERR_OOM, "cross_entropy", "out of memory for %lld class weights", (long long)C);
  const char *b = kg_data(w);
  double sum = 0;
  for (int64_t j = 0; j < C; j++) sum += v[j] = kg_load_as_double(b, w->dtype, j * w->stride[0]);
  *wv = v;
  *W = sum;
  return KG_OK;
}

kg_status kg_cpu_cross_entropy(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *tg = c->in[1];
  kg_tensor *loss = c->out[0], *lse = c->out[1];
  const kg_loss_params *p = c->params;
  kg_cpu_reduce_plan px, pt;
  kg_cpu_reduce_layout(x, 1u << (x->ndim - 1), &px);
  kg_cpu_reduce_layout(tg, 0, &pt);
  int64_t C = px.rshape[0], xs = px.rstride[0], rows = px.nout;
  int xe = (int)kg_elem_size(x);
  const char *xb = kg_data(x), *tb = kg_data(tg);
  char *lb = kg_data(loss), *sb = kg_data(lse);
  bool wide = x->dtype == KG_F64, failed = false;
  int64_t bad = 0, bad_row = -1;
  double total = 0, kept = 0, eps = p->label_smoothing, *wv, W;
  KG_TRY(load_weights(c->nin > 2 ? c->in[2] : NULL, C, &wv, &W));
  bool plain = !wv && eps == 0; /* the one-hot loss: lse - x[t] */
#pragma omp parallel if (rows * C > KG_PAR_THRESHOLD && rows > 1) reduction(+ : total, kept)
  {
    void *buf = malloc((size_t)C * (wide ? sizeof(double) : sizeof(float)));
    if (!buf) failed = true;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < rows; o++) {
      if (!buf) continue;
      const char *row = xb + kg_cpu_reduce_row_offset(&px, o) * xe;
      int64_t t = (int64_t)kg_load_as_double(tb, tg->dtype, kg_cpu_reduce_row_offset(&pt, o));
      double mx = -INFINITY, sum = 0, xt = 0, dot = 0; /* dot = Σc w[c]·x[c], for smoothing */
      if (wide) {
        double *v = buf;
        kg_cpu_load_f64(v, row, x->dtype, xs, C);
        if (eps > 0)
          for (int64_t j = 0; j < C; j++) dot += (wv ? wv[j] : 1) * v[j];
        for (int64_t j = 0; j < C; j++) mx = v[j] > mx || v[j] != v[j] ? v[j] : mx;
        if (mx == -INFINITY) mx = 0;
        for (int64_t j = 0; j < C; j++) sum += exp(v[j] - mx);
        if (t >= 0 && t < C) xt = v[t];
      } else {
        float *v = buf;
        kg_cpu_load_f32(v, row, x->dtype, xs, C);
        if (eps > 0)
          for (int64_t j = 0; j < C; j++) dot += (wv ? wv[j] : 1) * (double)v[j];
        mx = kg_row_max_f32(v, C);
        if (mx == -INFINITY) mx = 0;
        if (t >= 0 && t < C) xt = v[t];
        float fm = (float)mx;
        for (int64_t j = 0; j < C; j++) v[j] -= fm;
        kg_cpu_exp_f32(v, v, C);
        sum = kg_row_sum_f32(v, C);
      }
      double l = mx + log(sum), li = 0;
      kg_store_from_double(sb, lse->dtype, o, l);
      if (!ignored(p, t)) {
        if (t < 0 || t >= C) {
#pragma omp critical(kg_ce_bad)
          if (bad_row < 0 || o < bad_row) bad_row = o, bad = t;
        } else if (plain) {
          li = l - xt;
          total += li;
          kept++;
        } else {
          double wt = wv ? wv[t] : 1;
          li = (1 - eps) * wt * (l - xt) + (eps > 0 ? eps / (double)C * (W * l - dot) : 0);
          total += li;
          kept += wt;
        }
      }
      if (p->reduction == KG_REDUCE_NONE) kg_store_from_double(lb, loss->dtype, o, li);
    }
    free(buf);
  }
  free(wv);
  if (failed) return kg_error(KG_ERR_OOM, "cross_entropy", "out of memory for a row of %lld classes", (long long)C);
  if (bad_row >= 0) {
    char b[KG_SHAPE_STR_MAX];
    return kg_error(KG_ERR_VALUE, "cross_entropy",
                    "target %lld (row %lld) is out of range for %lld classes (logits %s); targets are 0-based",
                    (long long)bad, (long long)bad_row, (long long)C, KG_SHAPE(x, b));
  }
  if (p->reduction == KG_REDUCE_SUM) kg_store_from_double(lb, loss->dtype, 0, total);
  if (p->reduction == KG_REDUCE_MEAN) kg_store_from_double(lb, loss->dtype, 0, kept != 0 ? total / kept : NAN);
  return KG_OK;
}

/* in: logits [N, C], targets [N], lse [N], g (scalar, or [N] for reduction none; any strides),
 * weight [C] or NULL. out: dlogits [N, C] = (a·p - (1-ε)·w[t]·onehot(t) - ε/C·w)·g / Σw[t]
 * (the divisor for mean only), p = exp(x - lse), a = (1-ε)·w[t] + ε/C·Σw */
kg_status kg_cpu_cross_entropy_backward(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *tg = c->in[1], *lse = c->in[2], *g = c->in[3];
  kg_tensor *dx = c->out[0];
  const kg_loss_params *p = c->params;
  kg_cpu_reduce_plan px, pd, pt, pg;
  kg_cpu_reduce_layout(x, 1u << (x->ndim - 1), &px);
  kg_cpu_reduce_layout(dx, 1u << (dx->ndim - 1), &pd);
  kg_cpu_reduce_layout(tg, 0, &pt);
  kg_cpu_reduce_layout(g, 0, &pg);
  int64_t C = px.rshape[0], xs = px.rstride[0], ds = pd.rstride[0], rows = px.nout;
  int xe = (int)kg_elem_size(x), de = (int)kg_elem_size(dx);
  const char *xb = kg_data(x), *tb = kg_data(tg), *sb = kg_data(lse), *gb = kg_data(g);
  char *db = kg_data(dx);
  bool per_row = p->reduction == KG_REDUCE_NONE;
  double scale = 1, eps = p->label_smoothing, *wv, W;
  KG_TRY(load_weights(c->nin > 4 ? c->in[4] : NULL, C, &wv, &W));
  bool plain = !wv && eps == 0;
  if (p->reduction == KG_REDUCE_MEAN) {
    double kept = 0;
    for (int64_t o = 0; o < rows; o++) {
      int64_t t = (int64_t)kg_load_as_double(tb, tg->dtype, kg_cpu_reduce_row_offset(&pt, o));
      if (!ignored(p, t)) kept += wv ? wv[t] : 1;
    }
    scale = kept != 0 ? 1.0 / kept : 0;
  }
  double g0 = per_row ? 0 : kg_load_as_double(gb, g->dtype, 0);
#pragma omp parallel for if (rows * C > KG_PAR_THRESHOLD && rows > 1) schedule(static)
  for (int64_t o = 0; o < rows; o++) {
    int64_t t = (int64_t)kg_load_as_double(tb, tg->dtype, kg_cpu_reduce_row_offset(&pt, o));
    double w = ignored(p, t) ? 0 : scale * (per_row ? kg_load_as_double(gb, g->dtype, kg_cpu_reduce_row_offset(&pg, o)) : g0);
    double l = kg_load_as_double(sb, lse->dtype, o);
    const char *row = xb + kg_cpu_reduce_row_offset(&px, o) * xe;
    char *drow = db + kg_cpu_reduce_row_offset(&pd, o) * de;
    if (!plain) { /* weights or smoothing: in double */
      double buf[KG_CHUNK], wt = w == 0 ? 0 : (wv ? wv[t] : 1), a = (1 - eps) * wt + eps * W / (double)C;
      for (int64_t j = 0; j < C; j += KG_CHUNK) {
        int64_t m = C - j < KG_CHUNK ? C - j : KG_CHUNK;
        kg_cpu_load_f64(buf, row + j * xs * xe, x->dtype, xs, m);
        for (int64_t i = 0; i < m; i++)
          buf[i] = w == 0 ? 0
                          : (a * exp(buf[i] - l) - (j + i == t ? (1 - eps) * wt : 0) -
                             eps / (double)C * (wv ? wv[j + i] : 1)) * w;
        kg_cpu_store_f64(drow + j * ds * de, dx->dtype, ds, buf, m);
      }
      continue;
    }
    if (x->dtype == KG_F64 || dx->dtype == KG_F64) {
      double buf[KG_CHUNK];
      for (int64_t j = 0; j < C; j += KG_CHUNK) {
        int64_t m = C - j < KG_CHUNK ? C - j : KG_CHUNK;
        kg_cpu_load_f64(buf, row + j * xs * xe, x->dtype, xs, m);
        for (int64_t i = 0; i < m; i++) buf[i] = w == 0 ? 0 : (exp(buf[i] - l) - (j + i == t)) * w;
        kg_cpu_store_f64(drow + j * ds * de, dx->dtype, ds, buf, m);
      }
      continue;
    }
    float buf[KG_CHUNK], fl = (float)l, fw = (float)w;
    for (int64_t j = 0; j < C; j += KG_CHUNK) {
      int64_t m = C - j < KG_CHUNK ? C - j : KG_CHUNK;
      if (w == 0) {
        for (int64_t i = 0; i < m; i++) buf[i] = 0;
      } else {
        kg_cpu_load_f32(buf, row + j * xs * xe, x->dtype, xs, m);
        for (int64_t i = 0; i < m; i++) buf[i] -= fl;
        kg_cpu_exp_f32(buf, buf, m);
        for (int64_t i = 0; i < m; i++) buf[i] *= fw;
        if (t >= j && t < j + m) buf[t - j] -= fw;
      }
      kg_cpu_store_f32(drow + j * ds * de, dx->dtype, ds, buf, m);
    }
  }
  free(wv);
  return KG_OK;
}
