/* lab_rows.c — kernel lab of the row-wise CPU kernels (issue 7): softmax / log_softmax and their
 * fused backward (engine/cpu/softmax.c), layer / rms / group norm forward and backward
 * (engine/cpu/norm.c), max / min / argmax / argmin along a dim (engine/cpu/reduce.c) and
 * dropout's Philox words and mask (engine/cpu/random.c), against naive f64 references.
 *
 *   lab_rows --check     every case below in three children: the default build (direct f32
 *                        rows, AVX2 when the CPU has it), KENG_NO_SIMD=1 (scalar loops), and
 *                        the buffered paths (KENG_{SOFTMAX,NORM,SELECT}_DIRECT=0); row lengths
 *                        1, 7, 33, 1000, 4099, bf16 input, a strided (non-contiguous) softmax,
 *                        softmax along a leading dim (the column path, NaN / -inf columns),
 *                        NaN / -inf / tied rows for the selections, dropout at word offsets
 *                        0..3; ctest runs it (< 1 s)
 *   lab_rows [runs=7]    ns/element of each kernel, direct path vs buffered path (fastest of
 *                        runs; 1 thread unless KENG_NUM_THREADS says otherwise); PyTorch is in
 *                        tests/lab/rows_bench.{lua,py}
 *
 * Shape letters: R rows, N row length, B batch, C channels, G groups, S spatial size.
 * Bounds (f32): softmax |err| <= 1e-6 (1 + |ref|) x 4 — exp is <= 1 ulp, the row sum float
 * lanes per 256-element block; the norms 1e-5 (1 + |ref|) relative to the row's scale (dx and
 * dw sum over rows); bf16 output 8e-3 (its rounding is 2^-9 relative). Selections and dropout
 * are exact.
 */
#include "lab.h"
#include <keng/keng.h>
#include <keng/ops_api.h>
#include <keng/scalar.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

kg_status kg_cpu_softmax(const kg_op_call *c);
kg_status kg_cpu_log_softmax(const kg_op_call *c);
kg_status kg_cpu_softmax_backward(const kg_op_call *c);
kg_status kg_cpu_log_softmax_backward(const kg_op_call *c);
kg_status kg_cpu_layer_norm(const kg_op_call *c);
kg_status kg_cpu_rms_norm(const kg_op_call *c);
kg_status kg_cpu_group_norm(const kg_op_call *c);
kg_status kg_cpu_layer_norm_backward(const kg_op_call *c);
kg_status kg_cpu_rms_norm_backward(const kg_op_call *c);
kg_status kg_cpu_group_norm_backward(const kg_op_call *c);
kg_status kg_cpu_max(const kg_op_call *c);
kg_status kg_cpu_min(const kg_op_call *c);
kg_status kg_cpu_argmax(const kg_op_call *c);
kg_status kg_cpu_dropout(const kg_op_call *c);

static int failures;
static uint64_t rng_state = 88172645463325252ull;
static double urand(void) { /* xorshift64, uniform in [0, 1) */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static kg_tensor *tensor(int ndim, const int64_t *shape, kg_dtype dt) {
  kg_tensor *t = NULL;
  if (kg_tensor_empty(&t, ndim, shape, dt, KG_CPU)) {
    fprintf(stderr, "lab_rows: %s\n", kg_last_error());
    exit(2);
  }
  return t;
}
/* random values in [-scale, scale) + shift, rounded to t's dtype; returns them as stored */
static double *fill(kg_tensor *t, double scale, double shift) {
  int64_t n = kg_numel(t);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    kg_set_flat(t, i, (2 * urand() - 1) * scale + shift);
    v[i] = kg_get_flat(t, i);
  }
  return v;
}
static void run(kg_status (*k)(const kg_op_call *), int nin, const kg_tensor *const *in, int nout, kg_tensor *const *out,
                const void *params) {
  kg_op_call c = {0, nin, nout, in, out, params};
  if (k(&c)) {
    fprintf(stderr, "lab_rows: kernel failed: %s\n", kg_last_error());
    exit(2);
  }
}
/* worst |got - ref| / (1 + |ref|) * 1/scale over n elements of t (row-major) */
static double worst(const kg_tensor *t, const double *ref, int64_t n, double scale) {
  double w = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = kg_get_flat(t, i), e = fabs(g - ref[i]) / (scale * (1 + fabs(ref[i])));
    if (!(e <= w)) w = e; /* NaN counts as the worst */
  }
  return w;
}
static void report(const char *what, double err, double bound) {
  bool bad = !(err <= bound);
  failures += bad;
  if (bad || getenv("LAB_VERBOSE")) printf("%-48s err %.3g (bound %.3g)%s\n", what, err, bound, bad ? "  FAIL" : "");
}

