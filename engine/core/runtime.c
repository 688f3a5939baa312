/* runtime.c — the random generator state, device queries. */
#include "internal.h"

#include <stdlib.h>

/* the thread count: engine/core/threads.c */

/* ---- Philox stream position ------------------------------------------------------------- */

static kg_philox_state rng = {0x853c49e6748fea9bULL, 0};

void kg_manual_seed(uint64_t seed) {
  rng.seed = seed;
  rng.offset = 0;
}

/* The whole generator is this pair: every device draws from it (see keng.h), so saving it with a
 * checkpoint and putting it back makes a resumed run draw exactly what an uninterrupted one would. */
kg_philox_state kg_get_rng_state(void) { return rng; }

void kg_set_rng_state(kg_philox_state s) { rng = s; }

kg_philox_state kg_rng_reserve(uint64_t n) {
  kg_philox_state s = rng;
  rng.offset += (n + 3) & ~(uint64_t)3; /* keep each op's draw aligned to a Philox block */
  return s;
}

kg_status kg_device_synchronize(kg_device d) {
  if (d.type == KG_DEV_CUDA) return kg_cuda_sync(d.index);
  return KG_OK;
}
