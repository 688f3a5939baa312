/* ops_api.h — the public op functions, by family, and their params structs.
 *
 * Each kg_<op>() validates dtypes, devices and shapes, allocates its outputs, records the
 * autograd node and dispatches (describe, then run). All dims are 0-based here and may be
 * negative (-1 = last). Shape letters: B batch, T/S query/key length, H heads, D head dim,
 * C channels or classes, N rows, K reduction.
 */
#ifndef KENG_OPS_API_H
#define KENG_OPS_API_H

/* ---- creation (engine/ops/creation.c) ---------------------------------------------------- */

typedef struct { double value; } kg_fill_params;
typedef struct { double start, step; } kg_arange_params;
/* rand: uniform [a, b); randn: normal mean a, std b; randint: integers in [a, b). */
typedef struct { kg_philox_state rng; double a, b; } kg_random_params;
typedef struct { int64_t k; } kg_tri_params; /* diagonal offset */

kg_status kg_full(kg_tensor **out, int ndim, const int64_t *shape, double value, kg_dtype dt, kg_device dev);
/* kg_full whose errors name `op` (the function the user called: "zeros", "ones_like", ...) */
kg_status kg_full_named(kg_tensor **out, int ndim, const int64_t *shape, double value, kg_dtype dt, kg_device dev,
                        const char *op);
kg_status kg_fill_(kg_tensor *t, double value); /* in place, any view */
kg_status kg_arange(kg_tensor **out, double start, double end, double step, kg_dtype dt, kg_device dev);
kg_status kg_rand(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev);
kg_status kg_randn(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev);
kg_status kg_randint(kg_tensor **out, int64_t lo, int64_t hi, int ndim, const int64_t *shape, kg_dtype dt,
                     kg_device dev);
kg_status kg_tril(kg_tensor **out, const kg_tensor *x, int64_t k); /* x: [..., N, M] */
kg_status kg_triu(kg_tensor **out, const kg_tensor *x, int64_t k);

/* ---- copies and casts (engine/ops/copy.c) ------------------------------------------------ */

/* dst <- src, broadcasting src to dst's shape and converting dtype; any device pair. In place,
 * not recorded by autograd. */
kg_status kg_copy_(kg_tensor *dst, const kg_tensor *src);
/* x converted to dtype/device (x itself, retained, if nothing changes). Differentiable. */
kg_status kg_to(kg_tensor **out, const kg_tensor *x, kg_dtype dt, kg_device dev);
kg_status kg_contiguous(kg_tensor **out, const kg_tensor *x); /* x retained if contiguous */
kg_status kg_clone(kg_tensor **out, const kg_tensor *x);
kg_status kg_detach(kg_tensor **out, const kg_tensor *x); /* shares storage, no grad */

/* ---- views (engine/ops/view.c) ----------------------------------------------------------- */

typedef struct { int ndim; int64_t shape[KG_MAX_DIMS]; } kg_view_params;
typedef struct { int perm[KG_MAX_DIMS]; } kg_permute_params;
typedef struct { int dim; int64_t start, length; } kg_narrow_params;
typedef struct { int dim; int64_t index; } kg_select_params;

kg_status kg_view(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *shape);    /* one -1 */
kg_status kg_reshape(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *shape); /* copies if needed */
kg_status kg_permute(kg_tensor **out, const kg_tensor *x, const int *perm);
kg_status kg_transpose(kg_tensor **out, const kg_tensor *x, int d0, int d1);
kg_status kg_expand(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *shape); /* -1 keeps */
kg_status kg_narrow(kg_tensor **out, const kg_tensor *x, int dim, int64_t start, int64_t length);
kg_status kg_select(kg_tensor **out, const kg_tensor *x, int dim, int64_t index); /* index may be < 0 */
kg_status kg_squeeze(kg_tensor **out, const kg_tensor *x, int dim); /* dim KG_ALL_DIMS: all size-1 dims */
kg_status kg_unsqueeze(kg_tensor **out, const kg_tensor *x, int dim);
kg_status kg_flatten(kg_tensor **out, const kg_tensor *x); /* reshape to [numel] */
#define KG_ALL_DIMS 0x7fffffff

/* ---- elementwise (engine/ops/elementwise.c) --------------------------------------------- */

