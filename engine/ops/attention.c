/* attention.c — front-ends of the transformer blocks: fused scaled-dot-product attention and
 * rotary position embedding, and their backward passes.
 *
 * Shape letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0, grouped-query),
 * T query length, S key length, D head dim. Kernels: engine/cpu/attention.c. Reference: the
 * naive softmax(Q·Kᵀ·scale + mask)·V of tests/lua/attention_spec.lua.
 */
#include "../core/internal.h"
#include "sdpa_route.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scaled dot-product attention -------------------------------------------------------- */

/* q: [B, H, T, D], k, v: [B, Hkv, S, D], mask: NULL or bool/float broadcastable to [B, H, T, S] */
static kg_status sdpa_check(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                            const kg_sdpa_params *p) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX], m[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[4] = {q, k, v, mask};
  KG_TRY(kg_check_same_device("scaled_dot_product_attention", 4, ts));
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
    return kg_error(KG_ERR_SHAPE, "scaled_dot_product_attention",
                    "q %s, k %s, v %s: expected 4-D q [B,H,T,D] and k, v [B,Hkv,S,D]", KG_SHAPE(q, a), KG_SHAPE(k, b),
                    KG_SHAPE(v, c));
  if (!kg_dtype_info[q->dtype].is_float || k->dtype != q->dtype || v->dtype != q->dtype)
    return kg_error(KG_ERR_TYPE, "scaled_dot_product_attention", "q %s, k %s, v %s: one floating dtype expected",
                    kg_dtype_info[q->dtype].name, kg_dtype_info[k->dtype].name, kg_dtype_info[v->dtype].name);
  int64_t B = q->shape[0], H = q->shape[1], D = q->shape[3], Hkv = k->shape[1];
  if (k->shape[0] != B || v->shape[0] != B || k->shape[3] != D || !kg_same_shape(k, v) || Hkv == 0 ||
      H % Hkv != 0)
    return kg_error(KG_ERR_SHAPE, "scaled_dot_product_attention",
                    "q %s, k %s, v %s: need q [B,H,T,D], k = v [B,Hkv,S,D] with H divisible by Hkv",
                    KG_SHAPE(q, a), KG_SHAPE(k, b), KG_SHAPE(v, c));
  if (mask) {
    int64_t full[4] = {B, H, q->shape[2], k->shape[2]};
    bool ok = mask->ndim <= 4;
    for (int i = 0; ok && i < mask->ndim; i++) {
      int64_t s = mask->shape[mask->ndim - 1 - i];
      ok = s == 1 || s == full[3 - i];
    }
    if (!ok)
      return kg_error(KG_ERR_SHAPE, "scaled_dot_product_attention", "mask %s cannot be broadcast to [B,H,T,S] = %s",
                      KG_SHAPE(mask, m), kg_shape_str(a, 4, full));
    if (mask->dtype != KG_BOOL && !kg_dtype_info[mask->dtype].is_float)
      return kg_error(KG_ERR_TYPE, "scaled_dot_product_attention", "mask %s must be bool or floating, got %s",
                      KG_SHAPE(mask, m), kg_dtype_info[mask->dtype].name);
  }
  if (p->window < 0)
    return kg_error(KG_ERR_VALUE, "scaled_dot_product_attention", "window %lld must be >= 0", (long long)p->window);
  return KG_OK;
}

/* ---- the math route: GEMM -> masked softmax -> GEMM from engine ops ----------------------- */

/* Temporaries of the math route, released together. */
typedef struct {
  kg_tensor *t[40];
  int n;
} sdpa_tmp;

static void keep(sdpa_tmp *m, kg_tensor *t) { m->t[m->n++] = t; /* at most ~20 per call */ }

/* allowed [T, S] bool of the causal / window band: key j is visible to query i when
 * j - i <= off (causal) and j - i > off - window (window), off = S - T */
