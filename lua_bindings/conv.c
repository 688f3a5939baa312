/* conv.c — Lua bindings of the conv op family (see LUA_API.md). */
#include "keng_lua.h"

void kgl_register_conv(lua_State *L, int methods, int keng) {
  (void)L;
  (void)methods;
  (void)keng;
}
