/* debug.c — keng.debug: runtime checks.
 *   keng.debug.check_numerics(on) -> previous   every cpu op then checks its float outputs and
 *                                               raises "<op>: check_numerics: output 1 f32[..]
 *                                               has N NaN and M Inf values ...; inputs (...)"
 *   keng.debug.check_numerics() -> on           the current setting (KENG_CHECK_NUMERICS=1 turns
 *                                               it on at start)
 *   keng.debug.profile_start()                  clears and starts the op profile
 *   keng.debug.profile_stop() -> entries        stops it and hands over (and clears) what it
 *                                               holds: one table per distinct op line, in
 *                                               first-seen order: {line=, op=, calls=, ms=,
 *                                               flops=} (keng.profile formats them) */
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

static int l_profile_start(lua_State *L) {
  (void)L;
  kg_profile_start();
  return 0;
}

static int l_profile_stop(lua_State *L) {
  kg_profile_stop();
  int n;
  const kg_profile_entry *e = kg_profile_entries(&n);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 5);
    lua_pushstring(L, e[i].line);
    lua_setfield(L, -2, "line");
    lua_pushstring(L, e[i].op);
    lua_setfield(L, -2, "op");
    lua_pushinteger(L, (lua_Integer)e[i].calls);
    lua_setfield(L, -2, "calls");
    lua_pushnumber(L, e[i].ms);
    lua_setfield(L, -2, "ms");
    lua_pushnumber(L, (lua_Number)e[i].flops);
    lua_setfield(L, -2, "flops");
    lua_rawseti(L, -2, i + 1);
  }
  kg_profile_clear();
  return 1;
}

void kgl_register_debug(lua_State *L, int methods, int keng) {
  (void)methods;
  lua_createtable(L, 0, 3); /* keng.debug */
  lua_pushcfunction(L, l_check_numerics);
  lua_setfield(L, -2, "check_numerics");
  lua_pushcfunction(L, l_profile_start);
  lua_setfield(L, -2, "profile_start");
  lua_pushcfunction(L, l_profile_stop);
  lua_setfield(L, -2, "profile_stop");
  lua_setfield(L, keng, "debug");
}
