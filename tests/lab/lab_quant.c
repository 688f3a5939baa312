/* lab_quant.c — kernel lab for engine/cpu/quant.c: out[N, M] = a[N, K] · W[M, K]ᵀ + b with W
 * quantized in one of the formats of engine/ops/quant_format.h (Q8: int8 + a row scale; Q8_0:
 * int8 + an f16 scale per 32; Q4_0: 4-bit codes + an f16 scale per 32), docs/quantization.md.
 *
 *   lab_quant --check   every variant the CPU runs, for every format, vs a naive f64 reference at
 *                       N in 1..9, 31..33, 70, K around the 8/16/32/64/128 edges, padded leading
 *                       dims, with and without bias, 1 and 2 threads: the f32-x variants (scalar,
 *                       AVX2, AVX-512, blocked) against the f64 sum with the dequantized weight,
 *                       the int8-x ones (I8 scalar, VNNI) against the f64 sum with x quantized by
 *                       kg_cpu_quantize_x_row; the quantizers' ties, clamps and zero blocks; the
 *                       size of the int8-x error against f32 x; the 32-bit word decoding of the
 *                       CUDA GEMV (kg_qf_word_*) against kg_qf_code; and planted bugs (a scale
 *                       off by 0.1%, an int8-x reference fed f32 x, a word's codes in the wrong
 *                       order) must be caught
 *   lab_quant --model [THREADS]  every GEMV of one decode step of the ~1B Mistral (quant_1b.lua's
 *                       shapes; LAB_QUANT_HIDDEN / _FFN / _LAYERS change them), each format with
 *                       the AUTO kernel, weights from kg_cpu_alloc: ms per step and GB/s
 *   lab_quant           times a decode GEMV, x [1, 4096] against a [16384, 4096] weight: each
 *                       format and variant vs the bf16 kernel (engine/cpu/gemm_bf16.c), in GB/s
 *                       of weight bytes read; LAB_QUANT_M=131072 makes the weight 512 MiB of int8
 *                       (past this VM's 480 MiB L3: DRAM)
 */
#include "lab.h"
#include "cpu/gemm_bf16.h"
#include "cpu/quant.h"

#include <keng/scalar.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / (1 << 23)) - 1.0);
}

typedef struct {
  const char *name;
  kg_q8_variant v;
  bool ok, i8; /* runs here; quantizes x */
} variant;

static const char *fmt_name[] = {"Q8", "Q8_0", "Q4_0"};
static int failures, checks;

/* a random weight of format f, [M, K] with padded strides (codes ldq bytes, scales lds) */
typedef struct {
  kg_qweight w;
  uint8_t *q;
  void *s;
} qw_buf;

static qw_buf make_weight(kg_qfmt f, int64_t M, int64_t K) {
  qw_buf b;
  int64_t ldq = kg_qf_row_bytes(f, K) + 5, lds = f == KG_QF_Q8 ? 1 : K / KG_QF_BLOCK + 2;
  b.q = malloc((size_t)(M * ldq + 1));
  b.s = malloc(4 * (size_t)(M * lds + 1));
  for (int64_t i = 0; i < M * ldq; i++) {
    rng = rng * 6364136223846793005ull + 1;
    b.q[i] = f == KG_QF_Q4_0 ? (uint8_t)(rng >> 56) : (uint8_t)(int8_t)(frand() * 127.5f); /* never -128 */
  }
  for (int64_t i = 0; i < M * lds; i++) {
    if (f == KG_QF_Q8) ((float *)b.s)[i] = 0.01f * (1 + frand());
    else ((uint16_t *)b.s)[i] = kg_f32_to_f16(0.01f * frand());
  }
  b.w = (kg_qweight){f, b.q, ldq, b.s, lds};
  return b;
}

/* one product vs the f64 sum; returns the max relative error (|err| / (Σ|a·W| + |b|)). plant:
 * 1 = the reference's scales off by 0.1%, 2 = an int8-x reference fed f32 x; *vs_f32 (when not
 * NULL) gets the largest difference of the int8-x reference from the f32-x one, relative to
 * Σ|a·W| + |b| */
