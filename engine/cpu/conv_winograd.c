/* conv_winograd.c (cpu) — conv2d forward by Winograd F(4x4, 3x3) (Lavin & Gray 2015), f32,
 * for 3x3 kernels with stride 1, dilation 1, one group and any padding.
 *
 * Shape letters: B batch, C input channels, M output channels, H/W input size, Ho/Wo output
 * size, T tiles of a block, ξ (xi) one of the 36 points of a 6x6 tile.
 * Each 4x4 output tile reads a 6x6 input tile d (neighbours overlap by 2). With the standard
 * points (0, ±1, ±2, ∞) and the 6x6 / 6x3 / 4x6 matrices Bᵀ, G, Aᵀ below,
 *   y_tile[m] = Aᵀ [ Σ_c (G g[m,c] Gᵀ) ⊙ (Bᵀ d[c] B) ] A
 * so the 3x3 conv becomes 36 independent GEMMs over the channels, V[ξ] [T, C] @ U[ξ] [C, M]:
 * 36 multiplies per 16 outputs per channel pair instead of 144. The steps, per call:
 *   - the kernel transform U = G g Gᵀ, packed [M/MB][36][C][MB] (MB output channels
 *     contiguous, zero past M); vectors over 16 output channels;
 *   - tiles (all images of the batch, row by row) in blocks of whole tile rows, blocks in
 *     parallel; per tile row of a block: its six input rows repacked channel-last and
 *     zero-padded ([Wp][Cp], Cp = C rounded up to 16; a ring of 6 row slots, so the next tile
 *     row reuses two), then the input transform V = Bᵀ d B into vb [36][T][Cp] (a tile's 36
 *     inputs of 16 channels are 36 vector loads);
 *   - per block of MB output channels the 36 GEMMs by a register-blocked kernel (n <= 14
 *     tiles x 32 channels with AVX-512, n <= 6 x 16 with AVX2+FMA; the tile's value broadcast,
 *     the U row loaded) into ob [36][T][MB], then the output transform Aᵀ m A + bias, through a
 *     row buffer into y in whole rows (partial tiles at the right and bottom edges clipped).
 * The GEMM kernel is chosen at run time (KENG_CONV_WINOGRAD=0 off, =1 AVX2 at most, =2
 * AVX-512 at most), the transforms by target_clones; without AVX2+FMA the caller's other paths
 * run. Every output is written by one block with a fixed order of sums: deterministic for any
 * thread count.
 * The weight gradient (kg_cpu_conv_winograd_bwd_weight, "weight gradient" below) is the same
 * algorithm transposed: the input transform as here, dy's 4x4 tiles transformed by A · Aᵀ, 36
 * GEMMs reducing over the tiles into per-thread partials, then Gᵀ · G to 3x3.
 * The reference is the f64 naive loop of tests/lab/lab_conv.c and tests/lua/conv_spec.lua;
 * figures and the selection rule in docs/kernels.md ("Winograd convolution"). */
#include "conv_winograd.h"

#include "cpu.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* lanes of the transforms: 16 channels per vector (a GCC vector type, compiled for the target) */
#define WL 16
typedef float v16 __attribute__((vector_size(64)));

/* unaligned load / store of 16 floats (macros: a function passing a 64-byte vector by value
 * has an ABI that depends on the ISA) */
#define ld16(p)                       \
  ({                                  \
    v16 v_;                           \
    memcpy(&v_, (p), sizeof v_);      \
    v_;                               \
  })
#define st16(p, v)                    \
  do {                                \
    v16 v_ = (v);                     \
    memcpy((p), &v_, sizeof v_);      \
  } while (0)

/* the transforms compiled for AVX-512, AVX2 and the baseline, chosen at load time (a build
 * with -march=native has one ISA anyway); SSE2 alone made the conv 1.25-1.5x slower */
#define WINO_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* r <- rᵀ (16 x 16): four rounds of zipping row i with row i + 8 (rows 2i, 2i+1 <- the low and
 * high halves of the zip); two-source permutes (vpermt2ps with AVX-512) */
