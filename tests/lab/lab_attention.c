/* lab_attention.c — kernel lab of the CPU scaled-dot-product attention (engine/cpu/attention.c,
 * attention_avx2.c): every variant (the BLAS tiles, the AVX2 micro-kernels at several tile
 * sizes) against a naive f64 reference, forward (out, lse) and backward (dq, dk, dv).
 *
 *   lab_attention --check       every variant x every case below (odd lengths, D in
 *                               {1, 16, 20, 32, 64, 80, 128}, causal with T < S and T > S,
 *                               sliding window, GQA, bool / float / broadcast masks with fully
 *                               masked rows, non-contiguous views, bf16 and f16); ctest runs it
 *   lab_attention [runs=5]      times every variant on the benchmark shapes (fastest of runs,
 *                               process CPU ms; threads from KENG_NUM_THREADS, 1 is meant)
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads, T query length, S key length,
 * D head dim. The reference recomputes the band itself (it does not use attention.h's).
 */
#include "lab.h"
#include <cpu/attention.h>
#include <keng/keng.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

kg_status kg_cpu_scaled_dot_product_attention(const kg_op_call *c);
kg_status kg_cpu_sdpa_backward(const kg_op_call *c);

/* ---- variants ------------------------------------------------------------------------------ */

typedef struct {
  const char *name;
  kg_attn_tuning tune;
} variant;

static const variant variants[] = {
    {"blas 64x64", {KG_ATTN_BLAS, 64, 64}},   {"avx2 64x64", {KG_ATTN_AVX2, 64, 64}},
    {"avx2 48x64", {KG_ATTN_AVX2, 48, 64}},   {"avx2 96x64", {KG_ATTN_AVX2, 96, 64}},
    {"avx2 48x128", {KG_ATTN_AVX2, 48, 128}}, {"avx2 96x128", {KG_ATTN_AVX2, 96, 128}},
    {"avx2 32x32", {KG_ATTN_AVX2, 32, 32}},   {"avx2 96x256", {KG_ATTN_AVX2, 96, 256}},
    {"avx2 64x128", {KG_ATTN_AVX2, 64, 128}}, {"avx2 64x256", {KG_ATTN_AVX2, 64, 256}},
    {"avx2 auto", {KG_ATTN_AVX2, 64, 64, 128}}, /* the default: forward 64 x 128, backward 64 x 64 */
};
#define NVAR ((int)(sizeof variants / sizeof variants[0]))

/* ---- cases --------------------------------------------------------------------------------- */

enum { MASK_NONE, MASK_BOOL_TS, MASK_FLOAT_HTS, MASK_BOOL_KEYPAD };

typedef struct {
  int64_t B, H, Hkv, T, S, D;
  bool causal;
  int64_t window;
  int mask;
  kg_dtype dt;
  bool noncontig;
} acase;

static const acase cases[] = {
    {2, 2, 2, 37, 53, 16, false, 0, MASK_NONE, KG_F32, false},
    {1, 4, 2, 64, 64, 32, true, 0, MASK_NONE, KG_F32, false},
    {2, 2, 1, 65, 130, 64, true, 0, MASK_NONE, KG_F32, false},    /* T < S: bottom-right diagonal */
    {1, 2, 2, 100, 40, 80, true, 0, MASK_NONE, KG_F32, false},    /* T > S: first rows see nothing */
    {1, 3, 3, 49, 49, 64, false, 0, MASK_FLOAT_HTS, KG_F32, false}, /* sam-like additive bias */
    {2, 2, 2, 70, 70, 128, true, 16, MASK_NONE, KG_F32, false},   /* sliding window */
    {2, 4, 1, 33, 129, 64, false, 0, MASK_BOOL_KEYPAD, KG_F32, true},
    {1, 2, 2, 64, 64, 20, false, 8, MASK_BOOL_TS, KG_F32, false}, /* D % 8 != 0, masked rows */
    {2, 2, 1, 45, 77, 32, true, 0, MASK_NONE, KG_BF16, false},
    {1, 2, 2, 31, 70, 64, false, 0, MASK_BOOL_TS, KG_F16, true},
    {1, 1, 1, 1, 200, 64, true, 0, MASK_NONE, KG_F32, false},     /* one decode step */
    {2, 4, 2, 3, 40, 20, true, 8, MASK_BOOL_TS, KG_BF16, true},   /* few rows: scores by dot products */
    {1, 2, 2, 130, 130, 64, false, 20, MASK_NONE, KG_F32, false}, /* window without causal */
    {3, 2, 2, 19, 300, 1, false, 0, MASK_FLOAT_HTS, KG_F32, true},
    {1, 2, 2, 257, 257, 32, true, 0, MASK_NONE, KG_F32, false},
    {2, 6, 2, 200, 180, 32, true, 0, MASK_FLOAT_HTS, KG_BF16, false}, /* tasks per kv head (<= 4 threads) */
};
#define NCASE ((int)(sizeof cases / sizeof cases[0]))

