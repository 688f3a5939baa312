/* matmul.cu — batched GEMM through cuBLASLt (cublasLtMatmul), with cuBLAS
 * (cublasGemmStridedBatchedEx) as the fallback.
 *
 * a: [..., N, K] @ b: [..., K, M] -> out: [..., N, M] (contiguous, batch dims broadcast).
 * cuBLAS is column-major, so the row-major product C = A B is computed as Cᵀ = Bᵀ Aᵀ. An
 * operand is passed as it lies when its matrix has a unit stride on one dim and its batch
 * offsets are one stride apart; otherwise (or when its dtype is not the output's) it is first
 * packed contiguous in the output's dtype by the copy kernel. A batch whose right operand is
 * shared (stride 0, e.g. x[B, T, D] @ W[D, O]) and whose left rows are evenly spaced is folded
 * into one GEMM of B·T rows.
 *
 * cuBLASLt runs f32 / bf16 / f16 with f32 accumulation (CUBLAS_COMPUTE_32F, or
 * CUBLAS_COMPUTE_32F_FAST_TF32 for f32 when kg_allow_tf32() — keng.backends.allow_tf32), batched
 * and strided layouts, a fixed 32 MiB workspace per device (cudaMalloc'd once, so a CUDA Graph
 * capture never allocates for it) and the heuristic's first algorithm cached per shape, layout,
 * alignment and epilogue. The fallback takes f64, broadcast batches that do not fold (a stride
 * of 0 with more than one batch), and any case cuBLASLt declines; it uses the same workspace.
 *
 * gemm_lt also serves fused epilogues (bias, bias + GELU): the `linear` op's kernel
 * (kg_cuda_linear below) computes y = x wᵀ + b in one call with the BIAS epilogue, in training
 * and inference alike (its backward is built from matmul in engine/ops/matmul.c);
 * kg_cuda_linear_fused offers bias + GELU (cuBLASLt's tanh approximation) too. */
#include "cuda.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <pthread.h>
#include <string.h>

#define MAX_DEV 16
#define WS_BYTES ((size_t)32 << 20)

struct blas_dev {
  cublasHandle_t h;
  cublasLtHandle_t lt;
  void *ws;
};
static blas_dev devs[MAX_DEV];
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

/* the device's handles and workspace, created on first use (never during a capture) */
static kg_status get_blas(int device, const char *op, blas_dev **out) {
  if (device < 0 || device >= MAX_DEV) return kg_error(KG_ERR_DEVICE, op, "cuda:%d out of range", device);
  cudaStream_t s = kg_cuda_stream(device);
  blas_dev *d = &devs[device];
  pthread_mutex_lock(&handle_lock);
  kg_status st = KG_OK;
  if (!d->ws) {
    if (kg_cuda_capturing(device))
      st = kg_error(KG_ERR_DEVICE, op, "first matmul on cuda:%d inside a CUDA graph capture: run the step once "
                    "before capturing", device);
    else if (cudaMalloc(&d->ws, WS_BYTES) != cudaSuccess)
      d->ws = NULL, st = kg_cuda_err(cudaGetLastError(), op, "cudaMalloc of the cuBLAS workspace");
  }
  if (!st && !d->h) {
    cublasStatus_t cs = cublasCreate(&d->h);
    if (cs != CUBLAS_STATUS_SUCCESS) {
      d->h = NULL, st = kg_error(KG_ERR_DEVICE, op, "cublasCreate: %s", cublasGetStatusString(cs));
    } else { /* the stream is fixed per device; set it once: cublasSetStream resets the workspace */
      cublasSetStream(d->h, s);
      cublasSetWorkspace(d->h, d->ws, WS_BYTES);
    }
  }
  if (!st && !d->lt) {
    cublasStatus_t cs = cublasLtCreate(&d->lt);
    if (cs != CUBLAS_STATUS_SUCCESS) d->lt = NULL, st = kg_error(KG_ERR_DEVICE, op, "cublasLtCreate: %s", cublasGetStatusString(cs));
  }
  pthread_mutex_unlock(&handle_lock);
  KG_TRY(st);
  *out = d;
  return KG_OK;
}

/* ---- cuBLASLt: one column-major GEMM D[m, n] = op(A)[m, k] · op(B)[k, n] (+ epilogue) -------- */