#define ZIP_LO_IDX 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define ZIP_HI_IDX 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#if defined(__clang__) /* the fuzz and sanitizer builds: clang spells the two-source shuffle so */
#define ZIP_LO(a, b) __builtin_shufflevector(a, b, ZIP_LO_IDX)
#define ZIP_HI(a, b) __builtin_shufflevector(a, b, ZIP_HI_IDX)
#else
typedef int32_t i16 __attribute__((vector_size(64)));
#define ZIP_LO(a, b) __builtin_shuffle(a, b, (i16){ZIP_LO_IDX})
#define ZIP_HI(a, b) __builtin_shuffle(a, b, (i16){ZIP_HI_IDX})
#endif
static inline void transpose16(v16 r[16]) {
  for (int round = 0; round < 4; round++) {
    v16 t[16];
    for (int i = 0; i < 8; i++) {
      t[2 * i] = ZIP_LO(r[i], r[i + 8]);
      t[2 * i + 1] = ZIP_HI(r[i], r[i + 8]);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
  }
}

/* r[l] = the n (<= 16) floats at p + l * stride, zero past n, for the first `rows` l; zero
 * vectors after them */
static inline void load_rows16(v16 r[WL], const float *p, int64_t stride, int64_t rows, int64_t n) {
  for (int64_t l = 0; l < WL; l++) {
    if (l >= rows) {
      r[l] = (v16){0};
    } else if (n == WL) {
      r[l] = ld16(p + l * stride);
    } else {
      float v[WL] = {0};
      for (int64_t q = 0; q < n; q++) v[q] = p[l * stride + q];
      r[l] = ld16(v);
    }
  }
}

/* bytes of transformed input and GEMM output per block (vb + ob), and the flops below which
 * one thread runs */
#define WINO_VB_BYTES ((int64_t)640 << 10)
#define WINO_PAR_FLOPS ((int64_t)2 << 20)

/* ---- transforms (vectors over 16 channels) ----------------------------------------------------- */

/* the six rows of Bᵀ d for one column d[0..5] of the tile */
#define BT6(o, d0, d1, d2, d3, d4, d5)              \
  do {                                              \
    v16 a_ = (d4) - (d2), b_ = (d3) - (d1);         \
    (o)[0] = 4 * (d0) - 5 * (d2) + (d4);            \
    (o)[1] = ((d4) + (d3)) - 4 * ((d1) + (d2));     \
    (o)[2] = ((d4) - (d3)) + 4 * ((d1) - (d2));     \
    (o)[3] = a_ + 2 * b_;                           \
    (o)[4] = a_ - 2 * b_;                           \
    (o)[5] = 4 * (d1) - 5 * (d3) + (d5);            \
  } while (0)

/* the four rows of Aᵀ m for one column m[0..5] */
#define AT4(o, m0, m1, m2, m3, m4, m5)              \
  do {                                              \
    v16 p_ = (m1) + (m2), q_ = (m1) - (m2);         \
    v16 r_ = (m3) + (m4), s_ = (m3) - (m4);         \
    (o)[0] = (m0) + p_ + r_;                        \
    (o)[1] = q_ + 2 * s_;                           \
    (o)[2] = p_ + 4 * r_;                           \
    (o)[3] = q_ + 8 * s_ + (m5);                    \
  } while (0)

/* the six rows of G g for one column g[0..2] */
#define G6(o, g0, g1, g2)                                                  \
  do {                                                                     \
    v16 e_ = (g0) * (1.0f / 24) + (g2) * (1.0f / 6), f_ = (g1) * (1.0f / 12); \
    (o)[0] = (g0) * 0.25f;                                                 \
    (o)[1] = ((g0) + (g1) + (g2)) * (-1.0f / 6);                           \
    (o)[2] = ((g0) - (g1) + (g2)) * (-1.0f / 6);                           \
    (o)[3] = e_ + f_;                                                      \
    (o)[4] = e_ - f_;                                                      \
    (o)[5] = (g2);                                                         \
  } while (0)

/* u[mb][ξ][c][MB] = (G w[m, c] Gᵀ)[ξ] for the 16 output channels m = m0 + lane (zero for
 * m >= M); the 16 kernel rows [C*9] are first transposed into gt [C*9][16] (16 x 16 blocks in
 * registers), so each tap is one vector load: gathered lane by lane, the transform was 10% of
 * the 128->128 @16 B8 conv */
WINO_CLONES static void kernel_transform(float *u, float *gt, const float *w, int64_t C, int64_t M, int MB,
                                         int64_t m0) {
  int64_t K9 = 9 * C;
  for (int64_t j0 = 0; j0 < K9; j0 += WL) {
    int64_t nj = K9 - j0 < WL ? K9 - j0 : WL;
    v16 r[WL];
    load_rows16(r, w + m0 * K9 + j0, K9, M - m0, nj);
    transpose16(r);
    for (int64_t q = 0; q < nj; q++) st16(gt + (j0 + q) * WL, r[q]);
  }
  for (int64_t c = 0; c < C; c++) {
    v16 t[6][3], r[6];
    const float *g = gt + c * 9 * WL;
    for (int j = 0; j < 3; j++) {
      v16 col[6];
      G6(col, ld16(g + j * WL), ld16(g + (3 + j) * WL), ld16(g + (6 + j) * WL));
      for (int i = 0; i < 6; i++) t[i][j] = col[i];
    }
    float *dst = u + (m0 / MB * 36 * C + c) * MB + m0 % MB;
    for (int i = 0; i < 6; i++) {
      G6(r, t[i][0], t[i][1], t[i][2]);
      for (int j = 0; j < 6; j++) st16(dst + (i * 6 + j) * C * MB, r[j]);
    }
  }
}

/* dst[q][Cp] = x[b][c][ih][q - pw] (one padded row, channel-last), zero outside the image and
 * for c >= C */
WINO_CLONES static void pad_row(float *dst, const float *x, const kg_wino_shape *s, int64_t b, int64_t ih, int64_t Wp,
                    int64_t Cp) {
  int64_t C = s->C, H = s->H, W = s->W;
  if (ih < 0 || ih >= H) {
    memset(dst, 0, sizeof(float) * (size_t)(Wp * Cp));
    return;
  }
  memset(dst, 0, sizeof(float) * (size_t)(s->pw * Cp));
  memset(dst + (s->pw + W) * Cp, 0, sizeof(float) * (size_t)((Wp - s->pw - W) * Cp));
  float *row = dst + s->pw * Cp;
  const float *src = x + (b * C * H + ih) * W;
  /* 16 channels x 16 pixels at a time, read as rows, transposed in registers, written as
   * pixels (channel-strided reads one by one map to the same L1 set: 4.5 cycles a value) */
  for (int64_t c0 = 0; c0 < Cp; c0 += WL)
    for (int64_t w0 = 0; w0 < W; w0 += WL) {
      int64_t nw = W - w0 < WL ? W - w0 : WL;
      v16 r[WL];
      load_rows16(r, src + c0 * H * W + w0, H * W, C - c0, nw);
      transpose16(r);
      for (int64_t q = 0; q < nw; q++) st16(row + (w0 + q) * Cp + c0, r[q]);
    }
}

typedef struct {
  int64_t nth, ntw, Wp, Cp, Ho, Wo, T;
} wino_plan;

/* vb[ξ][t0 + tw][Cp] = (Bᵀ d B)[ξ] of the tiles tw < ntw of one tile row, whose six padded
 * input rows [Wp][Cp] are rp[0..5] */
WINO_CLONES static void input_transform(float *vb, const float *const rp[6], const wino_plan *pl, int64_t t0) {
  int64_t Cp = pl->Cp, T = pl->T;
  for (int64_t tw = 0; tw < pl->ntw; tw++) {
    int64_t o = 4 * tw * Cp;
    for (int64_t c0 = 0; c0 < Cp; c0 += WL) {
      v16 s[6][6];
      for (int j = 0; j < 6; j++) {
        int64_t q = o + j * Cp + c0;
        v16 col[6];
        BT6(col, ld16(rp[0] + q), ld16(rp[1] + q), ld16(rp[2] + q), ld16(rp[3] + q), ld16(rp[4] + q), ld16(rp[5] + q));
        for (int i = 0; i < 6; i++) s[i][j] = col[i];
      }
      float *dst = vb + (t0 + tw) * Cp + c0;
      for (int i = 0; i < 6; i++) {
        v16 r[6];
        BT6(r, s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5]);
        for (int j = 0; j < 6; j++) st16(dst + (i * 6 + j) * T * Cp, r[j]);
      }
    }
  }
}