static uint64_t rng_state = 88172645463325252ull;
static double uniform(void) { /* xorshift64 in [0, 1) */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double normal(void) { return sqrt(-2 * log(1 - uniform())) * cos(6.283185307179586 * uniform()); }

static void must(kg_status s) {
  if (s) {
    fprintf(stderr, "lab_attention: %s\n", kg_last_error());
    exit(2);
  }
}

/* a random [n0, n1, n2, n3] tensor of dtype dt (a [n0, n2, n1, n3] buffer viewed transposed when
 * noncontig); host <- its exact values, row-major [n0, n1, n2, n3] */
static kg_tensor *make_input(const int64_t *n, kg_dtype dt, bool noncontig, double *host, double sd) {
  kg_tensor *t = NULL, *base = NULL;
  if (noncontig) {
    int64_t bs[4] = {n[0], n[2], n[1], n[3]}, st[4] = {n[2] * n[1] * n[3], n[3], n[1] * n[3], 1};
    must(kg_tensor_empty(&base, 4, bs, dt, (kg_device){KG_DEV_CPU, 0}));
    must(kg_tensor_view_raw(&t, base, 4, n, st, 0));
    kg_tensor_release(base);
  } else {
    must(kg_tensor_empty(&t, 4, n, dt, (kg_device){KG_DEV_CPU, 0}));
  }
  int64_t numel = n[0] * n[1] * n[2] * n[3];
  for (int64_t e = 0; e < numel; e++) {
    int64_t i3 = e % n[3], i2 = e / n[3] % n[2], i1 = e / (n[3] * n[2]) % n[1], i0 = e / (n[3] * n[2] * n[1]);
    char *p = (char *)kg_data(t) + (i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3]) *
                                        (int64_t)kg_elem_size(t);
    float f = (float)(sd * normal()), back;
    kg_cpu_store_f32(p, dt, 1, &f, 1);
    kg_cpu_load_f32(&back, p, dt, 1, 1);
    if (host) host[e] = back;
  }
  return t;
}

/* ---- naive f64 reference ------------------------------------------------------------------- */

typedef struct {
  const acase *c;
  double *q, *k, *v, *g, *mask; /* mask: [B, H, T, S] expanded; NAN = hidden (bool false) */
  double *out, *lse, *dq, *dk, *dv;
} ref_data;

static bool visible(const acase *c, int64_t i, int64_t j) {
  int64_t d = j - (i + c->S - c->T); /* key offset from the query's diagonal */
  if (c->causal && d > 0) return false;
  if (c->window > 0 && d <= -c->window) return false;
  return true;
}

static void reference(ref_data *r) {
  const acase *c = r->c;
  int64_t G = c->H / c->Hkv, D = c->D, S = c->S;
  double scale = 1 / sqrt((double)D), *s = malloc(sizeof(double) * (size_t)S), *dp = malloc(sizeof(double) * (size_t)S);
  memset(r->dk, 0, sizeof(double) * (size_t)(c->B * c->Hkv * S * D));
  memset(r->dv, 0, sizeof(double) * (size_t)(c->B * c->Hkv * S * D));
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++)
      for (int64_t i = 0; i < c->T; i++) {
        int64_t row = (b * c->H + h) * c->T + i, kv = (b * c->Hkv + h / G) * S;
        const double *qi = r->q + row * D, *gi = r->g + row * D;
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
          double dot = 0, mk = r->mask ? r->mask[row * S + j] : 0;
          for (int64_t d = 0; d < D; d++) dot += qi[d] * r->k[(kv + j) * D + d];
          s[j] = !visible(c, i, j) || isnan(mk) ? -INFINITY : dot * scale + mk;
          mx = s[j] > mx ? s[j] : mx;
        }
        double *oi = r->out + row * D, *dqi = r->dq + row * D, sum = 0, delta = 0;
        memset(oi, 0, sizeof(double) * (size_t)D);
        memset(dqi, 0, sizeof(double) * (size_t)D);
        if (mx == -INFINITY) {
          r->lse[row] = -INFINITY;
          continue;
        }
        for (int64_t j = 0; j < S; j++) sum += s[j] = exp(s[j] - mx);
        r->lse[row] = mx + log(sum);
        for (int64_t j = 0; j < S; j++) {
          s[j] /= sum;
          dp[j] = 0;
          for (int64_t d = 0; d < D; d++) {
            oi[d] += s[j] * r->v[(kv + j) * D + d];
            dp[j] += gi[d] * r->v[(kv + j) * D + d];
          }
          delta += s[j] * dp[j];
        }
        for (int64_t j = 0; j < S; j++) {
          double ds = s[j] * (dp[j] - delta);
          for (int64_t d = 0; d < D; d++) {
            dqi[d] += scale * ds * r->k[(kv + j) * D + d];
            r->dk[(kv + j) * D + d] += scale * ds * qi[d];
            r->dv[(kv + j) * D + d] += s[j] * gi[d];
          }
        }
      }
  free(s);
  free(dp);
}