/* ---- softmax ------------------------------------------------------------------------------ */

static void check_softmax(int64_t R, int64_t N, kg_dtype dt, bool strided, bool log_form) {
  /* x: [R, N] (strided: a [N, R] tensor transposed, so rows have stride R) */
  int64_t shape[2] = {R, N}, tshape[2] = {N, R};
  kg_tensor *base = tensor(2, strided ? tshape : shape, dt), *x = base;
  double *bv = fill(base, 6, 0);
  if (strided) {
    int64_t st[2] = {1, R};
    kg_tensor_view_raw(&x, base, 2, shape, st, 0);
  }
  double *xv = malloc(sizeof(double) * (size_t)(R * N)), *ref = malloc(sizeof(double) * (size_t)(R * N));
  for (int64_t i = 0; i < R * N; i++) xv[i] = strided ? bv[(i % N) * R + i / N] : bv[i];
  for (int64_t r = 0; r < R; r++) {
    const double *v = xv + r * N;
    double mx = -INFINITY, s = 0;
    for (int64_t i = 0; i < N; i++) mx = fmax(mx, v[i]);
    for (int64_t i = 0; i < N; i++) s += exp(v[i] - mx);
    for (int64_t i = 0; i < N; i++) ref[r * N + i] = log_form ? v[i] - mx - log(s) : exp(v[i] - mx) / s;
  }
  kg_tensor *y = tensor(2, shape, dt);
  kg_dim_params dp = {1, false};
  run(log_form ? kg_cpu_log_softmax : kg_cpu_softmax, 1, (const kg_tensor *[]){x}, 1, &y, &dp);
  char what[96];
  double bound = dt == KG_BF16 ? 8e-3 : 4e-6;
  snprintf(what, sizeof what, "%s [%lld,%lld] %s%s", log_form ? "log_softmax" : "softmax", (long long)R, (long long)N,
           kg_dtype_info[dt].name, strided ? " strided" : "");
  report(what, worst(y, ref, R * N, 1), bound);

  /* backward from the kernel's own y: softmax dx = y (g - sum g y); log dx = g - exp(y) sum g */
  kg_tensor *g = tensor(2, shape, dt), *dx = tensor(2, shape, dt);
  double *gv = fill(g, 1, 0);
  for (int64_t r = 0; r < R; r++) {
    double s = 0, yv[4099 + 1];
    for (int64_t i = 0; i < N; i++) yv[i] = kg_get_flat(y, r * N + i);
    for (int64_t i = 0; i < N; i++) s += log_form ? gv[r * N + i] : gv[r * N + i] * yv[i];
    for (int64_t i = 0; i < N; i++)
      ref[r * N + i] = log_form ? gv[r * N + i] - exp(yv[i]) * s : yv[i] * (gv[r * N + i] - s);
  }
  run(log_form ? kg_cpu_log_softmax_backward : kg_cpu_softmax_backward, 2, (const kg_tensor *[]){g, y}, 1, &dx, &dp);
  snprintf(what + strlen(what), sizeof what - strlen(what), " backward");
  report(what, worst(dx, ref, R * N, 1), bound * (log_form ? 4 : 1)); /* log: g - e s cancels */
  kg_tensor_release(dx), kg_tensor_release(g), kg_tensor_release(y);
  if (x != base) kg_tensor_release(x);
  kg_tensor_release(base);
  free(bv), free(xv), free(ref), free(gv);
}