/* y[b][m][4th + i][4tw + j] = (Aᵀ ob A)[i][j] + bias[m] for the block's nr tile rows from
 * global tile row r0 and output channels m0 .. m0+MB-1 (ob [36][T][MB]); bp is the bias
 * zero-padded to a multiple of MB. A tile row goes through rowbuf [MB][4][4*ntw], so y is
 * written in whole rows by vector copies rather than tile by tile in 16-byte pieces (4 rows
 * in each of MB planes, 64 KB apart at 128x128). */
WINO_CLONES static void output_transform(float *y, const float *ob, const float *bp, float *rowbuf, const kg_wino_shape *s,
                             const wino_plan *pl, int64_t r0, int64_t nr, int64_t m0, int MB) {
  int64_t M = s->M, Ho = pl->Ho, Wo = pl->Wo, T = pl->T, Wq = 4 * pl->ntw;
  for (int64_t rr = 0; rr < nr; rr++) {
    int64_t b = (r0 + rr) / pl->nth, th = (r0 + rr) % pl->nth, ni = Ho - 4 * th < 4 ? Ho - 4 * th : 4;
    for (int64_t tw = 0; tw < pl->ntw; tw++) {
      int64_t t = rr * pl->ntw + tw;
      for (int lg = 0; lg < MB && m0 + lg < M; lg += WL) {
        v16 s4[4][6], o[4][4];
        for (int j = 0; j < 6; j++) {
          const float *p = ob + t * MB + lg + j * T * MB;
          v16 col[4];
          AT4(col, ld16(p), ld16(p + 6 * T * MB), ld16(p + 12 * T * MB), ld16(p + 18 * T * MB),
              ld16(p + 24 * T * MB), ld16(p + 30 * T * MB));
          for (int i = 0; i < 4; i++) s4[i][j] = col[i];
        }
        v16 bv = ld16(bp + m0 + lg);
        for (int i = 0; i < 4; i++) {
          AT4(o[i], s4[i][0], s4[i][1], s4[i][2], s4[i][3], s4[i][4], s4[i][5]);
          for (int j = 0; j < 4; j++) o[i][j] += bv;
        }
        /* to one vector of 16 pixels per output channel, rows of 4 into rowbuf */
        v16 r[WL];
        for (int p = 0; p < 16; p++) r[p] = o[p / 4][p % 4];
        transpose16(r);
        for (int l = 0; l < WL; l++) {
          float v[WL], *d = rowbuf + (lg + l) * 4 * Wq + 4 * tw;
          st16(v, r[l]);
          for (int i = 0; i < 4; i++) memcpy(d + i * Wq, v + 4 * i, 4 * sizeof(float));
        }
      }
    }
    int64_t nm = M - m0 < MB ? M - m0 : MB;
    /* vector copies: memcpy of one short row per call was 6% of the 128->128 @16 conv */
    for (int64_t l = 0; l < nm; l++)
      for (int64_t i = 0; i < ni; i++) {
        float *d = y + ((b * M + m0 + l) * Ho + 4 * th + i) * Wo;
        const float *src = rowbuf + (l * 4 + i) * Wq;
        int64_t q = 0;
        for (; q + WL <= Wo; q += WL) st16(d + q, ld16(src + q));
        for (; q < Wo; q++) d[q] = src[q];
      }
  }
}

