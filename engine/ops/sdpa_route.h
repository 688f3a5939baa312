/* sdpa_route.h — the one router of scaled_dot_product_attention: for each call, which
 * implementation runs it. Plain C with no CUDA in it (static inline), included by
 * engine/ops/attention.c (every build), engine/cuda/sdpa_plan.h and tests/c/test_sdpa_plan.c,
 * which checks every rule on the CPU.
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads, T query length, S key length,
 * D head dim. Routes:
 *   CPU    the CPU's fused kernel (engine/cpu/attention.c; any D)
 *   CUDNN  cuDNN's fused flash attention (engine/cuda/sdpa_cudnn.cu) for the forward, keng's
 *          flash kernel for the backward; the kernel falls back to FLASH when a layout, an
 *          alignment, a plan build or a launch fails (D <= 256 here, so FLASH always can)
 *   FLASH  keng's flash kernel (engine/cuda/attention.cu; D <= 256, scalar FMAs)
 *   MATH   batched GEMM -> masked softmax -> GEMM composed of engine ops (engine/ops/attention.c),
 *          so autograd comes from those ops; f32 GEMMs run as TF32 under keng.backends.allow_tf32
 * Rules, first match wins (docs/cuda.md has them as a table):
 *   0. an empty call (a zero B, H, T, S or D) -> CPU / FLASH: the fused kernels fill the outputs
 *   1. a non-finite scale, dropout, a float mask that needs a gradient, or keng.backends.sdpa_math
 *      -> MATH (the fused kernels assume a finite scale, draw no dropout mask and pass no gradient
 *      to the mask; MATH propagates NaN as PyTorch does and differentiates the mask)
 *   2. cpu -> CPU
 *   3. cuDNN takes it (kg_sdpa_cudnn_rule) -> CUDNN
 *   4. D > 256, or the flash kernel's shared memory for this D and dtype (forward, and the backward
 *      passes under grad) over the device's per-block limit -> MATH (nothing else on the GPU takes
 *      it: the SD VAE's one 512-wide head; f64 at D 256 on sm_80, f64 past D 130 on sm_86/89)
 *   5. big enough (T·S >= KG_SDPA_MATH_MIN_TS) with fast GEMMs to win with (bf16/f16: P·V on
 *      tensor cores, Q·Kᵀ from f32 copies — TF32 under allow_tf32, SGEMM else; f32 only under
 *      allow_tf32), and under grad the kept tensors (3 f32 score-sized ones: scores,
 *      probabilities, softmax output) within KG_SDPA_MATH_GRAD_BYTES -> MATH. Without grad the
 *      math route runs the batch in chunks whose f32 scores fit KG_SDPA_MATH_CHUNK_BYTES
 *      (kg_sdpa_math_rows), so any size goes.
 *   6. else FLASH (decode steps, small or f64 calls, f32 without TF32, huge calls under grad).
 * A window >= S is no window (kg_sdpa_window): its band holds every key of every row. */
#ifndef KENG_SDPA_ROUTE_H
#define KENG_SDPA_ROUTE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum { KG_SDPA_ROUTE_CPU, KG_SDPA_ROUTE_CUDNN, KG_SDPA_ROUTE_FLASH, KG_SDPA_ROUTE_MATH } kg_sdpa_route;

typedef enum { KG_SDPA_MASK_NONE, KG_SDPA_MASK_BOOL, KG_SDPA_MASK_ADDITIVE } kg_sdpa_mask_kind;

/* why cuDNN does not take a call (named by kg_sdpa_reason_name; keng.backends.cudnn_sdpa_stats
 * shows the counts by kg_sdpa_fallback_name, engine/core/backends.c) */
typedef enum {
  KG_SDPA_OK = 0,
  KG_SDPA_OFF,       /* keng.backends.cudnn_sdpa = false, or no cuDNN in the build */
  KG_SDPA_DTYPE,     /* not bf16 / f16 */
  KG_SDPA_HEAD_DIM,  /* D not a multiple of 8, or above what this GPU and cuDNN take */
  KG_SDPA_MASK,      /* an explicit mask tensor */
  KG_SDPA_WINDOW,    /* a sliding window narrower than S */
  KG_SDPA_CAUSAL_TS, /* causal with T > S (or, before cuDNN 9.6, T != S not multiples of 64) */
  KG_SDPA_LAYOUT,    /* a last dim not dense, or a stride not a multiple of 8 elements */
  KG_SDPA_ALIGN,     /* a data pointer not 16-byte aligned */
  KG_SDPA_EMPTY,     /* a zero-sized dim */
  KG_SDPA_ARCH,      /* a GPU below sm_80, cuDNN below 9.0, or cuDNN 9.10.0/9.10.1 (known SDPA bugs) */
  KG_SDPA_NREASONS
} kg_sdpa_reason;