static double check_one(const variant *var, kg_qfmt f, int64_t N, int64_t M, int64_t K, bool with_bias, int threads,
                        int plant, double *vs_f32) {
  int64_t lda = K + 3, ldo = M + 2;
  float *a = malloc(sizeof(float) * (size_t)(N * lda + 1)), *o = malloc(sizeof(float) * (size_t)(N * ldo + 1));
  float *bias = malloc(sizeof(float) * (size_t)M), *deq = malloc(sizeof(float) * (size_t)(K + 1));
  float *xd = malloc(sizeof(float) * (size_t)(K / KG_QF_BLOCK + 2)), *xv = malloc(sizeof(float) * (size_t)(K + 1));
  int8_t *xq = malloc((size_t)(K + 1));
  qw_buf wb = make_weight(f, M, K);
  for (int64_t i = 0; i < N * lda; i++) a[i] = frand() * (i % 7 == 0 ? 4 : 1); /* some outliers */
  for (int64_t m = 0; m < M; m++) bias[m] = frand();
  kg_cpu_gemm_q(o, ldo, a, lda, &wb.w, with_bias ? bias : NULL, N, M, K, var->v, threads);
  double worst = 0;
  for (int64_t n = 0; n < N; n++) {
    const float *an = a + n * lda;
    kg_cpu_quantize_x_row(xq, xd, an, K);
    for (int64_t k = 0; k < K; k++) xv[k] = var->i8 && plant != 2 ? (float)xq[k] * xd[k / KG_QF_BLOCK] : an[k];
    double rel = 0;
    for (int64_t m = 0; m < M; m++) {
      const void *sr = f == KG_QF_Q8 ? (const void *)((float *)wb.s + m) : (const void *)((uint16_t *)wb.s + m * wb.w.lds);
      kg_cpu_dequantize_row(deq, f, wb.q + m * wb.w.ldq, sr, K);
      double s = 0, mag = 0, s32 = 0;
      for (int64_t k = 0; k < K; k++) {
        double t = (double)xv[k] * (double)deq[k] * (plant == 1 ? 1.001 : 1);
        s += t, mag += fabs(t), s32 += (double)an[k] * (double)deq[k];
      }
      if (with_bias) s += bias[m], s32 += bias[m], mag += fabs(bias[m]);
      double err = fabs((double)o[n * ldo + m] - s) / (mag + 1e-30);
      if (err > worst) worst = err;
      rel = fmax(rel, fabs(s - s32) / (mag + 1e-30));
    }
    if (vs_f32 && rel > *vs_f32) *vs_f32 = rel;
  }
  free(a), free(o), free(bias), free(deq), free(xd), free(xv), free(xq), free(wb.q), free(wb.s);
  return worst;
}

static double i8_error; /* the largest int8-x difference from f32 x seen (relative to Σ|a·W| + |b|) */

static void check_variant(const variant *var, kg_qfmt f) {
  static const int64_t Ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 70};
  static const int64_t Ks8[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 257};
  static const int64_t Ksg[] = {32, 64, 96, 128, 160, 224, 256, 352};
  const int64_t *Ks = f == KG_QF_Q8 ? Ks8 : Ksg;
  size_t nk = f == KG_QF_Q8 ? sizeof Ks8 / sizeof *Ks8 : sizeof Ksg / sizeof *Ksg;
  for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
    for (size_t ki = 0; ki < nk; ki++) {
      int64_t M = 3 + (int64_t)((ni + ki) % 7) * 11;
      double err = check_one(var, f, Ns[ni], M, Ks[ki], (ni + ki) % 2 == 0, (ni + ki) % 3 == 0 ? 2 : 1, 0,
                             var->i8 ? &i8_error : NULL);
      checks++;
      if (err > 1e-5) {
        failures++;
        printf("\nFAIL %s %s N=%lld M=%lld K=%lld: relative error %.3g", fmt_name[f], var->name, (long long)Ns[ni],
               (long long)M, (long long)Ks[ki], err);
      }
    }
}

