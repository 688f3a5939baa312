/* decode.h — the decode-step op shared by its front-end (engine/ops/decode.c) and its kernels
 * (engine/cpu/decode.c, engine/cuda/decode.cu). */
#ifndef KENG_OPS_DECODE_H
#define KENG_OPS_DECODE_H

#include "../core/internal.h"

/* decode_qkv: heads H, kv_heads Hkv, RoPE base (unused with inv_freq), scale of cos and sin */
typedef struct {
  int64_t heads, kv_heads;
  double base, scale;
} kg_decode_qkv_params;

/* q [B, H, T, D] <- RoPE(the q heads of qkv); cache_k[:, :, col[t] mod L] <- RoPE(the k heads);
 * cache_v[:, :, col[t] mod L] <- the v heads. qkv [B, T, (H + 2·Hkv)·D] (q heads, then k, then v,
 * as the concatenated projections give them), positions [B, T] or [T], col [T] (0-based cache
 * columns, taken modulo L: a ring), caches [B, Hkv, L, D] contiguous in qkv's dtype, written in
 * place. Not differentiable (a decode-time op). The rotation is keng.rope's: angle pos · inv_freq[i]
 * (inv_freq NULL: base^(-2i/D); else floating [D/2], the frequencies of a scaled RoPE), cos and
 * sin times scale (1 for plain RoPE; the attention factor of yarn / longrope). */
kg_status kg_decode_qkv(kg_tensor **q, const kg_tensor *qkv, const kg_tensor *positions, kg_tensor *cache_k,
                        kg_tensor *cache_v, const kg_tensor *col, const kg_tensor *inv_freq, int64_t heads,
                        int64_t kv_heads, double base, double scale);

#endif
