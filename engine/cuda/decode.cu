/* decode.cu — decode_qkv on the GPU (engine/ops/decode.c; the CPU kernel is engine/cpu/decode.c,
 * step for step): a thread per (b, t, head, pair i < D/2) of the q and k heads rotates the pair
 * (angle pos · inv_freq[i] in double, inv_freq base^(-2i/D) unless given, cos/sin times scale
 * rounded to the compute type, as kg_cuda_rope)
 * and stores it into q [B, H, T, D] or cache_k [B, Hkv, L, D] at column col[t] mod L; the v
 * heads are copied into cache_v the same way. Columns are in range by construction (mod L):
 * nothing is checked, so nothing synchronises and the op is capturable as is. */
#include "util.cuh"

extern "C" {
#include "../ops/decode.h"
}

template <class FT>
__global__ void decode_qkv_kernel(const char *x, int dt, const char *pos, int pdt, int pnd, const char *col, int cdt,
                                  char *q, char *ck, char *cv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                  int64_t D, int64_t L, double base, const char *freq, int fdt, double scale) {
  int64_t half = D / 2, nh = H + 2 * Hkv;
  KG_CUDA_FOR(e, B * T * nh * half) {
    int64_t i = e % half, r = e / half, h = r % nh, bt = r / nh, b = bt / T, t = bt % T;
    int64_t cl = kg_load_index(col, cdt, t) % L;
    if (cl < 0) cl += L;
    int64_t src = (bt * nh + h) * D + i;
    if (h >= H + Hkv) { /* v: copy the pair (i, i + D/2) */
      int64_t dst = ((b * Hkv + h - H - Hkv) * L + cl) * D + i;
      kg_store(cv, dt, dst, kg_load<FT>(x, dt, src));
      kg_store(cv, dt, dst + half, kg_load<FT>(x, dt, src + half));
      continue;
    }
    double f = freq ? kg_load<double>(freq, fdt, i) : pow(base, -2.0 * (double)i / (double)D);
    double th = kg_load<double>(pos, pdt, pnd == 2 ? bt : t) * f;
    FT cs = (FT)(cos(th) * scale), sn = (FT)(sin(th) * scale);
    FT x1 = kg_load<FT>(x, dt, src), x2 = kg_load<FT>(x, dt, src + half);
    char *out = h < H ? q : ck;
    int64_t dst = h < H ? ((b * H + h) * T + t) * D + i : ((b * Hkv + h - H) * L + cl) * D + i;
    kg_store(out, dt, dst, x1 * cs - x2 * sn);
    kg_store(out, dt, dst + half, x2 * cs + x1 * sn);
  }
}

extern "C" kg_status kg_cuda_decode_qkv(const kg_op_call *c) {
  const kg_tensor *x = c->in[0], *pos = c->in[1], *col = c->in[2], *freq = c->nin > 3 ? c->in[3] : NULL;
  kg_tensor *q = c->out[0], *ck = c->out[1], *cv = c->out[2];
  const kg_decode_qkv_params *p = (const kg_decode_qkv_params *)c->params;
  int64_t B = x->shape[0], T = x->shape[1], H = p->heads, Hkv = p->kv_heads, nh = H + 2 * Hkv;
  int64_t D = x->shape[2] / nh, L = ck->shape[2], n = B * T * nh * (D / 2);
  if (n == 0) return KG_OK;
  int dev = q->device.index;
  cudaStream_t s = kg_cuda_stream(dev);
#define LAUNCH(FT)                                                                                                  \
  decode_qkv_kernel<FT><<<kg_cuda_blocks(n), KG_CUDA_THREADS, 0, s>>>(                                              \
      (const char *)kg_data(x), x->dtype, (const char *)kg_data(pos), pos->dtype, pos->ndim,                      \
      (const char *)kg_data(col), col->dtype, (char *)kg_data(q), (char *)kg_data(ck), (char *)kg_data(cv), B, T, \
      H, Hkv, D, L, p->base, freq ? (const char *)kg_data(freq) : NULL, freq ? (int)freq->dtype : 0, p->scale)
  if (x->dtype == KG_F64) LAUNCH(double);
  else LAUNCH(float);
#undef LAUNCH
  return kg_cuda_check("decode_qkv", dev);
}
