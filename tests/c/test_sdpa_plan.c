/* test_sdpa_plan.c — the router of scaled_dot_product_attention (engine/ops/sdpa_route.h: which of
 * CPU / cuDNN / flash / math runs a call), the rules that send a call to cuDNN's fused attention
 * and the plan cache (engine/cuda/sdpa_plan.h). Plain C, so this runs in every build, GPU or not.
 * Each rule is checked on a call that passes every other rule, so a wrong rule fails here. */
#include <keng/keng.h>

#include "cuda/sdpa_plan.h"

#include <math.h>
#include <stdio.h>

#include "check.h"

static void set4(int64_t *st, int64_t a, int64_t b, int64_t c, int64_t d) {
  st[0] = a, st[1] = b, st[2] = c, st[3] = d;
}

/* a bf16 call cuDNN takes: B 2, H 8, Hkv 2 (GQA), T 16, S 32, D 64, contiguous, causal, on an
 * H100/H200 (sm_90) with cuDNN 9.6 */
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
  c.sm = 90, c.cudnn_version = 90600;
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

  int64_t dims[] = {4, 60, 264, 512, 0};
  for (int i = 0; i < 5; i++) {
    c = good(), c.D = dims[i];
    CHECK(kg_sdpa_check(&c, true) == (dims[i] == 0 ? KG_SDPA_EMPTY : KG_SDPA_HEAD_DIM));
  }
  int64_t ok_dims[] = {8, 64, 72, 128, 136, 256}; /* Hopper: up to 256 (Gemma's 256 among them) */
  for (int i = 0; i < 6; i++) {
    c = good(), c.D = ok_dims[i];
    set4(c.qs, 8 * 16 * c.D, 16 * c.D, c.D, 1), set4(c.os, 8 * 16 * c.D, 16 * c.D, c.D, 1);
    set4(c.ks, 2 * 32 * c.D, 32 * c.D, c.D, 1), set4(c.vs, 2 * 32 * c.D, 32 * c.D, c.D, 1);
    CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
    c.sm = 80, c.cudnn_version = 90900; /* Ampere, cuDNN <= 9.9: 128 */
    CHECK(kg_sdpa_check(&c, true) == (c.D <= 128 ? KG_SDPA_OK : KG_SDPA_HEAD_DIM));
    c.cudnn_version = 91200; /* Ampere, later cuDNN: 256 for prefill, 128 for decode */
    CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
    c.T = 1;
    CHECK(kg_sdpa_check(&c, true) == (c.D <= 128 ? KG_SDPA_OK : KG_SDPA_HEAD_DIM));
    c.T = 16, c.sm = 100, c.cudnn_version = 90800; /* Blackwell before 9.9: 128 */
    CHECK(kg_sdpa_check(&c, true) == (c.D <= 128 ? KG_SDPA_OK : KG_SDPA_HEAD_DIM));
  }
  CHECK(kg_sdpa_cudnn_max_d(90, 90000, 1) == 256 && kg_sdpa_cudnn_max_d(86, 90900, 64) == 128);
  CHECK(kg_sdpa_cudnn_max_d(100, 91000, 1) == 256 && kg_sdpa_cudnn_max_d(89, 91000, 64) == 256);

  /* the device and library: below sm_80, below cuDNN 9, and 9.10.0 / 9.10.1 (known SDPA bugs) */
  c = good(), c.sm = 75;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_ARCH);
  c = good(), c.sm = 0; /* unknown device */
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_ARCH);
  c = good(), c.cudnn_version = 8907;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_ARCH);
  c = good(), c.cudnn_version = 91000;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_ARCH);
  c = good(), c.cudnn_version = 91001;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_ARCH);
  c = good(), c.cudnn_version = 91002;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);

  c = good(), c.has_mask = true;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_MASK);
  c = good(), c.window = 4;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_WINDOW);
  c = good(), c.window = 31; /* S = 32: one key out of the last row's band */
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_WINDOW);
  c = good(), c.window = 32; /* a window >= S is no window (Mistral: 4096 at S = 128) */
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  c = good(), c.window = 4096;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);

  /* causal is bottom-right aligned: T > S has rows cuDNN cannot express; non-causal T > S is fine */
  c = good(), c.T = 64;
  set4(c.qs, 8 * 64 * 64, 64 * 64, 64, 1), set4(c.os, 8 * 64 * 64, 64 * 64, 64, 1);
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_CAUSAL_TS);
  c.causal = false;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  /* before cuDNN 9.6 bottom-right causal needs T and S multiples of 64 (or T == S) */
  c = good(), c.cudnn_version = 90500;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_CAUSAL_TS);
  c.T = c.S = 32;
  CHECK(kg_sdpa_check(&c, true) == KG_SDPA_OK);
  c.T = 64, c.S = 128;
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
  CHECK(strcmp(kg_sdpa_reason_name(KG_SDPA_ARCH), "arch") == 0);
  CHECK(strcmp(kg_sdpa_reason_name(KG_SDPA_NREASONS), "?") == 0);

  /* the public names of the stats' slots (keng.backends.cudnn_sdpa_stats): the reasons', but
   * slot 0 (declined with no rule broken: a capture, no workspace) is "other" */
  CHECK(strcmp(kg_sdpa_fallback_name(KG_SDPA_OK), "other") == 0);
  for (int i = 1; i < KG_SDPA_NREASONS; i++)
    CHECK(kg_sdpa_fallback_name(i) && strcmp(kg_sdpa_fallback_name(i), kg_sdpa_reason_name((kg_sdpa_reason)i)) == 0);
  CHECK(kg_sdpa_fallback_name(KG_SDPA_NREASONS) == NULL && kg_sdpa_fallback_name(-1) == NULL);
  CHECK(KG_SDPA_NREASONS <= (int)(sizeof ((kg_sdpa_stats *)0)->fallback / sizeof(uint64_t)));
  CHECK(strcmp(kg_sdpa_route_stat_name(KG_SDPA_ROUTE_FLASH), "flash") == 0 && kg_sdpa_route_stat_name(4) == NULL);
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

