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
 * with AVX2, gemm_bf16.c reads b as bf16 instead (no conversion pass); with AVX512_BF16 also any
 * number of rows of a bf16 a (its vdpbf16ps kernel). Batch dims over which b is broadcast fold into a's rows
 * (one GEMM, b converted once), and a converted operand is reused across batch entries that
 * point at the same matrix. A tall product (>= MM_SPLIT_ROWS rows) is split by rows among our
 * threads (threaded_gemm). An f32 product with row-major a, >= 64 rows, >= 64 columns and K >= 32
 * runs on keng's AVX-512 GEMM instead (gemm_f32.c: the ViT/BERT linears and their input
 * gradients); a short K (<= 128) with fewer columns on the short-K kernel (smallk: a read in
 * place, b packed once per call). See docs/kernels.md for the figures.
 *
 * kg_cpu_linear (y = x wᵀ + b) runs the same product with b = wᵀ (a strided view, no copy) and
 * adds the bias inside the product: each output block in the compute type is first filled with
 * the bias rows and the GEMM then accumulates into it (beta = 1): a streaming write of y instead
 * of a separate add that reads and writes it again, and one rounding for bf16/f16 outputs. The
 * direct bf16 path adds it to its f32 rows after the product.
 */
#include "cpu.h"
#include "gemm_bf16.h"
#include "gemm_f32.h"

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
/* rows from which a product is split among our threads by rows (threaded_gemm) */
#define MM_SPLIT_ROWS 4096

/* the short-K f32 kernel (smallk): K, M and K * M (packed b <= 64 KiB) at most, rows from
 * which it is used, row block (measured: docs/kernels.md, "Short-K f32 products") */
#define SK_MAX_K 128
#define SK_MAX_M 256
#define SK_MAX_KM 16384
#define SK_MIN_ROWS 64
#define SK_ROWS 6

/* products that go to gemm_f32.c: rows, columns and K at least (measured: docs/kernels.md) */
#define GF_MIN_ROWS 64
#define GF_MIN_COLS 64
#define GF_MIN_K 32

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
 * unit stride on either dim, on a CPU with AVX2 + FMA (else convert + sgemm is faster); or any
 * number of rows of a bf16 a against such a b on a CPU with AVX512_BF16, where gemm_bf16.c's
 * packed vdpbf16ps kernel beats convert + sgemm at training sizes, both layouts (docs/kernels.md,
 * "bf16 GEMM for training rows") */
static bool bf16_direct(const view *b, kg_dtype wt, const mat *A, int64_t N, kg_dtype adt) {
  if (wt != KG_F32 || b->dt != KG_BF16 || A->trans) return false;
  if (b->rs < 0 || b->cs < 0 || (b->rs != 1 && b->cs != 1)) return false;
  if (N <= MM_BF16_ROWS) return kg_cpu_gemm_bf16_avx2();
  return adt == KG_BF16 && kg_cpu_gemm_bf16_dpbf16();
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

/* C = A @ B, or C += A @ B when acc (C then holds the bias rows) */
static void gemm(kg_dtype wt, int64_t N, int64_t M, int64_t K, const mat *A, const mat *B, void *C, int64_t ldc,
                 bool acc) {
  if (wt == KG_F64)
    cblas_dgemm(CblasRowMajor, A->trans ? CblasTrans : CblasNoTrans, B->trans ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                (int)K, 1.0, A->p, (int)A->ld, B->p, (int)B->ld, acc ? 1.0 : 0.0, C, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, A->trans ? CblasTrans : CblasNoTrans, B->trans ? CblasTrans : CblasNoTrans, (int)N, (int)M,
                (int)K, 1.0f, A->p, (int)A->ld, B->p, (int)B->ld, acc ? 1.0f : 0.0f, C, (int)ldc);
}

/* rows [0, N) of C (compute type wt, row stride ldc) = bias[j0, j0 + M); nt threads split the rows */
static void fill_bias(kg_dtype wt, void *C, int64_t ldc, int64_t N, int64_t M, const void *bias, int64_t j0, int nt) {
  int ws = kg_dtype_info[wt].size;
  const char *src = (const char *)bias + j0 * ws;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < N; r++) memcpy((char *)C + r * ldc * ws, src, (size_t)(M * ws));
}