struct lt_key {
  int dev, dt, tf32, ta, tb, epi;
  int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
  int align[4]; /* A, B, D, bias pointer alignment (bytes, up to 16) */
};
struct lt_entry {
  lt_key key;
  cublasLtMatmulAlgo_t algo;
  bool ok; /* false: cuBLASLt offers nothing, use the fallback */
  bool used;
};
#define LT_CACHE 256
static lt_entry lt_cache[LT_CACHE];
static int lt_next;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static int alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  return !p ? 16 : a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : a % 4 == 0 ? 4 : a % 2 == 0 ? 2 : 1;
}

struct lt_descs {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  lt_descs() : op(NULL), a(NULL), b(NULL), d(NULL) {}
  ~lt_descs() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

static bool layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                   int64_t stride) {
  if (cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld) != CUBLAS_STATUS_SUCCESS) return false;
  if (batch > 1) {
    int32_t bc = (int32_t)batch;
    if (cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) !=
            CUBLAS_STATUS_SUCCESS)
      return false;
  }
  return true;
}

/* Runs the GEMM through cuBLASLt. *done = false (KG_OK) when cuBLASLt declines the problem (the
 * caller falls back); an error status only for a failure of a call cuBLASLt accepted. */
static kg_status gemm_lt(const char *op, int dev, kg_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         const void *A, int64_t lda, int64_t sa, const void *B, int64_t ldb, int64_t sb, void *D,
                         int64_t ldd, int64_t sd, int64_t batch, cublasLtEpilogue_t epi, const void *bias, bool *done) {
  *done = false;
  cudaDataType_t t = dt == KG_F32 ? CUDA_R_32F : dt == KG_BF16 ? CUDA_R_16BF : dt == KG_F16 ? CUDA_R_16F : CUDA_R_64F;
  if (t == CUDA_R_64F) return KG_OK;
  if (batch > 1 && (sa == 0 || sb == 0)) return KG_OK; /* broadcast batches: the fallback */
  bool tf32 = dt == KG_F32 && kg_allow_tf32();
  blas_dev *bd;
  KG_TRY(get_blas(dev, op, &bd));
  lt_key key;
  memset(&key, 0, sizeof key);
  key.dev = dev, key.dt = dt, key.tf32 = tf32, key.ta = ta, key.tb = tb, key.epi = (int)epi;
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldd;
  key.sa = batch > 1 ? sa : 0, key.sb = batch > 1 ? sb : 0, key.sc = batch > 1 ? sd : 0, key.batch = batch;
  key.align[0] = alignment(A), key.align[1] = alignment(B), key.align[2] = alignment(D), key.align[3] = alignment(bias);

  lt_descs ds;
  cublasComputeType_t ct = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (cublasLtMatmulDescCreate(&ds.op, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) != CUBLAS_STATUS_SUCCESS)
    return KG_OK;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT &&
      (cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) != CUBLAS_STATUS_SUCCESS ||
       cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) !=
           CUBLAS_STATUS_SUCCESS))
    return KG_OK;
  /* stored shapes: op(A) is [m, k], so A lies as [m, k] (N) or [k, m] (T); likewise B */
  if (!layout(&ds.a, t, ta ? k : m, ta ? m : k, lda, batch, sa) || !layout(&ds.b, t, tb ? n : k, tb ? k : n, ldb, batch, sb) ||
      !layout(&ds.d, t, m, n, ldd, batch, sd))
    return KG_OK;

  lt_entry found;
  found.used = false;
  pthread_mutex_lock(&cache_lock);
  for (int i = 0; i < LT_CACHE; i++)
    if (lt_cache[i].used && memcmp(&lt_cache[i].key, &key, sizeof key) == 0) {
      found = lt_cache[i];
      break;
    }
  pthread_mutex_unlock(&cache_lock);
  if (!found.used) { /* ask the heuristic once for this shape */
    found.key = key, found.ok = false, found.used = true;
    cublasLtMatmulPreference_t pref = NULL;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      uint64_t wsb = WS_BYTES;
      uint32_t al[4] = {(uint32_t)key.align[0], (uint32_t)key.align[1], (uint32_t)key.align[2], (uint32_t)key.align[2]};
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]);
      cublasLtMatmulHeuristicResult_t res;
      int got = 0;
      if (cublasLtMatmulAlgoGetHeuristic(bd->lt, ds.op, ds.a, ds.b, ds.d, ds.d, pref, 1, &res, &got) ==
              CUBLAS_STATUS_SUCCESS &&
          got > 0 && res.state == CUBLAS_STATUS_SUCCESS)
        found.algo = res.algo, found.ok = true;
      cublasLtMatmulPreferenceDestroy(pref);
    }
    cudaGetLastError();
    pthread_mutex_lock(&cache_lock);
    lt_cache[lt_next] = found;
    lt_next = (lt_next + 1) % LT_CACHE;
    pthread_mutex_unlock(&cache_lock);
  }
  if (!found.ok) return KG_OK;
  float one = 1.0f, zero = 0.0f;
  cublasStatus_t cs = cublasLtMatmul(bd->lt, ds.op, &one, A, ds.a, B, ds.b, &zero, D, ds.d, D, ds.d, &found.algo, bd->ws,
                                     WS_BYTES, kg_cuda_stream(dev));
  if (cs != CUBLAS_STATUS_SUCCESS)
    return kg_error(KG_ERR_DEVICE, op, "cublasLtMatmul [%lld x %lld x %lld] x %lld: %s", (long long)m, (long long)k,
                    (long long)n, (long long)batch, cublasGetStatusString(cs));
  *done = true;
  return kg_cuda_check(op, dev);
}