static void check_quantize(void) {
  /* absmax 127 -> scale 1: the values are their own rounding; .5 ties go to even */
  double w[8] = {127, -127, 2.5, 3.5, -2.5, 0.49, -0.5, 1.5};
  int8_t want[8] = {127, -127, 2, 4, -2, 0, 0, 2}, q[8];
  float s;
  kg_cpu_quantize_q8_row(q, &s, w, 8);
  checks++;
  if (s != 1.0f || memcmp(q, want, 8)) failures++, printf("\nFAIL quantize_q8_row: ties/values (scale %g)", s);
  double z[3] = {0, 0, -0.0};
  kg_cpu_quantize_q8_row(q, &s, z, 3);
  checks++;
  if (s != 0.0f || q[0] || q[1] || q[2]) failures++, printf("\nFAIL quantize_q8_row: zero row");
  /* every dequantized value within half a step of the original */
  double r[300];
  int8_t rq[300];
  for (int i = 0; i < 300; i++) r[i] = frand() * 3;
  kg_cpu_quantize_q8_row(rq, &s, r, 300);
  checks++;
  for (int i = 0; i < 300; i++)
    if (fabs(rq[i] * (double)s - r[i]) > 0.5 * s * (1 + 1e-6) || rq[i] < -127) {
      failures++, printf("\nFAIL quantize_q8_row: value %d off by more than half a step", i);
      break;
    }
  /* int8 x: block 1 has absmax 127 (d = 1, ties to even), block 2 is zero, block 3 (5 values, the
   * short last one) holds a NaN */
  float x[69] = {127, -127, 2.5f, 3.5f, -2.5f, 0.49f, -0.5f, 1.5f};
  x[66] = NAN, x[64] = 1;
  int8_t xq[69], xw[8] = {127, -127, 2, 4, -2, 0, 0, 2};
  float xd[3];
  kg_cpu_quantize_x_row(xq, xd, x, 69);
  checks++;
  if (xd[0] != 1.0f || memcmp(xq, xw, 8) || xd[1] != 0 || xq[40] != 0 || !isnan(xd[2]))
    failures++, printf("\nFAIL quantize_x_row: ties / zero block / NaN block (d %g %g %g)", xd[0], xd[1], xd[2]);
  /* a block's values within half a step, never past ±127 */
  float xr[100];
  int8_t xrq[100];
  float xrd[4];
  for (int i = 0; i < 100; i++) xr[i] = frand() * 5;
  kg_cpu_quantize_x_row(xrq, xrd, xr, 100);
  checks++;
  for (int i = 0; i < 100; i++)
    if (fabsf(xrq[i] * xrd[i / 32] - xr[i]) > 0.5f * xrd[i / 32] * (1 + 1e-5f) || xrq[i] < -127) {
      failures++, printf("\nFAIL quantize_x_row: value %d off by more than half a step", i);
      break;
    }
}

static void check_quantize_q4(void) {
  /* a block whose largest magnitude is -8 (scale 1): codes are value + 8, ties to even, +8 clamps to 15 */
  double w[32] = {-8, 7, 2.5, 3.5, -2.5, 0.49, 8, 1.5};
  uint8_t q[16];
  uint16_t s;
  kg_cpu_quantize_q4_row(q, &s, w, 32);
  float d[32];
  kg_cpu_dequantize_row(d, KG_QF_Q4_0, q, &s, 32);
  float want[8] = {-8, 7, 2, 4, -2, 0, 7, 2};
  checks++;
  if (kg_f16_to_f32(s) != 1.0f) failures++, printf("\nFAIL quantize_q4_row: scale %g", kg_f16_to_f32(s));
  for (int j = 0; j < 8; j++)
    if (d[j] != want[j]) {
      failures++, printf("\nFAIL quantize_q4_row: element %d -> %g, want %g", j, d[j], want[j]);
      break;
    }
}

/* the 32-bit word decoding of the CUDA GEMV (quant_format.h's kg_qf_word_*) against kg_qf_code:
 * every element of a row exactly once, each code right, a word's codes in one block. plant: 1 = the
 * codes of a word taken in the wrong order (Q4_0: high and low nibbles swapped; int8: bytes
 * reversed), which must be seen. Returns the mismatches. */
