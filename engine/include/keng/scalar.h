/* scalar.h — scalar formulas shared by the C kernels and the CUDA kernels, so the CPU tests
 * exercise the same arithmetic the GPU runs: bf16/f16 conversion, activations and their
 * derivatives, the Philox4x32-10 counter-based generator.
 *
 * Activations too long for their row of engine/ops/elementwise.def are written once here as
 * macros over a floating type T (float or double), so f64 gradient checks run the same formula
 * at double precision. In C the math calls resolve by
 * type through <tgmath.h>; in CUDA through the float/double overloads.
 */
#ifndef KENG_SCALAR_H
#define KENG_SCALAR_H

#include <stdint.h>

#ifdef __CUDACC__
#define KG_HD __host__ __device__ __forceinline__
#else
#define KG_HD static inline
#endif
#include <math.h>
#include <string.h>

/* ---- bf16 / f16: one conversion each way, round to nearest even, NaN stays NaN ------------ */

KG_HD uint32_t kg_f32_bits(float f) {
#ifdef __CUDA_ARCH__ /* device pass; the host pass uses memcpy */
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
KG_HD float kg_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

KG_HD uint16_t kg_f32_to_bf16(float f) {
  uint32_t u = kg_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
  return (uint16_t)(u >> 16);
}
KG_HD float kg_bf16_to_f32(uint16_t h) { return kg_bits_f32((uint32_t)h << 16); }

KG_HD uint16_t kg_f32_to_f16(float f) {
  uint32_t x = kg_f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);      /* overflow -> inf */
  if (ax < 0x38800000u) {                                         /* subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;                  /* < half the smallest */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                                     /* 14 + (112 - e) + ... */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
  uint32_t out = r >> 13, rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) out++;
  return (uint16_t)(sign | out);
}
KG_HD float kg_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return kg_bits_f32(sign);
    float f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
    return sign ? -f : f;
  }
  if (e == 31) return kg_bits_f32(sign | 0x7f800000u | (m << 13));
  return kg_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- activations: y = f(x) and dy/dx, for T in {float, double} ---------------------------- */

#define KG_SQRT1_2 0.70710678118654752440
#define KG_SQRT2_PI 0.79788456080286535588 /* sqrt(2/pi) */
#define KG_INV_SQRT_2PI 0.39894228040143267794

#define KG_SIGMOID(T, x) ((T)1 / ((T)1 + exp(-(x))))
/* exact GELU: x * Phi(x) */
#define KG_GELU(T, x) ((T)0.5 * (x) * ((T)1 + erf((x) * (T)KG_SQRT1_2)))
#define KG_GELU_GRAD(T, x) \
  ((T)0.5 * ((T)1 + erf((x) * (T)KG_SQRT1_2)) + (x) * (T)KG_INV_SQRT_2PI * exp((T)-0.5 * (x) * (x)))
/* tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
#define KG_GELU_TANH_U(T, x) ((T)KG_SQRT2_PI * ((x) + (T)0.044715 * (x) * (x) * (x)))
#define KG_GELU_TANH(T, x) ((T)0.5 * (x) * ((T)1 + tanh(KG_GELU_TANH_U(T, x))))
#define KG_GELU_TANH_GRAD(T, x)                                                              \
  ((T)0.5 * ((T)1 + tanh(KG_GELU_TANH_U(T, x))) +                                            \
   (T)0.5 * (x) * ((T)1 - tanh(KG_GELU_TANH_U(T, x)) * tanh(KG_GELU_TANH_U(T, x))) *         \
       (T)KG_SQRT2_PI * ((T)1 + (T)3 * (T)0.044715 * (x) * (x)))
/* quick GELU (CLIP): x * sigmoid(1.702 x) */
#define KG_QUICK_GELU(T, x) ((x) * KG_SIGMOID(T, (T)1.702 * (x)))
#define KG_QUICK_GELU_GRAD(T, x) \
  (KG_SIGMOID(T, (T)1.702 * (x)) * ((T)1 + (T)1.702 * (x) * ((T)1 - KG_SIGMOID(T, (T)1.702 * (x)))))
#define KG_SILU(T, x) ((x) * KG_SIGMOID(T, x))
#define KG_SILU_GRAD(T, x) (KG_SIGMOID(T, x) * ((T)1 + (x) * ((T)1 - KG_SIGMOID(T, x))))

/* ---- online softmax: merge a new score s into running (max m, sum l) ------------------------ */
/* After all scores: softmax_i = exp(s_i - m) / l, logsumexp = m + log(l). */
#define KG_ONLINE_SOFTMAX_UPDATE(T, m, l, s)            \
  do {                                                  \
    if ((s) > (m)) {                                    \
      (l) = (l) * exp((m) - (s)) + (T)1;                \
      (m) = (s);                                        \
    } else {                                            \
      (l) += exp((s) - (m));                            \
    }                                                   \
  } while (0)

/* ---- Philox4x32-10 ---------------------------------------------------------------------- */
/* Counter-based: word i of the stream for seed s is the same on every device, so a CUDA kernel
 * and a CPU kernel given the same (seed, offset) draw the same numbers. */

typedef struct { uint32_t v[4]; } kg_u32x4;

KG_HD kg_u32x4 kg_philox4x32(uint64_t counter, uint64_t seed) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  kg_u32x4 out = {{c0, c1, c2, c3}};
  return out;
}
/* 32-bit word `i` of the stream (seed, offset). */
KG_HD uint32_t kg_philox_word(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t w = offset + i;
  return kg_philox4x32(w >> 2, seed).v[w & 3];
}
/* uniform in [0, 1) with 24 random bits */
KG_HD float kg_u32_to_unit(uint32_t u) { return (float)(u >> 8) * (1.0f / 16777216.0f); }
/* uniform in [0, 1) with 53 random bits, from two words */
KG_HD double kg_u32x2_to_unit(uint32_t a, uint32_t b) {
  return (double)(((uint64_t)(a >> 5) << 26) | (b >> 6)) * (1.0 / 9007199254740992.0);
}

/* Element i of a random tensor uses words 2i and 2i+1 of its stream (CPU and CUDA alike). */
/* uniform in [0, 1) with `bits` random bits (the dtype's precision: 24 f32, 8 bf16, 11 f16,
 * 53 f64), so a draw never rounds up to 1 when stored */
KG_HD double kg_uniform_bits(uint32_t w0, uint32_t w1, int bits) {
  if (bits > 32) return kg_u32x2_to_unit(w0, w1);
  return (double)(w0 >> (32 - bits)) * (1.0 / (double)(1ull << bits));
}
/* standard normal by Box-Muller from two 32-bit words; u1 is never 0, so |x| <= 6.7 */
KG_HD double kg_normal_u32x2(uint32_t w0, uint32_t w1) {
  double u1 = ((double)w0 + 0.5) * (1.0 / 4294967296.0), u2 = (double)w1 * (1.0 / 4294967296.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
