/* attention.c (cpu) — fused flash-style scaled-dot-product attention (forward and backward)
 * and rotary position embedding.
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads (head h reads kv head h / (H/Hkv)),
 * T query length, S key length, D head dim. q: [B, H, T, D], k, v: [B, Hkv, S, D], mask
 * broadcast to [B, H, T, S], out: [B, H, T, D], lse: [B, H, T].
 *
 * Forward: each task is one (b, h, block of BQ queries); it walks blocks of BK keys with an
 * online softmax (running max m and sum l per row, the accumulator rescaled when m grows), so
 * no [T, S] score matrix exists; key blocks outside the causal/window band are never visited.
 * Here the tile products (Q·Kᵀ, P·V and the backward's) run through BLAS gemm on f32/f64
 * buffers: the path of f64, and of f32 compute on CPUs without AVX2/FMA. Otherwise f32 compute
 * (f32, bf16, f16 tensors) runs attention_avx2.c's register-blocked tiles, same contract.
 * Backward recomputes probabilities from the saved logsumexp: pass 1 per (b, h, query block)
 * gives dq; pass 2 per (b, kv head, key block) gives dk and dv, summing over the query heads of
 * its group — no two tasks write the same row, so no atomics. Compute is f32 (f64 for f64).
 * Reference: the naive softmax(Q·Kᵀ·scale + mask)·V in tests/lua/attention_spec.lua.
 */
#include "attention.h"

#include <cblas.h>
#include <keng/scalar.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#define BQ 64 /* queries per task (BLAS tiles) */
#define BK 64 /* keys per inner block (BLAS tiles) */

kg_attn_tuning kg_attn_tune = {KG_ATTN_AUTO, 64, 64, 128};

typedef kg_attn_view view4;
typedef kg_attn_plan plan;
#define view_of kg_attn_view_of
#define at kg_attn_at
#define key_lo kg_attn_key_lo
#define key_hi kg_attn_key_hi

/* rel_h, rel_w: NULL, or SAM's decomposed bias [B, H, T, kh] and [B, H, T, kw] (attention.h) */
static plan make_plan(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                      const kg_tensor *rel_h, const kg_tensor *rel_w, const kg_sdpa_params *p) {
  plan P = {q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2], q->shape[3], 0, p->window,
            p->causal, mask != NULL, p->scale, view_of(q, q->stride), view_of(k, k->stride), view_of(v, v->stride),
            {0}};
  P.off = P.S - P.T;
  if (P.scale == 0) P.scale = 1.0 / sqrt((double)P.D);
  if (mask) {
    int64_t full[4] = {P.B, P.H, P.T, P.S}, st[4];
    kg_broadcast_strides(mask, 4, full, st);
    P.m = view_of(mask, st);
  }
  if (rel_h && rel_w) {
    P.has_rel = true, P.kh = rel_h->shape[3], P.kw = rel_w->shape[3];
    P.rh = view_of(rel_h, rel_h->stride), P.rw = view_of(rel_w, rel_w->stride);
  }
  return P;
}

/* s[c] <- e^(s[c] - m) for c < n. The f32 version has no calls or branches, so it vectorises
 * (no-trapping-math lets the compiler turn the clamps into selects): x = k·ln2 + r with
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error below 2.5e-7 on
 * [-87, 0], about 2 ulp); x below -87.3 (and -inf, a hidden key) gives exactly 0, NaN stays NaN. */
#define KG_NO_TRAP __attribute__((optimize("no-trapping-math")))
KG_NO_TRAP static inline float exp_f32(float x) {
  float xc = x < -87.3f ? -87.3f : x > 88.0f ? 88.0f : x;
  float k = floorf(xc * 1.44269504f + 0.5f);
  float r = xc - k * 0.693145751953125f - k * 1.428606765330187e-06f;
  float p = 1 + r * (1 + r * (0.5f + r * (1 / 6.0f + r * (1 / 24.0f + r * (1 / 120.0f + r * (1 / 720.0f))))));
  union { int32_t i; float f; } two_k = {((int32_t)k + 127) << 23};
  return x < -87.3f ? 0.0f : p * two_k.f;
}
KG_NO_TRAP static void exp_row_f32(float *s, int64_t n, float m) {
  for (int64_t c = 0; c < n; c++) s[c] = exp_f32(s[c] - m);
}
static void exp_row_f64(double *s, int64_t n, double m) {
  for (int64_t c = 0; c < n; c++) s[c] = exp(s[c] - m);
}

