/* topk_plan.h — the order and the sorting network of topk on the GPU (select.cu), in plain C so
 * that tests/c/test_cuda_launch.c sorts rows with them on the CPU in every build, GPU or not.
 *
 * A row's items are (value, index) pairs in a total order (kg_topk_before): NaN first for
 * largest / last for smallest, then by value, ties by the lower index, padding (index -1) after
 * everything — so any correct sort gives the CPU's qsort result. Rows are padded to a power of
 * two and sorted by a bitonic network: for size = 2, 4, ..., npad and stride = size/2, ..., 1,
 * compare-exchange t (t < npad/2) orders the pair (lo, lo + stride), lo = 2t - (t mod stride),
 * ascending in the `before` order when bit `size` of lo is clear, descending when set. Rows of up
 * to KG_TOPK_SORT_MAX items sort in shared memory (one block, all steps); longer rows asking for
 * more than KG_TOPK_SELECT_MAX items sort in global memory, one launch per step
 * ((log2 npad)(log2 npad + 1)/2 launches: 171 for a 256000-token vocabulary), instead of k
 * selection passes over the row (O(k·n): a top_p over 256000 tokens was ~6.5e10 loads a row). */
#ifndef KENG_CUDA_TOPK_PLAN_H
#define KENG_CUDA_TOPK_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#ifndef KG_HD /* as keng/scalar.h defines it */
#ifdef __CUDACC__
#define KG_HD __host__ __device__ __forceinline__
#else
#define KG_HD static inline
#endif
#endif

#define KG_TOPK_SORT_MAX 2048  /* rows sorted in shared memory (16 B an item: 32 KiB) */
#define KG_TOPK_SELECT_MAX 64  /* longer rows: selection passes up to this k, else a global sort */

typedef struct {
  double v;
  long long i; /* -1: padding, ranks after everything */
} kg_topk_item;

/* does a come before b? (largest: largest first, NaN first; smallest: smallest first, NaN last;
 * ties by index; padding last) */
KG_HD bool kg_topk_before(const kg_topk_item *a, const kg_topk_item *b, bool largest) {
  if (a->i < 0) return false;
  if (b->i < 0) return true;
  bool an = a->v != a->v, bn = b->v != b->v;
  if (an != bn) return largest ? an : bn;
  if (!an && a->v != b->v) return largest ? a->v > b->v : a->v < b->v;
  return a->i < b->i;
}

/* the padded length of a row of n items: a power of two, at least 32 */
KG_HD int64_t kg_topk_pad(int64_t n) {
  int64_t p = 32;
  while (p < n) p <<= 1;
  return p;
}

/* compare-exchange t of step (size, stride) on one row of npad items */
KG_HD void kg_bitonic_exchange(kg_topk_item *row, int64_t t, int64_t size, int64_t stride, bool largest) {
  int64_t lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
  bool up = (lo & size) == 0; /* this half sorts in the `before` order */
  bool swap = up ? kg_topk_before(&row[hi], &row[lo], largest) : kg_topk_before(&row[lo], &row[hi], largest);
  if (swap) {
    kg_topk_item tmp = row[lo];
    row[lo] = row[hi];
    row[hi] = tmp;
  }
}

/* whether topk of k items from rows of n sorts each row in global memory */
KG_HD bool kg_topk_global_sort(int64_t n, int64_t k) { return n > KG_TOPK_SORT_MAX && k > KG_TOPK_SELECT_MAX; }

#endif