/* ---- the 36 GEMMs: register-blocked kernel (AVX-512 or AVX2+FMA) ---------------------------- */

/* out[j][MB] = Σ_c v[j * ldv + c] * u[c][MB] for j < N tiles, MB = 2 vectors of output
 * channels; N is a compile-time constant so the 2N accumulators stay in registers */
#define DEFINE_WINO_TILE(ISA, TGT, V, L, LOAD, STORE, SET1, FMA, ZERO, N)                                   \
  __attribute__((target(TGT))) static void wino_tile_##ISA##_##N(int64_t C, const float *v, int64_t ldv,      \
                                                                 const float *u, float *out) {                \
    V acc[N][2];                                                                                           \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) acc[j][0] = ZERO(), acc[j][1] = ZERO();           \
    for (int64_t c = 0; c < C; c++, u += 2 * L) {                                                          \
      V a0 = LOAD(u), a1 = LOAD(u + L);                                                                    \
      _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                               \
        V xv = SET1(v[j * ldv + c]);                                                                       \
        acc[j][0] = FMA(a0, xv, acc[j][0]);                                                                \
        acc[j][1] = FMA(a1, xv, acc[j][1]);                                                                \
      }                                                                                                    \
    }                                                                                                      \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                                 \
      STORE(out + j * 2 * L, acc[j][0]);                                                                   \
      STORE(out + j * 2 * L + L, acc[j][1]);                                                               \
    }                                                                                                      \
  }

#define WT512(N) DEFINE_WINO_TILE(avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_setzero_ps, N)
#define WT256(N) DEFINE_WINO_TILE(avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_setzero_ps, N)
/* AVX-512: 2N accumulators + 2 kernel vectors + 1 broadcast <= 32 registers; AVX2: <= 16 */
WT512(1) WT512(2) WT512(3) WT512(4) WT512(5) WT512(6) WT512(7) WT512(8) WT512(9) WT512(10) WT512(11)
WT512(12) WT512(13) WT512(14)
WT256(1) WT256(2) WT256(3) WT256(4) WT256(5) WT256(6)

typedef void (*wino_fn)(int64_t, const float *, int64_t, const float *, float *);
static const wino_fn wino_avx512[] = {NULL, wino_tile_avx512_1, wino_tile_avx512_2, wino_tile_avx512_3,
                                      wino_tile_avx512_4, wino_tile_avx512_5, wino_tile_avx512_6,
                                      wino_tile_avx512_7, wino_tile_avx512_8, wino_tile_avx512_9,
                                      wino_tile_avx512_10, wino_tile_avx512_11, wino_tile_avx512_12,
                                      wino_tile_avx512_13, wino_tile_avx512_14};
static const wino_fn wino_avx2[] = {NULL, wino_tile_avx2_1, wino_tile_avx2_2, wino_tile_avx2_3,
                                    wino_tile_avx2_4, wino_tile_avx2_5, wino_tile_avx2_6};

/* ---- selection and driver ------------------------------------------------------------------- */

/* 2: AVX-512, 1: AVX2+FMA, 0: off; KENG_CONV_WINOGRAD=0 turns it off, =1 / =2 caps the ISA
 * (the lab switches variants with setenv + kg_env_reload) */
static int wino_isa(void) { return kg_cpu_vector_isa(KG_ENV_KENG_CONV_WINOGRAD); }

/* the shapes the transform is correct for */
static bool wino_applies(const kg_wino_shape *s) {
  return s->kh == 3 && s->kw == 3 && s->sh == 1 && s->sw == 1 && s->dh == 1 && s->dw == 1 && s->groups == 1 &&
         s->ph >= 0 && s->pw >= 0 && s->B > 0 && s->C > 0 && s->M > 0 && s->H + 2 * s->ph >= 3 &&
         s->W + 2 * s->pw >= 3;
}

/* the shapes where it is faster than the other paths (one thread, docs/kernels.md "Winograd
 * convolution"); KENG_CONV_WINOGRAD_FORCE=1 (lab): wherever it applies */
static bool wino_wanted(const kg_wino_shape *s, int64_t Ho, int64_t Wo) {
  if (kg_env_bool(KG_ENV_KENG_CONV_WINOGRAD_FORCE)) return true;
  int64_t P = Ho * Wo, tiles = ((Ho + 3) / 4) * ((Wo + 3) / 4);
  /* 4 input channels lose to the GEMM (8x64x64 4->32: 1.09-1.23 vs 1.08-1.10 ms), 8 win
   * (1.23-1.25 vs 1.98) */
  if (s->C < 8) return false;
  /* few output channels leave most of the 32-channel GEMM block empty: a loss at 128x128
   * (8x128 128->3: 45-47 vs 40-41 ms), a win on small images where the GEMM is badly shaped
   * (UNet conv_out 13x32x16x16 -> 4: 0.25-0.32 vs 0.49 ms) */
  if (s->M < 16 && !(s->M >= 4 && P <= 256)) return false;
  /* at least 64 pixels, most of the tiles' outputs inside the image (6x6: 0.13 vs 0.10 ms and
   * 5x5: 0.28 vs 0.20 against the direct kernel) */
  /* 4x4 images (one tile each) are left to the direct kernel: alone, with the weights hot, 13
   * images 128 -> 128 took 0.40 vs 0.47 ms by Winograd, but inside the UNet (sd_predict, 1
   * thread, cold weights: the transformed kernel is 4x the weight and each of its entries meets
   * only 13 tiles) 0.65 vs 0.53 ms, 256 -> 128 1.79 vs 1.51, 192 -> 128 1.16 vs 0.65 */
  return P >= 64 && 2 * P >= 16 * tiles;
}

