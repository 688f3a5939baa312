/* conv.c — front-ends of the convolution and resampling family (NCHW): conv2d,
 * conv_transpose2d, interpolation (nearest, bilinear, bicubic, antialias), and their backward passes.
 *
 * Shape letters: B batch, C channels (Cin, Cout), H/W height and width, kh/kw kernel size.
 * Output sizes follow PyTorch:
 *   conv2d            Ho = (H + 2 pad - dil (kh - 1) - 1) / stride + 1
 *   conv_transpose2d  Ho = (H - 1) stride - 2 pad + dil (kh - 1) + output_padding + 1
 * Kernels: engine/cpu/conv.c (im2col + GEMM; conv_transpose2d is conv2d's adjoint). */
#include "../core/internal.h"
#include "interp.h"

#include <string.h>

/* validates x, w, b and p for conv2d (transposed = false) or conv_transpose2d; shape: [4] out */
static kg_status conv_check(const char *op, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                            const kg_conv2d_params *p, bool transposed, int64_t *shape) {
  char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
  const kg_tensor *ts[3] = {x, w, b};
  KG_TRY(kg_check_same_device(op, 3, ts));
  KG_TRY(kg_check_float(op, x, "input"));
  KG_TRY(kg_check_float(op, w, "weight"));
  if (b) KG_TRY(kg_check_float(op, b, "bias"));
  if (x->ndim != 4) return kg_error(KG_ERR_SHAPE, op, "input x %s must be 4-D [B, Cin, H, W]", KG_SHAPE(x, s1));
  if (w->ndim != 4)
    return kg_error(KG_ERR_SHAPE, op, "weight %s must be 4-D %s", KG_SHAPE(w, s1),
                    transposed ? "[Cin, Cout/groups, kh, kw]" : "[Cout, Cin/groups, kh, kw]");
  int G = p->groups;
  if (G < 1) return kg_error(KG_ERR_VALUE, op, "groups must be at least 1 (got %d)", G);
  for (int i = 0; i < 2; i++) {
    if (p->stride[i] < 1 || p->dilation[i] < 1 || p->padding[i] < 0)
      return kg_error(KG_ERR_VALUE, op, "stride (%d, %d) and dilation (%d, %d) must be >= 1, padding (%d, %d) >= 0",
                      p->stride[0], p->stride[1], p->dilation[0], p->dilation[1], p->padding[0], p->padding[1]);
    if (transposed && (p->output_padding[i] < 0 ||
                       (p->output_padding[i] >= p->stride[i] && p->output_padding[i] >= p->dilation[i])))
      return kg_error(KG_ERR_VALUE, op, "output_padding (%d, %d) must be >= 0 and smaller than stride or dilation",
                      p->output_padding[0], p->output_padding[1]);
  }
  int64_t Cin = x->shape[1];
  if (Cin % G)
    return kg_error(KG_ERR_SHAPE, op, "x %s: %lld input channels are not divisible by groups=%d", KG_SHAPE(x, s1),
                    (long long)Cin, G);
  int64_t Cout;
  if (!transposed) {
    Cout = w->shape[0];
    if (Cout % G)
      return kg_error(KG_ERR_SHAPE, op, "weight %s: %lld output channels are not divisible by groups=%d",
                      KG_SHAPE(w, s1), (long long)Cout, G);
    if (w->shape[1] * G != Cin)
      return kg_error(KG_ERR_SHAPE, op,
                      "x %s, weight %s: channel mismatch: the weight takes %lld input channels (%lld per group x %d "
                      "groups), x has %lld",
                      KG_SHAPE(x, s1), KG_SHAPE(w, s2), (long long)(w->shape[1] * G), (long long)w->shape[1], G,
                      (long long)Cin);
  } else {
    if (w->shape[0] != Cin)
      return kg_error(KG_ERR_SHAPE, op, "x %s, weight %s: channel mismatch: the weight takes %lld input channels, x has %lld",
                      KG_SHAPE(x, s1), KG_SHAPE(w, s2), (long long)w->shape[0], (long long)Cin);
    Cout = w->shape[1] * G;
  }
  if (b && (b->ndim != 1 || b->shape[0] != Cout))
    return kg_error(KG_ERR_SHAPE, op, "bias %s must be [%lld] (the output channels)", KG_SHAPE(b, s1), (long long)Cout);
  shape[0] = x->shape[0];
  shape[1] = Cout;
  int64_t ext[2], big[2] = {0, 0}; /* the dilated kernel; transposed: (in - 1) stride + ext */
  for (int i = 0; i < 2; i++) {
    /* 64-bit size arithmetic that cannot wrap: sizes <= 2^59, stride/padding/dilation < 2^31 */
    int64_t in = x->shape[2 + i], k = w->shape[2 + i];
    if (!kg_size_mul(p->dilation[i], k ? k - 1 : 0, &ext[i]) || !kg_size_add(ext[i], 1, &ext[i]) ||
        (transposed && (!kg_size_mul(in ? in - 1 : 0, p->stride[i], &big[i]) || !kg_size_add(big[i], ext[i], &big[i]))))
      return kg_error(KG_ERR_VALUE, op, "x %s, weight %s: the output size in dim %d would pass 2^59", KG_SHAPE(x, s1),
                      KG_SHAPE(w, s2), 3 + i);
  }
  for (int i = 0; i < 2; i++) {
    int64_t in = x->shape[2 + i];
    if (!transposed) {
      if (in + 2 * (int64_t)p->padding[i] < ext[i]) {
        return kg_error(KG_ERR_SHAPE, op,
                        "x %s, weight %s: the dilated kernel (%lldx%lld) is larger than the padded input (%lldx%lld)",
                        KG_SHAPE(x, s1), KG_SHAPE(w, s2), (long long)ext[0], (long long)ext[1], (long long)(x->shape[2] + 2 * (int64_t)p->padding[0]),
                        (long long)(x->shape[3] + 2 * (int64_t)p->padding[1]));
      }
      shape[2 + i] = (in + 2 * (int64_t)p->padding[i] - ext[i]) / p->stride[i] + 1;
    } else {
      shape[2 + i] = big[i] - 2 * (int64_t)p->padding[i] + p->output_padding[i];
      if (shape[2 + i] < 1 || in < 1)
        return kg_error(KG_ERR_SHAPE, op, "x %s, weight %s: the output would be empty (size %lld in dim %d)",
                        KG_SHAPE(x, s1), KG_SHAPE(w, s2), (long long)shape[2 + i], 3 + i);
    }
  }
  return KG_OK;
}