static kg_status band_mask(kg_tensor **out, sdpa_tmp *m, int64_t T, int64_t S, bool causal, int64_t window,
                           kg_device dev) {
  kg_tensor *rows, *cols, *diff, *a = NULL, *b = NULL;
  int64_t rs[2] = {T, 1}, cs[2] = {1, S};
  const int64_t off = S - T;
  KG_TRY(kg_arange(&rows, 0, (double)T, 1, KG_I64, dev));
  keep(m, rows);
  KG_TRY(kg_arange(&cols, 0, (double)S, 1, KG_I64, dev));
  keep(m, cols);
  KG_TRY(kg_view(&rows, rows, 2, rs));
  keep(m, rows);
  KG_TRY(kg_view(&cols, cols, 2, cs));
  keep(m, cols);
  KG_TRY(kg_binary(&diff, KG_OP_SUB, cols, rows)); /* [T, S]: j - i */
  keep(m, diff);
  if (causal) {
    KG_TRY(kg_binary_scalar(&a, KG_OP_LE, diff, (double)off, false));
    keep(m, a);
  }
  if (window > 0) {
    KG_TRY(kg_binary_scalar(&b, KG_OP_GT, diff, (double)(off - window), false));
    keep(m, b);
  }
  if (a && b) {
    KG_TRY(kg_binary(out, KG_OP_MUL, a, b)); /* bool · bool = and */
    keep(m, *out);
  } else *out = a ? a : b;
  return KG_OK;
}

/* out = softmax(q kᵀ · scale + mask) v with keng's conventions (causal bottom-right, window,
 * bool masks hide, float masks add, a row that sees no key gives zeros). q: [B, H, T, D],
 * k, v: [B, Hkv, S, D]; the G = H / Hkv query heads of a kv head go as one GEMM ([B, Hkv, G·T, D]
 * · [B, Hkv, D, S]), so k and v are never repeated. Scores and softmax in f32 (f64 for f64). */
static kg_status sdpa_math_once(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v,
                                const kg_tensor *mask, const kg_sdpa_params *p) {
  const int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3];
  const int64_t Hkv = k->shape[1], S = k->shape[2], G = H / Hkv;
  const kg_dtype ft = q->dtype == KG_F64 ? KG_F64 : KG_F32;
  const kg_device dev = q->device;
  sdpa_tmp m = {{0}, 0};
  kg_tensor *t, *kt, *s = NULL, *allowed = NULL, *vis = NULL, *zero = NULL;
  kg_status st;
  int64_t qg[4] = {B, Hkv, G * T, D}, full[4] = {B, H, T, S}, grp[4] = {B, Hkv, G * T, S}, o4[4] = {B, H, T, D};
  /* small tensors (views, masks, scalars) are kept until the end; the score-sized chain s is
   * released link by link (autograd holds what its backward needs), so without grad at most two
   * score-sized tensors live at once */
#define STEP(call, var)                                                                                          \
  do {                                                                                                           \
    if ((st = (call)) != KG_OK) goto done;                                                                       \
    keep(&m, var);                                                                                               \
  } while (0)
