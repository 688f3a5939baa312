/* test_core.c — the engine core against hand-computed facts and naive loops: view shapes,
 * strides and offsets; bf16/f16 rounding bit patterns; the CPU allocator; every existing CPU
 * kernel (elementwise with broadcasting and strides, sum, matmul, copy with dtype conversion)
 * compared with a plain loop in this file, printing the worst element of each comparison.
 *
 * Shape letters: N rows, K reduction, M columns, B batch.
 * Run: ctest -R test_core (or ./build/test_core); exits non-zero when any check fails.
 */
#include <core/internal.h>
#include <cpu/attention.h>
#include <cpu/cpu.h>
#include <cpu/gemm_bf16.h>
#include <cpu/quant.h>
#include <keng/keng.h>
#include <keng/scalar.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small assertion kit ------------------------------------------------------------------ */

static int checks, failures;

#define CHECK(cond) CHECKM(cond, "%s", "")
#define CHECKM(cond, ...)                                                  \
  do {                                                                     \
    checks++;                                                              \
    if (!(cond)) {                                                         \
      failures++;                                                          \
      fprintf(stderr, "%s:%d: FAILED: %s ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
    }                                                                      \
  } while (0)
/* an engine call that must succeed */
#define OK(expr)                                                                            \
  do {                                                                                      \
    kg_status ok_s_ = (expr);                                                               \
    CHECKM(ok_s_ == KG_OK, "-> status %d: %s", (int)ok_s_, kg_last_error());                \
  } while (0)
/* an engine call that must fail with `code` and a message containing `needle` */
#define FAILS(expr, code, needle)                                                                   \
  do {                                                                                              \
    kg_status f_s_ = (expr);                                                                        \
    CHECKM(f_s_ == (code), "-> status %d, expected %d (%s)", (int)f_s_, (int)(code), kg_last_error()); \
    CHECKM(strstr(kg_last_error(), (needle)) != NULL, "message '%s' lacks '%s'", kg_last_error(), (needle)); \
  } while (0)

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define EQ_DIMS(t, n, ...) dims_eq((t)->ndim, (t)->shape, n, (const int64_t[]){__VA_ARGS__})
#define EQ_STRIDES(t, n, ...) dims_eq((t)->ndim, (t)->stride, n, (const int64_t[]){__VA_ARGS__})

static bool dims_eq(int nd, const int64_t *got, int n, const int64_t *want) {
  if (nd != n) return false;
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) return false;
  return true;
}

/* Compares n values, prints the worst element, counts a failure if its error exceeds tol.
 * err = |got - want| / (1 + |want|); NaN matches NaN, equal infinities match. */
static void compare(const char *what, const double *got, const double *want, int64_t n, double tol) {
  double worst = 0;
  int64_t wi = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i], e;
    if ((isnan(g) && isnan(w)) || g == w) e = 0;
    else e = fabs(g - w) / (1 + fabs(w));
    if (isnan(e)) e = INFINITY;
    if (e > worst) worst = e, wi = i;
  }
  bool ok = worst <= tol;
  printf("  %-4s %-44s worst element %lld: %.9g vs %.9g (err %.3g, tol %.3g)\n", ok ? "ok" : "FAIL", what,
         (long long)wi, n ? got[wi] : 0.0, n ? want[wi] : 0.0, worst, tol);
  checks++;
  if (!ok) failures++;
}

/* deterministic test values, not all representable in bf16 */
static double val(int64_t i) { return sin(0.37 * (double)i + 0.1) * 3.0; }

/* a contiguous tensor of `shape` filled with val(i + seed) */
static kg_tensor *filled(int nd, const int64_t *shape, kg_dtype dt, int seed) {
  kg_tensor *t = NULL;
  if (kg_tensor_empty(&t, nd, shape, dt, KG_CPU)) {
    fprintf(stderr, "allocation failed: %s\n", kg_last_error());
    exit(2);
  }
  for (int64_t i = 0; i < kg_numel(t); i++) kg_set_flat(t, i, val(i + seed));
  return t;
}

/* element of t at the multi-index idx of a (broadcast) shape of nd dims, as double */
static double at(const kg_tensor *t, int nd, const int64_t *idx) {
  int64_t off = t->offset;
  for (int d = 0; d < t->ndim; d++) {
    int64_t i = idx[nd - t->ndim + d];
    if (t->shape[d] == 1) i = 0;
    off += i * t->stride[d];
  }
  return kg_load_as_double(t->storage->data, t->dtype, off);
}

/* flat index -> multi-index for shape */
static void unravel(int64_t i, int nd, const int64_t *shape, int64_t *idx) {
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
}

/* what storing v into dtype dt gives back */
static double rounded(double v, kg_dtype dt) {
  switch (dt) {
  case KG_F32: return (float)v;
  case KG_BF16: return kg_bf16_to_f32(kg_f32_to_bf16((float)v));
  case KG_F16: return kg_f16_to_f32(kg_f32_to_f16((float)v));
  case KG_I32: case KG_I64: return trunc(v);
  case KG_BOOL: return v != 0;
  case KG_U8: return (double)(uint8_t)v;
  default: return v;
  }
}

static double *values(const kg_tensor *t) {
  int64_t n = kg_numel(t);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = kg_get_flat(t, i);
  return v;
}

/* ---- views and strides ------------------------------------------------------------------ */

