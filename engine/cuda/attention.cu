/* attention.cu — rotary position embedding and flash-style scaled-dot-product attention
 * (forward and backward), following engine/cpu/attention.c step for step.
 *
 * Shapes: q [B, H, T, D], k, v [B, Hkv, S, D] (head h reads kv head h / (H / Hkv)), mask
 * broadcast to [B, H, T, S] by strides (bool: false hides; float: added), out [B, H, T, D],
 * lse [B, H, T]. Causal keys j <= i + (S - T); window > 0 also j > i + (S - T) - window.
 * Compute in float for f32/bf16/f16 (double for f64).
 *
 * Forward: a block per (b, h, tile of BQ = 16 queries), 4 warps of 4 query rows each. Key and
 * value tiles of 32 rows go to shared memory; lane l scores key j0 + l against the row (q scaled
 * first, as the CPU does), then the row's online softmax (running max m and sum l, accumulator
 * rescaled when m grows) and acc += p·V with lane l owning dims l, l + 32, ... Tiles outside the
 * block's causal/window band are never loaded. Rows that see no key give zeros and lse -inf.
 * Backward recomputes P = exp(s - lse): delta_i = dO_i·O_i; pass 1 per (b, h, query tile) gives
 * dq = scale Σ dS·K; pass 2 per (b, kv head, tile of 16 keys) gives dv = Σ Pᵀ dO and
 * dk = Σ dSᵀ (scale q) over the query heads of its group and the queries that can see the tile —
 * every output row is written by one block, so no atomics and the result is deterministic.
 * Head dims up to 256. Correctness first: no tensor cores yet (see docs/cuda.md). Which calls
 * come here at all is the router's choice (engine/ops/sdpa_route.h: D > 256, and big calls with
 * tensor-core GEMMs to win with, take the math route of engine ops instead). The forward first
 * offers the call to cuDNN's fused attention (sdpa_cudnn.cu: the router's cuDNN rule plus layout
 * and alignment); these kernels run for everything it does not take. */
#include "util.cuh"
#include "../ops/sdpa_route.h"

#define WARPS 4
#define RPW 4               /* query rows per warp (forward, pass 1) */
#define BQ (WARPS * RPW)    /* queries per block */
#define KT 32               /* keys per tile */
#define KPW 4               /* keys per warp (pass 2) */
#define KB (WARPS * KPW)    /* keys per block (pass 2) */
#define QT 32               /* queries per tile (pass 2) */
/* the router sizes shared memory with the same tiles (engine/ops/sdpa_route.h) */
static_assert(BQ == KG_SDPA_FLASH_BQ && KT == KG_SDPA_FLASH_KT && KB == KG_SDPA_FLASH_KB && QT == KG_SDPA_FLASH_QT,
              "flash tiles out of step with sdpa_route.h");

struct sdpa_args {
  int64_t B, H, Hkv, T, S, D, off, window;
  bool causal, has_mask;
  double scale;
  const char *q, *k, *v, *m, *o, *g, *lse, *delta;
  int mdt, odt, gdt; /* out and dout may differ from q's dtype: loaded by run-time dtype */
  int64_t qs[4], ks[4], vs[4], ms[4], os[4], gs[4], dqs[4], dks[4], dvs[4];
  char *out, *dq, *dk, *dv;
};

__device__ __forceinline__ int64_t at4(const int64_t *st, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * st[0] + b * st[1] + c * st[2] + d * st[3];
}
__device__ __forceinline__ int64_t key_lo(const sdpa_args &a, int64_t i) {
  int64_t lo = a.window > 0 ? i + a.off - a.window + 1 : 0;
  return lo < 0 ? 0 : lo > a.S ? a.S : lo;
}
__device__ __forceinline__ int64_t key_hi(const sdpa_args &a, int64_t i) {
  int64_t hi = a.causal ? i + a.off + 1 : a.S;
  return hi < 0 ? 0 : hi > a.S ? a.S : hi;
}
/* score s of (b, h, i, j) with mask and band applied */
template <class FT>
__device__ __forceinline__ FT banded(const sdpa_args &a, FT s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (a.has_mask) {
    FT mv = kg_load<FT>(a.m, a.mdt, at4(a.ms, b, h, i, j));
    if (a.mdt == KG_BOOL) s = mv != 0 ? s : (FT)-INFINITY;
    else s += mv;
  }
  if (j < key_lo(a, i) || j >= key_hi(a, i)) s = -INFINITY;
  return s;
}
template <class FT> __device__ __forceinline__ FT warp_max(FT v) {
  for (int m = 16; m > 0; m >>= 1) {
    FT o = __shfl_xor_sync(0xffffffffu, v, m);
    v = o > v ? o : v;
  }
  return v;
}
template <class S, class FT> __device__ __forceinline__ FT ld(const char *base, int64_t off) {
  return (FT)kg_get((const S *)base + off);
}