/* Functions over one compute type FT (float, or double for f64); LOAD/STORE convert runs and
 * GEMM is cblas_sgemm/dgemm (single-threaded inside the OpenMP region), on tiles:
 *   load_rows: rows i0.. of x (b, h) times mul -> dst [n, D]
 *   band_row:  score row s [nk] of query i against keys j0..: mask and band applied (-inf where
 *              hidden); returns the row max */
#define DEFINE_SDPA(FT, SUF, LOAD, STORE, GEMM, EXP_ROW)                                                           \
  static void load_rows_##SUF(FT *dst, const view4 *x, int64_t b, int64_t h, int64_t i0, int64_t n,        \
                              int64_t D, FT mul) {                                                        \
    for (int64_t r = 0; r < n; r++) {                                                                     \
      LOAD(dst + r * D, at(x, b, h, i0 + r), x->dt, x->st[3], D);                                         \
      if (mul != 1)                                                                                       \
        for (int64_t d = 0; d < D; d++) dst[r * D + d] *= mul;                                            \
    }                                                                                                     \
  }                                                                                                       \
  static FT band_row_##SUF(FT *s, FT *mrow, const plan *P, int64_t b, int64_t h, int64_t i, int64_t j0,   \
                           int64_t nk) {                                                                  \
    if (P->has_mask) {                                                                                    \
      LOAD(mrow, P->m.base + (b * P->m.st[0] + h * P->m.st[1] + i * P->m.st[2] + j0 * P->m.st[3]) * P->m.es, \
           P->m.dt, P->m.st[3], nk);                                                                      \
      if (P->m.dt == KG_BOOL)                                                                             \
        for (int64_t c = 0; c < nk; c++) s[c] = mrow[c] != 0 ? s[c] : (FT)-INFINITY;                      \
      else                                                                                                \
        for (int64_t c = 0; c < nk; c++) s[c] += mrow[c];                                                 \
    }                                                                                                     \
    if (P->has_rel) { /* mrow [BK + kh + kw]: rh and rw's rows after the mask's */                        \
      FT *rh = mrow + BK, *rw = rh + P->kh;                                                               \
      LOAD(rh, at(&P->rh, b, h, i), P->rh.dt, P->rh.st[3], P->kh);                                        \
      LOAD(rw, at(&P->rw, b, h, i), P->rw.dt, P->rw.st[3], P->kw);                                        \
      for (int64_t c = 0; c < nk; c++) s[c] += rh[(j0 + c) / P->kw] + rw[(j0 + c) % P->kw];               \
    }                                                                                                     \
    int64_t lo = key_lo(P, i) - j0, hi = key_hi(P, i) - j0;                                               \
    for (int64_t c = 0; c < lo && c < nk; c++) s[c] = -INFINITY;                                          \
    for (int64_t c = hi > 0 ? hi : 0; c < nk; c++) s[c] = -INFINITY;                                      \
    FT mx = -INFINITY;                                                                                    \
    for (int64_t c = 0; c < nk; c++) mx = s[c] > mx ? s[c] : mx;                                          \
    return mx;                                                                                            \
  }                                                                                                       \
                                                                                                          \
  static void sdpa_fwd_##SUF(const plan *P, kg_tensor *out, FT *lse) {                                    \
    int64_t D = P->D, G = P->H / P->Hkv, nqb = (P->T + BQ - 1) / BQ, ntask = P->B * P->H * nqb;           \
    int64_t R = P->kh + P->kw; /* the rel bias rows' scratch */                                           \
    view4 o = view_of(out, out->stride);                                                                  \
    _Pragma("omp parallel if (ntask > 1 && P->T * P->S * P->D > 16384)") {                                \
      FT *qs = malloc(sizeof(FT) * (size_t)(2 * BQ * D + 2 * BK * D + BQ * BK + BK + R + 2 * BQ));       \
      FT *acc = qs + BQ * D, *kb = acc + BQ * D, *vb = kb + BK * D, *s = vb + BK * D, *mrow = s + BQ * BK; \
      FT *m = mrow + BK + R, *l = m + BQ;                                                                 \
      _Pragma("omp for schedule(dynamic)") for (int64_t task = 0; task < ntask; task++) {                 \
        int64_t b = task / (P->H * nqb), h = task / nqb % P->H, hk = h / G, i0 = task % nqb * BQ;         \
        int64_t nq = P->T - i0 < BQ ? P->T - i0 : BQ;                                                     \
        load_rows_##SUF(qs, &P->q, b, h, i0, nq, D, (FT)P->scale);                                        \
        memset(acc, 0, sizeof(FT) * (size_t)(nq * D));                                                    \
        for (int64_t r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;                                      \
        int64_t jlo = key_lo(P, i0), jhi = key_hi(P, i0 + nq - 1);                                       \
        for (int64_t j0 = jlo; j0 < jhi; j0 += BK) {                                                      \
          int64_t nk = jhi - j0 < BK ? jhi - j0 : BK;                                                     \
          load_rows_##SUF(kb, &P->k, b, hk, j0, nk, D, 1);                                                \
          load_rows_##SUF(vb, &P->v, b, hk, j0, nk, D, 1);                                                \
          /* s [nq, nk] = qs · kbᵀ */                                                                     \
          GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1, qs, D, kb, D, 0, s, BK);            \
          for (int64_t r = 0; r < nq; r++) {                                                              \
            FT *sr = s + r * BK, mx = band_row_##SUF(sr, mrow, P, b, h, i0 + r, j0, nk);                  \
            FT mnew = mx > m[r] ? mx : m[r];                                                              \
            if (mnew == -INFINITY) { /* nothing visible yet: this row adds nothing */                    \
              memset(sr, 0, sizeof(FT) * (size_t)nk);                                                     \
              continue;                                                                                   \
            }                                                                                             \
            FT corr = exp(m[r] - mnew), sum = 0, *a = acc + r * D;                                        \
            EXP_ROW(sr, nk, mnew);                                                                        \
            for (int64_t c = 0; c < nk; c++) sum += sr[c];                                                \
            l[r] = l[r] * corr + sum;                                                                     \
            m[r] = mnew;                                                                                  \
            if (corr != 1)                                                                                \
              for (int64_t d = 0; d < D; d++) a[d] *= corr;                                               \
          }                                                                                               \
          /* acc [nq, D] += p [nq, nk] · vb [nk, D] */                                                    \
          GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1, s, BK, vb, D, 1, acc, D);         \
        }                                                                                                 \
        for (int64_t r = 0; r < nq; r++) { /* rows that see no key give zeros and lse -inf */             \
          FT *a = acc + r * D, inv = l[r] > 0 ? 1 / l[r] : 0;                                             \
          for (int64_t d = 0; d < D; d++) a[d] *= inv;                                                    \
          STORE((char *)at(&o, b, h, i0 + r), o.dt, o.st[3], a, D);                                       \
          lse[(b * P->H + h) * P->T + i0 + r] = l[r] > 0 ? m[r] + log(l[r]) : (FT)-INFINITY;              \
        }                                                                                                 \
      }                                                                                                   \
      free(qs);                                                                                           \
    }                                                                                                     \
  }                                                                                                       \
                                                                                                          \
  /* Tiles of one (query block, key block): s <- P = exp(qs·kbᵀ - lse) and dp <- dS =            \
   * P ∘ (dO·vbᵀ - delta); rows that see no key are zero. */                                              \
  static void probs_##SUF(FT *s, FT *dp, FT *mrow, const plan *P, const FT *qs, const FT *dob, const FT *kb, \
                          const FT *vb, const FT *lse, const FT *delta, int64_t b, int64_t h, int64_t i0,  \
                          int64_t nq, int64_t j0, int64_t nk) {                                           \
    int64_t D = P->D, row0 = (b * P->H + h) * P->T + i0;                                                  \
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1, qs, D, kb, D, 0, s, BK);                  \
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1, dob, D, vb, D, 0, dp, BK);                \
    for (int64_t r = 0; r < nq; r++) {                                                                    \
      FT *sr = s + r * BK, *dr = dp + r * BK, L = lse[row0 + r], dl = delta[row0 + r];                    \
      if (L == -INFINITY) {                                                                               \
        memset(sr, 0, sizeof(FT) * (size_t)nk);                                                           \
        memset(dr, 0, sizeof(FT) * (size_t)nk);                                                           \
        continue;                                                                                         \
      }                                                                                                   \
      band_row_##SUF(sr, mrow, P, b, h, i0 + r, j0, nk);                                                  \
      EXP_ROW(sr, nk, L);                                                                                 \
      for (int64_t c = 0; c < nk; c++) dr[c] = sr[c] * (dr[c] - dl);                                      \
    }                                                                                                     \
  }                                                                                                       \
                                                                                                          \
  /* in: q, k, v, mask, out, lse, dout[, rel_h, rel_w]; out: dq, dk, dv[, drel_h, drel_w] */              \
  static void sdpa_bwd_##SUF(const plan *P, const kg_op_call *c) {                                        \
    int64_t D = P->D, G = P->H / P->Hkv, nqb = (P->T + BQ - 1) / BQ, nkb = (P->S + BK - 1) / BK;          \
    int64_t R = P->kh + P->kw;                                                                            \
    int64_t nrow = P->B * P->H * P->T;                                                                    \
    const FT *lse = kg_data(c->in[5]);                                                                    \
    view4 o = view_of(c->in[4], c->in[4]->stride), g = view_of(c->in[6], c->in[6]->stride);               \
    view4 dq = view_of(c->out[0], c->out[0]->stride), dk = view_of(c->out[1], c->out[1]->stride);         \
    view4 dv = view_of(c->out[2], c->out[2]->stride), drh = {0}, drw = {0};                               \
    if (P->has_rel) drh = view_of(c->out[3], c->out[3]->stride), drw = view_of(c->out[4], c->out[4]->stride); \
    FT *delta = malloc(sizeof(FT) * (size_t)(nrow > 0 ? nrow : 1)); /* delta_i = dO_i · O_i */            \
    bool par = P->T * P->S * P->D > 16384;                                                                \
    _Pragma("omp parallel if (par)") {                                                                    \
      FT *qs = malloc(sizeof(FT) * (size_t)(3 * BQ * D + 4 * BK * D + 2 * BQ * BK + BK + R + BQ * R));    \
      FT *dob = qs + BQ * D, *acc = dob + BQ * D, *kb = acc + BQ * D, *vb = kb + BK * D, *ak = vb + BK * D; \
      FT *av = ak + BK * D, *s = av + BK * D, *dp = s + BQ * BK, *mrow = dp + BQ * BK;                    \
      FT *grel = mrow + BK + R; /* [nq, kh + kw]: the rel bias's gradient of the task's rows */         \
      _Pragma("omp for schedule(static)") for (int64_t row = 0; row < nrow; row++) {                      \
        int64_t b = row / (P->H * P->T), h = row / P->T % P->H, i = row % P->T;                           \
        LOAD(qs, at(&o, b, h, i), o.dt, o.st[3], D);                                                      \
        LOAD(dob, at(&g, b, h, i), g.dt, g.st[3], D);                                                     \
        FT sum = 0;                                                                                       \
        for (int64_t d = 0; d < D; d++) sum += qs[d] * dob[d];                                            \
        delta[row] = sum;                                                                                 \
      }                                                                                                   \
      /* pass 1: dq [nq, D] = scale · dS [nq, nk] · kb [nk, D], over key blocks */                        \
      _Pragma("omp for schedule(dynamic)") for (int64_t task = 0; task < P->B * P->H * nqb; task++) {     \
        int64_t b = task / (P->H * nqb), h = task / nqb % P->H, hk = h / G, i0 = task % nqb * BQ;         \
        int64_t nq = P->T - i0 < BQ ? P->T - i0 : BQ;                                                     \
        load_rows_##SUF(qs, &P->q, b, h, i0, nq, D, (FT)P->scale);                                        \
        load_rows_##SUF(dob, &g, b, h, i0, nq, D, 1);                                                     \
        memset(acc, 0, sizeof(FT) * (size_t)(nq * D));                                                    \
        memset(grel, 0, sizeof(FT) * (size_t)(nq * R));                                                   \
        int64_t jlo = key_lo(P, i0), jhi = key_hi(P, i0 + nq - 1);                                       \
        for (int64_t j0 = jlo; j0 < jhi; j0 += BK) {                                                      \
          int64_t nk = jhi - j0 < BK ? jhi - j0 : BK;                                                     \
          load_rows_##SUF(kb, &P->k, b, hk, j0, nk, D, 1);                                                \
          load_rows_##SUF(vb, &P->v, b, hk, j0, nk, D, 1);                                                \
          probs_##SUF(s, dp, mrow, P, qs, dob, kb, vb, lse, delta, b, h, i0, nq, j0, nk);                 \
          GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, (FT)P->scale, dp, BK, kb, D, 1, acc, D); \
          for (int64_t r = 0; P->has_rel && r < nq; r++) /* d bias = dS: rows summed by grid row / col */ \
            for (int64_t cc = 0; cc < nk; cc++) {                                                         \
              grel[r * R + (j0 + cc) / P->kw] += dp[r * BK + cc];                                         \
              grel[r * R + P->kh + (j0 + cc) % P->kw] += dp[r * BK + cc];                                 \
            }                                                                                             \
        }                                                                                                 \
        for (int64_t r = 0; r < nq; r++) {                                                                \
          STORE((char *)at(&dq, b, h, i0 + r), dq.dt, dq.st[3], acc + r * D, D);                          \
          if (P->has_rel) {                                                                               \
            STORE((char *)at(&drh, b, h, i0 + r), drh.dt, drh.st[3], grel + r * R, P->kh);                \
            STORE((char *)at(&drw, b, h, i0 + r), drw.dt, drw.st[3], grel + r * R + P->kh, P->kw);        \
          }                                                                                               \
        }                                                                                                 \
      }                                                                                                   \
      /* pass 2: dv = Pᵀ · dO, dk = dSᵀ · (scale · Q), over the G query heads of kv head hk */            \
      _Pragma("omp for schedule(dynamic)") for (int64_t task = 0; task < P->B * P->Hkv * nkb; task++) {   \
        int64_t b = task / (P->Hkv * nkb), hk = task / nkb % P->Hkv, j0 = task % nkb * BK;                \
        int64_t nk = P->S - j0 < BK ? P->S - j0 : BK;                                                     \
        load_rows_##SUF(kb, &P->k, b, hk, j0, nk, D, 1);                                                  \
        load_rows_##SUF(vb, &P->v, b, hk, j0, nk, D, 1);                                                  \
        memset(ak, 0, sizeof(FT) * (size_t)(nk * D));                                                     \
        memset(av, 0, sizeof(FT) * (size_t)(nk * D));                                                     \
        /* queries that see some key of [j0, j0 + nk): i + off >= j0, i + off - window < j0 + nk - 1 */   \
        int64_t ilo = P->causal ? j0 - P->off : 0, ihi = P->T;                                            \
        if (P->window > 0 && j0 + nk - 1 - P->off + P->window < ihi) ihi = j0 + nk - 1 - P->off + P->window; \
        if (ilo < 0) ilo = 0;                                                                             \
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)                                                   \
          for (int64_t i0 = ilo; i0 < ihi; i0 += BQ) {                                                    \
            int64_t nq = ihi - i0 < BQ ? ihi - i0 : BQ;                                                   \
            load_rows_##SUF(qs, &P->q, b, h, i0, nq, D, (FT)P->scale);                                    \
            load_rows_##SUF(dob, &g, b, h, i0, nq, D, 1);                                                 \
            probs_##SUF(s, dp, mrow, P, qs, dob, kb, vb, lse, delta, b, h, i0, nq, j0, nk);               \
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1, s, BK, dob, D, 1, av, D);         \
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1, dp, BK, qs, D, 1, ak, D);         \
          }                                                                                               \
        for (int64_t cc = 0; cc < nk; cc++) {                                                             \
          STORE((char *)at(&dk, b, hk, j0 + cc), dk.dt, dk.st[3], ak + cc * D, D);                        \
          STORE((char *)at(&dv, b, hk, j0 + cc), dv.dt, dv.st[3], av + cc * D, D);                        \
        }                                                                                                 \
      }                                                                                                   \
      free(qs);                                                                                           \
    }                                                                                                     \
    free(delta);                                                                                          \
  }

