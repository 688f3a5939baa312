/* copy.c (cpu) — strided copy with broadcasting and dtype conversion. */
#include "cpu.h"

#include <string.h>

typedef struct { kg_dtype dt, st; } copy_ctx;

static void copy_run(void *ctx, char *const *ptr, const int64_t *stride, int64_t n) {
  const copy_ctx *c = ctx;
  int es = kg_dtype_info[c->dt].size;
  if (c->dt == c->st) { /* same dtype: move bits, exact for every type */
    if (stride[0] == 1 && stride[1] == 1) {
      memcpy(ptr[0], ptr[1], (size_t)(n * es));
      return;
    }
    switch (es) {
#define MOVE(T) for (int64_t i = 0; i < n; i++) ((T *)ptr[0])[i * stride[0]] = ((const T *)ptr[1])[i * stride[1]]; return;
    case 1: MOVE(uint8_t)
    case 2: MOVE(uint16_t)
    case 4: MOVE(uint32_t)
    case 8: MOVE(uint64_t)
#undef MOVE
    }
  }
  int ss = kg_dtype_info[c->st].size;
  if (kg_cpu_wide(c->dt) || kg_cpu_wide(c->st)) {
    double buf[KG_CHUNK];
    for (int64_t i = 0; i < n; i += KG_CHUNK) {
      int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;
      kg_cpu_load_f64(buf, ptr[1] + i * stride[1] * ss, c->st, stride[1], m);
      kg_cpu_store_f64(ptr[0] + i * stride[0] * es, c->dt, stride[0], buf, m);
    }
  } else {
    float buf[KG_CHUNK];
    for (int64_t i = 0; i < n; i += KG_CHUNK) {
      int64_t m = n - i < KG_CHUNK ? n - i : KG_CHUNK;
      kg_cpu_load_f32(buf, ptr[1] + i * stride[1] * ss, c->st, stride[1], m);
      kg_cpu_store_f32(ptr[0] + i * stride[0] * es, c->dt, stride[0], buf, m);
    }
  }
}

kg_status kg_cpu_copy(const kg_op_call *c) {
  copy_ctx ctx = {c->out[0]->dtype, c->in[0]->dtype};
  const kg_tensor *ts[2] = {c->out[0], c->in[0]};
  kg_iter it;
  kg_iter_init(&it, 2, ts);
  kg_iter_run(&it, copy_run, &ctx);
  return KG_OK;
}
