/* reduce.c (cpu) — sum over any set of dims, accumulating in double; max/min/argmax/argmin,
 * cumsum and topk along one dim. A contiguous sum over leading dims adds whole rows
 * (sum_leading) instead of walking strided columns.
 *
 * The input is viewed as [kept dims..., reduced dims...]; each output element (parallel over
 * them) walks its reduced elements in runs along the innermost reduced dim. Along-one-dim ops
 * treat each kept position as a row of N elements (N = the dim's size, any stride); max / min /
 * argmax / argmin on rows contiguous along the dim in f32 or bf16 take select_row_f32 (8-lane
 * extremes), bf16 rows with AVX-512 BW select_row_bf16_z (32 lanes on the bf16 bits);
 * KENG_SELECT_DIRECT=0 forces the general loop. */
#include "cpu.h"
#include "rows_simd.h"

#include <keng/scalar.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Splits x's dims by mask into kept (outer) and reduced (inner) shapes/strides. */
void kg_cpu_reduce_layout(const kg_tensor *x, uint32_t mask, kg_cpu_reduce_plan *p) {
  p->nk = p->nr = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask & (1u << d)) {
      p->rshape[p->nr] = x->shape[d];
      p->rstride[p->nr++] = x->stride[d];
    } else {
      p->kshape[p->nk] = x->shape[d];
      p->kstride[p->nk++] = x->stride[d];
    }
  }
  p->nout = 1;
  for (int i = 0; i < p->nk; i++) p->nout *= p->kshape[i];
  p->nred = 1;
  for (int i = 0; i < p->nr; i++) p->nred *= p->rshape[i];
}

int64_t kg_cpu_reduce_row_offset(const kg_cpu_reduce_plan *p, int64_t o) {
  int64_t off = 0;
  for (int i = p->nk - 1; i >= 0; i--) {
    off += (o % p->kshape[i]) * p->kstride[i];
    o /= p->kshape[i];
  }
  return off;
}

void kg_cpu_reduce_walk(const kg_cpu_reduce_plan *p, const char *base, kg_dtype dt, int64_t row_off,
                        void (*fn)(void *ctx, const double *v, int64_t start, int64_t n), void *ctx) {
  int es = kg_dtype_info[dt].size;
  double buf[KG_CHUNK];
  if (p->nr == 0) {
    kg_cpu_load_f64(buf, base + row_off * es, dt, 1, 1);
    fn(ctx, buf, 0, 1);
    return;
  }
  int last = p->nr - 1;
  int64_t inner = p->rshape[last], istride = p->rstride[last], outer = p->nred / (inner ? inner : 1);
  for (int64_t r = 0; r < outer; r++) {
    int64_t off = row_off, rem = r;
    for (int i = last - 1; i >= 0; i--) {
      off += (rem % p->rshape[i]) * p->rstride[i];
      rem /= p->rshape[i];
    }
    for (int64_t j = 0; j < inner; j += KG_CHUNK) {
      int64_t m = inner - j < KG_CHUNK ? inner - j : KG_CHUNK;
      kg_cpu_load_f64(buf, base + (off + j * istride) * es, dt, istride, m);
      fn(ctx, buf, r * inner + j, m);
    }
  }
}

static void add_run(void *ctx, const double *v, int64_t start, int64_t n) {
  (void)start;
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  *(double *)ctx += s;
}

/* x contiguous and reduced over its leading dims only (a bias gradient: [B, T, C] -> [C]): x
 * is [R, N] row-major and out[j] = sum_r x[r, j]. Walking each output's column would gather
 * with a stride of N; instead rows are added into double accumulators, a block of columns per
 * thread (the same additions in the same order as the column walk, so the same result). */