DEFINE_SDPA(float, f32, kg_cpu_load_f32, kg_cpu_store_f32, cblas_sgemm, exp_row_f32)
DEFINE_SDPA(double, f64, kg_cpu_load_f64, kg_cpu_store_f64, cblas_dgemm, exp_row_f64)

/* the AVX2 micro-kernels unless the lab asks for the BLAS tiles or the CPU lacks AVX2/FMA */
static bool use_avx2_tiles(void) {
  return kg_attn_tune.variant != KG_ATTN_BLAS && kg_attn_avx2_available();
}

/* in: q, k, v, mask (or NULL)[, rel_h, rel_w]; out: out [B, H, T, D], lse [B, H, T] (f32, f64 for f64) */
kg_status kg_cpu_scaled_dot_product_attention(const kg_op_call *c) {
  plan P = make_plan(c->in[0], c->in[1], c->in[2], c->nin > 3 ? c->in[3] : NULL, c->nin > 5 ? c->in[4] : NULL,
                     c->nin > 5 ? c->in[5] : NULL, c->params);
  if (P.B * P.H * P.T == 0) return KG_OK;
  if (P.D == 0) return kg_cpu_fill_value(c->out[1], P.S ? log((double)P.S) : -INFINITY); /* all scores 0 */
  kg_flop_add((uint64_t)(4 * P.B * P.H * P.T * P.S * P.D));
  if (c->out[1]->dtype == KG_F64) sdpa_fwd_f64(&P, c->out[0], kg_data(c->out[1]));
  else if (use_avx2_tiles() && !P.has_rel && kg_attn_fwd_decode(&P, c->out[0], kg_data(c->out[1]))) return KG_OK;
  else if (use_avx2_tiles()) kg_attn_fwd_avx2(&P, c->out[0], kg_data(c->out[1]));
  else sdpa_fwd_f32(&P, c->out[0], kg_data(c->out[1]));
  return KG_OK;
}

