/* autograd.c — bindings of engine/core/autograd.c: t:backward(), t:requires_grad_(), and the
 * grad mode (keng.no_grad(fn), enable_grad(fn), is_grad_enabled(), set_grad_enabled(on)). */
#include "keng_lua.h"

static int l_backward(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *g = NULL;
  bool retain = false;
  if (lua_istable(L, 2) && !kgl_test(L, 2)) {
    kgl_check_options(L, 2, "backward", (const char *const[]){"gradient", "retain_graph", NULL});
    lua_getfield(L, 2, "gradient");
    g = kgl_opt(L, -1);
    retain = kgl_field_bool(L, 2, "retain_graph", false);
  } else {
    g = kgl_opt(L, 2);
    retain = lua_toboolean(L, 3);
  }
  KGL_CALL(L, kg_backward(t, g, retain));
  return 0;
}

static int l_requires_grad_(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  kgl_set_requires_grad(L, t, lua_isnoneornil(L, 2) ? true : lua_toboolean(L, 2));
  lua_settop(L, 1);
  return 1;
}

/* runs fn(...) with grad mode `on` and returns its results; the mode is restored on error */
static int with_grad_mode(lua_State *L, bool on) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  bool was = kg_set_grad_enabled(on);
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  kg_set_grad_enabled(was);
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}
static int l_no_grad(lua_State *L) { return with_grad_mode(L, false); }
static int l_enable_grad(lua_State *L) { return with_grad_mode(L, true); }

static int l_is_grad_enabled(lua_State *L) {
  lua_pushboolean(L, kg_grad_enabled());
  return 1;
}

static int l_set_grad_enabled(lua_State *L) {
  lua_pushboolean(L, kg_set_grad_enabled(lua_toboolean(L, 1)));
  return 1;
}

void kgl_register_autograd(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, 0, "backward", l_backward);
  kgl_set(L, methods, 0, "requires_grad_", l_requires_grad_);
  kgl_set(L, 0, keng, "no_grad", l_no_grad);
  kgl_set(L, 0, keng, "enable_grad", l_enable_grad);
  kgl_set(L, 0, keng, "is_grad_enabled", l_is_grad_enabled);
  kgl_set(L, 0, keng, "set_grad_enabled", l_set_grad_enabled);
}