#define CHAIN(call)                                                                                              \
  do {                                                                                                           \
    kg_tensor *n_ = NULL;                                                                                        \
    if ((st = (call)) != KG_OK) goto done;                                                                       \
    kg_tensor_release(s);                                                                                        \
    s = n_;                                                                                                      \
  } while (0)
  /* bf16/f16: q and k go to f32 first, so the scores are f32 from the GEMM on (as in the fused
   * kernels and cuDNN's graph, not rounded to the io dtype); P goes back to it for P·V */
  const kg_tensor *qf = q, *kf = k;
  if (q->dtype != ft) {
    kg_tensor *a, *b;
    STEP(kg_to(&a, q, ft, dev), a);
    STEP(kg_to(&b, k, ft, dev), b);
    qf = a, kf = b;
  }
  STEP(kg_reshape(&t, qf, 4, qg), t);
  STEP(kg_transpose(&kt, kf, 2, 3), kt);
  if ((st = kg_matmul(&s, t, kt)) != KG_OK) goto done; /* [B, Hkv, G·T, S] */
  CHAIN(kg_view(&n_, s, 4, full));
  CHAIN(kg_binary_scalar(&n_, KG_OP_MUL, s, p->scale, false));
  if (p->causal || p->window > 0) {
    if ((st = band_mask(&allowed, &m, T, S, p->causal, p->window, dev)) != KG_OK) goto done;
  }
  if (mask && mask->dtype == KG_BOOL) {
    if (allowed) STEP(kg_binary(&allowed, KG_OP_MUL, allowed, mask), allowed);
    else allowed = (kg_tensor *)mask;
  } else if (mask) {
    CHAIN(kg_binary(&n_, KG_OP_ADD, s, mask));
    kg_tensor *finite; /* a -inf in an additive mask hides the key too */
    STEP(kg_binary_scalar(&finite, KG_OP_GT, mask, -INFINITY, false), finite);
    if (allowed) STEP(kg_binary(&allowed, KG_OP_MUL, allowed, finite), allowed);
    else allowed = finite;
  }
  if (allowed) {
    kg_tensor *ninf, *cnt;
    STEP(kg_scalar(&ninf, -INFINITY, s->dtype, dev), ninf);
    CHAIN(kg_where(&n_, allowed, s, ninf));
    /* rows that see no key: softmax would give 0/0, so they take zeros, before (a finite row,
     * no NaN in the backward) and after it */
    if (allowed->ndim < 2) { /* a 0-d or [S] mask: count over [T, S] */
      int64_t ts[2] = {T, S};
      STEP(kg_expand(&allowed, allowed, 2, ts), allowed);
    }
    STEP(kg_to(&cnt, allowed, KG_F32, dev), cnt);
    STEP(kg_sum(&cnt, cnt, 1u << (cnt->ndim - 1), true), cnt);
    STEP(kg_binary_scalar(&vis, KG_OP_GT, cnt, 0, false), vis);
    STEP(kg_scalar(&zero, 0, s->dtype, dev), zero);
    CHAIN(kg_where(&n_, vis, s, zero));
  }
  CHAIN(kg_softmax(&n_, s, -1));
  if (vis) CHAIN(kg_where(&n_, vis, s, zero));
  if (s->dtype != v->dtype) CHAIN(kg_to(&n_, s, v->dtype, dev));
  CHAIN(kg_reshape(&n_, s, 4, grp));
  STEP(kg_matmul(&t, s, v), t); /* [B, Hkv, G·T, D] */
  st = kg_reshape(out, t, 4, o4);
#undef STEP
#undef CHAIN
done:
  kg_tensor_release(s);
  kg_release_all(m.n, m.t);
  return st;
}

/* the math route over batch chunks of `rows` (no grad: the chunks' scores are freed in turn),
 * written into one output; mask rows follow when the mask has a batch dim of B */
static kg_status sdpa_math(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v,
                           const kg_tensor *mask, const kg_sdpa_params *p, int64_t rows) {
  const int64_t B = q->shape[0];
  if (rows >= B) return sdpa_math_once(out, q, k, v, mask, p);
  bool mask_b = mask && mask->ndim == 4 && mask->shape[0] == B;
  KG_TRY(kg_new_like(out, q, 4, q->shape, q->dtype));
  kg_status s = KG_OK;
  for (int64_t b0 = 0; s == KG_OK && b0 < B; b0 += rows) {
    int64_t n = B - b0 < rows ? B - b0 : rows;
    kg_tensor *qc = NULL, *kc = NULL, *vc = NULL, *mc = NULL, *oc = NULL, *dst = NULL;
    s = kg_narrow(&qc, q, 0, b0, n);
    if (!s) s = kg_narrow(&kc, k, 0, b0, n);
    if (!s) s = kg_narrow(&vc, v, 0, b0, n);
    if (!s && mask_b) s = kg_narrow(&mc, mask, 0, b0, n);
    if (!s) s = sdpa_math_once(&oc, qc, kc, vc, mask_b ? mc : mask, p);
    if (!s) s = kg_narrow(&dst, *out, 0, b0, n);
    if (!s) s = kg_copy_(dst, oc);
    kg_tensor *all[6] = {qc, kc, vc, mc, oc, dst};
    kg_release_all(6, all);
  }
  if (s) kg_tensor_release(*out);
  return s;
}