/* ---- operands ------------------------------------------------------------------------------ */

/* one operand as cuBLAS reads it: base, transposed or not (row-major sense), leading dim, batch stride */
typedef struct {
  const void *p;
  bool trans;
  int64_t ld, bstride;
  kg_tensor *owned;
} operand;

/* batch offsets of a view with batch dims (nb, shape, stride) equal i * s for one s? */
static bool one_batch_stride(int nb, const int64_t *shape, const int64_t *stride, int64_t *s) {
  int64_t span = 1;
  bool set = false;
  *s = 0;
  for (int d = nb - 1; d >= 0; d--) {
    if (shape[d] == 1) continue;
    if (!set) *s = stride[d], set = true;
    else if (stride[d] != *s * span) return false;
    span *= shape[d];
  }
  return true;
}

/* x viewed as [out batch..., R, C] (batch dims broadcast); nd = out->ndim */
static kg_status prepare(operand *op, const kg_tensor *x, const kg_tensor *o, int64_t R, int64_t C) {
  int nd = o->ndim, nx = x->ndim;
  int64_t shape[KG_MAX_DIMS], stride[KG_MAX_DIMS];
  for (int i = 0; i < nd - 2; i++) {
    int j = i - (nd - nx);
    shape[i] = o->shape[i];
    stride[i] = (j < 0 || x->shape[j] == 1) ? 0 : x->stride[j];
  }
  shape[nd - 2] = R, shape[nd - 1] = C;
  stride[nd - 2] = x->stride[nx - 2], stride[nd - 1] = x->stride[nx - 1];
  int64_t rs = stride[nd - 2], cs = stride[nd - 1], bs;
  op->owned = NULL;
  if (x->dtype == o->dtype && one_batch_stride(nd - 2, shape, stride, &bs)) {
    if ((cs == 1 || C == 1) && rs >= (C > 1 ? C : 1)) {
      *op = operand{kg_data(x), false, rs, bs, NULL};
      return KG_OK;
    }
    if ((rs == 1 || R == 1) && cs >= (R > 1 ? R : 1)) {
      *op = operand{kg_data(x), true, cs, bs, NULL};
      return KG_OK;
    }
  }
  /* pack: a broadcast view of x, copied contiguous in the output's dtype */
  kg_tensor *view, *packed;
  KG_TRY(kg_tensor_view_raw(&view, x, nd, shape, stride, x->offset));
  kg_status s = kg_tensor_empty(&packed, nd, shape, o->dtype, o->device);
  if (s == KG_OK) {
    const kg_tensor *in = view;
    s = kg_op_dispatch(KG_OP_COPY, 1, &packed, 1, &in, NULL);
    if (s) kg_tensor_release(packed);
  }
  kg_tensor_release(view);
  KG_TRY(s);
  *op = operand{kg_data(packed), false, C > 1 ? C : 1, R * C, packed};
  return KG_OK;
}

