/* test_sdpa_plan.c — the rules that send scaled_dot_product_attention to cuDNN's fused attention
 * and the plan cache (engine/cuda/sdpa_plan.h: plain C, so this runs in every build, GPU or not).
 * Each rule is checked on a call that passes every other rule, so a wrong rule fails here. */
#include <keng/keng.h>

#include "cuda/sdpa_plan.h"

#include <stdio.h>

static int failures;
#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                      \
    }                                                                  \
  } while (0)

static void set4(int64_t *st, int64_t a, int64_t b, int64_t c, int64_t d) { st[0] = a, st[1] = b, st[2] = c, st[3] = d; }

/* a bf16 call cuDNN takes: B 2, H 8, Hkv 2 (GQA), T 16, S 32, D 64, contiguous, causal */
static kg_sdpa_call good(void) {
  kg_sdpa_call c;
  memset(&c, 0, sizeof c);
  c.dev = 0, c.dtype = KG_BF16, c.is_half = true, c.causal = true;
  c.B = 2, c.H = 8, c.Hkv = 2, c.T = 16, c.S = 32, c.D = 64;
  set4(c.qs, 8 * 16 * 64, 16 * 64, 64, 1);
  set4(c.ks, 2 * 32 * 64, 32 * 64, 64, 1);
  set4(c.vs, 2 * 32 * 64, 32 * 64, 64, 1);
  set4(c.os, 8 * 16 * 64, 16 * 64, 64, 1);
  c.qp = 0x10000, c.kp = 0x20000, c.vp = 0x30000, c.op = 0x40000, c.elem = 2;
  return c;
}

static void test_rules(void) {
  kg_sdpa_call c = good();
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  CHECK(kg_sdpa_check(&c, false) == KG_SDPA_OFF);

  c = good(), c.dtype = KG_F32, c.is_half = false;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_DTYPE);
  c = good(), c.dtype = KG_F16;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);

  int64_t dims[] = {4, 60, 136, 256, 0};
  for (int i = 0; i < 5; i++) {
    c = good(), c.D = dims[i];
    CHECK(kg_sdpa_check(&c, true) == (dims[i] == 0 ? KG_SDPA_EMPTY : KG_SDPA_HEAD_DIM));
  }
  int64_t ok_dims[] = {8, 64, 72, 128};
  for (int i = 0; i < 4; i++) {
    c = good(), c.D = ok_dims[i];
    set4(c.qs, 8 * 16 * c.D, 16 * c.D, c.D, 1), set4(c.os, 8 * 16 * c.D, 16 * c.D, c.D, 1);
    set4(c.ks, 2 * 32 * c.D, 32 * c.D, c.D, 1), set4(c.vs, 2 * 32 * c.D, 32 * c.D, c.D, 1);
    CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  }

  c = good(), c.has_mask = true;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_MASK);
  c = good(), c.window = 4;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_WINDOW);

  /* causal is bottom-right aligned: T > S has rows cuDNN cannot express; non-causal T > S is fine */
  c = good(), c.T = 64;
  set4(c.qs, 8 * 64 * 64, 64 * 64, 64, 1), set4(c.os, 8 * 64 * 64, 64 * 64, 64, 1);
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_CAUSAL_TS);
  c.causal = false;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  c = good(), c.T = 1; /* decode: one query against the cache */
  set4(c.qs, 8 * 64, 64, 64, 1), set4(c.os, 8 * 64, 64, 64, 1);
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);

  /* layouts: transposed heads (q as a [B, T, H, D] view) are fine, a non-dense last dim or a
   * stride that is not a multiple of 8 elements is not */
  c = good();
  set4(c.qs, 16 * 8 * 64, 64, 8 * 64, 1);
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  c = good(), c.ks[3] = 2;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_LAYOUT);
  c = good(), c.vs[2] = 72;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  c = good(), c.vs[2] = 66;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_LAYOUT);
  c = good(), c.os[0] = 12;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_LAYOUT);

  c = good(), c.kp += 8;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_ALIGN);
  c = good(), c.B = 0;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_EMPTY);

  CHECK(strcmp(kg_sdpa_reason_name(KG_SDPA_HEAD_DIM), "head_dim") == 0);
  CHECK(strcmp(kg_sdpa_reason_name(KG_SDPA_NREASONS), "?") == 0);
}

static void test_keys(void) {
  kg_sdpa_call a = good(), b = good();
  kg_sdpa_key ka = kg_sdpa_key_of(&a), kb;
  /* pointers and the scale are not part of the key: a plan serves every call of its shape */
  b.qp += 4096, b.op += 4096;
  kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) == 0);
  /* everything the graph is built from is */
  b = good(), b.causal = false, kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) != 0);
  b = good(), b.S = 48, kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) != 0);
  b = good(), b.dtype = KG_F16, kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) != 0);
  b = good(), b.dev = 1, kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) != 0);
  b = good(), b.Hkv = 8, kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) != 0);
  b = good(), b.ks[1] = 4096, kb = kg_sdpa_key_of(&b);
  CHECK(memcmp(&ka, &kb, sizeof ka) != 0);
}

static void test_cache(void) {
  static kg_sdpa_cache cache; /* zeroed: empty */
  kg_sdpa_call c = good();
  kg_sdpa_key k0 = kg_sdpa_key_of(&c);
  CHECK(kg_sdpa_cache_find(&cache, &k0) == NULL);
  int plan0 = 0;
  CHECK(kg_sdpa_cache_put(&cache, &k0, &plan0, 1024, true) == NULL);
  kg_sdpa_entry *e = kg_sdpa_cache_find(&cache, &k0);
  CHECK(e && e->plan == &plan0 && e->workspace == 1024 && e->ok);

  /* a refused build is remembered as such */
  c.S = 40;
  kg_sdpa_key k1 = kg_sdpa_key_of(&c);
  CHECK(kg_sdpa_cache_put(&cache, &k1, NULL, 0, false) == NULL);
  e = kg_sdpa_cache_find(&cache, &k1);
  CHECK(e && !e->ok && e->plan == NULL);
  CHECK(kg_sdpa_cache_find(&cache, &k0)->plan == &plan0);

  /* filling the table evicts the oldest entry first and hands its plan back to be destroyed */
  static int plans[KG_SDPA_CACHE];
  void *evicted = NULL;
  int n_evicted = 0;
  for (int i = 0; i < KG_SDPA_CACHE - 1; i++) {
    c = good(), c.T = 100 + i, c.causal = false;
    kg_sdpa_key k = kg_sdpa_key_of(&c);
    void *old = kg_sdpa_cache_put(&cache, &k, &plans[i], 0, true);
    if (old) evicted = old, n_evicted++;
  }
  CHECK(n_evicted == 1 && evicted == &plan0);
  CHECK(kg_sdpa_cache_find(&cache, &k0) == NULL);
  CHECK(kg_sdpa_cache_find(&cache, &k1) != NULL);
  c = good(), c.T = 100, c.causal = false;
  kg_sdpa_key k100 = kg_sdpa_key_of(&c);
  CHECK(kg_sdpa_cache_find(&cache, &k100) && kg_sdpa_cache_find(&cache, &k100)->plan == &plans[0]);
}

int main(void) {
  test_rules();
  test_keys();
  test_cache();
  if (failures) {
    fprintf(stderr, "test_sdpa_plan: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_sdpa_plan: ok\n");
  return 0;
}