/* bytes of f32 scores per chunk of the math route without grad: KENG_SDPA_MATH_CHUNK (a test
 * knob) or KG_SDPA_MATH_CHUNK_BYTES */
static int64_t math_chunk_bytes(void) {
  long long v = kg_env_int(KG_ENV_KENG_SDPA_MATH_CHUNK);
  return v > 0 ? (int64_t)v : KG_SDPA_MATH_CHUNK_BYTES;
}

/* ---- the router ---------------------------------------------------------------------------- */

/* the router's view of a call (engine/ops/sdpa_route.h) */
static kg_sdpa_desc sdpa_desc(const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                              const kg_sdpa_params *p) {
  kg_sdpa_desc d;
  memset(&d, 0, sizeof d);
  d.cuda = q->device.type == KG_DEV_CUDA, d.dtype = q->dtype;
  d.is_half = q->dtype == KG_BF16 || q->dtype == KG_F16, d.is_f32 = q->dtype == KG_F32, d.is_f64 = q->dtype == KG_F64;
  d.B = q->shape[0], d.H = q->shape[1], d.T = q->shape[2], d.D = q->shape[3], d.Hkv = k->shape[1], d.S = k->shape[2];
  d.mask = !mask ? KG_SDPA_MASK_NONE : mask->dtype == KG_BOOL ? KG_SDPA_MASK_BOOL : KG_SDPA_MASK_ADDITIVE;
  d.causal = p->causal, d.window = p->window, d.scale = p->scale;
  d.mask_grad = kg_grad_enabled() && mask && kg_requires_grad(mask);
  d.requires_grad = d.mask_grad || (kg_grad_enabled() && (kg_requires_grad(q) || kg_requires_grad(k) || kg_requires_grad(v)));
  d.allow_tf32 = kg_allow_tf32(), d.cudnn_enabled = kg_cudnn_sdpa(), d.force_math = kg_sdpa_math();
  if (d.cuda) kg_cuda_sdpa_caps(q->device.index, &d.sm, &d.cudnn_version, &d.smem);
  return d;
}

/* [B, H, T, D] -> [B, T, H, D] contiguous (a copy unless *out's memory is in that order already) */
static kg_status to_bthd(kg_tensor **out, kg_tensor *a) {
  kg_tensor *t;
  kg_status s = kg_transpose(&t, a, 1, 2);
  kg_tensor_release(a);
  if (s) return s;
  s = kg_contiguous(out, t);
  kg_tensor_release(t);
  return s;
}

/* the fused kernel of the device on in = {q, k, v, mask[, rel_h, rel_w]} (nin 4 or 6) */
static kg_status sdpa_fused(kg_tensor **out, int nin, const kg_tensor *const *in, const kg_sdpa_params *prm) {
  const kg_tensor *q = in[0];
  /* out: [B, H, T, D]; lse: [B, H, T] logsumexp of each score row, saved for backward. For
   * out_bthd on the CPU, out is a [B, H, T, D] view of [B, T, H, D] memory (the kernel writes
   * through strides), so the transpose at the end is free */
  bool bthd = prm->out_bthd && q->device.type == KG_DEV_CPU;
  kg_tensor *o[2] = {NULL, NULL}, *base = NULL;
  int64_t shape[4] = {q->shape[0], q->shape[2], q->shape[1], q->shape[3]};
  if (bthd) {
    KG_TRY(kg_new_like(&base, q, 4, shape, q->dtype));
    kg_status s = kg_transpose(&o[0], base, 1, 2);
    kg_tensor_release(base);
    KG_TRY(s);
  } else {
    KG_TRY(kg_new_like(&o[0], q, 4, q->shape, q->dtype));
  }
  kg_status s = kg_new_like(&o[1], q, 3, q->shape, q->dtype == KG_F64 ? KG_F64 : KG_F32);
  if (s == KG_OK) s = kg_op_run(KG_OP_SDPA, 2, o, nin, in, prm, sizeof *prm);
  kg_tensor_release(o[1]);
  if (s) {
    kg_tensor_release(o[0]);
    return s;
  }
  if (prm->out_bthd) return to_bthd(out, o[0]);
  *out = o[0];
  return KG_OK;
}

