/* conv_algo.h — how engine/cuda/conv.cu chooses a cuDNN convolution algorithm: under a workspace
 * cap, falling back to the next one when a workspace cannot be allocated or a launch fails, and
 * remembering the choice per shape. Plain C with no CUDA or cuDNN in it (static inline), so
 * tests/c/test_conv_algo.c checks it in every build.
 *
 * Candidates come in the order of cuDNN's heuristic (cudnnGet*Algorithm_v7, best first), each
 * with its workspace (cudnnGet*WorkspaceSize) and whether both queries succeeded. The pick is the
 * first usable candidate whose workspace fits the cap. After a failure at candidate i the search
 * goes on after i: an out-of-memory for w bytes lowers the cap below w (a candidate wanting as
 * much would fail the same way), any other failure keeps the cap. cuDNN's heuristics always list
 * an algorithm that needs no workspace for these primitives, so the search ends with one. */
#ifndef KENG_CONV_ALGO_H
#define KENG_CONV_ALGO_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* the most workspace one convolution may take: FFT and Winograd variants can ask for several GB
 * on the SD VAE's 512-channel layers at 512x512; the next-best implicit GEMMs need little or none */
#define KG_CONV_WORKSPACE_CAP ((int64_t)1 << 30)

typedef struct {
  int algo;          /* cudnnConvolution*Algo_t */
  int64_t workspace; /* bytes */
  bool ok;           /* the heuristic's status and the workspace query both succeeded */
} kg_conv_candidate;

/* index of the first usable candidate at or after `from` needing at most `cap` bytes, or -1 */
static inline int kg_conv_pick(const kg_conv_candidate *c, int n, int from, int64_t cap) {
  for (int i = from < 0 ? 0 : from; i < n; i++)
    if (c[i].ok && c[i].workspace <= cap) return i;
  return -1;
}

/* the cap after candidate `failed` failed (oom: its workspace could not be allocated) */
static inline int64_t kg_conv_cap_after(const kg_conv_candidate *failed, int64_t cap, bool oom) {
  return oom && failed->workspace - 1 < cap ? failed->workspace - 1 : cap;
}

/* ---- the choice per shape --------------------------------------------------------------------- */

/* primitive (0 forward, 1 backward data, 2 backward filter), device, dtype, TF32 and the whole
 * geometry; compared as bytes (zeroed first, so no padding differs) */
typedef struct {
  int prim, dev, dt, tf32, groups, pad[2], stride[2], dil[2];
  int64_t im[4], col[4], w[4];
} kg_conv_key;

typedef struct {
  kg_conv_key key;
  int algo;
  int64_t workspace;
  bool used;
} kg_conv_entry;

#define KG_CONV_CACHE 128
typedef struct {
  kg_conv_entry e[KG_CONV_CACHE];
  int next; /* round-robin victim */
} kg_conv_cache;

static inline kg_conv_entry *kg_conv_cache_find(kg_conv_cache *c, const kg_conv_key *k) {
  for (int i = 0; i < KG_CONV_CACHE; i++)
    if (c->e[i].used && memcmp(&c->e[i].key, k, sizeof *k) == 0) return &c->e[i];
  return NULL;
}

/* stores the choice of key k, replacing an earlier choice of the same key (after a fallback) */
static inline void kg_conv_cache_put(kg_conv_cache *c, const kg_conv_key *k, int algo, int64_t workspace) {
  kg_conv_entry *e = kg_conv_cache_find(c, k);
  if (!e) {
    e = &c->e[c->next];
    c->next = (c->next + 1) % KG_CONV_CACHE;
  }
  e->key = *k, e->algo = algo, e->workspace = workspace, e->used = true;
}

#endif
