/* backends.c — process-wide switches read by the device kernels (keng.backends in Lua). */
#include "internal.h"

#include "../ops/sdpa_route.h"

static int allow_tf32; /* read by engine/cuda/matmul.cu and conv.cu at each launch */

void kg_set_allow_tf32(bool on) { __atomic_store_n(&allow_tf32, on ? 1 : 0, __ATOMIC_RELAXED); }
bool kg_allow_tf32(void) { return __atomic_load_n(&allow_tf32, __ATOMIC_RELAXED) != 0; }

static int cudnn_sdpa = 1; /* read by engine/cuda/sdpa_cudnn.cu at each attention call */

void kg_set_cudnn_sdpa(bool on) { __atomic_store_n(&cudnn_sdpa, on ? 1 : 0, __ATOMIC_RELAXED); }
bool kg_cudnn_sdpa(void) { return __atomic_load_n(&cudnn_sdpa, __ATOMIC_RELAXED) != 0; }

static int sdpa_math; /* read by engine/ops/attention.c's router at each call */

void kg_set_sdpa_math(bool on) { __atomic_store_n(&sdpa_math, on ? 1 : 0, __ATOMIC_RELAXED); }
bool kg_sdpa_math(void) { return __atomic_load_n(&sdpa_math, __ATOMIC_RELAXED) != 0; }

static kg_sdpa_stats sdpa_stats;

void kg_sdpa_stat_add(int field, int reason) {
  uint64_t *c = field == 0   ? &sdpa_stats.cudnn_calls
                : field == 1 ? &sdpa_stats.plans_built
                : field == 2 ? &sdpa_stats.build_failures
                : field == 3 ? &sdpa_stats.exec_failures
                : field == 5 ? &sdpa_stats.routes[reason >= 0 && reason < 4 ? reason : 0]
                             : &sdpa_stats.fallback[reason >= 0 && reason < 16 ? reason : 0];
  __atomic_add_fetch(c, 1, __ATOMIC_RELAXED);
}

void kg_sdpa_stats_get(kg_sdpa_stats *out) {
  out->cudnn_calls = __atomic_load_n(&sdpa_stats.cudnn_calls, __ATOMIC_RELAXED);
  out->plans_built = __atomic_load_n(&sdpa_stats.plans_built, __ATOMIC_RELAXED);
  out->build_failures = __atomic_load_n(&sdpa_stats.build_failures, __ATOMIC_RELAXED);
  out->exec_failures = __atomic_load_n(&sdpa_stats.exec_failures, __ATOMIC_RELAXED);
  for (int i = 0; i < 16; i++) out->fallback[i] = __atomic_load_n(&sdpa_stats.fallback[i], __ATOMIC_RELAXED);
  for (int i = 0; i < 4; i++) out->routes[i] = __atomic_load_n(&sdpa_stats.routes[i], __ATOMIC_RELAXED);
}

const char *kg_sdpa_fallback_name(int i) {
  if (i < 0 || i >= KG_SDPA_NREASONS) return NULL;
  return i == KG_SDPA_OK ? "other" : kg_sdpa_reason_name((kg_sdpa_reason)i);
}

const char *kg_sdpa_route_stat_name(int i) {
  return i >= 0 && i < 4 ? kg_sdpa_route_name((kg_sdpa_route)i) : NULL;
}
