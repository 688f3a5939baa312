/* loss.c — bindings of the losses: keng.cross_entropy(logits, targets, {reduction=, ignore_index=,
 * label_smoothing=, weight=}) with logits [..., C], 0-based integer targets [...] and class
 * weights [C], and keng.mse_loss(a, b, {reduction=}). ignore_index defaults to -100 and
 * label_smoothing to 0, as in PyTorch. Unknown option keys are refused. */
#include "keng_lua.h"

#include <math.h>
#include <string.h>

static kg_reduction reduction_opt(lua_State *L, int idx, const char *op) {
  if (!lua_istable(L, idx)) return KG_REDUCE_MEAN;
  lua_getfield(L, idx, "reduction");
  const char *r = luaL_optstring(L, -1, "mean");
  kg_reduction red = !strcmp(r, "mean") ? KG_REDUCE_MEAN : !strcmp(r, "sum") ? KG_REDUCE_SUM
                     : !strcmp(r, "none") ? KG_REDUCE_NONE : (kg_reduction)-1;
  if ((int)red < 0) luaL_error(L, "%s: reduction must be \"mean\", \"sum\" or \"none\", got \"%s\"", op, r);
  lua_pop(L, 1);
  return red;
}

static int l_cross_entropy(lua_State *L) {
  kg_tensor *logits = kgl_check(L, 1), *targets = kgl_check(L, 2), *r, *weight = NULL;
  static const char *const valid[] = {"reduction", "ignore_index", "label_smoothing", "weight", NULL};
  kgl_check_options(L, 3, "cross_entropy", valid);
  kg_loss_params p = {reduction_opt(L, 3, "cross_entropy"), -100, true, 0};
  double ii = kgl_field_number(L, 3, "ignore_index", -100);
  if (ii != floor(ii) || !(fabs(ii) < 9.2e18)) luaL_error(L, "cross_entropy: ignore_index must be an integer, got %f", ii);
  p.ignore_index = (int64_t)ii;
  p.label_smoothing = kgl_field_number(L, 3, "label_smoothing", 0);
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "weight");
    if (!lua_isnil(L, -1)) {
      weight = kgl_test(L, -1);
      if (!weight) luaL_error(L, "cross_entropy: weight must be a tensor of C class weights, got %s", luaL_typename(L, -1));
    }
    lua_pop(L, 1); /* the options table keeps the weight alive */
  }
  KGL_CALL(L, kg_cross_entropy(&r, logits, targets, weight, &p));
  kgl_push(L, r);
  return 1;
}

static int l_mse_loss(lua_State *L) {
  kg_tensor *a = kgl_check(L, 1), *b = kgl_check(L, 2), *r;
  static const char *const valid[] = {"reduction", NULL};
  kgl_check_options(L, 3, "mse_loss", valid);
  KGL_CALL(L, kg_mse_loss(&r, a, b, reduction_opt(L, 3, "mse_loss")));
  kgl_push(L, r);
  return 1;
}

void kgl_register_loss(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "cross_entropy", l_cross_entropy);
  kgl_set(L, methods, keng, "mse_loss", l_mse_loss);
}
