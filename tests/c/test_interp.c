/* test_interp.c — interpolate's per-axis windows (engine/ops/interp.h, plain C shared with the
 * CUDA kernel) over many sizes, modes and scales: windows non-empty, inside the input and
 * monotone in the output index; weights summing to 1; and kg_interp_readers, the CUDA backward's
 * gather range, equal to the brute-force set of output indices whose window holds j. */
#include "ops/interp.h"

#include <stdio.h>

static int failures;
#define CHECK(cond, a, i)                                                                                              \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      if (failures++ < 20)                                                                                             \
        fprintf(stderr, "%s:%d: %s (mode %d aa %d align %d in %lld out %lld scale %g, index %lld)\n", __FILE__,        \
                __LINE__, #cond, (a)->mode, (a)->antialias, (a)->align_corners, (long long)(a)->in,                    \
                (long long)(a)->out, (a)->scale, (long long)(i));                                                      \
    }                                                                                                                  \
  } while (0)

static void check_axis(const kg_interp_axis *a) {
  int64_t plo = 0, phi = 0;
  for (int64_t o = 0; o < a->out; o++) {
    int64_t lo, hi;
    kg_interp_bounds(a, o, &lo, &hi);
    CHECK(0 <= lo && lo < hi && hi <= a->in, a, o);
    CHECK(lo >= plo && hi >= phi, a, o);
    plo = lo, phi = hi;
    double norm = kg_interp_norm(a, o, lo, hi), sum = 0;
    for (int64_t j = lo; j < hi; j++)
      sum += kg_interp_weight(a, o, j, norm);
    CHECK(fabs(sum - 1) < 1e-5, a, o);
  }
  for (int64_t j = 0; j < a->in; j++) {
    int64_t o0, o1, b0 = -1, b1 = -1;
    kg_interp_readers(a, j, &o0, &o1);
    for (int64_t o = 0; o < a->out; o++) {
      int64_t lo, hi;
      kg_interp_bounds(a, o, &lo, &hi);
      if (lo <= j && j < hi) {
        if (b0 < 0) b0 = o;
        CHECK(b1 < 0 || b1 == o, a, j); /* contiguous */
        b1 = o + 1;
      }
    }
    if (b0 < 0)
      CHECK(o0 == o1, a, j);
    else
      CHECK(o0 == b0 && o1 == b1, a, j);
  }
}

int main(void) {
  static const double scales[] = {0, 0.3, 0.45, 0.5, 1.3, 1.7, 2, 3.1};
  int n = 0;
  for (int mode = 0; mode <= 2; mode++)
    for (int aa = 0; aa <= (mode ? 1 : 0); aa++)
      for (int align = 0; align <= (mode ? 1 : 0); align++)
        for (int single = 0; single <= 1; single++)
          for (int64_t in = 1; in <= 23; in += 2)
            for (int s = 0; s < (int)(sizeof scales / sizeof *scales); s++)
              for (int64_t out = 1; out <= 40; out += 3) {
                double sc = scales[s];
                int64_t o = sc > 0 ? (int64_t)floor(in * sc) : out;
                if (o < 1 || (sc > 0 && out > 1)) continue;
                kg_interp_axis a = {mode, aa, align, single, in, o, sc};
                check_axis(&a);
                n++;
              }
  printf("test_interp: %d axes, %d failures\n", n, failures);
  return failures != 0;
}