/* threads for a pass over n elements outside a parallel region */
static int pass_threads(int64_t n) { return n >= 4 * KG_PAR_THRESHOLD ? kg_num_threads() : 1; }

/* rows of out (dtype odt, row stride M) = f32 rows of c (row stride M) + bias */
static void store_bias_f32(char *out, kg_dtype odt, const float *c, const float *bias, int64_t N, int64_t M) {
  int os = kg_dtype_info[odt].size;
  float row[256];
  for (int64_t r = 0; r < N; r++)
    for (int64_t j0 = 0; j0 < M; j0 += 256) {
      int64_t n = M - j0 < 256 ? M - j0 : 256;
      for (int64_t j = 0; j < n; j++) row[j] = c[r * M + j0 + j] + bias[j0 + j];
      kg_cpu_store_f32(out + (r * M + j0) * os, odt, 1, row, n);
    }
}

/* C[N, M] (compute type wt, contiguous) = A[N, K] @ B[K, M] (+ bias) on kg_num_threads() threads.
 * A tall product is split by rows among our threads, one single-threaded GEMM each (bias rows
 * written just before): 7-10% faster than OpenBLAS's own threading on BERT's linears. Others go
 * to OpenBLAS's threading (a split by K for weight gradients measured level with it). Figures in
 * docs/kernels.md ("f32 GEMM threading"). */
static void threaded_gemm(kg_dtype wt, int64_t N, int64_t M, int64_t K, const mat *A, const mat *B, void *C,
                          const void *bias) {
  int ws = kg_dtype_info[wt].size;
  int nt = 2.0 * (double)N * (double)M * (double)K >= MM_PAR_FLOPS ? kg_num_threads() : 1;
  if (nt > 1 && N >= MM_SPLIT_ROWS) { /* rows */
    int64_t rb = ((N + nt - 1) / nt + 15) / 16 * 16;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < nt; t++) {
      int64_t r0 = t * rb, nr = N - r0 < rb ? N - r0 : rb;
      if (nr <= 0) continue;
      mat At = *A;
      At.p = (const char *)A->p + (A->trans ? r0 : r0 * A->ld) * ws;
      char *Ct = (char *)C + r0 * M * ws;
      if (bias) fill_bias(wt, Ct, M, nr, M, bias, 0, 1);
      gemm(wt, nr, M, K, &At, B, Ct, M, bias != NULL);
    }
    return;
  }
  if (bias) fill_bias(wt, C, M, N, M, bias, 0, pass_threads(N * M));
  gemm(wt, N, M, K, A, B, C, M, bias != NULL);
}

/* out[N, M] (contiguous, dtype odt) = A[N, K] @ B[K, M] (+ bias, wt, when not NULL): B
 * converted per column block */
static kg_status blocked(kg_dtype wt, const mat *A, const view *B, char *out, kg_dtype odt, int64_t N, int64_t M,
                         int64_t K, const void *bias) {
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
        if (bias) fill_bias(wt, cp, nc, N, nc, bias, j0, 1);
        gemm(wt, N, nc, K, A, &Bm, cp, nc, bias != NULL);
        for (int64_t r = 0; r < N; r++) kg_cpu_store_f32(out + (r * M + j0) * os, odt, 1, (float *)cp + r * nc, nc);
      } else {
        if (bias) fill_bias(wt, out + j0 * os, M, N, nc, bias, j0, 1);
        gemm(wt, N, nc, K, A, &Bm, out + j0 * os, M, bias != NULL);
      }
    }
    buf_free(&bb);
    buf_free(&cb);
  }
  return oom ? kg_error(KG_ERR_OOM, "matmul", "out of memory converting operands") : KG_OK;
}