/* x: [N, I] contiguous, softmax along dim 0 (the direct column path): column 1 holds a NaN,
 * column 2 is all -inf */
static void check_softmax_cols(int64_t N, int64_t I, bool log_form) {
  int64_t shape[2] = {N, I};
  kg_tensor *x = tensor(2, shape, KG_F32), *y = tensor(2, shape, KG_F32), *g = tensor(2, shape, KG_F32),
            *dx = tensor(2, shape, KG_F32);
  double *xv = fill(x, 6, 0), *gv = fill(g, 1, 0), *ref = malloc(sizeof(double) * (size_t)(N * I));
  if (I > 2) {
    kg_set_flat(x, (N / 2) * I + 1, NAN), xv[(N / 2) * I + 1] = NAN;
    for (int64_t k = 0; k < N; k++) kg_set_flat(x, k * I + 2, -INFINITY), xv[k * I + 2] = -INFINITY;
  }
  for (int64_t j = 0; j < I; j++) {
    double mx = -INFINITY, s = 0;
    bool nan = false;
    for (int64_t k = 0; k < N; k++) mx = fmax(mx, xv[k * I + j]), nan |= isnan(xv[k * I + j]);
    if (mx == -INFINITY) mx = 0;
    for (int64_t k = 0; k < N; k++) s += exp(xv[k * I + j] - mx);
    for (int64_t k = 0; k < N; k++) {
      double v = xv[k * I + j];
      ref[k * I + j] = nan ? NAN : log_form ? v - mx - log(s) : exp(v - mx) / s;
    }
  }
  kg_dim_params dp = {0, false};
  run(log_form ? kg_cpu_log_softmax : kg_cpu_softmax, 1, (const kg_tensor *[]){x}, 1, &y, &dp);
  char what[96];
  snprintf(what, sizeof what, "%s columns [%lld,%lld] f32", log_form ? "log_softmax" : "softmax", (long long)N, (long long)I);
  double w = 0; /* NaN where the reference is NaN; worst() elsewhere */
  for (int64_t i = 0; i < N * I; i++) {
    double gv2 = kg_get_flat(y, i);
    double e = isnan(ref[i]) ? (isnan(gv2) ? 0 : INFINITY) : fabs(gv2 - ref[i]) / (1 + fabs(ref[i]));
    if (!(e <= w)) w = e;
  }
  report(what, w, 4e-6);
  for (int64_t j = 0; j < I; j++) {
    double s = 0;
    for (int64_t k = 0; k < N; k++) {
      double yv = kg_get_flat(y, k * I + j);
      s += log_form ? gv[k * I + j] : gv[k * I + j] * yv;
    }
    for (int64_t k = 0; k < N; k++) {
      double yv = kg_get_flat(y, k * I + j);
      ref[k * I + j] = log_form ? gv[k * I + j] - exp(yv) * s : yv * (gv[k * I + j] - s);
    }
  }
  run(log_form ? kg_cpu_log_softmax_backward : kg_cpu_softmax_backward, 2, (const kg_tensor *[]){g, y}, 1, &dx, &dp);
  w = 0;
  for (int64_t i = 0; i < N * I; i++) {
    double gv2 = kg_get_flat(dx, i);
    double e = isnan(ref[i]) ? (isnan(gv2) ? 0 : INFINITY) : fabs(gv2 - ref[i]) / (1 + fabs(ref[i]));
    if (!(e <= w)) w = e;
  }
  snprintf(what + strlen(what), sizeof what - strlen(what), " backward");
  report(what, w, 1.6e-5);
  kg_tensor_release(x), kg_tensor_release(y), kg_tensor_release(g), kg_tensor_release(dx);
  free(xv), free(gv), free(ref);
}