#define SUM_COLS 512
static bool sum_leading(const kg_tensor *x, uint32_t mask, kg_tensor *o) {
  int k = 0;
  while (k < x->ndim && (mask & (1u << k))) k++;
  if (k == 0 || k == x->ndim || (mask >> k) != 0 || !kg_is_contiguous(x)) return false;
  int64_t N = 1, R = 1;
  for (int d = 0; d < x->ndim; d++) {
    if (d < k) R *= x->shape[d];
    else N *= x->shape[d];
  }
  if (N < 8 || R < 2) return false; /* few columns: the column walk is as good */
  const char *base = kg_data(x);
  int es = kg_dtype_info[x->dtype].size;
  int64_t nblk = (N + SUM_COLS - 1) / SUM_COLS;
#pragma omp parallel for if (R * N > KG_PAR_THRESHOLD && nblk > 1) schedule(static)
  for (int64_t b = 0; b < nblk; b++) {
    int64_t j0 = b * SUM_COLS, m = N - j0 < SUM_COLS ? N - j0 : SUM_COLS;
    double acc[SUM_COLS], row[SUM_COLS];
    for (int64_t j = 0; j < m; j++) acc[j] = 0;
    for (int64_t r = 0; r < R; r++) {
      kg_cpu_load_f64(row, base + (r * N + j0) * es, x->dtype, 1, m);
      for (int64_t j = 0; j < m; j++) acc[j] += row[j];
    }
    for (int64_t j = 0; j < m; j++) kg_store_from_double(kg_data(o), o->dtype, j0 + j, acc[j]);
  }
  return true;
}

kg_status kg_cpu_sum(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *o = c->out[0];
  const kg_reduce_params *rp = c->params;
  if (sum_leading(x, rp->mask, o)) return KG_OK;
  kg_cpu_reduce_plan p;
  kg_cpu_reduce_layout(x, rp->mask, &p);
  const char *base = kg_data(x);
  char *obase = kg_data(o);
  /* the output is contiguous; its row-major order is the kept dims' order */
#pragma omp parallel for if (p.nout * p.nred > KG_PAR_THRESHOLD && p.nout > 1) schedule(static)
  for (int64_t i = 0; i < p.nout; i++) {
    double s = 0;
    kg_cpu_reduce_walk(&p, base, x->dtype, kg_cpu_reduce_row_offset(&p, i), add_run, &s);
    kg_store_from_double(obase, o->dtype, i, s);
  }
  return KG_OK;
}

/* ---- along one dim ------------------------------------------------------------------------ */

/* ---- contiguous f32 / bf16 rows: a chunk at a time (bf16 widened to float, exactly), its
 * extreme found with 8-lane max/min (rows_simd.h); only a chunk that beats the best so far is
 * scanned again for the first index of its extreme. A NaN ends the row (the first NaN wins). */
static int64_t select_row_f32(const char *row, kg_dtype dt, int64_t n, bool want_max, float *best_out) {
  float buf[KG_CHUNK], best = 0;
  int64_t bi = -1;
  for (int64_t j = 0; j < n; j += KG_CHUNK) {
    int64_t m = n - j < KG_CHUNK ? n - j : KG_CHUNK;
    const float *v = (const float *)row + j;
    if (dt != KG_F32) {
      kg_cpu_load_f32(buf, row + j * 2, dt, 1, m);
      v = buf;
    }
    float e = kg_row_extreme_f32(v, m, !want_max);
    if (bi < 0 || isnan(e) || (want_max ? e > best : e < best)) {
      int64_t i = kg_row_find_f32(v, m, e);
      best = v[i], bi = j + i;
      if (isnan(e)) break;
    }
  }
  *best_out = best;
  return bi;
}

#if defined(__x86_64__)
/* bf16 rows with AVX-512 BW: 32 elements per vector compared as 16-bit integers, no widening.
 * The key of a bf16 is its magnitude bits m, negated when the sign is set (-m): the keys order
 * as the values do, -0 and +0 share key 0 (equal, as in the float compare: the first wins), and
 * every key fits int16. A NaN is m > 0x7f80 (the first NaN of the row wins, as in
 * select_row_f32). Per block of SEL_Z_BLOCK elements: the keys' max (min), and a NaN mask; only
 * a block that beats the best so far is scanned again for the first index of its extreme. */