/* ---- short-K f32 products (AVX-512) ---------------------------------------------------------
 * The UNet's attention and feed-forward linears at latent sizes ([3328, 32] x [32, 32]ᵀ,
 * [3328, 32] x [256, 32]ᵀ + b, [3328, 128] x [32, 128]ᵀ + b) have a K of 32-128: OpenBLAS
 * spends as long packing the tall a as multiplying it (57 and 90 GFLOP/s on one core). Here a is read in place: SK_ROWS rows at a
 * time, each of their K values broadcast against a row of b packed once per call ([K, Mp], Mp
 * = M rounded up to 32, zero past M), 2 x SK_ROWS accumulators of 16 columns, started from the
 * bias. Each output is the same sum in k order (float rounding only). */

#if defined(__x86_64__)
#include <immintrin.h>
#define KG_X86 1

__attribute__((target("avx512f"))) static void smallk_block(const float *A, int64_t lda, const float *Bp, int64_t Mp,
                                                            int64_t K, int64_t M, const float *bias, float *C,
                                                            int64_t i, int rn) {
  const float *ar[SK_ROWS];
  for (int r = 0; r < SK_ROWS; r++) ar[r] = A + (i + (r < rn ? r : rn - 1)) * lda; /* short block: repeat the last row */
  for (int64_t j = 0; j < M; j += 32) {
    int64_t left = M - j;
    __mmask16 m0 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    __mmask16 m1 = left >= 32 ? (__mmask16)0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
    __m512 i0 = bias ? _mm512_maskz_loadu_ps(m0, bias + j) : _mm512_setzero_ps();
    __m512 i1 = bias ? _mm512_maskz_loadu_ps(m1, bias + j + 16) : _mm512_setzero_ps();
    __m512 c0[SK_ROWS], c1[SK_ROWS];
#pragma GCC unroll 6
    for (int r = 0; r < SK_ROWS; r++) c0[r] = i0, c1[r] = i1;
    for (int64_t k = 0; k < K; k++) {
      __m512 b0 = _mm512_loadu_ps(Bp + k * Mp + j), b1 = _mm512_loadu_ps(Bp + k * Mp + j + 16);
#pragma GCC unroll 6
      for (int r = 0; r < SK_ROWS; r++) {
        __m512 a = _mm512_set1_ps(ar[r][k]);
        c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
      }
    }
    for (int r = 0; r < rn; r++) {
      _mm512_mask_storeu_ps(C + (i + r) * M + j, m0, c0[r]);
      if (m1) _mm512_mask_storeu_ps(C + (i + r) * M + j + 16, m1, c1[r]);
    }
  }
}
#endif

/* out[N, M] (f32, contiguous) = A[N, K] (f32 rows, row stride A->ld) @ b (+ bias) by the
 * short-K kernel; false (nothing done) when it does not apply or b's buffer is out of memory */
static bool smallk(const mat *A, const view *b, float *out, int64_t N, int64_t M, int64_t K, const float *bias) {
#ifdef KG_X86
  if (A->trans || K > SK_MAX_K || M > SK_MAX_M || K * M > SK_MAX_KM || N < SK_MIN_ROWS || kg_cpu_vector_isa(KG_ENV_KENG_GEMM_SMALLK) < 2)
    return false;
  int64_t Mp = (M + 31) / 32 * 32;
  buf bb = {0};
  float *Bp = buf_get(&bb, (size_t)(K * Mp) * sizeof(float));
  if (!Bp) return false;
  int es = kg_dtype_info[b->dt].size;
  for (int64_t k = 0; k < K; k++) {
    kg_cpu_load_f32(Bp + k * Mp, b->p + k * b->rs * es, b->dt, b->cs, M);
    memset(Bp + k * Mp + M, 0, (size_t)(Mp - M) * sizeof(float));
  }
  int64_t nblk = (N + SK_ROWS - 1) / SK_ROWS;
  int nt = 2.0 * (double)N * (double)M * (double)K >= MM_PAR_FLOPS ? kg_num_threads() : 1;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < nblk; t++) {
    int64_t i = t * SK_ROWS;
    smallk_block(A->p, A->ld, Bp, Mp, K, M, bias, out, i, N - i < SK_ROWS ? (int)(N - i) : SK_ROWS);
  }
  buf_free(&bb);
  return true;