static int word_mismatches(kg_qfmt f, const uint8_t *row, int64_t K, int plant) {
  int bad = 0, nc = kg_qf_word_codes(f);
  char seen[256] = {0};
  for (int64_t i = 0; i < kg_qf_row_bytes(f, K) / 4; i++) {
    uint32_t v = (uint32_t)row[4 * i] | (uint32_t)row[4 * i + 1] << 8 | (uint32_t)row[4 * i + 2] << 16 |
                 (uint32_t)row[4 * i + 3] << 24;
    for (int j = 0; j < nc; j++) {
      int jj = plant ? (f == KG_QF_Q4_0 ? j ^ 4 : 3 - j) : j;
      int64_t e = kg_qf_word_elem(f, i, j);
      if (e < 0 || e >= K || seen[e]++ || kg_qf_word_code(f, v, jj) != kg_qf_code(f, row, e) ||
          e / KG_QF_BLOCK != kg_qf_word_elem(f, i, 0) / KG_QF_BLOCK)
        bad++;
    }
  }
  for (int64_t e = 0; e < K; e++) bad += !seen[e];
  return bad;
}

static void check_words(void) {
  uint8_t row[256];
  for (int i = 0; i < 256; i++) {
    rng = rng * 6364136223846793005ull + 1;
    row[i] = (uint8_t)(rng >> 56);
  }
  row[0] = 0x80, row[1] = 0x7F, row[2] = 0x0F, row[3] = 0xF0; /* the extreme codes */
  for (int f = KG_QF_Q8; f <= KG_QF_Q4_0; f++) {
    checks += 2;
    int bad = word_mismatches((kg_qfmt)f, row, 256, 0);
    if (bad) failures++, printf("\nFAIL %s words: %d codes decoded wrong or missed", fmt_name[f], bad);
    if (!word_mismatches((kg_qfmt)f, row, 256, 1))
      failures++, printf("\nFAIL %s words: a planted code order went unseen", fmt_name[f]);
  }
}

static int run_check(variant *vars, int nv) {
  double t0 = lab_wall_seconds();
  printf("checking");
  for (int i = 0; i < nv; i++) {
    if (!vars[i].ok) {
      printf(" [%s: not on this CPU]", vars[i].name);
      continue;
    }
    printf(" %s", vars[i].name);
    fflush(stdout);
    for (int f = KG_QF_Q8; f <= KG_QF_Q4_0; f++) check_variant(&vars[i], (kg_qfmt)f);
  }
  check_quantize();
  check_quantize_q4();
  check_words();
  /* the checks can fail: planted bugs must be caught */
  for (int i = 0; i < nv; i++)
    for (int f = KG_QF_Q8; f <= KG_QF_Q4_0; f++) {
      if (!vars[i].ok) continue;
      checks += 2;
      if (check_one(&vars[i], (kg_qfmt)f, 3, 17, 128, true, 1, 1, NULL) <= 1e-5)
        failures++, printf("\nFAIL %s %s: a planted scale error went unseen", fmt_name[f], vars[i].name);
      if (vars[i].i8 && check_one(&vars[i], (kg_qfmt)f, 3, 17, 128, true, 1, 2, NULL) <= 1e-5)
        failures++, printf("\nFAIL %s %s: an f32-x reference passed for int8 x", fmt_name[f], vars[i].name);
    }
  /* int8 x stays close to f32 x: the bound docs/quantization.md states */
  checks++;
  if (!(i8_error < 0.05)) failures++, printf("\nFAIL: int8 x differs from f32 x by %.3g of sum |x w|", i8_error);
  printf("\nint8 x vs f32 x: largest difference %.2e of sum |x w|", i8_error);
  printf("\n%d checks, %d failures (%.1f s)\n", checks, failures, lab_wall_seconds() - t0);
  return failures ? 1 : 0;
}

/* ---- timing ------------------------------------------------------------------------------------ */

static double best_of(int reps, void (*fn)(void *), void *arg) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = lab_wall_seconds();
    fn(arg);
    t = lab_wall_seconds() - t;
    if (t < best) best = t;
  }
  return best;
}

