/* reduce.c (cpu) — sum over any set of dims, accumulating in double.
 *
 * The input is viewed as [kept dims..., reduced dims...]; each output element (parallel over
 * them) walks its reduced elements in runs along the innermost reduced dim. */
#include "cpu.h"

#include <string.h>

/* Splits x's dims by mask into kept (outer) and reduced (inner) shapes/strides. */
void kg_cpu_reduce_layout(const kg_tensor *x, uint32_t mask, kg_cpu_reduce_plan *p) {
  p->nk = p->nr = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask & (1u << d)) {
      p->rshape[p->nr] = x->shape[d];
      p->rstride[p->nr++] = x->stride[d];
    } else {
      p->kshape[p->nk] = x->shape[d];
      p->kstride[p->nk++] = x->stride[d];
    }
  }
  p->nout = 1;
  for (int i = 0; i < p->nk; i++) p->nout *= p->kshape[i];
  p->nred = 1;
  for (int i = 0; i < p->nr; i++) p->nred *= p->rshape[i];
}

int64_t kg_cpu_reduce_row_offset(const kg_cpu_reduce_plan *p, int64_t o) {
  int64_t off = 0;
  for (int i = p->nk - 1; i >= 0; i--) {
    off += (o % p->kshape[i]) * p->kstride[i];
    o /= p->kshape[i];
  }
  return off;
}

void kg_cpu_reduce_walk(const kg_cpu_reduce_plan *p, const char *base, kg_dtype dt, int64_t row_off,
                        void (*fn)(void *ctx, const double *v, int64_t start, int64_t n), void *ctx) {
  int es = kg_dtype_info[dt].size;
  double buf[KG_CHUNK];
  if (p->nr == 0) {
    kg_cpu_load_f64(buf, base + row_off * es, dt, 1, 1);
    fn(ctx, buf, 0, 1);
    return;
  }
  int last = p->nr - 1;
  int64_t inner = p->rshape[last], istride = p->rstride[last], outer = p->nred / (inner ? inner : 1);
  for (int64_t r = 0; r < outer; r++) {
    int64_t off = row_off, rem = r;
    for (int i = last - 1; i >= 0; i--) {
      off += (rem % p->rshape[i]) * p->rstride[i];
      rem /= p->rshape[i];
    }
    for (int64_t j = 0; j < inner; j += KG_CHUNK) {
      int64_t m = inner - j < KG_CHUNK ? inner - j : KG_CHUNK;
      kg_cpu_load_f64(buf, base + (off + j * istride) * es, dt, istride, m);
      fn(ctx, buf, r * inner + j, m);
    }
  }
}

static void add_run(void *ctx, const double *v, int64_t start, int64_t n) {
  (void)start;
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += v[i];
  *(double *)ctx += s;
}

kg_status kg_cpu_sum(const kg_op_call *c) {
  const kg_tensor *x = c->in[0];
  kg_tensor *o = c->out[0];
  const kg_reduce_params *rp = c->params;
  kg_cpu_reduce_plan p;
  kg_cpu_reduce_layout(x, rp->mask, &p);
  const char *base = kg_data(x);
  char *obase = kg_data(o);
  /* the output is contiguous; its row-major order is the kept dims' order */
#pragma omp parallel for if (p.nout * p.nred > KG_PAR_THRESHOLD && p.nout > 1) schedule(static)
  for (int64_t i = 0; i < p.nout; i++) {
    double s = 0;
    kg_cpu_reduce_walk(&p, base, x->dtype, kg_cpu_reduce_row_offset(&p, i), add_run, &s);
    kg_store_from_double(obase, o->dtype, i, s);
  }
  return KG_OK;
}