#else
  (void)A, (void)b, (void)out, (void)N, (void)M, (void)K, (void)bias;
  return false;
#endif
}

/* does out = A @ b go to gemm_f32.c? f32 in and out, a row-major, many rows, and at least one
 * 64-column panel of b: there its 6 x 64 tile runs at ~75-85% of the FMA peak where OpenBLAS
 * reaches 60-70% (docs/kernels.md, "keng's f32 GEMM"). A transposed a (weight gradients gᵀ x)
 * and narrower products stay with OpenBLAS / smallk. */
static bool f32_fits(const mat *A, const view *b, kg_dtype wt, kg_dtype odt, int64_t N, int64_t M, int64_t K) {
  return wt == KG_F32 && odt == KG_F32 && b->dt == KG_F32 && !A->trans && N >= GF_MIN_ROWS && M >= GF_MIN_COLS &&
         K >= GF_MIN_K && kg_cpu_gemm_f32_ok();
}

/* one product out[batch..., N, M] = a[batch..., N, K] @ b[batch..., K, M] (+ bias[M] on every
 * row): out contiguous; a's and b's element strides given per dim of out's shape (broadcast
 * batch dims have stride 0) */
typedef struct {
  int nd;
  int64_t shape[KG_MAX_DIMS], K;
  char *o;
  kg_dtype odt;
  const char *a, *b;
  kg_dtype adt, bdt;
  int64_t astr[KG_MAX_DIMS], bstr[KG_MAX_DIMS];
  const void *bias; /* NULL, or M values in the compute type (f64 for f64 outputs, else f32) */
} product;

/* is a bf16 a row-major (unit column stride)? */
static bool bf16_rows(const view *a) { return a->cs == 1 && a->rs >= a->C; }

/* can the packed kernel read a as it lies? Many rows of a bf16 a with unit column stride, or unit
 * row stride (a transposed: the kernel packs its columns), against a bf16 b that bf16_direct
 * takes (AVX512_BF16): then a is not converted to f32 at all */
static bool bf16_raw_a(const view *a, const view *b, kg_dtype wt, int64_t N) {
  if (a->dt != KG_BF16 || N <= MM_BF16_ROWS) return false;
  if (!bf16_rows(a) && !(a->rs == 1 && a->cs >= a->R)) return false;
  mat none = {NULL, false, 0};
  return bf16_direct(b, wt, &none, N, KG_BF16);
}

/* the direct bf16 path (gemm_bf16.c) of one batch entry: it writes its rows itself, the bias
 * is added to them after (or to an f32 copy, so that a bf16/f16 output is rounded once). All the
 * rows go in one call: the many-rows kernel keeps a's bf16 K block in L2 (lab: 128-row blocks,
 * which stream the weight once per block, were 20% slower on the LM head). a is A (f32), or
 * when A is NULL the bf16 view av as it lies. */
