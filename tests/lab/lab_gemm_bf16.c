/* lab_gemm_bf16.c — kernel lab for engine/cpu/gemm_bf16.c: out[N, M] = a[N, K] @ B[K, M] with
 * B a bf16 weight read as it lies (b_trans: W [M, K], x @ W^T; else W [K, M], x @ W).
 *
 *   lab_gemm_bf16 --check   every variant (scalar, AVX2, AVX-512, AVX512_BF16 dot tile and packed, the AMX
 *                           decode and packed kernels) x both layouts vs a naive f64 reference
 *                           at every N in 1..40, K in 1..300 (edges around multiples of 8/16 and
 *                           every K for a few N), column counts around the tile edges, padded
 *                           leading dims, f32/bf16 output, forced K blocks and 2 threads; the packed
 *                           variant also at 33..300 rows and past one packed block of a (1031..2085
 *                           rows), with a as f32, as bf16 rows and as bf16 transposed (dW = gᵀ x); the
 *                           same for the AMX packed kernel where the CPU has AMX-BF16
 *   lab_gemm_bf16           times the variants at decode sizes against convert + OpenBLAS sgemm,
 *                           then the DRAM roofline: a 1 GiB bf16 weight streamed by a GEMV vs a
 *                           plain read of the same buffer
 *   lab_gemm_bf16 --small   the decode sizes only (no 1 GiB buffer); --roofline: the roofline only
 *   lab_gemm_bf16 --train   training row counts (64 .. 1024 rows of bf16 values): the dot-product
 *                           dpbf16 tile vs the packed dpbf16 kernel vs convert + sgemm (AVX512_BF16),
 *                           and the packed kernel on AMX tiles (AMX-BF16)
 *
 * Shape letters: N rows of a (tokens), K reduction, M output columns (weight rows for b_trans).
 */
#include "lab.h"
#include "cpu/gemm_bf16.h"

#include <cblas.h>
#include <immintrin.h>
#include <keng/scalar.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / (1 << 23)) - 1.0);
}

/* ---- check ---------------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  kg_gemm_bf16_variant v;
} variant;

static int failures, checks;

/* how a reaches the kernel: f32 (bf16 values for the dpbf16 variants), or (packed only) as bf16
 * row-major (opts.a16) or bf16 transposed (opts.a16_trans, as gᵀ in dW = gᵀ x) */
enum { A_F32, A_BF16, A_BF16_T };

/* one product with padded leading dims, compared with the f64 sum of the same (exact) inputs; the
 * packed variant takes a in each of its three forms (one reference), the others f32 */
