/* debug.c — keng.debug: runtime checks.
 *   keng.debug.check_numerics(on) -> previous   every cpu op then checks its float outputs and
 *                                               raises "<op>: check_numerics: output 1 f32[..]
 *                                               has N NaN and M Inf values ...; inputs (...)"
 *   keng.debug.check_numerics() -> on           the current setting (KENG_CHECK_NUMERICS=1 turns
 *                                               it on at start) */
#include "keng_lua.h"

static int l_check_numerics(lua_State *L) {
  bool was = kg_check_numerics();
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    kg_set_check_numerics(lua_toboolean(L, 1));
  }
  lua_pushboolean(L, was);
  return 1;
}

void kgl_register_debug(lua_State *L, int methods, int keng) {
  (void)methods;
  lua_createtable(L, 0, 1); /* keng.debug */
  lua_pushcfunction(L, l_check_numerics);
  lua_setfield(L, -2, "check_numerics");
  lua_setfield(L, keng, "debug");
}