/* ---- forward ------------------------------------------------------------------------------- */

template <class FT, class S, int MR> __global__ void __launch_bounds__(WARPS * 32) sdpa_fwd_kernel(sdpa_args a) {
  extern __shared__ unsigned char smem[];
  const int64_t D = a.D, G = a.H / a.Hkv, nqb = (a.T + BQ - 1) / BQ;
  FT *qs = (FT *)smem, *ks = qs + BQ * D, *vs = ks + KT * (D + 1);
  const int64_t task = blockIdx.x, b = task / (a.H * nqb), h = task / nqb % a.H, hk = h / G, i0 = task % nqb * BQ;
  const int64_t nq = a.T - i0 < BQ ? a.T - i0 : BQ;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x)
    qs[e] = ld<S, FT>(a.q, at4(a.qs, b, h, i0 + e / D, e % D)) * (FT)a.scale;
  FT m[RPW], l[RPW], acc[RPW][MR];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    m[r] = -INFINITY, l[r] = 0;
#pragma unroll
    for (int k = 0; k < MR; k++) acc[r][k] = 0;
  }
  const int64_t jlo = key_lo(a, i0), jhi = key_hi(a, i0 + nq - 1);
  for (int64_t j0 = jlo; j0 < jhi; j0 += KT) {
    const int64_t nk = jhi - j0 < KT ? jhi - j0 : KT;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < nk * D; e += blockDim.x) {
      int64_t c = e / D, d = e % D;
      ks[c * (D + 1) + d] = ld<S, FT>(a.k, at4(a.ks, b, hk, j0 + c, d));
      vs[c * D + d] = ld<S, FT>(a.v, at4(a.vs, b, hk, j0 + c, d));
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      const int64_t r = w * RPW + rr, i = i0 + r;
      if (r >= nq) break;
      FT sc = -INFINITY;
      if (lane < nk) {
        FT dot = 0;
        const FT *qr = qs + r * D, *kr = ks + lane * (D + 1);
        for (int64_t d = 0; d < D; d++) dot += qr[d] * kr[d];
        sc = banded<FT>(a, dot, b, h, i, j0 + lane);
      }
      FT mx = warp_max(sc), mnew = mx > m[rr] ? mx : m[rr];
      if (mnew == (FT)-INFINITY) continue; /* nothing visible yet: this row adds nothing */
      FT corr = exp(m[rr] - mnew), p = lane < nk ? exp(sc - mnew) : (FT)0;
      l[rr] = l[rr] * corr + kg_warp_sum(p);
      m[rr] = mnew;
#pragma unroll
      for (int k = 0; k < MR; k++) acc[rr][k] *= corr;
      for (int c = 0; c < nk; c++) {
        FT pc = __shfl_sync(0xffffffffu, p, c);
#pragma unroll
        for (int k = 0; k < MR; k++) {
          int64_t d = lane + 32 * k;
          if (d < D) acc[rr][k] += pc * vs[c * D + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    const int64_t r = w * RPW + rr, i = i0 + r;
    if (r >= nq) break;
    FT inv = l[rr] > 0 ? (FT)1 / l[rr] : (FT)0;
#pragma unroll
    for (int k = 0; k < MR; k++) {
      int64_t d = lane + 32 * k;
      if (d < D) kg_put((S *)a.out + at4(a.os, b, h, i, d), acc[rr][k] * inv);
    }
    if (lane == 0) ((FT *)a.lse)[(b * a.H + h) * a.T + i] = l[rr] > 0 ? m[rr] + log(l[rr]) : (FT)-INFINITY;
  }
}

/* ---- backward ------------------------------------------------------------------------------ */

/* delta_i = dO_i · O_i, a warp per row */
template <class FT, class S> __global__ void sdpa_delta_kernel(sdpa_args a, FT *delta) {
  int64_t nrow = a.B * a.H * a.T, lane = threadIdx.x & 31;
  for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < nrow;
       row += (int64_t)gridDim.x * (blockDim.x >> 5)) {
    int64_t b = row / (a.H * a.T), h = row / a.T % a.H, i = row % a.T;
    FT s = 0;
    for (int64_t d = lane; d < a.D; d += 32) s += kg_load<FT>(a.o, a.odt, at4(a.os, b, h, i, d)) * kg_load<FT>(a.g, a.gdt, at4(a.gs, b, h, i, d));
    s = kg_warp_sum(s);
    if (lane == 0) delta[row] = s;
  }
}

/* pass 1: dq for a (b, h, query tile) */
template <class FT, class S, int MR> __global__ void __launch_bounds__(WARPS * 32) sdpa_dq_kernel(sdpa_args a) {
  extern __shared__ unsigned char smem[];
  const int64_t D = a.D, G = a.H / a.Hkv, nqb = (a.T + BQ - 1) / BQ;
  FT *qs = (FT *)smem, *dos = qs + BQ * D, *ks = dos + BQ * D, *vs = ks + KT * (D + 1);
  const FT *lse = (const FT *)a.lse, *delta = (const FT *)a.delta;
  const int64_t task = blockIdx.x, b = task / (a.H * nqb), h = task / nqb % a.H, hk = h / G, i0 = task % nqb * BQ;
  const int64_t nq = a.T - i0 < BQ ? a.T - i0 : BQ, row0 = (b * a.H + h) * a.T + i0;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x) {
    qs[e] = ld<S, FT>(a.q, at4(a.qs, b, h, i0 + e / D, e % D)) * (FT)a.scale;
    dos[e] = kg_load<FT>(a.g, a.gdt, at4(a.gs, b, h, i0 + e / D, e % D));
  }
  FT acc[RPW][MR];
#pragma unroll
  for (int r = 0; r < RPW; r++)
#pragma unroll
    for (int k = 0; k < MR; k++) acc[r][k] = 0;
  const int64_t jlo = key_lo(a, i0), jhi = key_hi(a, i0 + nq - 1);
  for (int64_t j0 = jlo; j0 < jhi; j0 += KT) {
    const int64_t nk = jhi - j0 < KT ? jhi - j0 : KT;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < nk * D; e += blockDim.x) {
      int64_t c = e / D, d = e % D;
      ks[c * (D + 1) + d] = ld<S, FT>(a.k, at4(a.ks, b, hk, j0 + c, d));
      vs[c * (D + 1) + d] = ld<S, FT>(a.v, at4(a.vs, b, hk, j0 + c, d));
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      const int64_t r = w * RPW + rr, i = i0 + r;
      if (r >= nq) break;
      FT L = lse[row0 + r];
      if (L == (FT)-INFINITY) continue; /* the row sees no key: no gradient */
      FT ds = 0;
      if (lane < nk) {
        FT s = 0, dp = 0;
        const FT *qr = qs + r * D, *dr = dos + r * D, *kr = ks + lane * (D + 1), *vr = vs + lane * (D + 1);
        for (int64_t d = 0; d < D; d++) s += qr[d] * kr[d], dp += dr[d] * vr[d];
        FT p = exp(banded<FT>(a, s, b, h, i, j0 + lane) - L);
        ds = p * (dp - delta[row0 + r]);
      }
      for (int c = 0; c < nk; c++) {
        FT dc = __shfl_sync(0xffffffffu, ds, c);
#pragma unroll
        for (int k = 0; k < MR; k++) {
          int64_t d = lane + 32 * k;
          if (d < D) acc[rr][k] += dc * ks[c * (D + 1) + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    const int64_t r = w * RPW + rr;
    if (r >= nq) break;
#pragma unroll
    for (int k = 0; k < MR; k++) {
      int64_t d = lane + 32 * k;
      if (d < D) kg_put((S *)a.dq + at4(a.dqs, b, h, i0 + r, d), acc[rr][k] * (FT)a.scale);
    }
  }
}

/* pass 2: dk, dv for a (b, kv head, tile of KB keys) */
template <class FT, class S, int MR> __global__ void __launch_bounds__(WARPS * 32) sdpa_dkv_kernel(sdpa_args a) {
  extern __shared__ unsigned char smem[];
  const int64_t D = a.D, G = a.H / a.Hkv, nkb = (a.S + KB - 1) / KB;
  FT *ks = (FT *)smem, *vs = ks + KB * D, *qs = vs + KB * D, *dos = qs + QT * (D + 1), *Ls = dos + QT * (D + 1);
  FT *dls = Ls + QT;
  const FT *lse = (const FT *)a.lse, *delta = (const FT *)a.delta;
  const int64_t task = blockIdx.x, b = task / (a.Hkv * nkb), hk = task / nkb % a.Hkv, j0 = task % nkb * KB;
  const int64_t nk = a.S - j0 < KB ? a.S - j0 : KB;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int64_t e = threadIdx.x; e < nk * D; e += blockDim.x) {
    ks[e] = ld<S, FT>(a.k, at4(a.ks, b, hk, j0 + e / D, e % D));
    vs[e] = ld<S, FT>(a.v, at4(a.vs, b, hk, j0 + e / D, e % D));
  }
  FT ak[KPW][MR], av[KPW][MR];
#pragma unroll
  for (int r = 0; r < KPW; r++)
#pragma unroll
    for (int k = 0; k < MR; k++) ak[r][k] = av[r][k] = 0;
  /* queries that see some key of [j0, j0 + nk) */
  int64_t ilo = a.causal ? j0 - a.off : 0, ihi = a.T;
  if (a.window > 0 && j0 + nk - 1 - a.off + a.window < ihi) ihi = j0 + nk - 1 - a.off + a.window;
  if (ilo < 0) ilo = 0;
  for (int64_t h = hk * G; h < (hk + 1) * G; h++)
    for (int64_t i0 = ilo; i0 < ihi; i0 += QT) {
      const int64_t nq = ihi - i0 < QT ? ihi - i0 : QT, row0 = (b * a.H + h) * a.T + i0;
      __syncthreads();
      for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x) {
        int64_t r = e / D, d = e % D;
        qs[r * (D + 1) + d] = ld<S, FT>(a.q, at4(a.qs, b, h, i0 + r, d)) * (FT)a.scale;
        dos[r * (D + 1) + d] = kg_load<FT>(a.g, a.gdt, at4(a.gs, b, h, i0 + r, d));
      }
      for (int64_t r = threadIdx.x; r < nq; r += blockDim.x) Ls[r] = lse[row0 + r], dls[r] = delta[row0 + r];
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < KPW; kk++) {
        const int64_t jj = w * KPW + kk, j = j0 + jj;
        if (jj >= nk) break;
        FT p = 0, ds = 0;
        if (lane < nq && Ls[lane] != (FT)-INFINITY) {
          FT s = 0, dp = 0;
          const FT *qr = qs + lane * (D + 1), *dr = dos + lane * (D + 1), *kr = ks + jj * D, *vr = vs + jj * D;
          for (int64_t d = 0; d < D; d++) s += qr[d] * kr[d], dp += dr[d] * vr[d];
          p = exp(banded<FT>(a, s, b, h, i0 + lane, j) - Ls[lane]);
          ds = p * (dp - dls[lane]);
        }
        for (int c = 0; c < nq; c++) {
          FT pc = __shfl_sync(0xffffffffu, p, c), dc = __shfl_sync(0xffffffffu, ds, c);
#pragma unroll
          for (int k = 0; k < MR; k++) {
            int64_t d = lane + 32 * k;
            if (d < D) av[kk][k] += pc * dos[c * (D + 1) + d], ak[kk][k] += dc * qs[c * (D + 1) + d];
          }
        }
      }
    }
#pragma unroll
  for (int kk = 0; kk < KPW; kk++) {
    const int64_t jj = w * KPW + kk;
    if (jj >= nk) break;
#pragma unroll
    for (int k = 0; k < MR; k++) {
      int64_t d = lane + 32 * k;
      if (d < D) {
        kg_put((S *)a.dk + at4(a.dks, b, hk, j0 + jj, d), ak[kk][k]);
        kg_put((S *)a.dv + at4(a.dvs, b, hk, j0 + jj, d), av[kk][k]);
      }
    }
  }
}

