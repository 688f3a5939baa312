/* elementwise.c (cpu) — unary, binary, clamp, where and the fused unary backward.
 * Each run of elements is loaded into a float (double when any operand is f64 or integer)
 * buffer, computed with the formulas of the op's row in engine/ops/elementwise.def (one loop
 * per row and compute type, generated below), and stored in the output dtype.
 * Float runs of tanh, gelu_tanh, exp, sigmoid, silu, quick_gelu and gelu (and the backward of
 * gelu_tanh, silu, quick_gelu, gelu) override their row with the libm-free formulas below,
 * declared in the f32_fast table: AVX2+FMA 8 lanes when the CPU has them, else a scalar loop
 * with the same formula. f64 stays on libm. */
#include "cpu.h"

#include <keng/scalar.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#if defined(__x86_64__) || defined(__i386__)
#define KG_X86 1
#endif

/* ---- float tanh without libm: AVX2+FMA, 8 lanes (scalar: the same formula) -----------------
 * |x| < 0.3: odd Taylor series through x^11 (truncation < 2e-9 relative);
 * else: tanh a = (1 - e) / (1 + e), e = exp(-2a) with a clamped to 9 (tanh rounds to 1 above),
 * exp by 2^n * p(r), r = z - n ln2 in [-ln2/2, ln2/2], p the degree-7 Taylor polynomial.
 * Error against libm in double over every float: docs/kernels.md. f64 stays on libm. */
/* Horner steps: acc = acc * u + c, for the scalar (S) and the vector (V) code */
#define TANH_SMALL(P, C, a, a2) \
  P(a, P(a2, P(a2, P(a2, P(a2, P(a2, C(-1382.0f / 155925), 62.0f / 2835), -17.0f / 315), 2.0f / 15), -1.0f / 3), 1.0f), 0.0f)
#define EXP_POLY(P, C, r) \
  P(r, P(r, P(r, P(r, P(r, P(r, P(r, C(1.0f / 5040), 1.0f / 720), 1.0f / 120), 1.0f / 24), 1.0f / 6), 0.5f), 1.0f), 1.0f)
#define LN2_HI 0.693145751953125f
#define LN2_LO 1.42860682030941723212e-6f

static inline float tanh_scalar(float x) {
#define SP(u, acc, c) ((acc) * (u) + (c))
#define SC(c) (c)
  float a = x < 0 ? -x : x, a2 = a * a;
  float small = TANH_SMALL(SP, SC, a, a2);
  float z = -2.0f * (a < 9.0f ? a : 9.0f);
  float n = nearbyintf(z * 1.44269504088896341f);
  float r = z - n * LN2_HI - n * LN2_LO;
  int32_t bits = ((int32_t)n + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, 4);
  float e = EXP_POLY(SP, SC, r) * two_n;
  float t = a < 0.3f ? small : (1.0f - e) / (1.0f + e);
  t = x < 0 ? -t : t;
  return x != x ? x : t;
#undef SP
#undef SC
}


/* ---- float exp and the sigmoid family without libm (scalar: the same formula as exp8) ------
 * exp x = 2^n * p(r), n = round(x / ln2), r = x - n ln2 (two-part ln2, exact n * LN2_HI),
 * p the degree-7 Taylor polynomial on |r| <= ln2/2 (truncation < 0.1 ulp). x is clamped to
 * [-110, 88.8] (exp rounds to 0 below, overflows above) and 2^n is applied as 2^(n>>1) *
 * 2^(n - (n>>1)) so that both factors are normal floats and results in the subnormal range
 * are still rounded once from a normal number. NaN stays NaN.
 * sigmoid from e = exp(-|x|), d = 1 / (1 + e) (exact division): sigmoid = d and 1 - sigmoid =
 * e d for x >= 0, the reverse below, so neither tail cancels (1 - s for large x is e d, not
 * 1 - d; results down to the subnormals keep their precision, unlike 1 / (1 + exp(-x)));
 * silu x = x sigmoid x, quick_gelu x = x sigmoid(1.702 x), their derivatives
 * s (1 + a (1 - s)) with a = x or 1.702 x. Error against libm in double: docs/kernels.md. */