/* ---- norms -------------------------------------------------------------------------------- */

typedef enum { LAYER, RMS, GROUP } norm_kind;

/* x: [B, C, S] (layer/rms: rows B, C = N, S = 1; group: G groups over C) */
static void check_norm(norm_kind kind, int64_t B, int64_t C, int64_t S, int G, kg_dtype dt, double shift) {
  int64_t shape3[3] = {B, C, S}, shape2[2] = {B, C}, cshape[1] = {C};
  bool group = kind == GROUP;
  int nd = group ? 3 : 2;
  const int64_t *shape = group ? shape3 : shape2;
  int64_t n = B * C * (group ? S : 1), rows = group ? B * G : B, M = n / rows, cpg = C / (group ? G : 1);
  int64_t Sx = group ? S : 1;
  kg_tensor *x = tensor(nd, shape, dt), *w = tensor(1, cshape, KG_F32), *b = tensor(1, cshape, KG_F32);
  double *xv = fill(x, 2, shift), *wv = fill(w, 1, 0.5), *bvv = fill(b, 1, 0);
  kg_norm_params p = {1e-5, kind == RMS, G};
  bool center = kind != RMS;
  double *ref = malloc(sizeof(double) * (size_t)n), *mean = calloc((size_t)rows, sizeof(double)),
         *rstd = calloc((size_t)rows, sizeof(double));
  for (int64_t r = 0; r < rows; r++) {
    const double *v = xv + r * M;
    double m = 0, ss = 0;
    if (center) {
      for (int64_t i = 0; i < M; i++) m += v[i];
      m /= (double)M;
    }
    for (int64_t i = 0; i < M; i++) ss += (v[i] - m) * (v[i] - m);
    mean[r] = m, rstd[r] = 1 / sqrt(ss / (double)M + p.eps);
    for (int64_t i = 0; i < M; i++) {
      int64_t ch = (r % (group ? G : 1)) * cpg + i / Sx;
      double sc = kind == RMS ? 1 + wv[ch] : wv[ch];
      ref[r * M + i] = (v[i] - m) * rstd[r] * sc + (kind == RMS ? 0 : bvv[ch]);
    }
  }
  int64_t sshape[1] = {rows};
  kg_tensor *y = tensor(nd, shape, dt), *sm = tensor(1, sshape, KG_F32), *sr = tensor(1, sshape, KG_F32);
  kg_status (*fwd)(const kg_op_call *) = kind == LAYER ? kg_cpu_layer_norm : kind == RMS ? kg_cpu_rms_norm : kg_cpu_group_norm;
  kg_status (*bwd)(const kg_op_call *) =
      kind == LAYER ? kg_cpu_layer_norm_backward : kind == RMS ? kg_cpu_rms_norm_backward : kg_cpu_group_norm_backward;
  const kg_tensor *fin[3] = {x, w, kind == RMS ? NULL : b};
  kg_tensor *fout[3] = {y, center ? sm : sr, sr};
  run(fwd, 3, fin, center ? 3 : 2, fout, &p);
  static const char *names[] = {"layer_norm", "rms_norm", "group_norm"};
  char what[96];
  snprintf(what, sizeof what, "%s [%lld,%lld,%lld] G%d %s shift %g", names[kind], (long long)B, (long long)C,
           (long long)Sx, G, kg_dtype_info[dt].name, shift);
  double bound = dt == KG_BF16 ? 8e-3 : 1e-5;
  report(what, worst(y, ref, n, 1), bound);

  /* backward: dx = rstd (gw - mean gw - xhat mean(gw xhat)), dw = sum dy xhat, db = sum dy */
  kg_tensor *g = tensor(nd, shape, dt), *dx = tensor(nd, shape, dt), *dw = tensor(1, cshape, KG_F32),
            *db = tensor(1, cshape, KG_F32);
  double *gv = fill(g, 1, 0), *rdw = calloc((size_t)C, sizeof(double)), *rdb = calloc((size_t)C, sizeof(double));
  double gscale = 0; /* dx's scale: rstd times the typical dy */
  for (int64_t r = 0; r < rows; r++) {
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < M; i++) {
      int64_t ch = (r % (group ? G : 1)) * cpg + i / Sx;
      double xh = (xv[r * M + i] - mean[r]) * rstd[r], gw = gv[r * M + i] * (kind == RMS ? 1 + wv[ch] : wv[ch]);
      sa += gw, sb += gw * xh;
      rdw[ch] += gv[r * M + i] * xh, rdb[ch] += gv[r * M + i];
    }
    double A = center ? sa / (double)M : 0, Bm = sb / (double)M;
    for (int64_t i = 0; i < M; i++) {
      int64_t ch = (r % (group ? G : 1)) * cpg + i / Sx;
      double xh = (xv[r * M + i] - mean[r]) * rstd[r], gw = gv[r * M + i] * (kind == RMS ? 1 + wv[ch] : wv[ch]);
      ref[r * M + i] = rstd[r] * (gw - A - xh * Bm);
    }
    gscale = fmax(gscale, rstd[r]);
  }
  const kg_tensor *bin[5] = {g, x, w, center ? sm : sr, sr};
  kg_tensor *bout[3] = {dx, dw, db};
  run(bwd, center ? 5 : 4, bin, kind == RMS ? 2 : 3, bout, &p);
  snprintf(what + strlen(what), sizeof what - strlen(what), " dx");
  report(what, worst(dx, ref, n, gscale), bound * 4);
  double dscale = sqrt((double)(n / C)); /* dw, db: sums of n / C terms of size ~1 */
  what[strlen(what) - 2] = 0;
  snprintf(what + strlen(what), sizeof what - strlen(what), "dw");
  report(what, worst(dw, rdw, C, dscale), bound * 4);
  if (kind != RMS) {
    what[strlen(what) - 2] = 0;
    snprintf(what + strlen(what), sizeof what - strlen(what), "db");
    report(what, worst(db, rdb, C, dscale), bound * 4);
  }
  kg_tensor *ts[] = {x, w, b, y, sm, sr, g, dx, dw, db};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) kg_tensor_release(ts[i]);
  free(xv), free(wv), free(bvv), free(ref), free(mean), free(rstd), free(gv), free(rdw), free(rdb);
}