static inline const char *kg_sdpa_reason_name(kg_sdpa_reason r) {
  static const char *names[KG_SDPA_NREASONS] = {
      "ok", "off", "dtype", "head_dim", "mask", "window", "causal_t_gt_s", "layout", "align", "empty", "arch"};
  return (unsigned)r < KG_SDPA_NREASONS ? names[r] : "?";
}

static inline const char *kg_sdpa_route_name(kg_sdpa_route r) {
  static const char *names[4] = {"cpu", "cudnn", "flash", "math"};
  return (unsigned)r < 4 ? names[r] : "?";
}

#define KG_SDPA_FLASH_MAX_D 256              /* engine/cuda/attention.cu's register tiles (MR <= 8) */
#define KG_SDPA_MATH_MIN_TS 4096             /* below, one fused launch beats ~8 composed ones */
#define KG_SDPA_MATH_CHUNK_BYTES (1ll << 30) /* f32 scores of one batch chunk, without grad */
#define KG_SDPA_MATH_GRAD_BYTES (4ll << 30)  /* what the math route keeps for backward */

/* everything the route depends on; dtype is a kg_dtype (KG_F32 ... from keng.h) */
typedef struct {
  bool cuda;
  int dtype;
  bool is_half, is_f32, is_f64; /* dtype is bf16 / f16; f32; f64 */
  int64_t B, H, Hkv, T, S, D;
  kg_sdpa_mask_kind mask;
  bool causal;
  int64_t window; /* as given: 0 none */
  double scale;   /* as resolved (1/sqrt(D) for 0) */
  double dropout;
  bool requires_grad, allow_tf32;
  bool mask_grad;     /* the mask needs a gradient (a learned bias) */
  bool cudnn_enabled; /* keng.backends.cudnn_sdpa and a build with cuDNN */
  bool force_math;    /* keng.backends.sdpa_math */
  int sm;             /* compute capability major*10 + minor, 0 unknown */
  int cudnn_version;  /* cudnnGetVersion() (9.1.2 = 90102), 0 none */
  int64_t smem;       /* shared memory a block may opt in to (bytes), 0 unknown (48 KiB assumed) */
} kg_sdpa_desc;

/* the window that matters: w >= S shows every row all its keys (row T-1's band starts at S - w) */
static inline int64_t kg_sdpa_window(int64_t window, int64_t S) { return window >= S ? 0 : window; }

/* the largest head dim cuDNN's fused attention takes (cudnn-frontend's support surface: Hopper 256;
 * Ampere/Ada 128 up to cuDNN 9.9, then 256 except decode; Blackwell 128 up to 9.9, then 256) */
static inline int64_t kg_sdpa_cudnn_max_d(int sm, int version, int64_t T) {
  int major = sm / 10;
  if (major == 9) return 256;
  if (major == 8 && version > 90900 && T > 1) return 256;
  if (major >= 10 && version > 90900) return 256;
  return 128;
}

/* KG_SDPA_OK when cuDNN's fused forward may take the call as far as shapes, dtype, masking and
 * the device go (layout and alignment are checked at launch: sdpa_plan.h, kg_sdpa_check) */
static inline kg_sdpa_reason kg_sdpa_cudnn_rule(const kg_sdpa_desc *d) {
  if (!d->cudnn_enabled || !d->cuda) return KG_SDPA_OFF;
  if (!d->is_half) return KG_SDPA_DTYPE;
  if (d->B <= 0 || d->H <= 0 || d->Hkv <= 0 || d->T <= 0 || d->S <= 0 || d->D <= 0) return KG_SDPA_EMPTY;
  if (d->sm < 80 || d->cudnn_version < 90000 || d->cudnn_version == 91000 || d->cudnn_version == 91001)
    return KG_SDPA_ARCH;
  if (d->D % 8 != 0 || d->D > kg_sdpa_cudnn_max_d(d->sm, d->cudnn_version, d->T)) return KG_SDPA_HEAD_DIM;
  if (d->mask != KG_SDPA_MASK_NONE) return KG_SDPA_MASK;
  if (kg_sdpa_window(d->window, d->S) > 0) return KG_SDPA_WINDOW;
  if (d->causal && d->T > d->S) return KG_SDPA_CAUSAL_TS;
  if (d->causal && d->T != d->S && d->cudnn_version < 90600 && (d->T % 64 != 0 || d->S % 64 != 0))
    return KG_SDPA_CAUSAL_TS;
  return KG_SDPA_OK;
}

/* The flash kernel's tiles (engine/cuda/attention.cu static_asserts its own against these) and
 * the dynamic shared memory of its three kernels for head dim D, FT bytes per compute element
 * (4: f32/bf16/f16, 8: f64). */