static kg_status run_bf16_direct(const product *p, char *optr, const mat *A, const view *av, const view *bv, int64_t N,
                                 int64_t M, int64_t K, buf *cbuf) {
  const float *a = A ? A->p : NULL;
  int64_t lda = A ? A->ld : K;
  bool trans = bv->rs == 1;
  int64_t ldw = trans ? bv->cs : bv->rs;
  kg_gemm_bf16_opts go = {.a_bf16 = p->adt == KG_BF16}; /* then a's f32 copy packs back exactly */
  if (!A) {
    go.a16 = (const uint16_t *)av->p;
    go.a16_trans = !bf16_rows(av);
    go.lda16 = go.a16_trans ? av->cs : av->rs;
  }
  if (!p->bias) return kg_cpu_gemm_bf16(optr, p->odt, M, a, lda, (const uint16_t *)bv->p, ldw, trans, N, M, K, &go);
  bool f32 = p->odt == KG_F32;
  float *cp = f32 ? (float *)optr : buf_get(cbuf, (size_t)(N * M * 4));
  if (!cp) return kg_error(KG_ERR_OOM, "linear", "out of memory for the f32 result");
  KG_TRY(kg_cpu_gemm_bf16(cp, KG_F32, M, a, lda, (const uint16_t *)bv->p, ldw, trans, N, M, K, &go));
  if (f32) {
    const float *bias = p->bias;
    for (int64_t r = 0; r < N; r++)
      for (int64_t j = 0; j < M; j++) cp[r * M + j] += bias[j];
  } else {
    store_bias_f32(optr, p->odt, cp, p->bias, N, M);
  }
  return KG_OK;
}

/* out = the bias rows (or +0) when K == 0 */
static void empty_product(const product *p, int64_t rows, int64_t M) {
  int os = kg_dtype_info[p->odt].size;
  if (!p->bias) {
    memset(p->o, 0, (size_t)(rows * M * os)); /* +0 in every float dtype */
    return;
  }
  for (int64_t r = 0; r < rows; r++) {
    if (p->odt == KG_F64) kg_cpu_store_f64(p->o + r * M * os, p->odt, 1, p->bias, M);
    else kg_cpu_store_f32(p->o + r * M * os, p->odt, 1, p->bias, M);
  }
}

/* the operands of batch entry bi: a and b views, offsets in elements */
static void entry_views(const product *p, int64_t bi, int64_t N, int64_t M, view *av, view *bv, int64_t *aoff,
                        int64_t *boff) {
  int nd = p->nd;
  int64_t rem = bi, ao = 0, bo = 0;
  for (int d = nd - 3; d >= 0; d--) {
    int64_t i = rem % p->shape[d];
    rem /= p->shape[d];
    ao += i * p->astr[d];
    bo += i * p->bstr[d];
  }
  *av = (view){p->a + ao * kg_dtype_info[p->adt].size, p->adt, N, p->K, p->astr[nd - 2], p->astr[nd - 1]};
  *bv = (view){p->b + bo * kg_dtype_info[p->bdt].size, p->bdt, p->K, M, p->bstr[nd - 2], p->bstr[nd - 1]};
  if (aoff) *aoff = ao, *boff = bo;
}

/* many small products whose operands go to BLAS as they lie (attention-style [b, n, k] @
 * [b, k, m]: sam's relative-position terms [7,756,64] @ [7,64,7] and [16,192,64] @ [16,64,16]):
 * one single-threaded GEMM per batch entry, the entries shared among the threads. One entry at
 * a time, each GEMM woke OpenBLAS's threads for well under 1 MFLOP (sam_tiny predict: 18-37
 * GFLOP/s). Returns false (nothing done) when the product is not of that kind. */
static bool small_batch(const product *p, int64_t batch, int64_t N, int64_t M, int64_t K, kg_dtype wt) {
  if (batch < 2 || p->adt != wt || p->bdt != wt || p->odt != wt || 2.0 * (double)N * (double)M * (double)K >= MM_PAR_FLOPS)
    return false;
  int nt = kg_num_threads();
  if (nt < 2 || 2.0 * (double)batch * (double)N * (double)M * (double)K < MM_PAR_FLOPS) return false;
  view av, bv;
  mat A, B;
  entry_views(p, 0, N, M, &av, &bv, NULL, NULL);
  if (!direct(&av, wt, &A) || !direct(&bv, wt, &B)) return false; /* strides are those of every entry */
  int ws = kg_dtype_info[wt].size;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bi = 0; bi < batch; bi++) {
    view a1, b1;
    entry_views(p, bi, N, M, &a1, &b1, NULL, NULL);
    mat A1 = A, B1 = B; /* entry 0's layout, this entry's matrices */
    A1.p = a1.p, B1.p = b1.p;
    char *optr = p->o + bi * N * M * ws;
    if (p->bias) fill_bias(wt, optr, M, N, M, p->bias, 0, 1);
    gemm(wt, N, M, K, &A1, &B1, optr, M, p->bias != NULL);
  }
  return true;
}