static inline float pow2i(int32_t n) {
  int32_t bits = (n + 127) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline float exp_scalar(float x) {
#define SP(u, acc, c) ((acc) * (u) + (c))
#define SC(c) (c)
  if (x != x) return x;
  float c = x > 88.8f ? 88.8f : x < -110.0f ? -110.0f : x;
  float n = nearbyintf(c * 1.44269504088896341f);
  float r = c - n * LN2_HI - n * LN2_LO;
  int32_t ni = (int32_t)n, n1 = ni >> 1;
  return EXP_POLY(SP, SC, r) * pow2i(n1) * pow2i(ni - n1);
#undef SP
#undef SC
}

/* exact GELU: x Phi(x), Phi(x) = erfc(-x/sqrt2) / 2. erfc(a), a >= 0, is the Chebyshev fit
 * t exp(-a^2 + ERFC_POLY(t)), t = 1 / (1 + a/2) (Numerical Recipes' erfcc, relative error
 * below 1.2e-7 for every a >= 0), so the x << 0 tail keeps its relative precision where
 * 1 + erf(x/sqrt2) cancels. Phi'(x) = exp(-x^2/2) / sqrt(2 pi). */
#define ERFC_POLY(P, C, t)                                                                                     \
  P(t, P(t, P(t, P(t, P(t, P(t, P(t, P(t, P(t, C(0.17087277f), -0.82215223f), 1.48851587f), -1.13520398f),   \
                              0.27886807f), -0.18628806f), 0.09678418f), 0.37409196f), 1.00002368f), -1.26551223f)
#define RSQRT2 0.70710678118654752f
#define RSQRT2PI 0.39894228040143268f

/* Phi(x) and, when dphi is given, *dphi = x Phi'(x) */
static inline float phi_scalar(float x, float *dphi) {
#define SP(u, acc, c) ((acc) * (u) + (c))
#define SC(c) (c)
  float a = fabsf(x) * RSQRT2, t = 1.0f / (1.0f + 0.5f * a);
  float half_erfc = 0.5f * t * exp_scalar(ERFC_POLY(SP, SC, t) - a * a);
  if (dphi) *dphi = x * RSQRT2PI * exp_scalar(-a * a);
  return x < 0 ? half_erfc : 1.0f - half_erfc;
#undef SP
#undef SC
}

/* sigmoid x and *rest = 1 - sigmoid x, each from e = exp(-|x|) without cancellation */
static inline float sigmoid_scalar(float x, float *rest) {
  float e = exp_scalar(x < 0 ? x : -x), d = 1.0f / (1.0f + e), ed = e * d;
  *rest = x < 0 ? d : ed;
  return x < 0 ? ed : d;
}

/* the exp family: forward ops, and the backward of the ones saving their input */
enum { F_EXP, F_SIGMOID, F_SILU, F_QUICK_GELU, F_SILU_GRAD, F_QUICK_GELU_GRAD, F_GELU, F_GELU_GRAD };

#ifdef KG_X86
#include <immintrin.h>
#define VP(u, acc, c) _mm256_fmadd_ps(acc, u, _mm256_set1_ps(c))
#define VC(c) _mm256_set1_ps(c)
__attribute__((target("avx2,fma"))) static inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a = _mm256_andnot_ps(sign, x), a2 = _mm256_mul_ps(a, a);
  __m256 small = TANH_SMALL(VP, VC, a, a2);
  __m256 z = _mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_min_ps(a, _mm256_set1_ps(9.0f)));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), z));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 e = _mm256_mul_ps(EXP_POLY(VP, VC, r), _mm256_castsi256_ps(bits));
  __m256 one = _mm256_set1_ps(1.0f);
  __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.3f), _CMP_LT_OQ));
  t = _mm256_or_ps(t, _mm256_and_ps(sign, x));                            /* sign of x */
  return _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));       /* NaN stays */
}