static void check_one(const variant *var, bool trans, int64_t N, int64_t M, int64_t K, kg_dtype odt, int threads,
                      int64_t kc) {
  int64_t lda = K + 3, ldw = (trans ? K : M) + 5, ldo = M + 2, ldt = N + 3; /* a transposed: [K, ldt] */
  int64_t wrows = trans ? M : K;
  int nform = var->v == KG_GEMM_BF16_PACKED || var->v == KG_GEMM_BF16_AMX_PACKED ? 3 : 1;
  float *a = malloc(sizeof(float) * (size_t)(N * lda));
  uint16_t *w = malloc(2 * (size_t)(wrows * ldw));
  float *o32 = malloc(sizeof(float) * (size_t)(3 * N * ldo));
  uint16_t *o16 = malloc(2 * (size_t)(3 * N * ldo));
  uint16_t *ab = malloc(2 * (size_t)(N * lda)), *at = malloc(2 * (size_t)(K * ldt));
  bool a16 = var->v == KG_GEMM_BF16_DPBF16 || var->v == KG_GEMM_BF16_PACKED || var->v == KG_GEMM_BF16_AMX ||
             var->v == KG_GEMM_BF16_AMX_PACKED; /* they need bf16 values in a */
  for (int64_t i = 0; i < N * lda; i++) a[i] = a16 ? kg_bf16_to_f32(kg_f32_to_bf16(frand())) : frand();
  for (int64_t i = 0; i < wrows * ldw; i++) w[i] = kg_f32_to_bf16(frand());
  for (int64_t i = 0; i < 3 * N * ldo; i++) o32[i] = NAN, o16[i] = 0x7fc0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) ab[n * lda + k] = at[k * ldt + n] = kg_f32_to_bf16(a[n * lda + k]);
  for (int f = 0; f < nform; f++) {
    kg_gemm_bf16_opts o = {var->v, threads, kc, a16};
    if (f == A_BF16) o.a16 = ab, o.lda16 = lda;
    if (f == A_BF16_T) o.a16 = at, o.lda16 = ldt, o.a16_trans = true;
    void *out = odt == KG_F32 ? (void *)(o32 + f * N * ldo) : (void *)(o16 + f * N * ldo);
    kg_cpu_gemm_bf16(out, odt, ldo, f == A_F32 ? a : NULL, lda, w, ldw, trans, N, M, K, &o);
  }
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < ldo; m++) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; m < M && k < K; k++) {
        double p = (double)a[n * lda + k] * kg_bf16_to_f32(trans ? w[m * ldw + k] : w[k * ldw + m]);
        ref += p, mag += fabs(p);
      }
      /* f32 accumulation: each of the <= K roundings costs <= 2^-24 of the running magnitude */
      double tol = (K + 4) * ldexp(mag, -24) + 1e-30;
      if (odt != KG_F32) tol += ldexp(fabs(ref), -8); /* final rounding to bf16 */
      for (int f = 0; f < nform; f++) {
        int64_t i = f * N * ldo + n * ldo + m;
        double got = odt == KG_F32 ? o32[i] : odt == KG_BF16 ? kg_bf16_to_f32(o16[i]) : kg_f16_to_f32(o16[i]);
        if (m >= M) { /* padding must stay untouched */
          if (!isnan(got)) failures++;
          continue;
        }
        checks++;
        if (!(fabs(got - ref) <= tol)) {
          if (failures < 10)
            fprintf(stderr, "FAIL %s %s a=%s N=%lld M=%lld K=%lld odt=%s t=%d kc=%lld [%lld,%lld]: %.9g vs %.9g\n",
                    var->name, trans ? "nt" : "nn", f == A_F32 ? "f32" : f == A_BF16 ? "bf16" : "bf16T", (long long)N,
                    (long long)M, (long long)K, kg_dtype_info[odt].name, threads, (long long)kc, (long long)n,
                    (long long)m, got, ref);
          failures++;
        }
      }
    }
  free(a), free(w), free(o32), free(o16), free(ab), free(at);
}

/* the packed kernel gives the same bits on 1 and 2 threads (columns or rows split among them) and
 * for every form of a: each sum runs over the same K blocks in the same order */