/* ---- launchers ------------------------------------------------------------------------------ */

static void strides4(int64_t *dst, const int64_t *src) {
  for (int i = 0; i < 4; i++) dst[i] = src[i];
}

static kg_status plan(sdpa_args *a, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                      const kg_sdpa_params *p, const char *op) {
  *a = sdpa_args{};
  a->B = q->shape[0], a->H = q->shape[1], a->Hkv = k->shape[1], a->T = q->shape[2], a->S = k->shape[2];
  a->D = q->shape[3], a->off = a->S - a->T, a->window = p->window, a->causal = p->causal;
  a->scale = p->scale == 0 ? 1.0 / sqrt((double)a->D) : p->scale;
  a->q = (const char *)kg_data(q), a->k = (const char *)kg_data(k), a->v = (const char *)kg_data(v);
  strides4(a->qs, q->stride), strides4(a->ks, k->stride), strides4(a->vs, v->stride);
  if (mask) {
    a->has_mask = true;
    a->m = (const char *)kg_data(mask), a->mdt = mask->dtype;
    for (int i = 0; i < 4; i++) { /* broadcast strides to [B, H, T, S]: 0 on size-1 or missing dims */
      int j = i - (4 - mask->ndim);
      a->ms[i] = (j < 0 || mask->shape[j] == 1) ? 0 : mask->stride[j];
    }
  }
  /* the router sends D > 256 to the math route; reaching here with one is a bug */
  if (a->D > KG_SDPA_FLASH_MAX_D && a->B * a->H * a->T * a->S > 0)
    return kg_error(KG_ERR_SHAPE, op, "head dim %lld reached the flash kernel (D <= %d); the router should have sent it "
                    "to the math route", (long long)a->D, KG_SDPA_FLASH_MAX_D);
  return KG_OK;
}