/* ---- running the kernels ------------------------------------------------------------------- */

typedef struct {
  kg_tensor *q, *k, *v, *mask, *g, *out, *lse, *dq, *dk, *dv;
  kg_sdpa_params prm;
} run_data;

static kg_tensor *empty4(const int64_t *n, int nd, kg_dtype dt) {
  kg_tensor *t = NULL;
  must(kg_tensor_empty(&t, nd, n, dt, (kg_device){KG_DEV_CPU, 0}));
  return t;
}

static void run_forward(run_data *d) {
  const kg_tensor *in[4] = {d->q, d->k, d->v, d->mask};
  kg_tensor *out[2] = {d->out, d->lse};
  kg_op_call c = {KG_OP_SDPA, d->mask ? 4 : 3, 2, in, out, &d->prm};
  if (kg_cpu_scaled_dot_product_attention(&c)) exit(2);
}
static void run_backward(run_data *d) {
  const kg_tensor *in[7] = {d->q, d->k, d->v, d->mask, d->out, d->lse, d->g};
  kg_tensor *out[3] = {d->dq, d->dk, d->dv};
  kg_op_call c = {KG_OP_SDPA_BACKWARD, 7, 3, in, out, &d->prm};
  if (kg_cpu_sdpa_backward(&c)) exit(2);
}

/* max |t - ref| / max(1e-30, max |ref|), lse-style -inf must match exactly */
static double rel_err(const kg_tensor *t, const double *ref, int64_t n) {
  float *got = malloc(sizeof(float) * (size_t)n);
  kg_cpu_load_f32(got, kg_data(t), t->dtype, 1, n);
  double err = 0, big = 1e-30;
  for (int64_t e = 0; e < n; e++) {
    if (isinf(ref[e]) || isinf(got[e])) {
      if (got[e] != ref[e]) err = INFINITY;
      continue;
    }
    double d = fabs(got[e] - ref[e]);
    err = d > err || isnan(d) ? d : err;
    big = fabs(ref[e]) > big ? fabs(ref[e]) : big;
  }
  free(got);
  return err / big;
}

