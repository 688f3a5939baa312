/* reduce.c — bindings of reductions: sum, mean, var (dim = a number, a list, or nil for all). */
#include "keng_lua.h"

static int l_sum(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  uint32_t mask = kgl_dims_mask(L, 2, x->ndim);
  KGL_CALL(L, kg_sum(&r, x, mask, lua_toboolean(L, 3)));
  kgl_push(L, r);
  return 1;
}

static int l_mean(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  uint32_t mask = kgl_dims_mask(L, 2, x->ndim);
  KGL_CALL(L, kg_mean(&r, x, mask, lua_toboolean(L, 3)));
  kgl_push(L, r);
  return 1;
}

/* t:var(dim, keepdim, {correction=1}) — unbiased by default, as PyTorch */
static int l_var(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  uint32_t mask = kgl_dims_mask(L, 2, x->ndim);
  int corr = (int)kgl_field_number(L, 4, "correction", kgl_field_bool(L, 4, "unbiased", true) ? 1 : 0);
  KGL_CALL(L, kg_var(&r, x, mask, lua_toboolean(L, 3), corr));
  kgl_push(L, r);
  return 1;
}

void kgl_register_reduce(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "sum", l_sum);
  kgl_set(L, methods, keng, "mean", l_mean);
  kgl_set(L, methods, keng, "var", l_var);
}
