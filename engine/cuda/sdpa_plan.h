/* sdpa_plan.h — the launch-time half of cuDNN's fused attention (engine/cuda/sdpa_cudnn.cu): the
 * layout and alignment a call needs on top of the router's shape rules (engine/ops/sdpa_route.h,
 * kg_sdpa_cudnn_rule), and the cache of the execution plans built for them. Plain C with no CUDA
 * or cuDNN in it, so tests/c/test_sdpa_plan.c checks the rules and the cache in any build.
 *
 * cuDNN's flash attention (graph API, cuDNN >= 9) serves bf16 / f16 with a head dim that is a
 * multiple of 8 (up to 128, or 256 where the GPU and cuDNN version allow: kg_sdpa_cudnn_max_d),
 * the last dim of q, k, v and out dense and every other stride a multiple of 8 elements (16-byte
 * rows for the TMA loads on Hopper). keng's causal mask is bottom-right aligned (key
 * j <= i + S - T), which cuDNN has only for T <= S. Masks given as tensors and sliding windows
 * narrower than S stay on keng's kernels: the semantics of a fully masked row (zeros, lse -inf)
 * are ours. A plan is built once per key below; the attention scale and the causal offset are
 * passed by value at each launch, so they are not part of it. */
#ifndef KENG_SDPA_PLAN_H
#define KENG_SDPA_PLAN_H

#include "../ops/sdpa_route.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* what the cuDNN path needs to know about one call */
typedef struct {
  int dev, dtype; /* kg_dtype */
  bool is_half;   /* dtype is bf16 or f16 */
  bool has_mask, causal;
  int64_t window;
  int64_t B, H, Hkv, T, S, D;
  int64_t qs[4], ks[4], vs[4], os[4]; /* element strides of q, k, v, out */
  uintptr_t qp, kp, vp, op;           /* data pointers (alignment only) */
  size_t elem;                        /* bytes per element */
  int sm, cudnn_version;              /* the device and library (kg_cuda_sdpa_caps) */
} kg_sdpa_call;

static inline bool kg_sdpa_strides_ok(const int64_t *st) {
  if (st[3] != 1) return false;
  for (int i = 0; i < 3; i++)
    if (st[i] % 8 != 0) return false;
  return true;
}

/* KG_SDPA_OK when cuDNN may take the call (given the switch `enabled`), else why not: the
 * router's rule on the shapes, then the layout and alignment of the tensors at hand */
static inline kg_sdpa_reason kg_sdpa_check(const kg_sdpa_call *c, bool enabled) {
  kg_sdpa_desc d;
  memset(&d, 0, sizeof d);
  d.cuda = true, d.dtype = c->dtype, d.is_half = c->is_half, d.cudnn_enabled = enabled;
  d.B = c->B, d.H = c->H, d.Hkv = c->Hkv, d.T = c->T, d.S = c->S, d.D = c->D;
  d.mask = c->has_mask ? KG_SDPA_MASK_BOOL : KG_SDPA_MASK_NONE, d.causal = c->causal, d.window = c->window;
  d.sm = c->sm, d.cudnn_version = c->cudnn_version;
  kg_sdpa_reason r = kg_sdpa_cudnn_rule(&d);
  if (r != KG_SDPA_OK) return r;
  if (!kg_sdpa_strides_ok(c->qs) || !kg_sdpa_strides_ok(c->ks) || !kg_sdpa_strides_ok(c->vs) ||
      !kg_sdpa_strides_ok(c->os))
    return KG_SDPA_LAYOUT;
  if ((c->qp | c->kp | c->vp | c->op) % 16 != 0) return KG_SDPA_ALIGN;
  return KG_SDPA_OK;
}

/* ---- the plan cache ------------------------------------------------------------------------ */

/* everything a plan is built from; compared as bytes (zeroed first, so no padding differs) */
typedef struct {
  int64_t dev, dtype, causal;
  int64_t B, H, Hkv, T, S, D;
  int64_t qs[4], ks[4], vs[4], os[4];
} kg_sdpa_key;

static inline kg_sdpa_key kg_sdpa_key_of(const kg_sdpa_call *c) {
  kg_sdpa_key k;
  memset(&k, 0, sizeof k);
  k.dev = c->dev, k.dtype = c->dtype, k.causal = c->causal;
  k.B = c->B, k.H = c->H, k.Hkv = c->Hkv, k.T = c->T, k.S = c->S, k.D = c->D;
  for (int i = 0; i < 4; i++) k.qs[i] = c->qs[i], k.ks[i] = c->ks[i], k.vs[i] = c->vs[i], k.os[i] = c->os[i];
  return k;
}

/* One entry: the plan (opaque here) and its workspace, or ok = false when building it failed —
 * remembered, so a shape cuDNN declines costs one try, not one per call. */
typedef struct {
  kg_sdpa_key key;
  void *plan;
  int64_t workspace;
  bool ok, used;
} kg_sdpa_entry;

#define KG_SDPA_CACHE 64
typedef struct {
  kg_sdpa_entry e[KG_SDPA_CACHE];
  int next; /* round-robin victim */
} kg_sdpa_cache;

static inline kg_sdpa_entry *kg_sdpa_cache_find(kg_sdpa_cache *c, const kg_sdpa_key *k) {
  for (int i = 0; i < KG_SDPA_CACHE; i++)
    if (c->e[i].used && memcmp(&c->e[i].key, k, sizeof *k) == 0) return &c->e[i];
  return NULL;
}

/* Stores an entry; returns the plan it evicted (NULL if none) for the caller to destroy. */
static inline void *kg_sdpa_cache_put(kg_sdpa_cache *c, const kg_sdpa_key *k, void *plan, int64_t workspace, bool ok) {
  kg_sdpa_entry *e = &c->e[c->next];
  void *old = e->used ? e->plan : NULL;
  c->next = (c->next + 1) % KG_SDPA_CACHE;
  e->key = *k, e->plan = plan, e->workspace = workspace, e->ok = ok, e->used = true;
  return old;
}

#endif