static kg_status run_product(const product *p, const char *op) {
  int nd = p->nd;
  int64_t N = p->shape[nd - 2], M = p->shape[nd - 1], K = p->K;
  int64_t batch = 1;
  for (int d = 0; d < nd; d++) batch *= p->shape[d];
  batch = N * M > 0 ? batch / (N * M) : 0;
  kg_dtype wt = p->odt == KG_F64 ? KG_F64 : KG_F32, odt = p->odt;
  kg_flop_add((uint64_t)(2 * batch * N * M * K));
  if (batch == 0) return KG_OK;
  int os = kg_dtype_info[odt].size;
  int ws = kg_dtype_info[wt].size;
  if (K == 0) {
    empty_product(p, batch * N, M);
    return KG_OK;
  }
  /* b broadcast over every batch dim, and a's batch dims continue its rows: one GEMM */
  if (batch > 1) {
    bool fold = true;
    int64_t expect = p->astr[nd - 2] * N;
    for (int d = nd - 3; d >= 0; d--) {
      if (p->shape[d] == 1) continue;
      if (p->bstr[d] != 0 || p->astr[d] != expect) fold = false;
      expect *= p->shape[d];
    }
    if (fold) N *= batch, batch = 1;
  }
  if (small_batch(p, batch, N, M, K, wt)) return KG_OK;
  buf abuf = {0}, bbuf = {0}, cbuf = {0};
  int64_t last_aoff = -1, last_boff = -1;
  mat A, B;
  kg_status st = KG_OK;
  for (int64_t bi = 0; bi < batch && st == KG_OK && !kg_interrupt_pending(); bi++) {
    int64_t aoff, boff;
    view av, bv;
    entry_views(p, bi, N, M, &av, &bv, &aoff, &boff);
    char *optr = p->o + bi * N * M * os;
    if (bf16_raw_a(&av, &bv, wt, N)) { /* training rows: a and b read as bf16 */
      st = run_bf16_direct(p, optr, NULL, &av, &bv, N, M, K, &cbuf);
      last_aoff = -1; /* A not converted */
      continue;
    }
    if (aoff != last_aoff && !direct(&av, wt, &A)) {
      void *ap = buf_get(&abuf, (size_t)(N * K * ws));
      if (!ap) {
        st = kg_error(KG_ERR_OOM, op, "out of memory converting operands");
        break;
      }
      A = convert(ap, wt, &av, 0, K);
    }
    last_aoff = aoff;
    if (bf16_direct(&bv, wt, &A, N, p->adt)) { /* read the bf16 weight directly */
      st = run_bf16_direct(p, optr, &A, &av, &bv, N, M, K, &cbuf);
      continue;
    }
    if (f32_fits(&A, &bv, wt, odt, N, M, K)) { /* the ViT/BERT linears and their input gradients */
      int nt = 2.0 * (double)N * (double)M * (double)K >= MM_PAR_FLOPS ? kg_num_threads() : 1;
      kg_status s = kg_cpu_gemm_f32((float *)optr, M, A.p, A.ld, (const float *)bv.p, bv.rs, bv.cs, N, M, K, p->bias, nt);
      if (s != KG_ERR_OOM) { /* out of memory for its packed b: OpenBLAS packs smaller blocks */
        st = s;
        continue;
      }
    }
    if (wt == KG_F32 && odt == KG_F32 && smallk(&A, &bv, (float *)optr, N, M, K, p->bias)) continue;
    bool bdirect = direct(&bv, wt, &B);
    if (!bdirect && N < MM_BLOCK_ROWS) { /* few rows: convert b in cache-sized column blocks */
      st = blocked(wt, &A, &bv, optr, odt, N, M, K, p->bias);
      last_boff = -1;
      continue;
    }
    if (!bdirect && boff != last_boff) {
      void *bp = buf_get(&bbuf, (size_t)(K * M * ws));
      if (!bp) {
        st = kg_error(KG_ERR_OOM, op, "out of memory converting operands");
        break;
      }
      B = convert(bp, wt, &bv, 0, M);
      last_boff = boff;
    }
    void *cp = optr;
    if (odt != wt && !(cp = buf_get(&cbuf, (size_t)(N * M * 4)))) {
      st = kg_error(KG_ERR_OOM, op, "out of memory for the f32 result");
      break;
    }
    threaded_gemm(wt, N, M, K, &A, &B, cp, p->bias);
    if (cp != optr) kg_cpu_store_f32(optr, odt, 1, cp, N * M);
  }
  buf_free(&abuf);
  buf_free(&bbuf);
  buf_free(&cbuf);
  return st;
}