bool kg_cpu_conv_winograd(float *y, const float *x, const float *w, const float *bias, const kg_wino_shape *s) {
  if (!wino_applies(s)) return false;
  int isa = wino_isa();
  int64_t Ho = s->H + 2 * s->ph - 2, Wo = s->W + 2 * s->pw - 2;
  if (isa == 0 || !wino_wanted(s, Ho, Wo)) return false;
  int L = isa == 2 ? 16 : 8, MB = 2 * L, NT = isa == 2 ? 14 : 6;
  const wino_fn *fns = isa == 2 ? wino_avx512 : wino_avx2;
  int64_t B = s->B, C = s->C, M = s->M, Cp = (C + WL - 1) / WL * WL;
  /* MB is 16 or 32: a multiple of the transforms' 16 lanes */
  int64_t nmb = (M + MB - 1) / MB, Mp = nmb * MB;
  wino_plan pl = {(Ho + 3) / 4, (Wo + 3) / 4, 0, Cp, Ho, Wo, 0};
  pl.Wp = 4 * pl.ntw + 2;
  /* a block: whole tile rows (of one or more images), vb + ob near WINO_VB_BYTES (L2 is 1 MB
   * on Zen 4; 256 KB of vb alone: 128->128 @16 B13 3.3-3.4 vs 3.1-3.3 ms); blocks of
   * near-equal size, a multiple of the thread count when there are enough rows (8x8 B13 at 2
   * threads was one block of 23 rows and one of 3) */
  int64_t nrows = B * pl.nth, TR = WINO_VB_BYTES / (36 * 4 * (Cp + MB)) / pl.ntw;
  if (TR < 1) TR = 1;
  bool par = 2 * B * M * C * 9 * Ho * Wo > WINO_PAR_FLOPS;
  int64_t nthr = par ? omp_get_max_threads() : 1, nblk = (nrows + TR - 1) / TR;
  nblk = (nblk + nthr - 1) / nthr * nthr;
  if (nblk > nrows) nblk = nrows;
  int64_t rbase = nrows / nblk, rextra = nrows % nblk, T = pl.T = (rbase + (rextra > 0)) * pl.ntw;
  size_t bu, bb;
  float *u = kg_cpu_alloc(sizeof(float) * (size_t)(36 * C * Mp), &bu);
  float *bp = kg_cpu_alloc(sizeof(float) * (size_t)Mp, &bb);
  bool ok = u && bp;
  if (ok)
    for (int64_t m = 0; m < Mp; m++) bp[m] = bias && m < M ? bias[m] : 0;
#pragma omp parallel if (par && ok)
  {
    size_t bvb = 0, bob = 0, brw = 0, bor = 0;
    float *vb = NULL, *ob = NULL, *rows = NULL, *orow = NULL;
    if (ok) {
      /* vb first serves as the kernel transform's gt [C*9][16] */
      int64_t nvb = 36 * T * Cp > 9 * C * WL ? 36 * T * Cp : 9 * C * WL;
      vb = kg_cpu_alloc(sizeof(float) * (size_t)nvb, &bvb);
      ob = kg_cpu_alloc(sizeof(float) * (size_t)(36 * T * MB), &bob);
      rows = kg_cpu_alloc(sizeof(float) * (size_t)(6 * pl.Wp * Cp), &brw);
      orow = kg_cpu_alloc(sizeof(float) * (size_t)(MB * 4 * 4 * pl.ntw), &bor);
    }
    if (!vb || !ob || !rows || !orow) {
#pragma omp atomic write
      ok = false;
    }
#pragma omp barrier
    if (ok) {
#pragma omp for schedule(static)
      for (int64_t q = 0; q < Mp / WL; q++) kernel_transform(u, vb, w, C, M, MB, q * WL);
    }
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < nblk; bk++) {
      if (!ok || kg_interrupt_pending()) continue;
      int64_t r0 = bk * rbase + (bk < rextra ? bk : rextra), nr = rbase + (bk < rextra), nt = nr * pl.ntw;
      for (int64_t r = 0; r < nr; r++) { /* tile row (image b, row th) */
        int64_t b = (r0 + r) / pl.nth, th = (r0 + r) % pl.nth;
        /* padded input row 4th + i in slot (4th + i) % 6: the next tile row of the image
         * reuses the last two */
        const float *rp[6];
        for (int i = 0; i < 6; i++) {
          float *slot = rows + (4 * th + i) % 6 * pl.Wp * Cp;
          if (r == 0 || th == 0 || i >= 2) pad_row(slot, x, s, b, 4 * th + i - s->ph, pl.Wp, Cp);
          rp[i] = slot;
        }
        input_transform(vb, rp, &pl, r * pl.ntw);
      }
      for (int64_t mb = 0; mb < nmb; mb++) {
        const float *um = u + mb * 36 * C * MB;
        /* groups of near-equal size (32 tiles: 11 + 11 + 10, not 14 + 14 + 4) */
        int64_t ng = (nt + NT - 1) / NT, base = nt / ng, extra = nt % ng;
        for (int xi = 0; xi < 36; xi++)
          for (int64_t q = 0, j = 0; q < ng; q++) {
            int64_t n = base + (q < extra);
            fns[n](C, vb + (xi * T + j) * Cp, Cp, um + xi * C * MB, ob + (xi * T + j) * MB);
            j += n;
          }
        output_transform(y, ob, bp, orow, s, &pl, r0, nr, mb * MB, MB);
      }
    }
    if (vb) kg_cpu_free(vb, bvb);
    if (ob) kg_cpu_free(ob, bob);
    if (rows) kg_cpu_free(rows, brw);
    if (orow) kg_cpu_free(orow, bor);
  }
  if (u) kg_cpu_free(u, bu);
  if (bp) kg_cpu_free(bp, bb);
  /* performed: the 36 products of each 6x6 transformed tile (whole tiles at the edges); the
   * transforms, O(C + M) per tile against O(C * M), are left out */
  if (ok) kg_flop_add_algo((uint64_t)(2 * B * M * C * 9 * Ho * Wo), (uint64_t)(2 * 36 * B * M * C * pl.nth * pl.ntw));
  return ok;
}

