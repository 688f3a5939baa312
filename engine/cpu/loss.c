/* loss.c (cpu) — cross_entropy forward and backward over rows of C classes.
 * logits: [N, C] viewed from [..., C] (any strides), targets: [N] integer 0-based,
 * lse: [N] per-row logsumexp, loss: scalar or [N]. Rows run in parallel; each row is loaded
 * into a float buffer (double for f64) and the logsumexp accumulates in double. Float rows use
 * the vector exp (kg_cpu_exp_f32, <= 1 ulp) and row reductions of rows_simd.h: with an LM head's
 * 32000 classes, libm's expf per element was most of the loss's time.
 * Contiguous f32, bf16 and f16 rows without class weights take the AVX-512 row kernels below
 * instead: they read the logits in their own dtype (widened in registers, no f32 copy of the
 * [B·T, V] logits), compute in f32 lanes with the sums added in double, and write the gradient
 * in the logits' dtype, as PyTorch's F.cross_entropy on bf16 logits (f32 inside, bf16 grad).
 * Class weights w [C] (optional) and label smoothing ε follow PyTorch: row loss
 * (1-ε)·w[t]·(lse - x[t]) + ε/C·Σc w[c]·(lse - x[c]), mean over Σ w[t] of the kept rows. */
#include "cpu.h"
#include "rows_simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* engine/ops/loss.c: the out-of-range target error, shared with the CUDA kernel */
kg_status kg_cross_entropy_range_error(const kg_tensor *logits, const kg_tensor *targets, int64_t row, long long value);

#if defined(__x86_64__) || defined(__i386__)
#define CE_X86 1
#endif

#ifdef CE_X86
#define CE512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define CE512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline
#define CE_BLOCK 1024 /* f32 lanes add CE_BLOCK/16 terms before their block's total goes to double */

/* AVX-512 F/BW/VL present and KENG_NO_SIMD=1 not set (the spec runs both paths) */
static bool ce_avx512(void) {
  static int have = -1; /* set once; a race writes the same value */
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return have == 1 && kg_cpu_simd() >= 2;
}

static bool ce_fast_dtype(kg_dtype dt) { return dt == KG_F32 || dt == KG_BF16 || dt == KG_F16; }

CE512_INLINE __mmask16 ce_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* 16 elements p[j..j+15] of dtype dt widened to f32 (exact); lanes outside k read as 0 */
CE512_INLINE __m512 ce_load16(const char *p, kg_dtype dt, int64_t j, __mmask16 k) {
  if (dt == KG_F32) return _mm512_maskz_loadu_ps(k, (const float *)p + j);
  __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)p + j);
  if (dt == KG_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16: the high half */
}

/* lanes k of v stored to p[j..] in dtype dt: bf16 nearest even with NaN kept quiet, exactly
 * kg_f32_to_bf16; f16 by the hardware's nearest-even conversion */
CE512_INLINE void ce_store16(char *p, kg_dtype dt, int64_t j, __mmask16 k, __m512 v) {
  if (dt == KG_F32) {
    _mm512_mask_storeu_ps((float *)p + j, k, v);
    return;
  }
  __m512i h;
  if (dt == KG_F16) {
    _mm256_mask_storeu_epi16((uint16_t *)p + j, k, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return;
  }
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  _mm256_mask_storeu_epi16((uint16_t *)p + j, k, _mm512_cvtepi32_epi16(h));
}

/* e^x: the formula of elementwise.c's exp8 (x = n·ln2 + r with a two-part ln2, the degree-7
 * Taylor polynomial on |r| <= ln2/2, <= 1 ulp), 2^n applied by scalef (subnormal results
 * rounded once, exactly 0 far below). NaN stays NaN (max/min pass their second operand). */
CE512_INLINE __m512 ce_exp16(__m512 x) {
  __m512 c = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), c));
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/* lse = max + log Σ exp(x - max) of one contiguous row x [C] (f32, bf16 or f16) as the buffered
 * path computes it: NaN when any x is NaN, a row of -inf shifts by 0; *sx = Σ x when sx. Two
 * passes over the row (max, then exp-sum), which stays in L2 between them. */