/* the fallback: cublasGemmStridedBatchedEx (f64, broadcast batches, what cuBLASLt declines) */
static kg_status gemm_legacy(int dev, kg_dtype dt, const operand &A, const operand &B, void *C, int64_t N, int64_t M,
                             int64_t K, int64_t batch) {
  cudaDataType_t t;
  cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  const void *one = &f1, *zero = &f0;
  switch (dt) {
  case KG_F32: t = CUDA_R_32F, ct = kg_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; break;
  case KG_BF16: t = CUDA_R_16BF; break;
  case KG_F16: t = CUDA_R_16F; break;
  case KG_F64: t = CUDA_R_64F, ct = CUBLAS_COMPUTE_64F, one = &d1, zero = &d0; break;
  default: return kg_error(KG_ERR_TYPE, "matmul", "dtype %s not supported on cuda", kg_dtype_info[dt].name);
  }
  blas_dev *bd;
  KG_TRY(get_blas(dev, "matmul", &bd));
  /* column-major: C'[M, N] = op(B')[M, K] · op(A')[K, N]; a row-major X with ld is X' col-major */
  cublasStatus_t cs = cublasGemmStridedBatchedEx(
      bd->h, B.trans ? CUBLAS_OP_T : CUBLAS_OP_N, A.trans ? CUBLAS_OP_T : CUBLAS_OP_N, (int)M, (int)N, (int)K, one, B.p,
      t, (int)B.ld, (long long)B.bstride, A.p, t, (int)A.ld, (long long)A.bstride, zero, C, t, (int)M,
      (long long)(N * M), (int)batch, ct, CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS)
    return kg_error(KG_ERR_DEVICE, "matmul", "cublasGemmStridedBatchedEx [%lld x %lld x %lld] x %lld: %s", (long long)N,
                    (long long)K, (long long)M, (long long)batch, cublasGetStatusString(cs));
  return kg_cuda_check("matmul", dev);
}