/* ---- weight gradient ------------------------------------------------------------------------ */
/* The forward transposed: with V = Bᵀ x_tile[c] B (the forward's input transform) and
 * E = A dy_tile[m] Aᵀ (dy's 4x4 tile, zero outside the output, to 6x6),
 *   dw[m, c] = Gᵀ [ Σ_tiles E[m] ⊙ V[c] ] G
 * so 36 GEMMs Z[ξ] [C, M] += V[ξ]ᵀ [C, T] @ E[ξ] [T, M] reduce over the tiles. Each thread
 * sums its blocks of tile rows (contiguous, in order) into its own Z [36][Cp][Mp]; the partials
 * are added in thread order, then the 3x3 transform Gᵀ Z G per (m, c): deterministic for a
 * given thread count. */

/* the six rows of A e for one column e[0..3] (A = (Aᵀ)ᵀ, 6x4) */
#define A6(o, e0, e1, e2, e3)                       \
  do {                                              \
    v16 p_ = (e0) + (e2), q_ = (e1) + (e3);         \
    v16 r_ = (e0) + 4 * (e2), s_ = 2 * (e1) + 8 * (e3); \
    (o)[0] = (e0);                                  \
    (o)[1] = p_ + q_;                               \
    (o)[2] = p_ - q_;                               \
    (o)[3] = r_ + s_;                               \
    (o)[4] = r_ - s_;                               \
    (o)[5] = (e3);                                  \
  } while (0)

/* eb[ξ][t0 + tw][Mp] = (A e Aᵀ)[ξ] of the tiles tw < ntw of one tile row, whose four dy rows
 * (channel-last, zero past Wo and M) are rq[0..3] [4*ntw][Mp] */
WINO_CLONES static void grad_transform(float *eb, const float *const rq[4], const wino_plan *pl, int64_t Mp,
                                       int64_t t0) {
  int64_t T = pl->T;
  for (int64_t tw = 0; tw < pl->ntw; tw++)
    for (int64_t m0 = 0; m0 < Mp; m0 += WL) {
      v16 s[6][4];
      for (int j = 0; j < 4; j++) {
        int64_t q = (4 * tw + j) * Mp + m0;
        v16 col[6];
        A6(col, ld16(rq[0] + q), ld16(rq[1] + q), ld16(rq[2] + q), ld16(rq[3] + q));
        for (int i = 0; i < 6; i++) s[i][j] = col[i];
      }
      float *dst = eb + (t0 + tw) * Mp + m0;
      for (int i = 0; i < 6; i++) {
        v16 r[6];
        A6(r, s[i][0], s[i][1], s[i][2], s[i][3]);
        for (int j = 0; j < 6; j++) st16(dst + (i * 6 + j) * T * Mp, r[j]);
      }
    }
}

/* z[j * ldz + 0 .. 2L) += Σ_t v[t * ldv + j] * e[t * lde + 0 .. 2L) for j < N channels c; the
 * 2L output channels m in vectors, the tiles t the reduction */
#define DEFINE_WINO_WTILE(ISA, TGT, V, L, LOAD, STORE, SET1, FMA, ZERO, ADD, N)                              \
  __attribute__((target(TGT))) static void winow_tile_##ISA##_##N(int64_t T, const float *v, int64_t ldv,     \
                                                                  const float *e, int64_t lde, float *z,    \
                                                                  int64_t ldz) {                            \
    V acc[N][2];                                                                                           \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) acc[j][0] = ZERO(), acc[j][1] = ZERO();           \
    for (int64_t t = 0; t < T; t++, v += ldv, e += lde) {                                                  \
      V a0 = LOAD(e), a1 = LOAD(e + L);                                                                    \
      _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                               \
        V xv = SET1(v[j]);                                                                                 \
        acc[j][0] = FMA(a0, xv, acc[j][0]);                                                                \
        acc[j][1] = FMA(a1, xv, acc[j][1]);                                                                \
      }                                                                                                    \
    }                                                                                                      \
    _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) {                                                 \
      STORE(z + j * ldz, ADD(LOAD(z + j * ldz), acc[j][0]));                                               \
      STORE(z + j * ldz + L, ADD(LOAD(z + j * ldz + L), acc[j][1]));                                       \
    }                                                                                                      \
  }