/* ---- max / min / argmax ------------------------------------------------------------------- */

/* rows: random, a tie of the extreme, -inf everywhere, a NaN late and a NaN early */
static void check_select(int64_t N, kg_dtype dt) {
  enum { R = 5 };
  int64_t shape[2] = {R, N}, oshape[1] = {R};
  kg_tensor *x = tensor(2, shape, dt);
  double *v = fill(x, 100, 0);
  if (N > 2) {
    kg_set_flat(x, 1 * N + N - 1, 1000), kg_set_flat(x, 1 * N + N / 2, 1000); /* tie: the first wins */
    kg_set_flat(x, 1 * N + 1, -1000), kg_set_flat(x, 1 * N + N - 2, -1000);
  }
  for (int64_t i = 0; i < N; i++) kg_set_flat(x, 2 * N + i, -INFINITY);
  kg_set_flat(x, 3 * N + N - 1, NAN);
  kg_set_flat(x, 4 * N + N / 3, NAN);
  if (N > 1) kg_set_flat(x, 4 * N + N - 1, NAN);
  for (int64_t i = 0; i < R * N; i++) v[i] = kg_get_flat(x, i);
  for (int want_max = 0; want_max < 2; want_max++) {
    kg_tensor *vo = tensor(1, oshape, dt), *io = tensor(1, oshape, KG_I64);
    kg_dim_params dp = {1, false};
    run(want_max ? kg_cpu_max : kg_cpu_min, 1, (const kg_tensor *[]){x}, 2, (kg_tensor *[]){vo, io}, &dp);
    int bad = 0;
    for (int64_t r = 0; r < R; r++) {
      int64_t bi = 0;
      for (int64_t i = 1; i < N; i++) {
        double a = v[r * N + i], b = v[r * N + bi];
        if (!isnan(b) && (isnan(a) || (want_max ? a > b : a < b))) bi = i;
      }
      double got = kg_get_flat(vo, r), want = v[r * N + bi];
      bad += kg_get_flat(io, r) != (double)bi || !(got == want || (isnan(got) && isnan(want))) ||
             signbit(got) != signbit(want);
    }
    char what[96];
    snprintf(what, sizeof what, "%s [%d,%lld] %s", want_max ? "max" : "min", R, (long long)N, kg_dtype_info[dt].name);
    report(what, bad, 0);
    kg_tensor_release(vo), kg_tensor_release(io);
  }
  kg_tensor_release(x);
  free(v);
}

