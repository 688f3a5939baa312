/* matmul.c (cpu) — batched GEMM through OpenBLAS: sgemm for f32, bf16 and f16 (converted to
 * f32, accumulating in f32), dgemm for f64.
 *
 * An operand whose last or second-last dim has unit stride and whose dtype is the compute type
 * goes to BLAS as it lies (NoTrans/Trans). Any other operand is converted (and packed) into a
 * pool buffer, reading its memory in the order it lies (a transposed weight is read row by
 * row, never gathered with a stride). The right operand of a small-M product (decode: a few
 * rows against a big bf16 weight) is converted in column blocks of about 256 KiB, each
 * multiplied while it is still in cache; the blocks are shared among the threads, each
 * running a single-threaded sgemm. Up to 32 rows against a bf16 b with a unit stride, on a CPU
 * with AVX2, gemm_bf16.c reads b as bf16 instead (no conversion pass). Batch dims over which b is broadcast fold into a's rows
 * (one GEMM, b converted once), and a converted operand is reused across batch entries that
 * point at the same matrix. See docs/kernels.md for the figures.
 */
#include "cpu.h"
#include "gemm_bf16.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

/* rows of a up to which a bf16 b is read directly by gemm_bf16.c (see docs/kernels.md, Decode) */
#define MM_BF16_ROWS 32
/* rows of a below which b is converted block by block (else whole, with one threaded GEMM) */
#define MM_BLOCK_ROWS 128
/* bytes of converted b per block */
#define MM_BLOCK_BYTES (256 * 1024)
/* flops below which a blocked product stays on one thread */
#define MM_PAR_FLOPS (4 << 20)

/* an [R, C] operand: base pointer, dtype, element strides */
typedef struct {
  const char *p;
  kg_dtype dt;
  int64_t R, C, rs, cs;
} view;

/* a matrix ready for BLAS */
typedef struct {
  const void *p;
  bool trans;
  int64_t ld;
} mat;

typedef struct {
  void *p;
  size_t bytes;
} buf;

static void *buf_get(buf *b, size_t bytes) {
  if (b->p && b->bytes >= bytes) return b->p;
  if (b->p) kg_cpu_free(b->p, b->bytes);
  b->p = kg_cpu_alloc(bytes, &b->bytes);
  return b->p;
}

static void buf_free(buf *b) {
  if (b->p) kg_cpu_free(b->p, b->bytes);
  b->p = NULL;
}

static void load_run(void *dst, kg_dtype wt, const void *src, kg_dtype dt, int64_t stride, int64_t n) {
  if (wt == KG_F64) kg_cpu_load_f64(dst, src, dt, stride, n);
  else kg_cpu_load_f32(dst, src, dt, stride, n);
}

/* can v go to BLAS without a copy? */
static bool direct(const view *v, kg_dtype wt, mat *m) {
  if (v->dt != wt) return false;
  if (v->cs == 1 && v->rs >= (v->C > 1 ? v->C : 1)) {
    *m = (mat){v->p, false, v->rs > 0 ? v->rs : 1};
    return true;
  }
  if (v->rs == 1 && v->cs >= (v->R > 1 ? v->R : 1)) {
    *m = (mat){v->p, true, v->cs > 0 ? v->cs : 1};
    return true;
  }
  return false;
}

/* does out = A @ b go to gemm_bf16.c? A few rows of f32 a (row-major) against a bf16 b with a
 * unit stride on either dim, on a CPU with AVX2 + FMA (else convert + sgemm is faster) */
static bool bf16_small(const view *b, kg_dtype wt, const mat *A, int64_t N) {
  if (wt != KG_F32 || b->dt != KG_BF16 || A->trans || N > MM_BF16_ROWS) return false;
  if (b->rs < 0 || b->cs < 0 || (b->rs != 1 && b->cs != 1)) return false;
  return kg_cpu_gemm_bf16_avx2();
}

/* converts columns [c0, c0 + nc) of v into dst as wt, following v's memory order: row-major
 * [R, nc] (NoTrans, ld nc) unless v's columns are the contiguous runs, then [nc, R] (Trans) */