/* in: q, k, v, mask, out, lse, dout[, rel_h, rel_w]; out: dq, dk, dv[, drel_h, drel_w] (every row of
 * each is written) */
kg_status kg_cpu_sdpa_backward(const kg_op_call *c) {
  plan P = make_plan(c->in[0], c->in[1], c->in[2], c->in[3], c->nin > 8 ? c->in[7] : NULL,
                     c->nin > 8 ? c->in[8] : NULL, c->params);
  if (P.B * P.H * P.T * P.D == 0 || P.S == 0) {
    for (int i = 0; i < c->nout; i++) kg_cpu_fill_value(c->out[i], 0);
    return KG_OK;
  }
  kg_flop_add((uint64_t)(10 * P.B * P.H * P.T * P.S * P.D));
  if (c->in[5]->dtype == KG_F64) sdpa_bwd_f64(&P, c);
  else if (use_avx2_tiles()) kg_attn_bwd_avx2(&P, c);
  else sdpa_bwd_f32(&P, c);
  return KG_OK;
}

/* ---- rotary position embedding ------------------------------------------------------------ */

/* (x1, x2) rotated by angle θ with (cos θ, sin θ) = (cs, sn): Hugging Face's rotate_half */
static inline void rope_rotate(double x1, double x2, double cs, double sn, double *y1, double *y2) {
  *y1 = x1 * cs - x2 * sn;
  *y2 = x2 * cs + x1 * sn;
}
static inline void rope_rotate_f32(float x1, float x2, float cs, float sn, float *y1, float *y2) {
  *y1 = x1 * cs - x2 * sn;
  *y2 = x2 * cs + x1 * sn;
}

