/* lab_quant.c — kernel lab for engine/cpu/quant.c: out[N, M] = scale[m] · a[N, K] · w[M, K]ᵀ + b
 * with w int8, the int8 weight-only linear (docs/quantization.md).
 *
 *   lab_quant --check   every variant (scalar, AVX2, AVX-512 where the CPU runs them, blocked
 *                       dequantize + sgemm) vs a naive f64 reference at N in 1..9, 31..33, 70,
 *                       K around the 8/16/32 edges, padded leading dims, with and without bias,
 *                       2 threads; and quantize_q8_row against its definition (ties to even, the
 *                       clamp, a zero row); a planted bug (a wrong scale) must be caught
 *   lab_quant           times a decode GEMV, x [1, 4096] against a [16384, 4096] weight: int8
 *                       and int4 (each variant) vs the bf16 kernel (engine/cpu/gemm_bf16.c), in
 *                       GB/s of weight bytes read; --check also covers the int4 (Q4_0 layout)
 *                       kernels (scalar, AVX2, AVX-512, blocked) and quantize_q4_row
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
  bool ok;
} variant;

static int failures, checks;

/* one product vs the f64 sum; returns the max relative error (|err| / (Σ|a·w·s| + |b|)) */
static double check_one(const variant *var, int64_t N, int64_t M, int64_t K, bool with_bias, int threads,
                        bool plant_bug) {
  int64_t lda = K + 3, ldw = K + 5, ldo = M + 2;
  float *a = malloc(sizeof(float) * (size_t)(N * lda + 1)), *o = malloc(sizeof(float) * (size_t)(N * ldo + 1));
  int8_t *w = malloc((size_t)(M * ldw + 1));
  float *scale = malloc(sizeof(float) * (size_t)M), *bias = malloc(sizeof(float) * (size_t)M);
  for (int64_t i = 0; i < N * lda; i++) a[i] = frand();
  for (int64_t i = 0; i < M * ldw; i++) w[i] = (int8_t)(frand() * 127.5f);
  for (int64_t m = 0; m < M; m++) scale[m] = 0.01f * (1 + frand()), bias[m] = frand();
  kg_cpu_gemm_q8(o, ldo, a, lda, w, ldw, scale, with_bias ? bias : NULL, N, M, K, var->v, threads);
  double worst = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
      double s = 0, mag = 0, sc = plant_bug ? scale[m] * 1.001 : scale[m];
      for (int64_t k = 0; k < K; k++) {
        double t = (double)a[n * lda + k] * (double)w[m * ldw + k] * sc;
        s += t, mag += fabs(t);
      }
      if (with_bias) s += bias[m], mag += fabs(bias[m]);
      double err = fabs((double)o[n * ldo + m] - s) / (mag + 1e-30);
      if (err > worst) worst = err;
    }
  free(a), free(o), free(w), free(scale), free(bias);
  return worst;
}

static void check_variant(const variant *var) {
  static const int64_t Ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 70};
  static const int64_t Ks[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 100, 257};
  for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
      int64_t M = 3 + (int64_t)((ni + ki) % 7) * 11;
      double err = check_one(var, Ns[ni], M, Ks[ki], (ni + ki) % 2 == 0, (ni + ki) % 3 == 0 ? 2 : 1, false);
      checks++;
      if (err > 1e-5) {
        failures++;
        printf("\nFAIL %s N=%lld M=%lld K=%lld: relative error %.3g", var->name, (long long)Ns[ni], (long long)M,
               (long long)Ks[ki], err);
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
}

/* int4: the same product with a Q4 weight (random codes and f16 scales) vs the f64 sum of the
 * dequantized values; K a multiple of 32 */