typedef struct { double lo, hi; } kg_clamp_params; /* -INFINITY / INFINITY = no bound; a NaN bound gives NaN */
/* din = dout * f'(x) for unary op `op` in one pass; x is the op's saved input or output */
typedef struct { kg_op op; double lo, hi; } kg_unary_backward_params;

kg_status kg_unary(kg_tensor **out, kg_op op, const kg_tensor *x);
kg_status kg_binary(kg_tensor **out, kg_op op, const kg_tensor *a, const kg_tensor *b);
/* a <op> s (or s <op> a when scalar_first); s takes a's dtype when a is floating. */
kg_status kg_binary_scalar(kg_tensor **out, kg_op op, const kg_tensor *a, double s, bool scalar_first);
/* a <- a <op> b in place (b broadcast to a); not recorded. */
kg_status kg_binary_(kg_op op, kg_tensor *a, const kg_tensor *b);
kg_status kg_clamp(kg_tensor **out, const kg_tensor *x, double lo, double hi);
kg_status kg_where(kg_tensor **out, const kg_tensor *cond, const kg_tensor *a, const kg_tensor *b);
/* PyTorch's softplus: log(1 + exp(beta x)) / beta, x where beta x > threshold; (1, 20) is the
 * SOFTPLUS row. beta finite and non-zero. */
kg_status kg_softplus(kg_tensor **out, const kg_tensor *x, double beta, double threshold);
/* A 0-d tensor holding v. */
kg_status kg_scalar(kg_tensor **out, double v, kg_dtype dt, kg_device dev);

/* ---- reductions (engine/ops/reduce.c) ---------------------------------------------------- */

/* dims as a bit mask over 0-based dims; KG_DIMS_ALL reduces everything. */
typedef struct { uint32_t mask; bool keepdim; int correction; } kg_reduce_params;
typedef struct { int dim; bool keepdim; } kg_dim_params;
typedef struct { int64_t k; int dim; bool largest, sorted; } kg_topk_params;
#define KG_DIMS_ALL 0xffffffffu

kg_status kg_sum(kg_tensor **out, const kg_tensor *x, uint32_t mask, bool keepdim);
kg_status kg_mean(kg_tensor **out, const kg_tensor *x, uint32_t mask, bool keepdim);
kg_status kg_var(kg_tensor **out, const kg_tensor *x, uint32_t mask, bool keepdim, int correction);
/* values and 0-based i64 indices along dim (indices may be NULL). */
kg_status kg_max(kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int dim, bool keepdim);
kg_status kg_min(kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int dim, bool keepdim);
kg_status kg_argmax(kg_tensor **out, const kg_tensor *x, int dim, bool keepdim);
kg_status kg_argmin(kg_tensor **out, const kg_tensor *x, int dim, bool keepdim);
kg_status kg_cumsum(kg_tensor **out, const kg_tensor *x, int dim);
kg_status kg_topk(kg_tensor **values, kg_tensor **indices, const kg_tensor *x, int64_t k, int dim, bool largest,
                  bool sorted);
kg_status kg_softmax(kg_tensor **out, const kg_tensor *x, int dim);
kg_status kg_log_softmax(kg_tensor **out, const kg_tensor *x, int dim);

/* ---- indexing and layout (engine/ops/index.c) ------------------------------------------- */

typedef struct { int dim; } kg_cat_params;
typedef struct { int npad; int64_t pad[2 * KG_MAX_DIMS]; double value; } kg_pad_params;
typedef struct { int dim; } kg_index_params;