/* the params as the kernels take them: scale resolved, a window >= S dropped */
static kg_sdpa_params sdpa_resolve(const kg_tensor *q, const kg_tensor *k, const kg_sdpa_params *p) {
  kg_sdpa_params prm = p ? *p : (kg_sdpa_params){0};
  if (prm.scale == 0) prm.scale = 1.0 / sqrt((double)q->shape[3]);
  prm.window = kg_sdpa_window(prm.window, k->shape[2]); /* a window >= S is no window */
  return prm;
}

kg_status kg_sdpa(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                  const kg_sdpa_params *p) {
  KG_TRY(sdpa_check(q, k, v, mask, p ? p : &(kg_sdpa_params){0}));
  kg_sdpa_params prm = sdpa_resolve(q, k, p);
  kg_sdpa_desc d = sdpa_desc(q, k, v, mask, &prm);
  kg_sdpa_route route = kg_sdpa_route_of(&d, NULL);
  kg_sdpa_stat_add(5, route);
  if (route == KG_SDPA_ROUTE_MATH) {
    kg_tensor *a;
    KG_TRY(sdpa_math(&a, q, k, v, mask, &prm, kg_sdpa_math_rows(d.B, d.H, d.T, d.S, d.requires_grad, math_chunk_bytes())));
    if (prm.out_bthd) return to_bthd(out, a);
    *out = a;
    return KG_OK;
  }
  const kg_tensor *in[4] = {q, k, v, mask};
  return sdpa_fused(out, 4, in, &prm);
}

/* ---- SAM's decomposed relative-position bias --------------------------------------------- */

/* rel_h [B, H, T, kh] and rel_w [B, H, T, kw] with kh·kw = S, floating, on q's device */
static kg_status rel_check(const kg_tensor *q, const kg_tensor *k, const kg_tensor *mask, const kg_tensor *rh,
                           const kg_tensor *rw) {
  static const char *op = "scaled_dot_product_attention";
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX];
  if (!rh || !rw) return kg_error(KG_ERR_VALUE, op, "rel_h and rel_w go together (got only %s)", rh ? "rel_h" : "rel_w");
  const kg_tensor *ts[3] = {q, rh, rw};
  KG_TRY(kg_check_same_device(op, 3, ts));
  KG_TRY(kg_check_float(op, rh, "rel_h"));
  KG_TRY(kg_check_float(op, rw, "rel_w"));
  if (mask) return kg_error(KG_ERR_VALUE, op, "mask %s: a mask cannot be combined with rel_h/rel_w", KG_SHAPE(mask, a));
  int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], S = k->shape[2];
  bool ok = rh->ndim == 4 && rw->ndim == 4;
  for (int i = 0; ok && i < 3; i++) ok = rh->shape[i] == q->shape[i] && rw->shape[i] == q->shape[i];
  if (!ok || rh->shape[3] * rw->shape[3] != S)
    return kg_error(KG_ERR_SHAPE, op,
                    "rel_h %s, rel_w %s: need [B,H,T,kh] and [B,H,T,kw] with B,H,T = %lld,%lld,%lld of q %s "
                    "and kh*kw = S = %lld",
                    KG_SHAPE(rh, a), KG_SHAPE(rw, b), (long long)B, (long long)H, (long long)T, KG_SHAPE(q, c),
                    (long long)S);
  if (q->shape[3] == 0) return kg_error(KG_ERR_SHAPE, op, "q %s: rel_h/rel_w need a head dim D > 0", KG_SHAPE(q, a));
  return KG_OK;
}

/* the bias [B, H, T, S] itself: rel_h[..., ky] + rel_w[..., kx] at key ky·kw + kx (the routes
 * other than the CPU's fused kernel take it as an additive mask, autograd through these ops) */