static void test_views(void) {
  puts("views and strides");
  kg_tensor *x = filled(3, SHAPE(2, 3, 4), KG_F32, 0), *v = NULL, *w = NULL;
  CHECK(EQ_STRIDES(x, 3, 12, 4, 1));
  CHECK(kg_is_contiguous(x));
  CHECK(kg_numel(x) == 24);

  OK(kg_transpose(&v, x, 0, 2));
  CHECK(EQ_DIMS(v, 3, 4, 3, 2));
  CHECK(EQ_STRIDES(v, 3, 1, 4, 12));
  CHECK(v->offset == 0 && v->storage == x->storage);
  CHECK(!kg_is_contiguous(v));
  /* v[i][j][k] == x[k][j][i] */
  CHECK(kg_get_flat(v, 1 * 6 + 2 * 2 + 1) == kg_get_flat(x, 1 * 12 + 2 * 4 + 1));
  kg_tensor_release(v);

  OK(kg_transpose(&v, x, -1, -2)); /* negative dims count from the end */
  CHECK(EQ_DIMS(v, 3, 2, 4, 3));
  CHECK(EQ_STRIDES(v, 3, 12, 1, 4));
  kg_tensor_release(v);

  OK(kg_narrow(&v, x, 1, 1, 2));
  CHECK(EQ_DIMS(v, 3, 2, 2, 4));
  CHECK(EQ_STRIDES(v, 3, 12, 4, 1));
  CHECK(v->offset == 4);
  CHECK(!kg_is_contiguous(v));
  CHECK(kg_get_flat(v, 0) == kg_get_flat(x, 4));
  kg_tensor_release(v);

  OK(kg_narrow(&v, x, 0, 1, 1)); /* a narrowed leading dim stays contiguous */
  CHECK(v->offset == 12 && kg_is_contiguous(v));
  kg_tensor_release(v);

  OK(kg_narrow(&v, x, 2, -2, 2)); /* negative start counts from the end */
  CHECK(v->offset == 2 && EQ_DIMS(v, 3, 2, 3, 2));
  kg_tensor_release(v);

  OK(kg_select(&v, x, 1, 2));
  CHECK(EQ_DIMS(v, 2, 2, 4));
  CHECK(EQ_STRIDES(v, 2, 12, 1));
  CHECK(v->offset == 8);
  kg_tensor_release(v);

  OK(kg_select(&v, x, 2, -1));
  CHECK(EQ_DIMS(v, 2, 2, 3));
  CHECK(EQ_STRIDES(v, 2, 12, 4));
  CHECK(v->offset == 3);
  /* select of a select composes offsets */
  OK(kg_select(&w, v, 0, 1));
  CHECK(w->ndim == 1 && w->offset == 15 && w->stride[0] == 4);
  CHECK(kg_get_flat(w, 2) == kg_get_flat(x, 12 + 8 + 3));
  kg_tensor_release(w);
  kg_tensor_release(v);

  FAILS(kg_select(&v, x, 1, 3), KG_ERR_VALUE, "select");
  FAILS(kg_select(&v, x, 3, 0), KG_ERR_VALUE, "select");
  FAILS(kg_narrow(&v, x, 2, 3, 2), KG_ERR_VALUE, "narrow");
  FAILS(kg_transpose(&v, x, 0, 5), KG_ERR_VALUE, "transpose");

  kg_tensor *col = filled(2, SHAPE(3, 1), KG_F32, 5);
  OK(kg_expand(&v, col, 3, SHAPE(2, 3, 5)));
  CHECK(EQ_DIMS(v, 3, 2, 3, 5));
  CHECK(EQ_STRIDES(v, 3, 0, 1, 0));
  CHECK(!kg_is_contiguous(v));
  CHECK(kg_get_flat(v, 1 * 15 + 2 * 5 + 4) == kg_get_flat(col, 2));
  kg_tensor_release(v);
  OK(kg_expand(&v, col, 2, SHAPE(-1, 4))); /* -1 keeps the size */
  CHECK(EQ_DIMS(v, 2, 3, 4) && EQ_STRIDES(v, 2, 1, 0));
  kg_tensor_release(v);
  FAILS(kg_expand(&v, x, 3, SHAPE(2, 5, 4)), KG_ERR_SHAPE, "expand");
  FAILS(kg_expand(&v, x, 2, SHAPE(3, 4)), KG_ERR_SHAPE, "expand");
  kg_tensor_release(col);

  int perm[3] = {2, 0, 1};
  OK(kg_permute(&v, x, perm));
  CHECK(EQ_DIMS(v, 3, 4, 2, 3) && EQ_STRIDES(v, 3, 1, 12, 4));
  kg_tensor_release(v);
  int bad[3] = {0, 0, 1};
  FAILS(kg_permute(&v, x, bad), KG_ERR_VALUE, "permute");

  OK(kg_unsqueeze(&v, x, 1));
  CHECK(EQ_DIMS(v, 4, 2, 1, 3, 4) && kg_is_contiguous(v));
  OK(kg_squeeze(&w, v, KG_ALL_DIMS));
  CHECK(EQ_DIMS(w, 3, 2, 3, 4));
  kg_tensor_release(w);
  kg_tensor_release(v);

  /* size-1 dims may carry any stride and still be contiguous */
  kg_tensor *odd = NULL;
  OK(kg_tensor_view_raw(&odd, x, 3, SHAPE(1, 3, 4), SHAPE(999, 4, 1), 0));
  CHECK(kg_is_contiguous(odd));
  kg_tensor_release(odd);

  /* view: splitting a dim of a transposed tensor is a view; merging its dims is not */
  kg_tensor *m = filled(2, SHAPE(4, 6), KG_F32, 0), *mt = NULL;
  OK(kg_transpose(&mt, m, 0, 1)); /* [6,4] strides {1,6} */
  OK(kg_view(&v, mt, 3, SHAPE(6, 2, 2)));
  CHECK(EQ_STRIDES(v, 3, 1, 12, 6) && v->storage == m->storage);
  kg_tensor_release(v);
  FAILS(kg_view(&v, mt, 1, SHAPE(24)), KG_ERR_SHAPE, "view");
  OK(kg_reshape(&v, mt, 2, SHAPE(-1, 3))); /* copies */
  CHECK(EQ_DIMS(v, 2, 8, 3) && kg_is_contiguous(v) && v->storage != m->storage);
  for (int64_t i = 0; i < 24; i++) CHECK(kg_get_flat(v, i) == kg_get_flat(mt, i));
  kg_tensor_release(v);
  FAILS(kg_reshape(&v, mt, 2, SHAPE(5, -1)), KG_ERR_SHAPE, "reshape");
  FAILS(kg_reshape(&v, mt, 2, SHAPE(-1, -1)), KG_ERR_VALUE, "reshape");
  kg_tensor_release(mt);
  kg_tensor_release(m);

  /* a write through a view lands in the base */
  OK(kg_select(&v, x, 0, 1));
  OK(kg_fill_(v, 7));
  CHECK(kg_get_flat(x, 11) != 7 && kg_get_flat(x, 12) == 7 && kg_get_flat(x, 23) == 7);
  kg_tensor_release(v);
  kg_tensor_release(x);
}

/* ---- bf16 / f16 conversion --------------------------------------------------------------- */

