/* sdpa_cudnn.cu — scaled_dot_product_attention forward through cuDNN's fused flash attention
 * (cuDNN graph API, the C backend: cudnnBackendCreateDescriptor / SetAttribute / Finalize), with
 * keng's own flash kernel (attention.cu) as the fallback for everything else.
 *
 * The operation graph is the pattern cuDNN's fused-attention engines recognise:
 *   S  = Q · Kᵀ                       (matmul, f32; Kᵀ is K [B, Hkv, S, D] read with dims 2, 3 swapped)
 *   S  = S · scale                    (pointwise MUL, scale a by-value f32 scalar)
 *   causal: row = gen_index(S, 2) [+ (S - T) by value], col = gen_index(S, 3),
 *           S = row >= col ? S : lowest   (CMP_GE, BINARY_SELECT: bottom-right alignment as keng)
 *   M = max_j S, E = exp(S - M), Z = Σ_j E            (reductions over the key axis)
 *   lse = M + log Z  -> our lse output [B, H, T] f32  (cuDNN's "stats"; the backward reads it)
 *   P = E / Z (in the io dtype), O = P · V            (matmul, written to out [B, H, T, D])
 * GQA is the matmuls' head broadcast (Hkv divides H). Which calls may come here, and the plan cache
 * (one plan per shape, strides, dtype, causal and device; a failed build is remembered), are in
 * sdpa_plan.h. Anything unsupported, any failed build or launch: *done = false, and the caller runs
 * the flash kernel — silently, counted in kg_sdpa_stats (keng.backends.cudnn_sdpa_stats).
 * Plans are never built during a CUDA Graph capture (a cached one is launched there as usual).
 * Backward stays on keng's kernel (it recomputes P from q, k and this lse).
 * Intermediate types follow cudnn-frontend's composite SDPA (its flash-attention node and
 * composite softmax): S, the scaled and masked scores, max, exp, sum and the stats in f32 (the
 * graph's intermediate type), and P = E / Z set to the io dtype before the second matmul — the
 * frontend does the same ("bmm2 aType as i/o type", a requirement of the backend's engines). */
#include "util.cuh"
#include "sdpa_plan.h"

#include <float.h>
#include <pthread.h>

/* reason a call is not taken; 0 in the stats counts "no plan may be built during a capture" */
static void fallback(int reason) { kg_sdpa_stat_add(4, reason); }

/* the compute capability (major*10 + minor) and the opt-in shared memory per block of a device,
 * read once; zeros when they cannot be read */
static void device_caps(int dev, int *sm, int64_t *smem) {
  static int cc[16], shm[16]; /* 0 = not read yet; a racing second read stores the same values */
  *sm = 0, *smem = 0;
  if (dev < 0 || dev >= 16) return;
  if (!cc[dev]) {
    int major = 0, minor = 0, optin = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    shm[dev] = optin;
    cc[dev] = major * 10 + minor;
  }
  *sm = cc[dev], *smem = shm[dev];
}

#ifndef KENG_HAVE_CUDNN

extern "C" void kg_cuda_sdpa_caps(int device, int *sm, int *cudnn_version, int64_t *smem) {
  device_caps(device, sm, smem);
  *cudnn_version = 0; /* no cuDNN: the router never picks it */
}

extern "C" kg_status kg_cudnn_sdpa_forward(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v,
                                           const kg_tensor *mask, const kg_sdpa_params *p, kg_tensor *out,
                                           kg_tensor *lse, bool *done) {
  *done = false;
  fallback(KG_SDPA_OFF);
  return KG_OK;
}

#else
#include <cudnn.h>

typedef cudnnBackendDescriptor_t bdesc;

/* the loaded library's version, which is what decides what its engines take */
extern "C" void kg_cuda_sdpa_caps(int device, int *sm, int *cudnn_version, int64_t *smem) {
  device_caps(device, sm, smem);
  *cudnn_version = (int)cudnnGetVersion();
}

/* ---- descriptors: a small arena that frees everything it made ------------------------------ */

