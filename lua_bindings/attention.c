/* attention.c — Lua bindings of the attention op family (see LUA_API.md). */
#include "keng_lua.h"

void kgl_register_attention(lua_State *L, int methods, int keng) {
  (void)L;
  (void)methods;
  (void)keng;
}
