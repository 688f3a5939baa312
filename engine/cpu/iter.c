/* iter.c — dtype conversion of element runs and the strided N-operand iterator. */
#include "cpu.h"

#include <keng/scalar.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KG_X86 1
#endif

bool kg_cpu_avx2_fma(void) {
  static int have = -1;
  if (have < 0) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    have = 0;
#endif
  }
  return have == 1 && !kg_env_bool(KG_ENV_KENG_NO_SIMD);
}

int kg_cpu_simd(void) {
  static int have = -1;
  if (have < 0) {
    int h = 0;
#ifdef KG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) h = 1;
    if (h && __builtin_cpu_supports("avx512f")) h = 2;
#endif
    have = h;
  }
  return kg_env_bool(KG_ENV_KENG_NO_SIMD) ? 0 : have; /* read each call: the labs switch it */
}

int kg_cpu_vector_isa(kg_env_id cap_env) {
  int have = kg_cpu_simd();
  long long cap = kg_env_int(cap_env);
  return have < cap ? have : (int)cap;
}

/* ---- vectorised bf16 <-> f32 runs (unit stride): AVX2 when the CPU has it, else scalar ---- */

#ifdef KG_X86
static int have_avx2 = -1; /* set once; a race writes the same value */

static bool use_avx2(void) {
  if (have_avx2 < 0) {
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
  }
  return have_avx2 == 1 && !kg_env_bool(KG_ENV_KENG_NO_SIMD);
}

/* bf16 -> f32 is exact: the 16 bits become the high half of the float */
__attribute__((target("avx2"))) static int64_t bf16_load_avx2(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i))), 16);
    __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i + 8))), 16);
    _mm256_storeu_si256((__m256i *)(dst + i), lo);
    _mm256_storeu_si256((__m256i *)(dst + i + 8), hi);
  }
  return i;
}

/* f32 -> bf16, nearest even: (u + 0x7fff + lsb) >> 16; NaN -> (u >> 16) | 0x40 (kept quiet),
 * exactly kg_f32_to_bf16 lane by lane */
__attribute__((target("avx2"))) static inline __m256i bf16_round8(__m256 x) {
  const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), q = _mm256_set1_epi32(0x40);
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
  __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), q);
  return _mm256_blendv_epi8(r, qn, nan);
}

__attribute__((target("avx2"))) static int64_t bf16_store_avx2(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = bf16_round8(_mm256_loadu_ps(src + i)), b = bf16_round8(_mm256_loadu_ps(src + i + 8));
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8); /* undo the lane interleave */
    _mm256_storeu_si256((__m256i *)(dst + i), p);
  }
  return i;
}
#endif

static void bf16_load_run(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
#ifdef KG_X86
  if (n >= 16 && use_avx2()) i = bf16_load_avx2(dst, src, n);
#endif
  for (; i < n; i++) dst[i] = kg_bf16_to_f32(src[i]);
}

static void bf16_store_run(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
#ifdef KG_X86
  if (n >= 16 && use_avx2()) i = bf16_store_avx2(dst, src, n);
#endif
  for (; i < n; i++) dst[i] = kg_f32_to_bf16(src[i]);
}

#define LOAD_CASES(T, dst, src, stride, n)                                                          \
  switch (dt) {                                                                                     \
  case KG_F32: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const float *)src)[i * stride]; break;  \
  case KG_F64: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const double *)src)[i * stride]; break; \
  case KG_BF16:                                                                                     \
    for (int64_t i = 0; i < n; i++) dst[i] = (T)kg_bf16_to_f32(((const uint16_t *)src)[i * stride]); \
    break;                                                                                          \
  case KG_F16:                                                                                      \
    for (int64_t i = 0; i < n; i++) dst[i] = (T)kg_f16_to_f32(((const uint16_t *)src)[i * stride]); \
    break;                                                                                          \
  case KG_I32: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const int32_t *)src)[i * stride]; break; \
  case KG_I64: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const int64_t *)src)[i * stride]; break; \
  case KG_BOOL:                                                                                     \
  case KG_U8: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const uint8_t *)src)[i * stride]; break; \
  case KG_I8: for (int64_t i = 0; i < n; i++) dst[i] = (T)((const int8_t *)src)[i * stride]; break;  \
  default: break;                                                                                   \
  }

void kg_cpu_load_f32(float *dst, const void *src, kg_dtype dt, int64_t stride, int64_t n) {
  if (dt == KG_F32 && stride == 1) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
  if (dt == KG_BF16 && stride == 1) {
    bf16_load_run(dst, src, n);
    return;
  }
  LOAD_CASES(float, dst, src, stride, n)
}

void kg_cpu_load_f64(double *dst, const void *src, kg_dtype dt, int64_t stride, int64_t n) {
  LOAD_CASES(double, dst, src, stride, n)
}

/* integer stores truncate toward zero like a C cast (PyTorch does the same), saturating where a
 * cast would be undefined (NaN -> 0, out of range -> the nearest bound; internal.h); bool is != 0 */