#define MAX_DESCS 80
struct arena {
  bdesc d[MAX_DESCS];
  int n;
  bool bad;   /* some create/set/finalize failed */
  bdesc plan; /* the execution plan built from the descriptors (one of d) */
  arena() : n(0), bad(false), plan(NULL) {}
  ~arena() {
    for (int i = 0; i < n; i++) cudnnBackendDestroyDescriptor(d[i]);
  }
  bdesc make(cudnnBackendDescriptorType_t t) {
    if (bad || n == MAX_DESCS) return bad = true, (bdesc)NULL;
    bdesc x = NULL;
    if (cudnnBackendCreateDescriptor(t, &x) != CUDNN_STATUS_SUCCESS) return bad = true, (bdesc)NULL;
    return d[n++] = x;
  }
  void set(bdesc x, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t count, const void *v) {
    if (!bad && (!x || cudnnBackendSetAttribute(x, a, t, count, v) != CUDNN_STATUS_SUCCESS)) bad = true;
  }
  void finalize(bdesc x) {
    if (!bad && (!x || cudnnBackendFinalize(x) != CUDNN_STATUS_SUCCESS)) bad = true;
  }
};

/* the handle attributes are marked deprecated in cuDNN 9.x but remain how a graph and a plan
 * learn their handle in every 9.x release; named by value to keep the build free of warnings */
#define ATTR_OPGRAPH_HANDLE ((cudnnBackendAttributeName_t)800)
#define ATTR_PLAN_HANDLE ((cudnnBackendAttributeName_t)400)

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_LOWEST, UID_OFFSET, UID_VIRTUAL = 100 };

struct graph_builder {
  arena &A;
  int64_t next_uid;
  bdesc ops[32];
  int nops;
  graph_builder(arena &a) : A(a), next_uid(UID_VIRTUAL), nops(0) {}

  bdesc tensor(int64_t uid, cudnnDataType_t dt, const int64_t *dims, const int64_t *strides, bool virt, bool by_value) {
    bdesc t = A.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    A.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    A.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    A.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    A.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    A.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (virt) A.set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) A.set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    A.finalize(t);
    return t;
  }
  /* a virtual (intermediate) tensor of dims, packed */
  bdesc virt(cudnnDataType_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t dims[4] = {d0, d1, d2, d3}, st[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
    return tensor(next_uid++, dt, dims, st, true, false);
  }
  bdesc scalar(int64_t uid, cudnnDataType_t dt) {
    int64_t one[4] = {1, 1, 1, 1};
    return tensor(uid, dt, one, one, false, true);
  }
  void add_op(bdesc op) {
    A.finalize(op);
    if (nops < 32) ops[nops++] = op;
    else A.bad = true;
  }
  /* y = mode(x[, b[, t]]) computed in `prec` */
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, bdesc x, bdesc b, bdesc t, bdesc y, int64_t axis = -1) {
    bdesc pw = A.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    A.set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    A.set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) A.set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    A.finalize(pw);
    bdesc op = A.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    A.set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    A.set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) A.set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) A.set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    A.set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(op);
  }
  void reduction(cudnnReduceTensorOp_t mode, bdesc x, bdesc y) {
    bdesc r = A.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    A.set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    A.set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    A.finalize(r);
    bdesc op = A.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    A.set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    A.set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    A.set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    add_op(op);
  }
  void matmul(bdesc a, bdesc b, bdesc c) {
    bdesc m = A.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    A.set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    A.finalize(m);
    bdesc op = A.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    A.set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    A.set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    A.set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    A.set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    add_op(op);
  }
};

/* Builds the operation graph of the key and the first execution plan cuDNN's heuristics offer
 * that finalizes. Returns the descriptors with the plan among them (the graph, engine configs
 * and tensors stay alive as long as the plan: the caller deletes the arena when the plan is
 * evicted) or NULL. */
static bool try_build(cudnnHandle_t h, const kg_sdpa_key *k, int64_t *workspace, arena &A);
static arena *build_plan(cudnnHandle_t h, const kg_sdpa_key *k, int64_t *workspace) {
  arena *owned = new arena;
  arena &A = *owned;
  if (!try_build(h, k, workspace, A)) {
    delete owned;
    return NULL;
  }
  return owned;
}