__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
  __m256 c = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.8f)), _mm256_set1_ps(-110.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), c));
  __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(EXP_POLY(VP, VC, r), s1), s2);
  return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* NaN stays */
}

/* op 0: tanh, 1: gelu (tanh form), 2: g * gelu'(s); returns elements done */
__attribute__((target("avx2,fma"))) static int64_t tanh_family8(int op, float *y, const float *x, const float *g, int64_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), k0 = _mm256_set1_ps((float)KG_SQRT2_PI),
               k1 = _mm256_set1_ps(0.044715f), k3 = _mm256_set1_ps(3 * 0.044715f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i), out;
    if (op == 0) {
      out = tanh8(v);
    } else {
      __m256 v2 = _mm256_mul_ps(v, v);
      __m256 t = tanh8(_mm256_mul_ps(k0, _mm256_fmadd_ps(_mm256_mul_ps(k1, v2), v, v)));
      __m256 hv = _mm256_mul_ps(half, v);
      if (op == 1) {
        out = _mm256_fmadd_ps(hv, t, hv); /* 0.5 x (1 + t) */
      } else {
        __m256 d = _mm256_fmadd_ps(half, t, half);                       /* 0.5 (1 + t) */
        __m256 sech2 = _mm256_fnmadd_ps(t, t, one);
        __m256 du = _mm256_mul_ps(k0, _mm256_fmadd_ps(k3, v2, one));
        out = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_fmadd_ps(_mm256_mul_ps(hv, sech2), du, d));
      }
    }
    _mm256_storeu_ps(y + i, out);
  }
  return i;
}


/* y = f(x) (or g * f'(x) for the _GRAD codes); returns elements done */
__attribute__((target("avx2,fma"))) static int64_t exp_family8(int op, float *y, const float *x, const float *g, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), k = _mm256_set1_ps(1.702f), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i), out;
    if (op == F_EXP) {
      out = exp8(v);
    } else if (op == F_GELU || op == F_GELU_GRAD) {
      __m256 a = _mm256_mul_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(RSQRT2)), a2 = _mm256_mul_ps(a, a);
      __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5f), a, one));
      __m256 he = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), t), exp8(_mm256_sub_ps(ERFC_POLY(VP, VC, t), a2)));
      __m256 ph = _mm256_blendv_ps(_mm256_sub_ps(one, he), he, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
      if (op == F_GELU) {
        out = _mm256_mul_ps(v, ph);
      } else { /* g (Phi + x Phi') */
        __m256 dph = _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(RSQRT2PI)), exp8(_mm256_xor_ps(a2, sign)));
        out = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_add_ps(ph, dph));
      }
    } else {
      __m256 a = op == F_QUICK_GELU || op == F_QUICK_GELU_GRAD ? _mm256_mul_ps(k, v) : v;
      __m256 e = exp8(_mm256_or_ps(a, sign)); /* exp(-|a|) */
      __m256 d = _mm256_div_ps(one, _mm256_add_ps(one, e)), ed = _mm256_mul_ps(e, d);
      __m256 neg = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ);
      __m256 sg = _mm256_blendv_ps(d, ed, neg), rest = _mm256_blendv_ps(ed, d, neg); /* s, 1 - s */
      if (op == F_SIGMOID) out = sg;
      else if (op == F_SILU || op == F_QUICK_GELU) out = _mm256_mul_ps(v, sg);
      else /* g * s (1 + a (1 - s)) */
        out = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_mul_ps(sg, _mm256_fmadd_ps(a, rest, one)));
    }
    _mm256_storeu_ps(y + i, out);
  }
  return i;
}

#undef VP
#undef VC

#endif

static void tanh_family(int op, float *y, const float *x, const float *g, int64_t n) {
  int64_t i = 0;
#ifdef KG_X86
  if (kg_cpu_avx2_fma()) i = tanh_family8(op, y, x, g, n);
#endif
  for (; i < n; i++) {
    float v = x[i];
    if (op == 0) {
      y[i] = tanh_scalar(v);
    } else {
      float t = tanh_scalar((float)KG_SQRT2_PI * (v + 0.044715f * v * v * v));
      y[i] = op == 1 ? 0.5f * v * (1.0f + t)
                     : g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * (float)KG_SQRT2_PI * (1.0f + 3 * 0.044715f * v * v));
    }
  }
}