/* ---- the router ------------------------------------------------------------------------------ */

/* a call on cuda:0 of an H200 (sm_90, cuDNN 9.6): bf16, B 1, H 16, Hkv 16, T = S = 128, D 256
 * (Gemma 7B's prefill), causal, no mask, no grad, TF32 off, cuDNN on */
static kg_sdpa_desc call(void) {
  kg_sdpa_desc d;
  memset(&d, 0, sizeof d);
  d.cuda = true, d.dtype = KG_BF16, d.is_half = true;
  d.B = 1, d.H = 16, d.Hkv = 16, d.T = 128, d.S = 128, d.D = 256;
  d.causal = true, d.scale = 0.0625, d.cudnn_enabled = true, d.sm = 90, d.cudnn_version = 90600;
  d.smem = 232448; /* 227 KiB a block may opt in to on sm_90 */
  return d;
}
static kg_sdpa_desc f32(kg_sdpa_desc d) {
  d.dtype = KG_F32, d.is_half = false, d.is_f32 = true;
  return d;
}
static kg_sdpa_route route(const kg_sdpa_desc *d) { return kg_sdpa_route_of(d, NULL); }

static void test_router(void) {
  kg_sdpa_desc d = call();
  kg_sdpa_reason why = KG_SDPA_NREASONS;
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_CUDNN && why == KG_SDPA_OK);
  d.cuda = false; /* the CPU kernel takes every D */
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_CPU && why == KG_SDPA_OK);
  d.D = 512;
  CHECK(route(&d) == KG_SDPA_ROUTE_CPU);

  /* rule 1: a non-finite scale, dropout or the switch: math, on every device */
  d = call(), d.scale = NAN;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.cuda = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = call(), d.scale = INFINITY, d.cuda = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = call(), d.scale = -INFINITY;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = call(), d.dropout = 0.1;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = call(), d.force_math = true, d.cuda = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = call(), d.mask = KG_SDPA_MASK_ADDITIVE, d.mask_grad = d.requires_grad = true, d.cuda = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH); /* a learned bias gets its gradient */
  d.mask_grad = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_CPU);
  /* rule 0: nothing to compute goes to the kernels that fill empty outputs, whatever the scale */
  d = call(), d.S = 0, d.scale = NAN;
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.cuda = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_CPU);
  d = call(), d.D = 0, d.force_math = true, d.cuda = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_CPU);

  /* rule 3: cuDNN, with the reason it declines */
  d = call(), d.cudnn_enabled = false;
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_MATH && why == KG_SDPA_OFF);
  d = call(), d.window = 4096; /* Mistral at T = 128: no window at all */
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_CUDNN && why == KG_SDPA_OK);
  d.window = 64; /* a real window: cuDNN is not asked, the math route is big enough */
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_MATH && why == KG_SDPA_WINDOW);
  d = call(), d.mask = KG_SDPA_MASK_BOOL;
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_MATH && why == KG_SDPA_MASK);
  d.T = 1; /* a decode step with a padding mask: one flash launch */
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_FLASH && why == KG_SDPA_MASK);
  d = call(), d.mask = KG_SDPA_MASK_ADDITIVE, d.T = d.S = 32; /* T·S = 1024: small, flash */
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d = call(), d.T = 1; /* decode without a mask: cuDNN (Hopper takes D 256 for decode too) */
  CHECK(route(&d) == KG_SDPA_ROUTE_CUDNN);
  d.sm = 80, d.cudnn_version = 91200; /* Ampere decode at D 256: cuDNN declines, flash (small) */
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_FLASH && why == KG_SDPA_HEAD_DIM);
  d.T = 128; /* Ampere prefill with a later cuDNN: 256 is fine */
  CHECK(route(&d) == KG_SDPA_ROUTE_CUDNN);
  d = call(), d.causal = true, d.T = 129; /* causal T > S */
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_MATH && why == KG_SDPA_CAUSAL_TS);

  /* rule 4: D > 256 has only the math route on the GPU: the SD VAE's one head of 512, f32 */
  d = f32(call());
  d.B = 1, d.H = 1, d.Hkv = 1, d.T = d.S = 4096, d.D = 512, d.causal = false;
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_MATH && why == KG_SDPA_DTYPE);
  d.T = d.S = 1; /* small or not, TF32 or not, grad or not */
  d.requires_grad = true;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = call(), d.D = 264;
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_MATH && why == KG_SDPA_HEAD_DIM);
  d.D = 256, d.mask = KG_SDPA_MASK_BOOL, d.T = 1; /* 256 itself is still the flash kernel's */
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);

  /* rule 4 also: the flash kernel's shared memory. f64 at D 256 needs 160 KiB forward and 193 KiB
   * for the dk/dv pass: sm_90 (227 KiB) runs both, sm_80 (163 KiB) the forward only, sm_86
   * (99 KiB) neither — the math route takes what the flash kernel cannot */
  CHECK(kg_sdpa_flash_smem_fwd(8, 256) == 164096 && kg_sdpa_flash_smem_dkv(8, 256) == 197632);
  CHECK(kg_sdpa_flash_smem_dq(4, 64) == 4 * (2 * 16 * 64 + 2 * 32 * 65));
  d = call(), d.dtype = KG_F64, d.is_half = false, d.is_f64 = true, d.requires_grad = true;
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.sm = 80, d.smem = 166912;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.requires_grad = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.sm = 86, d.smem = 101376;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.D = 128; /* f64 D 128 on sm_86: 80 KiB forward, 96 KiB backward */
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.requires_grad = true;
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.D = 136;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = f32(call()), d.T = 1, d.D = 256, d.requires_grad = true, d.smem = 101376; /* f32: 97 KiB, fits */
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.smem = 0; /* unknown: the 48 KiB every GPU has */
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.D = 64;
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);

  /* rule 5: f32 goes to the math route only under TF32 and when big enough (BERT: B 8, H 12,
   * T = S = 512, D 64) */
  d = f32(call());
  d.B = 8, d.H = 12, d.Hkv = 12, d.T = d.S = 512, d.D = 64, d.causal = false;
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.allow_tf32 = true;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.requires_grad = true;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.T = 4096 / 512 - 1; /* T·S just below KG_SDPA_MATH_MIN_TS */
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.T = 4096 / 512;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  /* under grad the kept tensors cap it: 3 · B·H·T·S·4 bytes <= 4 GiB (the chunks of a no-grad
   * call are freed in turn, so without grad any size goes) */
  d = f32(call());
  d.allow_tf32 = true, d.causal = false, d.D = 40, d.requires_grad = true;
  d.B = 2, d.H = 8, d.Hkv = 8, d.T = d.S = 4096; /* 1 GiB of f32 scores, 3 GiB kept */
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.B = 3; /* 4.5 GiB kept */
  CHECK(route(&d) == KG_SDPA_ROUTE_FLASH);
  d.requires_grad = false, d.B = 26; /* SD predict's UNet self-attention with guidance: 13 GiB */
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d = f32(call()); /* BERT fit (B 32) and predict (B 256) at T = 512 */
  d.allow_tf32 = true, d.causal = false, d.D = 64, d.H = d.Hkv = 12, d.T = d.S = 512, d.B = 32;
  d.requires_grad = true;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);
  d.requires_grad = false, d.B = 256;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);

  /* the chunks of a no-grad math call: as many batch rows as keep f32 scores within the cap */
  int64_t GiB = 1ll << 30;
  CHECK(kg_sdpa_math_rows(26, 8, 4096, 4096, false, GiB) == 2); /* 512 MiB per row */
  CHECK(kg_sdpa_math_rows(26, 8, 4096, 4096, true, GiB) == 26); /* grad: one piece */
  CHECK(kg_sdpa_math_rows(256, 12, 512, 512, false, GiB) == 85);
  CHECK(kg_sdpa_math_rows(4, 1, 2, 2, false, GiB) == 4);         /* small: one piece */
  CHECK(kg_sdpa_math_rows(13, 16, 8192, 8192, false, GiB) == 1); /* one row over the cap: still 1 */
  CHECK(kg_sdpa_math_rows(5, 2, 3, 4, false, 2 * 2 * 3 * 4 * 4) == 2);
  CHECK(kg_sdpa_math_rows(0, 2, 3, 4, false, GiB) == 0);
  /* f64 on the GPU: the flash kernel (no tensor cores to win with), math only past D 256 */
  d = call(), d.dtype = KG_F64, d.is_half = false, d.is_f64 = true, d.allow_tf32 = true;
  CHECK(kg_sdpa_route_of(&d, &why) == KG_SDPA_ROUTE_FLASH && why == KG_SDPA_DTYPE);
  d.D = 300;
  CHECK(route(&d) == KG_SDPA_ROUTE_MATH);

  /* the window that matters */
  CHECK(kg_sdpa_window(0, 10) == 0 && kg_sdpa_window(9, 10) == 9 && kg_sdpa_window(10, 10) == 0);
  CHECK(kg_sdpa_window(4096, 128) == 0 && kg_sdpa_window(4, 0) == 0);
  CHECK(strcmp(kg_sdpa_route_name(KG_SDPA_ROUTE_MATH), "math") == 0);
  CHECK(strcmp(kg_sdpa_route_name(KG_SDPA_ROUTE_CUDNN), "cudnn") == 0);
}

int main(void) {
  test_router();
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