static bool try_build(cudnnHandle_t h, const kg_sdpa_key *k, int64_t *workspace, arena &A) {
  graph_builder g(A);
  const cudnnDataType_t io = k->dtype == KG_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
  const int64_t B = k->B, H = k->H, Hkv = k->Hkv, T = k->T, S = k->S, D = k->D;
  int64_t qd[4] = {B, H, T, D}, ktd[4] = {B, Hkv, D, S}, vd[4] = {B, Hkv, S, D};
  int64_t kts[4] = {k->ks[0], k->ks[1], k->ks[3], k->ks[2]};
  int64_t statd[4] = {B, H, T, 1}, stats_st[4] = {H * T, T, 1, 1};
  bdesc Q = g.tensor(UID_Q, io, qd, k->qs, false, false);
  bdesc KT = g.tensor(UID_K, io, ktd, kts, false, false);
  bdesc V = g.tensor(UID_V, io, vd, k->vs, false, false);
  bdesc O = g.tensor(UID_O, io, qd, k->os, false, false);
  bdesc STATS = g.tensor(UID_STATS, f32, statd, stats_st, false, false);
  bdesc SCALE = g.scalar(UID_SCALE, f32);

  bdesc s0 = g.virt(f32, B, H, T, S);
  g.matmul(Q, KT, s0);
  bdesc s = g.virt(f32, B, H, T, S);
  g.pointwise(CUDNN_POINTWISE_MUL, f32, s0, SCALE, NULL, s);
  if (k->causal) {
    bdesc row = g.virt(i32, B, H, T, S), col = g.virt(i32, B, H, T, S);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s, NULL, NULL, row, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, i32, s, NULL, NULL, col, 3);
    if (S != T) { /* bottom-right: query i sees keys j <= i + (S - T) */
      bdesc shifted = g.virt(i32, B, H, T, S);
      g.pointwise(CUDNN_POINTWISE_ADD, i32, row, g.scalar(UID_OFFSET, i32), NULL, shifted);
      row = shifted;
    }
    bdesc keep = g.virt(b8, B, H, T, S), masked = g.virt(f32, B, H, T, S);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, b8, row, col, NULL, keep);
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, f32, s, g.scalar(UID_LOWEST, f32), keep, masked);
    s = masked;
  }
  bdesc mx = g.virt(f32, B, H, T, 1), sub = g.virt(f32, B, H, T, S), e = g.virt(f32, B, H, T, S);
  bdesc z = g.virt(f32, B, H, T, 1), lz = g.virt(f32, B, H, T, 1), p = g.virt(io, B, H, T, S);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, mx);
  g.pointwise(CUDNN_POINTWISE_SUB, f32, s, mx, NULL, sub);
  g.pointwise(CUDNN_POINTWISE_EXP, f32, sub, NULL, NULL, e);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g.pointwise(CUDNN_POINTWISE_LOG, f32, z, NULL, NULL, lz);
  g.pointwise(CUDNN_POINTWISE_ADD, f32, mx, lz, NULL, STATS);
  g.pointwise(CUDNN_POINTWISE_DIV, f32, e, z, NULL, p);
  g.matmul(p, V, O);
  if (A.bad) return false;

  bdesc graph = A.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  A.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
  A.set(graph, ATTR_OPGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  A.finalize(graph);
  bdesc heur = A.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  A.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  A.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  A.finalize(heur);
  enum { NCFG = 8 };
  bdesc cfgs[NCFG];
  for (int i = 0; i < NCFG; i++) cfgs[i] = A.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (A.bad) return false;
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, NCFG, &got, cfgs) !=
      CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < got && i < NCFG; i++) { /* the first configuration that finalizes */
    bdesc plan = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) return false;
    int64_t ws = 0, n = 0;
    if (cudnnBackendSetAttribute(plan, ATTR_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &cfgs[i]) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) ==
            CUDNN_STATUS_SUCCESS &&
        A.n < MAX_DESCS) {
      *workspace = ws;
      A.d[A.n++] = plan; /* destroyed with the rest */
      A.plan = plan;
      return true;
    }
    cudnnBackendDestroyDescriptor(plan);
  }
  return false;
}

/* ---- per-device handle and the plan cache --------------------------------------------------- */

#define MAX_DEV 16
static cudnnHandle_t handles[MAX_DEV];
static kg_sdpa_cache cache;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* the plan for key (built now unless capturing); NULL with *reason set when there is none */
static bdesc plan_for(int dev, const kg_sdpa_key *key, int64_t *ws, cudnnHandle_t *h, int *reason) {
  bool capturing = kg_cuda_capturing(dev);
  arena *plan = NULL;
  pthread_mutex_lock(&lock);
  if (!handles[dev] && !capturing && cudnnCreate(&handles[dev]) != CUDNN_STATUS_SUCCESS) handles[dev] = NULL;
  *h = handles[dev];
  kg_sdpa_entry *e = kg_sdpa_cache_find(&cache, key);
  if (e) {
    plan = e->ok ? (arena *)e->plan : NULL, *ws = e->workspace;
    *reason = KG_SDPA_OK;
  } else if (capturing || !*h) {
    *reason = 0; /* never build during a capture */
  } else {
    cudnnSetStream(*h, kg_cuda_stream(dev));
    plan = build_plan(*h, key, ws);
    cudaGetLastError(); /* a refused build may leave a (non-sticky) runtime error set: clear it */
    kg_sdpa_stat_add(plan ? 1 : 2, 0);
    void *old = kg_sdpa_cache_put(&cache, key, plan, plan ? *ws : 0, plan != NULL);
    delete (arena *)old; /* a CUDA Graph that launched it holds its own copy of the kernels */
    *reason = KG_SDPA_OK;
  }
  pthread_mutex_unlock(&lock);
  return plan ? plan->plan : NULL;
}