static void exp_family(int op, float *y, const float *x, const float *g, int64_t n) {
  int64_t i = 0;
#ifdef KG_X86
  if (kg_cpu_avx2_fma()) i = exp_family8(op, y, x, g, n);
#endif
  for (; i < n; i++) {
    float v = x[i];
    if (op == F_EXP) {
      y[i] = exp_scalar(v);
      continue;
    }
    if (op == F_GELU || op == F_GELU_GRAD) {
      float dph, ph = phi_scalar(v, op == F_GELU ? NULL : &dph);
      y[i] = op == F_GELU ? v * ph : g[i] * (ph + dph);
      continue;
    }
    float a = op == F_QUICK_GELU || op == F_QUICK_GELU_GRAD ? 1.702f * v : v, rest, sg = sigmoid_scalar(a, &rest);
    y[i] = op == F_SIGMOID ? sg : op == F_SILU || op == F_QUICK_GELU ? v * sg : g[i] * (sg * (a * rest + 1.0f));
  }
}

void kg_cpu_exp_f32(float *y, const float *x, int64_t n) { exp_family(F_EXP, y, x, NULL, n); }

/* ---- the formulas of elementwise.def as loops ------------------------------------------------
 * One loop per row and compute type: y = f(a) or f(a, b); for the backward dx = g f'(s) with
 * g in a and s in b. T is a typedef inside each loop, so the table's formulas read as written. */
typedef void (*ew_loop_f32)(float *y, const float *a, const float *b, int64_t n);
typedef void (*ew_loop_f64)(double *y, const double *a, const double *b, int64_t n);

#define UNARY_LOOP(name, T_, sfx, F)                                                        \
  static void fwd_##name##_##sfx(T_ *y, const T_ *a, const T_ *b, int64_t n) {              \
    typedef T_ T;                                                                           \
    (void)b;                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T x = a[i];                                                                           \
      y[i] = (F);                                                                           \
    }                                                                                       \
  }
#define BINARY_LOOP(name, T_, sfx, F)                                                       \
  static void fwd_##name##_##sfx(T_ *y, const T_ *a_, const T_ *b_, int64_t n) {            \
    typedef T_ T;                                                                           \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T a = a_[i], b = b_[i];                                                               \
      y[i] = (F);                                                                           \
    }                                                                                       \
  }
#define GRAD_LOOP(name, T_, sfx, D)                                                         \
  static void grad_##name##_##sfx(T_ *dx, const T_ *g_, const T_ *s_, int64_t n) {          \
    typedef T_ T;                                                                           \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T g = g_[i], s = s_[i];                                                               \
      (void)s;                                                                              \
      dx[i] = (D);                                                                          \
    }                                                                                       \
  }
#define GRAD_LOOPS_GRAD(name, D) GRAD_LOOP(name, float, f32, D) GRAD_LOOP(name, double, f64, D)
#define GRAD_LOOPS_NOGRAD(name, D)
#define KG_UNARY(ID, name, saves, grad, flags, F, D) \
  UNARY_LOOP(name, float, f32, F) UNARY_LOOP(name, double, f64, F) GRAD_LOOPS_##grad(name, D)
#define KG_BINARY(ID, name, saves, grad, flags, F) BINARY_LOOP(name, float, f32, F) BINARY_LOOP(name, double, f64, F)
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY

typedef struct {
  ew_loop_f32 f32;
  ew_loop_f64 f64;
  ew_loop_f32 grad_f32; /* NULL: no backward (NOGRAD, binary) */
  ew_loop_f64 grad_f64;
} ew_loops;
#define GRAD_PTRS_GRAD(name) grad_##name##_f32, grad_##name##_f64
#define GRAD_PTRS_NOGRAD(name) NULL, NULL
static const ew_loops loops[KG_OP_COUNT] = {
#define KG_UNARY(ID, name, saves, grad, flags, F, D) [KG_OP_##ID] = {fwd_##name##_f32, fwd_##name##_f64, GRAD_PTRS_##grad(name)},
#define KG_BINARY(ID, name, saves, grad, flags, F) [KG_OP_##ID] = {fwd_##name##_f32, fwd_##name##_f64, NULL, NULL},
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
};

/* ---- declared overrides: float runs of these rows use the libm-free formulas above ----------
 * (AVX2+FMA when present, else their scalar form; docs/kernels.md). Each computes its row's
 * formula to within the bounds that tests/lab/lab_elementwise --check enforces. */
static void fast_tanh(float *y, const float *x, const float *u, int64_t n) { tanh_family(0, y, x, NULL, n); }
static void fast_gelu_tanh(float *y, const float *x, const float *u, int64_t n) { tanh_family(1, y, x, NULL, n); }
static void fast_exp(float *y, const float *x, const float *u, int64_t n) { exp_family(F_EXP, y, x, NULL, n); }
static void fast_sigmoid(float *y, const float *x, const float *u, int64_t n) { exp_family(F_SIGMOID, y, x, NULL, n); }
static void fast_silu(float *y, const float *x, const float *u, int64_t n) { exp_family(F_SILU, y, x, NULL, n); }
static void fast_quick_gelu(float *y, const float *x, const float *u, int64_t n) { exp_family(F_QUICK_GELU, y, x, NULL, n); }
static void fast_gelu(float *y, const float *x, const float *u, int64_t n) { exp_family(F_GELU, y, x, NULL, n); }
/* backward: dx = g f'(s), g in the first input, s in the second */
static void fast_gelu_tanh_grad(float *dx, const float *g, const float *s, int64_t n) { tanh_family(2, dx, s, g, n); }
static void fast_silu_grad(float *dx, const float *g, const float *s, int64_t n) { exp_family(F_SILU_GRAD, dx, s, g, n); }
static void fast_quick_gelu_grad(float *dx, const float *g, const float *s, int64_t n) {
  exp_family(F_QUICK_GELU_GRAD, dx, s, g, n);
}
static void fast_gelu_grad(float *dx, const float *g, const float *s, int64_t n) { exp_family(F_GELU_GRAD, dx, s, g, n); }

static const struct {
  ew_loop_f32 fwd, grad;
} f32_fast[KG_OP_COUNT] = {
    [KG_OP_TANH] = {fast_tanh, NULL},
    [KG_OP_GELU_TANH] = {fast_gelu_tanh, fast_gelu_tanh_grad},
    [KG_OP_EXP] = {fast_exp, NULL},
    [KG_OP_SIGMOID] = {fast_sigmoid, NULL},
    [KG_OP_SILU] = {fast_silu, fast_silu_grad},
    [KG_OP_QUICK_GELU] = {fast_quick_gelu, fast_quick_gelu_grad},
    [KG_OP_GELU] = {fast_gelu, fast_gelu_grad},
};

typedef struct {
  kg_op op;
  kg_dtype dt[KG_ITER_MAX];
  int nops;
  bool wide;
  const void *params;
  ew_loop_f32 f32; /* the row's loop (or its override) for UNARY, BINARY and UNARY_BACKWARD */
  ew_loop_f64 f64;
} ew_ctx;

/* an absent bound is -inf / +inf; a NaN bound makes every element NaN and a NaN element stays
 * NaN (PyTorch) */
#define CLAMP_BODY(T, y, x, n, lo, hi)                                  \
  for (int64_t i = 0; i < n; i++) {                                     \
    T v = x[i];                                                         \
    if (v < (T)lo) v = (T)lo;                                           \
    if (v > (T)hi) v = (T)hi;                                           \
    y[i] = (lo != lo || hi != hi) ? (T)NAN : v;                         \
  }