/* in: x [..., T, D] contiguous, positions [T] or [Bp, T], inv_freq NULL or [D/2]; out like x.
 * Angle = pos · inv_freq[i] (base^(-2i/D) by default), computed in f64; cos/sin tabulated once
 * per (distinct position row, t), times p->scale. */
kg_status kg_cpu_rope(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *pos = c->in[1], *freq = c->in[2];
  kg_tensor *y = c->out[0];
  const kg_rope_params *p = c->params;
  int64_t D = x->shape[x->ndim - 1], T = x->shape[x->ndim - 2], half = D / 2;
  int64_t nrow = kg_numel(x) / D, Bp = pos->ndim == 2 ? pos->shape[0] : 1;
  int64_t rows_per_b = Bp > 1 ? nrow / Bp : nrow; /* x's first dim is Bp when Bp > 1 */
  /* the cos/sin table is most of the op's time at decode sizes: a batch row of positions equal
   * to the previous one (decode of equal-length prompts) shares its entries (same[b]) */
  double *tab = malloc(sizeof(double) * (size_t)(2 * Bp * T * half + half) + sizeof(int64_t) * (size_t)Bp + 8);
  if (!tab) return kg_error(KG_ERR_OOM, "rope", "out of memory for the cos/sin table");
  double *inv_freq = tab + 2 * Bp * T * half;
  int64_t *same = (int64_t *)(inv_freq + half);
  for (int64_t i = 0; i < half; i++)
    inv_freq[i] = freq ? kg_load_as_double(kg_data(freq), freq->dtype, i * freq->stride[0])
                       : pow(p->base, -2.0 * (double)i / (double)D);
#define ROPE_POS(b, t) \
  kg_load_as_double(kg_data(pos), pos->dtype, (b) * (pos->ndim == 2 ? pos->stride[0] : 0) + (t) * pos->stride[pos->ndim - 1])
  for (int64_t b = 0; b < Bp; b++) {
    same[b] = b;
    if (b == 0) continue;
    bool eq = true;
    for (int64_t t = 0; t < T && eq; t++) eq = ROPE_POS(b, t) == ROPE_POS(b - 1, t);
    if (eq) same[b] = same[b - 1];
  }
#pragma omp parallel for if (Bp * T * half > KG_PAR_THRESHOLD / 8) schedule(static)
  for (int64_t bt = 0; bt < Bp * T; bt++) {
    if (same[bt / T] != bt / T) continue;
    double ps = ROPE_POS(bt / T, bt % T);
    for (int64_t i = 0; i < half; i++) {
      double th = ps * inv_freq[i];
      tab[2 * (bt * half + i)] = cos(th) * p->scale;
      tab[2 * (bt * half + i) + 1] = sin(th) * p->scale;
    }
  }
#undef ROPE_POS
  const char *xb = kg_data(x);
  char *yb = kg_data(y);
  int es = (int)kg_elem_size(x);
  bool wide = x->dtype == KG_F64;
#pragma omp parallel if (nrow * D > KG_PAR_THRESHOLD)
  {
    double bd[2 * KG_CHUNK];
    float bf[2 * KG_CHUNK];
#pragma omp for schedule(static)
    for (int64_t r = 0; r < nrow; r++) {
      const double *cs = tab + 2 * (same[r / rows_per_b % Bp] * T + r % T) * half;
      for (int64_t i0 = 0; i0 < half; i0 += KG_CHUNK) {
        int64_t n = half - i0 < KG_CHUNK ? half - i0 : KG_CHUNK;
        const char *x1 = xb + (r * D + i0) * es, *x2 = x1 + half * es;
        char *y1 = yb + (r * D + i0) * es, *y2 = y1 + half * es;
        if (wide) {
          kg_cpu_load_f64(bd, x1, x->dtype, 1, n);
          kg_cpu_load_f64(bd + KG_CHUNK, x2, x->dtype, 1, n);
          for (int64_t i = 0; i < n; i++)
            rope_rotate(bd[i], bd[KG_CHUNK + i], cs[2 * (i0 + i)], cs[2 * (i0 + i) + 1], &bd[i], &bd[KG_CHUNK + i]);
          kg_cpu_store_f64(y1, y->dtype, 1, bd, n);
          kg_cpu_store_f64(y2, y->dtype, 1, bd + KG_CHUNK, n);
        } else {
          kg_cpu_load_f32(bf, x1, x->dtype, 1, n);
          kg_cpu_load_f32(bf + KG_CHUNK, x2, x->dtype, 1, n);
          for (int64_t i = 0; i < n; i++)
            rope_rotate_f32(bf[i], bf[KG_CHUNK + i], (float)cs[2 * (i0 + i)], (float)cs[2 * (i0 + i) + 1], &bf[i],
                            &bf[KG_CHUNK + i]);
          kg_cpu_store_f32(y1, y->dtype, 1, bf, n);
          kg_cpu_store_f32(y2, y->dtype, 1, bf + KG_CHUNK, n);
        }
      }
    }
  }
  free(tab);
  return KG_OK;
}
