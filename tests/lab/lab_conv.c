/* lab_conv.c — kernel lab of the CPU conv2d (engine/cpu/conv.c): the im2col + GEMM tiles, the
 * direct small-image kernel (AVX2+FMA, AVX-512) and Winograd F(4x4, 3x3) (conv_winograd.c;
 * AVX2+FMA, AVX-512 GEMM kernel), forward (y) and backward (dx, dw, db), against a naive f64
 * convolution.
 *
 *   lab_conv --check      every variant the CPU has x every case below (odd and tiny H, W,
 *                         channels not a multiple of the vector width, stride 1/2, padding
 *                         0/1/2, 1x1 and 3x3 and 5x3, dilation, groups, batch 1..30; for Winograd
 *                         every H, W in 1..11 with padding 0/1/2: partial edge tiles); ctest
 *   lab_conv [runs=7] [variant filter] [shape filter: vae|unet]
 *                         times the variants at the sd_tiny UNet and VAE shapes (median process
 *                         CPU ms; threads from KENG_NUM_THREADS, 1 is meant)
 *
 * Variants are picked through conv.c's environment switches: KENG_CONV_DIRECT=0 (GEMM only),
 * =1 (AVX2 cap), =2 (AVX-512 cap), KENG_CONV_DIRECT_FORCE=1 (direct kernel at any size), and
 * the same for Winograd: KENG_CONV_WINOGRAD=0|1|2, KENG_CONV_WINOGRAD_FORCE=1 (wherever it
 * applies: 3x3, stride 1, dilation 1, one group).
 * Shape letters: B batch, C in channels, M out channels, H/W input size, Ho/Wo output size.
 */
#include "lab.h"
#include <keng/keng.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

kg_status kg_cpu_conv2d(const kg_op_call *c);
kg_status kg_cpu_conv2d_backward(const kg_op_call *c);

/* ---- variants ------------------------------------------------------------------------------ */

typedef struct {
  const char *name, *direct, *force, *wino, *wforce;
  int isa; /* 0 any, 1 needs AVX2+FMA, 2 needs AVX-512F */
} variant;

static const variant variants[] = {
    {"gemm", "0", "0", "0", "0", 0},
    {"auto", "2", "0", "2", "0", 0},
    {"direct avx2", "1", "1", "0", "0", 1},
    {"direct avx512", "2", "1", "0", "0", 2},
    {"wino avx2", "1", "0", "1", "1", 1}, /* y, dx and dw all by Winograd wherever it applies */
    {"wino avx512", "2", "0", "2", "1", 2},
};
#define NVAR ((int)(sizeof variants / sizeof variants[0]))

