/* lab_elementwise.c — accuracy and speed of the libm-free float functions of
 * engine/cpu/elementwise.c: exp, sigmoid, silu, quick_gelu, tanh, gelu_tanh and the backward of
 * silu / quick_gelu / gelu_tanh, against libm in double.
 *
 *   lab_elementwise --check        every 997th float with |x| <= 128 plus special values, both
 *                                  the AVX2 path and (in a child with KENG_NO_SIMD=1) the
 *                                  scalar fallback; fails when an error exceeds its bound
 *   lab_elementwise [stride]       the same sweep (default every 61st float) printing the worst
 *                                  error of each function, then ns/element of the keng op
 *                                  against a plain libm float loop (64K elements, 1 thread)
 *
 * Errors: forward functions in ulp of the exact (double) result, subnormal results included
 * (ulp 2^-149 there); gelu_tanh as |error| / (1 + |x|) (for x << 0, 0.5 x (1 + tanh) cancels,
 * as in the libm float formula); backward in absolute error (they cross zero, where ulp means
 * nothing; their values are O(1)). */
#include "lab.h"
#include <keng/keng.h>
#include <keng/ops_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  const char *name;
  kg_op op;
  bool grad;             /* backward: g * f'(x) with g = 1 */
  int metric;            /* ULP: ulp of the result; ABS: absolute; ABSX: |error| / (1 + |x|) */
  double (*ref)(double); /* exact value (or derivative) in double */
  float (*libm)(float);  /* the libm float formula, for timing */
  double bound;          /* --check: max ulp (forward) or absolute error (backward) */
} fn;

static double sig(double x) { return 1 / (1 + exp(-x)); }
static double r_exp(double x) { return exp(x); }
static double r_sigmoid(double x) { return sig(x); }
static double r_silu(double x) { return x * sig(x); }
/* quick_gelu's argument 1.702 x is rounded to float first, as in every float implementation
 * (its rounding alone is |1.702 x| 2^-24 relative after exp): the reference takes the same a */