static mat convert(void *dst, kg_dtype wt, const view *v, int64_t c0, int64_t nc) {
  int es = kg_dtype_info[v->dt].size, ws = kg_dtype_info[wt].size;
  if (v->rs == 1 && v->cs != 1) { /* columns are contiguous: copy them as rows of the transpose */
    for (int64_t j = 0; j < nc; j++)
      load_run((char *)dst + j * v->R * ws, wt, v->p + (c0 + j) * v->cs * es, v->dt, 1, v->R);
    return (mat){dst, true, v->R > 0 ? v->R : 1};
  }
  for (int64_t r = 0; r < v->R; r++)
    load_run((char *)dst + r * nc * ws, wt, v->p + (r * v->rs + c0 * v->cs) * es, v->dt, v->cs, nc);
  return (mat){dst, false, nc > 0 ? nc : 1};
}

static void gemm(kg_dtype wt, int64_t N, int64_t M, int64_t K, const mat *A, const mat *B, void *C, int64_t ldc) {
  if (wt == KG_F64)
    cblas_dgemm(CblasRowMajor, A->trans ? CblasTrans : CblasNoTrans, B->trans ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                (int)K, 1.0, A->p, (int)A->ld, B->p, (int)B->ld, 0.0, C, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, A->trans ? CblasTrans : CblasNoTrans, B->trans ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                (int)K, 1.0f, A->p, (int)A->ld, B->p, (int)B->ld, 0.0f, C, (int)ldc);
}

/* out[N, M] (contiguous, dtype odt) = A[N, K] @ B[K, M]: B converted per column block */
static kg_status blocked(kg_dtype wt, const mat *A, const view *B, char *out, kg_dtype odt, int64_t N, int64_t M,
                         int64_t K) {
  int ws = kg_dtype_info[wt].size, os = kg_dtype_info[odt].size;
  int64_t mb = MM_BLOCK_BYTES / (ws * (K > 0 ? K : 1));
  mb = mb < 16 ? 16 : mb / 16 * 16;
  int nt = 2.0 * (double)N * (double)M * (double)K >= MM_PAR_FLOPS ? kg_num_threads() : 1;
  if (nt > 1 && mb * nt > M) mb = (M + nt - 1) / nt;
  if (mb > M) mb = M;
  int64_t nblk = (M + mb - 1) / mb;
  if (nt > nblk) nt = (int)nblk;
  bool oom = false;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    buf bb = {0}, cb = {0};
    void *bp = buf_get(&bb, (size_t)(K * mb * ws));
    void *cp = odt == wt ? NULL : buf_get(&cb, (size_t)(N * mb * ws));
    if (!bp || (odt != wt && !cp)) {
#pragma omp atomic write
      oom = true;
    }
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
      if (oom) continue;
      int64_t j0 = blk * mb, nc = M - j0 < mb ? M - j0 : mb;
      mat Bm = convert(bp, wt, B, j0, nc);
      if (cp) {
        gemm(wt, N, nc, K, A, &Bm, cp, nc);
        for (int64_t r = 0; r < N; r++) kg_cpu_store_f32(out + (r * M + j0) * os, odt, 1, (float *)cp + r * nc, nc);
      } else {
        gemm(wt, N, nc, K, A, &Bm, out + j0 * os, M);
      }
    }
    buf_free(&bb);
    buf_free(&cb);
  }
  return oom ? kg_error(KG_ERR_OOM, "matmul", "out of memory converting operands") : KG_OK;
}