#define WHERE_BODY(y, c, a, b, n) \
  for (int64_t i = 0; i < n; i++) y[i] = c[i] != 0 ? a[i] : b[i];

/* one chunk: y = f(a[, b]), clamp, where, or (UNARY_BACKWARD) dx = g f'(s) with g in a, s in b.
 * f32 / f64 pick the loop of the compute type T. */
#define EW_CHUNK(T, LOOP, c, y, a, b, w, n)                                                      \
  switch ((c)->op) {                                                                             \
  case KG_OP_CLAMP: {                                                                            \
    const kg_clamp_params *p = (c)->params;                                                      \
    CLAMP_BODY(T, y, a, n, p->lo, p->hi)                                                         \
  } break;                                                                                       \
  case KG_OP_WHERE: WHERE_BODY(y, a, b, w, n) break;                                             \
  default:                                                                                       \
    if ((c)->LOOP) (c)->LOOP(y, a, b, n);                                                        \
    else { /* the backward of clamp: the gradient passes inside [lo, hi] */                      \
      const kg_unary_backward_params *p = (c)->params;                                           \
      double lo = p->lo, hi = p->hi;                                                             \
      for (int64_t i = 0; i < n; i++) y[i] = (b[i] >= lo && b[i] <= hi) ? a[i] : (T)0;           \
    }                                                                                            \
  }

/* one chunked run; T is float or double, LOAD/STORE the matching converters */
#define EW_RUN(T, LOOP, LOAD, STORE)                                                             \
  {                                                                                              \
    T buf[KG_ITER_MAX][KG_CHUNK];                                                                \
    for (int64_t i = 0; i < n; i += KG_CHUNK) {                                                  \
      int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;                                           \
      for (int k = 1; k < c->nops; k++)                                                          \
        LOAD(buf[k], ptr[k] + i * stride[k] * kg_dtype_info[c->dt[k]].size, c->dt[k], stride[k], m); \
      EW_CHUNK(T, LOOP, c, buf[0], buf[1], buf[2], buf[3], m)                                    \
      STORE(ptr[0] + i * stride[0] * kg_dtype_info[c->dt[0]].size, c->dt[0], stride[0], buf[0], m); \
    }                                                                                            \
  }

/* the same run computed in place on the operands' memory: every operand f32 with unit stride
 * (the common case), so the two chunk copies per element are skipped */
static void ew_run_f32_direct(const ew_ctx *c, char *const *ptr, int64_t n) {
  float *y = (float *)ptr[0];
  const float *a = (const float *)ptr[1], *b = c->nops > 2 ? (const float *)ptr[2] : NULL, *w = NULL;
  EW_CHUNK(float, f32, c, y, a, b, w, n)
}

/* and no input overlaps the output except exactly (in place): a shifted overlap would read
 * elements already written, which the chunked path does not */
static bool all_f32_unit(const ew_ctx *c, char *const *ptr, const int64_t *stride, int64_t n) {
  if (c->wide || c->op == KG_OP_WHERE) return false;
  for (int k = 0; k < c->nops; k++) {
    if (c->dt[k] != KG_F32 || stride[k] != 1) return false;
    if (k > 0 && ptr[k] != ptr[0] && ptr[k] < ptr[0] + n * 4 && ptr[0] < ptr[k] + n * 4) return false;
  }
  return true;
}

/* f32 operands with unit stride, except inputs broadcast along the run (stride 0, e.g. the
 * outer sum x[..., n, 1] + y[..., 1, n] of SAM's relative-position bias, or a per-row bias):
 * those are expanded once into a chunk buffer and the run is computed in place. Inputs must not
 * overlap the output at all (a broadcast element inside it would change while the run is written) */
static bool f32_unit_or_broadcast(const ew_ctx *c, char *const *ptr, const int64_t *stride, int64_t n) {
  if (c->wide || c->op == KG_OP_WHERE || c->dt[0] != KG_F32 || stride[0] != 1) return false;
  for (int k = 1; k < c->nops; k++) {
    if (c->dt[k] != KG_F32 || (stride[k] != 1 && stride[k] != 0)) return false;
    int64_t len = stride[k] ? n * 4 : 4;
    if (ptr[k] < ptr[0] + n * 4 && ptr[0] < ptr[k] + len) return false;
  }
  return true;
}