static kg_status conv_run(kg_op op, kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                          const kg_conv2d_params *p) {
  int64_t shape[4];
  bool transposed = op == KG_OP_CONV_TRANSPOSE2D;
  KG_TRY(conv_check(kg_op_info[op].name, x, w, b, p, transposed, shape));
  KG_TRY(kg_new_like(out, x, 4, shape, kg_dtype_promote(x->dtype, w->dtype)));
  const kg_tensor *in[3] = {x, w, b};
  kg_status s = kg_op_run(op, 1, out, 3, in, p, sizeof *p);
  if (s) kg_tensor_release(*out);
  return s;
}

kg_status kg_conv2d(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                    const kg_conv2d_params *p) {
  return conv_run(KG_OP_CONV2D, out, x, w, b, p);
}

kg_status kg_conv_transpose2d(kg_tensor **out, const kg_tensor *x, const kg_tensor *w, const kg_tensor *b,
                              const kg_conv2d_params *p) {
  return conv_run(KG_OP_CONV_TRANSPOSE2D, out, x, w, b, p);
}

/* dx, dw, db in one kernel call: in {dy, x, w}, out the wanted ones in that order */
static kg_status conv_grad(kg_op bop, kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  kg_conv_backward_params bp = {*(const kg_conv2d_params *)n->params, {false, false, false}};
  kg_tensor *outs[3];
  int k = 0;
  kg_status s = KG_OK;
  for (int i = 0; i < 3 && s == KG_OK; i++) {
    if (i == 2 && n->nin < 3) break;
    if (!kg_node_needs_grad(n, i)) continue;
    bp.need[i] = true;
    const kg_tensor_meta *m = &n->in_meta[i];
    s = kg_new_like(&din[i], dout[0], m->ndim, m->shape, m->dtype);
    if (s == KG_OK) outs[k++] = din[i];
  }
  const kg_tensor *in[3] = {dout[0], n->saved_in[0], n->saved_in[1]};
  if (s == KG_OK && k) s = kg_op_dispatch(bop, k, outs, 3, in, &bp);
  return s; /* the engine releases din[] */
}

