/* io.c — Lua bindings of the io op family (see LUA_API.md). */
#include "keng_lua.h"

void kgl_register_io(lua_State *L, int methods, int keng) {
  (void)L;
  (void)methods;
  (void)keng;
}
