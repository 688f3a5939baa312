/* test_pool.c — keng's parallel-for (engine/core/pool.c) and the GEMM cut into pieces for it
 * (engine/cpu/gemm_par.c): every chunk runs exactly once for any thread count, also when the
 * count changes between loops; a loop started inside a chunk or an OpenMP region runs inline in
 * order; an error stops the handout without a deadlock; a caller that is slow (or a worker that
 * is) does not lose chunks; concurrent callers on plain threads are all served; products cut
 * into pieces give the same bits on 2, 3 and 4 threads, and the K pieces' bits on 1 too. */
#include "core/internal.h"
#include "core/pool.h"
#include "cpu/gemm_par.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;
#define CHECK(cond)                                                                                                    \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                         \
      failures++;                                                                                                      \
    }                                                                                                                  \
  } while (0)

#define MAXN 5000
typedef struct {
  _Atomic int hits[MAXN];
  _Atomic int nested_inline; /* nested loops that ran in order on the chunk's thread */
  int fail_at;               /* chunk that returns an error (-1: none) */
  int slow;                  /* sleep in some chunks */
} counts;

static void nap_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

static int count_chunk(void *ctx, int64_t i) {
  counts *c = ctx;
  atomic_fetch_add(&c->hits[i], 1);
  if (c->slow && i % 7 == 0) nap_us(200);
  return (int)i == c->fail_at ? 42 : 0;
}

static void every_chunk_once(void) {
  static counts c;
  int64_t sizes[] = {1, 2, 3, 17, 64, 1000, MAXN};
  int threads[] = {1, 2, 3, 4, 8, 2, 1, 5}; /* the count changes between loops, up and down */
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
      memset(&c, 0, sizeof c);
      c.fail_at = -1;
      c.slow = sizes[s] <= 64 && (t % 2); /* a chunk sleeping makes the others take more */
      CHECK(kg_parallel_for(sizes[s], threads[t], count_chunk, &c) == 0);
      int bad = 0;
      for (int64_t i = 0; i < MAXN; i++) bad += atomic_load(&c.hits[i]) != (i < sizes[s]);
      CHECK(bad == 0);
      if (bad) fprintf(stderr, "  n=%lld threads=%d: %d chunks not run exactly once\n", (long long)sizes[s], threads[t], bad);
    }
  CHECK(kg_parallel_for(0, 4, count_chunk, &c) == 0); /* no chunks: nothing runs */
  kg_pool_stats st = kg_pool_get_stats();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  /* at most one thread per core: 8 asked for, cores - 1 workers beside the caller */
  CHECK(cores < 2 || (st.parallel > 0 && st.workers >= 1 && st.workers <= cores - 1));
}

/* a loop inside a chunk: runs inline, in order, on the same thread */
typedef struct {
  _Atomic int total;
  _Atomic int out_of_order;
} nest;
static _Thread_local int last_inner;
static int inner_chunk(void *ctx, int64_t i) {
  nest *n = ctx;
  if (i != last_inner + 1) atomic_fetch_add(&n->out_of_order, 1);
  last_inner = (int)i;
  atomic_fetch_add(&n->total, 1);
  return 0;
}
static int outer_chunk(void *ctx, int64_t i) {
  (void)i;
  last_inner = -1;
  CHECK(kg_pool_nested());
  return kg_parallel_for(10, 4, inner_chunk, ctx);
}

static void nested(void) {
  nest n = {0};
  CHECK(!kg_pool_nested());
  CHECK(kg_parallel_for(20, 3, outer_chunk, &n) == 0);
  CHECK(atomic_load(&n.total) == 200 && atomic_load(&n.out_of_order) == 0);
  /* inside an OpenMP region: inline too */
  nest m = {0};
  int rc = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      last_inner = -1;
      rc = kg_parallel_for(50, 4, inner_chunk, &m);
    }
  }
  CHECK(rc == 0 && atomic_load(&m.total) == 50 && atomic_load(&m.out_of_order) == 0);
}

static void errors(void) {
  static counts c;
  for (int nt = 1; nt <= 4; nt++) {
    memset(&c, 0, sizeof c);
    c.fail_at = 5;
    CHECK(kg_parallel_for(1000, nt, count_chunk, &c) == 42);
    int over = 0, ran = 0;
    for (int i = 0; i < 1000; i++) over += atomic_load(&c.hits[i]) > 1, ran += atomic_load(&c.hits[i]);
    CHECK(over == 0 && atomic_load(&c.hits[5]) == 1 && ran < 1000); /* the handout stopped */
    /* and the pool still works afterwards */
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    CHECK(kg_parallel_for(100, nt, count_chunk, &c) == 0 && atomic_load(&c.hits[99]) == 1);
  }
}