static uint16_t bf(uint32_t f32bits) { return kg_f32_to_bf16(kg_bits_f32(f32bits)); }
static uint16_t hf(float f) { return kg_f32_to_f16(f); }
#define CHECK_BITS(got, want) CHECKM((got) == (want), "got 0x%04x, want 0x%04x", (unsigned)(got), (unsigned)(want))

static void test_half_formats(void) {
  puts("bf16 and f16 conversion");
  /* bf16: keep the top 16 bits of f32, rounding to nearest even */
  CHECK_BITS(bf(0x3f800000u), 0x3f80);  /* 1.0 */
  CHECK_BITS(bf(0xbfc00000u), 0xbfc0);  /* -1.5 */
  CHECK_BITS(bf(0x3f808000u), 0x3f80);  /* 1 + 2^-8: tie, 0x3f80 is even: down */
  CHECK_BITS(bf(0x3f818000u), 0x3f82);  /* 1 + 3*2^-8: tie, 0x3f81 is odd: up */
  CHECK_BITS(bf(0x3f808001u), 0x3f81);  /* just above the tie: up */
  CHECK_BITS(bf(0x3f807fffu), 0x3f80);  /* just below: down */
  CHECK_BITS(bf(0x7f800000u), 0x7f80);  /* inf */
  CHECK_BITS(bf(0xff800000u), 0xff80);  /* -inf */
  CHECK_BITS(bf(0x7f7fffffu), 0x7f80);  /* FLT_MAX rounds up to inf */
  CHECK_BITS(bf(0x7f7f0000u), 0x7f7f);  /* largest bf16 stays */
  CHECK_BITS(bf(0x00010000u), 0x0001);  /* subnormal, exact */
  CHECK_BITS(bf(0x00008000u), 0x0000);  /* subnormal tie to even (0) */
  CHECK_BITS(bf(0x00018000u), 0x0002);  /* subnormal tie to even (2) */
  CHECK_BITS(bf(0x80000000u), 0x8000);  /* -0 */
  uint16_t n1 = bf(0x7fc00000u), n2 = bf(0x7f800001u), n3 = bf(0xffffffffu);
  CHECKM((n1 & 0x7f80) == 0x7f80 && (n1 & 0x7f), "quiet NaN -> 0x%04x", n1);
  CHECKM((n2 & 0x7f80) == 0x7f80 && (n2 & 0x7f), "NaN with low payload -> 0x%04x (became inf?)", n2);
  CHECKM((n3 & 0x7f80) == 0x7f80 && (n3 & 0x7f), "NaN 0xffffffff -> 0x%04x", n3);
  CHECK(kg_f32_bits(kg_bf16_to_f32(0x3f81)) == 0x3f810000u);
  CHECK(kg_f32_bits(kg_bf16_to_f32(0x0001)) == 0x00010000u);
  CHECK(isnan(kg_bf16_to_f32(n2)));

  /* f16: 1 sign, 5 exponent (bias 15), 10 mantissa */
  CHECK_BITS(hf(1.0f), 0x3c00);
  CHECK_BITS(hf(-2.0f), 0xc000);
  CHECK_BITS(hf(0.5f), 0x3800);
  CHECK_BITS(hf(65504.0f), 0x7bff);                       /* max finite */
  CHECK_BITS(hf(65519.0f), 0x7bff);                       /* below the halfway point */
  CHECK_BITS(hf(65520.0f), 0x7c00);                       /* tie to even -> 65536: inf */
  CHECK_BITS(hf(1e6f), 0x7c00);                           /* overflow */
  CHECK_BITS(hf(-1e6f), 0xfc00);
  CHECK_BITS(hf(INFINITY), 0x7c00);
  CHECK_BITS(hf(-INFINITY), 0xfc00);
  CHECK_BITS(hf(1.0f + 0x1p-11f), 0x3c00);                /* tie, even: down */
  CHECK_BITS(hf(1.0f + 3 * 0x1p-11f), 0x3c02);            /* tie, odd: up */
  CHECK_BITS(hf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);     /* above the tie */
  CHECK_BITS(hf(0x1p-14f), 0x0400);                       /* smallest normal */
  CHECK_BITS(hf(0x1p-24f), 0x0001);                       /* smallest subnormal */
  CHECK_BITS(hf(1023 * 0x1p-24f), 0x03ff);                /* largest subnormal */
  CHECK_BITS(hf(1023.75f * 0x1p-24f), 0x0400);            /* rounds up into the normals */
  CHECK_BITS(hf(0x1p-25f), 0x0000);                       /* half the smallest: tie to 0 */
  CHECK_BITS(hf(0x1p-25f * (1 + 0x1p-20f)), 0x0001);      /* just above: up */
  CHECK_BITS(hf(3 * 0x1p-25f), 0x0002);                   /* 1.5 * 2^-24: tie to even 2 */
  CHECK_BITS(hf(0x1p-26f), 0x0000);                       /* underflow */
  CHECK_BITS(hf(-0x1p-24f), 0x8001);
  CHECK_BITS(hf(-0.0f), 0x8000);
  uint16_t h = hf(NAN);
  CHECKM((h & 0x7c00) == 0x7c00 && (h & 0x3ff), "NaN -> 0x%04x", h);
  h = hf(kg_bits_f32(0x7f800001u));
  CHECKM((h & 0x7c00) == 0x7c00 && (h & 0x3ff), "NaN with low payload -> 0x%04x", h);
  CHECK(kg_f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(kg_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(kg_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(isinf(kg_f16_to_f32(0x7c00)) && kg_f16_to_f32(0xfc00) < 0);
  CHECK(isnan(kg_f16_to_f32(0x7e00)));
  CHECK(signbit(kg_f16_to_f32(0x8000)) && kg_f16_to_f32(0x8000) == 0);

  /* every one of the 65536 patterns survives a round trip through f32 (NaN stays NaN) */
  int bad_bf = 0, bad_hf = 0;
  for (uint32_t u = 0; u < 65536; u++) {
    float f = kg_bf16_to_f32((uint16_t)u);
    if (isnan(f) ? !isnan(kg_bf16_to_f32(kg_f32_to_bf16(f))) : kg_f32_to_bf16(f) != u) bad_bf++;
    float g = kg_f16_to_f32((uint16_t)u);
    if (isnan(g) ? !isnan(kg_f16_to_f32(kg_f32_to_f16(g))) : kg_f32_to_f16(g) != u) bad_hf++;
  }
  CHECKM(bad_bf == 0, "%d bf16 patterns do not round-trip", bad_bf);
  CHECKM(bad_hf == 0, "%d f16 patterns do not round-trip", bad_hf);

  /* f16 rounding against an independent reference: the nearest of the two neighbours */
  int bad_near = 0;
  for (int i = 0; i < 20000; i++) {
    float f = (float)(val(i) * pow(2.0, (i % 40) - 25)); /* spans subnormals to 2^15 */
    float r = kg_f16_to_f32(hf(f));
    uint16_t b = hf(f);
    float up = kg_f16_to_f32((uint16_t)(b + 1)), dn = kg_f16_to_f32((uint16_t)(b ? b - 1 : 0));
    if ((b & 0x7fff) == 0) continue; /* zero: check only that nothing nearer exists below */
    if (fabsf(up - f) < fabsf(r - f) || fabsf(dn - f) < fabsf(r - f)) bad_near++;
  }
  CHECKM(bad_near == 0, "%d values did not round to the nearest f16", bad_near);
}

/* ---- allocator ---------------------------------------------------------------------------- */

static void test_allocator(void) {
  puts("allocator");
  const int64_t sizes[] = {1, 3, 17, 100, 1000, 1025, 5000, 123457};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    kg_tensor *t = NULL;
    OK(kg_tensor_empty(&t, 1, &sizes[i], KG_U8, KG_CPU));
    if (!t) continue;
    CHECKM(((uintptr_t)kg_data(t) & 63) == 0, "%lld bytes at %p", (long long)sizes[i], kg_data(t));
    kg_tensor_release(t);
  }

  /* a freed block is reused by the next request of its size class */
  const int64_t pairs[][2] = {{1000, 1001}, {10000, 10100}, {262144, 262000}};
  for (int i = 0; i < 3; i++) {
    kg_tensor *a = NULL, *b = NULL;
    OK(kg_tensor_empty(&a, 1, &pairs[i][0], KG_U8, KG_CPU));
    void *p = kg_data(a);
    kg_memory_stats s0 = kg_memory_get_stats(KG_CPU);
    kg_tensor_release(a);
    kg_memory_stats s1 = kg_memory_get_stats(KG_CPU);
    CHECKM(s1.cached > s0.cached && s1.allocated < s0.allocated, "release of %lld bytes: cached %zu -> %zu",
           (long long)pairs[i][0], s0.cached, s1.cached);
    OK(kg_tensor_empty(&b, 1, &pairs[i][1], KG_U8, KG_CPU));
    CHECKM(kg_data(b) == p, "%lld bytes after freeing %lld: %p, not the freed %p", (long long)pairs[i][1],
           (long long)pairs[i][0], kg_data(b), p);
    kg_memory_stats s2 = kg_memory_get_stats(KG_CPU);
    CHECK(s2.cached == s0.cached);
    kg_tensor_release(b);
  }
  kg_memory_empty_cache(KG_CPU);
  CHECK(kg_memory_get_stats(KG_CPU).cached == 0);

  /* an absurd size fails cleanly with the sizes in the message */
  kg_tensor *huge = NULL;
  FAILS(kg_tensor_empty(&huge, 2, SHAPE((int64_t)1 << 30, 1 << 12), KG_F32, KG_CPU), KG_ERR_OOM, "asked");
  CHECK(huge == NULL);
  FAILS(kg_full(&huge, 1, SHAPE((int64_t)1 << 42), 0, KG_F64, KG_CPU), KG_ERR_OOM, "asked");
  FAILS(kg_tensor_empty(&huge, 1, SHAPE(-3), KG_F32, KG_CPU), KG_ERR_VALUE, "negative");
  FAILS(kg_tensor_empty(&huge, 3, SHAPE((int64_t)1 << 40, (int64_t)1 << 40, 1 << 10), KG_F32, KG_CPU), KG_ERR_VALUE,
        "too large");
  /* the pool still works afterwards */
  kg_tensor *t = NULL;
  OK(kg_full(&t, 1, SHAPE(10), 2.5, KG_F32, KG_CPU));
  CHECK(t && kg_get_flat(t, 9) == 2.5);
  kg_tensor_release(t);
  /* a zero-size tensor still has a valid storage */
  OK(kg_tensor_empty(&t, 2, SHAPE(0, 5), KG_F32, KG_CPU));
  CHECK(t && kg_numel(t) == 0);
  kg_tensor_release(t);
}

/* ---- kernels against naive loops ------------------------------------------------------------ */

/* out = a <op> b by the engine and by a loop over the broadcast shape */
static void check_binary(const char *what, kg_op op, const kg_tensor *a, const kg_tensor *b, double tol) {
  kg_tensor *o = NULL;
  OK(kg_binary(&o, op, a, b));
  if (!o) return;
  int64_t n = kg_numel(o), idx[KG_MAX_DIMS];
  double *want = malloc(sizeof(double) * (size_t)n), *got = values(o);
  for (int64_t i = 0; i < n; i++) {
    unravel(i, o->ndim, o->shape, idx);
    double x = at(a, o->ndim, idx), y = at(b, o->ndim, idx), r;
    switch (op) {
    case KG_OP_ADD: r = x + y; break;
    case KG_OP_SUB: r = x - y; break;
    case KG_OP_MUL: r = x * y; break;
    case KG_OP_DIV: r = x / y; break;
    case KG_OP_MAXIMUM: r = x > y ? x : y; break;
    case KG_OP_LT: r = x < y; break;
    default: r = NAN;
    }
    want[i] = rounded(r, o->dtype);
  }
  compare(what, got, want, n, tol);
  free(want);
  free(got);
  kg_tensor_release(o);
}

static void test_elementwise(void) {
  puts("elementwise kernels");
  const kg_dtype dts[] = {KG_F32, KG_F64, KG_BF16, KG_F16};
  for (int k = 0; k < 4; k++) {
    kg_dtype dt = dts[k];
    char what[64];
    /* a: [3,4] as the transpose of a [4,3] tensor; b: [4] broadcast over rows */
    kg_tensor *base = filled(2, SHAPE(4, 3), dt, 0), *a = NULL, *b = filled(1, SHAPE(4), dt, 50);
    kg_transpose(&a, base, 0, 1);
    /* bf16/f16 outputs: the kernel computes in f32 and rounds once, as the loop does */
    double tol = dt == KG_F32 ? 1e-7 : dt == KG_F64 ? 1e-15 : 1e-7;
    snprintf(what, sizeof what, "add [3,4]ᵀ + [4] %s", kg_dtype_info[dt].name);
    check_binary(what, KG_OP_ADD, a, b, tol);
    /* [3,1] * [1,4] -> [3,4], and a strided column narrowed out of a wider tensor */
    kg_tensor *wide = filled(2, SHAPE(3, 5), dt, 7), *col = NULL, *row = filled(2, SHAPE(1, 4), dt, 9);
    kg_narrow(&col, wide, 1, 2, 1);
    snprintf(what, sizeof what, "mul [3,1](strided) * [1,4] %s", kg_dtype_info[dt].name);
    check_binary(what, KG_OP_MUL, col, row, tol);
    snprintf(what, sizeof what, "div [3,4]ᵀ / [3,1] %s", kg_dtype_info[dt].name);
    check_binary(what, KG_OP_DIV, a, col, tol);
    snprintf(what, sizeof what, "maximum [3,4]ᵀ, [4] %s", kg_dtype_info[dt].name);
    check_binary(what, KG_OP_MAXIMUM, a, b, 0);
    snprintf(what, sizeof what, "lt [3,4]ᵀ < [4] %s", kg_dtype_info[dt].name);
    check_binary(what, KG_OP_LT, a, b, 0);

    /* exp of a non-contiguous view */
    kg_tensor *e = NULL;
    OK(kg_unary(&e, KG_OP_EXP, a));
    if (e) {
      double got[12], want[12];
      int64_t idx[2];
      for (int64_t i = 0; i < 12; i++) {
        unravel(i, 2, a->shape, idx);
        got[i] = kg_get_flat(e, i);
        want[i] = rounded(exp(at(a, 2, idx)), dt);
      }
      snprintf(what, sizeof what, "exp [3,4]ᵀ %s", kg_dtype_info[dt].name);
      compare(what, got, want, 12, dt == KG_F64 ? 1e-15 : dt == KG_F32 ? 1e-6 : 1e-2);
      CHECK(e->dtype == dt && kg_is_contiguous(e));
      kg_tensor_release(e);
    }
    kg_release_all(6, (kg_tensor *[]){base, a, b, wide, col, row});
  }

  /* a large broadcast add runs the parallel path of the iterator */
  kg_tensor *big = filled(2, SHAPE(300, 257), KG_F32, 3), *bt = NULL, *bias = filled(2, SHAPE(300, 1), KG_F32, 11);
  kg_transpose(&bt, big, 0, 1); /* [257, 300] */
  kg_tensor *bias_t = NULL;
  kg_transpose(&bias_t, bias, 0, 1); /* [1, 300] */
  check_binary("add [257,300]ᵀ + [1,300] (parallel)", KG_OP_ADD, bt, bias_t, 1e-7);
  kg_release_all(4, (kg_tensor *[]){big, bt, bias, bias_t});

  /* scalar on either side, integer promotion */
  kg_tensor *ints = NULL, *r = NULL;
  OK(kg_arange(&ints, 0, 6, 1, KG_I64, KG_CPU));
  OK(kg_binary_scalar(&r, KG_OP_SUB, ints, 10, true)); /* 10 - x */
  CHECK(r && r->dtype == KG_I64 && kg_get_flat(r, 4) == 6);
  kg_tensor_release(r);
  OK(kg_binary_scalar(&r, KG_OP_MUL, ints, 0.5, false));
  CHECK(r && r->dtype == KG_F32 && kg_get_flat(r, 5) == 2.5);
  kg_tensor_release(r);
  OK(kg_binary_scalar(&r, KG_OP_DIV, ints, 4, false)); /* integer / integer is float */
  CHECK(r && r->dtype == KG_F32 && kg_get_flat(r, 3) == 0.75);
  kg_tensor_release(r);
  kg_tensor_release(ints);

  /* clamp and where */
  kg_tensor *x = filled(1, SHAPE(20), KG_F32, 0), *c = NULL, *cond = NULL, *w = NULL, *zero = NULL;
  OK(kg_clamp(&c, x, -1, 0.5));
  OK(kg_clamp(&cond, x, -INFINITY, 0)); /* no lower bound */
  OK(kg_scalar(&zero, 0, KG_F32, KG_CPU));
  kg_tensor *pos = NULL;
  OK(kg_binary(&pos, KG_OP_GT, x, zero));
  OK(kg_where(&w, pos, x, zero)); /* relu */
  double g1[20], w1[20], g2[20], w2[20], g3[20], w3[20];
  for (int i = 0; i < 20; i++) {
    double v = (float)val(i);
    g1[i] = kg_get_flat(c, i), w1[i] = v < -1 ? -1 : v > 0.5 ? 0.5 : v;
    g2[i] = kg_get_flat(cond, i), w2[i] = v > 0 ? 0 : v;
    g3[i] = kg_get_flat(w, i), w3[i] = v > 0 ? v : 0;
  }
  compare("clamp(x, -1, 0.5)", g1, w1, 20, 0);
  compare("clamp(x, nil, 0)", g2, w2, 20, 0);
  compare("where(x > 0, x, 0)", g3, w3, 20, 0);
  FAILS(kg_clamp(&r, x, 1, -1), KG_ERR_VALUE, "clamp");
  kg_tensor *bad = filled(1, SHAPE(3), KG_F32, 0);
  FAILS(kg_binary(&r, KG_OP_ADD, x, bad), KG_ERR_SHAPE, "[20] and [3]");
  FAILS(kg_binary_(KG_OP_ADD, bad, x), KG_ERR_SHAPE, "add");
  kg_release_all(7, (kg_tensor *[]){x, c, cond, w, zero, pos, bad});
}

static void test_sum(void) {
  puts("sum, mean, var");
  /* x: a [3,4,5] permuted view of a [5,3,4] tensor */
  kg_tensor *base = filled(3, SHAPE(5, 3, 4), KG_F64, 0), *x = NULL;
  kg_permute(&x, base, (int[]){1, 2, 0});
  CHECK(!kg_is_contiguous(x));
  const uint32_t masks[] = {1u << 0, 1u << 1, 1u << 2, (1u << 0) | (1u << 2), KG_DIMS_ALL};
  for (int mi = 0; mi < 5; mi++) {
    for (int keep = 0; keep < 2; keep++) {
      kg_tensor *s = NULL;
      OK(kg_sum(&s, x, masks[mi], keep));
      if (!s) continue;
      int64_t kshape[3], idx[3];
      for (int d = 0; d < 3; d++) kshape[d] = (masks[mi] & (1u << d)) ? 1 : x->shape[d];
      int nd_want = 0;
      for (int d = 0; d < 3; d++) nd_want += keep || !(masks[mi] & (1u << d));
      CHECKM(s->ndim == nd_want, "mask %x keepdim %d: %d dims", masks[mi], keep, s->ndim);
      int64_t nout = kshape[0] * kshape[1] * kshape[2];
      double want[60] = {0}, *got = values(s);
      for (int64_t i = 0; i < 60; i++) {
        unravel(i, 3, x->shape, idx);
        int64_t o = 0;
        for (int d = 0; d < 3; d++) o = o * kshape[d] + ((masks[mi] & (1u << d)) ? 0 : idx[d]);
        want[o] += at(x, 3, idx);
      }
      char what[64];
      snprintf(what, sizeof what, "sum mask 0x%x keepdim=%d", masks[mi] & 7, keep);
      CHECK(kg_numel(s) == nout);
      compare(what, got, want, nout, 1e-14);
      free(got);
      kg_tensor_release(s);
    }
  }
  /* mean and unbiased var over dim 1 ([3,4,5] -> [3,5]) */
  kg_tensor *m = NULL, *v = NULL;
  OK(kg_mean(&m, x, 1u << 1, false));
  OK(kg_var(&v, x, 1u << 1, false, 1));
  if (m && v) {
    double gm[15], wm[15], gv[15], wv[15];
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 5; k++) {
        double s = 0, ss = 0;
        for (int j = 0; j < 4; j++) s += at(x, 3, (int64_t[]){i, j, k});
        for (int j = 0; j < 4; j++) ss += pow(at(x, 3, (int64_t[]){i, j, k}) - s / 4, 2);
        gm[i * 5 + k] = kg_get_flat(m, i * 5 + k), wm[i * 5 + k] = s / 4;
        gv[i * 5 + k] = kg_get_flat(v, i * 5 + k), wv[i * 5 + k] = ss / 3;
      }
    compare("mean over dim 1", gm, wm, 15, 1e-14);
    compare("var over dim 1 (correction 1)", gv, wv, 15, 1e-13);
  }
  kg_release_all(4, (kg_tensor *[]){m, v, x, base});
  /* bf16 input: accumulated wide, rounded once */
  kg_tensor *h = filled(1, SHAPE(1000), KG_BF16, 0), *s = NULL;
  OK(kg_sum(&s, h, KG_DIMS_ALL, false));
  double acc = 0;
  for (int i = 0; i < 1000; i++) acc += kg_get_flat(h, i);
  double got = s ? kg_get_flat(s, 0) : NAN, want = rounded(acc, KG_BF16);
  compare("sum of 1000 bf16", &got, &want, 1, 0);
  kg_tensor_release(s);
  kg_tensor_release(h);
  kg_tensor *x2 = filled(2, SHAPE(2, 3), KG_F32, 0);
  FAILS(kg_sum(&s, x2, 1u << 2, false), KG_ERR_VALUE, "sum");
  kg_tensor_release(x2);
}

/* a @ b by the engine and by a triple loop; a, b may be views, batch dims broadcast */
static void check_matmul(const char *what, const kg_tensor *a, const kg_tensor *b, double tol) {
  kg_tensor *o = NULL;
  OK(kg_matmul(&o, a, b));
  if (!o) return;
  int nd = o->ndim;
  int64_t N = o->shape[nd - 2], M = o->shape[nd - 1], K = a->shape[a->ndim - 1], n = kg_numel(o);
  int64_t idx[KG_MAX_DIMS], ai[KG_MAX_DIMS], bi[KG_MAX_DIMS];
  double *want = malloc(sizeof(double) * (size_t)n), *got = values(o);
  for (int64_t i = 0; i < n; i++) {
    unravel(i, nd, o->shape, idx);
    memcpy(ai, idx, sizeof idx);
    memcpy(bi, idx, sizeof idx);
    double s = 0;
    for (int64_t k = 0; k < K; k++) {
      ai[nd - 1] = k;
      bi[nd - 2] = k;
      /* at() aligns right and pins size-1 dims; a's own last two dims are [N, K] */
      s += at(a, nd, ai) * at(b, nd, bi);
    }
    want[i] = rounded(s, o->dtype);
  }
  (void)N, (void)M;
  compare(what, got, want, n, tol);
  free(want);
  free(got);
  kg_tensor_release(o);
}

static void test_matmul(void) {
  puts("matmul");
  const kg_dtype dts[] = {KG_F32, KG_F64, KG_BF16};
  for (int k = 0; k < 3; k++) {
    kg_dtype dt = dts[k];
    double tol = dt == KG_F64 ? 1e-13 : dt == KG_F32 ? 1e-5 : 1e-2;
    char what[80];
    kg_tensor *a = filled(2, SHAPE(5, 7), dt, 0), *b = filled(2, SHAPE(7, 3), dt, 100);
    snprintf(what, sizeof what, "[5,7] @ [7,3] %s", kg_dtype_info[dt].name);
    check_matmul(what, a, b, tol);
    /* transposed operands: aᵀ stored [7,5], bᵀ stored [3,7] */
    kg_tensor *as = filled(2, SHAPE(7, 5), dt, 1), *bs = filled(2, SHAPE(3, 7), dt, 2), *at_ = NULL, *bt = NULL;
    kg_transpose(&at_, as, 0, 1);
    kg_transpose(&bt, bs, 0, 1);
    snprintf(what, sizeof what, "[7,5]ᵀ @ [3,7]ᵀ %s", kg_dtype_info[dt].name);
    check_matmul(what, at_, bt, tol);
    /* neither dim unit-stride: columns picked every other element (packed path) */
    kg_tensor *wide = filled(3, SHAPE(5, 7, 2), dt, 3), *strided = NULL;
    kg_select(&strided, wide, 2, 1); /* [5,7] strides {14,2} */
    snprintf(what, sizeof what, "strided [5,7] @ [7,3]ᵀᵀ %s", kg_dtype_info[dt].name);
    check_matmul(what, strided, b, tol);
    /* batched with broadcast: [2,1,5,7] @ [3,7,4] -> [2,3,5,4] */
    kg_tensor *ba = filled(4, SHAPE(2, 1, 5, 7), dt, 4), *bb = filled(3, SHAPE(3, 7, 4), dt, 5);
    snprintf(what, sizeof what, "batched [2,1,5,7] @ [3,7,4] %s", kg_dtype_info[dt].name);
    check_matmul(what, ba, bb, tol);
    kg_release_all(9, (kg_tensor *[]){a, b, as, bs, at_, bt, wide, strided, ba});
    kg_tensor_release(bb);
  }
  /* 1-D cases: [7] @ [7,3] -> [3]; [5,7] @ [7] -> [5]; [7] @ [7] -> [] */
  kg_tensor *v = filled(1, SHAPE(7), KG_F64, 0), *m = filled(2, SHAPE(7, 3), KG_F64, 1), *m2 = filled(2, SHAPE(5, 7), KG_F64, 2);
  kg_tensor *o = NULL;
  OK(kg_matmul(&o, v, m));
  CHECK(o && EQ_DIMS(o, 1, 3));
  if (o) {
    double s = 0;
    for (int k = 0; k < 7; k++) s += kg_get_flat(v, k) * kg_get_flat(m, k * 3 + 2);
    double g = kg_get_flat(o, 2);
    compare("[7] @ [7,3] element 3", &g, &s, 1, 1e-14);
  }
  kg_tensor_release(o);
  OK(kg_matmul(&o, m2, v));
  CHECK(o && EQ_DIMS(o, 1, 5));
  kg_tensor_release(o);
  OK(kg_matmul(&o, v, v));
  CHECK(o && o->ndim == 0);
  if (o) {
    double s = 0, g = kg_get_flat(o, 0);
    for (int k = 0; k < 7; k++) s += kg_get_flat(v, k) * kg_get_flat(v, k);
    compare("[7] @ [7] (dot)", &g, &s, 1, 1e-14);
  }
  kg_tensor_release(o);
  FAILS(kg_matmul(&o, m, m2), KG_ERR_SHAPE, "[7,3] @ [5,7]");
  FAILS(kg_matmul(&o, m, m2), KG_ERR_SHAPE, "matmul");
  kg_tensor *ints = NULL;
  OK(kg_arange(&ints, 0, 7, 1, KG_I64, KG_CPU));
  FAILS(kg_matmul(&o, ints, m), KG_ERR_TYPE, "matmul");
  kg_release_all(4, (kg_tensor *[]){v, m, m2, ints});

  /* linear: x [4,3] · w [2,3]ᵀ + b [2] */
  kg_tensor *x = filled(2, SHAPE(4, 3), KG_F64, 0), *w = filled(2, SHAPE(2, 3), KG_F64, 5), *b = filled(1, SHAPE(2), KG_F64, 9);
  OK(kg_linear(&o, x, w, b));
  if (o) {
    double got[8], want[8];
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 2; j++) {
        double s = kg_get_flat(b, j);
        for (int k = 0; k < 3; k++) s += kg_get_flat(x, i * 3 + k) * kg_get_flat(w, j * 3 + k);
        got[i * 2 + j] = kg_get_flat(o, i * 2 + j), want[i * 2 + j] = s;
      }
    compare("linear [4,3]·[2,3]ᵀ + [2]", got, want, 8, 1e-14);
  }
  kg_tensor_release(o);
  FAILS(kg_linear(&o, x, b, NULL), KG_ERR_SHAPE, "linear");
  FAILS(kg_linear(&o, x, w, x), KG_ERR_SHAPE, "bias");
  kg_release_all(3, (kg_tensor *[]){x, w, b});
}

