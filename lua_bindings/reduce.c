/* reduce.c — bindings of reductions: sum, mean, var (dim = a number, a list, or nil for all);
 * max, min, argmax, argmin, cumsum, topk (indices 0-based i64); softmax and log_softmax. */
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
  kgl_check_options(L, 4, "var", (const char *const[]){"correction", "unbiased", NULL});
  int corr = (int)kgl_field_integer(L, 4, "correction", kgl_field_bool(L, 4, "unbiased", true) ? 1 : 0, 0, 1 << 30);
  KGL_CALL(L, kg_var(&r, x, mask, lua_toboolean(L, 3), corr));
  kgl_push(L, r);
  return 1;
}

/* x flattened to [numel] (for a nil dim) */
static kg_tensor *flat_of(lua_State *L, kg_tensor *x) {
  kg_tensor *f;
  KGL_CALL(L, kg_flatten(&f, x));
  kgl_push(L, f); /* kept on the stack so an error cannot leak it */
  return f;
}

/* t:max() -> 0-d max; t:max(dim, keepdim) -> values, indices */
static int select_values(lua_State *L, kg_status (*fn)(kg_tensor **, kg_tensor **, const kg_tensor *, int, bool)) {
  kg_tensor *x = kgl_check(L, 1), *v, *i;
  if (lua_isnoneornil(L, 2)) {
    kg_tensor *f = flat_of(L, x);
    KGL_CALL(L, fn(&v, NULL, f, 0, false));
    kgl_push(L, v);
    return 1;
  }
  int dim = kgl_dim(L, 2, x->ndim);
  KGL_CALL(L, fn(&v, &i, x, dim, lua_toboolean(L, 3)));
  kgl_push(L, v);
  kgl_push(L, i);
  return 2;
}
static int l_max(lua_State *L) { return select_values(L, kg_max); }
static int l_min(lua_State *L) { return select_values(L, kg_min); }

/* t:argmax(dim, keepdim); a nil dim indexes the flattened tensor */
static int select_index(lua_State *L, kg_status (*fn)(kg_tensor **, const kg_tensor *, int, bool)) {
  kg_tensor *x = kgl_check(L, 1), *r;
  if (lua_isnoneornil(L, 2)) {
    kg_tensor *f = flat_of(L, x);
    KGL_CALL(L, fn(&r, f, 0, false));
  } else {
    int dim = kgl_dim(L, 2, x->ndim);
    KGL_CALL(L, fn(&r, x, dim, lua_toboolean(L, 3)));
  }
  kgl_push(L, r);
  return 1;
}
static int l_argmax(lua_State *L) { return select_index(L, kg_argmax); }
static int l_argmin(lua_State *L) { return select_index(L, kg_argmin); }

static int l_cumsum(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  KGL_CALL(L, kg_cumsum(&r, x, kgl_dim(L, 2, x->ndim)));
  kgl_push(L, r);
  return 1;
}

/* t:topk(k, dim, {largest=true, sorted=true}) -> values, indices; dim defaults to -1 */
static int l_topk(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *v, *i;
  lua_Integer k = luaL_checkinteger(L, 2);
  int opts = lua_istable(L, 3) ? 3 : 4;
  int dim = opts == 3 ? -1 : kgl_optdim(L, 3, x->ndim, -1);
  kgl_check_options(L, opts, "topk", (const char *const[]){"largest", "sorted", NULL});
  bool largest = kgl_field_bool(L, opts, "largest", true), sorted = kgl_field_bool(L, opts, "sorted", true);
  KGL_CALL(L, kg_topk(&v, &i, x, (int64_t)k, dim, largest, sorted));
  kgl_push(L, v);
  kgl_push(L, i);
  return 2;
}

/* keng.softmax(x, dim) and t:softmax(dim); dim defaults to -1 */
static int softmax_like(lua_State *L, kg_status (*fn)(kg_tensor **, const kg_tensor *, int)) {
  kg_tensor *x = kgl_check(L, 1), *r;
  KGL_CALL(L, fn(&r, x, kgl_optdim(L, 2, x->ndim, -1)));
  kgl_push(L, r);
  return 1;
}
static int l_softmax(lua_State *L) { return softmax_like(L, kg_softmax); }
static int l_log_softmax(lua_State *L) { return softmax_like(L, kg_log_softmax); }

void kgl_register_reduce(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "sum", l_sum);
  kgl_set(L, methods, keng, "mean", l_mean);
  kgl_set(L, methods, keng, "var", l_var);
  kgl_set(L, methods, keng, "max", l_max);
  kgl_set(L, methods, keng, "min", l_min);
  kgl_set(L, methods, keng, "argmax", l_argmax);
  kgl_set(L, methods, keng, "argmin", l_argmin);
  kgl_set(L, methods, keng, "cumsum", l_cumsum);
  kgl_set(L, methods, keng, "topk", l_topk);
  kgl_set(L, methods, keng, "softmax", l_softmax);
  kgl_set(L, methods, keng, "log_softmax", l_log_softmax);
}