#define KG_SDPA_FLASH_BQ 16 /* queries per block (forward, dq pass) */
#define KG_SDPA_FLASH_KT 32 /* keys per tile (forward, dq pass) */
#define KG_SDPA_FLASH_KB 16 /* keys per block (dk/dv pass) */
#define KG_SDPA_FLASH_QT 32 /* queries per tile (dk/dv pass) */
static inline int64_t kg_sdpa_flash_smem_fwd(int64_t ft, int64_t D) {
  return ft * (KG_SDPA_FLASH_BQ * D + KG_SDPA_FLASH_KT * (D + 1) + KG_SDPA_FLASH_KT * D);
}
static inline int64_t kg_sdpa_flash_smem_dq(int64_t ft, int64_t D) {
  return ft * (2 * KG_SDPA_FLASH_BQ * D + 2 * KG_SDPA_FLASH_KT * (D + 1));
}
static inline int64_t kg_sdpa_flash_smem_dkv(int64_t ft, int64_t D) {
  return ft * (2 * KG_SDPA_FLASH_KB * D + 2 * KG_SDPA_FLASH_QT * (D + 1) + 2 * KG_SDPA_FLASH_QT);
}
/* whether the flash kernel can run the call on this device (and its backward, under grad) */
static inline bool kg_sdpa_flash_fits(const kg_sdpa_desc *d) {
  int64_t ft = d->is_f64 ? 8 : 4, limit = d->smem > 0 ? d->smem : 48 * 1024;
  if (d->D > KG_SDPA_FLASH_MAX_D || kg_sdpa_flash_smem_fwd(ft, d->D) > limit) return false;
  return !d->requires_grad || (kg_sdpa_flash_smem_dq(ft, d->D) <= limit && kg_sdpa_flash_smem_dkv(ft, d->D) <= limit);
}

/* the route of a call; *why (may be NULL) says why cuDNN did not take it (KG_SDPA_OK if it did,
 * or if cuDNN was never asked: cpu, or rule 1) */
static inline kg_sdpa_route kg_sdpa_route_of(const kg_sdpa_desc *d, kg_sdpa_reason *why) {
  kg_sdpa_reason r = KG_SDPA_OK;
  kg_sdpa_route route;
  bool empty = d->B <= 0 || d->H <= 0 || d->T <= 0 || d->S <= 0 || d->D <= 0;
  if (empty)
    route = d->cuda ? KG_SDPA_ROUTE_FLASH : KG_SDPA_ROUTE_CPU; /* nothing to compute */
  else if (!isfinite(d->scale) || d->dropout > 0 || d->mask_grad || d->force_math)
    route = KG_SDPA_ROUTE_MATH;
  else if (!d->cuda)
    route = KG_SDPA_ROUTE_CPU;
  else if ((r = kg_sdpa_cudnn_rule(d)) == KG_SDPA_OK)
    route = KG_SDPA_ROUTE_CUDNN;
  else if (!kg_sdpa_flash_fits(d))
    route = KG_SDPA_ROUTE_MATH;
  else {
    double scores = (double)d->B * (double)d->H * (double)d->T * (double)d->S;
    bool tensor_cores = d->is_half || (d->is_f32 && d->allow_tf32);
    bool big = (double)d->T * (double)d->S >= KG_SDPA_MATH_MIN_TS;
    bool fits = !d->requires_grad || 3 * 4.0 * scores <= (double)KG_SDPA_MATH_GRAD_BYTES;
    route = tensor_cores && big && fits ? KG_SDPA_ROUTE_MATH : KG_SDPA_ROUTE_FLASH;
  }
  if (why) *why = r;
  return route;
}

/* batch rows per chunk of the math route: all B under grad (every chunk's tensors would be kept
 * anyway), else as many as keep the f32 scores [rows, H, T, S] within chunk_bytes (at least 1) */
static inline int64_t kg_sdpa_math_rows(int64_t B, int64_t H, int64_t T, int64_t S, bool requires_grad,
                                        int64_t chunk_bytes) {
  double per_row = 4.0 * (double)H * (double)T * (double)S;
  if (requires_grad || per_row <= 0) return B;
  double rows = (double)chunk_bytes / per_row;
  return rows >= (double)B ? B : rows < 1 ? 1 : (int64_t)rows;
}

/* the GPU's compute capability, the cuDNN version and the opt-in shared memory per block the
 * router reads (engine/cuda/sdpa_cudnn.cu;
 * zeros in a build without CUDA: engine/core/cuda_stub.c) */
#ifdef __cplusplus
extern "C" {
#endif
void kg_cuda_sdpa_caps(int device, int *sm, int *cudnn_version, int64_t *smem);
#ifdef __cplusplus
}
#endif

#endif