/* ---- dropout ------------------------------------------------------------------------------ */

static void check_dropout(int64_t n, uint64_t offset, double p, kg_dtype dt) {
  int64_t shape[1] = {n};
  kg_tensor *x = tensor(1, shape, dt), *y = tensor(1, shape, dt), *m = tensor(1, shape, KG_BOOL);
  double *xv = fill(x, 3, 0);
  kg_dropout_params dp = {{0x1234567890abcdefull, offset}, p};
  run(kg_cpu_dropout, 1, (const kg_tensor *[]){x}, 2, (kg_tensor *[]){y, m}, &dp);
  int bad = 0;
  float s = (float)(1 / (1 - p));
  for (int64_t i = 0; i < n; i++) {
    bool keep = kg_u32_to_unit(kg_philox_word(dp.rng.seed, offset, (uint64_t)i)) >= (float)p;
    double want = keep ? (double)((float)xv[i] * s) : 0;
    if (dt == KG_BF16) want = keep ? (double)kg_bf16_to_f32(kg_f32_to_bf16((float)xv[i] * s)) : 0;
    bad += (kg_get_flat(m, i) != 0) != keep || kg_get_flat(y, i) != want;
  }
  char what[96];
  snprintf(what, sizeof what, "dropout n %lld offset %llu p %g %s", (long long)n, (unsigned long long)offset, p,
           kg_dtype_info[dt].name);
  report(what, bad, 0);
  kg_tensor_release(x), kg_tensor_release(y), kg_tensor_release(m);
  free(xv);
}

static int check_all(void) {
  static const int64_t lens[] = {1, 7, 33, 1000, 4099};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
    int64_t N = lens[k], R = N > 1000 ? 3 : 5;
    for (int lf = 0; lf < 2; lf++) {
      check_softmax(R, N, KG_F32, false, lf);
      check_softmax(R, N, KG_F32, true, lf);
      check_softmax(R, N, KG_BF16, false, lf);
      check_softmax_cols(N, 3, lf);
      check_softmax_cols(N, 67, lf); /* two column blocks of 64, a tail of 3 */
    }
    check_norm(LAYER, R, N, 1, 1, KG_F32, 0);
    check_norm(LAYER, R, N, 1, 1, KG_F32, 100); /* a large mean: the variance must not cancel */
    check_norm(RMS, R, N, 1, 1, KG_F32, 0.5);
    check_norm(LAYER, R, N, 1, 1, KG_BF16, 0);
    check_select(N, KG_F32);
    check_select(N, KG_BF16);
  }
  check_norm(GROUP, 2, 6, 35, 3, KG_F32, 0);
  check_norm(GROUP, 2, 6, 35, 3, KG_F32, 50);
  check_norm(GROUP, 3, 4, 1, 2, KG_F32, 0);
  check_norm(GROUP, 2, 8, 1000, 4, KG_F32, 0);
  check_norm(GROUP, 2, 6, 33, 3, KG_BF16, 0);
  for (uint64_t off = 0; off < 4; off++) {
    check_dropout(1, off, 0.5, KG_F32);
    check_dropout(1000, off, 0.1, KG_F32);
    check_dropout(4099, off + 0x7fffffffcull, 0.5, KG_F32); /* the counter crosses 2^32 words */
  }
  check_dropout(1000, 3, 0.3, KG_BF16);
  return failures;
}