/* plain threads calling at once: one gets the pool, the others run inline; all chunks once */
static void *caller(void *arg) {
  counts *c = arg;
  for (int r = 0; r < 20; r++) {
    CHECK(kg_parallel_for(MAXN / 4, 3, count_chunk, c) == 0);
  }
  return NULL;
}
static void concurrent(void) {
  static counts c[4];
  memset(c, 0, sizeof c);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) c[i].fail_at = -1, pthread_create(&t[i], NULL, caller, &c[i]);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  int bad = 0;
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < MAXN; k++) bad += atomic_load(&c[i].hits[k]) != (k < MAXN / 4 ? 20 : 0);
  CHECK(bad == 0);
}

static void fill(float *p, int64_t n, unsigned seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    p[i] = (float)((seed >> 9) & 0xffff) / 32768.0f - 1.0f;
  }
}

/* C = A @ B (+ beta C) cut into pieces, against one sgemm call, and bits across thread counts */
static void gemm(int64_t N, int64_t M, int64_t K, bool ta, bool tb, double beta) {
  float *A = malloc(sizeof(float) * N * K), *B = malloc(sizeof(float) * K * M), *C0 = malloc(sizeof(float) * N * M);
  float *C = malloc(sizeof(float) * N * M), *ref = malloc(sizeof(float) * N * M), *ref2 = malloc(sizeof(float) * N * M);
  fill(A, N * K, 1), fill(B, K * M, 2), fill(C0, N * M, 3);
  memcpy(ref, C0, sizeof(float) * N * M);
  int64_t lda = ta ? N : K, ldb = tb ? K : M;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)N, (int)M, (int)K,
              1.f, A, (int)lda, B, (int)ldb, (float)beta, ref, (int)M);
  kg_gemm_split sp = kg_cpu_gemm_split(N, M, K);
  double maxerr = 0;
  for (int nt = 1; nt <= 4; nt++) {
    memcpy(C, C0, sizeof(float) * N * M);
    kg_cpu_blas_gemm(false, ta, tb, N, M, K, A, lda, B, ldb, beta, C, M, nt);
    for (int64_t i = 0; i < N * M; i++) {
      double e = fabs((double)C[i] - ref[i]) / (1 + fabs(ref[i]));
      if (e > maxerr) maxerr = e;
    }
    if (nt == 1 && sp.k == 1) memcpy(ref2, ref, sizeof(float) * N * M); /* one call at 1 thread */
    if (nt == 1 && sp.k > 1) memcpy(ref2, C, sizeof(float) * N * M);   /* K pieces at any count */
    if (nt >= 2 && memcmp(C, ref2, sizeof(float) * N * M)) {
      fprintf(stderr, "  gemm %lldx%lldx%lld ta=%d tb=%d beta=%g split k%lld r%lld c%lld: bits differ at %d threads\n",
              (long long)N, (long long)M, (long long)K, ta, tb, beta, (long long)sp.k, (long long)sp.rows,
              (long long)sp.cols, nt);
      failures++;
    }
  }
  CHECK(maxerr < 1e-4 * sqrt((double)K));
  free(A), free(B), free(C0), free(C), free(ref), free(ref2);
}

static void gemm_pieces(void) {
  /* the cut: small products whole, long K in K pieces, others in tiles of the larger dim */
  kg_gemm_split s = kg_cpu_gemm_split(16, 16, 16);
  CHECK(s.k == 1 && s.rows == 1 && s.cols == 1);
  s = kg_cpu_gemm_split(128, 128, 4096);
  CHECK(s.k > 1 && s.rows == 1 && s.cols == 1);
  s = kg_cpu_gemm_split(4096, 512, 128);
  CHECK(s.k == 1 && s.rows > 1);
  s = kg_cpu_gemm_split(128, 4096, 512);
  CHECK(s.k == 1 && s.cols > 1);
  gemm(4101, 40, 32, false, true, 0);   /* a tall product with an odd row count */
  gemm(1000, 300, 200, true, false, 1); /* tiles both ways, accumulating into C (a fused bias) */
  gemm(130, 70, 2001, false, false, 1); /* K pieces with beta 1 */
  gemm(64, 100, 3000, true, true, 0);
  gemm(300, 1100, 100, false, false, 0); /* wide: column tiles */
}

int main(void) {
  every_chunk_once();
  nested();
  errors();
  concurrent();
  gemm_pieces();
  if (failures) fprintf(stderr, "test_pool: %d failures\n", failures);
  else printf("test_pool: ok\n");
  return failures != 0;
}