#define SEL_Z_BLOCK 512
__attribute__((target("avx512f,avx512bw"))) static int64_t select_row_bf16_z(const uint16_t *row, int64_t n,
                                                                            bool want_max, float *best_out) {
  const __m512i magm = _mm512_set1_epi16(0x7fff), inf = _mm512_set1_epi16(0x7f80), zero = _mm512_setzero_si512();
  const __m512i fill = _mm512_set1_epi16(want_max ? INT16_MIN : INT16_MAX); /* past the row's end: never the extreme */
  int16_t best = 0;
  int64_t bi = -1;
  for (int64_t j = 0; j < n; j += SEL_Z_BLOCK) {
    int64_t m = n - j < SEL_Z_BLOCK ? n - j : SEL_Z_BLOCK;
    __m512i e = fill;
    __mmask32 nan = 0;
    for (int64_t i = 0; i < m; i += 32) {
      __mmask32 lm = m - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (m - i)) - 1);
      __m512i x = _mm512_maskz_loadu_epi16(lm, row + j + i), mag = _mm512_and_si512(x, magm);
      nan |= _mm512_mask_cmpgt_epi16_mask(lm, mag, inf);
      __m512i key = _mm512_mask_mov_epi16(fill, lm, _mm512_mask_sub_epi16(mag, _mm512_movepi16_mask(x), zero, mag));
      e = want_max ? _mm512_max_epi16(e, key) : _mm512_min_epi16(e, key);
    }
    if (nan) { /* the first NaN of the block ends the row */
      for (int64_t i = 0; i < m; i += 32) {
        __mmask32 lm = m - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (m - i)) - 1);
        __m512i mag = _mm512_and_si512(_mm512_maskz_loadu_epi16(lm, row + j + i), magm);
        __mmask32 hit = _mm512_mask_cmpgt_epi16_mask(lm, mag, inf);
        if (hit) {
          bi = j + i + __builtin_ctz(hit);
          break;
        }
      }
      break;
    }
    __m512i b = _mm512_set1_epi16(best);
    if (bi >= 0 && !(want_max ? _mm512_cmpgt_epi16_mask(e, b) : _mm512_cmplt_epi16_mask(e, b))) continue;
    int16_t lanes[32];
    _mm512_storeu_si512(lanes, e);
    int16_t be = lanes[0];
    for (int l = 1; l < 32; l++) be = want_max ? (lanes[l] > be ? lanes[l] : be) : (lanes[l] < be ? lanes[l] : be);
    __m512i want = _mm512_set1_epi16(be);
    for (int64_t i = 0; i < m; i += 32) { /* the block holds be: the first lane with its key */
      __mmask32 lm = m - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (m - i)) - 1);
      __m512i x = _mm512_maskz_loadu_epi16(lm, row + j + i), mag = _mm512_and_si512(x, magm);
      __m512i key = _mm512_mask_sub_epi16(mag, _mm512_movepi16_mask(x), zero, mag);
      __mmask32 hit = _mm512_mask_cmpeq_epi16_mask(lm, key, want);
      if (hit) {
        bi = j + i + __builtin_ctz(hit);
        break;
      }
    }
    best = be;
  }
  *best_out = kg_bf16_to_f32(row[bi]);
  return bi;
}

static bool select_bf16_z(void) {
  static int have = -1; /* set once; a race writes the same value */
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 1 : 0;
  }
  return have == 1 && kg_cpu_simd() >= 2; /* KENG_NO_SIMD=1: the 8-lane / scalar path */
}
#endif

/* KENG_SELECT_DIRECT=0 forces the general path (the kernel lab compares both) */
static bool select_direct_enabled(void) { return kg_env_bool(KG_ENV_KENG_SELECT_DIRECT); }