typedef struct {
  int64_t M, K;
  float *a, *o;
  uint16_t *w16;
  kg_qweight w;
  kg_q8_variant v;
} bench;

static void run_q(void *p) {
  bench *b = p;
  kg_cpu_gemm_q(b->o, b->M, b->a, b->K, &b->w, NULL, 1, b->M, b->K, b->v, 0);
}
static void run_bf16(void *p) { /* x holds bf16 values, as in a bf16 model: AUTO may take AVX512_BF16 */
  bench *b = p;
  kg_gemm_bf16_opts o = {.variant = KG_GEMM_BF16_AUTO, .a_bf16 = true};
  kg_cpu_gemm_bf16(b->o, KG_F32, b->M, b->a, b->K, b->w16, b->K, true, 1, b->M, b->K, &o);
}

static void run_timing(variant *vars, int nv) {
  /* LAB_QUANT_M: the weight rows (16384: 64 MiB of int8, L3-resident on this VM; 131072: DRAM) */
  bench b = {.M = getenv("LAB_QUANT_M") ? atoll(getenv("LAB_QUANT_M")) : 16384, .K = 4096};
  b.a = malloc(4 * (size_t)b.K), b.o = malloc(4 * (size_t)b.M), b.w16 = malloc(2 * (size_t)(b.M * b.K));
  for (int64_t i = 0; i < b.K; i++) b.a[i] = kg_bf16_to_f32(kg_f32_to_bf16(frand()));
  for (int64_t i = 0; i < b.M * b.K; i++) b.w16[i] = kg_f32_to_bf16(frand());
  printf("decode GEMV x [1, %lld] . W [%lld, %lld]^T, %d threads, best of 5 (wall)\n", (long long)b.K,
         (long long)b.M, (long long)b.K, kg_num_threads());
  double t = best_of(5, run_bf16, &b);
  printf("  %-4s %-10s %8.2f ms  %6.2f GB/s of weight\n", "bf16", "", t * 1e3, 2.0 * b.M * b.K / t / 1e9);
  free(b.w16);
  for (int f = KG_QF_Q8; f <= KG_QF_Q4_0; f++) {
    qw_buf wb = make_weight((kg_qfmt)f, b.M, b.K);
    b.w = wb.w;
    double bytes = (double)b.M * (double)wb.w.ldq + (double)b.M * (f == KG_QF_Q8 ? 4 : 2 * b.K / 32);
    for (int i = 0; i < nv; i++) {
      if (!vars[i].ok || vars[i].v == KG_Q8_BLOCKED) continue;
      b.v = vars[i].v;
      t = best_of(5, run_q, &b);
      printf("  %-4s %-10s %8.2f ms  %6.2f GB/s of weight and scales\n", fmt_name[f], vars[i].name, t * 1e3,
             bytes / t / 1e9);
    }
    free(wb.q), free(wb.s);
  }
  free(b.a), free(b.o);
}

/* one decode step's GEMVs of a Mistral-shaped model (LAB_QUANT_HIDDEN, _FFN, _LAYERS; default the
 * ~1B of tests/lab/quant_1b.lua: 2048, 5632, 22, kv 1/4 of hidden, a 32000-row head), each weight
 * its own kg_cpu_alloc block as a model's are, every format with the AUTO kernel: the kernels'
 * share of a decode step without the rest of the model (docs/quantization.md) */
