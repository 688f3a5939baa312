/* random.c — Lua bindings of the random op family (see LUA_API.md). */
#include "keng_lua.h"

void kgl_register_random(lua_State *L, int methods, int keng) {
  (void)L;
  (void)methods;
  (void)keng;
}