static void check_deterministic(kg_gemm_bf16_variant var) {
  static const int64_t shapes[][3] = {{300, 515, 513}, {1100, 40, 300}, {70, 4100, 257}}; /* N, M, K */
  for (int s = 0; s < 3; s++)
    for (int tr = 0; tr < 2; tr++) {
      int64_t N = shapes[s][0], M = shapes[s][1], K = shapes[s][2], wrows = tr ? M : K;
      float *a = malloc(4 * (size_t)(N * K)), *o[3];
      uint16_t *w = malloc(2 * (size_t)(wrows * (tr ? K : M))), *at = malloc(2 * (size_t)(N * K));
      for (int64_t i = 0; i < N * K; i++) a[i] = kg_bf16_to_f32(kg_f32_to_bf16(frand()));
      for (int64_t i = 0; i < wrows * (tr ? K : M); i++) w[i] = kg_f32_to_bf16(frand());
      for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) at[k * N + n] = kg_f32_to_bf16(a[n * K + k]);
      for (int v = 0; v < 3; v++) {
        o[v] = malloc(4 * (size_t)(N * M));
        kg_gemm_bf16_opts op = {var, v == 1 ? 2 : 1, 0, true};
        if (v == 2) op.a16 = at, op.lda16 = N, op.a16_trans = true;
        kg_cpu_gemm_bf16(o[v], KG_F32, M, v == 2 ? NULL : a, K, w, tr ? K : M, tr, N, M, K, &op);
      }
      checks++;
      if (memcmp(o[0], o[1], 4 * (size_t)(N * M)) || memcmp(o[0], o[2], 4 * (size_t)(N * M))) {
        fprintf(stderr, "FAIL %s %s N=%lld M=%lld K=%lld: 1 thread, 2 threads and transposed a differ\n",
                var == KG_GEMM_BF16_PACKED ? "packed" : "amx_packed", tr ? "nt" : "nn", (long long)N, (long long)M,
                (long long)K);
        failures++;
      }
      for (int v = 0; v < 3; v++) free(o[v]);
      free(a), free(w), free(at);
    }
}

