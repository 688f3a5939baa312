/* test_op_table.c — the op-coverage test: reads engine/ops/ops.def the same way the engine does
 * and checks that the linked library provides what every op promises.
 *   - kinds KERNEL, UNARY, BINARY and INTERNAL have a CPU kernel (kg_cpu_<name>); in a CUDA
 *     build (KENG_HAVE_CUDA) they also have a CUDA kernel (kg_cuda_<name>);
 *   - every op marked GRAD whose kind is not COMPOSITE has a backward (kg_grad_<name>);
 *   - names are unique, lower-case identifiers, and kg_op_info follows ops.def's order, kinds
 *     and GRAD marks (elementwise.def's rows come in through ops.def);
 *   - the flags of elementwise.def's rows are consistent (COMPARE rows are NOGRAD, INPLACE is
 *     binary only).
 * Each missing item is printed; the test fails if any is missing.
 */
#include <keng/keng.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  int id;
  const char *name;
  kg_op_kind kind;
  bool grad;
} def_row;

#define KERNEL KG_KIND_KERNEL
#define UNARY KG_KIND_UNARY
#define BINARY KG_KIND_BINARY
#define VIEW KG_KIND_VIEW
#define COMPOSITE KG_KIND_COMPOSITE
#define INTERNAL KG_KIND_INTERNAL
#define GRAD true
#define NOGRAD false
static const def_row rows[] = {
#define KG_OP(id, name, kind, saves, grad) {KG_OP_##id, #name, kind, grad},
#include "ops/ops.def"
#undef KG_OP
};
#undef KERNEL
#undef UNARY
#undef BINARY
#undef VIEW
#undef COMPOSITE
#undef INTERNAL
#undef GRAD
#undef NOGRAD

static int missing;

static void report(const char *fmt, const char *name, const char *extra) {
  printf("  MISSING ");
  printf(fmt, name, extra);
  putchar('\n');
  missing++;
}

int main(void) {
  int nrows = (int)(sizeof rows / sizeof *rows);
  if (nrows != KG_OP_COUNT) report("ops.def has %s rows but KG_OP_COUNT is %s", "?", "?");

  for (int i = 0; i < nrows && i < KG_OP_COUNT; i++) {
    const kg_op_facts *f = &kg_op_info[i];
    const def_row *r = &rows[i];
    /* the table follows ops.def */
    if (r->id != i) report("%s: enum value out of ops.def order%s", r->name, "");
    if (!f->name || strcmp(f->name, r->name)) report("%s: kg_op_info has the name '%s' here", r->name, f->name ? f->name : "(null)");
    if (f->kind != r->kind) report("%s: kind is %s in kg_op_info", r->name, kg_kind_name(f->kind));
    if (f->differentiable != r->grad) report("%s: differentiable flag differs from ops.def's %s", r->name, r->grad ? "GRAD" : "NOGRAD");
    /* a name is a lower-case C identifier and unique */
    bool ident = r->name[0] && !isdigit((unsigned char)r->name[0]);
    for (const char *c = r->name; *c; c++) ident &= islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_';
    if (!ident) report("%s: not a lower-case identifier%s", r->name, "");
    for (int j = 0; j < i; j++)
      if (!strcmp(rows[j].name, r->name)) report("%s: name used twice (also op %s)", r->name, rows[j].name);

    /* kernels and backward */
    bool needs_kernel = f->kind == KG_KIND_KERNEL || f->kind == KG_KIND_UNARY || f->kind == KG_KIND_BINARY ||
                        f->kind == KG_KIND_INTERNAL;
    if (needs_kernel && !f->kernel[KG_DEV_CPU]) report("%s: CPU kernel kg_cpu_%s", f->name, f->name);
#ifdef KENG_HAVE_CUDA
    if (needs_kernel && !f->kernel[KG_DEV_CUDA]) report("%s: CUDA kernel kg_cuda_%s", f->name, f->name);
#endif
    if (f->differentiable && f->kind != KG_KIND_COMPOSITE && !f->backward)
      report("%s: backward kg_grad_%s", f->name, f->name);
    /* a VIEW or COMPOSITE op runs no kernel of its own; a stray one means a wrong kind */
    if (!needs_kernel && f->kernel[KG_DEV_CPU])
      report("%s: has kg_cpu_%s but its kind (view/composite) never dispatches it", f->name, f->name);
    if (f->kernel[KG_DEV_META]) report("%s: a meta kernel is set (meta tensors run no kernels)%s", f->name, "");
    /* the flags of elementwise.def's rows */
    if (f->flags && f->kind != KG_KIND_UNARY && f->kind != KG_KIND_BINARY)
      report("%s: elementwise flags on a non-elementwise op%s", f->name, "");
    if ((f->flags & KG_OPF_COMPARE) && f->differentiable) report("%s: a COMPARE row is GRAD%s", f->name, "");
    if ((f->flags & KG_OPF_INPLACE) && f->kind != KG_KIND_BINARY) report("%s: INPLACE on a unary op%s", f->name, "");
  }

  printf("test_op_table: %d ops, %d missing\n", KG_OP_COUNT, missing);
  return missing ? 1 : 0;
}
