/* dispatch.c — the op table built from ops.def, and running an op: dispatch to the device's
 * kernel, KENG_DEBUG logging, and recording the autograd node.
 *
 * Kernels and backward functions are weak references: an op whose kernel for a device is not
 * linked in has NULL there, which `keng --ops` shows and the coverage test fails on.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KG_OP(id, name, kind, saves, grad)                                  \
  kg_status kg_cpu_##name(const kg_op_call *) __attribute__((weak));         \
  kg_status kg_cuda_##name(const kg_op_call *) __attribute__((weak));        \
  kg_status kg_grad_##name(kg_node *, kg_tensor *const *, kg_tensor **) __attribute__((weak));
#include "../ops/ops.def"
#undef KG_OP

#define SAVE_NONE 0u
#define IN(i) KG_SAVES_IN(i)
#define OUT(j) KG_SAVES_OUT(j)
#define KIND_KERNEL KG_KIND_KERNEL
#define KIND_UNARY KG_KIND_UNARY
#define KIND_BINARY KG_KIND_BINARY
#define KIND_VIEW KG_KIND_VIEW
#define KIND_COMPOSITE KG_KIND_COMPOSITE
#define KIND_INTERNAL KG_KIND_INTERNAL
#define GRAD_GRAD true
#define GRAD_NOGRAD false

const kg_op_facts kg_op_info[KG_OP_COUNT] = {
#define KG_OP(id, name, kind, saves, grad) \
  [KG_OP_##id] = {#name, KIND_##kind, saves, GRAD_##grad, {kg_cpu_##name, kg_cuda_##name, NULL}, kg_grad_##name},
#include "../ops/ops.def"
#undef KG_OP
};

const char *kg_kind_name(kg_op_kind k) {
  static const char *names[] = {"kernel", "unary", "binary", "view", "composite", "internal"};
  return names[k];
}

/* ---- runtime settings ------------------------------------------------------------------- */

static int debug_level = -1;
int kg_debug_level(void) {
  if (debug_level < 0) {
    const char *e = getenv("KENG_DEBUG");
    debug_level = e ? atoi(e) : 0;
  }
  return debug_level;
}

void kg_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("[keng] ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static uint64_t flops;
uint64_t kg_flop_count(void) { return __atomic_load_n(&flops, __ATOMIC_RELAXED); }
void kg_flop_add(uint64_t n) { __atomic_add_fetch(&flops, n, __ATOMIC_RELAXED); }

/* ---- running ops --------------------------------------------------------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void log_op(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in, double ms) {
  char line[1024], b[KG_SHAPE_STR_MAX], dev[16];
  int n = snprintf(line, sizeof line, "%-16s", kg_op_info[op].name);
  for (int i = 0; i < nin && n < 900; i++)
    if (in[i]) n += snprintf(line + n, sizeof line - n, " %s%s", kg_dtype_info[in[i]->dtype].name, KG_SHAPE(in[i], b));
  n += snprintf(line + n, sizeof line - n, " ->");
  for (int i = 0; i < nout && n < 900; i++)
    if (out[i]) n += snprintf(line + n, sizeof line - n, " %s%s", kg_dtype_info[out[i]->dtype].name, KG_SHAPE(out[i], b));
  kg_log("%s %s %.3f ms", line, kg_device_name(nout && out[0] ? out[0]->device : in[0]->device, dev), ms);
}

kg_status kg_op_dispatch(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                         const void *params) {
  kg_device dev = nout && out[0] ? out[0]->device : in[0]->device;
  if (dev.type == KG_DEV_META) return KG_OK; /* shapes only */
  kg_kernel_fn k = kg_op_info[op].kernel[dev.type];
  if (!k) {
    char d[16];
    return kg_error(KG_ERR_DEVICE, kg_op_info[op].name, "no kernel for device %s", kg_device_name(dev, d));
  }
  bool empty = nout > 0;
  for (int i = 0; i < nout; i++) /* NULL outputs are allowed: a kernel may skip them */
    if (out[i] && kg_numel(out[i])) empty = false;
  if (empty) return KG_OK; /* nothing to compute */
  kg_op_call call = {op, nin, nout, in, out, params};
  int dbg = kg_debug_level();
  double t0 = dbg ? now_ms() : 0;
  kg_status s = k(&call);
  if (dbg && s == KG_OK) {
    if (dev.type == KG_DEV_CUDA) kg_device_synchronize(dev);
    log_op(op, nout, out, nin, in, now_ms() - t0);
  }
  return s;
}

kg_status kg_op_run(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                    const void *params, size_t params_size) {
  KG_TRY(kg_op_dispatch(op, nout, out, nin, in, params));
  return kg_op_record(op, nout, out, nin, in, params, params_size);
}