static int run_check(void) {
  variant vars[7] = {{"scalar", KG_GEMM_BF16_SCALAR},
                     {"avx2", KG_GEMM_BF16_AVX2},
                     {"avx512", KG_GEMM_BF16_AVX512},
                     {"dpbf16", KG_GEMM_BF16_DPBF16},
                     {"packed", KG_GEMM_BF16_PACKED},
                     {"amx", KG_GEMM_BF16_AMX},
                     {"amx_packed", KG_GEMM_BF16_AMX_PACKED}};
  int nvar = kg_cpu_gemm_bf16_amx() ? 7 : kg_cpu_gemm_bf16_dpbf16() ? 5 : kg_cpu_gemm_bf16_avx512() ? 3 : kg_cpu_gemm_bf16_avx2() ? 2 : 1;
  printf("checking");
  for (int v = 0; v < nvar; v++) printf(" %s", vars[v].name);
  printf(nvar < 7 ? " (the others do not run on this CPU)\n" : "\n");
  static const int64_t Ks[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 100, 255, 256, 257, 300};
  static const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 24, 31, 33, 40, 515};
  int nK = sizeof Ks / sizeof *Ks, nM = sizeof Ms / sizeof *Ms;
  double t0 = lab_wall_seconds();
  for (int vi = 0; vi < nvar; vi++)
    for (int tr = 0; tr < 2; tr++) {
      /* every N against the K and M edges */
      for (int64_t N = 1; N <= 40; N++)
        for (int ki = 0; ki < nK; ki++)
          for (int mi = (int)(N % 2); mi < nM - 1; mi += 2 + (int)(N % 3))
            check_one(&vars[vi], tr, N, Ms[mi], Ks[ki], KG_F32, 1, 0);
      /* every K in 1..300 for a few N */
      for (int64_t K = 1; K <= 300; K++) {
        check_one(&vars[vi], tr, 1, 13, K, KG_F32, 1, 0);
        check_one(&vars[vi], tr, 7, 21, K, KG_F32, 1, 0);
      }
      /* bf16/f16 output, forced K blocks (exact multiples and not), 2 threads, chunked columns */
      for (int64_t N = 1; N <= 40; N += 3)
        for (int ki = 0; ki < nK; ki += 2) {
          check_one(&vars[vi], tr, N, 37, Ks[ki], KG_BF16, 1, 0);
          check_one(&vars[vi], tr, N, 19, Ks[ki], KG_F16, 1, 0);
          check_one(&vars[vi], tr, N, 29, Ks[ki], KG_F32, 1, 16);
          check_one(&vars[vi], tr, N, 29, Ks[ki], KG_F32, 1, 24);
        }
      for (int64_t N = 1; N <= 40; N += 13)
        for (int ki = 0; ki < nK; ki += 4) check_one(&vars[vi], tr, N, 515, Ks[ki], N % 2 ? KG_BF16 : KG_F32, 2, 0);
    }
  /* the many-rows kernel (AUTO takes it past 32 rows of bf16 a) at training row counts: row tile
   * remainders, K edges (odd K: half pairs), panel edges, K blocks, bf16 output, 2 threads */
  if (kg_cpu_gemm_bf16_dpbf16()) {
    static const int64_t Ns[] = {33, 40, 47, 63, 64, 65, 100, 127, 128, 129, 255, 256, 300};
    static const int64_t Ms2[] = {1, 17, 47, 48, 49, 96, 130, 515};
    static const int64_t Ks2[] = {1, 2, 3, 31, 32, 33, 255, 256, 257, 300, 513};
    variant pks[2] = {{"packed", KG_GEMM_BF16_PACKED}, {"amx_packed", KG_GEMM_BF16_AMX_PACKED}};
    for (int pv = 0; pv < (kg_cpu_gemm_bf16_amx() ? 2 : 1); pv++) {
      const variant *pk = &pks[pv];
      for (int tr = 0; tr < 2; tr++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
          for (size_t ki = 0; ki < sizeof Ks2 / sizeof *Ks2; ki++)
            for (size_t mi = 0; mi < sizeof Ms2 / sizeof *Ms2; mi++) {
              int64_t N = Ns[ni], K = Ks2[ki], M = Ms2[mi];
              int v = (int)((ni + ki + mi) % 5);
              check_one(pk, tr, N, M, K, v == 1 ? KG_BF16 : KG_F32, v == 2 ? 2 : 1, v == 3 ? 18 : v == 4 ? 64 : 0);
            }
      /* more rows than one packed block of a (1024 at K block 256), odd K over several K blocks */
      for (int tr = 0; tr < 2; tr++) {
        check_one(pk, tr, 1031, 49, 513, KG_F32, 1, 0);
        check_one(pk, tr, 1100, 33, 257, KG_BF16, 1, 0);
        check_one(pk, tr, 2085, 17, 300, KG_F32, 2, 0);
        check_one(pk, tr, 2085, 40, 700, KG_BF16, 2, 96);
      }
      /* wide chunks over several K blocks (their panels for all of K past 1 MiB: the K blocks are
       * the outer loop); the narrower ones above put the row blocks outside */
      for (int tr = 0; tr < 2; tr++) {
        check_one(pk, tr, 41, 1100, 600, KG_F32, 1, 0);
        check_one(pk, tr, 70, 1100, 513, KG_BF16, 2, 0);
      }
    }
  }
  if (kg_cpu_gemm_bf16_dpbf16()) check_deterministic(KG_GEMM_BF16_PACKED);
  if (kg_cpu_gemm_bf16_amx()) check_deterministic(KG_GEMM_BF16_AMX_PACKED);
  printf("%d checks, %d failures (%.1f s)\n", checks, failures, lab_wall_seconds() - t0);
  return failures ? 1 : 0;
}

/* ---- timing --------------------------------------------------------------------------------- */

/* median wall ms of reps calls */
#define REPS 9

typedef struct {
  bool trans, baseline;
  kg_gemm_bf16_variant v;
  int threads;
} timed;

/* the pre-issue path in spirit: the weight converted to f32 (in full) each call, then sgemm */
static void convert_sgemm(float *c, const float *a, const uint16_t *w, float *wf, bool trans, int64_t N, int64_t M,
                          int64_t K) {
  kg_cpu_load_f32(wf, w, KG_BF16, 1, M * K);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans ? CblasTrans : CblasNoTrans, (int)N, (int)M, (int)K, 1.0f, a, (int)K,
              wf, trans ? (int)K : (int)M, 0.0f, c, (int)M);
}