static int check_case(const acase *c, int ci) {
  int64_t B = c->B, H = c->H, Hkv = c->Hkv, T = c->T, S = c->S, D = c->D;
  int64_t nq[4] = {B, H, T, D}, nk[4] = {B, Hkv, S, D}, nl[3] = {B, H, T};
  ref_data r = {c};
  size_t szq = (size_t)(B * H * T * D), szk = (size_t)(B * Hkv * S * D);
  r.q = malloc(sizeof(double) * szq), r.g = malloc(sizeof(double) * szq), r.out = malloc(sizeof(double) * szq);
  r.dq = malloc(sizeof(double) * szq), r.lse = malloc(sizeof(double) * (size_t)(B * H * T));
  r.k = malloc(sizeof(double) * szk), r.v = malloc(sizeof(double) * szk), r.dk = malloc(sizeof(double) * szk);
  r.dv = malloc(sizeof(double) * szk);
  run_data d = {0};
  d.q = make_input(nq, c->dt, c->noncontig, r.q, 1);
  d.k = make_input(nk, c->dt, c->noncontig, r.k, 1);
  d.v = make_input(nk, c->dt, c->noncontig, r.v, 1);
  d.g = make_input(nq, c->dt, c->noncontig, r.g, 1);
  d.prm = (kg_sdpa_params){0, c->causal, c->window};
  if (c->mask != MASK_NONE) { /* a mask of the broadcast shape, expanded to [B, H, T, S] for r */
    int64_t mn[4] = {c->mask == MASK_FLOAT_HTS ? 1 : B, c->mask == MASK_FLOAT_HTS ? H : 1,
                     c->mask == MASK_BOOL_KEYPAD ? 1 : T, S};
    kg_dtype mdt = c->mask == MASK_FLOAT_HTS ? KG_F32 : KG_BOOL;
    d.mask = empty4(mn, 4, mdt);
    int64_t nm = mn[0] * mn[1] * mn[2] * mn[3];
    double *mh = malloc(sizeof(double) * (size_t)nm);
    for (int64_t e = 0; e < nm; e++) {
      int64_t i = e / S % mn[2];
      if (mdt == KG_BOOL) { /* every 7th query row fully hidden; else about 1 in 4 keys */
        bool on = (c->mask == MASK_BOOL_TS && i % 7 == 3) ? false : uniform() > 0.25;
        ((uint8_t *)kg_data(d.mask))[e] = on;
        mh[e] = on ? 0 : NAN;
      } else { /* about 1 in 10 biases -inf */
        float f = uniform() < 0.1 ? -INFINITY : (float)normal();
        ((float *)kg_data(d.mask))[e] = f;
        mh[e] = f == -INFINITY ? NAN : f;
      }
    }
    r.mask = malloc(sizeof(double) * (size_t)(B * H * T * S));
    for (int64_t e = 0; e < B * H * T * S; e++) {
      int64_t j = e % S, i = e / S % T, h = e / (S * T) % H, b = e / (S * T * H);
      int64_t me = (((b % mn[0]) * mn[1] + h % mn[1]) * mn[2] + i % mn[2]) * S + j;
      r.mask[e] = mh[me];
    }
    free(mh);
  }
  reference(&r);
  double tol = c->dt == KG_F32 ? 5e-6 : 8e-3, gtol = c->dt == KG_F32 ? 2e-5 : 1e-2;
  int fails = 0;
  for (int vi = 0; vi < NVAR; vi++) {
    kg_attn_tune = variants[vi].tune;
    if (kg_attn_tune.variant == KG_ATTN_AVX2 && !kg_attn_avx2_available()) continue;
    d.out = empty4(nq, 4, c->dt), d.lse = empty4(nl, 3, KG_F32);
    d.dq = empty4(nq, 4, c->dt), d.dk = empty4(nk, 4, c->dt), d.dv = empty4(nk, 4, c->dt);
    run_forward(&d);
    run_backward(&d);
    double e[5] = {rel_err(d.out, r.out, (int64_t)szq), rel_err(d.lse, r.lse, B * H * T),
                   rel_err(d.dq, r.dq, (int64_t)szq), rel_err(d.dk, r.dk, (int64_t)szk),
                   rel_err(d.dv, r.dv, (int64_t)szk)};
    bool ok = e[0] <= tol && e[1] <= 1e-5 && e[2] <= gtol && e[3] <= gtol && e[4] <= gtol;
    fails += !ok;
    printf("%s case %2d [%lld,%lld/%lld,%lld,%lld,%lld]%s%s w%lld m%d %s %-12s out %.1e lse %.1e dq %.1e dk %.1e "
           "dv %.1e\n",
           ok ? "ok  " : "FAIL", ci, (long long)B, (long long)H, (long long)Hkv, (long long)T, (long long)S,
           (long long)D, c->causal ? " causal" : "", c->noncontig ? " noncontig" : "", (long long)c->window,
           c->mask, kg_dtype_info[c->dt].name, variants[vi].name, e[0], e[1], e[2], e[3], e[4]);
    kg_tensor *ts[5] = {d.out, d.lse, d.dq, d.dk, d.dv};
    for (int i = 0; i < 5; i++) kg_tensor_release(ts[i]);
  }
  kg_attn_tune = (kg_attn_tuning){KG_ATTN_AUTO, 64, 64, 128};
  kg_tensor *ins[5] = {d.q, d.k, d.v, d.g, d.mask};
  for (int i = 0; i < 5; i++)
    if (ins[i]) kg_tensor_release(ins[i]);
  double *hs[10] = {r.q, r.k, r.v, r.g, r.mask, r.out, r.lse, r.dq, r.dk, r.dv};
  for (int i = 0; i < 10; i++) free(hs[i]);
  return fails;
}

/* ---- timing -------------------------------------------------------------------------------- */