/* launches kernel K<FT, S, MR> with MR picked from D and `smem` bytes of dynamic shared memory */
#define SDPA_LAUNCH(KERN, FT, S, grid, smem, s, a)                                                    \
  do {                                                                                                \
    if ((a).D <= 64) {                                                                                \
      cudaFuncSetAttribute(KERN<FT, S, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem)); \
      KERN<FT, S, 2><<<grid, WARPS * 32, smem, s>>>(a);                                               \
    } else if ((a).D <= 128) {                                                                        \
      cudaFuncSetAttribute(KERN<FT, S, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem)); \
      KERN<FT, S, 4><<<grid, WARPS * 32, smem, s>>>(a);                                               \
    } else {                                                                                          \
      cudaFuncSetAttribute(KERN<FT, S, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem)); \
      KERN<FT, S, 8><<<grid, WARPS * 32, smem, s>>>(a);                                               \
    }                                                                                                 \
  } while (0)

/* runs F(FT, S) for the attention dtypes */
#define SDPA_DTYPES(op, dt, F)                                                                        \
  switch (dt) {                                                                                       \
  case KG_F32: F(float, float); break;                                                                \
  case KG_BF16: F(float, kg_bf16); break;                                                             \
  case KG_F16: F(float, kg_f16); break;                                                               \
  case KG_F64: F(double, double); break;                                                              \
  default: return kg_error(KG_ERR_TYPE, op, "dtype %s not supported", kg_dtype_info[dt].name);        \
  }

