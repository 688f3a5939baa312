/* decode.c (cpu) — decode_qkv (engine/ops/decode.c): RoPE on the q and k heads of one [q; k; v]
 * projection, q out as [B, H, T, D], k and v into the KV cache at column col[t] mod L. The
 * rotation is kg_cpu_rope's (angle pos · inv_freq[i] in f64, inv_freq base^(-2i/D) unless given,
 * cos/sin times scale rounded to float and the pair rotated in float; f64 tensors in double), so
 * the fused step gives the unfused one's bits.
 * in: qkv [B, T, (H + 2·Hkv)·D], positions [B, T] or [T], col [T], inv_freq [D/2] or NULL (contiguous);
 * out: q [B, H, T, D], cache_k, cache_v [B, Hkv, L, D] (contiguous, written in place). */
#include "cpu.h"
#include "../ops/decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kg_status kg_cpu_decode_qkv(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *pos = c->in[1], *col = c->in[2], *freq = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *q = c->out[0], *ck = c->out[1], *cv = c->out[2];
  const kg_decode_qkv_params *p = c->params;
  int64_t B = x->shape[0], T = x->shape[1], H = p->heads, Hkv = p->kv_heads, nh = H + 2 * Hkv;
  int64_t D = x->shape[2] / nh, half = D / 2, L = ck->shape[2];
  int es = (int)kg_elem_size(x);
  bool wide = x->dtype == KG_F64;
  /* cos/sin per (b, t) and pair, computed once for all its heads (most of the op's time else) */
  double *tab = malloc(sizeof(double) * (size_t)(2 * B * T * half + half + 1));
  if (!tab) return kg_error(KG_ERR_OOM, "decode_qkv", "out of memory for the cos/sin table");
  double *inv = tab + 2 * B * T * half;
  for (int64_t i = 0; i < half; i++)
    inv[i] = freq ? kg_load_as_double(kg_data(freq), freq->dtype, i) : pow(p->base, -2.0 * (double)i / (double)D);
  for (int64_t bt = 0; bt < B * T; bt++) {
    double ps = kg_load_as_double(kg_data(pos), pos->dtype, pos->ndim == 2 ? bt : bt % T);
    int64_t same = -1; /* a row of the same position (a decode batch's rows mostly share it): copied */
    for (int64_t r = bt - 1; r >= 0 && r >= bt - 4; r--)
      if (kg_load_as_double(kg_data(pos), pos->dtype, pos->ndim == 2 ? r : r % T) == ps) same = r;
    if (same >= 0) {
      memcpy(tab + 2 * bt * half, tab + 2 * same * half, sizeof(double) * (size_t)(2 * half));
      continue;
    }
    for (int64_t i = 0; i < half; i++) {
      double th = ps * inv[i];
      tab[2 * (bt * half + i)] = cos(th) * p->scale;
      tab[2 * (bt * half + i) + 1] = sin(th) * p->scale;
    }
  }
  const char *xb = kg_data(x);
  char *qb = kg_data(q), *kb = kg_data(ck), *vb = kg_data(cv);
#pragma omp parallel for if (B * T * nh * D > KG_PAR_THRESHOLD) schedule(static)
  for (int64_t r = 0; r < B * T * nh; r++) {
    int64_t h = r % nh, bt = r / nh, b = bt / T, t = bt % T;
    int64_t cl = (int64_t)kg_load_as_double(kg_data(col), col->dtype, t) % L;
    if (cl < 0) cl += L;
    const char *src = xb + r * D * es;
    char *dst;
    if (h < H) dst = qb + (((b * H + h) * T + t) * D) * es;                      /* q [b, h, t] */
    else if (h < H + Hkv) dst = kb + (((b * Hkv + h - H) * L + cl) * D) * es;     /* k [b, h, col] */
    else dst = vb + (((b * Hkv + h - H - Hkv) * L + cl) * D) * es;                /* v [b, h, col] */
    if (h >= H + Hkv) { /* v: a plain copy */
      memcpy(dst, src, (size_t)(D * es));
      continue;
    }
    double bd[2 * KG_CHUNK];
    float bf[2 * KG_CHUNK];
    for (int64_t i0 = 0; i0 < half; i0 += KG_CHUNK) {
      int64_t n = half - i0 < KG_CHUNK ? half - i0 : KG_CHUNK;
      const double *cs = tab + 2 * (bt * half + i0);
      const char *x1 = src + i0 * es, *x2 = x1 + half * es;
      char *y1 = dst + i0 * es, *y2 = y1 + half * es;
      if (wide) {
        kg_cpu_load_f64(bd, x1, x->dtype, 1, n);
        kg_cpu_load_f64(bd + KG_CHUNK, x2, x->dtype, 1, n);
        for (int64_t i = 0; i < n; i++) {
          double a1 = bd[i], a2 = bd[KG_CHUNK + i];
          bd[i] = a1 * cs[2 * i] - a2 * cs[2 * i + 1];
          bd[KG_CHUNK + i] = a2 * cs[2 * i] + a1 * cs[2 * i + 1];
        }
        kg_cpu_store_f64(y1, x->dtype, 1, bd, n);
        kg_cpu_store_f64(y2, x->dtype, 1, bd + KG_CHUNK, n);
      } else {
        kg_cpu_load_f32(bf, x1, x->dtype, 1, n);
        kg_cpu_load_f32(bf + KG_CHUNK, x2, x->dtype, 1, n);
        for (int64_t i = 0; i < n; i++) {
          float a1 = bf[i], a2 = bf[KG_CHUNK + i], fc = (float)cs[2 * i], fs = (float)cs[2 * i + 1];
          bf[i] = a1 * fc - a2 * fs;
          bf[KG_CHUNK + i] = a2 * fc + a1 * fs;
        }
        kg_cpu_store_f32(y1, x->dtype, 1, bf, n);
        kg_cpu_store_f32(y2, x->dtype, 1, bf + KG_CHUNK, n);
      }
    }
  }
  free(tab);
  return KG_OK;
}