static double time_ms(const timed *t, float *c, const float *a, const uint16_t *w, float *wf, int64_t N, int64_t M,
                      int64_t K, int reps) {
  double ms[REPS];
  kg_gemm_bf16_opts o = {t->v, t->threads, 0, true}; /* timing only: a_bf16 lets DPBF16 run */
  openblas_set_num_threads(t->threads);
  for (int r = -1; r < reps; r++) {
    double t0 = lab_wall_seconds();
    if (t->baseline) convert_sgemm(c, a, w, wf, t->trans, N, M, K);
    else kg_cpu_gemm_bf16(c, KG_F32, M, a, K, w, t->trans ? K : M, t->trans, N, M, K, &o);
    if (r >= 0) ms[r] = (lab_wall_seconds() - t0) * 1e3;
  }
  qsort(ms, (size_t)reps, sizeof *ms, lab_cmp_double);
  return ms[reps / 2];
}

static void run_decode_sizes(void) {
  static const int64_t shapes[][2] = {{256, 32000}, {256, 768}, {768, 256}, {256, 256}, {4096, 4096}}; /* K, M */
  static const int64_t Ns[] = {1, 4, 8, 16, 32, 64, 128};
  printf("\nms per call (median of %d) and GFLOP/s, weight bf16, a f32, out f32\n", REPS);
  printf("| K x M | N | threads | scalar nt | avx2 nt | avx512 nt | dpbf16 nt | avx2 nn | convert+sgemm nt |\n"
         "|---|---|---|---|---|---|---|---|---|\n");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    int64_t K = shapes[s][0], M = shapes[s][1];
    uint16_t *w = malloc(2 * (size_t)(K * M));
    float *wf = malloc(4 * (size_t)(K * M));
    for (int64_t i = 0; i < K * M; i++) w[i] = kg_f32_to_bf16(frand());
    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
      int64_t N = Ns[ni];
      float *a = malloc(4 * (size_t)(N * K)), *c = malloc(4 * (size_t)(N * M));
      for (int64_t i = 0; i < N * K; i++) a[i] = frand();
      for (int th = 1; th <= 2; th++) {
        timed vs[6] = {{true, false, KG_GEMM_BF16_SCALAR, th},
                       {true, false, KG_GEMM_BF16_AVX2, th},
                       {true, false, KG_GEMM_BF16_AVX512, th},
                       {true, false, KG_GEMM_BF16_DPBF16, th},
                       {false, false, KG_GEMM_BF16_AVX2, th},
                       {true, true, KG_GEMM_BF16_AUTO, th}};
        printf("| %lldx%lld | %lld | %d |", (long long)K, (long long)M, (long long)N, th);
        for (int v = 0; v < 6; v++) {
          if (v == 0 && (N > 1 || K * M > 1 << 24)) { /* the scalar variant only at N = 1 */
            printf(" |");
            continue;
          }
          bool runs = v == 2 ? kg_cpu_gemm_bf16_avx512() : v == 3 ? kg_cpu_gemm_bf16_dpbf16() : kg_cpu_gemm_bf16_avx2();
          if (v > 0 && v < 5 && !runs) {
            printf(" n/a |");
            continue;
          }
          double ms = time_ms(&vs[v], c, a, w, wf, N, M, K, REPS);
          printf(" %.3f (%.0f) |", ms, 2.0 * N * M * K / ms * 1e-6);
        }
        printf("\n");
        fflush(stdout);
      }
      free(a), free(c);
    }
    free(w), free(wf);
  }
}

/* the sum of one 4 KiB block's 64-bit words, 4 chains */
__attribute__((target("avx2"))) static uint64_t read_block(const uint8_t *p) {
  const __m256i *q = (const __m256i *)p;
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (int i = 0; i < 4096 / 32; i += 4) {
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(q + i));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(q + i + 1));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(q + i + 2));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(q + i + 3));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  uint64_t l[4];
  _mm256_storeu_si256((__m256i *)l, s);
  return l[0] + l[1] + l[2] + l[3];
}