static kg_status fill(kg_tensor *t, double v, const char *op) {
  kg_cuda_ew_args a = {KG_EW_FILL, 0, v, NAN, 0, 0, 0};
  return kg_numel(t) ? kg_cuda_ew(op, a, t, 0, NULL) : KG_OK;
}

/* in: q, k, v, mask (or NULL); out: out [B, H, T, D], lse [B, H, T] (f32, f64 for f64) */
extern "C" kg_status kg_cuda_scaled_dot_product_attention(const kg_op_call *c) {
  const char *op = "scaled_dot_product_attention";
  const kg_tensor *q = c->in[0];
  sdpa_args a;
  KG_TRY(plan(&a, q, c->in[1], c->in[2], c->nin > 3 ? c->in[3] : NULL, (const kg_sdpa_params *)c->params, op));
  if (a.B * a.H * a.T == 0) return KG_OK;
  if (a.D == 0) return fill(c->out[1], a.S ? log((double)a.S) : -INFINITY, op); /* all scores 0 */
  if (a.S == 0) { /* no keys: zeros and lse -inf (any D: the router sends D > 256 here only then) */
    KG_TRY(fill(c->out[0], 0, op));
    return fill(c->out[1], -INFINITY, op);
  }
  bool done = false; /* cuDNN's fused attention first, where it applies (sdpa_cudnn.cu) */
  KG_TRY(kg_cudnn_sdpa_forward(q, c->in[1], c->in[2], a.has_mask ? c->in[3] : NULL, (const kg_sdpa_params *)c->params,
                               c->out[0], c->out[1], &done));
  if (done) return KG_OK;
  kg_flop_add((uint64_t)(4 * a.B * a.H * a.T * a.S * a.D));
  a.out = (char *)kg_data(c->out[0]), a.lse = (const char *)kg_data(c->out[1]);
  strides4(a.os, c->out[0]->stride);
  int dev = c->out[0]->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  unsigned grid = (unsigned)(a.B * a.H * ((a.T + BQ - 1) / BQ));
#define FWD(FT, S)                                                                                    \
  {                                                                                                   \
    size_t smem = (size_t)kg_sdpa_flash_smem_fwd(sizeof(FT), a.D);                                    \
    SDPA_LAUNCH(sdpa_fwd_kernel, FT, S, grid, smem, s, a);                                            \
  }
  SDPA_DTYPES(op, q->dtype, FWD)
#undef FWD
  return kg_cuda_check(op, dev);
}