static void ew_run_f32_broadcast(const ew_ctx *c, char *const *ptr, const int64_t *stride, int64_t n) {
  float expanded[KG_ITER_MAX][KG_CHUNK];
  int64_t first = n < KG_CHUNK ? n : KG_CHUNK;
  for (int k = 1; k < c->nops; k++)
    if (stride[k] == 0)
      for (int64_t j = 0; j < first; j++) expanded[k][j] = *(const float *)ptr[k];
  for (int64_t i = 0; i < n; i += KG_CHUNK) {
    char *p[KG_ITER_MAX] = {ptr[0] + i * 4};
    for (int k = 1; k < c->nops; k++) p[k] = stride[k] ? ptr[k] + i * 4 : (char *)expanded[k];
    ew_run_f32_direct(c, p, n - i < KG_CHUNK ? n - i : KG_CHUNK);
  }
}

static void ew_run(void *ctx, char *const *ptr, const int64_t *stride, int64_t n) {
  const ew_ctx *c = ctx;
  if (all_f32_unit(c, ptr, stride, n)) ew_run_f32_direct(c, ptr, n);
  else if (f32_unit_or_broadcast(c, ptr, stride, n)) ew_run_f32_broadcast(c, ptr, stride, n);
  else if (c->wide) EW_RUN(double, f64, kg_cpu_load_f64, kg_cpu_store_f64)
  else EW_RUN(float, f32, kg_cpu_load_f32, kg_cpu_store_f32)
}

static kg_status run(const kg_op_call *call) {
  ew_ctx c = {call->op, {0}, 1 + call->nin, false, call->params, NULL, NULL};
  if (call->op == KG_OP_UNARY_BACKWARD) {
    kg_op op = ((const kg_unary_backward_params *)call->params)->op;
    if (op != KG_OP_CLAMP) {
      c.f32 = f32_fast[op].grad ? f32_fast[op].grad : loops[op].grad_f32;
      c.f64 = loops[op].grad_f64;
      if (!c.f32) return kg_error(KG_ERR_VALUE, "unary_backward", "%s has no derivative", kg_op_info[op].name);
    }
  } else if (call->op != KG_OP_CLAMP && call->op != KG_OP_WHERE) {
    c.f32 = f32_fast[call->op].fwd ? f32_fast[call->op].fwd : loops[call->op].f32;
    c.f64 = loops[call->op].f64;
  }
  const kg_tensor *ts[KG_ITER_MAX] = {call->out[0]};
  c.dt[0] = call->out[0]->dtype;
  c.wide = kg_cpu_wide(c.dt[0]);
  for (int k = 0; k < call->nin; k++) {
    ts[k + 1] = call->in[k];
    c.dt[k + 1] = call->in[k]->dtype;
    if (kg_cpu_wide(c.dt[k + 1])) c.wide = true;
  }
  kg_iter it;
  kg_iter_init(&it, c.nops, ts);
  kg_iter_run(&it, ew_run, &c);
  return KG_OK;
}

/* kg_cpu_<name> for every row of elementwise.def, and the ops with their own bodies */
#define KG_UNARY(ID, name, saves, grad, flags, F, D) \
  kg_status kg_cpu_##name(const kg_op_call *c) { return run(c); }
#define KG_BINARY(ID, name, saves, grad, flags, F) \
  kg_status kg_cpu_##name(const kg_op_call *c) { return run(c); }
#include "../ops/elementwise.def"
#undef KG_UNARY
#undef KG_BINARY
kg_status kg_cpu_clamp(const kg_op_call *c) { return run(c); }
kg_status kg_cpu_where(const kg_op_call *c) { return run(c); }
kg_status kg_cpu_unary_backward(const kg_op_call *c) { return run(c); }