static void strides4(int64_t *dst, const int64_t *src) {
  for (int i = 0; i < 4; i++) dst[i] = src[i];
}

extern "C" kg_status kg_cudnn_sdpa_forward(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v,
                                           const kg_tensor *mask, const kg_sdpa_params *p, kg_tensor *out,
                                           kg_tensor *lse, bool *done) {
  *done = false;
  kg_sdpa_call c;
  memset(&c, 0, sizeof c);
  c.dev = out->device.index, c.dtype = q->dtype, c.is_half = q->dtype == KG_BF16 || q->dtype == KG_F16;
  c.has_mask = mask != NULL, c.causal = p->causal, c.window = p->window;
  c.B = q->shape[0], c.H = q->shape[1], c.Hkv = k->shape[1], c.T = q->shape[2], c.S = k->shape[2], c.D = q->shape[3];
  strides4(c.qs, q->stride), strides4(c.ks, k->stride), strides4(c.vs, v->stride), strides4(c.os, out->stride);
  c.qp = (uintptr_t)kg_data(q), c.kp = (uintptr_t)kg_data(k), c.vp = (uintptr_t)kg_data(v), c.op = (uintptr_t)kg_data(out);
  c.elem = kg_elem_size(q);
  int64_t smem = 0;
  kg_cuda_sdpa_caps(c.dev, &c.sm, &c.cudnn_version, &smem);
  kg_sdpa_reason why = kg_sdpa_check(&c, kg_cudnn_sdpa());
  if (why == KG_SDPA_OK && (!kg_is_contiguous(lse) || lse->dtype != KG_F32)) why = KG_SDPA_LAYOUT;
  if (why == KG_SDPA_OK && (c.dev < 0 || c.dev >= MAX_DEV)) why = KG_SDPA_OFF;
  if (why != KG_SDPA_OK) {
    fallback(why);
    return KG_OK;
  }
  kg_cuda_stream(c.dev); /* makes the device current: cudnnCreate binds its handle to it */
  kg_sdpa_key key = kg_sdpa_key_of(&c);
  int64_t ws = 0;
  cudnnHandle_t h = NULL;
  int reason = 0;
  bdesc plan = plan_for(c.dev, &key, &ws, &h, &reason);
  if (!plan) {
    fallback(reason);
    return KG_OK;
  }
  kg_cuda_buf work;
  if (ws > 0 && work.alloc((size_t)ws, c.dev, "scaled_dot_product_attention")) {
    fallback(KG_SDPA_OK);
    return KG_OK; /* no memory for cuDNN's workspace: the flash kernel needs none */
  }
  float scale = (float)(p->scale == 0 ? 1.0 / sqrt((double)c.D) : p->scale), lowest = -FLT_MAX;
  int32_t offset = (int32_t)(c.S - c.T);
  int64_t uids[8] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_LOWEST, UID_OFFSET};
  void *ptrs[8] = {(void *)kg_data(q), (void *)kg_data(k), (void *)kg_data(v), kg_data(out), kg_data(lse),
                   &scale, &lowest, &offset};
  /* by-value tensors the graph does not have must not be in the pack */
  int64_t n = c.causal ? (c.S != c.T ? 8 : 7) : 6;
  cudnnStatus_t st;
  bdesc pack = NULL;
  st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &work.p);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) {
    pthread_mutex_lock(&lock); /* the handle's stream is per device; one launch at a time */
    cudnnSetStream(h, kg_cuda_stream(c.dev));
    st = cudnnBackendExecute(h, plan, pack);
    pthread_mutex_unlock(&lock);
  }
  if (pack) cudnnBackendDestroyDescriptor(pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudaGetLastError();
    kg_sdpa_stat_add(3, 0);
    return KG_OK; /* the flash kernel rewrites both outputs */
  }
  kg_flop_add((uint64_t)(4 * c.B * c.H * c.T * c.S * c.D));
  kg_sdpa_stat_add(0, 0);
  *done = true;
  return kg_cuda_check("scaled_dot_product_attention", c.dev);
}

#endif