/* max/min/argmax/argmin: the first extreme element of each row; NaN counts as the extreme */
static kg_status select_run(const kg_op_call *c, bool want_max) {
  const kg_tensor *x = c->in[0];
  const kg_dim_params *dp = c->params;
  bool with_values = c->nout == 2;
  kg_tensor *vo = with_values ? c->out[0] : NULL, *io = c->out[with_values ? 1 : 0];
  kg_cpu_reduce_plan p;
  kg_cpu_reduce_layout(x, 1u << dp->dim, &p);
  int64_t n = p.rshape[0], xs = p.rstride[0];
  int es = (int)kg_elem_size(x);
  const char *base = kg_data(x);
  int64_t *ibase = kg_data(io);
  char *vbase = vo ? kg_data(vo) : NULL;
  if (xs == 1 && (x->dtype == KG_F32 || x->dtype == KG_BF16) && select_direct_enabled()) {
#if defined(__x86_64__)
    if (x->dtype == KG_BF16 && n > 0 && select_bf16_z()) {
#pragma omp parallel for if (p.nout * n > KG_PAR_THRESHOLD && p.nout > 1) schedule(static)
      for (int64_t o = 0; o < p.nout; o++) {
        float best = 0;
        ibase[o] = select_row_bf16_z((const uint16_t *)(base + kg_cpu_reduce_row_offset(&p, o) * es), n, want_max, &best);
        if (vbase) kg_store_from_double(vbase, vo->dtype, o, best);
      }
      return KG_OK;
    }
#endif
#pragma omp parallel for if (p.nout * n > KG_PAR_THRESHOLD && p.nout > 1) schedule(static)
    for (int64_t o = 0; o < p.nout; o++) {
      float best = 0;
      ibase[o] = select_row_f32(base + kg_cpu_reduce_row_offset(&p, o) * es, x->dtype, n, want_max, &best);
      if (vbase) kg_store_from_double(vbase, vo->dtype, o, best);
    }
    return KG_OK;
  }
#pragma omp parallel for if (p.nout * n > KG_PAR_THRESHOLD && p.nout > 1) schedule(static)
  for (int64_t o = 0; o < p.nout; o++) {
    const char *row = base + kg_cpu_reduce_row_offset(&p, o) * es;
    double buf[KG_CHUNK], best = 0;
    int64_t bi = -1;
    for (int64_t j = 0; j < n; j += KG_CHUNK) {
      int64_t m = n - j < KG_CHUNK ? n - j : KG_CHUNK;
      kg_cpu_load_f64(buf, row + j * xs * es, x->dtype, xs, m);
      for (int64_t i = 0; i < m; i++) {
        double v = buf[i];
        if (bi < 0 || (!isnan(best) && (isnan(v) || (want_max ? v > best : v < best)))) best = v, bi = j + i;
      }
    }
    ibase[o] = bi; /* outputs are contiguous, rows in the kept dims' order */
    if (vbase) kg_store_from_double(vbase, vo->dtype, o, best);
  }
  return KG_OK;
}
kg_status kg_cpu_max(const kg_op_call *c) { return select_run(c, true); }
kg_status kg_cpu_min(const kg_op_call *c) { return select_run(c, false); }
kg_status kg_cpu_argmax(const kg_op_call *c) { return select_run(c, true); }
kg_status kg_cpu_argmin(const kg_op_call *c) { return select_run(c, false); }