/* plain read of n bytes, threads share the buffer (the block sum is its own function: clang
 * does not give an OpenMP region's outlined body its function's target attribute) */
static uint64_t read_all(const uint8_t *p, size_t n, int threads) {
  uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
  for (size_t blk = 0; blk < n / 4096; blk++)
    total += read_block(p + blk * 4096);
  return total;
}

static void run_roofline(void) {
  const int64_t M = 16384, K = 32768; /* W [M, K] bf16 = 1 GiB */
  size_t bytes = (size_t)(M * K) * 2;
  uint16_t *w = aligned_alloc(4096, bytes);
  float *a = malloc(4 * (size_t)K), *c = malloc(4 * (size_t)K); /* K >= M: room for both layouts */
  if (!w || !a || !c) {
    printf("roofline: cannot allocate 1 GiB, skipped\n");
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M * K; i++) w[i] = (uint16_t)(0x3f80 + (i & 0x3f)); /* touch every page */
  for (int64_t i = 0; i < K; i++) a[i] = frand();
  printf("\nDRAM roofline: W [%lld, %lld] bf16 = %.2f GiB streamed once per call (median of 5, GB/s = 1e9 B/s)\n",
         (long long)M, (long long)K, bytes / 1073741824.0);
  printf("| threads | plain read GB/s | x @ W^T avx2 GB/s (share) | x @ W^T avx512 | x @ W^T dpbf16 | x @ W avx2 |\n"
         "|---|---|---|---|---|---|\n");
  volatile uint64_t sink = 0;
  for (int th = 1; th <= 2; th++) {
    double r[5], g[4][5];
    kg_gemm_bf16_opts o2 = {KG_GEMM_BF16_AVX2, th, 0}, o5 = {KG_GEMM_BF16_AVX512, th, 0};
    kg_gemm_bf16_opts od = {KG_GEMM_BF16_DPBF16, th, 0, true};
    bool z = kg_cpu_gemm_bf16_avx512(), d = kg_cpu_gemm_bf16_dpbf16();
    for (int i = 0; i < 5; i++) {
      double t0 = lab_wall_seconds();
      sink += read_all((const uint8_t *)w, bytes, th);
      r[i] = bytes / (lab_wall_seconds() - t0) * 1e-9;
      t0 = lab_wall_seconds();
      kg_cpu_gemm_bf16(c, KG_F32, M, a, K, w, K, true, 1, M, K, &o2);
      g[0][i] = bytes / (lab_wall_seconds() - t0) * 1e-9;
      t0 = lab_wall_seconds();
      if (z) kg_cpu_gemm_bf16(c, KG_F32, M, a, K, w, K, true, 1, M, K, &o5);
      g[1][i] = z ? bytes / (lab_wall_seconds() - t0) * 1e-9 : 0;
      t0 = lab_wall_seconds();
      if (d) kg_cpu_gemm_bf16(c, KG_F32, M, a, K, w, K, true, 1, M, K, &od);
      g[2][i] = d ? bytes / (lab_wall_seconds() - t0) * 1e-9 : 0;
      t0 = lab_wall_seconds(); /* the same buffer read as W [K', M'] = [16384, 32768] with x [1, 16384] */
      kg_cpu_gemm_bf16(c, KG_F32, K, a, M, w, K, false, 1, K, M, &o2);
      g[3][i] = bytes / (lab_wall_seconds() - t0) * 1e-9;
    }
    qsort(r, 5, sizeof *r, lab_cmp_double);
    printf("| %d | %.1f |", th, r[2]);
    for (int v = 0; v < 4; v++) {
      qsort(g[v], 5, sizeof *g[v], lab_cmp_double);
      printf(" %.1f (%.0f%%) |", g[v][2], 100 * g[v][2] / r[2]);
    }
    printf("\n");
  }
  (void)sink;
  free(w), free(a), free(c);
}