static double qa(double x) { return (double)(1.702f * (float)x); }
static double r_qgelu(double x) { return x * sig(qa(x)); }
static double r_tanh(double x) { return tanh(x); }
static const double K0 = 0.7978845608028654; /* sqrt(2/pi) */
static double r_gelu_tanh(double x) { return 0.5 * x * (1 + tanh(K0 * (x + 0.044715 * x * x * x))); }
static double r_gelu(double x) { return 0.5 * x * erfc(-x * 0.7071067811865476); }
static double r_gelu_grad(double x) {
  return 0.5 * erfc(-x * 0.7071067811865476) + x * exp(-0.5 * x * x) * 0.3989422804014327;
}
static double r_silu_grad(double x) { return sig(x) * (1 + x * (1 - sig(x))); }
static double r_qgelu_grad(double x) { double s = sig(qa(x)); return s * (1 + qa(x) * (1 - s)); }
static double r_gelu_tanh_grad(double x) {
  double t = tanh(K0 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * K0 * (1 + 3 * 0.044715 * x * x);
}
static float l_exp(float x) { return expf(x); }
static float l_sigmoid(float x) { return 1 / (1 + expf(-x)); }
static float l_silu(float x) { return x / (1 + expf(-x)); }
static float l_qgelu(float x) { return x / (1 + expf(-1.702f * x)); }
static float l_tanh(float x) { return tanhf(x); }
static float l_gelu_tanh(float x) { return 0.5f * x * (1 + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
static float l_gelu(float x) { return 0.5f * x * (1 + erff(x * 0.70710678f)); }
static float l_silu_grad(float x) { float s = 1 / (1 + expf(-x)); return s * (1 + x * (1 - s)); }

enum { ULP, ABS, ABSX };
static const char *metric_name[] = {"ulp", "abs", "abs/(1+|x|)"};
static const fn fns[] = {
    {"exp", KG_OP_EXP, false, ULP, r_exp, l_exp, 2},
    {"sigmoid", KG_OP_SIGMOID, false, ULP, r_sigmoid, l_sigmoid, 3},
    {"silu", KG_OP_SILU, false, ULP, r_silu, l_silu, 4},
    {"quick_gelu", KG_OP_QUICK_GELU, false, ULP, r_qgelu, l_qgelu, 4},
    {"tanh", KG_OP_TANH, false, ULP, r_tanh, l_tanh, 3},
    {"gelu_tanh", KG_OP_GELU_TANH, false, ABSX, r_gelu_tanh, l_gelu_tanh, 2e-7},
    {"gelu (erf)", KG_OP_GELU, false, ABSX, r_gelu, l_gelu, 2e-7},
    {"silu backward", KG_OP_SILU, true, ABS, r_silu_grad, l_silu_grad, 3e-7},
    {"quick_gelu backward", KG_OP_QUICK_GELU, true, ABS, r_qgelu_grad, NULL, 3e-7},
    {"gelu_tanh backward", KG_OP_GELU_TANH, true, ABS, r_gelu_tanh_grad, NULL, 1.5e-6},
    {"gelu (erf) backward", KG_OP_GELU, true, ABS, r_gelu_grad, NULL, 3e-7},
};
enum { NFN = sizeof fns / sizeof fns[0] };

static double ulp_of(double r) {
  double a = fabs(r);
  if (a < 0x1p-126) return 0x1p-149;
  int e;
  frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
  return ldexp(1.0, e - 24);
}

/* y = f(x) (or g * f'(x)) for a float tensor x through the engine */
static kg_tensor *run(const fn *f, kg_tensor *x) {
  kg_tensor *y = NULL;
  if (!f->grad) {
    if (kg_unary(&y, f->op, x)) return NULL;
    return y;
  }
  kg_tensor *g;
  if (kg_tensor_empty(&g, x->ndim, x->shape, KG_F32, x->device)) return NULL;
  float *gp = kg_data(g);
  for (int64_t i = 0, n = kg_numel(g); i < n; i++) gp[i] = 1;
  if (kg_tensor_empty(&y, x->ndim, x->shape, KG_F32, x->device)) return NULL;
  kg_unary_backward_params p = {f->op, 0, 0};
  const kg_tensor *in[2] = {g, x};
  kg_status s = kg_op_dispatch(KG_OP_UNARY_BACKWARD, 1, &y, 2, in, &p);
  kg_tensor_release(g);
  return s ? NULL : y;
}

/* inputs: every stride-th float pattern with |x| <= 128, and the special values */
static float *sweep(int64_t stride, int64_t *n) {
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.72f, 88.7228f, 88.73f, 89, -87.33f,
                                  -87.34f, -103.27f, -103.28f, -103.98f, -104, -150, 1e-30f, -1e-30f, 0x1p-149f};
  uint32_t top = 0x43000000; /* 128.0f */
  int64_t m = 2 * (int64_t)(top / stride + 1) + (int64_t)(sizeof special / sizeof *special);
  float *x = malloc((size_t)m * sizeof *x);
  int64_t k = 0;
  for (uint32_t u = 0; u <= top; u += (uint32_t)stride) {
    memcpy(&x[k++], &u, 4);
    x[k] = -x[k - 1];
    k++;
  }
  for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[k++] = special[i];
  *n = k;
  return x;
}

/* results below this are "tiny": an intermediate such as exp(-|x|) may be subnormal there and
 * carry fewer bits, so they are held to an absolute bound (TINY_ABS) instead of ulp */
#define TINY 0x1p-100
#define TINY_ABS 0x1p-120

/* worst error of f over xs; *at: the input where it occurs; *tiny: worst absolute error of
 * the tiny results */
static double worst(const fn *f, const float *xs, int64_t n, float *at, double *tiny) {
  kg_tensor *x;
  int64_t shape[1] = {n};
  if (kg_tensor_empty(&x, 1, shape, KG_F32, (kg_device){KG_DEV_CPU, 0})) return INFINITY;
  memcpy(kg_data(x), xs, (size_t)n * 4);
  kg_tensor *y = run(f, x);
  if (!y) return INFINITY;
  const float *yp = kg_data(y);
  double w = 0;
  for (int64_t i = 0; i < n; i++) {
    double r = f->ref(xs[i]), e;
    float v = yp[i];
    if (isnan(r) || isnan(v)) e = isnan(r) == isnan(v) ? 0 : INFINITY;
    else if (fabs(r) > 3.4028234663852886e38) e = isinf(v) && (v > 0) == (r > 0) ? 0 : INFINITY;
    else if (isinf(r)) e = v == r ? 0 : INFINITY;
    else if (f->metric == ABS) e = fabs(v - r);
    else if (f->metric == ABSX) e = fabs(v - r) / (1 + fabs(xs[i]));
    else if (fabs(r) < TINY) {
      if (fabs(v - r) > *tiny) *tiny = fabs(v - r);
      continue;
    } else e = fabs(v - r) / ulp_of(r);
    if (e > w) w = e, *at = xs[i];
  }
  kg_tensor_release(x), kg_tensor_release(y);
  return w;
}

static int check_all(int64_t stride, bool print) {
  int64_t n;
  float *xs = sweep(stride, &n);
  int bad = 0;
  const char *path = getenv("KENG_NO_SIMD") ? "scalar" : "simd";
  for (int i = 0; i < NFN; i++) {
    float at = 0;
    double tiny = 0, w = worst(&fns[i], xs, n, &at, &tiny);
    bool ok = w <= fns[i].bound && tiny <= TINY_ABS;
    if (print || !ok)
      printf("%-7s %-24s worst %.3g %s at x = %.9g (tiny results: %.2g abs)%s\n", path, fns[i].name, w,
             metric_name[fns[i].metric], at, tiny, ok ? "" : "  FAIL");
    bad += !ok;
  }
  printf("%s: %lld inputs per function, %d failures\n", path, (long long)n, bad);
  free(xs);
  return bad;
}

static void timing(void) {
  enum { N = 65536, REPS = 200 };
  kg_tensor *x;
  int64_t shape[1] = {N};
  kg_tensor_empty(&x, 1, shape, KG_F32, (kg_device){KG_DEV_CPU, 0});
  float *xp = kg_data(x), *buf = malloc(N * sizeof *buf);
  for (int i = 0; i < N; i++) xp[i] = (float)((i * 37 % 2001) - 1000) / 100.0f;
  printf("\nns/element, %d elements in cache, 1 thread (median of 5 x %d calls)\n", N, REPS);
  for (int i = 0; i < NFN; i++) {
    double tk[5], tl[5];
    for (int r = 0; r < 5; r++) {
      double t0 = lab_wall_seconds();
      for (int k = 0; k < REPS; k++) kg_tensor_release(run(&fns[i], x));
      tk[r] = (lab_wall_seconds() - t0) / REPS / N * 1e9;
      t0 = lab_wall_seconds();
      if (fns[i].libm)
        for (int k = 0; k < REPS; k++)
          for (int j = 0; j < N; j++) buf[j] = fns[i].libm(xp[j]);
      tl[r] = fns[i].libm ? (lab_wall_seconds() - t0) / REPS / N * 1e9 : 0;
    }
    for (int a = 0; a < 5; a++)
      for (int b = a + 1; b < 5; b++) {
        if (tk[b] < tk[a]) { double t = tk[a]; tk[a] = tk[b]; tk[b] = t; }
        if (tl[b] < tl[a]) { double t = tl[a]; tl[a] = tl[b]; tl[b] = t; }
      }
    if (fns[i].libm) printf("%-24s keng %.2f   libm float loop %.2f\n", fns[i].name, tk[2], tl[2]);
    else printf("%-24s keng %.2f\n", fns[i].name, tk[2]);
  }
  free(buf);
  kg_tensor_release(x);
}

int main(int argc, char **argv) {
  kg_set_num_threads(1);
  if (argc > 1 && strcmp(argv[1], "--check") == 0) {
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) { /* the scalar fallback, decided once per process */
      setenv("KENG_NO_SIMD", "1", 1);
      kg_env_reload(); /* the engine reads its switches once */
      exit(check_all(997, false) ? 1 : 0);
    }
    int bad = check_all(997, false), st = 1;
    waitpid(child, &st, 0);
    return bad || !WIFEXITED(st) || WEXITSTATUS(st) ? 1 : 0;
  }
  int64_t stride = argc > 1 ? atoll(argv[1]) : 61;
  check_all(stride, true);
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    setenv("KENG_NO_SIMD", "1", 1);
    kg_env_reload();
    exit(check_all(stride, true) ? 1 : 0);
  }
  int st;
  waitpid(child, &st, 0);
  timing();
  return 0;
}