/* in: q, k, v, mask, out, lse, dout; out: dq, dk, dv */
extern "C" kg_status kg_cuda_sdpa_backward(const kg_op_call *c) {
  const char *op = "sdpa_backward";
  const kg_tensor *q = c->in[0];
  sdpa_args a;
  KG_TRY(plan(&a, q, c->in[1], c->in[2], c->in[3], (const kg_sdpa_params *)c->params, op));
  if (a.B * a.H * a.T * a.D == 0 || a.S == 0) {
    for (int i = 0; i < 3; i++) KG_TRY(fill(c->out[i], 0, op));
    return KG_OK;
  }
  kg_flop_add((uint64_t)(10 * a.B * a.H * a.T * a.S * a.D));
  a.o = (const char *)kg_data(c->in[4]), a.lse = (const char *)kg_data(c->in[5]), a.g = (const char *)kg_data(c->in[6]);
  strides4(a.os, c->in[4]->stride), strides4(a.gs, c->in[6]->stride);
  a.odt = c->in[4]->dtype, a.gdt = c->in[6]->dtype;
  a.dq = (char *)kg_data(c->out[0]), a.dk = (char *)kg_data(c->out[1]), a.dv = (char *)kg_data(c->out[2]);
  strides4(a.dqs, c->out[0]->stride), strides4(a.dks, c->out[1]->stride), strides4(a.dvs, c->out[2]->stride);
  int dev = c->out[0]->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  int64_t nrow = a.B * a.H * a.T;
  kg_cuda_buf delta;
  bool wide = q->dtype == KG_F64;
  KG_TRY(delta.alloc((wide ? 8 : 4) * (size_t)nrow, dev, op));
  a.delta = (const char *)delta.p;
  unsigned g1 = (unsigned)(a.B * a.H * ((a.T + BQ - 1) / BQ)), g2 = (unsigned)(a.B * a.Hkv * ((a.S + KB - 1) / KB));
#define BWD(FT, S)                                                                                    \
  {                                                                                                   \
    sdpa_delta_kernel<FT, S><<<kg_grid((nrow + 7) / 8), 256, 0, s>>>(a, (FT *)delta.p);              \
    size_t smem1 = (size_t)kg_sdpa_flash_smem_dq(sizeof(FT), a.D);                                    \
    SDPA_LAUNCH(sdpa_dq_kernel, FT, S, g1, smem1, s, a);                                              \
    size_t smem2 = (size_t)kg_sdpa_flash_smem_dkv(sizeof(FT), a.D);                                   \
    SDPA_LAUNCH(sdpa_dkv_kernel, FT, S, g2, smem2, s, a);                                             \
  }
  SDPA_DTYPES(op, q->dtype, BWD)
#undef BWD
  return kg_cuda_check(op, dev);
}