/* decode GEMV shapes (N = 1 and 32): GB/s of the weight read by each b_trans variant against a
 * plain read of the same buffer (best of reps, wall clock, 1 thread then 2): the LM head of the
 * tiny presets (16 MiB, L3) and the projections of the ~1B Mistral shape (streamed from DRAM
 * when the whole set is cycled: each call reads a different copy) */
static void run_gemv(void) {
  /* K, M, DRAM (copies past 1 GiB in all, cycled: each call reads weights no cache holds) */
  /* the tiny presets' head and projection; the ~1B Mistral's q/o, k/v, gate+up (one GEMM), down, head */
  static const int64_t shapes[][3] = {{256, 32000, 0}, {256, 768, 0},   {2048, 2048, 1}, {2048, 256, 1},
                                      {2048, 11264, 1}, {5632, 2048, 1}, {2048, 32000, 1}};
  volatile uint64_t sink = 0;
  printf("\nGEMV GB/s (best of 5 cycles, wall): weight bf16, a bf16 values, out f32; read = plain read of the same weights\n");
  printf("| K x M (copies) | N | threads | read | avx512 | dpbf16 | auto | amx |\n|---|---|---|---|---|---|---|---|\n");
  size_t nshape = sizeof shapes / sizeof *shapes, s0 = 0;
  if (getenv("LAB_GEMV_SHAPES")) nshape = (size_t)atoi(getenv("LAB_GEMV_SHAPES")); /* the first n only */
  if (getenv("LAB_GEMV_FROM")) s0 = (size_t)atoi(getenv("LAB_GEMV_FROM"));          /* from shape s0 (0-based) */
  for (size_t s = s0; s < nshape; s++) {
    int64_t K = shapes[s][0], M = shapes[s][1];
    size_t one = (size_t)(K * M) * 2;
    int64_t ncp = shapes[s][2] ? (int64_t)(((size_t)1 << 30) / one + 1) : 1;
    uint16_t *w = aligned_alloc(4096, one * (size_t)ncp);
    if (!w) continue;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < K * M * ncp; i++) w[i] = (uint16_t)(0x3f80 + (i % 61));
    int64_t nmax = getenv("LAB_GEMV_N") ? atoi(getenv("LAB_GEMV_N")) : 32; /* 1: batch 1 only */
    for (int64_t N = 1; N <= nmax; N += 31) {
      float *a = malloc(4 * (size_t)(N * K)), *c = malloc(4 * (size_t)(N * M));
      for (int64_t i = 0; i < N * K; i++) a[i] = kg_bf16_to_f32(kg_f32_to_bf16(frand()));
      for (int th = 1; th <= 2; th++) {
        double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
        kg_gemm_bf16_opts os[5] = {{KG_GEMM_BF16_AUTO, th}, {KG_GEMM_BF16_AVX512, th, 0, true},
                                   {KG_GEMM_BF16_DPBF16, th, 0, true}, {KG_GEMM_BF16_AUTO, th, 0, true},
                                   {KG_GEMM_BF16_AMX, th, 0, true}};
        int nv = kg_cpu_gemm_bf16_amx() ? 5 : 4;
        int reps = ncp > 1 ? 5 : 50;
        for (int r = 0; r < reps; r++)
          for (int v = 0; v < nv; v++) {
            double t0 = lab_wall_seconds();
            for (int64_t cp = 0; cp < ncp; cp++) {
              const uint16_t *wr = w + (size_t)cp * (size_t)(K * M);
              if (v == 0) sink += read_all((const uint8_t *)wr, one, th);
              else kg_cpu_gemm_bf16(c, KG_F32, M, a, K, wr, K, true, N, M, K, &os[v]);
            }
            double t = (lab_wall_seconds() - t0) / (double)ncp;
            if (t < best[v]) best[v] = t;
          }
        printf("| %lldx%lld (%lld) | %lld | %d |", (long long)K, (long long)M, (long long)ncp, (long long)N, th);
        for (int v = 0; v < nv; v++) printf(" %.1f |", one / best[v] * 1e-9);
        printf("\n");
        fflush(stdout);
      }
      free(a), free(c);
    }
    free(w);
  }
  (void)sink;
}