/* fastest CPU ms of fn(d) over runs calls after one warm-up (the least disturbed run) */
static double time_ms(void (*fn)(run_data *), run_data *d, int runs) {
  double ts[64];
  fn(d);
  for (int i = 0; i < runs; i++) {
    double t0 = lab_cpu_seconds();
    fn(d);
    ts[i] = (lab_cpu_seconds() - t0) * 1e3;
  }
  qsort(ts, (size_t)runs, sizeof(double), lab_cmp_double);
  return ts[0];
}

static void time_shape(const acase *c, int runs) {
  int64_t nq[4] = {c->B, c->H, c->T, c->D}, nk[4] = {c->B, c->Hkv, c->S, c->D}, nl[3] = {c->B, c->H, c->T};
  run_data d = {0};
  d.q = make_input(nq, c->dt, false, NULL, 1), d.k = make_input(nk, c->dt, false, NULL, 1);
  d.v = make_input(nk, c->dt, false, NULL, 1), d.g = make_input(nq, c->dt, false, NULL, 1);
  d.out = empty4(nq, 4, c->dt), d.lse = empty4(nl, 3, KG_F32);
  d.dq = empty4(nq, 4, c->dt), d.dk = empty4(nk, 4, c->dt), d.dv = empty4(nk, 4, c->dt);
  d.prm = (kg_sdpa_params){0, c->causal, c->window};
  double gf = 4.0 * (double)(c->B * c->H * c->T * c->S * c->D) / 1e9; /* forward GFLOP, no band */
  printf("[%lld,%lld/%lld,%lld,%lld,%lld]%s %s:\n", (long long)c->B, (long long)c->H, (long long)c->Hkv,
         (long long)c->T, (long long)c->S, (long long)c->D, c->causal ? " causal" : "", kg_dtype_info[c->dt].name);
  for (int vi = 0; vi < NVAR; vi++) {
    kg_attn_tune = variants[vi].tune;
    double f = time_ms(run_forward, &d, runs), b = time_ms(run_backward, &d, runs);
    printf("  %-12s fwd %7.2f ms (%5.1f GFLOP/s)  bwd %7.2f ms (%5.1f GFLOP/s)\n", variants[vi].name, f,
           gf / f * 1e3, b, 2.5 * gf / b * 1e3);
  }
  kg_attn_tune = (kg_attn_tuning){KG_ATTN_AUTO, 64, 64, 128};
  kg_tensor *ts[9] = {d.q, d.k, d.v, d.g, d.out, d.lse, d.dq, d.dk, d.dv};
  for (int i = 0; i < 9; i++) kg_tensor_release(ts[i]);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--check") == 0) {
    int fails = 0;
    for (int ci = 0; ci < NCASE; ci++) fails += check_case(&cases[ci], ci);
    printf("%d failures\n", fails);
    return fails != 0;
  }
  int runs = argc > 1 ? atoi(argv[1]) : 5;
  runs = runs < 1 ? 1 : runs > 64 ? 64 : runs;
  printf("lab_attention: %d threads, fastest of %d runs, CPU ms (GFLOP/s counts the full T x S)\n", kg_num_threads(), runs);
  static const acase shapes[] = {
      {8, 8, 8, 512, 512, 64, false, 0, MASK_NONE, KG_F32, false},
      {8, 8, 8, 512, 512, 64, true, 0, MASK_NONE, KG_F32, false},
      {8, 8, 8, 512, 512, 64, false, 0, MASK_NONE, KG_BF16, false},
      {32, 2, 2, 128, 128, 64, false, 0, MASK_NONE, KG_F32, false},
      {8, 8, 2, 128, 128, 32, true, 0, MASK_NONE, KG_F32, false},
      {26, 2, 2, 256, 256, 32, false, 0, MASK_NONE, KG_F32, false}, /* sd_tiny self-attention */
      {32, 4, 4, 1, 64, 64, true, 0, MASK_NONE, KG_F32, false},     /* one decode step with a KV cache */
      {4, 3, 3, 256, 256, 64, false, 0, MASK_FLOAT_HTS, KG_F32, false}, /* sam_tiny global, rel-pos bias */
      {36, 3, 3, 49, 49, 64, false, 0, MASK_FLOAT_HTS, KG_F32, false},  /* sam_tiny 7x7 windows */
      {26, 8, 8, 256, 256, 16, false, 0, MASK_NONE, KG_F32, false},     /* head dim 16 */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) time_shape(&shapes[i], runs);
  return 0;
}
