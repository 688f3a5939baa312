/* reduce_plan.h — the launch-shape arithmetic of the CUDA reductions (reduce.cu's sum, norm.cu's
 * dw/db), in plain C so that tests/c/test_cuda_launch.c checks it on every build, GPU or not.
 *
 * A reduction has `nout` outputs of `n` elements each. It runs in up to two stages:
 *   stage 1  `units` independent pieces of work (one output in block-per-output form, or a tile
 *            of 256 outputs in thread-per-output form) are each split into `splits` ranges of
 *            the reduced index; a block sums one (unit, range) pair into a partial (in double)
 *   stage 2  a thread per output adds its `splits` partials in index order.
 * The split depends only on the shapes, never on the device or on timing, and every sum runs in
 * a fixed order: the result is the same bits on every run (and on every GPU). With one split the
 * first stage writes the outputs and the second is skipped.
 *
 * Split k covers the reduced indices [k * chunk, min((k + 1) * chunk, n)); kg_split_plan never
 * makes an empty split, so the ranges partition [0, n) exactly. */
#ifndef KENG_CUDA_REDUCE_PLAN_H
#define KENG_CUDA_REDUCE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#ifndef KG_HD /* as keng/scalar.h defines it */
#ifdef __CUDACC__
#define KG_HD __host__ __device__ __forceinline__
#else
#define KG_HD static inline
#endif
#endif

/* Blocks to aim for: 8 resident 256-thread blocks on each of an H100/H200's 132 SMs is ~1056. */
#define KG_RED_TARGET_BLOCKS 1024
/* At most this many partials per output (bounds the scratch and stage 2's serial sum). */
#define KG_RED_MAX_SPLITS 1024
/* Fewest elements a split of a block-per-output sum takes (8 per thread of a 256-thread block),
 * and fewest rows a split of a thread-per-output sum takes (each thread's serial loop). */
#define KG_RED_MIN_CHUNK_ROWS 2048
#define KG_RED_MIN_CHUNK_COLS 32
/* Threads of a thread-per-output block (one tile of outputs). */
#define KG_RED_TILE 256
/* Blocks of a launch at most: the kernels stride over the (unit, split) pairs. */
#define KG_RED_MAX_GRID 65535

typedef struct {
  int64_t splits; /* ranges per unit: >= 1 */
  int64_t chunk;  /* reduced indices per range (the last may be shorter, never empty) */
} kg_split;

/* units pieces of work reducing n elements each; min_chunk: the fewest elements worth a range */
KG_HD kg_split kg_split_plan(int64_t units, int64_t n, int64_t min_chunk) {
  kg_split p;
  p.splits = 1;
  p.chunk = n > 0 ? n : 0;
  if (units <= 0 || n <= 0) return p;
  if (min_chunk < 1) min_chunk = 1;
  int64_t want = (KG_RED_TARGET_BLOCKS + units - 1) / units; /* ranges to reach the target */
  int64_t most = n / min_chunk;                              /* ranges of at least min_chunk */
  int64_t s = want < most ? want : most;
  if (s > KG_RED_MAX_SPLITS) s = KG_RED_MAX_SPLITS;
  if (s < 1) s = 1;
  p.chunk = (n + s - 1) / s;
  p.splits = (n + p.chunk - 1) / p.chunk; /* rounding up the chunk may leave fewer ranges */
  return p;
}

/* the reduced indices [*lo, *hi) of range k */
KG_HD void kg_split_range(kg_split p, int64_t n, int64_t k, int64_t *lo, int64_t *hi) {
  *lo = k * p.chunk;
  *hi = *lo + p.chunk < n ? *lo + p.chunk : n;
}

/* Pair u of a block-per-output launch: output *o, range *k (its partial: kg_red_part). */
KG_HD void kg_red_rows_pair(int64_t u, kg_split p, int64_t *o, int64_t *k) {
  *o = u / p.splits;
  *k = u - *o * p.splits;
}

/* Pair u of a thread-per-output launch (KG_RED_TILE threads a block), thread i: output *o (idle
 * when >= nout), range *k. Neighbouring pairs are neighbouring tiles of the same range. */
KG_HD void kg_red_cols_pair(int64_t u, int64_t tiles, int64_t i, int64_t *o, int64_t *k) {
  *k = u / tiles;
  *o = (u - *k * tiles) * KG_RED_TILE + i;
}

/* Where partial k of output o lives: output-major for block-per-output (one block writes one
 * partial), range-major for thread-per-output (a block's threads write neighbouring slots). */
KG_HD int64_t kg_red_part(bool rows, kg_split p, int64_t nout, int64_t o, int64_t k) {
  return rows ? o * p.splits + k : k * nout + o;
}

/* Partial j (0 or 1) of output o, range k, for a reduction that keeps two sums (norm.cu's dw
 * and db): block-per-output keeps one output-major array per sum, thread-per-output interleaves
 * them as ranges 2k and 2k + 1. 2 * nout * splits slots in all. */
KG_HD int64_t kg_red_part2(bool rows, kg_split p, int64_t nout, int64_t o, int64_t k, int j) {
  return rows ? j * nout * p.splits + kg_red_part(true, p, nout, o, k) : kg_red_part(false, p, nout, o, 2 * k + j);
}

/* blocks for `pairs` (unit, split) pairs: one each, up to KG_RED_MAX_GRID (then they stride) */
KG_HD unsigned kg_red_grid(int64_t pairs) {
  return (unsigned)(pairs < 1 ? 1 : pairs > KG_RED_MAX_GRID ? KG_RED_MAX_GRID : pairs);
}

/* The form of a sum: a block per output when its elements lie along memory (innermost reduced
 * stride 1, at least 64 of them) or when the outputs are too few to give a thread each, else a
 * thread per output — coalesced when the outputs lie along memory (innermost kept stride 1):
 * neighbouring threads then read neighbouring addresses at every step of their loops. */
KG_HD bool kg_red_block_per_output(int64_t nout, int64_t n, int64_t rstride_inner, int64_t kstride_inner) {
  if (n <= 1) return false;
  if (rstride_inner == 1 && (n >= 64 || nout < 1024)) return true;
  if (kstride_inner == 1 && nout >= 32) return false;
  return nout < 1024;
}

/* Drops size-1 dims and merges dims that are contiguous with each other (stride[d] ==
 * stride[d + 1] * shape[d + 1]) in a (shape, stride) list read in row-major order: the same
 * elements in the same order with fewer index divisions. Returns the new count. */
KG_HD int kg_red_merge(int n, int64_t *shape, int64_t *stride) {
  int m = 0;
  for (int d = 0; d < n; d++) {
    if (shape[d] == 1) continue;
    if (m > 0 && stride[m - 1] == stride[d] * shape[d]) {
      shape[m - 1] *= shape[d];
      stride[m - 1] = stride[d];
    } else {
      shape[m] = shape[d];
      stride[m] = stride[d];
      m++;
    }
  }
  return m;
}

#endif
