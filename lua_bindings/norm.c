/* norm.c — Lua bindings of the norm op family (see LUA_API.md). */
#include "keng_lua.h"

void kgl_register_norm(lua_State *L, int methods, int keng) {
  (void)L;
  (void)methods;
  (void)keng;
}