static void run_model(int threads) {
  int64_t H = getenv("LAB_QUANT_HIDDEN") ? atoll(getenv("LAB_QUANT_HIDDEN")) : 2048;
  int64_t F = getenv("LAB_QUANT_FFN") ? atoll(getenv("LAB_QUANT_FFN")) : 5632;
  int layers = getenv("LAB_QUANT_LAYERS") ? atoi(getenv("LAB_QUANT_LAYERS")) : 22;
  int64_t shape[8][2] = {{H, H}, {H / 4, H}, {H / 4, H}, {H, H}, {F, H}, {F, H}, {H, F}, {32000, H}};
  int n = 7 * layers + 1;
  float *a = malloc(4 * (size_t)(F > H ? F : H)), *o = malloc(4 * 32000 * 2);
  for (int64_t i = 0; i < (F > H ? F : H); i++) a[i] = frand();
  printf("decode step of a Mistral (hidden %lld, ffn %lld, %d layers + head), %d threads, best of 8\n", (long long)H,
         (long long)F, layers, threads);
  kg_qweight *ws = malloc(sizeof(kg_qweight) * (size_t)n);
  size_t *qr = malloc(sizeof(size_t) * (size_t)n * 2);
  for (int f = KG_QF_Q8; f <= KG_QF_Q4_0; f++) {
    double bytes = 0;
    for (int i = 0; i < n; i++) {
      int64_t M = shape[i == n - 1 ? 7 : i % 7][0], K = shape[i == n - 1 ? 7 : i % 7][1];
      int64_t ldq = kg_qf_row_bytes((kg_qfmt)f, K), lds = kg_qf_row_scales((kg_qfmt)f, K);
      size_t sb = (size_t)(M * lds) * (f == KG_QF_Q8 ? 4 : 2);
      uint8_t *q = kg_cpu_alloc((size_t)(M * ldq), &qr[2 * i]);
      void *sc = kg_cpu_alloc(sb, &qr[2 * i + 1]);
      for (int64_t j = 0; j < M * ldq; j++) q[j] = (uint8_t)(j * 2654435761u >> 13) & (f == KG_QF_Q4_0 ? 0xFF : 0x7F);
      for (int64_t j = 0; j < M * lds; j++)
        if (f == KG_QF_Q8) ((float *)sc)[j] = 0.01f;
        else ((uint16_t *)sc)[j] = kg_f32_to_f16(0.01f);
      ws[i] = (kg_qweight){(kg_qfmt)f, q, ldq, sc, lds};
      bytes += (double)(M * ldq) + (double)sb;
    }
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < 8; r++) {
      double t = lab_wall_seconds(), c = lab_cpu_seconds();
      for (int i = 0; i < n; i++) {
        int64_t M = shape[i == n - 1 ? 7 : i % 7][0], K = shape[i == n - 1 ? 7 : i % 7][1];
        kg_cpu_gemm_q(o, M, a, K, &ws[i], NULL, 1, M, K, KG_Q8_AUTO, threads);
      }
      t = lab_wall_seconds() - t, c = lab_cpu_seconds() - c;
      best = t < best ? t : best, best_cpu = c < best_cpu ? c : best_cpu;
    }
    printf("  %-4s %8.2f ms (cpu %.2f)  %6.2f GB/s of %.0f MB weights and scales\n", fmt_name[f], best * 1e3,
           best_cpu * 1e3, bytes / best / 1e9, bytes / 1e6);
    for (int i = 0; i < n; i++) kg_cpu_free((void *)ws[i].q, qr[2 * i]), kg_cpu_free((void *)ws[i].scale, qr[2 * i + 1]);
  }
  kg_memory_empty_cache(KG_CPU);
  free(ws), free(qr), free(a), free(o);
}

int main(int argc, char **argv) {
  variant vars[] = {{"scalar", KG_Q8_SCALAR, true, false},       {"avx2", KG_Q8_AVX2, kg_cpu_q8_avx2(), false},
                    {"avx512", KG_Q8_AVX512, kg_cpu_q8_avx512(), false}, {"blocked", KG_Q8_BLOCKED, true, false},
                    {"i8-scalar", KG_Q8_I8_SCALAR, true, true},  {"i8-vnni", KG_Q8_I8_VNNI, kg_cpu_q8_vnni(), true}};
  int nv = (int)(sizeof vars / sizeof *vars);
  if (argc > 1 && !strcmp(argv[1], "--check")) return run_check(vars, nv);
  if (argc > 1 && !strcmp(argv[1], "--model")) {
    run_model(argc > 2 ? atoi(argv[2]) : 1);
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "usage: %s [--check | --model [THREADS]]\n", argv[0]);
    return 2;
  }
  run_timing(vars, nv);
  return 0;
}