static double check_q4(const variant *var, int64_t N, int64_t M, int64_t K, bool with_bias, int threads) {
  int64_t lda = K + 3, ldw = K / 2 + 5, lds = K / 32 + 2, ldo = M + 2;
  float *a = malloc(sizeof(float) * (size_t)(N * lda + 1)), *o = malloc(sizeof(float) * (size_t)(N * ldo + 1));
  uint8_t *w = malloc((size_t)(M * ldw + 1));
  uint16_t *sc = malloc(2 * (size_t)(M * lds + 1));
  float *bias = malloc(sizeof(float) * (size_t)M), *deq = malloc(sizeof(float) * (size_t)(K + 1));
  for (int64_t i = 0; i < N * lda; i++) a[i] = frand();
  for (int64_t i = 0; i < M * ldw; i++) w[i] = (uint8_t)(rng = rng * 6364136223846793005ull + 1, rng >> 56);
  for (int64_t i = 0; i < M * lds; i++) sc[i] = kg_f32_to_f16(0.01f * frand());
  for (int64_t m = 0; m < M; m++) bias[m] = frand();
  kg_cpu_gemm_q4(o, ldo, a, lda, w, ldw, sc, lds, with_bias ? bias : NULL, N, M, K, var->v, threads);
  double worst = 0;
  for (int64_t m = 0; m < M; m++) {
    kg_cpu_dequantize_q4_row(deq, w + m * ldw, sc + m * lds, K);
    for (int64_t n = 0; n < N; n++) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) {
        double t = (double)a[n * lda + k] * (double)deq[k];
        s += t, mag += fabs(t);
      }
      if (with_bias) s += bias[m], mag += fabs(bias[m]);
      double err = fabs((double)o[n * ldo + m] - s) / (mag + 1e-30);
      if (err > worst) worst = err;
    }
  }
  free(a), free(o), free(w), free(sc), free(bias), free(deq);
  return worst;
}

static void check_q4_variant(const variant *var) {
  static const int64_t Ns[] = {1, 2, 3, 4, 5, 9, 32, 33, 70};
  static const int64_t Ks[] = {32, 64, 96, 256};
  for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
      int64_t M = 3 + (int64_t)((ni + ki) % 5) * 7;
      double err = check_q4(var, Ns[ni], M, Ks[ki], (ni + ki) % 2 == 0, (ni + ki) % 3 == 0 ? 2 : 1);
      checks++;
      if (err > 1e-5) {
        failures++;
        printf("\nFAIL q4 %s N=%lld M=%lld K=%lld: relative error %.3g", var->name, (long long)Ns[ni], (long long)M,
               (long long)Ks[ki], err);
      }
    }
}

static void check_quantize_q4(void) {
  /* a block whose largest magnitude is -8 (scale 1): codes are value + 8, ties to even, +8 clamps to 15 */
  double w[32] = {-8, 7, 2.5, 3.5, -2.5, 0.49, 8, 1.5};
  uint8_t q[16];
  uint16_t s;
  kg_cpu_quantize_q4_row(q, &s, w, 32);
  float d[32];
  kg_cpu_dequantize_q4_row(d, q, &s, 32);
  float want[8] = {-8, 7, 2, 4, -2, 0, 7, 2};
  checks++;
  if (kg_f16_to_f32(s) != 1.0f) failures++, printf("\nFAIL quantize_q4_row: scale %g", kg_f16_to_f32(s));
  for (int j = 0; j < 8; j++)
    if (d[j] != want[j]) {
      failures++, printf("\nFAIL quantize_q4_row: element %d -> %g, want %g", j, d[j], want[j]);
      break;
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
    check_variant(&vars[i]);
    check_q4_variant(&vars[i]); /* int4: scalar, AVX2, AVX-512, blocked */
  }
  check_quantize();
  check_quantize_q4();
  /* the check can fail: a reference with a scale off by 0.1% must be caught */
  checks++;
  if (check_one(&vars[0], 3, 17, 100, true, 1, true) <= 1e-5) failures++, printf("\nFAIL: a planted bug went unseen");
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
  float *a, *o, *scale;
  int8_t *w8;
  uint16_t *w16, *s4;
  uint8_t *w4;
  kg_q8_variant v;
} bench;