static kg_status rel_bias(kg_tensor **out, const kg_tensor *rh, const kg_tensor *rw) {
  kg_tensor *a = NULL, *b = NULL, *sum = NULL;
  int64_t shape[4] = {rh->shape[0], rh->shape[1], rh->shape[2], rh->shape[3] * rw->shape[3]};
  int64_t sh[5] = {shape[0], shape[1], shape[2], rh->shape[3], 1}, sw[5] = {shape[0], shape[1], shape[2], 1, rw->shape[3]};
  kg_status s = kg_reshape(&a, rh, 5, sh); /* [B, H, T, kh, 1] */
  if (!s) s = kg_reshape(&b, rw, 5, sw);   /* [B, H, T, 1, kw] */
  if (!s) s = kg_binary(&sum, KG_OP_ADD, a, b);
  if (!s) s = kg_reshape(out, sum, 4, shape);
  kg_tensor *all[3] = {a, b, sum};
  kg_release_all(3, all);
  return s;
}

kg_status kg_sdpa_rel(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                      const kg_tensor *rel_h, const kg_tensor *rel_w, const kg_sdpa_params *p) {
  if (!rel_h && !rel_w) return kg_sdpa(out, q, k, v, mask, p);
  KG_TRY(sdpa_check(q, k, v, mask, p ? p : &(kg_sdpa_params){0}));
  KG_TRY(rel_check(q, k, mask, rel_h, rel_w));
  kg_sdpa_params prm = sdpa_resolve(q, k, p);
  /* routed as a call with an additive mask whose gradient the kernel gives (the CPU's does) */
  kg_sdpa_desc d = sdpa_desc(q, k, v, NULL, &prm);
  d.mask = KG_SDPA_MASK_ADDITIVE;
  d.requires_grad |= kg_grad_enabled() && (kg_requires_grad(rel_h) || kg_requires_grad(rel_w));
  if (kg_sdpa_route_of(&d, NULL) != KG_SDPA_ROUTE_CPU) { /* CUDA, or the math route: the bias in full */
    kg_tensor *bias;
    KG_TRY(rel_bias(&bias, rel_h, rel_w));
    kg_status s = kg_sdpa(out, q, k, v, bias, &prm);
    kg_tensor_release(bias);
    return s;
  }
  kg_sdpa_stat_add(5, KG_SDPA_ROUTE_CPU);
  const kg_tensor *in[6] = {q, k, v, NULL, rel_h, rel_w};
  return sdpa_fused(out, 6, in, &prm);
}

/* dq, dk, dv (and drel_h, drel_w) from one SDPA_BACKWARD kernel that recomputes the
 * probabilities from lse */
kg_status kg_grad_scaled_dot_product_attention(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (!dout[0]) return KG_OK;
  const kg_tensor *q = n->saved_in[0], *k = n->saved_in[1], *v = n->saved_in[2];
  const kg_tensor *rh = n->nin > 5 ? n->saved_in[4] : NULL, *rw = n->nin > 5 ? n->saved_in[5] : NULL;
  int ng = rh ? 5 : 3;
  kg_tensor *g[5] = {NULL, NULL, NULL, NULL, NULL};
  kg_status s = kg_new_like(&g[0], q, 4, q->shape, q->dtype);
  if (s == KG_OK) s = kg_new_like(&g[1], k, 4, k->shape, k->dtype);
  if (s == KG_OK) s = kg_new_like(&g[2], v, 4, v->shape, v->dtype);
  if (s == KG_OK && rh) s = kg_new_like(&g[3], rh, 4, rh->shape, rh->dtype);
  if (s == KG_OK && rh) s = kg_new_like(&g[4], rw, 4, rw->shape, rw->dtype);
  /* in: q, k, v, mask, out, lse, dout[, rel_h, rel_w] */
  const kg_tensor *in[9] = {q, k, v, n->saved_in[3], n->saved_out[0], n->saved_out[1], dout[0], rh, rw};
  if (s == KG_OK) s = kg_op_dispatch(KG_OP_SDPA_BACKWARD, ng, g, rh ? 9 : 7, in, n->params);
  if (s) {
    kg_release_all(5, g);
    return s;
  }
  for (int i = 0; i < ng; i++) { /* g: q, k, v, rel_h, rel_w; inputs: q, k, v, mask, rel_h, rel_w */
    int in_i = i < 3 ? i : i + 1;
    if (kg_node_needs_grad(n, in_i)) din[in_i] = g[i];
    else kg_tensor_release(g[i]);
  }
  return KG_OK;
}