extern "C" kg_status kg_cuda_matmul(const kg_op_call *c) {
  const kg_tensor *a = c->in[0], *b = c->in[1];
  kg_tensor *o = c->out[0];
  int nd = o->ndim;
  int64_t N = o->shape[nd - 2], M = o->shape[nd - 1], K = a->shape[a->ndim - 1];
  int64_t batch = N * M > 0 ? kg_numel(o) / (N * M) : 0;
  int dev = o->device.index;
  if (!batch) return KG_OK;
  if (!kg_is_contiguous(o)) return kg_error(KG_ERR_VALUE, "matmul", "output must be contiguous");
  if (o->dtype != KG_F32 && o->dtype != KG_BF16 && o->dtype != KG_F16 && o->dtype != KG_F64)
    return kg_error(KG_ERR_TYPE, "matmul", "dtype %s not supported on cuda", kg_dtype_info[o->dtype].name);
  cudaStream_t s = kg_cuda_stream(dev);
  kg_flop_add((uint64_t)(2 * batch * N * M * K));
  if (K == 0) return kg_cuda_err(cudaMemsetAsync(kg_data(o), 0, (size_t)kg_numel(o) * kg_elem_size(o), s), "matmul", "memset");
  operand A, B;
  KG_TRY(prepare(&A, a, o, N, K));
  kg_status st = prepare(&B, b, o, K, M);
  if (st) return kg_tensor_release(A.owned), st;
  /* a shared right operand and evenly spaced left rows: one GEMM of batch·N rows */
  if (batch > 1 && B.bstride == 0 && !A.trans && A.bstride == N * A.ld) N *= batch, batch = 1;
  if (N > INT32_MAX || M > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
    st = kg_error(KG_ERR_SHAPE, "matmul", "dims N=%lld M=%lld K=%lld batch=%lld exceed cuBLAS's int range",
                  (long long)N, (long long)M, (long long)K, (long long)batch);
  bool done = false;
  if (!st)
    st = gemm_lt("matmul", dev, o->dtype, B.trans, A.trans, M, N, K, B.p, B.ld, B.bstride, A.p, A.ld, A.bstride,
                 kg_data(o), M, N * M, batch, CUBLASLT_EPILOGUE_DEFAULT, NULL, &done);
  if (!st && !done) st = gemm_legacy(dev, o->dtype, A, B, kg_data(o), N, M, K, batch);
  /* packed operands are freed stream-ordered, after the GEMM that reads them */
  kg_tensor_release(A.owned);
  kg_tensor_release(B.owned);
  return st;
}

/* y[..., O] = x[..., I] · w[O, I]ᵀ + b[O], then GELU (tanh form) when gelu: one cuBLASLt call with
 * a BIAS or GELU_BIAS epilogue. x dense (rows evenly spaced), w and b contiguous, y contiguous,
 * one dtype among f32/bf16/f16. *done = false, with nothing queued, when the layout or dtype does
 * not fit or cuBLASLt declines (the caller then runs matmul + a bias add). */
static kg_status linear_epilogue(kg_tensor *y, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b, bool gelu,
                                 bool *done) {
  int64_t I = w->shape[1], O = w->shape[0], rows = I ? kg_numel(x) / I : 0;
  kg_dtype dt = y->dtype;
  *done = false;
  if ((dt != KG_F32 && dt != KG_BF16 && dt != KG_F16) || x->dtype != dt || w->dtype != dt || b->dtype != dt ||
      !kg_is_contiguous(x) || !kg_is_contiguous(w) || !kg_is_contiguous(b) || !kg_is_contiguous(y) || !rows || !I ||
      rows > INT32_MAX || O > INT32_MAX || I > INT32_MAX)
    return KG_OK;
  /* column-major: y'[O, rows] = op(w')·x'; w row-major [O, I] is w' col-major [I, O] with ld I,
   * op T gives [O, I]; x row-major [rows, I] is x' col-major [I, rows] with ld I: op N */
  KG_TRY(gemm_lt("linear", y->device.index, dt, true, false, O, rows, I, kg_data(w), I, 0, kg_data(x), I, 0, kg_data(y),
                 O, 0, 1, gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS, kg_data(b), done));
  if (*done) kg_flop_add((uint64_t)(2 * rows * O * I));
  return KG_OK;
}

/* The fused form for callers outside the op table (cuda.cuh): KG_ERR_VALUE when it does not fit.
 * keng's `linear` has no activation argument, so the GELU_BIAS epilogue has no caller yet. */
kg_status kg_cuda_linear_fused(kg_tensor *y, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b, bool gelu) {
  bool done;
  KG_TRY(linear_epilogue(y, x, w, b, gelu, &done));
  return done ? KG_OK : kg_error(KG_ERR_VALUE, "linear", "layout or dtype not supported by the fused path");
}

/* The `linear` op: in = {x [..., I], w [O, I], b [O] or NULL}, out = y [..., O] contiguous.
 * With a bias, the cuBLASLt BIAS epilogue when it fits (forward of training and inference
 * alike); otherwise the matmul kernel on x @ wᵀ (a strided view of w, no copy) and then the
 * bias added in place by the elementwise kernel. */
extern "C" kg_status kg_cuda_linear(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
  kg_tensor *y = c->out[0];
  if (b) {
    bool done;
    KG_TRY(linear_epilogue(y, x, w, b, false, &done));
    if (done) return KG_OK;
  }
  /* the product as matmul sees it: x [..., N, I] @ wᵀ [I, O] -> y [..., N, O]; a 1-D x is one row */
  int nx = x->ndim;
  int64_t xs[KG_MAX_DIMS], xst[KG_MAX_DIMS], ys[KG_MAX_DIMS], yst[KG_MAX_DIMS];
  int nd = nx < 2 ? 2 : nx;
  for (int d = 0; d < nx; d++) xs[nd - nx + d] = x->shape[d], xst[nd - nx + d] = x->stride[d];
  for (int d = 0; d < y->ndim; d++) ys[nd - nx + d] = y->shape[d], yst[nd - nx + d] = y->stride[d];
  if (nx < 2) xs[0] = ys[0] = 1, xst[0] = x->shape[0], yst[0] = y->shape[0];
  int64_t wts[2] = {w->shape[1], w->shape[0]}, wtst[2] = {w->stride[1], w->stride[0]};
  kg_tensor *xv = NULL, *yv = NULL, *wv = NULL;
  kg_status st = kg_tensor_view_raw(&xv, x, nd, xs, xst, x->offset);
  if (!st) st = kg_tensor_view_raw(&yv, y, nd, ys, yst, y->offset);
  if (!st) st = kg_tensor_view_raw(&wv, w, 2, wts, wtst, w->offset);
  if (!st) {
    const kg_tensor *in[2] = {xv, wv};
    kg_op_call mc = {KG_OP_MATMUL, 2, 1, in, &yv, NULL};
    st = kg_cuda_matmul(&mc);
  }
  if (!st && b) {
    kg_cuda_ew_args a;
    memset(&a, 0, sizeof a);
    a.kind = KG_EW_BINARY, a.op = KG_OP_ADD;
    const kg_tensor *in[2] = {y, b}; /* y += b, b broadcast over the rows */
    st = kg_cuda_ew("linear", a, y, 2, in);
  }
  kg_tensor_release(xv);
  kg_tensor_release(yv);
  kg_tensor_release(wv);
  return st;
}