kg_status kg_grad_conv2d(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return conv_grad(KG_OP_CONV2D_BACKWARD, n, dout, din);
}

kg_status kg_grad_conv_transpose2d(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  return conv_grad(KG_OP_CONV_TRANSPOSE2D_BACKWARD, n, dout, din);
}

/* ---- interpolation (nearest, bilinear, bicubic) ----------------------------------------- */

kg_status kg_interpolate(kg_tensor **out, const kg_tensor *x, const kg_interpolate_params *p) {
  char s1[KG_SHAPE_STR_MAX];
  static const char *const modes[] = {"nearest", "bilinear", "bicubic"};
  if (x->ndim != 4) return kg_error(KG_ERR_SHAPE, "interpolate", "input x %s must be 4-D [B, C, H, W]", KG_SHAPE(x, s1));
  if (p->mode < KG_INTERP_NEAREST || p->mode > KG_INTERP_BICUBIC)
    return kg_error(KG_ERR_VALUE, "interpolate", "unknown mode %d", p->mode);
  if (p->mode == KG_INTERP_NEAREST && (p->align_corners || p->antialias))
    return kg_error(KG_ERR_VALUE, "interpolate", "%s applies to the bilinear and bicubic modes, not nearest",
                    p->align_corners ? "align_corners" : "antialias");
  if (p->mode != KG_INTERP_NEAREST && !kg_dtype_info[x->dtype].is_float)
    return kg_error(KG_ERR_TYPE, "interpolate", "mode '%s' needs a floating-point x, got %s", modes[p->mode],
                    kg_dtype_info[x->dtype].name);
  if (p->out_h < 1 || p->out_w < 1)
    return kg_error(KG_ERR_VALUE, "interpolate", "x %s: output size %lldx%lld must be positive", KG_SHAPE(x, s1),
                    (long long)p->out_h, (long long)p->out_w);
  if (x->shape[2] < 1 || x->shape[3] < 1)
    return kg_error(KG_ERR_SHAPE, "interpolate", "x %s: cannot resize an empty image", KG_SHAPE(x, s1));
  int64_t shape[4] = {x->shape[0], x->shape[1], p->out_h, p->out_w};
  KG_TRY(kg_new_like(out, x, 4, shape, x->dtype));
  kg_status s = kg_op_run(KG_OP_INTERPOLATE, 1, out, 1, &x, p, sizeof *p);
  if (s) kg_tensor_release(*out);
  return s;
}

kg_status kg_interpolate_nearest(kg_tensor **out, const kg_tensor *x, int64_t out_h, int64_t out_w) {
  kg_interpolate_params p;
  memset(&p, 0, sizeof p); /* padding too: params are copied bytewise into the graph */
  p.out_h = out_h, p.out_w = out_w, p.mode = KG_INTERP_NEAREST;
  return kg_interpolate(out, x, &p);
}

kg_status kg_grad_interpolate(kg_node *n, kg_tensor *const *dout, kg_tensor **din) {
  const kg_tensor_meta *m = &n->in_meta[0];
  KG_TRY(kg_new_like(&din[0], dout[0], m->ndim, m->shape, m->dtype));
  const kg_tensor *in[1] = {dout[0]};
  return kg_op_dispatch(KG_OP_INTERPOLATE_BACKWARD, 1, &din[0], 1, in, n->params);
}