static void test_copy(void) {
  puts("copy and casts");
  kg_tensor *src = filled(2, SHAPE(6, 5), KG_F32, 0);
  for (int i = 0; i < 30; i++) kg_set_flat(src, i, val(i) * 700); /* beyond bf16/f16 precision, in range */
  kg_set_flat(src, 7, NAN);
  kg_set_flat(src, 8, INFINITY);
  kg_set_flat(src, 9, 1e6); /* f16 overflow */
  const kg_dtype dts[] = {KG_F64, KG_BF16, KG_F16, KG_I32, KG_I64, KG_BOOL, KG_U8};
  for (int k = 0; k < 7; k++) {
    kg_dtype dt = dts[k];
    kg_tensor *dst = NULL;
    OK(kg_to(&dst, src, dt, KG_CPU));
    if (!dst) continue;
    CHECK(dst->dtype == dt && kg_is_contiguous(dst));
    double got[30], want[30];
    int n = 0;
    for (int i = 0; i < 30; i++) {
      double v = kg_get_flat(src, i);
      if (!kg_dtype_info[dt].is_float && !isfinite(v)) continue; /* undefined in C, skip */
      if (dt == KG_U8 && (v < 0 || v >= 256)) continue;
      got[n] = kg_get_flat(dst, i);
      want[n++] = rounded(v, dt);
    }
    char what[64];
    snprintf(what, sizeof what, "f32 -> %s", kg_dtype_info[dt].name);
    compare(what, got, want, n, 0);
    kg_tensor_release(dst);
  }
  /* bf16 -> f32 is exact; f64 -> bf16 rounds through f32 once */
  kg_tensor *h = NULL, *back = NULL;
  OK(kg_to(&h, src, KG_BF16, KG_CPU));
  OK(kg_to(&back, h, KG_F32, KG_CPU));
  if (h && back) {
    double got[30], want[30];
    for (int i = 0; i < 30; i++) got[i] = kg_get_flat(back, i), want[i] = kg_get_flat(h, i);
    compare("bf16 -> f32", got, want, 30, 0);
  }
  kg_tensor_release(h);
  kg_tensor_release(back);

  /* copy_ into a transposed view with broadcasting and conversion: dst [5,6]ᵀ-view <- src [6] f64 */
  kg_tensor *store = NULL, *dst = NULL, *row = filled(1, SHAPE(6), KG_F64, 3);
  OK(kg_full(&store, 2, SHAPE(6, 5), -1, KG_F16, KG_CPU));
  kg_transpose(&dst, store, 0, 1); /* [5,6] */
  OK(kg_copy_(dst, row));
  double got[30], want[30];
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 5; j++) got[i * 5 + j] = kg_get_flat(store, i * 5 + j), want[i * 5 + j] = rounded(val(i + 3), KG_F16);
  compare("copy_ f64 [6] -> f16 [5,6]ᵀ (broadcast)", got, want, 30, 0);
  CHECK(store->storage->version > 0);
  kg_tensor *wrong = filled(1, SHAPE(5), KG_F32, 0);
  FAILS(kg_copy_(dst, wrong), KG_ERR_SHAPE, "copy_");
  /* same dtype, strided both sides: bit moves, exact for i64 beyond 2^53 */
  kg_tensor *big = NULL, *bigt = NULL, *c = NULL;
  OK(kg_full(&big, 2, SHAPE(3, 4), 0, KG_I64, KG_CPU));
  for (int i = 0; i < 12; i++) ((int64_t *)kg_data(big))[i] = ((int64_t)1 << 60) + i;
  kg_transpose(&bigt, big, 0, 1);
  OK(kg_contiguous(&c, bigt));
  bool exact = c != NULL;
  for (int i = 0; c && i < 4; i++)
    for (int j = 0; j < 3; j++) exact &= ((int64_t *)kg_data(c))[i * 3 + j] == ((int64_t)1 << 60) + j * 4 + i;
  CHECKM(exact, "i64 transpose copy lost bits");
  kg_release_all(9, (kg_tensor *[]){src, store, dst, row, wrong, big, bigt, c, NULL});
}