kg_status kg_cat(kg_tensor **out, int n, const kg_tensor *const *xs, int dim);
kg_status kg_stack(kg_tensor **out, int n, const kg_tensor *const *xs, int dim);
/* pad = {left, right} for the last dim, then {top, bottom} for the one before, ... (as F.pad). */
kg_status kg_pad(kg_tensor **out, const kg_tensor *x, int npad, const int64_t *pad, double value);
kg_status kg_gather(kg_tensor **out, const kg_tensor *x, int dim, const kg_tensor *idx);
kg_status kg_index_select(kg_tensor **out, const kg_tensor *x, int dim, const kg_tensor *idx);
/* ids: [...] integer, 0-based; table: [V, C]  ->  out: [..., C] */
kg_status kg_embedding(kg_tensor **out, const kg_tensor *ids, const kg_tensor *table);
/* dst[.., idx[i,j], ..] += src[i,j,..] along dim (in place). */
kg_status kg_scatter_add_(kg_tensor *dst, int dim, const kg_tensor *idx, const kg_tensor *src);
/* dst.select(dim, idx[i]) += src.select(dim, i) (in place). */
kg_status kg_index_add_(kg_tensor *dst, int dim, const kg_tensor *idx, const kg_tensor *src);
kg_status kg_repeat_interleave(kg_tensor **out, const kg_tensor *x, int64_t n, int dim);

/* ---- linear algebra (engine/ops/matmul.c) ------------------------------------------------ */

/* a: [..., N, K] @ b: [..., K, M] -> [..., N, M]; leading dims broadcast; 1-D as in PyTorch. */
kg_status kg_matmul(kg_tensor **out, const kg_tensor *a, const kg_tensor *b);
/* x: [..., K] · w: [M, K]ᵀ + b: [M] (b may be NULL) -> [..., M] */
kg_status kg_linear(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b);
/* int8 weight-only (engine/ops/quant.c): y = x · (wq · scale[:, None])ᵀ + b, wq i8 [O, I], scale
 * f32 [O], b [O] or NULL; x gets a gradient, wq and scale do not */
kg_status kg_linear_q8(kg_tensor **out, const kg_tensor *x, const kg_tensor *wq, const kg_tensor *scale,
                       const kg_tensor *b);
/* w [O, I] float -> q i8 [O, I], scale f32 [O]: absmax per row / 127, round to nearest even */
kg_status kg_quantize_q8(kg_tensor **q, kg_tensor **scale, const kg_tensor *w);
/* linear_q8 also takes scale f16 [O, I / 32] (llama.cpp's Q8_0 groups; I a multiple of 32) */
/* whether the CPU's quantized GEMV (up to 32 rows of x) quantizes x to int8 per block of 32, as
 * llama.cpp does (on by default where the CPU has AVX-512 VNNI, and always off, reading false,
 * elsewhere; off: f32 x, the exact dequantized-weight arithmetic). docs/quantization.md states
 * its error. */
void kg_set_quant_act_int8(bool on);
bool kg_quant_act_int8(void);
/* int4 in blocks of 32 (llama.cpp's Q4_0 layout, engine/cpu/quant.h): w [O, I] (I a multiple of
 * 32) -> q u8 [O, I / 2] (two codes a byte), scale f16 [O, I / 32]; linear_q4 and the x gradient
 * as linear_q8; dequantize_q4 -> w [O, I] in dtype dt */
kg_status kg_quantize_q4(kg_tensor **q, kg_tensor **scale, const kg_tensor *w);
kg_status kg_dequantize_q4(kg_tensor **out, const kg_tensor *wq, const kg_tensor *scale, kg_dtype dt);
/* W [O, I] in dtype dt from linear_q8's wq and scale (either scale layout) */
kg_status kg_dequantize_q8(kg_tensor **out, const kg_tensor *wq, const kg_tensor *scale, kg_dtype dt);
kg_status kg_linear_q4(kg_tensor **out, const kg_tensor *x, const kg_tensor *wq, const kg_tensor *scale,
                       const kg_tensor *b);

/* ---- normalisation (engine/ops/norm.c) --------------------------------------------------- */

typedef struct { double eps; bool unit_offset; int groups; } kg_norm_params;

/* Over the last dim. x: [..., C], w, b: [C] or NULL. */
kg_status kg_layer_norm(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b, double eps);
/* y = x * rsqrt(mean(x²) + eps) * (unit_offset ? 1 + w : w); reduces in f32. */
kg_status kg_rms_norm(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, double eps, bool unit_offset);
/* x: [B, C, *], w, b: [C] or NULL. */
kg_status kg_group_norm(kg_tensor **out, const kg_tensor *x, int groups, const kg_tensor *w, const kg_tensor *b,
                        double eps);

/* ---- convolution and resampling, NCHW (engine/ops/conv.c) --------------------------------- */

