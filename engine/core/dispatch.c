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

#define INT KG_OPF_INT
#define COMPARE KG_OPF_COMPARE
#define INPLACE KG_OPF_INPLACE

/* every argument is pasted or stringized here, never passed on (an op name is not expanded) */
const kg_op_facts kg_op_info[KG_OP_COUNT] = {
#define KG_OP(id, name, kind, saves, grad) \
  [KG_OP_##id] = {#name, KIND_##kind, saves, GRAD_##grad, 0, {kg_cpu_##name, kg_cuda_##name, NULL}, kg_grad_##name},
#define KG_UNARY(id, name, saves, grad, flags, f, df) \
  [KG_OP_##id] = {#name, KIND_UNARY, saves, GRAD_##grad, flags, {kg_cpu_##name, kg_cuda_##name, NULL}, kg_grad_##name},
#define KG_BINARY(id, name, saves, grad, flags, f) \
  [KG_OP_##id] = {#name, KIND_BINARY, saves, GRAD_##grad, flags, {kg_cpu_##name, kg_cuda_##name, NULL}, kg_grad_##name},
#include "../ops/ops.def"
#undef KG_OP
#undef KG_UNARY
#undef KG_BINARY
};
#undef INT
#undef COMPARE
#undef INPLACE

const char *kg_kind_name(kg_op_kind k) {
  static const char *names[] = {"kernel", "unary", "binary", "view", "composite", "internal"};
  return names[k];
}

/* ---- runtime settings ------------------------------------------------------------------- */

int kg_debug_level(void) { return (int)kg_env_int(KG_ENV_KENG_DEBUG); }

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
static uint64_t flops_saved; /* direct-formula FLOPs an algorithm did not perform */
void kg_flop_add_algo(uint64_t direct, uint64_t performed) {
  __atomic_add_fetch(&flops, direct, __ATOMIC_RELAXED);
  if (direct > performed) __atomic_add_fetch(&flops_saved, direct - performed, __ATOMIC_RELAXED);
}
uint64_t kg_flop_count_performed(void) { return kg_flop_count() - __atomic_load_n(&flops_saved, __ATOMIC_RELAXED); }

/* ---- running ops --------------------------------------------------------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* "op dtype[shape]... -> dtype[shape]..." into line (size >= 1024 for the log; shorter is cut) */
static void op_line(char *line, size_t size, kg_op op, int nout, kg_tensor *const *out, int nin,
                    const kg_tensor *const *in, int pad) {
  char b[KG_SHAPE_STR_MAX];
  int n = snprintf(line, size, "%-*s", pad, kg_op_info[op].name);
  for (int i = 0; i < nin && n < (int)size - 1; i++)
    if (in[i]) n += snprintf(line + n, size - n, " %s%s", kg_dtype_info[in[i]->dtype].name, KG_SHAPE(in[i], b));
  if (n < (int)size - 1) n += snprintf(line + n, size - n, " ->");
  for (int i = 0; i < nout && n < (int)size - 1; i++)
    if (out[i]) n += snprintf(line + n, size - n, " %s%s", kg_dtype_info[out[i]->dtype].name, KG_SHAPE(out[i], b));
}

static void log_op(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in, double ms) {
  char line[1024], dev[16];
  op_line(line, 900, op, nout, out, nin, in, 16);
  kg_log("%s %s %.3f ms", line, kg_device_name(nout && out[0] ? out[0]->device : in[0]->device, dev), ms);
}

/* ---- op profile (kg_profile_start / kg_profile_stop) -------------------------------------------
 * Entries in first-seen order, found by an open-addressing hash of the line. Ops run from the
 * host thread only (kernels thread inside), so no lock. */
#define PROFILE_SLOTS (2 * KG_PROFILE_MAX)
static struct {
  bool on;
  int n;
  kg_profile_entry *e;
  int *slot; /* index + 1 into e, 0 empty */
} prof;

void kg_profile_start(void) {
  if (!prof.e) {
    prof.e = calloc(KG_PROFILE_MAX, sizeof *prof.e);
    prof.slot = calloc(PROFILE_SLOTS, sizeof *prof.slot);
    if (!prof.e || !prof.slot) {
      free(prof.e), free(prof.slot);
      prof.e = NULL, prof.slot = NULL;
      return; /* no profile rather than no ops */
    }
  }
  kg_profile_clear();
  prof.on = true;
}
void kg_profile_clear(void) {
  if (prof.slot) memset(prof.slot, 0, PROFILE_SLOTS * sizeof *prof.slot);
  prof.n = 0;
}
void kg_profile_stop(void) { prof.on = false; }
bool kg_profiling(void) { return prof.on; }
const kg_profile_entry *kg_profile_entries(int *n) {
  *n = prof.e ? prof.n : 0;
  return prof.e;
}

static void profile_add(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in, double ms,
                        uint64_t flops) {
  char line[256];
  op_line(line, sizeof line, op, nout, out, nin, in, 0);
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *c = line; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  kg_profile_entry *e = NULL;
  for (uint64_t i = h % PROFILE_SLOTS;; i = (i + 1) % PROFILE_SLOTS) {
    int k = prof.slot[i];
    if (k && strcmp(prof.e[k - 1].line, line) == 0) {
      e = &prof.e[k - 1];
      break;
    }
    if (k) continue;
    if (prof.n < KG_PROFILE_MAX - 1) { /* a new line (the last entry is kept for "(other)") */
      e = &prof.e[prof.n++];
      *e = (kg_profile_entry){.op = kg_op_info[op].name};
      memcpy(e->line, line, sizeof line);
      prof.slot[i] = prof.n;
    } else {
      e = &prof.e[KG_PROFILE_MAX - 1];
      if (prof.n == KG_PROFILE_MAX - 1) {
        *e = (kg_profile_entry){.op = "(other)"};
        strcpy(e->line, "(other)");
        prof.n = KG_PROFILE_MAX;
      }
    }
    break;
  }
  e->calls++;
  e->ms += ms;
  e->flops += flops;
}

/* ---- numerics guard (KENG_CHECK_NUMERICS=1 or kg_set_check_numerics) ------------------------ */

static int check_numerics = -1; /* -1: as KENG_CHECK_NUMERICS says */
bool kg_check_numerics(void) { return check_numerics < 0 ? kg_env_bool(KG_ENV_KENG_CHECK_NUMERICS) : check_numerics; }
void kg_set_check_numerics(bool on) { check_numerics = on; }

/* element i's class: 0 finite, 1 inf, 2 nan (float dtypes only) */
static int nonfinite(kg_dtype dt, const char *p) {
  switch (dt) {
  case KG_F32: {
    uint32_t b;
    memcpy(&b, p, 4);
    return (b & 0x7F800000u) != 0x7F800000u ? 0 : (b & 0x007FFFFFu) ? 2 : 1;
  }
  case KG_F64: {
    uint64_t b;
    memcpy(&b, p, 8);
    return (b & 0x7FF0000000000000ull) != 0x7FF0000000000000ull ? 0 : (b & 0x000FFFFFFFFFFFFFull) ? 2 : 1;
  }
  case KG_BF16: {
    uint16_t b;
    memcpy(&b, p, 2);
    return (b & 0x7F80u) != 0x7F80u ? 0 : (b & 0x007Fu) ? 2 : 1;
  }
  case KG_F16: {
    uint16_t b;
    memcpy(&b, p, 2);
    return (b & 0x7C00u) != 0x7C00u ? 0 : (b & 0x03FFu) ? 2 : 1;
  }
  default: return 0;
  }
}

/* The device scan of a cuda tensor (engine/cuda/numerics.cu: a reduction on the device and a
 * copy of three numbers back); absent without CUDA. */
kg_status kg_cuda_scan_numerics(const kg_tensor *t, int64_t *nan, int64_t *inf, int64_t *first) __attribute__((weak));

/* Counts NaN and Inf values of a float tensor (any strides) on the cpu or, through the device
 * scan, on cuda; *first: the first bad flat index. Other devices and failed scans count nothing. */
static void scan_numerics(const kg_tensor *t, int64_t *nan, int64_t *inf, int64_t *first) {
  *nan = *inf = 0;
  *first = -1;
  if (t->device.type == KG_DEV_CUDA && kg_cuda_scan_numerics && kg_dtype_info[t->dtype].is_float) {
    if (kg_cuda_scan_numerics(t, nan, inf, first) != KG_OK) *nan = *inf = 0, *first = -1;
    return;
  }
  if (t->device.type != KG_DEV_CPU || !kg_dtype_info[t->dtype].is_float || !t->storage || !t->storage->data) return;
  int64_t n = kg_numel(t), idx[KG_MAX_DIMS] = {0};
  size_t es = kg_elem_size(t);
  const char *base = (const char *)t->storage->data;
  int64_t off = t->offset;
  for (int64_t i = 0; i < n; i++) {
    int c = nonfinite(t->dtype, base + off * (int64_t)es);
    if (c) {
      if (*first < 0) *first = i;
      if (c == 2) (*nan)++;
      else (*inf)++;
    }
    for (int d = t->ndim - 1; d >= 0; d--) { /* next index, row-major */
      off += t->stride[d];
      if (++idx[d] < t->shape[d]) break;
      off -= t->stride[d] * t->shape[d];
      idx[d] = 0;
    }
  }
}

/* After a kernel: a NaN in any float output, or an Inf that no input already held (fill is
 * exempt: -inf masks are asked for), raises naming the op and the shapes. */
static kg_status check_outputs(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in) {
  for (int j = 0; j < nout; j++) {
    if (!out[j]) continue;
    int64_t nan, inf, first;
    scan_numerics(out[j], &nan, &inf, &first);
    if (!nan && !inf) continue;
    if (!nan) {
      if (op == KG_OP_FILL) continue;
      bool had_inf = false;
      for (int i = 0; i < nin && !had_inf; i++) {
        int64_t n2, i2, f2;
        if (!in[i]) continue;
        scan_numerics(in[i], &n2, &i2, &f2);
        had_inf = n2 || i2;
      }
      if (had_inf) continue;
    }
    char msg[700], b[KG_SHAPE_STR_MAX];
    int n = snprintf(msg, sizeof msg, "(");
    for (int i = 0; i < nin && n < 600; i++)
      if (in[i]) n += snprintf(msg + n, sizeof msg - n, "%s%s%s", i ? ", " : "", kg_dtype_info[in[i]->dtype].name, KG_SHAPE(in[i], b));
    snprintf(msg + n, sizeof msg - n, ")");
    return kg_error(KG_ERR_VALUE, kg_op_info[op].name,
                    "check_numerics: output %d %s%s has %lld NaN and %lld Inf values (first at flat index %lld); "
                    "inputs %s",
                    j + 1, kg_dtype_info[out[j]->dtype].name, KG_SHAPE(out[j], b), (long long)nan, (long long)inf,
                    (long long)first, msg);
  }
  return KG_OK;
}

/* the guard covers cpu ops, and cuda ops outside a CUDA Graph capture (reading the counts back
 * synchronises, which a capture cannot do; a replay is not checked either) */
static bool numerics_checkable(kg_device dev) {
  if (dev.type == KG_DEV_CPU) return true;
  return dev.type == KG_DEV_CUDA && kg_cuda_scan_numerics && !kg_cuda_capturing(dev.index);
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
  if (dev.type == KG_DEV_CPU) kg_threads_poll(); /* the adaptive thread count follows the load */
  kg_op_call call = {op, nin, nout, in, out, params};
  int dbg = kg_debug_level();
  bool timed = dbg || prof.on;
  double t0 = timed ? now_ms() : 0;
  uint64_t f0 = prof.on ? kg_flop_count() : 0;
  kg_status s = k(&call);
  /* Ctrl-C: long kernels stop early at their next poll; either way the result is dropped */
  if (s == KG_OK && kg_interrupt_pending()) s = kg_error(KG_ERR_INTERRUPTED, kg_op_info[op].name, "interrupted");
  if (s == KG_OK && kg_check_numerics() && numerics_checkable(dev)) s = check_outputs(op, nout, out, nin, in);
  if (timed && s == KG_OK) {
    if (dev.type == KG_DEV_CUDA) kg_device_synchronize(dev);
    double ms = now_ms() - t0;
    if (dbg) log_op(op, nout, out, nin, in, ms);
    if (prof.on && prof.e) profile_add(op, nout, out, nin, in, ms, kg_flop_count() - f0);
  }
  return s;
}

kg_status kg_op_run(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                    const void *params, size_t params_size) {
  KG_TRY(kg_op_dispatch(op, nout, out, nin, in, params));
  return kg_op_record(op, nout, out, nin, in, params, params_size);
}
