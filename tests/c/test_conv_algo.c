/* test_conv_algo.c — how engine/cuda/conv.cu picks a cuDNN convolution algorithm
 * (engine/cuda/conv_algo.h: plain C, so this runs in every build): the workspace cap, the
 * fallback order after an out-of-memory or a failed launch, and the per-shape cache. */
#include "cuda/conv_algo.h"

#include <stdio.h>

#include "check.h"

#define MB ((int64_t)1 << 20)

/* a heuristic list as cuDNN gives it, best first: an FFT wanting 3 GB, a refused algorithm, a
 * Winograd of 600 MB, an implicit precomputed GEMM of 40 MB, the plain implicit GEMM (no
 * workspace) */
static const kg_conv_candidate list[] = {
    {4, 3072 * MB, true}, {5, 0, false}, {6, 600 * MB, true}, {1, 40 * MB, true}, {0, 0, true}};
enum { N = 5 };

/* the algorithms tried in turn when every try fails as `oom[i]` says for candidate i (1 = out of
 * memory, 0 = another failure, -1 = success); returns the count, -1 at the end */
static int tries(int64_t cap, const int *oom, int *algos) {
  int n = 0, i = kg_conv_pick(list, N, 0, cap);
  while (i >= 0) {
    algos[n++] = list[i].algo;
    if (oom[i] < 0) return n;
    cap = kg_conv_cap_after(&list[i], cap, oom[i] == 1);
    i = kg_conv_pick(list, N, i + 1, cap);
  }
  algos[n++] = -1;
  return n;
}

static void test_pick(void) {
  /* the cap skips the 3 GB FFT; without a cap the heuristic's first choice stands */
  CHECK(kg_conv_pick(list, N, 0, KG_CONV_WORKSPACE_CAP) == 2);
  CHECK(kg_conv_pick(list, N, 0, INT64_MAX) == 0);
  /* a refused candidate is never picked, even when it needs nothing */
  CHECK(kg_conv_pick(list, N, 1, 0) == 4);
  CHECK(kg_conv_pick(list, N, 5, INT64_MAX) == -1);
  CHECK(kg_conv_pick(list, 0, 0, INT64_MAX) == -1);
  CHECK(kg_conv_pick(list, N, -3, KG_CONV_WORKSPACE_CAP) == 2);

  /* out of memory for 600 MB: the next candidate under 600 MB (the 40 MB GEMM) */
  int a[8];
  int ok_winograd[N] = {0, 0, -1, -1, -1};
  CHECK(tries(KG_CONV_WORKSPACE_CAP, ok_winograd, a) == 1 && a[0] == 6);
  int oom_winograd[N] = {0, 0, 1, -1, -1};
  CHECK(tries(KG_CONV_WORKSPACE_CAP, oom_winograd, a) == 2 && a[0] == 6 && a[1] == 1);
  /* out of memory twice: down to the algorithm that needs no workspace */
  int oom_two[N] = {0, 0, 1, 1, -1};
  CHECK(tries(KG_CONV_WORKSPACE_CAP, oom_two, a) == 3 && a[1] == 1 && a[2] == 0);
  /* a failed launch (not memory) keeps the cap: the next candidate in order */
  int bad_launch[N] = {0, 0, 0, -1, -1};
  CHECK(tries(KG_CONV_WORKSPACE_CAP, bad_launch, a) == 2 && a[1] == 1);
  /* an out-of-memory lowers the cap below what failed, never raises it */
  CHECK(kg_conv_cap_after(&list[2], KG_CONV_WORKSPACE_CAP, true) == 600 * MB - 1);
  CHECK(kg_conv_cap_after(&list[3], 10 * MB, true) == 10 * MB);
  CHECK(kg_conv_cap_after(&list[2], KG_CONV_WORKSPACE_CAP, false) == KG_CONV_WORKSPACE_CAP);
  /* everything fails: the search ends */
  int all_fail[N] = {1, 1, 1, 1, 1};
  CHECK(tries(INT64_MAX, all_fail, a) == 5 && a[0] == 4 && a[3] == 0 && a[4] == -1);
}

static kg_conv_key key_of(int prim, int64_t batch) {
  kg_conv_key k;
  memset(&k, 0, sizeof k);
  k.prim = prim, k.dt = 0, k.groups = 1;
  k.pad[0] = k.pad[1] = k.stride[0] = k.stride[1] = k.dil[0] = k.dil[1] = 1;
  int64_t im[4] = {batch, 512, 64, 64}, col[4] = {batch, 512, 64, 64}, w[4] = {512, 512, 3, 3};
  for (int i = 0; i < 4; i++)
    k.im[i] = im[i], k.col[i] = col[i], k.w[i] = w[i];
  return k;
}

static void test_cache(void) {
  static kg_conv_cache cache; /* zeroed: empty */
  kg_conv_key fwd = key_of(0, 1), bwd = key_of(1, 1), fwd2 = key_of(0, 2);
  CHECK(kg_conv_cache_find(&cache, &fwd) == NULL);
  kg_conv_cache_put(&cache, &fwd, 6, 600 * MB);
  kg_conv_cache_put(&cache, &bwd, 1, 0);
  kg_conv_entry *e = kg_conv_cache_find(&cache, &fwd);
  CHECK(e && e->algo == 6 && e->workspace == 600 * MB);
  CHECK(kg_conv_cache_find(&cache, &bwd)->algo == 1);
  CHECK(kg_conv_cache_find(&cache, &fwd2) == NULL); /* another batch is another shape */
  kg_conv_key tf = fwd;
  tf.tf32 = 1;
  CHECK(kg_conv_cache_find(&cache, &tf) == NULL); /* TF32 picks its own algorithm */
  /* a fallback replaces the choice in place */
  kg_conv_cache_put(&cache, &fwd, 1, 40 * MB);
  e = kg_conv_cache_find(&cache, &fwd);
  CHECK(e && e->algo == 1 && e->workspace == 40 * MB && cache.next == 2);
  /* a full table evicts the oldest */
  for (int i = 0; i < KG_CONV_CACHE - 1; i++) {
    kg_conv_key k = key_of(2, 100 + i);
    kg_conv_cache_put(&cache, &k, 0, 0);
  }
  CHECK(kg_conv_cache_find(&cache, &fwd) == NULL);
  CHECK(kg_conv_cache_find(&cache, &bwd) != NULL);
}

int main(void) {
  test_pick();
  test_cache();
  if (failures) {
    fprintf(stderr, "test_conv_algo: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_conv_algo: ok\n");
  return 0;
}