typedef struct {
  int stride[2], padding[2], dilation[2], output_padding[2];
  int groups;
} kg_conv2d_params;
/* mode: KG_INTERP_NEAREST / BILINEAR / BICUBIC (the formulas: engine/ops/interp.h); scale_h/scale_w:
 * the user's scale factors (0 when a size was given), which PyTorch's source-index math uses */
enum { KG_INTERP_NEAREST = 0, KG_INTERP_BILINEAR = 1, KG_INTERP_BICUBIC = 2 };
typedef struct {
  int64_t out_h, out_w;
  int mode;
  bool align_corners, antialias;
  double scale_h, scale_w;
} kg_interpolate_params;
/* CONV2D_BACKWARD / CONV_TRANSPOSE2D_BACKWARD: in {dy, x, w}; out: the wanted ones of dx, dw, db in order */
typedef struct { kg_conv2d_params p; bool need[3]; } kg_conv_backward_params;

/* x: [B, Cin, H, W], w: [Cout, Cin/groups, kh, kw], b: [Cout] or NULL */
kg_status kg_conv2d(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                    const kg_conv2d_params *p);
/* x: [B, Cin, H, W], w: [Cin, Cout/groups, kh, kw], b: [Cout] or NULL */
kg_status kg_conv_transpose2d(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                              const kg_conv2d_params *p);
/* nearest-neighbour resize of x: [B, C, H, W] to [B, C, out_h, out_w] */
kg_status kg_interpolate_nearest(kg_tensor **out, const kg_tensor *x, int64_t out_h, int64_t out_w);
/* resize of x: [B, C, H, W] to [B, C, p->out_h, p->out_w] as torch.nn.functional.interpolate */
kg_status kg_interpolate(kg_tensor **out, const kg_tensor *x, const kg_interpolate_params *p);

/* ---- randomness in models (engine/ops/random.c) ------------------------------------------- */

typedef struct { kg_philox_state rng; double p; } kg_dropout_params;
typedef struct { kg_philox_state rng; int64_t n; bool replacement; } kg_multinomial_params;

/* Inverted dropout: zeroes with probability p, scales the rest by 1/(1-p); identity when
 * !training or p == 0. */
kg_status kg_dropout(kg_tensor **out, const kg_tensor *x, double p, bool training);
/* probs: [V] or [B, V] (non-negative, need not sum to 1) -> i64 [n] or [B, n], 0-based. */
kg_status kg_multinomial(kg_tensor **out, const kg_tensor *probs, int64_t n, bool replacement);

/* ---- transformer blocks (engine/ops/attention.c) ------------------------------------------ */

typedef struct {
  double base;  /* inverse frequencies base^(-2i/D) when no inv_freq tensor is given */
  double scale; /* cos and sin are multiplied by it (YaRN's / LongRoPE's attention factor); 1 = plain */
} kg_rope_params;
typedef struct {
  double scale;   /* 0 = 1/sqrt(D) */
  bool causal;    /* query i sees keys j <= i + (S - T) (aligned bottom-right, as a KV cache) */
  int64_t window; /* > 0: also j > i + (S - T) - window (sliding window) */
  bool out_bthd;  /* the output as [B, T, H, D] (contiguous: the heads of a token side by side, as the
                     out projection reads them), not [B, H, T, D]; the CPU's fused kernel writes it so */
} kg_sdpa_params;

/* x: [..., T, D] rotated pairwise over halves (x[:D/2], x[D/2:]) as Hugging Face's
 * rotate_half; positions: [T] or [B, T] integer (0-based) broadcast over x's leading dims. */
kg_status kg_rope(kg_tensor **out, const kg_tensor *x, const kg_tensor *positions, double base);
/* kg_rope with the frequencies given: inv_freq NULL (base^(-2i/D)) or a float tensor [D/2] on x's
 * device (scaled RoPE: linear, dynamic NTK, Llama 3, YaRN, LongRoPE compute it); the rotated pairs
 * are multiplied by p->scale. */
kg_status kg_rope_freq(kg_tensor **out, const kg_tensor *x, const kg_tensor *positions, const kg_tensor *inv_freq,
                       const kg_rope_params *p);