static bool variant_runs(const variant *v) {
  if (v->isa >= 1 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return false;
  if (v->isa >= 2 && !__builtin_cpu_supports("avx512f")) return false;
  return true;
}

static void use_variant(const variant *v) {
  setenv("KENG_CONV_DIRECT", v->direct, 1);
  setenv("KENG_CONV_DIRECT_FORCE", v->force, 1);
  setenv("KENG_CONV_WINOGRAD", v->wino, 1);
  setenv("KENG_CONV_WINOGRAD_FORCE", v->wforce, 1);
  kg_env_reload(); /* the engine reads its switches once */
}

/* ---- cases --------------------------------------------------------------------------------- */

typedef struct {
  int64_t B, C, H, W, M;
  int kh, kw, s, p, d, groups;
} ccase;

static const ccase cases[] = {
    {13, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1},  /* UNet level 0 */
    {13, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1},    {13, 128, 4, 4, 128, 3, 3, 1, 1, 1, 1},
    {26, 128, 2, 2, 128, 3, 3, 1, 1, 1, 1},  /* two chunks of 13 */
    {30, 5, 3, 7, 37, 3, 3, 1, 1, 1, 1},     /* 30 = 3 chunks (AVX-512) / 5 (AVX2); M tail */
    {15, 3, 5, 4, 4, 3, 3, 1, 1, 1, 1},      /* conv_out-like M = 4; chunks 8 + 7 */
    {1, 7, 6, 5, 9, 3, 3, 1, 1, 1, 1},       /* batch 1 */
    {7, 6, 9, 9, 17, 3, 3, 2, 1, 1, 1},      /* stride 2 (strided data gradient) */
    {5, 8, 8, 7, 16, 3, 3, 2, 0, 1, 1},      /* stride 2, no padding */
    {9, 16, 5, 5, 33, 1, 1, 1, 0, 1, 1},     /* 1x1 */
    {6, 4, 7, 6, 10, 5, 3, 1, 2, 1, 1},      /* 5x3 kernel, padding 2 */
    {4, 3, 6, 6, 5, 3, 3, 1, 2, 2, 1},       /* dilation 2 */
    {14, 8, 4, 4, 12, 3, 3, 1, 1, 1, 2},     /* groups 2 */
    {2, 4, 1, 1, 3, 3, 3, 1, 1, 1, 1},       /* 1x1 image: only the centre tap */
    {3, 2, 2, 3, 64, 3, 3, 1, 0, 1, 1},      /* output 0x1 */
    {4, 16, 20, 20, 24, 3, 3, 1, 1, 1, 1},   /* above the direct kernel's size limit */
    {2, 20, 30, 29, 33, 3, 3, 1, 1, 1, 1},   /* Winograd: several tile blocks, the last partial */
    {3, 35, 13, 10, 40, 3, 3, 1, 2, 1, 1},   /* Winograd: 3 channel vectors, 2-3 m-blocks */
    {1, 16, 9, 9, 16, 3, 3, 1, 0, 1, 1},     /* Winograd: C, M one vector exactly */
    {1, 256, 14, 13, 40, 3, 3, 1, 1, 1, 1},  /* Winograd: 256 channels (error growth) */
    {5, 24, 60, 56, 20, 3, 3, 1, 1, 1, 1},   /* Winograd dw: several tile blocks per thread summed */
};
#define NCASE ((int)(sizeof cases / sizeof cases[0]))

/* Winograd's partial tiles: every H, W in 1..11 (W from a fixed permutation) x padding 0..2,
 * batch 1..3, C and M not multiples of 16 */
#define NSWEEP (11 * 3)
static ccase sweep_case(int i) {
  int h = i / 3 + 1, p = i % 3, wv = (h * 7) % 11 + 1;
  return (ccase){1 + i % 3, 3 + i % 5 * 4, h, wv, 5 + i % 7 * 3, 3, 3, 1, p, 1, 1};
}

static int64_t out_size(int64_t n, int k, int s, int p, int d) { return (n + 2 * p - d * (k - 1) - 1) / s + 1; }

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;
static double uniform(void) { /* xorshift64 in [0, 1) */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void must(kg_status s) {
  if (s) {
    fprintf(stderr, "lab_conv: %s\n", kg_last_error());
    exit(2);
  }
}

static kg_tensor *tensor(int nd, const int64_t *n) {
  kg_tensor *t = NULL;
  must(kg_tensor_empty(&t, nd, n, KG_F32, (kg_device){KG_DEV_CPU, 0}));
  return t;
}

/* uniform in [-1, 1), host <- the same values in double */
static kg_tensor *random_tensor(int nd, const int64_t *n, double *host) {
  kg_tensor *t = tensor(nd, n);
  float *f = kg_data(t);
  for (int64_t i = 0; i < kg_numel(t); i++) host[i] = f[i] = (float)(2 * uniform() - 1);
  return t;
}

typedef struct {
  ccase c;
  int64_t Ho, Wo;
  kg_tensor *x, *w, *b, *y, *dy, *dx, *dw, *db;
  double *hx, *hw, *hb, *hdy;
  kg_conv2d_params p;
} run_data;

static void setup(run_data *d, const ccase *c) {
  memset(d, 0, sizeof *d);
  d->c = *c;
  d->Ho = out_size(c->H, c->kh, c->s, c->p, c->d), d->Wo = out_size(c->W, c->kw, c->s, c->p, c->d);
  int64_t nx[4] = {c->B, c->C, c->H, c->W}, nw[4] = {c->M, c->C / c->groups, c->kh, c->kw}, nb[1] = {c->M},
          ny[4] = {c->B, c->M, d->Ho, d->Wo};
  int64_t sx = c->B * c->C * c->H * c->W, sw = nw[0] * nw[1] * nw[2] * nw[3], sy = c->B * c->M * d->Ho * d->Wo;
  d->hx = malloc(sizeof(double) * (size_t)(sx + 1)), d->hw = malloc(sizeof(double) * (size_t)(sw + 1));
  d->hb = malloc(sizeof(double) * (size_t)(c->M + 1)), d->hdy = malloc(sizeof(double) * (size_t)(sy + 1));
  d->x = random_tensor(4, nx, d->hx), d->w = random_tensor(4, nw, d->hw), d->b = random_tensor(1, nb, d->hb);
  d->dy = random_tensor(4, ny, d->hdy);
  d->y = tensor(4, ny), d->dx = tensor(4, nx), d->dw = tensor(4, nw), d->db = tensor(1, nb);
  d->p = (kg_conv2d_params){{c->s, c->s}, {c->p, c->p}, {c->d, c->d}, {0, 0}, c->groups};
}

static void teardown(run_data *d) {
  kg_tensor *ts[] = {d->x, d->w, d->b, d->y, d->dy, d->dx, d->dw, d->db};
  for (int i = 0; i < 8; i++) kg_tensor_release(ts[i]);
  free(d->hx), free(d->hw), free(d->hb), free(d->hdy);
}

static void run_forward(run_data *d) {
  const kg_tensor *in[3] = {d->x, d->w, d->b};
  kg_tensor *out[1] = {d->y};
  kg_op_call c = {KG_OP_CONV2D, 3, 1, in, out, &d->p};
  must(kg_cpu_conv2d(&c));
}

static void run_backward(run_data *d) {
  kg_conv_backward_params bp = {d->p, {true, true, true}};
  const kg_tensor *in[3] = {d->dy, d->x, d->w};
  kg_tensor *out[3] = {d->dx, d->dw, d->db};
  kg_op_call c = {KG_OP_CONV2D_BACKWARD, 3, 3, in, out, &bp};
  must(kg_cpu_conv2d_backward(&c));
}

/* ---- reference (f64) ----------------------------------------------------------------------- */

/* y, dx, dw, db of the naive loops, and for each entry the sum of |terms| (the error scale) */
typedef struct {
  double *y, *ya, *dx, *dxa, *dw, *dwa, *db, *dba;
} reference;

static void compute_reference(const run_data *d, reference *r) {
  const ccase *c = &d->c;
  int64_t Cg = c->C / c->groups, Mg = c->M / c->groups, Ho = d->Ho, Wo = d->Wo;
  int64_t sx = c->B * c->C * c->H * c->W, sw = c->M * Cg * c->kh * c->kw, sy = c->B * c->M * Ho * Wo;
  r->y = calloc((size_t)sy + 1, 8), r->ya = calloc((size_t)sy + 1, 8), r->dx = calloc((size_t)sx + 1, 8);
  r->dxa = calloc((size_t)sx + 1, 8), r->dw = calloc((size_t)sw + 1, 8), r->dwa = calloc((size_t)sw + 1, 8);
  r->db = calloc((size_t)c->M + 1, 8), r->dba = calloc((size_t)c->M + 1, 8);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t m = 0; m < c->M; m++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          int64_t yi = ((b * c->M + m) * Ho + oh) * Wo + ow;
          double s = d->hb[m], sa = fabs(d->hb[m]), g = d->hdy[yi];
          r->db[m] += g, r->dba[m] += fabs(g);
          for (int64_t cc = 0; cc < Cg; cc++)
            for (int ki = 0; ki < c->kh; ki++)
              for (int kj = 0; kj < c->kw; kj++) {
                int64_t ih = oh * c->s - c->p + ki * c->d, iw = ow * c->s - c->p + kj * c->d;
                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                int64_t ci = m / Mg * Cg + cc;
                int64_t xi = ((b * c->C + ci) * c->H + ih) * c->W + iw, wi = ((m * Cg + cc) * c->kh + ki) * c->kw + kj;
                s += d->hx[xi] * d->hw[wi], sa += fabs(d->hx[xi] * d->hw[wi]);
                r->dx[xi] += g * d->hw[wi], r->dxa[xi] += fabs(g * d->hw[wi]);
                r->dw[wi] += g * d->hx[xi], r->dwa[wi] += fabs(g * d->hx[xi]);
              }
          r->y[yi] = s, r->ya[yi] = sa;
        }
}

static void free_reference(reference *r) {
  free(r->y), free(r->ya), free(r->dx), free(r->dxa), free(r->dw), free(r->dwa), free(r->db), free(r->dba);
}

/* worst |got - ref| / (sum of |terms| + 1e-30) over the tensor; f32 sums of K terms stay well
 * under 1e-5 of that scale, one dropped or doubled term is ~1/K of it */
static double worst(const kg_tensor *t, const double *ref, const double *scale) {
  const float *f = kg_data(t);
  double e = 0;
  for (int64_t i = 0; i < kg_numel(t); i++) {
    double v = fabs(f[i] - ref[i]) / (scale[i] + 1e-30);
    if (!(v <= e)) e = v; /* NaN counts as a failure */
  }
  return e;
}

static int check(void) {
  int fails = 0, runs = 0;
  double most[NVAR][3] = {{0}}; /* worst y, dx and dw error per variant */
  for (int ci = 0; ci < NCASE + NSWEEP; ci++) {
    ccase cc = ci < NCASE ? cases[ci] : sweep_case(ci - NCASE);
    const ccase *c = &cc;
    /* (kg_conv2d rejects a kernel larger than the padded input) */
    if (ci >= NCASE && (out_size(c->H, c->kh, c->s, c->p, c->d) < 1 || out_size(c->W, c->kw, c->s, c->p, c->d) < 1))
      continue;
    run_data d;
    setup(&d, c);
    reference r;
    compute_reference(&d, &r);
    for (int v = 0; v < NVAR; v++) {
      if (!variant_runs(&variants[v])) continue;
      use_variant(&variants[v]);
      memset(kg_data(d.y), 0xff, (size_t)kg_numel(d.y) * 4); /* NaN: every entry must be written */
      memset(kg_data(d.dx), 0xff, (size_t)kg_numel(d.dx) * 4);
      run_forward(&d);
      run_backward(&d);
      double ey = worst(d.y, r.y, r.ya), ex = worst(d.dx, r.dx, r.dxa), ew = worst(d.dw, r.dw, r.dwa),
             eb = worst(d.db, r.db, r.dba);
      /* Winograd rounds in the transformed tile: at a corner with padding 2 the output has 1-4
       * terms per channel but its error comes from the whole 6x6 input tile (seen: 9.1e-6) */
      double tol = variants[v].wino[0] == '0' ? 1e-5 : 3e-5;
      bool ok = ey < tol && ex < tol && ew < tol && eb < tol;
      if (!(ey <= most[v][0])) most[v][0] = ey;
      if (!(ex <= most[v][1])) most[v][1] = ex;
      if (!(ew <= most[v][2])) most[v][2] = ew;
      runs++;
      if (!ok) {
        fails++;
        printf("FAIL %-14s B%lld C%lld %lldx%lld M%lld k%dx%d s%d p%d d%d g%d: y %.2g dx %.2g dw %.2g db %.2g\n",
               variants[v].name, (long long)c->B, (long long)c->C, (long long)c->H, (long long)c->W,
               (long long)c->M, c->kh, c->kw, c->s, c->p, c->d, c->groups, ey, ex, ew, eb);
      }
    }
    free_reference(&r);
    teardown(&d);
  }
  for (int v = 0; v < NVAR; v++)
    if (variant_runs(&variants[v]))
      printf("  %-14s worst y %.2g dx %.2g dw %.2g (of the sum of |terms|)\n", variants[v].name, most[v][0],
             most[v][1], most[v][2]);
  printf("lab_conv --check: %d runs, %d failed\n", runs, fails);
  return fails ? 1 : 0;
}

/* ---- timing -------------------------------------------------------------------------------- */

/* median CPU ms of fn(d) over runs calls after one warm-up */
static double time_ms(void (*fn)(run_data *), run_data *d, int runs) {
  double ts[64];
  if (runs > 64) runs = 64;
  fn(d);
  for (int i = 0; i < runs; i++) {
    double t0 = lab_cpu_seconds();
    fn(d);
    ts[i] = (lab_cpu_seconds() - t0) * 1e3;
  }
  qsort(ts, (size_t)runs, sizeof(double), lab_cmp_double);
  return ts[runs / 2];
}

static const ccase bench[] = { /* sd_tiny UNet */
    {13, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1},  {13, 96, 16, 16, 32, 3, 3, 1, 1, 1, 1},
    {13, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1},    {13, 192, 8, 8, 64, 3, 3, 1, 1, 1, 1},
    {13, 128, 4, 4, 128, 3, 3, 1, 1, 1, 1},  {13, 256, 4, 4, 128, 3, 3, 1, 1, 1, 1},
    {13, 128, 2, 2, 128, 3, 3, 1, 1, 1, 1},  {13, 256, 2, 2, 128, 3, 3, 1, 1, 1, 1},
    {13, 32, 16, 16, 4, 3, 3, 1, 1, 1, 1},   {13, 64, 8, 8, 64, 1, 1, 1, 0, 1, 1},
    {13, 128, 16, 16, 128, 3, 3, 1, 1, 1, 1}, {26, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1},
    {26, 128, 4, 4, 128, 3, 3, 1, 1, 1, 1},
};
static const ccase bench_vae[] = { /* sd_tiny VAE decoder (batch 8) */
    {8, 32, 128, 128, 32, 3, 3, 1, 1, 1, 1}, {8, 64, 64, 64, 64, 3, 3, 1, 1, 1, 1},
    {8, 128, 32, 32, 128, 3, 3, 1, 1, 1, 1}, {8, 128, 16, 16, 128, 3, 3, 1, 1, 1, 1},
    {8, 32, 64, 64, 64, 3, 3, 1, 1, 1, 1},   {8, 64, 32, 32, 128, 3, 3, 1, 1, 1, 1},
};

static void bench_shapes(const ccase *list, size_t n, int runs, const char *vf) {
  for (size_t i = 0; i < n; i++) {
    const ccase *c = &list[i];
    run_data d;
    setup(&d, c);
    printf("B%-2lld %3lld->%-3lld k%d @%-3lld:", (long long)c->B, (long long)c->C, (long long)c->M, c->kh,
           (long long)c->H);
    for (int v = 0; v < NVAR; v++) {
      if (!variant_runs(&variants[v]) || (vf && !strstr(variants[v].name, vf))) continue;
      use_variant(&variants[v]);
      printf("  %s fwd %6.3f bwd %6.3f", variants[v].name, time_ms(run_forward, &d, runs),
             time_ms(run_backward, &d, runs));
      fflush(stdout);
    }
    printf("\n");
    teardown(&d);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--check") == 0) return check();
  int runs = argc > 1 ? atoi(argv[1]) : 7;
  const char *vf = argc > 2 && *argv[2] ? argv[2] : NULL, *sf = argc > 3 ? argv[3] : "";
  printf("lab_conv: median process CPU ms of %d runs, %d threads; fwd = y, bwd = dx + dw + db\n", runs,
         kg_num_threads());
  if (!strstr(sf, "vae")) bench_shapes(bench, sizeof bench / sizeof bench[0], runs, vf);
  if (!strstr(sf, "unet")) bench_shapes(bench_vae, sizeof bench_vae / sizeof bench_vae[0], runs, vf);
  return 0;
}