/* training rows (N = 64 .. 1024, a's values bf16): the dot-product tile, the packed kernel and
 * convert + sgemm, 1 and 2 threads */
static void run_train_sizes(void) {
  static const int64_t shapes[][2] = {{256, 32000}, {256, 768}, {768, 256}, {256, 256}, {32000, 256}}; /* K, M */
  static const int64_t Ns[] = {64, 128, 256, 1024};
  printf("\nms per call (median of %d) and GFLOP/s, weight bf16, a bf16 values, out f32\n", REPS);
  printf("| K x M | N | threads | dpbf16 nt | packed nt | convert+sgemm nt | packed nn | convert+sgemm nn | amx_packed nt "
         "| amx_packed nn |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    int64_t K = shapes[s][0], M = shapes[s][1];
    uint16_t *w = malloc(2 * (size_t)(K * M));
    float *wf = malloc(4 * (size_t)(K * M));
    for (int64_t i = 0; i < K * M; i++) w[i] = kg_f32_to_bf16(frand());
    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
      int64_t N = Ns[ni];
      float *a = malloc(4 * (size_t)(N * K)), *c = malloc(4 * (size_t)(N * M));
      for (int64_t i = 0; i < N * K; i++) a[i] = kg_bf16_to_f32(kg_f32_to_bf16(frand()));
      for (int th = 1; th <= 2; th++) {
        timed vs[7] = {{true, false, KG_GEMM_BF16_DPBF16, th},       {true, false, KG_GEMM_BF16_PACKED, th},
                       {true, true, KG_GEMM_BF16_AUTO, th},          {false, false, KG_GEMM_BF16_PACKED, th},
                       {false, true, KG_GEMM_BF16_AUTO, th},         {true, false, KG_GEMM_BF16_AMX_PACKED, th},
                       {false, false, KG_GEMM_BF16_AMX_PACKED, th}};
        printf("| %lldx%lld | %lld | %d |", (long long)K, (long long)M, (long long)N, th);
        for (int v = 0; v < (kg_cpu_gemm_bf16_amx() ? 7 : 5); v++) {
          int reps = K * M * N > (1ll << 31) ? 5 : REPS;
          double ms = time_ms(&vs[v], c, a, w, wf, N, M, K, reps);
          printf(" %.3f (%.0f) |", ms, 2.0 * N * M * K / ms * 1e-6);
        }
        printf("\n");
        fflush(stdout);
      }
      free(a), free(c);
    }
    free(w), free(wf);
  }
}

int main(int argc, char **argv) {
  bool check = false, small = false, roof_only = false, train = false, gemv = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) check = true;
    else if (!strcmp(argv[i], "--small")) small = true;
    else if (!strcmp(argv[i], "--roofline")) roof_only = true;
    else if (!strcmp(argv[i], "--train")) train = true;
    else if (!strcmp(argv[i], "--gemv")) gemv = true;
    else {
      fprintf(stderr, "usage: %s [--check | --small | --roofline | --train | --gemv]\n", argv[0]);
      return 2;
    }
  }
  if (check) return run_check();
  if (gemv) {
    run_gemv();
    return 0;
  }
  if (train) {
    if (kg_cpu_gemm_bf16_dpbf16()) run_train_sizes();
    else printf("no AVX512_BF16: the training-rows kernel does not run here\n");
    return 0;
  }
  printf("AVX2+FMA: %s\n", kg_cpu_gemm_bf16_avx2() ? "yes" : "no");
  if (!roof_only) run_decode_sizes();
  if (!small) run_roofline();
  return 0;
}