/* q: [B, H, T, D], k, v: [B, Hkv, S, D] with H % Hkv == 0; mask: NULL, bool (true = attend)
 * or float (added to scores), broadcastable to [B, H, T, S]. out: [B, H, T, D]. The fused
 * routes never materialise [B, H, T, S]; the math route does (engine/ops/sdpa_route.h says
 * which calls take it: D > 256 on cuda, big tensor-core calls, a non-finite scale). */
kg_status kg_sdpa(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                  const kg_sdpa_params *p);
/* kg_sdpa with SAM's decomposed relative-position bias added to the scaled scores (no mask then):
 * rel_h [B, H, T, kh], rel_w [B, H, T, kw], kh·kw = S; key j = ky·kw + kx of a kh x kw grid gets
 * rel_h[b, h, i, ky] + rel_w[b, h, i, kx]. The CPU's fused kernel reads them in place and gives
 * their gradients; other routes build the [B, H, T, S] bias from them. NULL, NULL: kg_sdpa. */
kg_status kg_sdpa_rel(kg_tensor **out, const kg_tensor *q, const kg_tensor *k, const kg_tensor *v, const kg_tensor *mask,
                      const kg_tensor *rel_h, const kg_tensor *rel_w, const kg_sdpa_params *p);

/* ---- losses (engine/ops/loss.c) ------------------------------------------------------------ */

typedef enum { KG_REDUCE_MEAN, KG_REDUCE_SUM, KG_REDUCE_NONE } kg_reduction;
/* label_smoothing ε in [0, 1]: the target distribution is (1 - ε)·onehot + ε/C (PyTorch's) */
typedef struct {
  kg_reduction reduction;
  int64_t ignore_index;
  bool has_ignore;
  double label_smoothing;
} kg_loss_params;

/* logits: [N, C] or [..., C]; targets: integer [N] or [...], 0-based class ids; weight: float
 * [C] class weights or NULL (a constant: no gradient). Fused log-softmax + NLL, reduced in f32;
 * rows whose target is ignore_index count for nothing. As PyTorch: row i's loss is
 * (1-ε)·w[t]·(lse - x[t]) + ε/C·Σc w[c]·(lse - x[c]); mean divides the sum by Σ w[t] over the
 * rows kept. Output f32: scalar, or [N] with KG_REDUCE_NONE. */
kg_status kg_cross_entropy(kg_tensor **out, const kg_tensor *logits, const kg_tensor *targets,
                           const kg_tensor *weight, const kg_loss_params *p);
kg_status kg_mse_loss(kg_tensor **out, const kg_tensor *a, const kg_tensor *b, kg_reduction reduction);

/* ---- optimizers (engine/ops/optim.c) ------------------------------------------------------ */

/* SGD as PyTorch: wd L2 (g += wd·p) or decoupled (p -= lr·wd·p); buf = g on step 1, else
 * momentum·buf + (1 - dampening)·g; nesterov: g + momentum·buf, else buf; p -= lr·that. */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  int64_t step; /* 1-based; step 1 initialises the momentum buffer with g */
  bool nesterov, decoupled;
  /* Optional (NULL = use lr / step above): one-element f64 tensors on the param's device read
   * when the update runs — on cuda by the kernel itself, so a CUDA Graph replay of the update
   * uses the values written there before the launch (keng.optim does this). */
  const kg_tensor *lr_t, *step_t;
} kg_sgd_params;
/* Adam as Keras 3 (see engine/ops/optim.c for the formula); decoupled = AdamW. */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step; /* 1-based step t of the bias correction */
  bool decoupled;
  const kg_tensor *lr_t, *step_t; /* as kg_sgd_params */
} kg_adam_params;

/* In place on param, momentum_buf (NULL when momentum == 0); grad, buf: param's shape, any
 * floating dtype. Refused under grad mode when param requires grad (run it under no_grad). */
kg_status kg_sgd_step_(kg_tensor *param, const kg_tensor *grad, kg_tensor *momentum_buf, const kg_sgd_params *p);
/* In place on param, m, v (param's shape; state usually in param's dtype). */
kg_status kg_adam_step_(kg_tensor *param, const kg_tensor *grad, kg_tensor *m, kg_tensor *v,
                        const kg_adam_params *p);

/* ---- the decode step (engine/ops/decode.c) ------------------------------------------------ */

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