/* ---- arange / fill / autograd in brief -------------------------------------------------------- */

static void test_creation_autograd(void) {
  puts("creation and autograd");
  kg_tensor *r = NULL;
  OK(kg_arange(&r, 2, 7, 1, KG_F32, KG_CPU)); /* 2..6 */
  CHECK(r && EQ_DIMS(r, 1, 5) && kg_get_flat(r, 0) == 2 && kg_get_flat(r, 4) == 6);
  kg_tensor_release(r);
  OK(kg_arange(&r, 0, 1, 0.25, KG_F64, KG_CPU));
  CHECK(r && r->shape[0] == 4 && kg_get_flat(r, 3) == 0.75);
  kg_tensor_release(r);
  OK(kg_arange(&r, 5, 0, -2, KG_I64, KG_CPU)); /* 5, 3, 1 */
  CHECK(r && r->shape[0] == 3 && kg_get_flat(r, 2) == 1);
  kg_tensor_release(r);
  FAILS(kg_arange(&r, 0, 5, 0, KG_F32, KG_CPU), KG_ERR_VALUE, "arange");

  /* d/da sum(a * b) = b, d/db = a; twice accumulates */
  kg_tensor *a = filled(2, SHAPE(2, 3), KG_F64, 0), *b = filled(1, SHAPE(3), KG_F64, 4), *p = NULL, *s = NULL;
  a->requires_grad = b->requires_grad = true;
  for (int pass = 1; pass <= 2; pass++) {
    OK(kg_binary(&p, KG_OP_MUL, a, b));
    OK(kg_sum(&s, p, KG_DIMS_ALL, false));
    OK(kg_backward(s, NULL, false));
    kg_release_all(2, (kg_tensor *[]){p, s});
  }
  CHECK(a->grad && EQ_DIMS(a->grad, 2, 2, 3) && b->grad && EQ_DIMS(b->grad, 1, 3));
  if (a->grad && b->grad) {
    double ga[6], wa[6], gb[3], wb[3];
    for (int i = 0; i < 6; i++) ga[i] = kg_get_flat(a->grad, i), wa[i] = 2 * kg_get_flat(b, i % 3);
    for (int j = 0; j < 3; j++) gb[j] = kg_get_flat(b->grad, j), wb[j] = 2 * (kg_get_flat(a, j) + kg_get_flat(a, 3 + j));
    compare("grad of sum(a*b) wrt a [2,3], twice", ga, wa, 6, 1e-15);
    compare("grad of sum(a*b) wrt b [3] (broadcast), twice", gb, wb, 3, 1e-15);
  }
  /* in-place write of a saved input, then backward: an error naming the op */
  OK(kg_binary(&p, KG_OP_MUL, a, b));
  OK(kg_sum(&s, p, KG_DIMS_ALL, false));
  bool was = kg_set_grad_enabled(false);
  OK(kg_fill_(b, 1));
  kg_set_grad_enabled(was);
  FAILS(kg_backward(s, NULL, false), KG_ERR_AUTOGRAD, "mul");
  kg_release_all(4, (kg_tensor *[]){p, s, a, b});
}

