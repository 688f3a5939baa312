/* norm.c — bindings of the normalisation ops (docs/lua_api.md):
 *   keng.layer_norm(x, w, b, eps=1e-5)            x [..., C], w/b [C] or nil
 *   keng.rms_norm(x, w, eps=1e-6, {unit_offset=false})
 *   keng.group_norm(x, groups, w, b, eps=1e-5)    x [B, C, *] */
#include "keng_lua.h"

static int l_layer_norm(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *w = kgl_opt(L, 2), *b = kgl_opt(L, 3), *r;
  double eps = luaL_optnumber(L, 4, 1e-5);
  KGL_CALL(L, kg_layer_norm(&r, x, w, b, eps));
  kgl_push(L, r);
  return 1;
}

static int l_rms_norm(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *w = kgl_opt(L, 2), *r;
  double eps = luaL_optnumber(L, 3, 1e-6);
  static const char *const valid[] = {"unit_offset", NULL};
  kgl_check_options(L, 4, "rms_norm", valid);
  bool unit_offset = kgl_field_bool(L, 4, "unit_offset", false);
  KGL_CALL(L, kg_rms_norm(&r, x, w, eps, unit_offset));
  kgl_push(L, r);
  return 1;
}

static int l_group_norm(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  lua_Integer groups = luaL_checkinteger(L, 2);
  kg_tensor *w = kgl_opt(L, 3), *b = kgl_opt(L, 4);
  double eps = luaL_optnumber(L, 5, 1e-5);
  luaL_argcheck(L, groups >= 1 && groups <= 0x7fffffff, 2, "groups must be a positive integer");
  KGL_CALL(L, kg_group_norm(&r, x, (int)groups, w, b, eps));
  kgl_push(L, r);
  return 1;
}

void kgl_register_norm(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "layer_norm", l_layer_norm);
  kgl_set(L, methods, keng, "rms_norm", l_rms_norm);
  kgl_set(L, methods, keng, "group_norm", l_group_norm);
}