/* runs check_all in a child with the given environment; returns its failure count */
static int check_in_child(const char *label, const char *const *env) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; env[i]; i += 2) setenv(env[i], env[i + 1], 1);
    kg_env_reload(); /* the engine reads its switches once */
    int f = check_all();
    printf("lab_rows --check [%s]: %d failure(s)\n", label, f);
    fflush(stdout);
    _exit(f ? 1 : 0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/* ---- timing ------------------------------------------------------------------------------- */

#define TIME(label, elems, stmt)                                                        \
  do {                                                                                  \
    double best = 1e30;                                                                 \
    for (int rr = 0; rr < runs; rr++) {                                                 \
      double t0 = (lab_cpu_seconds() * 1e3);                                                             \
      stmt;                                                                             \
      double t = (lab_cpu_seconds() * 1e3) - t0;                                                         \
      if (t < best) best = t;                                                           \
    }                                                                                   \
    printf("  %-40s %8.3f ms  %6.3f ns/elem\n", label, best, best * 1e6 / (double)(elems)); \
  } while (0)

static void time_all(int runs) {
  int64_t ss[2] = {64 * 128, 128}, ls[2] = {4096, 768}, gs[3] = {8, 32, 128 * 128}, vs[2] = {32, 32000},
          ds[1] = {32 * 128 * 768}, cs[1] = {768}, c32[1] = {32};
  kg_tensor *s = tensor(2, ss, KG_F32), *sy = tensor(2, ss, KG_F32), *sg = tensor(2, ss, KG_F32), *sd = tensor(2, ss, KG_F32);
  free(fill(s, 4, 0)), free(fill(sg, 1, 0));
  kg_dim_params dp = {1, false};
  TIME("softmax [8192,128]", 64 * 128 * 128, run(kg_cpu_softmax, 1, (const kg_tensor *[]){s}, 1, &sy, &dp));
  TIME("log_softmax [8192,128]", 64 * 128 * 128, run(kg_cpu_log_softmax, 1, (const kg_tensor *[]){s}, 1, &sy, &dp));
  TIME("softmax_backward [8192,128]", 64 * 128 * 128,
       run(kg_cpu_softmax_backward, 2, (const kg_tensor *[]){sg, sy}, 1, &sd, &dp));
  kg_tensor *l = tensor(2, ls, KG_F32), *ly = tensor(2, ls, KG_F32), *lg = tensor(2, ls, KG_F32), *ld = tensor(2, ls, KG_F32);
  kg_tensor *w = tensor(1, cs, KG_F32), *b = tensor(1, cs, KG_F32), *dw = tensor(1, cs, KG_F32), *db = tensor(1, cs, KG_F32);
  int64_t rs[1] = {4096};
  kg_tensor *sm = tensor(1, rs, KG_F32), *sr = tensor(1, rs, KG_F32);
  free(fill(l, 2, 0)), free(fill(lg, 1, 0)), free(fill(w, 1, 1)), free(fill(b, 1, 0));
  kg_norm_params np = {1e-5, false, 1};
  TIME("layer_norm [4096,768]", 4096 * 768,
       run(kg_cpu_layer_norm, 3, (const kg_tensor *[]){l, w, b}, 3, (kg_tensor *[]){ly, sm, sr}, &np));
  TIME("layer_norm_backward [4096,768]", 4096 * 768,
       run(kg_cpu_layer_norm_backward, 5, (const kg_tensor *[]){lg, l, w, sm, sr}, 3, (kg_tensor *[]){ld, dw, db}, &np));
  kg_tensor *g = tensor(3, gs, KG_F32), *gy = tensor(3, gs, KG_F32), *gg = tensor(3, gs, KG_F32), *gd = tensor(3, gs, KG_F32);
  kg_tensor *gw = tensor(1, c32, KG_F32), *gb = tensor(1, c32, KG_F32), *gdw = tensor(1, c32, KG_F32), *gdb = tensor(1, c32, KG_F32);
  int64_t grs[1] = {64};
  kg_tensor *gm = tensor(1, grs, KG_F32), *gr = tensor(1, grs, KG_F32);
  free(fill(g, 2, 0)), free(fill(gg, 1, 0)), free(fill(gw, 1, 1)), free(fill(gb, 1, 0));
  kg_norm_params gp = {1e-5, false, 8};
  TIME("group_norm G8 [8,32,16384]", 8 * 32 * 16384,
       run(kg_cpu_group_norm, 3, (const kg_tensor *[]){g, gw, gb}, 3, (kg_tensor *[]){gy, gm, gr}, &gp));
  TIME("group_norm_backward G8 [8,32,16384]", 8 * 32 * 16384,
       run(kg_cpu_group_norm_backward, 5, (const kg_tensor *[]){gg, g, gw, gm, gr}, 3, (kg_tensor *[]){gd, gdw, gdb}, &gp));
  int64_t os[1] = {32};
  kg_tensor *v = tensor(2, vs, KG_F32), *vb = tensor(2, vs, KG_BF16), *io = tensor(1, os, KG_I64);
  free(fill(v, 10, 0)), free(fill(vb, 10, 0));
  TIME("argmax f32 [32,32000]", 32 * 32000, run(kg_cpu_argmax, 1, (const kg_tensor *[]){v}, 1, &io, &dp));
  TIME("argmax bf16 [32,32000]", 32 * 32000, run(kg_cpu_argmax, 1, (const kg_tensor *[]){vb}, 1, &io, &dp));
  kg_tensor *d = tensor(1, ds, KG_F32), *dy = tensor(1, ds, KG_F32), *dm = tensor(1, ds, KG_BOOL);
  free(fill(d, 1, 0));
  kg_dropout_params drp = {{42, 0}, 0.1};
  TIME("dropout [3145728]", 32 * 128 * 768, run(kg_cpu_dropout, 1, (const kg_tensor *[]){d}, 2, (kg_tensor *[]){dy, dm}, &drp));
  kg_tensor *all[] = {s, sy, sg, sd, l, ly, lg, ld, w, b, dw, db, sm, sr, g, gy, gg, gd, gw, gb, gdw, gdb, gm, gr, v, vb, io, d, dy, dm};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kg_tensor_release(all[i]);
}

static const char *const env_default[] = {NULL};
static const char *const env_scalar[] = {"KENG_NO_SIMD", "1", NULL};
static const char *const env_buffered[] = {"KENG_SOFTMAX_DIRECT", "0", "KENG_NORM_DIRECT", "0", "KENG_SELECT_DIRECT", "0", NULL};

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--check") == 0) {
    int f = check_in_child("direct", env_default) + check_in_child("KENG_NO_SIMD=1", env_scalar) +
            check_in_child("buffered", env_buffered);
    return f ? 1 : 0;
  }
  int runs = argc > 1 ? atoi(argv[1]) : 7;
  const char *nt = getenv("KENG_NUM_THREADS"); /* process CPU time: idle OpenMP threads spin */
  kg_set_num_threads(nt && atoi(nt) > 0 ? atoi(nt) : 1);
  const char *const *envs[3] = {env_default, env_scalar, env_buffered};
  const char *labels[3] = {"direct (default)", "direct, KENG_NO_SIMD=1", "buffered (the old path)"};
  for (int k = 0; k < 3; k++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      for (int i = 0; envs[k][i]; i += 2) setenv(envs[k][i], envs[k][i + 1], 1);
      kg_env_reload();
      printf("%s, best of %d, process CPU time:\n", labels[k], runs);
      time_all(runs);
      fflush(stdout);
      _exit(0);
    }
    waitpid(pid, NULL, 0);
  }
  return 0;
}