/* KENG_NO_SIMD=1 turns off every vector kernel that dispatches on the CPU's features, read at
 * each call (the labs switch it in-process), and unsetting it gives them back */
static void test_no_simd(void) {
  bool (*const probes[])(void) = {kg_cpu_gemm_bf16_avx2, kg_cpu_gemm_bf16_avx512, kg_cpu_gemm_bf16_dpbf16,
                                  kg_cpu_gemm_bf16_amx, kg_attn_avx2_available, kg_cpu_avx2_fma,
                                  kg_cpu_q8_avx2, kg_cpu_q8_avx512, kg_cpu_q8_vnni};
  enum { N = sizeof probes / sizeof probes[0] };
  bool before[N];
  unsetenv("KENG_NO_SIMD");
  kg_env_reload();
  for (int i = 0; i < N; i++) before[i] = probes[i]();
  setenv("KENG_NO_SIMD", "1", 1);
  kg_env_reload();
  CHECK(kg_cpu_simd() == 0);
  for (int i = 0; i < N; i++) CHECKM(!probes[i](), "probe %d still on under KENG_NO_SIMD=1", i);
  unsetenv("KENG_NO_SIMD");
  kg_env_reload();
  for (int i = 0; i < N; i++) CHECKM(probes[i]() == before[i], "probe %d changed after KENG_NO_SIMD was unset", i);
}

int main(void) {
  test_no_simd();
  test_views();
  test_half_formats();
  test_allocator();
  test_elementwise();
  test_sum();
  test_matmul();
  test_copy();
  test_creation_autograd();
  printf("test_core: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