static void run_q8(void *p) {
  bench *b = p;
  kg_cpu_gemm_q8(b->o, b->M, b->a, b->K, b->w8, b->K, b->scale, NULL, 1, b->M, b->K, b->v, 0);
}
static void run_q4(void *p) {
  bench *b = p;
  kg_cpu_gemm_q4(b->o, b->M, b->a, b->K, b->w4, b->K / 2, b->s4, b->K / 32, NULL, 1, b->M, b->K, b->v, 0);
}
static void run_bf16(void *p) { /* x holds bf16 values, as in a bf16 model: AUTO may take AVX512_BF16 */
  bench *b = p;
  kg_gemm_bf16_opts o = {.variant = KG_GEMM_BF16_AUTO, .a_bf16 = true};
  kg_cpu_gemm_bf16(b->o, KG_F32, b->M, b->a, b->K, b->w16, b->K, true, 1, b->M, b->K, &o);
}

static void run_timing(variant *vars, int nv) {
  bench b = {.M = 16384, .K = 4096};
  b.a = malloc(4 * (size_t)b.K), b.o = malloc(4 * (size_t)b.M), b.scale = malloc(4 * (size_t)b.M);
  b.w8 = malloc((size_t)(b.M * b.K)), b.w16 = malloc(2 * (size_t)(b.M * b.K));
  b.w4 = malloc((size_t)(b.M * b.K / 2)), b.s4 = malloc(2 * (size_t)(b.M * b.K / 32));
  for (int64_t i = 0; i < b.M * b.K / 2; i++) b.w4[i] = (uint8_t)(i * 2654435761u >> 24);
  for (int64_t i = 0; i < b.M * b.K / 32; i++) b.s4[i] = kg_f32_to_f16(0.01f);
  for (int64_t i = 0; i < b.K; i++) b.a[i] = kg_bf16_to_f32(kg_f32_to_bf16(frand()));
  for (int64_t i = 0; i < b.M; i++) b.scale[i] = 0.01f;
  for (int64_t i = 0; i < b.M * b.K; i++) {
    float f = frand();
    b.w8[i] = (int8_t)(f * 127), b.w16[i] = kg_f32_to_bf16(f);
  }
  printf("decode GEMV x [1, %lld] . W [%lld, %lld]^T, %d threads, best of 5 (wall)\n", (long long)b.K,
         (long long)b.M, (long long)b.K, kg_num_threads());
  double t = best_of(5, run_bf16, &b);
  printf("  %-8s %8.2f ms  %6.2f GB/s of weight\n", "bf16", t * 1e3, 2.0 * b.M * b.K / t / 1e9);
  for (int i = 0; i < nv; i++) {
    if (!vars[i].ok || vars[i].v == KG_Q8_BLOCKED) continue;
    b.v = vars[i].v;
    t = best_of(5, run_q8, &b);
    printf("  int8 %-8s %4.2f ms  %6.2f GB/s of weight\n", vars[i].name, t * 1e3, 1.0 * b.M * b.K / t / 1e9);
    t = best_of(5, run_q4, &b);
    printf("  int4 %-8s %4.2f ms  %6.2f GB/s of weight (+ scales)\n", vars[i].name, t * 1e3,
           (0.5 + 2.0 / 32) * b.M * b.K / t / 1e9);
  }
  free(b.a), free(b.o), free(b.scale), free(b.w8), free(b.w16), free(b.w4), free(b.s4);
}

int main(int argc, char **argv) {
  variant vars[] = {{"scalar", KG_Q8_SCALAR, true},
                    {"avx2", KG_Q8_AVX2, kg_cpu_q8_avx2()},
                    {"avx512", KG_Q8_AVX512, kg_cpu_q8_avx512()},
                    {"blocked", KG_Q8_BLOCKED, true}};
  int nv = (int)(sizeof vars / sizeof *vars);
  if (argc > 1 && !strcmp(argv[1], "--check")) return run_check(vars, nv);
  if (argc > 1) {
    fprintf(stderr, "usage: %s [--check]\n", argv[0]);
    return 2;
  }
  run_timing(vars, nv);
  return 0;
}
