/* pool.h — keng's own parallel-for (engine/core/pool.c): chunks handed out one at a time from an
 * atomic counter, so a thread the scheduler has parked (another process wants its core) simply
 * takes fewer chunks, and the caller never waits for a thread that has not started. */
#ifndef KENG_POOL_H
#define KENG_POOL_H

#include <stdint.h>

/* Runs one chunk (0-based); returns 0, or a nonzero code that stops the loop. */
typedef int (*kg_chunk_fn)(void *ctx, int64_t chunk);

/* Runs fn(ctx, c) exactly once for each c in [0, n) on up to nt threads (the caller is one of
 * them; nt <= 0: kg_num_threads()). Chunks go to whichever thread asks next, so which thread
 * runs a chunk varies; results must not depend on it (a chunk's reduction order is its own).
 * Called from inside a chunk or an OpenMP region, or while another thread's loop holds the
 * pool, it runs the chunks in order on the calling thread. The first nonzero code a chunk
 * returns stops the handout (chunks not yet started are skipped) and is returned once the
 * chunks already running have finished; 0 otherwise. */
int kg_parallel_for(int64_t n, int nt, kg_chunk_fn fn, void *ctx);

/* 1 when a loop started here would run inline: inside a chunk or an active OpenMP region. */
int kg_pool_nested(void);

/* Chunks of about `grain` work units each for `total` units: at least 1, at most `max`. A count
 * that depends only on the sizes (never on the thread count) keeps results bit-equal across
 * thread counts. */
static inline int64_t kg_pool_chunks(int64_t total, int64_t grain, int64_t max) {
  int64_t n = grain > 0 ? (total + grain - 1) / grain : 1;
  if (n > max) n = max;
  return n < 1 ? 1 : n;
}

/* kg_pool_get_stats: <keng/keng.h> */

#endif