#define WW512(N) DEFINE_WINO_WTILE(avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_add_ps, N)
#define WW256(N) DEFINE_WINO_WTILE(avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_add_ps, N)
WW512(1) WW512(2) WW512(3) WW512(4) WW512(5) WW512(6) WW512(7) WW512(8) WW512(9) WW512(10) WW512(11)
WW512(12) WW512(13) WW512(14)
WW256(1) WW256(2) WW256(3) WW256(4) WW256(5) WW256(6)

typedef void (*winow_fn)(int64_t, const float *, int64_t, const float *, int64_t, float *, int64_t);
static const winow_fn winow_avx512[] = {NULL, winow_tile_avx512_1, winow_tile_avx512_2, winow_tile_avx512_3,
                                        winow_tile_avx512_4, winow_tile_avx512_5, winow_tile_avx512_6,
                                        winow_tile_avx512_7, winow_tile_avx512_8, winow_tile_avx512_9,
                                        winow_tile_avx512_10, winow_tile_avx512_11, winow_tile_avx512_12,
                                        winow_tile_avx512_13, winow_tile_avx512_14};
static const winow_fn winow_avx2[] = {NULL, winow_tile_avx2_1, winow_tile_avx2_2, winow_tile_avx2_3,
                                      winow_tile_avx2_4, winow_tile_avx2_5, winow_tile_avx2_6};

/* bytes of transformed x and dy per block (vb + eb): flat from 512 KB to 4 MB on the VAE
 * shapes (1 MB best by a few %), 8 MB 5-20% slower */
#define WINO_BW_BYTES ((int64_t)1 << 20)

/* the three rows of Gᵀ z for one column z[0..5] */
#define GT3(o, z0, z1, z2, z3, z4, z5)                                        \
  do {                                                                        \
    v16 p_ = (z1) + (z2), r_ = (z3) + (z4);                                   \
    (o)[0] = (z0) * 0.25f - p_ * (1.0f / 6) + r_ * (1.0f / 24);               \
    (o)[1] = ((z2) - (z1)) * (1.0f / 6) + ((z3) - (z4)) * (1.0f / 12);        \
    (o)[2] = (r_ - p_) * (1.0f / 6) + (z5);                                   \
  } while (0)

/* dw[m][c][3][3] = (Gᵀ z[.][c][m] G) for m < M, c < C (z [36][Cp][Mp]), 16 output channels
 * per vector (read lane by lane from z, the transform was 40% of the 13x128x4x4 dw) */
WINO_CLONES static void grad_output(float *dw, const float *z, int64_t C, int64_t M, int64_t Cp, int64_t Mp) {
  for (int64_t c = 0; c < C; c++)
    for (int64_t m0 = 0; m0 < M; m0 += WL) {
      v16 t[3][6], r[3][3];
      for (int j = 0; j < 6; j++) {
        const float *p = z + (j * Cp + c) * Mp + m0;
        int64_t q = 6 * Cp * Mp;
        v16 col[3];
        GT3(col, ld16(p), ld16(p + q), ld16(p + 2 * q), ld16(p + 3 * q), ld16(p + 4 * q), ld16(p + 5 * q));
        for (int i = 0; i < 3; i++) t[i][j] = col[i];
      }
      for (int i = 0; i < 3; i++) GT3(r[i], t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5]);
      float v[9][WL];
      for (int k = 0; k < 9; k++) st16(v[k], r[k / 3][k % 3]);
      for (int64_t l = 0; l < WL && m0 + l < M; l++) {
        float *d = dw + ((m0 + l) * C + c) * 9;
        for (int k = 0; k < 9; k++) d[k] = v[k][l];
      }
    }
}