/* running sums in double, stored in the output dtype */
kg_status kg_cpu_cumsum(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *y = c->out[0];
  const kg_dim_params *dp = c->params;
  kg_cpu_reduce_plan px, py;
  kg_cpu_reduce_layout(x, 1u << dp->dim, &px);
  kg_cpu_reduce_layout(y, 1u << dp->dim, &py);
  int64_t n = px.rshape[0], xs = px.rstride[0], ys = py.rstride[0];
  int xe = (int)kg_elem_size(x), ye = (int)kg_elem_size(y);
  const char *xb = kg_data(x);
  char *yb = kg_data(y);
#pragma omp parallel for if (px.nout * n > KG_PAR_THRESHOLD && px.nout > 1) schedule(static)
  for (int64_t o = 0; o < px.nout; o++) {
    const char *xr = xb + kg_cpu_reduce_row_offset(&px, o) * xe;
    char *yr = yb + kg_cpu_reduce_row_offset(&py, o) * ye;
    double buf[KG_CHUNK], acc = 0;
    for (int64_t j = 0; j < n; j += KG_CHUNK) {
      int64_t m = n - j < KG_CHUNK ? n - j : KG_CHUNK;
      kg_cpu_load_f64(buf, xr + j * xs * xe, x->dtype, xs, m);
      for (int64_t i = 0; i < m; i++) buf[i] = acc += buf[i];
      kg_cpu_store_f64(yr + j * ys * ye, y->dtype, ys, buf, m);
    }
  }
  return KG_OK;
}

typedef struct {
  double v;
  int64_t i;
} topk_item;

/* NaN ranks above everything; ties keep the lower index first */
static int by_value_desc(const void *a, const void *b) {
  const topk_item *x = a, *y = b;
  bool xn = isnan(x->v), yn = isnan(y->v);
  if (xn != yn) return xn ? -1 : 1;
  if (!xn && x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}
static int by_value_asc(const void *a, const void *b) {
  const topk_item *x = a, *y = b;
  bool xn = isnan(x->v), yn = isnan(y->v);
  if (xn != yn) return xn ? 1 : -1;
  if (!xn && x->v != y->v) return x->v < y->v ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

/* each row sorted (always, so sorted = false gives sorted results too); the first k kept */
kg_status kg_cpu_topk(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *vo = c->out[0], *io = c->out[1];
  const kg_topk_params *tp = c->params;
  kg_cpu_reduce_plan px, pv;
  kg_cpu_reduce_layout(x, 1u << tp->dim, &px);
  kg_cpu_reduce_layout(vo, 1u << tp->dim, &pv); /* values and indices share one layout */
  int64_t n = px.rshape[0], xs = px.rstride[0], os = pv.rstride[0], k = tp->k;
  int xe = (int)kg_elem_size(x);
  const char *xb = kg_data(x);
  char *vb = kg_data(vo);
  int64_t *ib = kg_data(io);
  bool failed = false;
#pragma omp parallel if (px.nout * n > KG_PAR_THRESHOLD && px.nout > 1)
  {
    topk_item *items = malloc(sizeof *items * (size_t)(n ? n : 1));
    double buf[KG_CHUNK];
    if (!items) failed = true;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < px.nout; o++) {
      if (!items) continue;
      const char *xr = xb + kg_cpu_reduce_row_offset(&px, o) * xe;
      for (int64_t j = 0; j < n; j += KG_CHUNK) {
        int64_t m = n - j < KG_CHUNK ? n - j : KG_CHUNK;
        kg_cpu_load_f64(buf, xr + j * xs * xe, x->dtype, xs, m);
        for (int64_t i = 0; i < m; i++) items[j + i] = (topk_item){buf[i], j + i};
      }
      qsort(items, (size_t)n, sizeof *items, tp->largest ? by_value_desc : by_value_asc);
      int64_t off = kg_cpu_reduce_row_offset(&pv, o);
      for (int64_t i = 0; i < k; i++) {
        kg_store_from_double(vb, vo->dtype, off + i * os, items[i].v);
        ib[off + i * os] = items[i].i;
      }
    }
    free(items);
  }
  if (failed) return kg_error(KG_ERR_OOM, "topk", "out of memory for a row of %lld elements", (long long)n);
  return KG_OK;
}