#define STORE_CASES(T, dst, src, stride, n)                                                          \
  switch (dt) {                                                                                      \
  case KG_F32: for (int64_t i = 0; i < n; i++) ((float *)dst)[i * stride] = (float)src[i]; break;     \
  case KG_F64: for (int64_t i = 0; i < n; i++) ((double *)dst)[i * stride] = (double)src[i]; break;   \
  case KG_BF16:                                                                                      \
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = kg_f32_to_bf16((float)src[i]);   \
    break;                                                                                           \
  case KG_F16:                                                                                       \
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = kg_f32_to_f16((float)src[i]);    \
    break;                                                                                           \
  case KG_I32: for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i * stride] = kg_sat_i32(src[i]); break; \
  case KG_I64: for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i * stride] = kg_sat_i64(src[i]); break; \
  case KG_BOOL: for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i * stride] = src[i] != 0; break;    \
  case KG_U8: for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i * stride] = kg_sat_u8(src[i]); break;  \
  case KG_I8: for (int64_t i = 0; i < n; i++) ((int8_t *)dst)[i * stride] = kg_sat_i8(src[i]); break;   \
  default: break;                                                                                    \
  }

void kg_cpu_store_f32(void *dst, kg_dtype dt, int64_t stride, const float *src, int64_t n) {
  if (dt == KG_F32 && stride == 1) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
  if (dt == KG_BF16 && stride == 1) {
    bf16_store_run(dst, src, n);
    return;
  }
  STORE_CASES(float, dst, src, stride, n)
}

void kg_cpu_store_f64(void *dst, kg_dtype dt, int64_t stride, const double *src, int64_t n) {
  STORE_CASES(double, dst, src, stride, n)
}

void kg_broadcast_strides(const kg_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - t->ndim);
    stride[i] = (j < 0 || t->shape[j] == 1) && shape[i] != 1 ? 0 : (j < 0 ? 0 : t->stride[j]);
  }
}

void kg_iter_init(kg_iter *it, int nops, const kg_tensor *const *ts) {
  const kg_tensor *o = ts[0];
  it->nops = nops;
  int nd = 0;
  /* drop size-1 dims, then merge dims that are contiguous in every operand */
  int64_t shape[KG_MAX_DIMS], stride[KG_ITER_MAX][KG_MAX_DIMS], bs[KG_ITER_MAX][KG_MAX_DIMS];
  for (int k = 0; k < nops; k++) {
    kg_broadcast_strides(ts[k], o->ndim, o->shape, bs[k]);
    it->base[k] = (char *)kg_data(ts[k]);
    it->elsize[k] = kg_dtype_info[ts[k]->dtype].size;
  }
  for (int d = 0; d < o->ndim; d++) {
    if (o->shape[d] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int k = 0; k < nops; k++)
        if (stride[k][nd - 1] != bs[k][d] * o->shape[d]) merge = false;
      if (merge) {
        shape[nd - 1] *= o->shape[d];
        for (int k = 0; k < nops; k++) stride[k][nd - 1] = bs[k][d];
        continue;
      }
    }
    shape[nd] = o->shape[d];
    for (int k = 0; k < nops; k++) stride[k][nd] = bs[k][d];
    nd++;
  }
  if (nd == 0) { /* scalar or all size-1 */
    shape[0] = kg_numel(o);
    for (int k = 0; k < nops; k++) stride[k][0] = 1;
    nd = 1;
  }
  it->ndim = nd;
  memcpy(it->shape, shape, sizeof(int64_t) * (size_t)nd);
  for (int k = 0; k < nops; k++) memcpy(it->stride[k], stride[k], sizeof(int64_t) * (size_t)nd);
}

/* runs elements [begin, end) of the flattened iteration space; each operand's offset is kept
 * as an odometer (updated by strides when an index wraps), so a run costs O(1) to address:
 * broadcast ops such as x[..., 16, 1] + y[..., 1, 16] make runs of only 16 elements */
static void run_range(const kg_iter *it, kg_iter_fn fn, void *ctx, int64_t begin, int64_t end) {
  int nd = it->ndim, last = nd - 1, nops = it->nops;
  int64_t idx[KG_MAX_DIMS], rem = begin, off[KG_ITER_MAX] = {0};
  for (int d = last; d >= 0; d--) {
    idx[d] = rem % it->shape[d];
    rem /= it->shape[d];
  }
  for (int k = 0; k < nops; k++)
    for (int d = 0; d < nd; d++) off[k] += idx[d] * it->stride[k][d];
  int64_t inner[KG_ITER_MAX];
  for (int k = 0; k < nops; k++) inner[k] = it->stride[k][last];
  int64_t pos = begin;
  while (pos < end) {
    char *ptr[KG_ITER_MAX];
    for (int k = 0; k < nops; k++) ptr[k] = it->base[k] + off[k] * it->elsize[k];
    int64_t n = it->shape[last] - idx[last];
    if (n > end - pos) n = end - pos;
    fn(ctx, ptr, inner, n);
    pos += n;
    idx[last] += n;
    for (int k = 0; k < nops; k++) off[k] += n * inner[k];
    for (int d = last; d > 0 && idx[d] >= it->shape[d]; d--) {
      for (int k = 0; k < nops; k++) off[k] += it->stride[k][d - 1] - idx[d] * it->stride[k][d];
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

void kg_iter_run(const kg_iter *it, kg_iter_fn fn, void *ctx) {
  int64_t total = 1;
  for (int d = 0; d < it->ndim; d++) total *= it->shape[d];
  if (total == 0) return;
  int nt = total >= KG_PAR_THRESHOLD ? kg_num_threads() : 1;
  if (nt <= 1) {
    run_range(it, fn, ctx, 0, total);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t b = total * t / n, e = total * (t + 1) / n;
    run_range(it, fn, ctx, b, e);
  }
}