/* ---- rotary position embedding ------------------------------------------------------------ */

/* x: [..., T, D] (D even), positions: [T] or [B, T] with B = x's first dim (or 1), inv_freq:
 * NULL or [D/2] floating (saved for backward with the positions) */
kg_status kg_rope_freq(kg_tensor **out, const kg_tensor *x, const kg_tensor *positions, const kg_tensor *inv_freq,
                       const kg_rope_params *p) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[3] = {x, positions, inv_freq};
  KG_TRY(kg_check_same_device("rope", 3, ts));
  KG_TRY(kg_check_float("rope", x, "x"));
  KG_TRY(kg_check_integer("rope", positions, "positions"));
  if (x->ndim < 2 || x->shape[x->ndim - 1] % 2 != 0)
    return kg_error(KG_ERR_SHAPE, "rope", "x %s must be [..., T, D] with D even", KG_SHAPE(x, a));
  int64_t T = x->shape[x->ndim - 2];
  bool ok = (positions->ndim == 1 && positions->shape[0] == T) ||
            (positions->ndim == 2 && positions->shape[1] == T &&
             (positions->shape[0] == 1 || (x->ndim >= 3 && positions->shape[0] == x->shape[0])));
  if (!ok)
    return kg_error(KG_ERR_SHAPE, "rope", "positions %s must be [T] or [B, T] for x %s", KG_SHAPE(positions, b),
                    KG_SHAPE(x, a));
  if (inv_freq) {
    KG_TRY(kg_check_float("rope", inv_freq, "inv_freq"));
    if (inv_freq->ndim != 1 || inv_freq->shape[0] != x->shape[x->ndim - 1] / 2)
      return kg_error(KG_ERR_SHAPE, "rope", "inv_freq %s must be [D/2] = [%lld] for x %s", KG_SHAPE(inv_freq, b),
                      (long long)(x->shape[x->ndim - 1] / 2), KG_SHAPE(x, a));
    if (inv_freq->requires_grad || inv_freq->grad_fn)
      return kg_error(KG_ERR_VALUE, "rope", "inv_freq %s must not require grad (rope has no gradient for it)",
                      KG_SHAPE(inv_freq, b));
  } else if (!(p->base > 0)) {
    return kg_error(KG_ERR_VALUE, "rope", "base %g must be positive", p->base);
  }
  if (!isfinite(p->scale)) return kg_error(KG_ERR_VALUE, "rope", "scale %g must be finite", p->scale);
  kg_tensor *xc;
  KG_TRY(kg_contiguous(&xc, x));
  kg_status s = kg_new_like(out, x, x->ndim, x->shape, x->dtype);
  const kg_tensor *in[3] = {xc, positions, inv_freq};
  if (s == KG_OK) {
    s = kg_op_run(KG_OP_ROPE, 1, out, 3, in, p, sizeof *p);
    if (s) kg_tensor_release(*out);
  }
  kg_tensor_release(xc);
  return s;
}

kg_status kg_rope(kg_tensor **out, const kg_tensor *x, const kg_tensor *positions, double base) {
  kg_rope_params p = {base, 1.0};
  return kg_rope_freq(out, x, positions, NULL, &p);
}

/* y = scale · R(pos) x, so dx = scale · R(-pos) dy: the same op at the negated positions */
kg_status kg_grad_rope(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  if (!kg_node_needs_grad(n, 0)) return KG_OK;
  const kg_rope_params *p = n->params;
  kg_tensor *neg;
  KG_TRY(kg_unary(&neg, KG_OP_NEG, n->saved_in[1]));
  kg_status s = kg_rope_freq(&din[0], dout[0], neg, n->saved_in[2], p);
  kg_tensor_release(neg);
  return s;
}
