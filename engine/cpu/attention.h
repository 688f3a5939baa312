/* attention.h — internal to the CPU attention kernels (attention.c, attention_avx2.c) and
 * their lab (tests/lab/lab_attention.c): the plan of one SDPA call and the variant switch.
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads, T query length, S key length,
 * D head dim (see attention.c).
 */
#ifndef KENG_CPU_ATTENTION_H
#define KENG_CPU_ATTENTION_H

#include "cpu.h"

#include <math.h>

/* a strided 4-D operand: element (a, b, c, d) at base + (a*st[0] + ... + d*st[3]) * es */
typedef struct {
  const char *base;
  int64_t st[4];
  kg_dtype dt;
  int es;
} kg_attn_view;

static inline kg_attn_view kg_attn_view_of(const kg_tensor *t, const int64_t *st) {
  kg_attn_view v = {kg_data(t), {st[0], st[1], st[2], st[3]}, t->dtype, (int)kg_elem_size(t)};
  return v;
}
/* address of row (a, b, c) */
static inline const char *kg_attn_at(const kg_attn_view *v, int64_t a, int64_t b, int64_t c) {
  return v->base + (a * v->st[0] + b * v->st[1] + c * v->st[2]) * v->es;
}

typedef struct {
  int64_t B, H, Hkv, T, S, D, off, window; /* off = S - T: the causal diagonal */
  bool causal, has_mask;
  double scale;
  kg_attn_view q, k, v, m; /* m: the mask broadcast to [B, H, T, S] */
  /* SAM's decomposed relative-position bias, added to the scaled scores: key j = (j / kw,
   * j % kw) of a kh x kw grid (S = kh·kw) gets rh[b, h, i, j / kw] + rw[b, h, i, j % kw];
   * rh: [B, H, T, kh], rw: [B, H, T, kw] */
  bool has_rel;
  int64_t kh, kw;
  kg_attn_view rh, rw;
} kg_attn_plan;

/* s[c] += rh[(j0 + c) / kw] + rw[(j0 + c) % kw] for c < nk: the bias of query (b, h, i) against
 * keys j0.., with its rows loaded as f32 into tmp [kh + kw] (same sum order as the materialised
 * bias: (rh + rw) first, then added to the score) */
static inline void kg_attn_rel_row_f32(float *s, float *tmp, const kg_attn_plan *P, int64_t b, int64_t h, int64_t i,
                                       int64_t j0, int64_t nk) {
  /* f32 rows with unit stride are read in place: a copy call per row cost a tenth of a window */
  const float *rh = (const float *)kg_attn_at(&P->rh, b, h, i), *rw = (const float *)kg_attn_at(&P->rw, b, h, i);
  if (P->rh.dt != KG_F32 || P->rh.st[3] != 1) kg_cpu_load_f32(tmp, rh, P->rh.dt, P->rh.st[3], P->kh), rh = tmp;
  if (P->rw.dt != KG_F32 || P->rw.st[3] != 1) kg_cpu_load_f32(tmp + P->kh, rw, P->rw.dt, P->rw.st[3], P->kw), rw = tmp + P->kh;
  for (int64_t c = 0, ky = j0 / P->kw, kx = j0 % P->kw; c < nk; ky++, kx = 0) {
    int64_t n = P->kw - kx < nk - c ? P->kw - kx : nk - c;
    float a = rh[ky], *sc = s + c - kx;
    for (int64_t x = kx; x < kx + n; x++) sc[x] += a + rw[x];
    c += n;
  }
}
/* the bias's gradient from one row of dS (keys j0..j0+nk): gh[ky] += Σ_kx ds, gw[kx] += Σ_ky ds */
static inline void kg_attn_rel_grad_f32(float *gh, float *gw, const float *ds, const kg_attn_plan *P, int64_t j0,
                                        int64_t nk) {
  for (int64_t c = 0, ky = j0 / P->kw, kx = j0 % P->kw; c < nk; ky++, kx = 0) {
    int64_t n = P->kw - kx < nk - c ? P->kw - kx : nk - c;
    const float *dc = ds + c - kx;
    float sum = 0;
    for (int64_t x = kx; x < kx + n; x++) sum += dc[x], gw[x] += dc[x];
    gh[ky] += sum;
    c += n;
  }
}

/* keys visible to query i by the causal/window band: [lo, hi) */
static inline int64_t kg_attn_key_lo(const kg_attn_plan *P, int64_t i) {
  int64_t lo = P->window > 0 ? i + P->off - P->window + 1 : 0;
  return lo < 0 ? 0 : lo > P->S ? P->S : lo;
}
static inline int64_t kg_attn_key_hi(const kg_attn_plan *P, int64_t i) {
  int64_t hi = P->causal ? i + P->off + 1 : P->S;
  return hi < 0 ? 0 : hi > P->S ? P->S : hi;
}
/* queries that see some key of [j0, j0 + nk) by the band: [lo, hi) (may be empty) */
static inline void kg_attn_query_range(const kg_attn_plan *P, int64_t j0, int64_t nk, int64_t *lo, int64_t *hi) {
  int64_t ilo = P->causal ? j0 - P->off : 0, ihi = P->T;
  if (P->window > 0 && j0 + nk - 1 - P->off + P->window < ihi) ihi = j0 + nk - 1 - P->off + P->window;
  *lo = ilo < 0 ? 0 : ilo;
  *hi = ihi;
}

/* Which implementation runs the f32-compute paths (f64 always uses the BLAS tiles). The lab
 * sets these; the engine leaves them at their defaults (AUTO: AVX2 when the CPU has it). */
typedef enum { KG_ATTN_AUTO, KG_ATTN_BLAS, KG_ATTN_AVX2 } kg_attn_variant;
typedef struct {
  kg_attn_variant variant;
  int bq, bk; /* AVX2 query and key tile (bk a multiple of 8) */
  int bkf;    /* the forward's key tile (a multiple of 8), 0: bk. Larger than the backward's: the
                 online softmax pays per row and key tile (a max, two sums, an expf, a rescale of
                 the row's sums), and the backward's tiles are its dk/dv accumulators */
} kg_attn_tuning;
extern kg_attn_tuning kg_attn_tune;

bool kg_attn_avx2_available(void);
/* AVX2 + FMA kernels (attention_avx2.c): the same contract as the BLAS tiles in attention.c */
void kg_attn_fwd_avx2(const kg_attn_plan *P, kg_tensor *out, float *lse);
void kg_attn_bwd_avx2(const kg_attn_plan *P, const kg_op_call *c);
/* the decode step's forward (attention_decode.c): at most 4 query rows over an f32 or bf16 KV
 * cache read in place; false (nothing written) when the operands do not fit it */
bool kg_attn_fwd_decode(const kg_attn_plan *P, kg_tensor *out, float *lse);

#endif
