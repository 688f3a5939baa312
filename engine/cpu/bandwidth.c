/* bandwidth.c (cpu) — STREAM-style bandwidth (kg_cpu_bandwidth in keng.h). Each thread owns one contiguous part
 * of every buffer (first touched by that thread, as the timed passes split them), sums its part
 * with eight independent 512-bit accumulator chains over eight interleaved streams so that the
 * loads, not the adds, bound the loop, and the best of the passes is reported (a shared machine only ever slows
 * a pass). The triad is the STREAM kernel, written with plain C loops the compiler vectorises. */
#include <keng/keng.h>
#include "cpu.h"

#include <omp.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void) { return omp_get_wtime(); }

/* sum of n floats (n a multiple of 128), read as 8 interleaved streams (the eighths of the
 * range, a cache line of each per step, as the GEMV tile reads 8 weight rows at once): one
 * stream left DRAM bandwidth unused (1 thread, busy machine: 4.7 GB/s, 4 or 8 streams 7-13) */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n) {
  __m512 s[8];
  for (int i = 0; i < 8; i++) s[i] = _mm512_setzero_ps();
  size_t q = n / 8 / 16 * 16, i = 0;
  for (; i < q; i += 16)
    for (int j = 0; j < 8; j++) s[j] = _mm512_add_ps(s[j], _mm512_load_ps(p + j * q + i));
  for (i = 8 * q; i < n; i += 16) s[0] = _mm512_add_ps(s[0], _mm512_load_ps(p + i));
  for (int j = 1; j < 8; j++) s[0] = _mm512_add_ps(s[0], s[j]);
  return _mm512_reduce_add_ps(s[0]);
}
#endif

static float sum_plain(const float *p, size_t n) {
  float s[16] = {0};
  for (size_t i = 0; i < n; i += 16)
    for (int j = 0; j < 16; j++) s[j] += p[i + j];
  float t = 0;
  for (int j = 0; j < 16; j++) t += s[j];
  return t;
}

kg_status kg_cpu_bandwidth(kg_bandwidth *out, size_t bytes, int threads, int reps) {
  int nt = threads > 0 ? threads : kg_num_threads();
  if (reps < 1) reps = 1;
  /* elements per thread and array: a multiple of 128 floats, three arrays in `bytes` */
  size_t per = bytes / 3 / 4 / (size_t)nt / 128 * 128;
  if (per == 0) per = 128;
  size_t n = per * (size_t)nt, got = 0;
  float *buf = kg_cpu_alloc(3 * n * sizeof(float), &got);
  if (!buf) return kg_error(KG_ERR_OOM, "memory_bandwidth", "cannot allocate %zu bytes", 3 * n * sizeof(float));
  float *a = buf, *b = buf + n, *c = buf + 2 * n;
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool z = __builtin_cpu_supports("avx512f");
#else
  bool z = false;
#endif
  double best_read = 1e30, best_triad = 1e30;
  volatile float sink = 0;
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    size_t o = (size_t)t * per;
    for (size_t i = 0; i < per; i++) a[o + i] = 1.0f, b[o + i] = 2.0f, c[o + i] = 0.5f; /* first touch */
    for (int r = 0; r < reps; r++) {
#pragma omp barrier
      double t0 = now();
      /* read: all three arrays as one buffer (3 n floats), each thread its third of each */
      float s = 0;
      for (int q = 0; q < 3; q++) {
#if defined(__x86_64__)
        if (z) s += sum_avx512(buf + (size_t)q * n + o, per);
        else
#endif
          s += sum_plain(buf + (size_t)q * n + o, per);
      }
#pragma omp barrier
#pragma omp master
      {
        double dt = now() - t0;
        if (dt < best_read) best_read = dt;
        sink += s;
      }
#pragma omp barrier
      t0 = now();
      for (size_t i = o; i < o + per; i++) a[i] = b[i] + 3.0f * c[i];
#pragma omp barrier
#pragma omp master
      {
        double dt = now() - t0;
        if (dt < best_triad) best_triad = dt;
      }
    }
  }
  (void)sink;
  kg_cpu_free(buf, got);
  out->read = 3.0 * (double)n * 4 / best_read * 1e-9;
  out->triad = 3.0 * (double)n * 4 / best_triad * 1e-9;
  out->threads = nt;
  return KG_OK;
}