CE512 static double ce_lse16(const char *row, kg_dtype dt, int64_t C, double *sx) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  __mmask16 nan = 0;
  int64_t j = 0;
  for (; j + 32 <= C; j += 32) {
    __m512 a = ce_load16(row, dt, j, 0xffff), b = ce_load16(row, dt, j + 16, 0xffff);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, a), m1 = _mm512_max_ps(m1, b);
  }
  for (; j < C; j += 16) {
    __mmask16 k = ce_mask(C - j);
    __m512 a = ce_load16(row, dt, j, k);
    nan |= _mm512_mask_cmp_ps_mask(k, a, a, _CMP_UNORD_Q);
    m0 = _mm512_mask_max_ps(m0, k, m0, a);
  }
  if (nan) return NAN;
  float mx = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  if (mx == -INFINITY) mx = 0;
  __m512 mv = _mm512_set1_ps(mx);
  double sum = 0, s_x = 0;
  for (int64_t b = 0; b < C; b += CE_BLOCK) {
    int64_t e = C - b < CE_BLOCK ? C : b + CE_BLOCK;
    __m512 s = _mm512_setzero_ps(), t = s;
    for (j = b; j < e; j += 16) {
      __mmask16 k = ce_mask(e - j);
      __m512 v = ce_load16(row, dt, j, k);
      s = _mm512_mask_add_ps(s, k, s, ce_exp16(_mm512_sub_ps(v, mv)));
      if (sx) t = _mm512_add_ps(t, v); /* lanes outside k are 0 */
    }
    sum += _mm512_reduce_add_ps(s);
    s_x += _mm512_reduce_add_ps(t);
  }
  if (sx) *sx = s_x;
  return mx + log(sum);
}

/* d[j] = a·exp(x[j] - l) - off, minus tsub at j = t: one contiguous row of the gradient, read
 * from x in dt and written in ddt */
CE512 static void ce_grad16(char *d, kg_dtype ddt, const char *row, kg_dtype dt, int64_t C, float l, float a, float off,
                            int64_t t, float tsub) {
  __m512 lv = _mm512_set1_ps(l), av = _mm512_set1_ps(a), ov = _mm512_set1_ps(off);
  for (int64_t j = 0; j < C; j += 16) {
    __mmask16 k = ce_mask(C - j);
    __m512 v = _mm512_fmsub_ps(av, ce_exp16(_mm512_sub_ps(ce_load16(row, dt, j, k), lv)), ov);
    if ((uint64_t)(t - j) < 16) v = _mm512_mask_sub_ps(v, (__mmask16)(1u << (t - j)), v, _mm512_set1_ps(tsub));
    ce_store16(d, ddt, j, k, v);
  }
}
#else /* never called: ce_avx512() is false */
static bool ce_avx512(void) { return false; }
static bool ce_fast_dtype(kg_dtype dt) { (void)dt; return false; }
static double ce_lse16(const char *row, kg_dtype dt, int64_t C, double *sx) { return NAN; }
static void ce_grad16(char *d, kg_dtype ddt, const char *row, kg_dtype dt, int64_t C, float l, float a, float off,
                      int64_t t, float tsub) {}
#endif

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
  bool fast = xs == 1 && !wv && ce_fast_dtype(x->dtype) && ce_avx512(); /* the row kernels, no buffer */
#pragma omp parallel if (rows * C > KG_PAR_THRESHOLD && rows > 1) reduction(+ : total, kept)
  {
    void *buf = fast ? NULL : malloc((size_t)C * (wide ? sizeof(double) : sizeof(float)));
    if (!buf && !fast) failed = true;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < rows; o++) {
      if (!buf && !fast) continue;
      const char *row = xb + kg_cpu_reduce_row_offset(&px, o) * xe;
      int64_t t = (int64_t)kg_load_as_double(tb, tg->dtype, kg_cpu_reduce_row_offset(&pt, o));
      double mx = -INFINITY, sum = 0, xt = 0, dot = 0, l; /* dot = Σc w[c]·x[c], for smoothing */
      if (fast) {
        l = ce_lse16(row, x->dtype, C, eps > 0 ? &dot : NULL);
        if (t >= 0 && t < C) xt = kg_load_as_double(row, x->dtype, t);
      } else if (wide) {
        double *v = buf;
        kg_cpu_load_f64(v, row, x->dtype, xs, C);
        if (eps > 0)
          for (int64_t j = 0; j < C; j++) dot += (wv ? wv[j] : 1) * v[j];
        for (int64_t j = 0; j < C; j++) mx = v[j] > mx || v[j] != v[j] ? v[j] : mx;
        if (mx == -INFINITY) mx = 0;
        for (int64_t j = 0; j < C; j++) sum += exp(v[j] - mx);
        if (t >= 0 && t < C) xt = v[t];
        l = mx + log(sum);
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
        l = mx + log(sum);
      }
      double li = 0;
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
  if (bad_row >= 0) return kg_cross_entropy_range_error(x, tg, bad_row, (long long)bad);
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
  bool fast = xs == 1 && ds == 1 && !wv && ce_fast_dtype(x->dtype) && ce_fast_dtype(dx->dtype) && ce_avx512();
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
    if (fast) { /* without weights a = 1: dx = (p - (1-ε)·onehot(t) - ε/C)·w */
      if (w == 0)
        memset(drow, 0, (size_t)C * de); /* exact zeros, even for a row of NaN */
      else
        ce_grad16(drow, dx->dtype, row, x->dtype, C, (float)l, (float)w, (float)(eps / (double)C * w), t,
                  (float)((1 - eps) * w));
      continue;
    }
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