kg_status kg_cpu_matmul(const kg_op_call *c) {
  const kg_tensor *a = c->in[0], *b = c->in[1];
  kg_tensor *o = c->out[0];
  int nd = o->ndim, na = a->ndim, nb = b->ndim;
  int64_t N = o->shape[nd - 2], M = o->shape[nd - 1], K = a->shape[na - 1];
  int64_t batch = N * M > 0 ? kg_numel(o) / (N * M) : 0;
  kg_dtype wt = o->dtype == KG_F64 ? KG_F64 : KG_F32, odt = o->dtype;
  int64_t astr[KG_MAX_DIMS], bstr[KG_MAX_DIMS];
  kg_broadcast_strides(a, nd, o->shape, astr); /* batch dims broadcast; last two are a's own */
  kg_broadcast_strides(b, nd, o->shape, bstr);
  astr[nd - 2] = a->stride[na - 2], astr[nd - 1] = a->stride[na - 1];
  bstr[nd - 2] = b->stride[nb - 2], bstr[nd - 1] = b->stride[nb - 1];
  kg_flop_add((uint64_t)(2 * batch * N * M * K));
  if (batch == 0) return KG_OK;
  int aes = kg_dtype_info[a->dtype].size, bes = kg_dtype_info[b->dtype].size, os = kg_dtype_info[odt].size;
  int ws = kg_dtype_info[wt].size;
  if (K == 0) {
    memset(kg_data(o), 0, (size_t)(batch * N * M * os)); /* +0 in every float dtype */
    return KG_OK;
  }
  /* b broadcast over every batch dim, and a's batch dims continue its rows: one GEMM */
  if (batch > 1) {
    bool fold = true;
    int64_t expect = astr[nd - 2] * N;
    for (int d = nd - 3; d >= 0; d--) {
      if (o->shape[d] == 1) continue;
      if (bstr[d] != 0 || astr[d] != expect) fold = false;
      expect *= o->shape[d];
    }
    if (fold) N *= batch, batch = 1;
  }
  const char *abase = kg_data(a), *bbase = kg_data(b);
  char *obase = kg_data(o);
  buf abuf = {0}, bbuf = {0}, cbuf = {0};
  int64_t last_aoff = -1, last_boff = -1;
  mat A, B;
  kg_status st = KG_OK;
  for (int64_t bi = 0; bi < batch && st == KG_OK && !kg_interrupt_pending(); bi++) {
    int64_t rem = bi, aoff = 0, boff = 0;
    for (int d = nd - 3; d >= 0; d--) {
      int64_t i = rem % o->shape[d];
      rem /= o->shape[d];
      aoff += i * astr[d];
      boff += i * bstr[d];
    }
    view av = {abase + aoff * aes, a->dtype, N, K, astr[nd - 2], astr[nd - 1]};
    view bv = {bbase + boff * bes, b->dtype, K, M, bstr[nd - 2], bstr[nd - 1]};
    char *optr = obase + bi * N * M * os;
    if (aoff != last_aoff && !direct(&av, wt, &A)) {
      void *p = buf_get(&abuf, (size_t)(N * K * ws));
      if (!p) {
        st = kg_error(KG_ERR_OOM, "matmul", "out of memory converting operands");
        break;
      }
      A = convert(p, wt, &av, 0, K);
    }
    last_aoff = aoff;
    if (bf16_small(&bv, wt, &A, N)) { /* decode: read the bf16 weight directly */
      bool trans = bv.rs == 1;
      kg_gemm_bf16_opts go = {.a_bf16 = a->dtype == KG_BF16}; /* then a's f32 copy packs back exactly */
      st = kg_cpu_gemm_bf16(optr, odt, M, A.p, A.ld, (const uint16_t *)bv.p, trans ? bv.cs : bv.rs, trans, N, M, K, &go);
      continue;
    }
    bool bdirect = direct(&bv, wt, &B);
    if (!bdirect && N < MM_BLOCK_ROWS) { /* few rows: convert b in cache-sized column blocks */
      st = blocked(wt, &A, &bv, optr, odt, N, M, K);
      last_boff = -1;
      continue;
    }
    if (!bdirect && boff != last_boff) {
      void *p = buf_get(&bbuf, (size_t)(K * M * ws));
      if (!p) {
        st = kg_error(KG_ERR_OOM, "matmul", "out of memory converting operands");
        break;
      }
      B = convert(p, wt, &bv, 0, M);
      last_boff = boff;
    }
    if (odt == wt) {
      gemm(wt, N, M, K, &A, &B, optr, M);
    } else {
      float *cp = buf_get(&cbuf, (size_t)(N * M * 4));
      if (!cp) {
        st = kg_error(KG_ERR_OOM, "matmul", "out of memory for the f32 result");
        break;
      }
      gemm(wt, N, M, K, &A, &B, cp, M);
      kg_cpu_store_f32(optr, odt, 1, cp, N * M);
    }
  }
  buf_free(&abuf);
  buf_free(&bbuf);
  buf_free(&cbuf);
  return st;
}
