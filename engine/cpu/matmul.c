/* matmul.c (cpu) — batched GEMM through OpenBLAS: sgemm for f32 (and for bf16/f16, converted
 * to f32 per operand, accumulating in f32), dgemm for f64. Operands whose last or second-last
 * dim has unit stride are passed as they lie (NoTrans/Trans); others are packed first. */
#include "cpu.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

/* one operand matrix, ready for BLAS: pointer, transpose flag, leading dimension */
typedef struct {
  const void *p;
  bool trans;
  int64_t ld;
  void *owned;
} mat;

/* m: [R, C] view at base with strides (rs, cs) in dtype dt; want element type wt (f32/f64) */
static int prepare(mat *out, const char *base, kg_dtype dt, int64_t R, int64_t C, int64_t rs, int64_t cs, kg_dtype wt) {
  out->owned = NULL;
  if (dt == wt && cs == 1 && rs >= (C > 1 ? C : 1)) {
    *out = (mat){base, false, rs > 0 ? rs : 1, NULL};
    return 0;
  }
  if (dt == wt && rs == 1 && cs >= (R > 1 ? R : 1)) {
    *out = (mat){base, true, cs > 0 ? cs : 1, NULL};
    return 0;
  }
  int es = kg_dtype_info[dt].size, ws = kg_dtype_info[wt].size;
  void *buf = aligned_alloc(64, (size_t)((R * C * ws + 63) / 64 * 64 + 64));
  if (!buf) return -1;
  for (int64_t r = 0; r < R; r++) {
    const char *src = base + r * rs * es;
    if (wt == KG_F64) kg_cpu_load_f64((double *)buf + r * C, src, dt, cs, C);
    else kg_cpu_load_f32((float *)buf + r * C, src, dt, cs, C);
  }
  *out = (mat){buf, false, C > 0 ? C : 1, buf};
  return 0;
}

kg_status kg_cpu_matmul(const kg_op_call *c) {
  const kg_tensor *a = c->in[0], *b = c->in[1];
  kg_tensor *o = c->out[0];
  int nd = o->ndim, na = a->ndim, nb = b->ndim;
  int64_t N = o->shape[nd - 2], M = o->shape[nd - 1], K = a->shape[na - 1];
  int64_t batch = N * M > 0 ? kg_numel(o) / (N * M) : 0;
  kg_dtype wt = o->dtype == KG_F64 ? KG_F64 : KG_F32;
  int64_t astr[KG_MAX_DIMS], bstr[KG_MAX_DIMS];
  kg_broadcast_strides(a, nd, o->shape, astr); /* batch dims broadcast; last two are a's own */
  kg_broadcast_strides(b, nd, o->shape, bstr);
  astr[nd - 2] = a->stride[na - 2], astr[nd - 1] = a->stride[na - 1];
  bstr[nd - 2] = b->stride[nb - 2], bstr[nd - 1] = b->stride[nb - 1];
  const char *abase = kg_data(a), *bbase = kg_data(b);
  char *obase = kg_data(o);
  int aes = kg_dtype_info[a->dtype].size, bes = kg_dtype_info[b->dtype].size;
  float *cbuf = NULL;
  if (o->dtype != wt) cbuf = aligned_alloc(64, (size_t)((N * M * 4 + 63) / 64 * 64 + 64));
  kg_status st = KG_OK;
  for (int64_t bi = 0; bi < batch && st == KG_OK; bi++) {
    int64_t rem = bi, aoff = 0, boff = 0;
    for (int d = nd - 3; d >= 0; d--) {
      int64_t i = rem % o->shape[d];
      rem /= o->shape[d];
      aoff += i * astr[d];
      boff += i * bstr[d];
    }
    mat A, B;
    if (prepare(&A, abase + aoff * aes, a->dtype, N, K, astr[nd - 2], astr[nd - 1], wt) ||
        prepare(&B, bbase + boff * bes, b->dtype, K, M, bstr[nd - 2], bstr[nd - 1], wt)) {
      st = kg_error(KG_ERR_OOM, "matmul", "out of memory packing operands");
      break;
    }
    char *cptr = obase + bi * N * M * kg_dtype_info[o->dtype].size;
    if (K == 0) {
      memset(cbuf ? (void *)cbuf : cptr, 0, (size_t)(N * M * (wt == KG_F64 ? 8 : 4)));
    } else if (wt == KG_F64) {
      cblas_dgemm(CblasRowMajor, A.trans ? CblasTrans : CblasNoTrans, B.trans ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                  (int)K, 1.0, A.p, (int)A.ld, B.p, (int)B.ld, 0.0, (double *)cptr, (int)M);
    } else {
      cblas_sgemm(CblasRowMajor, A.trans ? CblasTrans : CblasNoTrans, B.trans ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                  (int)K, 1.0f, A.p, (int)A.ld, B.p, (int)B.ld, 0.0f, cbuf ? cbuf : (float *)cptr, (int)M);
    }
    if (cbuf) kg_cpu_store_f32(cptr, o->dtype, 1, cbuf, N * M);
    free(A.owned);
    free(B.owned);
  }
  free(cbuf);
  kg_flop_add((uint64_t)(2 * batch * N * M * K));
  return st;
}