/* ---- rope ------------------------------------------------------------------------------------ */

/* x [..., T, D] contiguous; thread per (row, i < D/2); angle pos · inv_freq[i] (freq NULL:
 * base^(-2i/D)) in double; cos and sin times scale */
template <class FT>
__global__ void rope_kernel(const char *x, int xdt, char *y, int ydt, const char *pos, int pdt, int pnd,
                            int64_t ps0, int64_t ps1, int64_t nrow, int64_t T, int64_t D, int64_t Bp,
                            int64_t rows_per_b, double base, const char *freq, int fdt, int64_t fs,
                            double scale) {
  int64_t half = D / 2;
  KG_CUDA_FOR(e, nrow * half) {
    int64_t r = e / half, i = e - r * half;
    int64_t bt = (r / rows_per_b % Bp) * T + r % T;
    int64_t pi = (bt / T) * ps0 * (pnd == 2) + (bt % T) * ps1;
    double f = freq ? kg_load<double>(freq, fdt, i * fs) : pow(base, -2.0 * (double)i / (double)D);
    double th = kg_load<double>(pos, pdt, pi) * f;
    FT cs = (FT)(cos(th) * scale), sn = (FT)(sin(th) * scale);
    int64_t o1 = r * D + i, o2 = o1 + half;
    FT x1 = kg_load<FT>(x, xdt, o1), x2 = kg_load<FT>(x, xdt, o2);
    kg_store(y, ydt, o1, x1 * cs - x2 * sn);
    kg_store(y, ydt, o2, x2 * cs + x1 * sn);
  }
}

extern "C" kg_status kg_cuda_rope(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *pos = c->in[1], *freq = c->in[2];
  kg_tensor *y = c->out[0];
  const kg_rope_params *p = (const kg_rope_params *)c->params;
  const char *fd = freq ? (const char *)kg_data(freq) : NULL;
  int fdt = freq ? (int)freq->dtype : 0;
  int64_t fs = freq ? freq->stride[0] : 0;
  int64_t D = x->shape[x->ndim - 1], T = x->shape[x->ndim - 2], half = D / 2;
  int64_t nrow = D ? kg_numel(x) / D : 0, Bp = pos->ndim == 2 ? pos->shape[0] : 1;
  int64_t rows_per_b = Bp > 1 ? nrow / Bp : nrow;
  if (nrow * half == 0) return KG_OK;
  int dev = y->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
  int64_t ps0 = pos->stride[0], ps1 = pos->stride[pos->ndim - 1];
  if (rows_per_b < 1) rows_per_b = 1;
  if (x->dtype == KG_F64)
    rope_kernel<double><<<kg_cuda_blocks(nrow * half), KG_CUDA_THREADS, 0, s>>>(
        (const char *)kg_data(x), x->dtype, (char *)kg_data(y), y->dtype, (const char *)kg_data(pos), pos->dtype,
        pos->ndim, ps0, ps1, nrow, T, D, Bp, rows_per_b, p->base, fd, fdt, fs, p->scale);
  else
    rope_kernel<float><<<kg_cuda_blocks(nrow * half), KG_CUDA_THREADS, 0, s>>>(
        (const char *)kg_data(x), x->dtype, (char *)kg_data(y), y->dtype, (const char *)kg_data(pos), pos->dtype,
        pos->ndim, ps0, ps1, nrow, T, D, Bp, rows_per_b, p->base, fd, fdt, fs, p->scale);
  return kg_cuda_check("rope", dev);
}
