/* decode.c — the front-end of decode_qkv, the fused step of autoregressive decoding that turns
 * one projection of [q; k; v] into the attention's inputs: RoPE on the q and k heads, q laid
 * out [B, H, T, D], k and v written into the KV cache at columns held in a device tensor (so a
 * decode step never builds a column from a Lua number and can be captured as a CUDA Graph).
 * Columns are taken modulo the cache length L: every column is in range by construction, so no
 * kernel checks (or synchronises on) them. Kernels: engine/cpu/decode.c, engine/cuda/decode.cu.
 * The rotation takes RoPE's frequencies as an input (inv_freq, else base^(-2i/D)) and a scale of
 * cos and sin, so scaled RoPE (llama3, linear, dynamic, yarn, longrope) runs fused too.
 * Shape letters: B batch, T tokens, H query heads, Hkv key/value heads, D head dim, L cache. */
#include "decode.h"

#include <math.h>

#define OP "decode_qkv"

kg_status kg_decode_qkv(kg_tensor **q, const kg_tensor *qkv, const kg_tensor *positions, kg_tensor *cache_k,
                        kg_tensor *cache_v, const kg_tensor *col, const kg_tensor *inv_freq, int64_t H, int64_t Hkv,
                        double base, double scale) {
  char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX], c[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[6] = {qkv, positions, cache_k, cache_v, col, inv_freq};
  KG_TRY(kg_check_same_device(OP, inv_freq ? 6 : 5, ts));
  KG_TRY(kg_check_float(OP, qkv, "qkv"));
  KG_TRY(kg_check_integer(OP, positions, "positions"));
  KG_TRY(kg_check_integer(OP, col, "col"));
  if (H < 1 || Hkv < 1) return kg_error(KG_ERR_VALUE, OP, "heads %lld and kv_heads %lld must be >= 1", (long long)H, (long long)Hkv);
  if (!inv_freq && !(base > 0)) return kg_error(KG_ERR_VALUE, OP, "base %g must be positive", base);
  if (!isfinite(scale)) return kg_error(KG_ERR_VALUE, OP, "scale %g must be finite", scale);
  int64_t nh = H + 2 * Hkv;
  if (qkv->ndim != 3 || qkv->shape[2] % nh != 0 || (qkv->shape[2] / nh) % 2 != 0 || qkv->shape[2] == 0)
    return kg_error(KG_ERR_SHAPE, OP, "qkv %s must be [B, T, (heads + 2·kv_heads)·D] = [B, T, %lld·D] with D even",
                    KG_SHAPE(qkv, a), (long long)nh);
  int64_t B = qkv->shape[0], T = qkv->shape[1], D = qkv->shape[2] / nh;
  for (int i = 0; i < 2; i++) {
    const kg_tensor *k = i ? cache_v : cache_k;
    if (k->ndim != 4 || k->shape[0] != B || k->shape[1] != Hkv || k->shape[3] != D || k->shape[2] < 1)
      return kg_error(KG_ERR_SHAPE, OP, "cache_%s %s must be [B, kv_heads, L, D] = [%lld, %lld, L, %lld] for qkv %s",
                      i ? "v" : "k", KG_SHAPE(k, a), (long long)B, (long long)Hkv, (long long)D, KG_SHAPE(qkv, b));
    if (k->dtype != qkv->dtype)
      return kg_error(KG_ERR_TYPE, OP, "cache_%s is %s, qkv %s: one dtype expected", i ? "v" : "k",
                      kg_dtype_info[k->dtype].name, kg_dtype_info[qkv->dtype].name);
    if (!kg_is_contiguous(k)) return kg_error(KG_ERR_VALUE, OP, "cache_%s %s must be contiguous (it is written in place)",
                                              i ? "v" : "k", KG_SHAPE(k, a));
    KG_TRY(kg_check_inplace(OP, k));
  }
  if (!kg_same_shape(cache_k, cache_v))
    return kg_error(KG_ERR_SHAPE, OP, "cache_k %s and cache_v %s differ", KG_SHAPE(cache_k, a), KG_SHAPE(cache_v, b));
  if (cache_k->storage == cache_v->storage)
    return kg_error(KG_ERR_VALUE, OP, "cache_k and cache_v share storage");
  bool pos_ok = (positions->ndim == 1 && positions->shape[0] == T) ||
                (positions->ndim == 2 && positions->shape[0] == B && positions->shape[1] == T);
  if (!pos_ok)
    return kg_error(KG_ERR_SHAPE, OP, "positions %s must be [B, T] or [T] for qkv %s", KG_SHAPE(positions, a),
                    KG_SHAPE(qkv, b));
  if (col->ndim != 1 || col->shape[0] != T)
    return kg_error(KG_ERR_SHAPE, OP, "col %s must be [T] = [%lld] (a cache column per token)", KG_SHAPE(col, c), (long long)T);
  if (inv_freq) {
    KG_TRY(kg_check_float(OP, inv_freq, "inv_freq"));
    if (inv_freq->ndim != 1 || inv_freq->shape[0] != D / 2)
      return kg_error(KG_ERR_SHAPE, OP, "inv_freq %s must be [D/2] = [%lld] for qkv %s", KG_SHAPE(inv_freq, c),
                      (long long)(D / 2), KG_SHAPE(qkv, b));
  }
  if (kg_grad_enabled() && kg_requires_grad(qkv))
    return kg_error(KG_ERR_AUTOGRAD, OP, "not differentiable (a decode-time op): run it under no_grad or detach qkv");
  kg_tensor *xc = NULL, *pc = NULL, *cc = NULL, *fc = NULL;
  kg_status s = kg_contiguous(&xc, qkv);
  if (s == KG_OK) s = kg_contiguous(&pc, positions);
  if (s == KG_OK) s = kg_contiguous(&cc, col);
  if (s == KG_OK && inv_freq) s = kg_contiguous(&fc, inv_freq);
  int64_t shape[4] = {B, H, T, D};
  if (s == KG_OK) s = kg_new_like(q, qkv, 4, shape, qkv->dtype);
  if (s == KG_OK) {
    kg_decode_qkv_params p = {H, Hkv, base, scale};
    kg_tensor *out[3] = {*q, cache_k, cache_v};
    const kg_tensor *in[4] = {xc, pc, cc, fc};
    kg_tensor_bump_version(cache_k);
    kg_tensor_bump_version(cache_v);
    s = kg_op_dispatch(KG_OP_DECODE_QKV, 3, out, 4, in, &p);
    if (s) kg_tensor_release(*q);
  }
  if (xc) kg_tensor_release(xc);
  if (pc) kg_tensor_release(pc);
  if (cc) kg_tensor_release(cc);
  if (fc) kg_tensor_release(fc);
  return s;
}