kg_status kg_cpu_matmul(const kg_op_call *c) {
  const kg_tensor *a = c->in[0], *b = c->in[1];
  kg_tensor *o = c->out[0];
  int nd = o->ndim, na = a->ndim, nb = b->ndim;
  product p = {.nd = nd, .K = a->shape[na - 1], .o = kg_data(o), .odt = o->dtype, .a = kg_data(a), .b = kg_data(b),
               .adt = a->dtype, .bdt = b->dtype};
  memcpy(p.shape, o->shape, sizeof(int64_t) * (size_t)nd);
  kg_broadcast_strides(a, nd, o->shape, p.astr); /* batch dims broadcast; last two are a's own */
  kg_broadcast_strides(b, nd, o->shape, p.bstr);
  p.astr[nd - 2] = a->stride[na - 2], p.astr[nd - 1] = a->stride[na - 1];
  p.bstr[nd - 2] = b->stride[nb - 2], p.bstr[nd - 1] = b->stride[nb - 1];
  return run_product(&p, "matmul");
}

/* in = {x [..., I], w [O, I], b [O] or NULL}, out = y [..., O] contiguous: the product x @ wᵀ
 * with wᵀ read through swapped strides; a 1-D x is one row */
kg_status kg_cpu_linear(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
  kg_tensor *y = c->out[0];
  int nx = x->ndim;
  int64_t nout = w->shape[0], nin = w->shape[1]; /* not O, I: complex.h defines I */
  product p = {.nd = nx < 2 ? 2 : nx, .K = nin, .o = kg_data(y), .odt = y->dtype, .a = kg_data(x), .b = kg_data(w),
               .adt = x->dtype, .bdt = w->dtype};
  int nd = p.nd;
  if (nx < 2) {
    p.shape[0] = 1, p.astr[0] = nin; /* one row; its stride only has to look dense */
  } else {
    for (int d = 0; d < nx - 1; d++) p.shape[d] = x->shape[d], p.astr[d] = x->stride[d];
  }
  p.shape[nd - 1] = nout;
  p.astr[nd - 1] = x->stride[nx - 1];
  for (int d = 0; d < nd - 2; d++) p.bstr[d] = 0;
  p.bstr[nd - 2] = w->stride[1], p.bstr[nd - 1] = w->stride[0]; /* wᵀ [I, O] */
  kg_dtype wt = y->dtype == KG_F64 ? KG_F64 : KG_F32;
  buf bb = {0};
  if (b) {
    void *bp = buf_get(&bb, (size_t)(nout > 0 ? nout : 1) * kg_dtype_info[wt].size);
    if (!bp) return kg_error(KG_ERR_OOM, "linear", "out of memory converting the bias");
    load_run(bp, wt, kg_data(b), b->dtype, b->stride[0], nout);
    p.bias = bp;
  }
  kg_status st = run_product(&p, "linear");
  buf_free(&bb);
  return st;
}
