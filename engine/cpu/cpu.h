/* cpu.h — CPU kernel toolkit: dtype conversion of element runs, and the strided iterator.
 *
 * Kernels are dtype-generic by converting runs of up to KG_CHUNK elements into a float (or,
 * for f64 tensors, double) buffer, computing there, and converting back: storage in any dtype,
 * compute in f32 (f64 for f64), one conversion routine per dtype in this file.
 */
#ifndef KENG_CPU_H
#define KENG_CPU_H

#include "../core/internal.h"

#define KG_CHUNK 256

/* dst[i] = (float)src[i * stride] for i < n */
void kg_cpu_load_f32(float *dst, const void *src, kg_dtype dt, int64_t stride, int64_t n);
void kg_cpu_load_f64(double *dst, const void *src, kg_dtype dt, int64_t stride, int64_t n);
/* dst[i * stride] = src[i], rounding to dt (nearest even for bf16/f16) */
void kg_cpu_store_f32(void *dst, kg_dtype dt, int64_t stride, const float *src, int64_t n);
void kg_cpu_store_f64(void *dst, kg_dtype dt, int64_t stride, const double *src, int64_t n);

/* y[i] = exp(x[i]) in float without libm (AVX2+FMA or the same formula in scalar code; y may
 * be x; error <= 1 ulp, docs/kernels.md); defined in elementwise.c */
void kg_cpu_exp_f32(float *y, const float *x, int64_t n);

/* w[j] = kg_philox_word(seed, offset, i + j) for j < n <= KG_CHUNK, whole Philox blocks at a
 * time (AVX2 when present); defined in random.c */
void kg_cpu_philox_words(uint32_t *w, uint64_t seed, uint64_t offset, uint64_t i, int64_t n);

/* The CPU has AVX2 + FMA and KENG_NO_SIMD=1 does not switch the vector paths off (the kernel labs
 * run both); used by the vector kernels of elementwise.c and rows_simd.h. Defined in iter.c. */
bool kg_cpu_avx2_fma(void);
/* the widest float vectors the CPU has for a kernel with AVX2/AVX-512 variants: 2 AVX-512F,
 * 1 AVX2+FMA, 0 neither or KENG_NO_SIMD=1 (kg_cpu_simd, <keng/keng.h>); capped by the registry
 * switch cap_env (engine/core/env.def; 0 = the kernel off; a lab switches variants with setenv +
 * kg_env_reload) */
int kg_cpu_vector_isa(kg_env_id cap_env);

/* The copy and fill kernels (copy.c, creation.c), for kernels that build on them; fill_value
 * sets every element of t to v (an op's output: no in-place checks, no version bump). */
kg_status kg_cpu_copy(const kg_op_call *c);
kg_status kg_cpu_fill(const kg_op_call *c);
kg_status kg_cpu_fill_value(kg_tensor *t, double v);

/* Compute in double for f64 and for integers (exact to 2^53), float otherwise. */
static inline bool kg_cpu_wide(kg_dtype dt) { return dt == KG_F64 || dt == KG_I64 || dt == KG_I32; }

/* Walks up to 4 operands of one shape (operand 0 defines it; others broadcast with stride 0),
 * calling fn on runs along the innermost (coalesced) dim. ptr[k] points at the run's first
 * element of operand k, stride[k] is its element stride. Runs in parallel (OpenMP) when large. */
#define KG_ITER_MAX 4
typedef void (*kg_iter_fn)(void *ctx, char *const *ptr, const int64_t *stride, int64_t n);
typedef struct {
  int nops, ndim;
  int64_t shape[KG_MAX_DIMS];
  int64_t stride[KG_ITER_MAX][KG_MAX_DIMS];
  char *base[KG_ITER_MAX];
  int elsize[KG_ITER_MAX];
} kg_iter;
void kg_iter_init(kg_iter *it, int nops, const kg_tensor *const *ts);
void kg_iter_run(const kg_iter *it, kg_iter_fn fn, void *ctx);
/* Broadcast strides of t viewed with shape (ndim, shape): 0 on broadcast dims. */
void kg_broadcast_strides(const kg_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* Reductions: x's dims split into kept (outer, one output element each) and reduced (inner). */
typedef struct {
  int nk, nr;
  int64_t kshape[KG_MAX_DIMS], kstride[KG_MAX_DIMS], rshape[KG_MAX_DIMS], rstride[KG_MAX_DIMS];
  int64_t nout, nred;
} kg_cpu_reduce_plan;
void kg_cpu_reduce_layout(const kg_tensor *x, uint32_t mask, kg_cpu_reduce_plan *p);
/* element offset (relative to kg_data(x)) of output element o's first reduced element */
int64_t kg_cpu_reduce_row_offset(const kg_cpu_reduce_plan *p, int64_t o);
/* calls fn on runs of the reduced elements of one output, as doubles; start is the run's
 * position in the row-major order of the reduced dims */
void kg_cpu_reduce_walk(const kg_cpu_reduce_plan *p, const char *base, kg_dtype dt, int64_t row_off,
                        void (*fn)(void *ctx, const double *v, int64_t start, int64_t n), void *ctx);

/* Parallel-for helper: splits [0, n) among threads when n * cost is large. */
#define KG_PAR_THRESHOLD 32768

#endif
