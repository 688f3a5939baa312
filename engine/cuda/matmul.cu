/* matmul.cu — batched GEMM through cuBLAS (cublasGemmStridedBatchedEx): f32, bf16 and f16
 * with CUBLAS_COMPUTE_32F (f32 accumulate, no TF32), f64 with CUBLAS_COMPUTE_64F.
 *
 * a: [..., N, K] @ b: [..., K, M] -> out: [..., N, M] (contiguous, batch dims broadcast).
 * cuBLAS is column-major, so the row-major product C = A B is computed as Cᵀ = Bᵀ Aᵀ. An
 * operand is passed as it lies when its matrix has a unit stride on one dim and its batch
 * offsets are one stride apart; otherwise (or when its dtype is not the output's) it is first
 * packed contiguous in the output's dtype by the copy kernel. */
#include "cuda.cuh"

#include <cublas_v2.h>
#include <pthread.h>

static cublasHandle_t handles[16];
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

static kg_status get_handle(int device, cublasHandle_t *out) {
  cudaStream_t s = kg_cuda_stream(device);
  if (device < 0 || device >= 16) return kg_error(KG_ERR_DEVICE, "matmul", "cuda:%d out of range", device);
  pthread_mutex_lock(&handle_lock);
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (!handles[device]) st = cublasCreate(&handles[device]);
  pthread_mutex_unlock(&handle_lock);
  if (st != CUBLAS_STATUS_SUCCESS) return kg_error(KG_ERR_DEVICE, "matmul", "cublasCreate: %s", cublasGetStatusString(st));
  cublasSetStream(handles[device], s);
  *out = handles[device];
  return KG_OK;
}

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

extern "C" kg_status kg_cuda_matmul(const kg_op_call *c) {
  const kg_tensor *a = c->in[0], *b = c->in[1];
  kg_tensor *o = c->out[0];
  int nd = o->ndim;
  int64_t N = o->shape[nd - 2], M = o->shape[nd - 1], K = a->shape[a->ndim - 1];
  int64_t batch = N * M > 0 ? kg_numel(o) / (N * M) : 0;
  int dev = o->device.index;
  if (!batch) return KG_OK;
  if (!kg_is_contiguous(o)) return kg_error(KG_ERR_VALUE, "matmul", "output must be contiguous");
  if (N > INT32_MAX || M > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
    return kg_error(KG_ERR_SHAPE, "matmul", "dims N=%lld M=%lld K=%lld batch=%lld exceed cuBLAS's int range",
                    (long long)N, (long long)M, (long long)K, (long long)batch);
  cudaStream_t s = kg_cuda_stream(dev);
  kg_flop_add((uint64_t)(2 * batch * N * M * K));
  if (K == 0) return kg_cuda_err(cudaMemsetAsync(kg_data(o), 0, (size_t)kg_numel(o) * kg_elem_size(o), s), "matmul", "memset");
  cudaDataType_t t;
  cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  const void *one = &f1, *zero = &f0;
  switch (o->dtype) {
  case KG_F32: t = CUDA_R_32F; break;
  case KG_BF16: t = CUDA_R_16BF; break;
  case KG_F16: t = CUDA_R_16F; break;
  case KG_F64: t = CUDA_R_64F, ct = CUBLAS_COMPUTE_64F, one = &d1, zero = &d0; break;
  default: return kg_error(KG_ERR_TYPE, "matmul", "dtype %s not supported on cuda", kg_dtype_info[o->dtype].name);
  }
  cublasHandle_t h = NULL;
  KG_TRY(get_handle(dev, &h));
  operand A, B;
  KG_TRY(prepare(&A, a, o, N, K));
  kg_status st = prepare(&B, b, o, K, M);
  if (st) return kg_tensor_release(A.owned), st;
  /* column-major: C'[M, N] = op(B')[M, K] · op(A')[K, N]; a row-major X with ld is X' col-major */
  cublasStatus_t cs = cublasGemmStridedBatchedEx(
      h, B.trans ? CUBLAS_OP_T : CUBLAS_OP_N, A.trans ? CUBLAS_OP_T : CUBLAS_OP_N, (int)M, (int)N, (int)K, one, B.p, t,
      (int)B.ld, (long long)B.bstride, A.p, t, (int)A.ld, (long long)A.bstride, zero, kg_data(o), t, (int)M,
      (long long)(N * M), (int)batch, ct, CUBLAS_GEMM_DEFAULT);
  /* packed operands are freed stream-ordered, after the GEMM that reads them */
  kg_tensor_release(A.owned);
  kg_tensor_release(B.owned);
  if (cs != CUBLAS_STATUS_SUCCESS)
    return kg_error(KG_ERR_DEVICE, "matmul", "cublasGemmStridedBatchedEx [%lld x %lld x %lld] x %lld: %s", (long long)N,
                    (long long)K, (long long)M, (long long)batch, cublasGetStatusString(cs));
  return kg_cuda_check("matmul", dev);
}
