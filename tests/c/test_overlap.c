/* test_overlap.c — the engine's guards against hostile layouts and sizes (engine/core):
 * kg_check_overlap against a brute-force oracle on random strided views (self overlap, partial
 * overlap of an elementwise input, any overlap of an index-op input), the checked size
 * arithmetic, and the saturating float-to-integer conversions. Lua cannot build most of these
 * layouts (no as_strided), so the exact paths are proven here. */
#include "core/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static int64_t rnd(int64_t n) { /* [0, n) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (int64_t)(rng % (uint64_t)n);
}

/* the offset of flat element i of a view (row-major), x broadcast to the shape of `like` */
static int64_t offset_of(const kg_tensor *t, const kg_tensor *like, int64_t i) {
  int64_t off = t->offset;
  int lead = like->ndim - t->ndim;
  for (int d = like->ndim - 1; d >= 0; d--) {
    int64_t n = like->shape[d], k = i % n;
    i /= n;
    if (d >= lead && t->shape[d - lead] != 1) off += k * t->stride[d - lead];
  }
  return off;
}

static kg_tensor *random_view(const kg_tensor *base, int ndim, const int64_t *shape) {
  int64_t stride[KG_MAX_DIMS];
  for (int d = 0; d < ndim; d++) stride[d] = rnd(6);
  kg_tensor *v = NULL;
  if (kg_tensor_view_raw(&v, base, ndim, shape, stride, rnd(8)) != KG_OK) return NULL;
  return v;
}

static void test_random_layouts(void) {
  int64_t n = 64;
  kg_tensor *base;
  if (kg_tensor_empty(&base, 1, &n, KG_F32, KG_CPU) != KG_OK) {
    CHECK(0);
    return;
  }
  int checked = 0;
  for (int trial = 0; trial < 4000; trial++) {
    int nd = 1 + (int)rnd(3);
    int64_t shape[KG_MAX_DIMS], xshape[KG_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = 1 + rnd(4);
    for (int d = 0; d < nd; d++) xshape[d] = rnd(3) ? shape[d] : 1; /* broadcast some dims */
    kg_tensor *dst = random_view(base, nd, shape), *x = random_view(base, nd, xshape);
    if (!dst || !x) {
      kg_tensor_release(dst), kg_tensor_release(x);
      continue;
    }
    int64_t N = kg_numel(dst), XN = kg_numel(x);
    bool self = false, partial = false, any = false;
    for (int64_t i = 0; i < N && !self; i++)
      for (int64_t j = i + 1; j < N && !self; j++) self = offset_of(dst, dst, i) == offset_of(dst, dst, j);
    for (int64_t i = 0; i < N; i++)
      for (int64_t j = 0; j < N; j++)
        if (offset_of(x, dst, i) == offset_of(dst, dst, j) && i != j) partial = true;
    for (int64_t i = 0; i < XN; i++)
      for (int64_t j = 0; j < N; j++)
        if (offset_of(x, x, i) == offset_of(dst, dst, j)) any = true;
    const kg_tensor *in[1] = {x};
    kg_status elementwise = kg_check_overlap("t", dst, 1, in, true);
    kg_status index = kg_check_overlap("t", dst, 1, in, false);
    CHECK((elementwise != KG_OK) == (self || partial));
    CHECK((index != KG_OK) == (self || any));
    if ((elementwise != KG_OK) != (self || partial) || (index != KG_OK) != (self || any)) {
      char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX], d[KG_SHAPE_STR_MAX];
      fprintf(stderr, "  dst %s strides %s +%lld, x %s strides %s +%lld: self %d partial %d any %d\n",
              kg_shape_str(a, dst->ndim, dst->shape), kg_shape_str(b, dst->ndim, dst->stride), (long long)dst->offset,
              kg_shape_str(c, x->ndim, x->shape), kg_shape_str(d, x->ndim, x->stride), (long long)x->offset, self,
              partial, any);
    }
    checked++;
    kg_tensor_release(dst);
    kg_tensor_release(x);
  }
  CHECK(checked > 3000);
  kg_tensor_release(base);
}

static void test_sizes(void) {
  int64_t r;
  CHECK(kg_size_add(KG_SIZE_MAX - 1, 1, &r) && r == KG_SIZE_MAX);
  CHECK(!kg_size_add(KG_SIZE_MAX, 1, &r));
  CHECK(!kg_size_add(INT64_MAX, INT64_MAX, &r));
  CHECK(!kg_size_add(-5, 2, &r));
  CHECK(kg_size_mul(1 << 29, (1 << 30) - 1, &r) && r == ((int64_t)1 << 59) - (1 << 29));
  CHECK(!kg_size_mul(1 << 29, 1 << 30, &r)); /* 2^59 is one past KG_SIZE_MAX */
  CHECK(!kg_size_mul((int64_t)1 << 62, 4, &r)); /* wraps to 0 in 64 bits */
  CHECK(!kg_size_mul(((int64_t)1 << 62) + 1, 4, &r));
  int64_t ok[2] = {(int64_t)1 << 29, ((int64_t)1 << 30) - 1}, big[2] = {((int64_t)1 << 62) + 1, 4}, zero[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  CHECK(kg_check_shape("t", 2, ok) == KG_OK);
  CHECK(kg_check_shape("t", 2, big) == KG_ERR_VALUE && strstr(kg_last_error(), "t: shape [4611686018427387905,4] is too large"));
  CHECK(kg_check_shape("t", 3, zero) == KG_ERR_VALUE); /* empty, but the strides would not fit */
  kg_tensor *x, *v;
  int64_t four = 4, wrapped[2] = {((int64_t)1 << 62) + 1, 4};
  CHECK(kg_tensor_empty(&x, 1, &four, KG_F32, KG_CPU) == KG_OK);
  CHECK(kg_reshape(&v, x, 2, wrapped) == KG_ERR_VALUE && strstr(kg_last_error(), "reshape:"));
  CHECK(kg_view(&v, x, 2, wrapped) == KG_ERR_VALUE);
  kg_tensor_release(x);
}

static void test_conversions(void) {
  CHECK(kg_sat_i64(NAN) == 0 && kg_sat_i32(NAN) == 0 && kg_sat_u8(NAN) == 0);
  CHECK(kg_sat_i64(1e300) == INT64_MAX && kg_sat_i64(-1e300) == INT64_MIN);
  CHECK(kg_sat_i64(INFINITY) == INT64_MAX && kg_sat_i32(-INFINITY) == INT32_MIN);
  CHECK(kg_sat_i32(2147483648.0) == INT32_MAX && kg_sat_i32(-2.9) == -2);
  CHECK(kg_sat_u8(300) == 44 && kg_sat_u8(-1) == 255); /* through int64, as a cast through int64 */
  CHECK(kg_value_fits(255, KG_U8) && !kg_value_fits(256, KG_U8) && !kg_value_fits(NAN, KG_I64));
  CHECK(kg_value_fits(-0x1p63, KG_I64) && !kg_value_fits(0x1p63, KG_I64) && kg_value_fits(NAN, KG_F32));
  CHECK(kg_check_value_fits("fill_", NAN, KG_I32) == KG_ERR_VALUE && strstr(kg_last_error(), "value NaN"));
}

int main(void) {
  test_random_layouts();
  test_sizes();
  test_conversions();
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("test_overlap: ok\n");
  return failures != 0;
}