bool kg_cpu_conv_winograd_bwd_weight(float *dw, const float *x, const float *dy, const kg_wino_shape *s) {
  if (!wino_applies(s)) return false;
  int isa = wino_isa();
  int64_t Ho = s->H + 2 * s->ph - 2, Wo = s->W + 2 * s->pw - 2;
  /* =0: the weight gradient by the other paths */
  if (isa == 0 || !kg_env_bool(KG_ENV_KENG_CONV_WINOGRAD_DW) || !wino_wanted(s, Ho, Wo)) return false;
  /* images of fewer than 64 output pixels (the forward's 4x4 branch) tie or lose to the direct
   * kernel: 13x128x4x4 -> 128 1.34 vs 1.27 ms (fwd + bwd), 256 -> 128 2.51 vs 2.58 */
  if (Ho * Wo < 64 && !kg_env_bool(KG_ENV_KENG_CONV_WINOGRAD_FORCE)) return false;
  int L = isa == 2 ? 16 : 8, MB = 2 * L, NT = isa == 2 ? 14 : 6;
  const winow_fn *fns = isa == 2 ? winow_avx512 : winow_avx2;
  int64_t B = s->B, C = s->C, M = s->M, Cp = (C + WL - 1) / WL * WL, Mp = (M + MB - 1) / MB * MB;
  wino_plan pl = {(Ho + 3) / 4, (Wo + 3) / 4, 0, Cp, Ho, Wo, 0};
  pl.Wp = 4 * pl.ntw + 2;
  int64_t Wq = 4 * pl.ntw, nrows = B * pl.nth, TR = WINO_BW_BYTES / (36 * 4 * (Cp + Mp)) / pl.ntw;
  if (TR < 1) TR = 1;
  bool par = 2 * B * M * C * 9 * Ho * Wo > WINO_PAR_FLOPS;
  int64_t nthr = par ? omp_get_max_threads() : 1, nblk = (nrows + TR - 1) / TR;
  nblk = (nblk + nthr - 1) / nthr * nthr;
  if (nblk > nrows) nblk = nrows;
  int64_t rbase = nrows / nblk, rextra = nrows % nblk, T = pl.T = (rbase + (rextra > 0)) * pl.ntw;
  int64_t nz = 36 * Cp * Mp;
  /* dy seen as an "image" [B, M, Ho, Wo] for pad_row (no padding; rows past Ho are zero) */
  kg_wino_shape sy = *s;
  sy.C = M, sy.H = Ho, sy.W = Wo, sy.ph = sy.pw = 0;
  size_t bzs;
  float *zs = kg_cpu_alloc(sizeof(float) * (size_t)(nz * nthr), &bzs);
  bool ok = zs != NULL;
  int nused = 1;
#pragma omp parallel num_threads((int)nthr) if (par && ok)
  {
    int tid = omp_get_thread_num();
#pragma omp single
    nused = omp_get_num_threads();
    size_t bvb = 0, beb = 0, brw = 0, bry = 0;
    float *vb = NULL, *eb = NULL, *rows = NULL, *rowy = NULL, *z = ok ? zs + tid * nz : NULL;
    if (ok) {
      vb = kg_cpu_alloc(sizeof(float) * (size_t)(36 * T * Cp), &bvb);
      eb = kg_cpu_alloc(sizeof(float) * (size_t)(36 * T * Mp), &beb);
      rows = kg_cpu_alloc(sizeof(float) * (size_t)(6 * pl.Wp * Cp), &brw);
      rowy = kg_cpu_alloc(sizeof(float) * (size_t)(4 * Wq * Mp), &bry);
      memset(z, 0, sizeof(float) * (size_t)nz);
    }
    if (!vb || !eb || !rows || !rowy) {
#pragma omp atomic write
      ok = false;
    }
#pragma omp barrier
    /* contiguous blocks per thread, in order (schedule(static) with nblk a multiple of the
     * thread count, or fewer blocks than threads) */
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < nblk; bk++) {
      if (!ok || kg_interrupt_pending()) continue;
      int64_t r0 = bk * rbase + (bk < rextra ? bk : rextra), nr = rbase + (bk < rextra), nt = nr * pl.ntw;
      for (int64_t r = 0; r < nr; r++) {
        int64_t b = (r0 + r) / pl.nth, th = (r0 + r) % pl.nth;
        const float *rp[6], *rq[4];
        for (int i = 0; i < 6; i++) {
          float *slot = rows + (4 * th + i) % 6 * pl.Wp * Cp;
          if (r == 0 || th == 0 || i >= 2) pad_row(slot, x, s, b, 4 * th + i - s->ph, pl.Wp, Cp);
          rp[i] = slot;
        }
        input_transform(vb, rp, &pl, r * pl.ntw);
        for (int i = 0; i < 4; i++) {
          pad_row(rowy + i * Wq * Mp, dy, &sy, b, 4 * th + i, Wq, Mp);
          rq[i] = rowy + i * Wq * Mp;
        }
        grad_transform(eb, rq, &pl, Mp, r * pl.ntw);
      }
      /* channel groups of near-equal size */
      int64_t ng = (C + NT - 1) / NT, base = C / ng, extra = C % ng;
      for (int xi = 0; xi < 36; xi++)
        for (int64_t m0 = 0; m0 < Mp; m0 += MB)
          for (int64_t q = 0, c0 = 0; q < ng; q++) {
            int64_t n = base + (q < extra);
            fns[n](nt, vb + xi * T * Cp + c0, Cp, eb + xi * T * Mp + m0, Mp, z + (xi * Cp + c0) * Mp + m0, Mp);
            c0 += n;
          }
    }
    if (vb) kg_cpu_free(vb, bvb);
    if (eb) kg_cpu_free(eb, beb);
    if (rows) kg_cpu_free(rows, brw);
    if (rowy) kg_cpu_free(rowy, bry);
  }
  if (ok && !kg_interrupt_pending()) {
    for (int t = 1; t < nused; t++) /* partials in thread order */
      for (int64_t i = 0; i < nz; i++) zs[i] += zs[t * nz + i];
    grad_output(dw, zs, C, M, Cp, Mp);
  }
  if (zs) kg_cpu_free(zs, bzs);
  /* performed: the 36 products of each 6x6 transformed tile (whole tiles at the edges); the
   * transforms, O(C + M) per tile against O(C * M), are left out */
  if (ok) kg_flop_add_algo((uint64_t)(2 * B * M * C * 9 * Ho * Wo), (uint64_t)(2 * 36 * B * M * C * pl.nth * pl.ntw));
  return ok;
}
